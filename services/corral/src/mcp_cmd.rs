//! `corral mcp` (the flags are [`corral::cli::McpArgs`]): Corral's MCP server over stdio for an
//! agent tool (`corral_api::mcp`), acting through the API at `CORRAL_API_URL` with the caller
//! credential, for the one identity it is given. Its stdout is the protocol's: every word of its
//! own goes to stderr.

use std::process::ExitCode;

use corral::cli::McpArgs;
use corral_api::client::Client;
use corral_api::mcp::{Api, Identity, Server};
use rmcp::ServiceExt as _;

/// `corral mcp`.
pub fn run(args: McpArgs) -> ExitCode {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(actor), Some(conversation)) = (
        args.actor.or_else(|| env("CORRAL_MCP_ACTOR")),
        args.conversation.or_else(|| env("CORRAL_MCP_CONVERSATION")),
    ) else {
        eprintln!(
            "corral mcp: no identity: pass --actor and --conversation (or set CORRAL_MCP_ACTOR \
             and CORRAL_MCP_CONVERSATION)"
        );
        return ExitCode::from(2);
    };
    let member = args
        .member
        .or_else(|| env("CORRAL_MCP_MEMBER"))
        .unwrap_or_else(|| actor.clone());
    for (name, value) in [
        ("actor", &actor),
        ("conversation", &conversation),
        ("member", &member),
    ] {
        if !corral_core::ids::identity_is_valid(value) {
            eprintln!("corral mcp: the {name} must be 1 to 256 bytes with no control character");
            return ExitCode::from(2);
        }
    }
    let token = match crate::run_cmd::credential() {
        Ok(token) => token,
        Err(error) => {
            eprintln!("corral mcp: {error}");
            return ExitCode::from(2);
        }
    };
    let client = match Client::new(&crate::run_cmd::api_url(), &token) {
        Ok(client) => client,
        Err(error) => {
            eprintln!("corral mcp: {error}");
            return ExitCode::from(1);
        }
    };
    let identity = Identity {
        actor,
        conversation,
        member,
    };
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        return ExitCode::from(1);
    };
    let served = runtime.block_on(async move {
        let server = Server::fixed(Api::Remote(client), identity)
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| e.to_string())?;
        server.waiting().await.map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("corral mcp: {error}");
            ExitCode::from(1)
        }
    }
}
