//! The one definition of a skipped test, for every test in the workspace.
//!
//! A test that needs something this machine may lack calls [`skip`] when it is missing, then
//! returns. Where CI requires that need (`CORRAL_REQUIRE_<NEED>` is set), [`skip`] panics
//! instead, so the test fails; otherwise it prints `SKIPPED <test>: <why>` to standard error and
//! appends one line `<test>\t<need>\t<why>` to the file named by `CORRAL_SKIP_LOG`, which CI
//! counts and lists after `cargo test`. A test that returns early without calling [`skip`] is a
//! test that can pass with the feature broken.
//!
//! It also holds the test registries ([`registries`]): a PyPI index and an npm registry that a
//! test starts on loopback and fills with packages it builds, never reaching any other index, and
//! ports that refuse or never answer; and a stub DNS server ([`dns`]) that answers from a table a
//! test (or the chaos harness's DNS faults) controls.
//!
//! This crate depends on nothing but `std`, and holds nothing but what a skip needs, those
//! registries and that stub.

pub mod dns;
pub mod registries;

use std::fmt;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::Path;

/// The environment variable naming the file each skip appends its line to.
pub const SKIP_LOG_VAR: &str = "CORRAL_SKIP_LOG";

/// What a test needs that a machine may lack. Each has a variable, `CORRAL_REQUIRE_<NEED>`, under
/// which a test that lacks it fails instead of skipping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// A server the test starts: Valkey, moto's S3 server, pypiserver or verdaccio
    /// (`scripts/setup-services --tests`).
    Services,
    /// Network namespaces: `ip netns`, `unshare(CLONE_NEWNET)`.
    Netns,
    /// An effective uid of 0: the jail's supervisor mounts, maps ids and creates cgroups.
    Root,
    /// A full jail: `corral-jail probe` reports the posture `full` (cgroups, user namespaces,
    /// seccomp), beyond root.
    Jail,
    /// A host program or filesystem feature: `/usr/bin/python3`, `/usr/bin/node`, `chattr` on a
    /// filesystem that keeps the immutable flag.
    Tools,
}

impl Need {
    /// Every need, in the order CI lists them.
    pub const ALL: [Need; 5] = [
        Need::Services,
        Need::Netns,
        Need::Root,
        Need::Jail,
        Need::Tools,
    ];

    /// The need's name in the skip log.
    pub fn name(self) -> &'static str {
        match self {
            Need::Services => "services",
            Need::Netns => "netns",
            Need::Root => "root",
            Need::Jail => "jail",
            Need::Tools => "tools",
        }
    }

    /// The variable under which a test that lacks this need fails instead of skipping.
    pub fn require_var(self) -> &'static str {
        match self {
            Need::Services => "CORRAL_REQUIRE_SERVICES",
            Need::Netns => "CORRAL_REQUIRE_NETNS",
            Need::Root => "CORRAL_REQUIRE_ROOT",
            Need::Jail => "CORRAL_REQUIRE_JAIL",
            Need::Tools => "CORRAL_REQUIRE_TOOLS",
        }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Skips the test `test`, which lacks `need` for the reason `why`; panics instead when
/// `CORRAL_REQUIRE_<NEED>` is set (to any value), or when the skip cannot be written to
/// `CORRAL_SKIP_LOG`. The caller returns right after.
#[track_caller]
pub fn skip(test: &str, need: Need, why: &str) {
    let required = std::env::var_os(need.require_var()).is_some();
    let log = std::env::var_os(SKIP_LOG_VAR);
    if let Err(failure) = record(test, need, why, required, log.as_deref().map(Path::new)) {
        panic!("{failure}");
    }
}

/// Whether every one of `programs` (name, path) is installed; skips `test` for [`Need::Tools`]
/// naming the first that is not.
#[track_caller]
pub fn programs_or_skip(test: &str, programs: &[(&str, &str)]) -> bool {
    match programs.iter().find(|(_, path)| !Path::new(path).exists()) {
        Some((name, path)) => {
            skip(
                test,
                Need::Tools,
                &format!("no {name} at {path}: run scripts/setup-services"),
            );
            false
        }
        None => true,
    }
}

