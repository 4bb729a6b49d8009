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

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use corral_api::workers::{Locator, Workers};
use corral_api::workspaces::Workspaces;
use corral_api::{AppState, credential_from_env, fresh_credential};
use corral_core::config::{FieldKeySource, Settings};
use corral_store::ValkeyStore;

/// What the API is built from beyond the settings.
pub struct ApiParts {
    /// The coordination store's URL.
    pub valkey: String,
    /// The pool's name.
    pub pool: String,
    /// Workspace storage URL.
    pub workspace_url: String,
    /// Where workers are.
    pub locator: Locator,
    /// Credentials.
    pub caller: String,
    /// See above.
    pub admin: String,
    /// See above.
    pub worker: String,
    /// The field key's bytes, if any.
    pub field_key: Option<Vec<u8>>,
}

/// Reads `path`, or writes a fresh credential there (mode 0600) and returns it.
pub fn secret_file(path: &Path) -> Result<String, String> {
    if let Ok(existing) = std::fs::read_to_string(path) {
        let existing = existing.trim().to_owned();
        if !existing.is_empty() {
            return Ok(existing);
        }
    }
    let secret = fresh_credential();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all(secret.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(secret)
}

/// The field key's bytes as the settings name them.
pub fn field_key_bytes(settings: &Settings) -> Result<Option<Vec<u8>>, String> {
    match &settings.field_key {
        FieldKeySource::Unset => Ok(None),
        FieldKeySource::Value(key) => Ok(Some(key.expose_secret().trim().as_bytes().to_vec())),
        FieldKeySource::File(path) => std::fs::read_to_string(path)
            .map(|text| Some(text.trim().as_bytes().to_vec()))
            .map_err(|e| format!("SANDBOX_FIELD_KEY_FILE {path}: {e}")),
    }
}

/// Connects and assembles the API's state.
pub async fn build(settings: Settings, parts: ApiParts) -> Result<Arc<AppState>, String> {
    let store = ValkeyStore::connect(&parts.valkey, &parts.pool)
        .await
        .map_err(|e| e.to_string())?;
    let workspaces = Workspaces::open(&parts.workspace_url)?;
    let workers = Workers::new(parts.locator, parts.worker)?;
    let egress =
        corral_api::egress::Egress::new(settings.egress.clone(), parts.field_key.as_deref());
    Ok(Arc::new(AppState {
        settings,
        store,
        workspaces,
        workers,
        egress,
        metrics: corral_api::metrics::Metrics::default(),
        caller_credential: parts.caller,
        admin_credential: parts.admin,
    }))
}

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
        credential_from_env(env, name)?.ok_or_else(|| format!("{name} or {name}_FILE is required"))
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
        },
    ))
}

/// `corral api`.
pub fn run(args: &[String]) -> ExitCode {
    if !args.is_empty() {
        eprintln!("usage: corral api   (settings from the environment; see `corral help`)");
        return ExitCode::from(2);
    }
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
        match corral_api::serve(state, listener, crate::up_cmd::stop_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("corral api: {error}");
                ExitCode::from(1)
            }
        }
    })
}
