//! Browser sessions (BROW-1, BROW-6, BROW-10, BROW-12, BROW-13): a headed Chromium on a leased
//! worker that an agent drives with structured actions.
//!
//! - `POST /v1/browser_sessions` `{actor, conversation, member, url?}`: sweeps idle sessions,
//!   takes a ticket in the one queue (same ceiling and per-member fairness as code runs) for a
//!   lease in the browser namespace (it does not evict the member's code lease), mints the
//!   session's egress grant, and opens the runtime on the worker; the lease is renewed while the
//!   session lives. With `url`, navigates there first (the browser policy admits it; the egress
//!   proxy stays the final boundary).
//! - `POST /v1/browser_sessions/{id}/actions` `{actor, conversation, action}`: one action
//!   (`corral_core::browser::Action`), bounded in time and size.
//! - `POST /v1/browser_sessions/{id}/private` `{actor, conversation, private}`: a member marks
//!   an interval private (BROW-12); the agent's reads and actions are refused meanwhile.
//! - `POST /v1/browser_sessions/{id}/close` `{actor, conversation}`: the worker stops every
//!   process, deletes the profile and resets; a close it does not confirm discards the worker.
//!
//! Every call is authorized by the session's actor and conversation: another's session is not
//! found. A session idle for `CORRAL_BROWSER_IDLE_SECONDS` is closed by a sweeper.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use corral_contract::CallError;
use corral_contract::messages::BrowserOpenRequest;
use corral_core::browser::{Action, ActionError};
use corral_core::ids::{
    ActorId, ConversationId, LeaseNamespace, LeaseScope, MemberId, OpToken, WorkerId,
    first_invalid_identity,
};
use corral_core::pool::Disposition;
use corral_core::run::admission::RefusalCode;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::run::lease;

/// One open session.
struct Session {
    actor: String,
    conversation: String,
    worker: WorkerId,
    token: OpToken,
    /// Whether its egress policy gave it a grant: without one it navigates nowhere but
    /// `about:blank`.
    networked: bool,
    holder: Mutex<Option<lease::Holder>>,
    /// Whether a member marked the session private (BROW-12).
    private: AtomicBool,
    last_activity: Mutex<Instant>,
    /// One call at a time reaches the worker.
    turn: tokio::sync::Mutex<()>,
}

/// The open sessions of this API.
#[derive(Default)]
pub struct Sessions {
    open: Mutex<BTreeMap<String, Arc<Session>>>,
    sweeping: AtomicBool,
}

impl Sessions {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Session>>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The session `id`, if `actor` and `conversation` own it.
    fn authorized(&self, id: &str, actor: &str, conversation: &str) -> Option<Arc<Session>> {
        self.map()
            .get(id)
            .filter(|s| s.actor == actor && s.conversation == conversation)
            .cloned()
    }

    /// How many are open.
    #[must_use]
    pub fn count(&self) -> usize {
        self.map().len()
    }
}

fn refused(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({ "outcome": "refused", "error": { "code": code, "message": message.into() } })),
    )
        .into_response()
}

/// The request body as `T`, or the refusal with the stable code of what is wrong with it.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Box<Response>> {
    serde_json::from_slice(body).map_err(|e| {
        let code = corral_contract::ErrorBody::of_json(&e).error.code();
        Box::new(refused(StatusCode::BAD_REQUEST, code, e.to_string()))
    })
}

/// A call on one session: its body names the actor and conversation that must own it.
trait SessionCall: serde::de::DeserializeOwned {
    fn owner(&self) -> (&str, &str);
}

/// The request and the session it may act on, or the refusal: a malformed body, or a session
/// this actor and conversation do not own (not found, like one that does not exist).
fn session_call<T: SessionCall>(
    state: &AppState,
    id: &str,
    body: &[u8],
) -> Result<(T, Arc<Session>), Box<Response>> {
    let request: T = parse(body)?;
    let (actor, conversation) = request.owner();
    match state.browser.authorized(id, actor, conversation) {
        Some(session) => Ok((request, session)),
        None => Err(Box::new(not_found())),
    }
}

fn not_found() -> Response {
    refused(
        StatusCode::NOT_FOUND,
        "browser_session_not_found",
        "no such session in this conversation",
    )
}

/// `POST /v1/browser_sessions`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenRequest {
    actor: String,
    conversation: String,
    member: String,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    wait_seconds: Option<u64>,
}

