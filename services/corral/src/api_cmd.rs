//! `corral api`: the front door as a service of its own (settings from the environment), and the
//! pieces `corral up` assembles it from.
//!
//! Environment: `CORRAL_VALKEY_URL` (required), `CORRAL_POOL` (default `default`),
//! `CORRAL_API_LISTEN` (default 127.0.0.1:8000), `CORRAL_WORKSPACE_URL` (`file:///dir`, the default
//! `file:///var/lib/corral/workspaces`, or `s3://bucket[/prefix]` with the `AWS_*` variables),
//! `CORRAL_WORKER_STATE_DIR` (the `local` backend's records) or `CORRAL_WORKER_URL_TEMPLATE`
//! (`http://{id}.NAMESPACE.svc:8091` for the `kube` backend's workers), and the credentials `CORRAL_API_TOKEN[_FILE]`,
//! `CORRAL_ADMIN_TOKEN[_FILE]`, `CORRAL_WORKER_TOKEN[_FILE]`; the `SANDBOX_*` settings as
//! `corral config docs` lists them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use corral_contract::Locator;
use corral_contract::credential;
use corral_core::config::Settings;

use crate::stack::{ApiParts, build, field_key_bytes, stop_signal};

fn from_env(settings: &Settings) -> Result<(SocketAddr, ApiParts), String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let listen = match env("CORRAL_API_LISTEN") {
        Some(text) => text
            .parse()
            .map_err(|_| format!("CORRAL_API_LISTEN {text:?}: not host:port"))?,
        None => corral_api::DEFAULT_LISTEN,
    };
    let locator = match (
        env("CORRAL_WORKER_STATE_DIR"),
        env("CORRAL_WORKER_URL_TEMPLATE"),
    ) {
        (Some(dir), None) => Locator::StateDir(PathBuf::from(dir)),
        (None, Some(template)) => Locator::template(&template)?,
        _ => {
            return Err(String::from(
                "set exactly one of CORRAL_WORKER_STATE_DIR and CORRAL_WORKER_URL_TEMPLATE",
            ));
        }
    };
    let need = |name: &str| -> Result<String, String> {
        credential::from_env(env, name)?.ok_or_else(|| format!("{name} or {name}_FILE is required"))
    };
    Ok((
        listen,
        ApiParts {
            valkey: env("CORRAL_VALKEY_URL").ok_or("CORRAL_VALKEY_URL is required (POOL-11)")?,
            pool: env("CORRAL_POOL").unwrap_or_else(|| String::from("default")),
            workspace_url: env("CORRAL_WORKSPACE_URL")
                .unwrap_or_else(|| String::from("file:///var/lib/corral/workspaces")),
            locator,
            caller: need("CORRAL_API_TOKEN")?,
            admin: need("CORRAL_ADMIN_TOKEN")?,
            worker: need("CORRAL_WORKER_TOKEN")?,
            field_key: field_key_bytes(settings)?,
            sample_tools: false,
        },
    ))
}

/// `corral api`.
pub fn run() -> ExitCode {
    let settings = match Settings::from_lookup(|name| std::env::var(name).ok()) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("corral api: {error} ({})", error.code());
            return ExitCode::from(1);
        }
    };
    let (listen, parts) = match from_env(&settings) {
        Ok(parsed) => parsed,
        Err(error) => {
            eprintln!("corral api: {error}");
            return ExitCode::from(2);
        }
    };
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        eprintln!("corral api: no runtime");
        return ExitCode::from(1);
    };
    runtime.block_on(async move {
        let state = match build(settings, parts).await {
            Ok(state) => state,
            Err(error) => {
                eprintln!("corral api: {error}");
                return ExitCode::from(1);
            }
        };
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("corral api: {listen}: {error}");
                return ExitCode::from(1);
            }
        };
        eprintln!("corral api: listening on http://{listen}");
        match corral_api::serve(state, listener, stop_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("corral api: {error}");
                ExitCode::from(1)
            }
        }
    })
}
