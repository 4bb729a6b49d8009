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
//!
//! Session state is the deployment's, not this process's (BROW-14): the record (worker, lease
//! token, owner replica, privacy, last activity) lives in Valkey (`corral_store::browser`), so any
//! replica authorizes and serves any session's calls, reaps it or closes it. Only the lease is
//! held by the replica that opened it: whichever replica ends a session announces how, and the
//! owner releases the lease accordingly (a missed announcement is found by the owner's sweep).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use corral_contract::CallError;
use corral_contract::messages::{BrowserNavigated, BrowserOpenRequest, LiveViewOrder};
use corral_core::browser::turn::{self, TurnRefusal};
use corral_core::browser::{
    Action, ActionError, Call, CallRefusal, SessionRecord, SessionState, close_abandoned, is_idle,
    judge_call,
};
use corral_core::ids::{
    ActorId, ConversationId, LeaseNamespace, LeaseScope, MemberId, first_invalid_identity,
};
use corral_core::pool::Disposition;
use corral_core::run::admission::RefusalCode;
use corral_core::store::Unavailable;
use corral_store::browser::Ended;
use corral_store::lease::AcquireError;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::run::lease;

/// This replica's share of the browser sessions: the leases it holds. Everything else about a
/// session is in the deployment's store.
pub struct Sessions {
    /// This replica's name in the records of the sessions it opens.
    replica: String,
    /// The leases of the sessions this replica opened, by session.
    held: Mutex<BTreeMap<String, lease::Holder>>,
    /// Whether the sweeper and the watcher of ends are running.
    background: AtomicBool,
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            replica: corral_core::ids::hex(&corral_contract::credential::random_bytes()[..8]),
            held: Mutex::default(),
            background: AtomicBool::new(false),
        }
    }
}

impl Sessions {
    fn held(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, lease::Holder>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends the lease of session `id` if this replica holds it.
    fn release(&self, id: &str, disposition: Disposition) {
        if let Some(holder) = self.held().remove(id) {
            holder.release(disposition);
        }
    }

    /// How many sessions' leases this replica holds.
    #[must_use]
    pub fn count(&self) -> usize {
        self.held().len()
    }
}

pub(crate) fn refused(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({ "outcome": "refused", "error": { "code": code, "message": message.into() } })),
    )
        .into_response()
}

/// The request body as `T`, or the refusal with the stable code of what is wrong with it.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Box<Response>> {
    serde_json::from_slice(body).map_err(|e| {
        let code = corral_contract::ErrorBody::of_json(&e).error.code();
        Box::new(refused(StatusCode::BAD_REQUEST, code, e.to_string()))
    })
}

pub(crate) fn unavailable(_: Unavailable) -> Box<Response> {
    Box::new(refused(
        StatusCode::SERVICE_UNAVAILABLE,
        AcquireError::CoordinationUnavailable.code(),
        "Valkey, which keeps the sessions, cannot be reached",
    ))
}

pub(crate) fn call_refused(refusal: CallRefusal) -> Box<Response> {
    Box::new(match refusal {
        CallRefusal::NotFound => refused(
            StatusCode::NOT_FOUND,
            "browser_session_not_found",
            "no such session in this conversation",
        ),
        CallRefusal::Private => refused(
            StatusCode::FORBIDDEN,
            ActionError::SessionPrivate.code(),
            "a member marked this session private: the assistant's reads and actions are refused until they end it",
        ),
        CallRefusal::NoNetwork => refused(
            StatusCode::FORBIDDEN,
            ActionError::NavigationDenied.code(),
            "this deployment's egress policy gives the session no network",
        ),
    })
}

/// A call on one session: its body names the actor and conversation that must own it.
pub(crate) trait SessionCall: serde::de::DeserializeOwned {
    fn owner(&self) -> (&str, &str);
    fn call(&self) -> Call<'_>;
}