/// [`skip`] with its environment as arguments: `Err` says why the test must fail instead.
fn record(
    test: &str,
    need: Need,
    why: &str,
    required: bool,
    log: Option<&Path>,
) -> Result<(), String> {
    if required {
        return Err(format!(
            "{test}: {} is set, so this test may not skip: {why}",
            need.require_var()
        ));
    }
    eprintln!("SKIPPED {test}: {why}");
    let Some(log) = log else {
        return Ok(());
    };
    let cannot = |error: std::io::Error| {
        format!(
            "{test}: skipped ({why}), but the skip cannot be written to {SKIP_LOG_VAR}={}: {error}",
            log.display()
        )
    };
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(cannot)?;
    // One write of the whole line: concurrent tests append whole lines to the one file.
    file.write_all(log_line(test, need, why).as_bytes())
        .map_err(cannot)
}

/// One line of the skip log, `<test>\t<need>\t<why>\n`, with tabs and line breaks in the fields
/// made spaces so that each skip stays one line of three fields.
pub fn log_line(test: &str, need: Need, why: &str) -> String {
    format!("{}\t{need}\t{}\n", flat(test), flat(why))
}

fn flat(text: &str) -> String {
    text.chars()
        .map(|c| {
            if matches!(c, '\t' | '\n' | '\r') {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// Whether this process's effective uid is 0 (from `/proc/self/status`; false where unreadable).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh directory for one test, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let path =
                std::env::temp_dir().join(format!("corral-testkit-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).expect("scratch directory");
            Self(path)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn each_skip_appends_one_line_of_three_fields() {
        let scratch = Scratch::new("append");
        let log = scratch.0.join("skipped.tsv");
        std::fs::write(&log, "earlier\troot\tkept\n").expect("seed");
        record(
            "a::first",
            Need::Services,
            "no valkey-server",
            false,
            Some(&log),
        )
        .expect("skipped");
        record(
            "a::second",
            Need::Tools,
            "chattr:\tfailed\nexit 1",
            false,
            Some(&log),
        )
        .expect("skipped");
        assert_eq!(
            std::fs::read_to_string(&log).expect("log"),
            "earlier\troot\tkept\n\
             a::first\tservices\tno valkey-server\n\
             a::second\ttools\tchattr: failed exit 1\n"
        );
    }

    #[test]
    fn a_required_need_fails_the_test_and_logs_nothing() {
        let scratch = Scratch::new("required");
        let log = scratch.0.join("skipped.tsv");
        let failure = record("a::test", Need::Root, "not root", true, Some(&log))
            .expect_err("a required need must fail");
        assert_eq!(
            failure,
            "a::test: CORRAL_REQUIRE_ROOT is set, so this test may not skip: not root"
        );
        assert!(!log.exists(), "a failure is not a skip");
    }

    #[test]
    fn a_skip_that_cannot_be_logged_fails_the_test() {
        let scratch = Scratch::new("unwritable");
        let log = scratch.0.join("no-such-directory").join("skipped.tsv");
        let failure = record("a::test", Need::Netns, "no ip", false, Some(&log))
            .expect_err("an uncounted skip must fail");
        assert!(failure.contains("CORRAL_SKIP_LOG"), "{failure}");
        assert_eq!(record("a::test", Need::Netns, "no ip", false, None), Ok(()));
    }

    #[test]
    fn each_need_has_its_own_name_and_variable() {
        for need in Need::ALL {
            assert_eq!(
                need.require_var(),
                format!("CORRAL_REQUIRE_{}", need.name().to_uppercase())
            );
        }
        let mut names: Vec<&str> = Need::ALL.iter().map(|n| n.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Need::ALL.len());
    }

    /// CI fails a test that lacks a need only where it sets the need's variable: it must set
    /// every one, and no other.
    #[test]
    fn ci_requires_every_need_and_nothing_else() {
        let ci = include_str!("../../../.ci/run");
        for need in Need::ALL {
            assert!(
                ci.contains(&format!("export {}=1\n", need.require_var())),
                ".ci/run does not export {}=1",
                need.require_var()
            );
        }
        let named: Vec<&str> = ci
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("CORRAL_REQUIRE_") && word.len() > 15)
            .collect();
        assert!(!named.is_empty());
        for word in named {
            assert!(
                Need::ALL.iter().any(|n| n.require_var() == word),
                ".ci/run names {word}, which no Need has"
            );
        }
    }

    #[test]
    fn is_root_agrees_with_id() {
        let output = std::process::Command::new("id")
            .arg("-u")
            .output()
            .expect("id -u runs");
        let uid = String::from_utf8(output.stdout).expect("utf-8");
        assert_eq!(is_root(), uid.trim() == "0", "id -u says {uid}");
    }
}
