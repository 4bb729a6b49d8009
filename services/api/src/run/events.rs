//! A streamed run's events (WS-7, `corral_core::run::progress`): numbered, kept deployment-wide
//! in the store, and sent to the caller's stream; and a stream resumed from any replica with
//! `Last-Event-ID` (`GET /v1/runs/{run_id}/events`).
//!
//! One relay per streamed run takes what the run tells, sends `run.output` chunks of one stream
//! together when they come sooner than `OUTPUT_EVENT_INTERVAL_MS` after the last, numbers each
//! event, appends it to the store, then sends it on. The caller may hang up: the run, the relay
//! and the store's copy go on to the run's answer. The store being unavailable never holds the
//! run up: the events still reach the caller, only a later resume cannot have them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use corral_core::run::progress::{
    self, FOLLOW_POLL_MS, OUTPUT, OUTPUT_EVENT_INTERVAL_MS, RESULT, RESUME_BATCH, Stream,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::Progress;
use crate::AppState;
use crate::refusal::{error, workspace_identity_refused};

/// An event as the caller's stream sends it: its number, name and data.
pub type Numbered = (u64, &'static str, Value);

/// The owner recorded with a run's events: only the same actor and conversation resume it.
fn owner(actor: &str, conversation: &str) -> String {
    json!({ "actor": actor, "conversation": conversation }).to_string()
}

/// How long each event keeps the run's events.
fn keep_seconds(state: &AppState) -> u64 {
    progress::keep_seconds(
        state.settings.bounds.max_wall_seconds,
        state.settings.pool().acquire_wait_ms,
    )
}

/// Starts the relay of run `run_id` for `actor` and `conversation`: where the run tells its
/// progress, and the numbered events for the caller's stream.
pub fn start(
    state: Arc<AppState>,
    run_id: String,
    actor: &str,
    conversation: &str,
) -> (Progress, UnboundedReceiver<Numbered>) {
    let (told, events) = unbounded_channel();
    let (numbered, stream) = unbounded_channel();
    let owner = owner(actor, conversation);
    tokio::spawn(async move {
        let keep = keep_seconds(&state);
        let kept = matches!(
            state.store.open_run_events(&run_id, &owner, keep).await,
            Ok(true)
        );
        let mut relay = Relay {
            state,
            run_id,
            keep,
            kept,
            seq: 0,
            to_caller: numbered,
        };
        relay.run(events).await;
    });
    (told, stream)
}

struct Relay {
    state: Arc<AppState>,
    run_id: String,
    keep: u64,
    /// Whether the store still has every event so far.
    kept: bool,
    seq: u64,
    to_caller: UnboundedSender<Numbered>,
}

/// Output chunks not yet sent: one stream's text, in order.
struct Pending {
    stream: Stream,
    text: String,
}

impl Relay {
    async fn run(&mut self, mut events: UnboundedReceiver<(&'static str, Value)>) {
        let interval = Duration::from_millis(OUTPUT_EVENT_INTERVAL_MS);
        let mut pending: Option<Pending> = None;
        let mut last_output: Option<Instant> = None;
        loop {
            let next = match (&pending, last_output) {
                (Some(_), Some(at)) => {
                    match tokio::time::timeout_at((at + interval).into(), events.recv()).await {
                        Ok(next) => next,
                        Err(_) => {
                            self.flush(&mut pending, &mut last_output).await;
                            continue;
                        }
                    }
                }
                _ => events.recv().await,
            };
            let Some((name, data)) = next else {
                self.flush(&mut pending, &mut last_output).await;
                return;
            };
            if name != OUTPUT {
                self.flush(&mut pending, &mut last_output).await;
                self.emit(name, data).await;
                continue;
            }
            let Some((stream, text)) = output_of(&data) else {
                continue;
            };
            match &mut pending {
                Some(held) if held.stream == stream => held.text.push_str(&text),
                _ => {
                    self.flush(&mut pending, &mut last_output).await;
                    pending = Some(Pending { stream, text });
                }
            }
            if last_output.is_none_or(|at| at.elapsed() >= interval) {
                self.flush(&mut pending, &mut last_output).await;
            }
        }
    }

    /// Sends the pending output, if any.
    async fn flush(&mut self, pending: &mut Option<Pending>, last_output: &mut Option<Instant>) {
        if let Some(held) = pending.take() {
            *last_output = Some(Instant::now());
            self.emit(OUTPUT, json!({ "stream": held.stream, "text": held.text }))
                .await;
        }
    }

    /// Numbers the event, keeps it in the store, and sends it to the caller.
    async fn emit(&mut self, name: &'static str, data: Value) {
        self.seq += 1;
        if self.kept {
            let event = json!({ "name": name, "data": data }).to_string();
            self.kept = matches!(
                self.state
                    .store
                    .append_run_event(&self.run_id, self.seq, &event, self.keep)
                    .await,
                Ok(true)
            );
            if !self.kept {
                self.state.metrics.unperformed("run_events_not_kept");
            }
        }
        // A caller that hung up is not waited for.
        let _ = self.to_caller.send((self.seq, name, data));
    }
}

/// A `run.output` event's stream and text.
fn output_of(data: &Value) -> Option<(Stream, String)> {
    let stream = serde_json::from_value(data.get("stream")?.clone()).ok()?;
    Some((stream, data.get("text")?.as_str()?.to_owned()))
}

/// The caller's stream of run `run_id`: each numbered event with its id.
pub fn sse(run_id: String, stream: UnboundedReceiver<Numbered>) -> Response {
    let events = futures::stream::unfold(stream, move |mut stream| {
        let run_id = run_id.clone();
        async move {
            let (seq, name, data) = stream.recv().await?;
            Some((
                Ok::<_, std::convert::Infallible>(event(&run_id, seq, name, &data)),
                stream,
            ))
        }
    });
    Sse::new(events).into_response()
}

fn event(run_id: &str, seq: u64, name: &str, data: &Value) -> Event {
    Event::default()
        .id(progress::event_id(run_id, seq))
        .event(name)
        .data(data.to_string())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeQuery {
    actor: String,
    conversation: String,
}

/// `GET /v1/runs/{run_id}/events`: the events of a streamed run after the caller's
/// `Last-Event-ID` (all of them without one), then the rest as they come, to its `run.result`.
/// Only the actor and conversation that started the run may resume it; any other, like an
/// unknown or expired run, gets 404 `run_events_unknown`.
pub async fn resume(
    State(state): State<Arc<AppState>>,
    Path(run_id): Path<String>,
    Query(query): Query<ResumeQuery>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = workspace_identity_refused(&query.actor, &query.conversation) {
        return refused;
    }
    let unknown = || {
        error(
            StatusCode::NOT_FOUND,
            "run_events_unknown",
            "no events of this run for this actor and conversation: it was not streamed, is \
             another's, or its events expired",
        )
    };
    if run_id.is_empty() || run_id.len() > 128 || !run_id.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return unknown();
    }
    let first = match state.store.run_events(&run_id, 0, 0).await {
        Ok(Some(first)) => first,
        Ok(None) => return unknown(),
        Err(_) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the coordination store did not answer; resume again",
            );
        }
    };
    if first.owner != owner(&query.actor, &query.conversation) {
        return unknown();
    }
    let last = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => None,
        Some(Ok(text)) => Some(text),
        Some(Err(_)) => Some(""),
    };
    let after = match progress::resume_after(&run_id, last, first.published) {
        Ok(after) => after,
        Err(refused) => {
            return error(
                StatusCode::BAD_REQUEST,
                refused.code(),
                "Last-Event-ID must be an id this run's stream sent: <run id>-<n>",
            );
        }
    };
    let follow = Follow {
        state,
        run_id,
        after,
        batch: Vec::new(),
        done: false,
    };
    let events = futures::stream::unfold(follow, |mut follow| async move {
        let event = follow.next().await?;
        Some((Ok::<_, std::convert::Infallible>(event), follow))
    });
    Sse::new(events).into_response()
}