/// The request and the session it may act on, judged from the stored session by corral-core's
/// one rule (`browser::judge_call`), or the refusal.
pub(crate) async fn session_call<T: SessionCall>(
    state: &AppState,
    id: &str,
    body: &[u8],
) -> Result<(T, SessionRecord), Box<Response>> {
    let request: T = parse(body)?;
    let stored = state.store.browser_session(id).await.map_err(unavailable)?;
    let (actor, conversation) = request.owner();
    judge_call(
        stored.as_ref().map(|(record, state)| (record, state)),
        actor,
        conversation,
        request.call(),
    )
    .map_err(call_refused)?;
    let (record, _) = stored.ok_or_else(|| call_refused(CallRefusal::NotFound))?;
    Ok((request, record))
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
    let first = match first_navigation(&request) {
        Ok(first) => first,
        Err(response) => return *response,
    };
    // The live view's TURN credential first: a session nobody could watch is not opened
    // (BROW-9), and nothing is leased for it.
    let id = corral_core::ids::hex(&corral_contract::credential::random_bytes()[..16]);
    let (turn, turn_address) = match live_view_credential(&state, &id).await {
        Ok(credential) => credential,
        Err(response) => return *response,
    };
    // Open sweeps idle sessions first (BROW-13).
    reap_idle(&state).await;
    let (granted, asked_at) = match acquire_session_lease(&state, &request).await {
        Ok(acquired) => acquired,
        Err(response) => return *response,
    };
    let holder = lease::Holder::start(state.clone(), granted, asked_at);
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
    let record = SessionRecord {
        actor: request.actor,
        conversation: request.conversation,
        worker: granted.worker,
        token: granted.token,
        networked: egress.grant.is_some(),
        owner: state.browser.replica.clone(),
        live_view: Some(turn.clone()),
    };
    // The first navigation is judged by the rule every later call is (a session without network
    // opens only `about:blank`), then made by the worker as the runtime starts.
    if let Some(first) = &first
        && let Err(refusal) = judge_first_navigation(first, &record, now)
    {
        holder.release(Disposition::Reset);
        return *call_refused(refusal);
    }
    let order = open_order(&granted, &egress, request.url.clone(), &turn, turn_address);
    let opened = match state.workers.browser_open(granted.worker, &order).await {
        Ok(opened) => opened,
        Err(error) => return open_failed(holder, &error),
    };
    state.browser.held().insert(id.clone(), holder);
    if opened.relayed.is_none() {
        return refuse_unrelayed(&state, &id, &record, &opened.diagnostics).await;
    }
    if let Err(response) = store_session(&state, &id, &record).await {
        return *response;
    }
    let mut body = opened_body(&id, &granted, &opened, &turn, &egress.report);
    if first.is_some()
        && let Some(failed) = first_navigation_failure(opened.navigated, &mut body)
    {
        // A session whose first navigation failed is not left open.
        if claim_close(&state, &id).await == Ok(true) {
            finish_close(&state, &id, &record).await;
        }
        return failed;
    }
    Json(body).into_response()
}

/// The open's first navigation, checked, or the refusal of an invalid identity or URL.
fn first_navigation(request: &OpenRequest) -> Result<Option<Action>, Box<Response>> {
    if let Some((_, message)) = first_invalid_identity(&[
        ("actor", &request.actor),
        ("conversation", &request.conversation),
        ("member", &request.member),
    ]) {
        return Err(Box::new(refused(
            StatusCode::BAD_REQUEST,
            RefusalCode::InvalidIdentity.code(),
            message,
        )));
    }
    let first = request.url.as_ref().map(|url| Action::Navigate {
        url: url.clone(),
        timeout_ms: None,
    });
    if let Some(Err(why)) = first.as_ref().map(Action::check) {
        return Err(Box::new(refused(
            StatusCode::BAD_REQUEST,
            ActionError::Invalid.code(),
            why,
        )));
    }
    Ok(first)
}

