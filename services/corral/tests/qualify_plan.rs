//! `kind-cluster/qualify` without a cluster: `--dry-run` prints every step and checks every
//! prerequisite it can, and a real run on a machine that lacks one stops before creating
//! anything, naming it (issue 26, item 6). The qualification suite itself is tests/qualify.rs,
//! which only a deployed cluster runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository's root")
}

fn qualify(args: &[&str]) -> Output {
    Command::new("bash")
        .arg(root().join("kind-cluster/qualify"))
        .args(args)
        .output()
        .expect("bash runs kind-cluster/qualify")
}

/// What every plan must do, in this order (the titles `qualify` prints).
const STEPS: [&str; 13] = [
    "build the images",
    "static checks with the built digests",
    "the overlay's Secrets",
    "a kind config with gVisor's runtime handler",
    "create the cluster",
    "install gVisor on every node",
    "load the images into every node",
    "deploy the kind overlay",
    "wait for Corral's services",
    "reach the API",
    "the qualification suite (normal runtime)",
    "move the default pool onto gVisor",
    "the qualification suite's gVisor case",
];

#[test]
fn qualify_dry_run_prints_every_step_and_checks_every_prerequisite() {
    let out = qualify(&["--dry-run", "--name", "plan-check"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut at = 0;
    for step in STEPS {
        let Some(found) = text[at..].find(step) else {
            panic!("step {step:?} missing or out of order:\n{text}");
        };
        at += found + step.len();
    }
    for prerequisite in [
        "docker daemon",
        "kind >= ",
        "kubectl",
        "gVisor runsc",
        "gVisor containerd shim",
    ] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(prerequisite))
            .unwrap_or_else(|| panic!("prerequisite {prerequisite:?} not checked:\n{text}"));
        assert!(
            line.contains(" ok ") || line.contains(" MISSING "),
            "{line}"
        );
    }
    // The plan names the overlay it deploys and the suite it runs, and the last line says whether
    // a real run would go ahead.
    assert!(text.contains("overlays/kind"), "{text}");
    assert!(text.contains("gvisor"), "{text}");
    let last = text.lines().last().unwrap_or_default();
    assert!(last.starts_with("dry run: "), "{last}");
    assert!(
        !root().join("target/qualify/plan-check").exists(),
        "a dry run created its work directory"
    );
}

#[test]
fn qualify_without_gvisor_stops_before_deploying_saying_which() {
    let out = qualify(&["--name", "no-gvisor", "--runsc-dir", "/nonexistent/gvisor"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let stop = stderr
        .lines()
        .find(|l| l.contains("stopping before deploying: missing"))
        .unwrap_or_else(|| panic!("no stop line: {stderr}"));
    assert!(
        stop.contains("gVisor runsc") && stop.contains("gVisor containerd shim"),
        "{stop}"
    );
    assert!(
        !root().join("target/qualify/no-gvisor").exists(),
        "it created its work directory"
    );
}

#[test]
fn qualify_refuses_bad_arguments() {
    for args in [
        &["--bogus"][..],
        &["--name"][..],
        &["--name", "Not_A_Name"][..],
    ] {
        let out = qualify(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
