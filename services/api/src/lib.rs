//! Corral's front door (`corral api`): the service an agent platform calls.
//!
//! - `POST /v1/run_code` ([`run`]): a FIFO ticket, the run's egress grant, the workspace restored,
//!   the code executed on the leased worker, the workspace saved create-only, the lease released
//!   and the worker reset with evidence; two projections back, the model's and the member's.
//! - `GET /v1/read_workspace` : one file of the actor-and-conversation workspace, by relative
//!   path only (WS-4).
//! - `GET`/`PUT /v1/admin/egress_policy` ([`egress`]): the egress policy in Valkey with a revision
//!   grants carry; a change applies to the next run (EGR-5, EGR-9). Admin credential.
//! - `GET /v1/egress/verifying_key`: the public half the egress proxy reads (EGR-7).
//! - `GET /healthz`, `/readyz`, `/metrics` ([`metrics`]), `/openapi.json` ([`openapi`]).
//!
//! Callers present `Authorization: Bearer <credential>` (the caller credential for runs and
//! reads, the admin credential for the policy), compared in constant time. Every refusal is a
//! JSON `{"outcome": "refused", "error": {"code", "message", ...}}` with a stable code. Storage is
//! the API's alone ([`workspaces`]); workers hold no storage credential ([`workers`]).

use std::net::SocketAddr;
use std::sync::Arc;

use corral_core::config::Settings;
use corral_store::ValkeyStore;

pub mod client;
pub mod egress;
pub mod http;
pub mod metrics;
pub mod openapi;
pub mod run;
pub mod workers;
pub mod workspaces;

/// Everything a request handler needs.
pub struct AppState {
    /// The deployment's settings.
    pub settings: Settings,
    /// The pool's coordination store (and the egress policy's).
    pub store: ValkeyStore,
    /// Workspace snapshots.
    pub workspaces: workspaces::Workspaces,
    /// The workers' control APIs.
    pub workers: workers::Workers,
    /// The egress policy, signer and proxy.
    pub egress: egress::Egress,
    /// Counters.
    pub metrics: metrics::Metrics,
    /// The caller credential.
    pub caller_credential: String,
    /// The admin credential.
    pub admin_credential: String,
}

/// Serves the API on `listener` until `shutdown` completes.
///
/// # Errors
/// When serving fails.
pub async fn serve(
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, http::router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Reads a credential from the file named by `<name>_FILE`, else from `<name>`; `None` if neither.
///
/// # Errors
/// An unreadable file, or a credential shorter than 16 bytes.
pub fn credential_from_env(
    lookup: impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<String>, String> {
    let text = match lookup(&format!("{name}_FILE")).filter(|p| !p.is_empty()) {
        Some(path) => {
            std::fs::read_to_string(&path).map_err(|e| format!("{name}_FILE {path}: {e}"))?
        }
        None => match lookup(name).filter(|v| !v.is_empty()) {
            Some(value) => value,
            None => return Ok(None),
        },
    };
    let text = text.trim().to_owned();
    if text.len() < 16 {
        return Err(format!("{name}: a credential must be at least 16 bytes"));
    }
    Ok(Some(text))
}

/// A fresh credential: 32 random bytes in hex.
#[must_use]
pub fn fresh_credential() -> String {
    let a = egress::random_bytes();
    let b = egress::random_bytes();
    a.iter()
        .chain(b.iter())
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Makes ring the process's TLS crypto provider, once (idempotent). Every HTTP client Corral
/// builds (to workers, to S3, to the API) uses rustls; the workspace's one provider is ring (kube
/// uses it too), and rustls refuses to guess when none is installed. Called before any client is
/// built.
pub fn ensure_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Where the API listens by default (the parent API's port in the specification).
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8000);
