//! The routes, authentication and the small handlers.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use corral_contract::credential;
use corral_core::run::admission::RunCodeRequest;
use corral_core::store::Loaded;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
pub use crate::refusal::error;
use crate::refusal::{stored_workspace, workspace_identity_refused};
use crate::run::run_code;
use crate::workspaces::FileLookup;

/// The routes, and `/mcp` (Streamable HTTP, behind the caller credential) over them.
pub fn router(state: Arc<AppState>) -> Router {
    let routes = routes(state.clone());
    let mcp = Router::new()
        .nest_service(
            "/mcp",
            crate::mcp::service(routes.clone(), state.caller_credential.clone()),
        )
        .layer(middleware::from_fn_with_state(state.clone(), caller_auth));
    routes.merge(mcp)
}

/// Every route but `/mcp`.
fn routes(state: Arc<AppState>) -> Router {
    let body_max = usize::try_from(state.settings.bounds.workspace_max_bytes)
        .unwrap_or(usize::MAX)
        .saturating_mul(2)
        .saturating_add(64 * 1024);
    let caller = Router::new()
        .route("/v1/run_code", post(run_code_handler))
        .route(
            "/v1/validate_package",
            post(crate::validate::validate_package),
        )
        .route("/v1/browser_sessions", post(crate::browser::open))
        .route(
            "/v1/browser_sessions/{id}/actions",
            post(crate::browser::act),
        )
        .route(
            "/v1/browser_sessions/{id}/private",
            post(crate::browser::private),
        )
        .route(
            "/v1/browser_sessions/{id}/close",
            post(crate::browser::close),
        )
        .route(
            "/v1/browser_sessions/{id}/viewers",
            post(crate::viewer::viewers),
        )
        .route("/v1/runs/{run_id}/events", get(crate::run::events::resume))
        .route("/v1/read_workspace", get(read_workspace))
        .route("/v1/list_workspace", get(crate::workspace_files::list))
        .route("/v1/write_workspace", post(crate::workspace_files::write))
        .route("/v1/edit_workspace", post(crate::hashline::edit))
        .route("/v1/read_output", get(read_output))
        .layer(middleware::from_fn_with_state(state.clone(), caller_auth));
    let admin = Router::new()
        .route("/v1/admin/egress_policy", get(policy_get).put(policy_put))
        .layer(middleware::from_fn_with_state(state.clone(), admin_auth));
    let packages = state
        .broker
        .clone()
        .map_or_else(Router::new, crate::broker::routes);
    // The built-in sample platform's tool endpoint, by capability (`corral up` only).
    let sample = if state.sample_tools {
        Router::new().route("/v1/sample_tools", post(crate::tools::sample))
    } else {
        Router::new()
    };
    Router::new()
        .merge(caller)
        .merge(admin)
        // A worker's supervisor, by the run's token (KER-5).
        .route(corral_contract::routes::TOOL_CALL, post(crate::tools::call))
        .route("/v1/egress/verifying_key", get(verifying_key))
        // A member's viewer: authorized by its ticket, not the caller's credential (BROW-8).
        .route(
            "/api/browser-sessions/{id}/viewport/",
            get(crate::viewer::viewport),
        )
        .route(
            "/api/browser-sessions/{id}/viewport/{*path}",
            get(crate::viewer::viewport),
        )
        .route(
            "/api/browser-sessions/{id}/signal",
            get(crate::viewer::signal),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route(
            "/openapi.json",
            get(|| async { axum::Json(crate::openapi::document()) }),
        )
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(DefaultBodyLimit::max(body_max))
        .with_state(state)
        .merge(packages)
        .merge(sample)
}

fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    credential::bearer(headers.get(header::AUTHORIZATION)?.as_bytes())
}

fn matches(presented: Option<&[u8]>, expected: &str) -> bool {
    presented.is_some_and(|p| credential::matches(p, expected.as_bytes()))
}

/// Lets `request` through when it carries `expected`; otherwise 401 naming `who`.
async fn authorize(expected: &str, who: &str, request: Request, next: Next) -> Response {
    if matches(presented(request.headers()), expected) {
        next.run(request).await
    } else {
        error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!("a valid {who} credential is required"),
        )
    }
}

async fn caller_auth(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    authorize(&state.caller_credential, "caller", request, next).await
}

async fn admin_auth(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    authorize(&state.admin_credential, "admin", request, next).await
}

