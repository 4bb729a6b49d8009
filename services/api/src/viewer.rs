//! Members' viewers of a session's live view (BROW-2, BROW-8, BROW-9, BROW-12).
//!
//! - `POST /v1/browser_sessions/{id}/viewers` `{actor, conversation, member}` (the caller's
//!   credential, authorized as every session call is): a ticket for `member`, and the viewport's
//!   address with it.
//! - `GET /api/browser-sessions/{id}/viewport/{path}?ticket=…`: the static client, and nothing
//!   else. The ticket is checked against the session's record (same conversation, not closing,
//!   not another member's private interval) and the path is judged by
//!   `corral_core::browser::viewport::resolve` on what it resolves to, so no spelling reaches an
//!   `api/` path.
//! - `GET /api/browser-sessions/{id}/signal?ticket=…`: the signaling relay, a WebSocket. It sends
//!   the session's ICE configuration (its one TURN authority and credential, relay only), relays
//!   each offer to the worker's adapter and its answer back, and looks at the record again every
//!   [`RECHECK`]: a relay whose member may no longer watch is closed with the reason's code and
//!   whether the page should connect again (`viewer::after_close`: close code 4403 when the
//!   reason stands, such as `private_text` or `session_not_found`; 4503 when it passes).
//!
//! No cookie is set anywhere here: the ticket travels in the URL (the page is served with
//! `Referrer-Policy: no-referrer`), so concurrent sessions' viewers never collide on an origin.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use corral_contract::CallError;
use corral_contract::messages::BrowserSignalRequest;
use corral_core::browser::turn::TurnCredential;
use corral_core::browser::viewer::{
    self, AfterClose, OfferRefusal, SIGNAL_MAX_BYTES, SignalRefusal, Ticket, TicketKey, ViewRefusal,
};
use corral_core::browser::viewport::{self, ViewportRefusal};
use corral_core::browser::{Call, SessionRecord};
use corral_core::ids::first_invalid_identity;
use corral_core::run::admission::RefusalCode;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::browser::{SessionCall, refused, session_call, unavailable};

/// How often a signaling relay looks at the session's record again.
pub const RECHECK: Duration = Duration::from_millis(250);
/// The viewport's prefix; the session id and `/viewport/` follow.
pub const VIEWPORT_PREFIX: &str = "/api/browser-sessions/";

/// The static client: its page and its script.
const INDEX_HTML: &str = include_str!("viewer/index.html");
const VIEWER_JS: &str = include_str!("viewer/viewer.js");

fn key(state: &AppState) -> TicketKey {
    TicketKey::derive(state.caller_credential.as_bytes())
}

/// `POST /v1/browser_sessions/{id}/viewers`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewersRequest {
    actor: String,
    conversation: String,
    member: String,
}

impl SessionCall for ViewersRequest {
    fn owner(&self) -> (&str, &str) {
        (&self.actor, &self.conversation)
    }
    fn call(&self) -> Call<'_> {
        Call::Watch
    }
}

/// A ticket for a member to watch the session.
pub async fn viewers(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (request, record) = match session_call::<ViewersRequest>(&state, &id, &body).await {
        Ok(call) => call,
        Err(response) => return *response,
    };
    if let Some((_, message)) = first_invalid_identity(&[("member", &request.member)]) {
        return refused(
            StatusCode::BAD_REQUEST,
            RefusalCode::InvalidIdentity.code(),
            message,
        );
    }
    let now = match state.store.now().await {
        Ok(now) => now,
        Err(error) => return *unavailable(error),
    };
    let (ticket, expires_at) = viewer::mint(
        &key(&state),
        &id,
        &record.conversation,
        &request.member,
        now,
    );
    let query = format!("?ticket={ticket}");
    Json(json!({
        "session": id,
        "member": request.member,
        "ticket": ticket,
        "expires_at_ms": expires_at.0,
        "viewport": format!("{VIEWPORT_PREFIX}{id}/viewport/{query}"),
        "signal": format!("{VIEWPORT_PREFIX}{id}/signal{query}"),
    }))
    .into_response()
}

fn view_refused(refusal: &ViewRefusal) -> Response {
    let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::FORBIDDEN);
    refused(status, refusal.code(), refusal.to_string())
}

/// The ticket's member, and the session's record, when they may watch now.
async fn authorize(
    state: &AppState,
    id: &str,
    ticket: Option<&str>,
) -> Result<(Ticket, SessionRecord), Response> {
    let now = state.store.now().await.map_err(|e| *unavailable(e))?;
    let ticket = viewer::verify(&key(state), ticket.unwrap_or_default(), id, now)
        .map_err(|refusal| view_refused(&refusal))?;
    let record = judge(state, id, &ticket).await?;
    Ok((ticket, record))
}

/// The stored session judged for `ticket` (`viewer::judge_view`).
async fn judge(state: &AppState, id: &str, ticket: &Ticket) -> Result<SessionRecord, Response> {
    let stored = state
        .store
        .browser_session_viewed(id)
        .await
        .map_err(|e| *unavailable(e))?;
    viewer::judge_view(
        stored.as_ref().map(|(record, state, _)| (record, state)),
        ticket,
        stored.as_ref().and_then(|(_, _, member)| member.as_deref()),
    )
    .map_err(|refusal| view_refused(&refusal))?;
    let (record, _, _) = stored.ok_or_else(|| view_refused(&ViewRefusal::NotFound))?;
    Ok(record)
}