/// The live view's TURN credential for session `id` and the relay's address, or the refusal.
async fn live_view_credential(
    state: &AppState,
    id: &str,
) -> Result<(turn::TurnCredential, std::net::SocketAddr), Box<Response>> {
    let turn = match state.store.now().await {
        Ok(now) => crate::live_view::credential(state, id, now).await,
        Err(unavailable_store) => return Err(unavailable(unavailable_store)),
    };
    turn.map_err(|refusal| {
        Box::new(refused(
            StatusCode::SERVICE_UNAVAILABLE,
            refusal.code(),
            format!("the live view cannot be offered: {refusal}"),
        ))
    })
}

/// A browser lease for the request's member, waited for within its bound, or the refusal.
async fn acquire_session_lease(
    state: &Arc<AppState>,
    request: &OpenRequest,
) -> Result<(corral_store::lease::Granted, tokio::time::Instant), Box<Response>> {
    let wait_ms = request
        .wait_seconds
        .map_or(state.settings.pool().acquire_wait_ms, |s| {
            s.saturating_mul(1_000)
                .min(state.settings.pool().acquire_wait_ms)
        });
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    let scope = LeaseScope {
        namespace: LeaseNamespace::Browser,
        actor: ActorId(request.actor.clone()),
        conversation: ConversationId(request.conversation.clone()),
    };
    let mut watch = None;
    let member = MemberId(request.member.clone());
    match lease::acquire_in(state, &member, scope, false, deadline, &mut watch).await {
        Ok(acquired) => Ok(acquired),
        Err(error) => {
            let (status, body) = crate::run::answer::admission_refused(state, &error, wait_ms);
            if let AcquireError::WaitTimeout { orders } = error {
                lease::perform_orders(state.clone(), orders);
            }
            Err(Box::new((status, Json(body)).into_response()))
        }
    }
}

/// The first navigation judged by the rule every later call is, on the fresh session.
fn judge_first_navigation(
    first: &Action,
    record: &SessionRecord,
    now: corral_core::time::UnixMillis,
) -> Result<(), CallRefusal> {
    let fresh = SessionState {
        private: false,
        last_activity: now,
        closing: None,
    };
    judge_call(
        Some((record, &fresh)),
        &record.actor,
        &record.conversation,
        Call::Act(first),
    )
}

/// The worker's order to start the session's runtime: its grant, first URL and live view.
fn open_order(
    granted: &corral_store::lease::Granted,
    egress: &crate::egress::RunEgress,
    url: Option<String>,
    turn: &turn::TurnCredential,
    turn_address: std::net::SocketAddr,
) -> BrowserOpenRequest {
    BrowserOpenRequest {
        grant: egress.grant.clone(),
        width: corral_core::browser::WIDTH,
        height: corral_core::browser::HEIGHT,
        token: granted.token,
        url,
        live_view: Some(LiveViewOrder {
            turn: turn_address,
            username: turn.username.clone(),
            password: turn.password.clone(),
        }),
    }
}

/// Releases the lease of a session whose runtime did not start, and refuses the open.
fn open_failed(holder: lease::Holder, error: &CallError) -> Response {
    let disposition = match error {
        CallError::Refused(body) if body.error.before_anything_ran() => Disposition::Reset,
        CallError::Unreachable(_) => Disposition::Reset,
        _ => Disposition::Discard,
    };
    holder.release(disposition);
    refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "browser_open_failed",
        format!("the session's runtime did not start: {error}"),
    )
}

/// Closes a session whose worker could not allocate its live view's relay, and refuses the open.
async fn refuse_unrelayed(
    state: &AppState,
    id: &str,
    record: &SessionRecord,
    diagnostics: &[String],
) -> Response {
    // A session nobody could watch is not left open (BROW-9): the worker could not allocate
    // its relay on the authority the API just heard from.
    if claim_close(state, id).await == Ok(true) {
        finish_close(state, id, record).await;
    }
    refused(
        StatusCode::SERVICE_UNAVAILABLE,
        TurnRefusal::Unreachable(String::new()).code(),
        format!(
            "the worker could not allocate the live view's relay: {}",
            diagnostics.join("; ")
        ),
    )
}

