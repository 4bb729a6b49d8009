//! The TypeScript client (`clients/typescript`), built by tsc and run under Node's test runner
//! against a `corral up` started here: its runs, stream, typed refusals, persistent kernel,
//! workspace edits and package validation. Needs root, Valkey, the baked Pi runtime, and the
//! TypeScript compiler from `scripts/setup-services --tests` (`/opt/corral/test-tools/typescript`);
//! without them it skips through `corral_testkit::skip`, which CI forbids.

mod common;

use std::path::Path;
use std::process::Command;

use common::stack::Stack;
use corral_testkit::registries::TempDir;
use corral_testkit::{Need, skip};

const TSC: &str = "/opt/corral/test-tools/typescript/node_modules/.bin/tsc";

fn said(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_typescript_client_passes_its_tests_against_corral_up() {
    const TEST: &str = "the_typescript_client_passes_its_tests_against_corral_up";
    if !Path::new(TSC).is_file() {
        skip(
            TEST,
            Need::Tools,
            "no TypeScript compiler: run scripts/setup-services --tests",
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
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/typescript");
    let built = TempDir::new("ts-client");
    let compiled = Command::new(TSC)
        .args(["-p", "."])
        .arg("--outDir")
        .arg(built.path().join("dist"))
        .current_dir(&client)
        .output()
        .expect("tsc runs");
    assert!(
        compiled.status.success(),
        "tsc failed:\n{}",
        said(&compiled)
    );
    std::fs::create_dir_all(built.path().join("test")).expect("mkdir");
    std::fs::copy(
        client.join("test/client.test.mjs"),
        built.path().join("test/client.test.mjs"),
    )
    .expect("copy the tests");
    let Some((stack, replica)) = Stack::for_client_suite(TEST) else {
        return;
    };
    let output = Command::new("node")
        .args(["--test", "--test-reporter=spec", "test/"])
        .current_dir(built.path())
        .env("CORRAL_API_URL", &stack.api)
        .env("CORRAL_API_REPLICA_URL", &replica)
        .env("CORRAL_API_TOKEN_FILE", stack.state.join("api-token"))
        // Every test runs against the stack: none may skip.
        .env("CORRAL_REQUIRE_SERVICES", "1")
        .output()
        .expect("node --test runs");
    let text = said(&output);
    assert!(output.status.success(), "node --test failed:\n{text}");
    assert!(text.contains("pass 14"), "{text}");
    assert!(text.contains("skipped 0"), "{text}");
}
