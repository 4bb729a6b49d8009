//! The pieces `corral api` and `corral up` both assemble the front door from: its parts beyond the
//! settings, its credentials and field key on disk, its state, and the signal that stops it.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::sync::Arc;

use corral_api::AppState;
use corral_api::workspaces::Workspaces;
use corral_contract::{Locator, WorkerClient, credential};
use corral_core::config::{FieldKeySource, Settings};
use corral_store::ValkeyStore;

/// What the API is built from beyond the settings.
#[derive(Clone)]
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
    /// Whether the API serves the built-in sample tool platform (`corral up` only).
    pub sample_tools: bool,
}

/// Reads `path`, or writes a fresh credential there (mode 0600) and returns it.
pub fn secret_file(path: &Path) -> Result<String, String> {
    if let Ok(existing) = std::fs::read_to_string(path) {
        let existing = existing.trim().to_owned();
        if !existing.is_empty() {
            return Ok(existing);
        }
    }
    let secret = credential::fresh();
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
    let workers = WorkerClient::new(parts.locator, parts.worker)?;
    let settings_packages = settings.packages.clone();
    let resources = settings
        .resource_authority_url
        .as_deref()
        .map(corral_api::resources::Authority::open)
        .transpose()
        .map_err(|e| format!("CORRAL_RESOURCE_AUTHORITY_URL: {e}"))?;
    let broker = corral_api::broker::Broker::new(&settings_packages, parts.field_key.as_deref())?;
    let mut state = AppState::of(corral_api::Core {
        settings,
        store,
        workspaces,
        workers,
        field_key: parts.field_key,
        caller_credential: parts.caller,
        admin_credential: parts.admin,
    });
    state.broker = Some(Arc::new(broker));
    state.resources = resources;
    state.sample_tools = parts.sample_tools;
    Ok(Arc::new(state))
}

/// Completes on SIGINT or SIGTERM.
pub async fn stop_signal() {
    corral_egress_proxy::run::shutdown_signal().await;
}
