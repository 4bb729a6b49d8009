//! Corral's MCP server driven by a real MCP client, the official Python SDK (`mcp`, pinned in
//! `scripts/test-tools/mcp/requirements.txt`), over stdio (`corral mcp`) and over Streamable HTTP
//! (`/mcp`) against a `corral up` started here: tools listed, runs, an image result, a
//! persistent kernel, the workspace by anchors, an unknown tool, a wrong type, an identity
//! argument and an unauthenticated request refused (`tests/mcp_client.py`). Needs root, Valkey
//! and the client from `scripts/setup-services --tests` (`/opt/corral/test-tools/mcp-client`);
//! without them it skips through `corral_testkit::skip`, which CI forbids.

mod common;

use std::path::Path;
use std::process::Command;

use common::stack::Stack;
use corral_testkit::{Need, skip};

const CLIENT: &str = "/opt/corral/test-tools/mcp-client";

#[test]
fn the_mcp_server_answers_a_real_mcp_client_over_stdio_and_streamable_http() {
    const TEST: &str = "the_mcp_server_answers_a_real_mcp_client_over_stdio_and_streamable_http";
    if !Path::new(CLIENT).join("mcp").is_dir() {
        skip(
            TEST,
            Need::Tools,
            "no MCP client: run scripts/setup-services --tests",
        );
        return;
    }
    let Some(stack) = Stack::start(TEST, &[], &[]) else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let output = Command::new("python3")
        .arg(&script)
        .env("PYTHONPATH", CLIENT)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CORRAL_BIN", env!("CARGO_BIN_EXE_corral"))
        .env("CORRAL_API_URL", &stack.api)
        .env("CORRAL_API_TOKEN_FILE", stack.state.join("api-token"))
        .output()
        .expect("python3 runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the MCP client failed:\n{said}");
    for check in [
        "ok stdio: tools listed",
        "ok stdio: an image result",
        "ok streamable http: a run",
        "ok streamable http: an unauthenticated request refused",
        "all ok",
    ] {
        assert!(said.contains(check), "{check} missing:\n{said}");
    }
}