/// Opens a session.
pub async fn open(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let request: OpenRequest = match parse(&body) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    if let Some((_, message)) = first_invalid_identity(&[
        ("actor", &request.actor),
        ("conversation", &request.conversation),
        ("member", &request.member),
    ]) {
        return refused(
            StatusCode::BAD_REQUEST,
            RefusalCode::InvalidIdentity.code(),
            message,
        );
    }
    let first = request.url.as_ref().map(|url| Action::Navigate {
        url: url.clone(),
        timeout_ms: None,
    });
    if let Some(Err(why)) = first.as_ref().map(Action::check) {
        return refused(StatusCode::BAD_REQUEST, ActionError::Invalid.code(), why);
    }
    // Open sweeps idle sessions first (BROW-13).
    reap_idle(&state).await;
    let wait_ms = request
        .wait_seconds
        .map_or(state.settings.pool().acquire_wait_ms, |s| {
            s.saturating_mul(1_000)
                .min(state.settings.pool().acquire_wait_ms)
        });
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let scope = LeaseScope {
        namespace: LeaseNamespace::Browser,
        actor: ActorId(request.actor.clone()),
        conversation: ConversationId(request.conversation.clone()),
    };
    let mut watch = None;
    let member = MemberId(request.member.clone());
    let (granted, asked_at) =
        match lease::acquire_in(&state, &member, scope, deadline, &mut watch).await {
            Ok(acquired) => acquired,
            Err(error) => {
                let (status, body) = crate::run::answer::admission_refused(&state, &error, wait_ms);
                if let corral_store::lease::AcquireError::WaitTimeout { orders } = error {
                    lease::perform_orders(state.clone(), orders);
                }
                return (status, Json(body)).into_response();
            }
        };
    let holder = lease::Holder::start(state.clone(), granted, asked_at);
    let id = corral_core::ids::hex(&corral_contract::credential::random_bytes()[..16]);
    let now = corral_core::time::UnixMillis(
        granted
            .expires_at
            .0
            .saturating_sub(state.settings.lease_ttl_seconds.saturating_mul(1_000)),
    );
    let egress = state
        .egress
        .for_run(
            &state.store,
            &id,
            &ActorId(request.actor.clone()),
            None,
            now,
        )
        .await;
    let opened = state
        .workers
        .browser_open(
            granted.worker,
            &BrowserOpenRequest {
                grant: egress.grant.clone(),
                width: corral_core::browser::WIDTH,
                height: corral_core::browser::HEIGHT,
                token: granted.token,
            },
        )
        .await;
    let opened = match opened {
        Ok(opened) => opened,
        Err(error) => {
            let disposition = match &error {
                CallError::Refused(body) if body.error.before_anything_ran() => Disposition::Reset,
                CallError::Unreachable(_) => Disposition::Reset,
                _ => Disposition::Discard,
            };
            holder.release(disposition);
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "browser_open_failed",
                format!("the session's runtime did not start: {error}"),
            );
        }
    };
    let session = Arc::new(Session {
        actor: request.actor,
        conversation: request.conversation,
        worker: granted.worker,
        token: granted.token,
        networked: egress.grant.is_some(),
        holder: Mutex::new(Some(holder)),
        private: AtomicBool::new(false),
        last_activity: Mutex::new(Instant::now()),
        turn: tokio::sync::Mutex::new(()),
    });
    state.browser.map().insert(id.clone(), session.clone());
    start_sweeper(&state);
    let mut body = json!({
        "session": id,
        "worker": granted.worker.to_string(),
        "start_ms": opened.start_ms,
        "isolation": opened.isolation,
        "egress": egress.report,
    });
    if let Some(first) = first {
        match act_on(&state, &session, &first).await {
            Ok(result) => body["navigated"] = result,
            Err(response) => {
                close_session(&state, &id, &session).await;
                return *response;
            }
        }
    }
    Json(body).into_response()
}

/// `POST /v1/browser_sessions/{id}/actions`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActRequest {
    actor: String,
    conversation: String,
    action: Action,
}

impl SessionCall for ActRequest {
    fn owner(&self) -> (&str, &str) {
        (&self.actor, &self.conversation)
    }
}

/// One action.
pub async fn act(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (request, session) = match session_call::<ActRequest>(&state, &id, &body) {
        Ok(call) => call,
        Err(response) => return *response,
    };
    if let Err(why) = request.action.check() {
        return refused(StatusCode::BAD_REQUEST, ActionError::Invalid.code(), why);
    }
    match act_on(&state, &session, &request.action).await {
        Ok(result) => Json(result).into_response(),
        Err(response) => *response,
    }
}