/// A resumed stream: the store's events after `after`, read in batches, until the result.
struct Follow {
    state: Arc<AppState>,
    run_id: String,
    after: u64,
    batch: Vec<(u64, String)>,
    done: bool,
}

impl Follow {
    /// The next event; `None` after the result, or once the run's events are gone.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if self.done {
                return None;
            }
            if !self.batch.is_empty() {
                let (seq, text) = self.batch.remove(0);
                let stored: Value = serde_json::from_str(&text).ok()?;
                let name = stored["name"].as_str()?.to_owned();
                self.done = name == RESULT;
                return Some(event(&self.run_id, seq, &name, &stored["data"]));
            }
            match self
                .state
                .store
                .run_events(&self.run_id, self.after, RESUME_BATCH)
                .await
            {
                // Expired (or the store lost it): the stream ends without a result.
                Ok(None) => return None,
                Ok(Some(read)) if !read.events.is_empty() => {
                    let from = self.after;
                    self.after += read.events.len() as u64;
                    self.batch = (from + 1..).zip(read.events).collect();
                }
                // Nothing new, or the store did not answer: look again shortly.
                Ok(Some(_)) | Err(_) => {
                    tokio::time::sleep(Duration::from_millis(FOLLOW_POLL_MS)).await;
                }
            }
        }
    }
}