/// Stores the opened session for every replica, or closes it and refuses the open.
async fn store_session(
    state: &AppState,
    id: &str,
    record: &SessionRecord,
) -> Result<(), Box<Response>> {
    let stored = match state.store.now().await {
        Ok(now) => state.store.put_browser_session(id, record, now).await,
        Err(unavailable) => Err(unavailable),
    };
    if let Err(error) = stored {
        // A session no replica can find is closed at once: its worker is not left running.
        finish_close(state, id, record).await;
        return Err(unavailable(error));
    }
    Ok(())
}

/// The open's answer: the session, its worker, how it started, its live view and egress.
fn opened_body(
    id: &str,
    granted: &corral_store::lease::Granted,
    opened: &corral_contract::messages::BrowserOpenReply,
    turn: &turn::TurnCredential,
    egress: &Value,
) -> Value {
    json!({
        "session": id,
        "worker": granted.worker.to_string(),
        "start_ms": opened.start_ms,
        "isolation": opened.isolation,
        "start_phases_ms": opened.phases_ms,
        "live_view": {
            "ice_servers": [turn.ice_server()],
            "ice_transport_policy": "relay",
            "expires_at_ms": turn.expires_at.0,
            "viewers": format!("/v1/browser_sessions/{id}/viewers"),
        },
        "diagnostics": opened.diagnostics,
        "egress": egress,
    })
}

/// Adds the first navigation's result to the body, or the refusal when it failed or was not made.
fn first_navigation_failure(
    navigated: Option<BrowserNavigated>,
    body: &mut Value,
) -> Option<Response> {
    match navigated {
        Some(BrowserNavigated {
            result: Some(result),
            took_ms,
            ..
        }) => {
            body["navigated"] = json!({ "result": result, "took_ms": took_ms });
            None
        }
        Some(BrowserNavigated {
            error: Some((code, message)),
            ..
        }) => Some(refused(StatusCode::UNPROCESSABLE_ENTITY, &code, message)),
        Some(_) | None => Some(refused(
            StatusCode::BAD_GATEWAY,
            ActionError::BrowserError.code(),
            "the worker did not make the first navigation",
        )),
    }
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
    fn call(&self) -> Call<'_> {
        Call::Act(&self.action)
    }
}

/// One action.
pub async fn act(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (request, record) = match session_call::<ActRequest>(&state, &id, &body).await {
        Ok(call) => call,
        Err(response) => return *response,
    };
    if let Err(why) = request.action.check() {
        return refused(StatusCode::BAD_REQUEST, ActionError::Invalid.code(), why);
    }
    match act_on(&state, &id, &record, &request.action).await {
        Ok(result) => Json(result).into_response(),
        Err(response) => *response,
    }
}

/// Records the activity (refused if the session ended or began closing meanwhile) and performs
/// `action` on the session's worker.
async fn act_on(
    state: &AppState,
    id: &str,
    record: &SessionRecord,
    action: &Action,
) -> Result<Value, Box<Response>> {
    let now = state.store.now().await.map_err(unavailable)?;
    if !state
        .store
        .touch_browser_session(id, now)
        .await
        .map_err(unavailable)?
    {
        return Err(call_refused(CallRefusal::NotFound));
    }
    match state.workers.browser_act(record.worker, action).await {
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
    /// The member whose interval it is, who keeps their live view (BROW-12); the actor when
    /// absent.
    #[serde(default)]
    member: Option<String>,
}

impl SessionCall for PrivateRequest {
    fn owner(&self) -> (&str, &str) {
        (&self.actor, &self.conversation)
    }
    fn call(&self) -> Call<'_> {
        Call::Private
    }
}

