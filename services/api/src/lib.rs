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
//! the API's alone ([`workspaces`]); workers hold no storage credential, and the API reaches them
//! only through the one worker client (`corral_contract::WorkerClient`).

// The OpenAPI document is one `json!` literal, deeper than the default limit allows.
#![recursion_limit = "256"]

use std::net::SocketAddr;
use std::sync::Arc;

use corral_core::config::Settings;
use corral_store::ValkeyStore;

pub mod broker;
pub mod browser;
pub mod client;
pub mod egress;
pub mod hashline;
pub mod http;
pub mod live_view;
pub mod mcp;
pub mod metrics;
pub mod openapi;
pub mod refusal;
pub mod resources;
pub mod run;
pub mod tools;
pub mod trace;
pub mod validate;
pub mod viewer;
pub mod workspace_files;
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
    pub workers: corral_contract::WorkerClient,
    /// The egress policy, signer and proxy.
    pub egress: egress::Egress,
    /// Counters.
    pub metrics: metrics::Metrics,
    /// The caller credential.
    pub caller_credential: String,
    /// The admin credential.
    pub admin_credential: String,
    /// The package broker (PKG-3), `None` when it could not be built.
    pub broker: Option<Arc<broker::Broker>>,
    /// The root of persistent kernels' seal keys (`corral_core::kernel::seal_root`), from the
    /// field key; `None` without one, and persistent cells are then not run.
    pub kernel_seal_root: Option<[u8; 32]>,
    /// Affinity-mode kernels' held leases and retained workspaces (KER-4).
    pub affinity: run::affinity::Sessions,
    /// The running runs that were given tools, by callback token (KER-5).
    pub tool_runs: tools::ToolRuns,
    /// Whether this API serves the built-in sample tool platform at `/v1/sample_tools`
    /// (`corral up`, which points `CORRAL_TOOL_ENDPOINT_URL` at it); a production API does not.
    pub sample_tools: bool,
    /// The platform's resource authority (PROJ-1 to PROJ-8, OUT-1); `None`: nothing is projected
    /// and no output is linked.
    pub resources: Option<resources::Authority>,
    /// The browser sessions this API opened (BROW-13).
    pub browser: browser::Sessions,
}

/// What every API holds: its settings, the stores it speaks to and its credentials.
pub struct Core {
    /// The deployment's settings.
    pub settings: Settings,
    /// The pool's coordination store.
    pub store: ValkeyStore,
    /// Workspace snapshots.
    pub workspaces: workspaces::Workspaces,
    /// The workers' control APIs.
    pub workers: corral_contract::WorkerClient,
    /// The field key, which signs egress grants (and seals kernels' state), if there is one.
    pub field_key: Option<Vec<u8>>,
    /// The caller credential.
    pub caller_credential: String,
    /// The admin credential.
    pub admin_credential: String,
}

impl AppState {
    /// An API of `core` alone: its egress from the settings and the field key, fresh counters and
    /// sessions, and no broker, resource authority or sample tools (a deployment adds those).
    #[must_use]
    pub fn of(core: Core) -> Self {
        let egress = egress::Egress::new(core.settings.egress.clone(), core.field_key.as_deref());
        let kernel_seal_root = core
            .field_key
            .as_deref()
            .and_then(corral_core::kernel::seal_root);
        Self {
            settings: core.settings,
            store: core.store,
            workspaces: core.workspaces,
            workers: core.workers,
            egress,
            metrics: metrics::Metrics::default(),
            caller_credential: core.caller_credential,
            admin_credential: core.admin_credential,
            broker: None,
            kernel_seal_root,
            affinity: run::affinity::Sessions::default(),
            tool_runs: tools::ToolRuns::default(),
            sample_tools: false,
            resources: None,
            browser: browser::Sessions::default(),
        }
    }

    /// The registries runs may install from through the broker (PKG-3, PKG-7).
    #[must_use]
    pub fn packages(&self) -> corral_core::packages::resolve::Available {
        self.broker.as_ref().map_or(
            corral_core::packages::resolve::Available {
                python: false,
                npm: false,
            },
            |broker| broker.available(),
        )
    }
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
    // Every replica reaps idle browser sessions and hears of their ends (BROW-6, BROW-14).
    browser::start_background(&state);
    axum::serve(listener, http::router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

pub use corral_contract::ensure_crypto_provider;

/// Where the API listens by default (the parent API's port in the specification).
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8000);