async fn run_code_handler(
    State(state): State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let request: RunCodeRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            // Truncated, not JSON, or not a run_code request: the same codes as the workers'.
            let code = corral_contract::ErrorBody::of_json(&e).error.code();
            return error(StatusCode::BAD_REQUEST, code, e.to_string());
        }
    };
    let streams = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/event-stream"));
    if streams {
        return progress_stream(state, request);
    }
    let (status, body) = run_code(state, request).await;
    let retry = body["error"]["retry_after_seconds"].as_u64();
    let mut response = (status, axum::Json(body)).into_response();
    if let Some(retry) = retry
        && let Ok(value) = retry.to_string().parse()
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// `run_code` as a server-sent event stream (WS-7, `corral_core::run::progress`): `run.queued`,
/// `run.running`, the code's output as `run.output` chunks (and `run.bound`), then one
/// `run.result` with `{status, body}`, each with its id; kept in the store so that the caller
/// resumes from any replica (`GET /v1/runs/{run_id}/events`). The run goes on to its end if the
/// caller hangs up.
fn progress_stream(state: Arc<AppState>, request: RunCodeRequest) -> Response {
    let run_id = crate::run::new_run_id();
    let (tx, numbered) = crate::run::events::start(
        state.clone(),
        run_id.clone(),
        &request.actor,
        &request.conversation,
    );
    let result = tx.clone();
    let id = run_id.clone();
    tokio::spawn(async move {
        let (status, body) = crate::run::run_code_with_progress(state, request, id, Some(tx)).await;
        let _ = result.send((
            corral_core::run::progress::RESULT,
            serde_json::json!({ "status": status.as_u16(), "body": body }),
        ));
    });
    crate::run::events::sse(run_id, numbered)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    actor: String,
    conversation: String,
    path: String,
    /// `raw` (the default): the bytes; `hashline`: the lines with their tags (WS-3).
    #[serde(default)]
    view: Option<String>,
    /// With `view=hashline`, the first line to show (1-based; default 1).
    #[serde(default)]
    start: Option<u32>,
    /// With `view=hashline`, how many lines to show (default and most: 2000).
    #[serde(default)]
    count: Option<u32>,
}

/// One file of a workspace's authoritative snapshot (WS-4): relative paths inside only.
async fn read_workspace(
    State(state): State<Arc<AppState>>,
    Query(query): Query<ReadQuery>,
) -> Response {
    if let Some(refused) = workspace_identity_refused(&query.actor, &query.conversation) {
        return refused;
    }
    let path = match corral_core::workspace::read_path(&query.path) {
        Ok(path) => path.to_owned(),
        Err(refused) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({ "outcome": "refused", "error": {
                    "code": refused.code(), "path": query.path,
                    "message": "read_workspace takes a relative path inside the workspace" } })),
            )
                .into_response();
        }
    };
    let hashline = match query.view.as_deref() {
        None | Some("raw") => false,
        Some("hashline") => true,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "view_unknown",
                "view is raw (the bytes) or hashline (tagged lines)",
            );
        }
    };
    let key = corral_core::workspace::storage_key(&query.actor, &query.conversation);
    let snapshot = match stored_workspace(&state, &key).await {
        Ok(snapshot) => snapshot,
        Err(refused) => return *refused,
    };
    if hashline {
        let count = query.count.unwrap_or(corral_core::hashline::VIEW_LINES_MAX);
        return crate::hashline::read(
            &state,
            &key,
            &path,
            &snapshot,
            query.start.unwrap_or(1),
            count,
        )
        .await;
    }
    match crate::workspaces::find_file(&snapshot.archive, &path, state.settings.bounds.workspace_max_bytes) {
        FileLookup::Found(bytes) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                (header::HeaderName::from_static("x-corral-workspace-generation"), snapshot.generation.to_string()),
            ],
            bytes,
        )
            .into_response(),
        FileLookup::NotFound => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({ "outcome": "refused", "error": {
                "code": "workspace_path_not_found", "path": path,
                "message": "no regular file at this path in the workspace (links are never stored)" } })),
        )
            .into_response(),
        FileLookup::Corrupt(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "workspace_snapshot_corrupt", e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputQuery {
    actor: String,
    conversation: String,
    reference: String,
}

/// One retained output (OUT-1), by the reference a run returned: the same actor and conversation
/// only, and it stays readable whatever later runs save.
async fn read_output(
    State(state): State<Arc<AppState>>,
    Query(query): Query<OutputQuery>,
) -> Response {
    if let Some(refused) = workspace_identity_refused(&query.actor, &query.conversation) {
        return refused;
    }
    let Some((run_id, path)) = corral_core::workspace::parse_output_reference(&query.reference)
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "output_reference_invalid",
            "a reference is output:<run id>/<relative path>, as a run returned it",
        );
    };
    let key = corral_core::workspace::storage_key(&query.actor, &query.conversation);
    match state.workspaces.read_output(&key, run_id, path).await {
        Ok(Some(bytes)) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                corral_core::downloads::media_type(path),
            )],
            bytes,
        )
            .into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "output_not_found",
            "no output by this reference for this actor in this conversation",
        ),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.code(), e.to_string()),
    }
}