async fn act_on(
    state: &AppState,
    session: &Session,
    action: &Action,
) -> Result<Value, Box<Response>> {
    let _turn = session.turn.lock().await;
    if session.private.load(Ordering::SeqCst) {
        return Err(Box::new(refused(
            StatusCode::FORBIDDEN,
            ActionError::SessionPrivate.code(),
            "a member marked this session private: the assistant's reads and actions are refused until they end it",
        )));
    }
    // The egress policy decides whether the session may leave at all; the proxy judges each
    // host (the final boundary).
    if let Action::Navigate { url, .. } = action
        && !session.networked
        && url != "about:blank"
    {
        return Err(Box::new(refused(
            StatusCode::FORBIDDEN,
            ActionError::NavigationDenied.code(),
            "this deployment's egress policy gives the session no network",
        )));
    }
    *session
        .last_activity
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    match state.workers.browser_act(session.worker, action).await {
        Ok(reply) => Ok(json!({ "result": reply.result, "took_ms": reply.took_ms })),
        Err(CallError::Refused(body)) => {
            let code = body
                .detail
                .reason
                .clone()
                .unwrap_or_else(|| body.error.code().to_owned());
            let status = if body.error == corral_contract::error::ErrorCode::BrowserActionFailed {
                StatusCode::UNPROCESSABLE_ENTITY
            } else {
                StatusCode::CONFLICT
            };
            Err(Box::new(refused(
                status,
                &code,
                body.detail.message.unwrap_or_default(),
            )))
        }
        Err(error) => Err(Box::new(refused(
            StatusCode::BAD_GATEWAY,
            ActionError::BrowserGone.code(),
            error.to_string(),
        ))),
    }
}

/// `POST /v1/browser_sessions/{id}/private`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivateRequest {
    actor: String,
    conversation: String,
    private: bool,
}

impl SessionCall for PrivateRequest {
    fn owner(&self) -> (&str, &str) {
        (&self.actor, &self.conversation)
    }
}

/// Marks the session private, or ends the private interval (BROW-12).
pub async fn private(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (request, session) = match session_call::<PrivateRequest>(&state, &id, &body) {
        Ok(call) => call,
        Err(response) => return *response,
    };
    session.private.store(request.private, Ordering::SeqCst);
    Json(json!({ "session": id, "private": request.private })).into_response()
}

/// `POST /v1/browser_sessions/{id}/close`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloseRequest {
    actor: String,
    conversation: String,
}

impl SessionCall for CloseRequest {
    fn owner(&self) -> (&str, &str) {
        (&self.actor, &self.conversation)
    }
}

/// Closes the session.
pub async fn close(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (_, session) = match session_call::<CloseRequest>(&state, &id, &body) {
        Ok(call) => call,
        Err(response) => return *response,
    };
    let closed = close_session(&state, &id, &session).await;
    Json(closed).into_response()
}

/// Closes `session`: the worker stops every process and resets; the lease is released for reuse
/// only when it confirmed, and discarded otherwise (BROW-13).
async fn close_session(state: &AppState, id: &str, session: &Session) -> Value {
    let _turn = session.turn.lock().await;
    state.browser.map().remove(id);
    let holder = session
        .holder
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    let Some(holder) = holder else {
        return json!({ "session": id, "closed": true, "confirmed": false });
    };
    let reply = state
        .workers
        .browser_close(session.worker, session.token)
        .await;
    let (confirmed, evidence) = match &reply {
        Ok(reply) => (
            reply.confirmed && reply.reset_evidence.verdict == "clean",
            json!(reply.reset_evidence),
        ),
        Err(error) => (false, json!({ "error": error.to_string() })),
    };
    holder.release(if confirmed {
        Disposition::Reset
    } else {
        Disposition::Discard
    });
    json!({ "session": id, "closed": true, "confirmed": confirmed, "reset_evidence": evidence })
}

/// Closes every session idle longer than `CORRAL_BROWSER_IDLE_SECONDS` (BROW-6).
pub async fn reap_idle(state: &AppState) {
    let limit = Duration::from_secs(state.settings.browser_idle_seconds);
    let idle: Vec<(String, Arc<Session>)> = state
        .browser
        .map()
        .iter()
        .filter(|(_, s)| {
            s.last_activity
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .elapsed()
                >= limit
        })
        .map(|(id, s)| (id.clone(), s.clone()))
        .collect();
    for (id, session) in idle {
        close_session(state, &id, &session).await;
    }
}

/// How often the sweeper looks, at most: a tenth of the idle limit.
fn sweep_every(state: &AppState) -> Duration {
    Duration::from_millis(
        state
            .settings
            .browser_idle_seconds
            .saturating_mul(100)
            .clamp(100, 10_000),
    )
}

fn start_sweeper(state: &Arc<AppState>) {
    if !state.browser.sweeping.swap(true, Ordering::SeqCst) {
        tokio::spawn(sweep(Arc::downgrade(state)));
    }
}

async fn sweep(state: Weak<AppState>) {
    loop {
        let Some(every) = state.upgrade().map(|s| sweep_every(&s)) else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        reap_idle(&state).await;
    }
}
