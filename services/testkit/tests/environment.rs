//! `skip` as tests meet it, reading the real environment: this program runs itself as a child
//! with `CORRAL_REQUIRE_*` and `CORRAL_SKIP_LOG` set as each case needs (the variables are
//! process-wide, so each case gets its own process). Without a test harness: `main` is the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use corral_testkit::{Need, SKIP_LOG_VAR, skip};

/// Set in a child: the name of the need it skips for.
const CHILD_VAR: &str = "CORRAL_TESTKIT_CHILD";

fn main() {
    if let Some(name) = std::env::var_os(CHILD_VAR) {
        let need = Need::ALL
            .into_iter()
            .find(|need| name == need.name())
            .expect("a need's name");
        skip("environment::child", need, "lacks it");
        return;
    }
    let scratch = std::env::temp_dir().join(format!("corral-testkit-env-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("scratch directory");
    let log = scratch.join("skipped.tsv");
    cases(&log);
    std::fs::remove_dir_all(&scratch).expect("scratch removed");
    println!("test environment ... ok");
}

fn cases(log: &Path) {
    // Nothing required: the skip is printed and logged, and the test passes.
    let out = child(Need::Root, &[], log);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("SKIPPED environment::child: lacks it\n"),
        "{out:?}"
    );
    assert_eq!(read(log), "environment::child\troot\tlacks it\n");

    // Another need required: this one still skips, and the log grows by one line.
    let out = child(Need::Root, &["CORRAL_REQUIRE_SERVICES"], log);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(read(log).lines().count(), 2);

    // The need required (even as an empty value): the test fails, saying why, and logs nothing.
    for value in ["1", ""] {
        let out = child_with(Need::Root, &[("CORRAL_REQUIRE_ROOT", value)], log);
        assert_eq!(out.status.code(), Some(101), "a panic: {out:?}");
        assert!(
            stderr(&out).contains(
                "environment::child: CORRAL_REQUIRE_ROOT is set, so this test may not skip: lacks it"
            ),
            "{out:?}"
        );
        assert_eq!(read(log).lines().count(), 2, "a failure is not logged");
    }

    // Every need reads its own variable.
    for need in Need::ALL {
        let out = child(need, &[need.require_var()], log);
        assert_eq!(out.status.code(), Some(101), "{need}: {out:?}");
        assert!(stderr(&out).contains(need.require_var()), "{out:?}");
    }
    assert_eq!(read(log).lines().count(), 2);
}

fn child(need: Need, required: &[&str], log: &Path) -> Output {
    let set: Vec<(&str, &str)> = required.iter().map(|var| (*var, "1")).collect();
    child_with(need, &set, log)
}

/// Runs this program as a child skipping for `need`, with only `set` of the `CORRAL_REQUIRE_*`
/// variables (the parent's own, under CI, are removed) and the skip log at `log`.
fn child_with(need: Need, set: &[(&str, &str)], log: &Path) -> Output {
    let mut command = Command::new(std::env::current_exe().expect("this program"));
    for need in Need::ALL {
        command.env_remove(need.require_var());
    }
    command
        .envs(set.iter().copied())
        .env(SKIP_LOG_VAR, log)
        .env(CHILD_VAR, need.name())
        .env("RUST_BACKTRACE", "0");
    command.output().expect("the child runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(PathBuf::from(log)).expect("the skip log")
}