async fn policy_get(State(state): State<Arc<AppState>>) -> Response {
    match state.egress.describe(&state.store).await {
        Ok(described) => axum::Json(described).into_response(),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "coordination_unavailable",
            "Valkey cannot be reached",
        ),
    }
}

/// Replaces the policy. The body is an object of raw setting values by name (only the egress
/// policy settings); an absent name is an absent setting. The answer is the policy as resolved.
async fn policy_put(State(state): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    let fields: BTreeMap<String, Value> = match serde_json::from_slice(&body) {
        Ok(fields) => fields,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
    };
    let mut values = BTreeMap::new();
    for (name, value) in fields {
        if !corral_store::policy::POLICY_FIELDS.contains(&name.as_str()) {
            return error(
                StatusCode::BAD_REQUEST,
                "policy_field_unknown",
                format!(
                    "{name} is not an egress policy setting; the settings are {:?}",
                    corral_store::policy::POLICY_FIELDS
                ),
            );
        }
        let text = match value {
            Value::Null => continue,
            Value::String(s) => s,
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(","),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "policy_value_invalid",
                    format!("{name}: a string, number, boolean or list"),
                );
            }
        };
        // Read as the environment's values are: trimmed, and blank is unset.
        let Some(text) = corral_core::config::setting_value(&text) else {
            continue;
        };
        if text.len() > corral_core::egress::policy::SETTING_LIST_MAX_BYTES {
            return error(
                StatusCode::BAD_REQUEST,
                "policy_value_too_long",
                format!(
                    "{name}: at most {} bytes",
                    corral_core::egress::policy::SETTING_LIST_MAX_BYTES
                ),
            );
        }
        values.insert(name, text.to_owned());
    }
    if state.store.replace_egress_policy(&values).await.is_err() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "coordination_unavailable",
            "Valkey cannot be reached",
        );
    }
    policy_get(State(state)).await
}

async fn verifying_key(State(state): State<Arc<AppState>>) -> Response {
    match state.egress.verifying_key() {
        Some(key) => ([(header::CONTENT_TYPE, "text/plain")], key).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "field_key_missing",
            "no field key is configured: no grant is ever minted (EGR-8)",
        ),
    }
}

/// Ready when coordination and storage are; the proxy and key state are reported, since runs
/// proceed without them with the network denied (EGR-8).
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let coordination = state.store.now().await.is_ok();
    let storage = state
        .workspaces
        .latest("0000000000000000000000000000000000000000000000000000000000000000")
        .await
        .is_ok();
    let proxy = state.egress.proxy_state().await;
    let key = state.egress.verifying_key().is_some();
    let ready = coordination && storage;
    (
        if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        axum::Json(json!({
            "ready": ready,
            "coordination": if coordination { "ok" } else { "unavailable" },
            "storage": if storage { "ok" } else { "unavailable" },
            "egress_proxy": proxy.as_str(),
            "field_key": if key { "present" } else { "missing" },
        })),
    )
        .into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let pool = match state.store.load().await {
        Ok(Loaded::Found { doc, .. }) => Some((doc.counts(), doc.tickets().count())),
        _ => None,
    };
    let mut text = state.metrics.render(pool, state.store.write_counts());
    if let Some(broker) = &state.broker {
        text.push_str(&format!(
            "# HELP corral_package_registry_dials_total Connections the package broker opened to a registry.\n\
             # TYPE corral_package_registry_dials_total counter\n\
             corral_package_registry_dials_total {}\n\
             # HELP corral_package_tokens_total Package broker tokens minted (one per run that installs).\n\
             # TYPE corral_package_tokens_total counter\n\
             corral_package_tokens_total {}\n",
            broker.dials(),
            broker.minted()
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