/// Marks the session private, or ends the private interval (BROW-12).
pub async fn private(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (request, record) = match session_call::<PrivateRequest>(&state, &id, &body).await {
        Ok(call) => call,
        Err(response) => return *response,
    };
    let member = request.private.then(|| {
        request
            .member
            .clone()
            .unwrap_or_else(|| request.actor.clone())
    });
    if let Some((_, message)) = member
        .as_ref()
        .and_then(|member| first_invalid_identity(&[("member", member)]))
    {
        return refused(
            StatusCode::BAD_REQUEST,
            RefusalCode::InvalidIdentity.code(),
            message,
        );
    }
    match state
        .store
        .mark_browser_session_private(&id, member.as_deref())
        .await
    {
        Ok(true) => {}
        Ok(false) => return *call_refused(CallRefusal::NotFound),
        Err(error) => return *unavailable(error),
    }
    // Then the adapter removes every other member's peer: the signaling relays close on their
    // own next look at the record, and a viewer's page is not trusted to stop watching.
    let removed = state
        .workers
        .browser_private(record.worker, member.clone())
        .await;
    let removed = match removed {
        Ok(reply) => reply.removed,
        Err(error) => {
            return refused(
                StatusCode::BAD_GATEWAY,
                corral_core::browser::viewer::SignalRefusal::Unreachable.code(),
                format!(
                    "the interval is marked, but the worker's live view did not answer: {error}"
                ),
            );
        }
    };
    Json(json!({
        "session": id,
        "private": request.private,
        "member": member,
        "viewers_removed": removed.len(),
    }))
    .into_response()
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
    fn call(&self) -> Call<'_> {
        Call::Close
    }
}

/// Closes the session.
pub async fn close(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (_, record) = match session_call::<CloseRequest>(&state, &id, &body).await {
        Ok(call) => call,
        Err(response) => return *response,
    };
    match claim_close(&state, &id).await {
        Ok(true) => Json(finish_close(&state, &id, &record).await).into_response(),
        // Another call claimed it first.
        Ok(false) => *call_refused(CallRefusal::NotFound),
        Err(error) => *unavailable(error),
    }
}

/// Claims the close of session `id` at the deployment's time: true for exactly one claimant.
async fn claim_close(state: &AppState, id: &str) -> Result<bool, Unavailable> {
    let now = state.store.now().await?;
    state.store.claim_browser_close(id, now).await
}

/// Closes a session whose close this replica claimed: the worker stops every process and
/// resets; the lease is released for reuse only when it confirmed, and discarded otherwise
/// (BROW-13). The record ends with an announcement of how, for the replica holding the lease.
async fn finish_close(state: &AppState, id: &str, record: &SessionRecord) -> Value {
    let reply = state
        .workers
        .browser_close(record.worker, record.token)
        .await;
    let (confirmed, evidence) = match &reply {
        Ok(reply) => (
            reply.confirmed && reply.reset_evidence.verdict == "clean",
            json!(reply.reset_evidence),
        ),
        Err(error) => (false, json!({ "error": error.to_string() })),
    };
    let disposition = if confirmed {
        Disposition::Reset
    } else {
        Disposition::Discard
    };
    // Released here when this replica holds the lease; otherwise the announcement tells its
    // holder, and if the record cannot be ended the holder's sweep abandons the close in time.
    state.browser.release(id, disposition);
    if state
        .store
        .end_browser_session(id, disposition)
        .await
        .is_err()
    {
        state.metrics.unperformed("browser_session_end_unrecorded");
    }
    json!({ "session": id, "closed": true, "confirmed": confirmed, "reset_evidence": evidence })
}

/// Closes every session of the deployment idle longer than `CORRAL_BROWSER_IDLE_SECONDS`
/// (BROW-6), whichever replica opened it; one replica wins each close.
pub async fn reap_idle(state: &AppState) {
    let (Ok(sessions), Ok(now)) = (
        state.store.browser_sessions().await,
        state.store.now().await,
    ) else {
        return;
    };
    for (id, record, session) in sessions {
        if is_idle(&session, now, state.settings.browser_idle_seconds)
            && claim_close(state, &id).await == Ok(true)
        {
            finish_close(state, &id, &record).await;
        }
    }
}

