//! `corral controller --health-listen ADDR`: the controller's `GET /healthz` and `GET /readyz`,
//! for the kubelet's probes, as corral-api serves its own (axum, a JSON body on `/readyz`).
//!
//! - `/healthz`: 200 while the process runs (its runtime answers).
//! - `/readyz`: 200 once the reconciler's last pass reached the store (coordinated), 503 before
//!   the first pass has ended and while the last one could not reach it (the controller then
//!   does nothing at all, POOL-11).
//!
//! Nothing else is served, and nothing that is not the controller's state: no pool, no worker.
//! `corral up` runs its controller without it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

const NO_PASS_YET: u8 = 0;
const COORDINATED: u8 = 1;
const UNCOORDINATED: u8 = 2;

/// What `/readyz` answers: the last pass's reach of the store. Cloned, it is the same state.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicU8>);

impl Readiness {
    /// Records a pass that ended, and whether it reached the store.
    pub fn passed(&self, coordinated: bool) {
        let state = if coordinated {
            COORDINATED
        } else {
            UNCOORDINATED
        };
        self.0.store(state, Ordering::Relaxed);
    }

    /// True when the last pass reached the store.
    pub fn ready(&self) -> bool {
        self.0.load(Ordering::Relaxed) == COORDINATED
    }

    fn coordination(&self) -> &'static str {
        match self.0.load(Ordering::Relaxed) {
            NO_PASS_YET => "no pass yet",
            COORDINATED => "ok",
            _ => "unavailable",
        }
    }
}

/// Binds `address` and serves the two endpoints on it for as long as the runtime runs; returns
/// the bound address (port 0 picks one).
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(address: SocketAddr, readiness: Readiness) -> Result<SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| format!("--health-listen {address}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("--health-listen {address}: {e}"))?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router(readiness)).await {
            eprintln!("corral controller: health endpoints stopped: {error}");
        }
    });
    Ok(bound)
}

fn router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

async fn readyz(State(readiness): State<Readiness>) -> Response {
    let ready = readiness.ready();
    (
        if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        axum::Json(json!({
            "ready": ready,
            "coordination": readiness.coordination(),
        })),
    )
        .into_response()
}

/// The status `GET path` answers on 127.0.0.1:`port` (tests).
#[cfg(test)]
pub async fn status(port: u16, path: &'static str) -> Option<u16> {
    tokio::task::spawn_blocking(move || corral_testkit::registries::http_status(port, path))
        .await
        .expect("the probe ran")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_is_200_while_running_and_ready_follows_the_last_pass() {
        let readiness = Readiness::default();
        let bound = serve("127.0.0.1:0".parse().unwrap(), readiness.clone())
            .await
            .expect("binds");
        let port = bound.port();
        assert_eq!(status(port, "/healthz").await, Some(200));
        assert_eq!(status(port, "/readyz").await, Some(503), "before any pass");
        readiness.passed(false);
        assert_eq!(
            status(port, "/readyz").await,
            Some(503),
            "store unreachable"
        );
        readiness.passed(true);
        assert_eq!(status(port, "/readyz").await, Some(200));
        readiness.passed(false);
        assert_eq!(status(port, "/readyz").await, Some(503), "lost the store");
        assert_eq!(status(port, "/healthz").await, Some(200));
        assert_eq!(status(port, "/metrics").await, Some(404), "nothing else");
    }

    #[tokio::test]
    async fn an_address_in_use_is_refused_naming_the_flag() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let address = taken.local_addr().expect("bound");
        let error = serve(address, Readiness::default())
            .await
            .expect_err("in use");
        assert!(error.starts_with("--health-listen 127.0.0.1:"), "{error}");
    }
}
