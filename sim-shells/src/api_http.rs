//! The API itself as a replica of the deployment world: `corral_api`'s own state and router
//! (`corral_api::http::router`), served by axum through hyper's connection API on turmoil's
//! listener, its store linked to the simulated Valkey, its workspaces in the simulated object
//! store, its workers reached with the world's dial; and a client that calls `POST /v1/run_code`
//! over the world's network as an agent platform does. Every step of these runs is the API's own
//! (admission, lease, the run sequence's performer in `run/mod.rs`, keeping, the answer); the
//! world judges only what crosses its hosts: the workers' executes, the pool documents Valkey
//! stores, the objects the object store holds, and the answers the client reads.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corral_api::AppState;
use corral_api::workspaces::Workspaces;
use corral_contract::WorkerClient;
use corral_core::config::Settings;
use corral_core::pool::PoolConfig;
use corral_store::ValkeyStore;
use http_body_util::{BodyExt, Full};
use serde_json::{Value as Json, json};

/// The port the API listens on.
pub const PORT: u16 = 8000;
/// The caller credential the world's client presents.
const CALLER: &str = "sim-caller-credential-0123456789abcdef";
/// How long the client waits for an answer: past any run's wait, its bound and its keeping.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The API's settings in this world: the defaults, with the pool's settings those of the world's
/// pool (in whole seconds).
///
/// # Errors
/// When `pool` cannot be said in the API's settings (it would run another pool than the world's).
pub fn settings(pool: &PoolConfig) -> Result<Settings, String> {
    let seconds = |ms: u64| ms / 1_000;
    let settings = Settings {
        warm_pool_min: pool.warm_min,
        pool_target_idle: pool.target_idle,
        pool_max_allocated: pool.max_allocated,
        max_concurrent_creates: pool.max_concurrent_creates,
        burst_idle_ttl_seconds: seconds(pool.burst_idle_ttl_ms),
        acquire_wait_seconds: seconds(pool.acquire_wait_ms),
        acquire_queue_max: pool.acquire_queue_max,
        max_concurrent_per_member: pool.max_per_member,
        lease_heartbeat_seconds: seconds(pool.lease_heartbeat_ms),
        lease_ttl_seconds: seconds(pool.lease_ttl_ms),
        create_timeout_seconds: seconds(pool.create_timeout_ms),
        reset_timeout_seconds: seconds(pool.reset_timeout_ms),
        delete_retry_seconds: seconds(pool.delete_retry_ms),
        inventory_stale_seconds: seconds(pool.inventory_stale_ms),
        ..Settings::default()
    };
    if settings.pool() != *pool {
        return Err(format!(
            "the API's settings say the pool {:?}, not the world's {pool:?}",
            settings.pool()
        ));
    }
    Ok(settings)
}

/// The API's state over the world's store, workspaces and workers.
///
/// # Errors
/// As [`settings`].
pub fn state(
    pool: &PoolConfig,
    store: ValkeyStore,
    workspaces: Workspaces,
    workers: WorkerClient,
) -> Result<Arc<AppState>, String> {
    Ok(Arc::new(AppState::of(corral_api::Core {
        settings: settings(pool)?,
        store,
        workspaces,
        workers,
        field_key: None,
        caller_credential: CALLER.to_owned(),
        admin_credential: format!("{CALLER}-admin"),
    })))
}

/// Serves the API's router for `state` on [`PORT`] until the host is crashed: axum's router as
/// a hyper service, one HTTP/1 connection at a time as each is accepted.
///
/// # Errors
/// When it cannot listen.
pub async fn serve(state: Arc<AppState>) -> turmoil::Result {
    let router = corral_api::http::router(state);
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The `run_code` request the world's client sends for run `run`.
#[must_use]
pub fn run_code(run: u64, actor: &str, conversation: &str) -> Json {
    json!({
        "actor": actor,
        "conversation": conversation,
        "member": format!("m{}", run % 4),
        "language": "python",
        "code": format!("print({run})"),
    })
}

/// Sends `body` to `POST /v1/run_code` on `host` with the caller credential: the answer's status
/// and body, or why none came (the connection failed or the answer did not come in time).
///
/// # Errors
/// The transport's failure, in words.
pub async fn call(host: &str, body: &Json) -> Result<(u16, Json), String> {
    let exchange = async {
        let stream = turmoil::net::TcpStream::connect((host, PORT))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(connection);
        let request = hyper::Request::post("/v1/run_code")
            .header(hyper::header::HOST, host)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {CALLER}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Json::Null);
        Ok((status, body))
    };
    tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err("no answer in time".to_owned()))
}
