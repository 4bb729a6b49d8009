//! Refusals before any code runs: a missing isolation primitive (unless the operator accepts a
//! weaker jail by name), an unsupported language, an oversized workspace, unusable arguments.

mod common;

use std::process::Command;

use common::{Jail, TempDir, root_or_skip, serial};

const ALLOW_WEAKER: &str = "CORRAL_JAIL_ALLOW_WEAKER_ISOLATION";
const PROBE: &str = "import os\nprint('ran as', os.getuid())\n";

fn missing(ran: &common::Ran) -> Vec<String> {
    ran.json["isolation"]["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// Refused: exit 3, `not_run`, the primitive named in the result and on stderr, no code run.
fn assert_refused_for(ran: &common::Ran, primitive: &str) {
    assert_eq!(ran.status, 3, "{}", ran.json);
    assert_eq!(ran.json["not_run"], "isolation_unavailable", "{}", ran.json);
    assert_eq!(ran.json["isolation"]["posture"], "refused");
    assert!(missing(ran).contains(&primitive.to_owned()), "{}", ran.json);
    assert!(
        ran.stderr.contains(primitive) && ran.stderr.contains(ALLOW_WEAKER),
        "{}",
        ran.stderr
    );
    assert!(!ran.stdout().contains("ran as"));
    // PKG-6: the record goes beside a nonzero exit.
    assert_eq!(ran.json["exit_code"], 1);
    ran.assert_clean_reset();
}

#[test]
fn without_cgroup_access_the_worker_refuses_unless_weaker_isolation_is_allowed() {
    if !root_or_skip("without_cgroup_access_the_worker_refuses_unless_weaker_isolation_is_allowed")
    {
        return;
    }
    let _serial = serial();
    let refused = Jail::python(PROBE)
        .env("CORRAL_JAIL_CGROUP_ROOT", "/proc/corral-no-cgroups-here")
        .run();
    assert_refused_for(&refused, "cgroup_memory");
    assert!(missing(&refused).contains(&"cgroup_pids".to_owned()));

    // Accepted by name: the run proceeds, says it is weaker, and rlimits still stop a fork bomb.
    let weaker = Jail::python(
        "import os\nprint('ran as', os.getuid(), flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        os._exit(0)\n",
    )
    .env("CORRAL_JAIL_CGROUP_ROOT", "/proc/corral-no-cgroups-here")
    .env(ALLOW_WEAKER, "1")
    .wall(3)
    .run();
    weaker.assert_ran();
    assert_eq!(
        weaker.json["isolation"]["posture"], "weaker",
        "{}",
        weaker.json
    );
    assert!(
        weaker.stdout().starts_with("ran as 1000"),
        "{}",
        weaker.json
    );
    weaker.assert_clean_reset();
}

#[test]
fn without_user_namespaces_the_worker_refuses_unless_weaker_isolation_is_allowed() {
    if !root_or_skip(
        "without_user_namespaces_the_worker_refuses_unless_weaker_isolation_is_allowed",
    ) {
        return;
    }
    let _serial = serial();
    let dir = TempDir::new("deny-userns");
    let wrapper = common::seccomp_wrapper(dir.path(), true, false);
    let refused = Jail::python(PROBE).under(wrapper.clone()).run();
    assert_refused_for(&refused, "user_namespaces");

    // Accepted by name: no user namespace, so the code runs as an unprivileged host uid of the
    // jails' range instead, still in its own pid, mount and network namespaces.
    let weaker =
        Jail::python("import os\nprint('ran as', os.getuid())\nprint(sorted(os.listdir('/')))\n")
            .under(wrapper)
            .env(ALLOW_WEAKER, "yes")
            .run();
    weaker.assert_ran();
    assert_eq!(
        weaker.json["isolation"]["posture"], "weaker",
        "{}",
        weaker.json
    );
    let uid: u32 = weaker
        .stdout()
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("ran as "))
        .and_then(|uid| uid.parse().ok())
        .unwrap_or_else(|| panic!("{}", weaker.json));
    assert!(uid >= common::JAIL_UID_BASE, "{uid}");
    assert!(weaker.stdout().contains("'workspace'"), "{}", weaker.json);
    weaker.assert_clean_reset();
}

#[test]
fn without_seccomp_the_worker_refuses_unless_weaker_isolation_is_allowed() {
    if !root_or_skip("without_seccomp_the_worker_refuses_unless_weaker_isolation_is_allowed") {
        return;
    }
    let _serial = serial();
    let dir = TempDir::new("deny-seccomp");
    let wrapper = common::seccomp_wrapper(dir.path(), false, true);
    let refused = Jail::python(PROBE).under(wrapper.clone()).run();
    assert_refused_for(&refused, "seccomp");
    let weaker = Jail::python(PROBE)
        .under(wrapper)
        .env(ALLOW_WEAKER, "on")
        .run();
    weaker.assert_ran();
    assert_eq!(
        weaker.json["isolation"]["posture"], "weaker",
        "{}",
        weaker.json
    );
    assert_eq!(weaker.stdout(), "ran as 1000\n");
    weaker.assert_clean_reset();
}

#[test]
fn pkg_06_an_unsupported_language_is_refused_before_it_runs() {
    if !root_or_skip("pkg_06_an_unsupported_language_is_refused_before_it_runs") {
        return;
    }
    let _serial = serial();
    let mut jail = Jail::python("print('no')");
    jail.language = "ruby";
    let ran = jail.run();
    assert_eq!(ran.status, 3, "{}", ran.json);
    assert_eq!(ran.json["not_run"], "unsupported_language");
    assert_eq!(ran.json["exit_code"], 1);
    ran.assert_clean_reset();
}

#[test]
fn a_workspace_over_its_bound_is_refused() {
    if !root_or_skip("a_workspace_over_its_bound_is_refused") {
        return;
    }
    let _serial = serial();
    let dir = TempDir::new("too-large");
    std::fs::write(dir.path().join("big.bin"), vec![0u8; 5000]).unwrap();
    let ran = Jail::python(PROBE)
        .workspace(dir.path())
        .env("SANDBOX_WORKSPACE_MAX_BYTES", "4096")
        .run();
    assert_eq!(ran.status, 3, "{}", ran.json);
    assert_eq!(ran.json["not_run"], "workspace_too_large");
    assert!(
        std::fs::metadata(dir.path().join("big.bin")).is_ok(),
        "the operator's directory is untouched"
    );
    ran.assert_clean_reset();
}

#[test]
fn unusable_arguments_exit_with_status_2() {
    let binary = env!("CARGO_BIN_EXE_corral-jail");
    for args in [
        &["run"][..],
        &["run", "--language", "python"],
        &["run", "--language", "python", "/nonexistent/file.py"],
        &[
            "run",
            "--language",
            "python",
            "--wall-seconds",
            "zero",
            "x.py",
        ],
        &[
            "run",
            "--language",
            "python",
            "--workspace",
            "/nonexistent-dir",
            "/etc/hostname",
        ],
        &["frobnicate"],
    ] {
        let output = Command::new(binary).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    let output = Command::new(binary)
        .args(["run", "--language", "python", "/etc/hostname"])
        .env("SANDBOX_MAX_WALL_SECONDS", "forever")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("SANDBOX_MAX_WALL_SECONDS"));
}