/// The query of a viewer's request.
#[derive(Deserialize)]
pub struct TicketQuery {
    #[serde(default)]
    ticket: Option<String>,
}

/// The part of `raw` (a request's path, as received) after `/api/browser-sessions/{id}/viewport/`.
fn viewport_rest<'a>(raw: &'a str, id: &str) -> Option<&'a str> {
    raw.strip_prefix(VIEWPORT_PREFIX)?
        .strip_prefix(id)?
        .strip_prefix("/viewport/")
}

/// `GET /api/browser-sessions/{id}/viewport/{path}`: the static client only (BROW-8).
pub async fn viewport(
    State(state): State<Arc<AppState>>,
    Path(params): Path<std::collections::HashMap<String, String>>,
    Query(query): Query<TicketQuery>,
    uri: Uri,
) -> Response {
    let Some(id) = params.get("id") else {
        return refused(StatusCode::NOT_FOUND, "not_found", "no such path");
    };
    // Judged on the path as received: the router's own decoding is not what the guard reads.
    let Some(rest) = viewport_rest(uri.path(), id) else {
        return refused(StatusCode::NOT_FOUND, "not_found", "no such path");
    };
    let path = match viewport::resolve(rest) {
        Ok(path) => path,
        Err(refusal) => {
            let status = match refusal {
                ViewportRefusal::AdapterApi => StatusCode::FORBIDDEN,
                ViewportRefusal::Malformed(_) => StatusCode::BAD_REQUEST,
            };
            return refused(status, refusal.code(), refusal.to_string());
        }
    };
    if let Err(response) = authorize(&state, id, query.ticket.as_deref()).await {
        return response;
    }
    let (body, kind) = match path.as_str() {
        // The page loads its script with the same ticket (a verified ticket is base64url and
        // dots only, so it is safe in the attribute).
        "" | "index.html" => (
            INDEX_HTML.replace("{ticket}", query.ticket.as_deref().unwrap_or_default()),
            "text/html; charset=utf-8",
        ),
        "viewer.js" => (VIEWER_JS.to_owned(), "text/javascript; charset=utf-8"),
        _ => {
            return refused(
                StatusCode::NOT_FOUND,
                "viewport_not_found",
                "the viewport serves its client's page and script only",
            );
        }
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'self'; connect-src 'self'; media-src 'self' blob:; style-src 'unsafe-inline'",
            ),
        ],
        body,
    )
        .into_response()
}

/// `GET /api/browser-sessions/{id}/signal` (a WebSocket): the signaling relay.
pub async fn signal(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<TicketQuery>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let (ticket, record) = match authorize(&state, &id, query.ticket.as_deref()).await {
        Ok(authorized) => authorized,
        Err(response) => return response,
    };
    upgrade
        .max_message_size(SIGNAL_MAX_BYTES)
        .max_frame_size(SIGNAL_MAX_BYTES)
        .on_upgrade(move |socket| relay(state, id, ticket, record, socket))
}

/// One signaling message from the viewer.
#[derive(Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
enum Signal {
    /// An SDP offer, its ICE gathering complete (its candidates in it).
    Offer { sdp: String },
    /// The member is using the pointer or keyboard: the session is not idle (BROW-6).
    Activity {},
}

async fn send(socket: &mut WebSocket, message: &Value) -> bool {
    socket
        .send(Message::Text(message.to_string().into()))
        .await
        .is_ok()
}

/// Closes the relay with `code`, saying whether the page should connect again
/// (`viewer::after_close`): a standing reason is closed as 4403, a passing one as 4503.
async fn close(socket: &mut WebSocket, code: &str, message: String) {
    let reconnect = viewer::after_close(code) == AfterClose::Reconnect;
    let _ = send(
        socket,
        &json!({ "t": "closed", "code": code, "message": message, "reconnect": reconnect }),
    )
    .await;
    let frame = CloseFrame {
        code: if reconnect { 4503 } else { 4403 },
        reason: code.to_owned().into(),
    };
    let _ = socket.send(Message::Close(Some(frame))).await;
}

