//! `corral-contract`: every message between Corral's API, controller and worker, defined once.
//!
//! It owns the worker's control routes ([`routes`]), the typed request and reply of each
//! ([`messages`]), their error codes ([`error`]) and limits ([`limits`], each derived from
//! corral-core's definition), where a worker's control API is ([`locate`]), how a credential is
//! read and compared ([`credential`]), and the one client of the routes ([`client`]), which the
//! API and the controller both use while the worker's server decodes the same types.
//!
//! It must never decide anything about a run or the pool (that is corral-core's) and never
//! perform a run (that is the worker's). Nothing outside this crate names a worker route, header
//! or limit.

pub mod client;
pub mod credential;
pub mod error;
pub mod limits;
pub mod locate;
pub mod messages;
pub mod routes;

pub use client::{CallError, WorkerClient};
pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use locate::Locator;
pub use messages::{
    Durations, EvidenceReport, ExecuteReply, ExecuteRequest, HealthReply, Isolation, ResetReply,
    ResetRequest, WorkspaceReturn,
};

/// Makes ring the process's TLS crypto provider, once (idempotent). Every HTTP client Corral
/// builds that may speak TLS (to S3, to the API, to a resource authority) uses rustls, whose one provider here is ring (kube
/// uses it too); rustls refuses to guess when none is installed. Called before any client is
/// built.
pub fn ensure_crypto_provider() {
    // Err means a provider is installed already, which is what this asks for.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