/// Ends what this replica holds that nobody else will: a session that ended without its hearing
/// of it (a missed announcement: released as it ended, or as a discard once that is forgotten), a
/// session whose lease it lost, or whose close was claimed and abandoned (both ended as a
/// discard, since nothing vouches for the worker).
async fn check_held(state: &AppState) {
    let held: Vec<(String, bool)> = state
        .browser
        .held()
        .iter()
        .map(|(id, holder)| (id.clone(), holder.lost()))
        .collect();
    let Ok(now) = state.store.now().await else {
        return;
    };
    for (id, lost) in held {
        match state.store.browser_session(&id).await {
            Ok(None) => {
                let disposition = state
                    .store
                    .browser_session_ended(&id)
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or(Disposition::Discard);
                state.browser.release(&id, disposition);
            }
            Ok(Some((_, session))) if lost || close_abandoned(&session, now) => {
                if state
                    .store
                    .end_browser_session(&id, Disposition::Discard)
                    .await
                    .is_ok()
                {
                    state.browser.release(&id, Disposition::Discard);
                }
            }
            Ok(Some(_)) | Err(_) => {}
        }
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

/// Starts this replica's sweeper and its watcher of sessions' ends, once. Every replica sweeps
/// (a session is reaped even when the replica that opened it is gone).
pub fn start_background(state: &Arc<AppState>) {
    if !state.browser.background.swap(true, Ordering::SeqCst) {
        tokio::spawn(sweep(Arc::downgrade(state)));
        tokio::spawn(watch_ends(Arc::downgrade(state)));
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
        check_held(&state).await;
        renew_live_views(&state).await;
    }
}

/// Renews the TURN credential of each live view whose lease this replica holds, in the last
/// quarter of its life (BROW-9, `turn::needs_renewal`): the worker allocates a new relay with the
/// new credential first, then the record carries it, and each viewer's signaling relay hands it
/// to its page, which reconnects through the new relay before the old credential lapses.
async fn renew_live_views(state: &AppState) {
    let (Ok(sessions), Ok(now)) = (
        state.store.browser_sessions().await,
        state.store.now().await,
    ) else {
        return;
    };
    let ttl = state.settings.turn.credential_ttl_seconds;
    for (id, mut record, session) in sessions {
        let due = record
            .live_view
            .as_ref()
            .is_some_and(|credential| turn::needs_renewal(credential, now, ttl));
        if record.owner != state.browser.replica || session.closing.is_some() || !due {
            continue;
        }
        let Ok((credential, address)) = crate::live_view::credential(state, &id, now).await else {
            continue;
        };
        let order = LiveViewOrder {
            turn: address,
            username: credential.username.clone(),
            password: credential.password.clone(),
        };
        if state
            .workers
            .browser_turn(record.worker, &order)
            .await
            .is_err()
        {
            continue;
        }
        record.live_view = Some(credential);
        let _ = state.store.replace_browser_record(&id, &record).await;
    }
}

/// Releases a held lease as soon as another replica announces its session's end.
async fn watch_ends(state: Weak<AppState>) {
    loop {
        let Some(store) = state.upgrade().map(|s| s.store.clone()) else {
            return;
        };
        let Ok(mut watch) = store.watch_browser_ends().await else {
            // The sweep's check covers the leases meanwhile; subscribe again shortly.
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        loop {
            let ended = watch.next().await;
            let Some(state) = state.upgrade() else {
                return;
            };
            match ended {
                Ended::Session(id, disposition) => state.browser.release(&id, disposition),
                Ended::Missed => check_held(&state).await,
                Ended::Closed => break,
            }
        }
    }
}