/// Relays one viewer's signaling until the socket ends or the member may no longer watch: the
/// live view's config first (again whenever its credential is renewed), then an answer to each
/// message.
async fn relay(
    state: Arc<AppState>,
    id: String,
    ticket: Ticket,
    record: SessionRecord,
    mut socket: WebSocket,
) {
    let Some(credential) = &record.live_view else {
        close(
            &mut socket,
            OfferRefusal::Stopped.code(),
            "this session has no live view".into(),
        )
        .await;
        return;
    };
    let config = |credential: &TurnCredential| {
        config_message(
            credential,
            &ticket.member,
            state.settings.browser_idle_seconds,
        )
    };
    if !send(&mut socket, &config(credential)).await {
        return;
    }
    let mut sent = credential.clone();
    let viewer = format!(
        "{}/{}",
        ticket.member,
        corral_core::ids::hex(&corral_contract::credential::random_bytes()[..8])
    );
    let mut recheck = tokio::time::interval(RECHECK);
    loop {
        tokio::select! {
            message = socket.recv() => {
                let text = match message {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(_)) => {
                        let _ = send(&mut socket, &error_answer(SignalRefusal::Invalid.code(), "signaling messages are JSON text".into())).await;
                        continue;
                    }
                    Some(Err(_)) | None => return,
                };
                let answer = match answer_signal(&state, &id, &ticket, &record, &viewer, &text).await {
                    Ok(Some(answer)) => answer,
                    Ok(None) => continue,
                    Err((code, message)) => {
                        close(&mut socket, &code, message).await;
                        return;
                    }
                };
                if !send(&mut socket, &answer).await {
                    return;
                }
            }
            _ = recheck.tick() => {
                match judge(&state, &id, &ticket).await {
                    Err(response) => {
                        let (code, message) = refusal_of(response).await;
                        close(&mut socket, &code, message).await;
                        return;
                    }
                    // A renewed credential: the page reconnects through the worker's new relay.
                    Ok(current) => {
                        if let Some(renewed) = current.live_view.filter(|c| *c != sent) {
                            if !send(&mut socket, &config(&renewed)).await {
                                return;
                            }
                            sent = renewed;
                        }
                    }
                }
            }
        }
    }
}

/// The live view's config for the viewer: the relay-only ICE servers of `credential`, the member,
/// and how often the page reports activity.
fn config_message(credential: &TurnCredential, member: &str, idle_seconds: u64) -> Value {
    json!({
        "t": "config",
        "ice_servers": [credential.ice_server()],
        "ice_transport_policy": "relay",
        "member": member,
        "activity_every_ms": viewer::activity_every_ms(idle_seconds),
    })
}

/// The answer to one signaling message of the viewer's: `Ok(None)` when nothing is answered,
/// `Err` with the code and message to close the relay with when the member may not watch.
async fn answer_signal(
    state: &AppState,
    id: &str,
    ticket: &Ticket,
    record: &SessionRecord,
    viewer: &str,
    text: &str,
) -> Result<Option<Value>, (String, String)> {
    match serde_json::from_str::<Signal>(text) {
        Err(e) => Ok(Some(error_answer(
            SignalRefusal::Invalid.code(),
            e.to_string(),
        ))),
        Ok(Signal::Offer { sdp }) => {
            if let Err(response) = judge(state, id, ticket).await {
                return Err(refusal_of(response).await);
            }
            Ok(Some(
                offer(state, record, viewer, &ticket.member, sdp).await,
            ))
        }
        Ok(Signal::Activity {}) => {
            // Counted only while the member may watch; nothing is answered.
            if judge(state, id, ticket).await.is_ok()
                && let Ok(now) = state.store.now().await
            {
                let _ = state.store.touch_browser_session(id, now).await;
            }
            Ok(None)
        }
    }
}

/// The stable code in a refusal's body, and its message.
async fn refusal_of(response: Response) -> (String, String) {
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let body = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str().map_or_else(
        || {
            corral_contract::ErrorCode::LiveViewRefused
                .code()
                .to_owned()
        },
        str::to_owned,
    );
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or("the live view is not available to this viewer now")
        .to_owned();
    (code, message)
}

async fn offer(
    state: &AppState,
    record: &SessionRecord,
    viewer: &str,
    member: &str,
    sdp: String,
) -> Value {
    let request = BrowserSignalRequest {
        viewer: viewer.to_owned(),
        member: member.to_owned(),
        sdp,
    };
    match state.workers.browser_signal(record.worker, &request).await {
        Ok(reply) => json!({ "t": "answer", "sdp": reply.sdp }),
        Err(CallError::Refused(body)) => error_answer(
            &body
                .detail
                .reason
                .clone()
                .unwrap_or_else(|| body.error.code().to_owned()),
            body.detail.message.clone().unwrap_or_default(),
        ),
        Err(error) => error_answer(SignalRefusal::Unreachable.code(), error.to_string()),
    }
}

/// An error answer with `code`, saying whether the page should offer again
/// (`viewer::after_close`); the relay stays open either way.
fn error_answer(code: &str, message: String) -> Value {
    json!({
        "t": "error",
        "code": code,
        "message": message,
        "reconnect": viewer::after_close(code) == AfterClose::Reconnect,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brow_08_the_guard_reads_the_path_after_the_sessions_viewport_prefix() {
        assert_eq!(
            viewport_rest("/api/browser-sessions/ab12/viewport/x/../api/", "ab12"),
            Some("x/../api/")
        );
        assert_eq!(
            viewport_rest("/api/browser-sessions/ab12/viewport/", "ab12"),
            Some("")
        );
        assert_eq!(
            viewport_rest("/api/browser-sessions/ab12/other/", "ab12"),
            None
        );
        assert_eq!(
            viewport_rest("/api/browser-sessions/ab1/viewport/", "ab12"),
            None
        );
    }
}
