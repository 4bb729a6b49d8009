//! The Python client (`clients/python`) under pytest against a `corral up` started here: its
//! runs, streams, typed refusals, persistent kernel, workspace edits, package validation and
//! async client. Needs root, Valkey, the baked Pi runtime, and httpx and pytest from
//! `scripts/setup-services --tests` (`/opt/corral/test-tools/python-client`); without them it
//! skips through `corral_testkit::skip`, which CI forbids.

mod common;

use std::path::Path;
use std::process::Command;

use common::stack::Stack;
use corral_testkit::{Need, skip};

const TOOLS: &str = "/opt/corral/test-tools/python-client";

#[test]
fn the_python_client_passes_its_tests_against_corral_up() {
    const TEST: &str = "the_python_client_passes_its_tests_against_corral_up";
    if !Path::new(TOOLS).join("pytest").is_dir() {
        skip(
            TEST,
            Need::Tools,
            "no httpx and pytest for the Python client: run scripts/setup-services --tests",
        );
        return;
    }
    if !Path::new("/opt/corral/pi/observe.mjs").is_file() {
        skip(
            TEST,
            Need::Tools,
            "no baked Pi runtime: run scripts/build-pi-runtime",
        );
        return;
    }
    let Some((stack, replica)) = Stack::for_client_suite(TEST) else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let client = root.join("clients/python");
    let output = Command::new("python3")
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&client)
        .env("PYTHONPATH", format!("{TOOLS}:{}", client.display()))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CORRAL_API_URL", &stack.api)
        .env("CORRAL_API_REPLICA_URL", &replica)
        .env("CORRAL_API_TOKEN_FILE", stack.state.join("api-token"))
        // Every test runs against the stack: none may skip.
        .env("CORRAL_REQUIRE_SERVICES", "1")
        .output()
        .expect("python3 -m pytest runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "pytest failed:\n{said}");
    assert!(said.contains(" passed"), "{said}");
    assert!(!said.contains("skipped"), "{said}");
}
