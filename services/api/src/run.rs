//! `run_code`, end to end (ISO-1, POOL-3, WS-1 to WS-6, OUT-1 to OUT-4, KER-1, PKG-6, EGR-8):
//! admit, take a FIFO ticket, mint the run's grant from the policy read now, restore the
//! workspace, execute on the leased worker, save the workspace create-only, release the lease and
//! reset the worker with evidence, and answer with the model's and the member's projections.
//!
//! The run is a task of its own: a caller that hangs up does not cancel it halfway, so a lease is
//! always released and a worker always reset or discarded. Code never runs anywhere but a leased
//! worker: no step falls back to running it here (ISO-1).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use corral_core::ids::{
    ActorId, ConversationId, LeaseNamespace, LeaseScope, MemberId, TicketId, identity_is_valid,
};
use corral_core::jail::Language;
use corral_core::pool::{Command, Disposition, Effect};
use corral_store::lease::{self, AcquireError, Granted};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::workers::ExecuteError;
use crate::workspaces::StorageError;

/// The body of `POST /v1/run_code`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    /// Whose workspace (with the conversation).
    pub actor: String,
    /// The conversation.
    pub conversation: String,
    /// The member the lease counts against (POOL-3).
    pub member: String,
    /// `python` or `node`.
    pub language: String,
    /// The program.
    pub code: String,
    /// Names the run will create (WS-7): shown as progress, granting nothing.
    #[serde(default)]
    pub declared_outputs: Vec<String>,
    /// Hosts the provider hints at (EGR-4): narrows `host_allowlist`, ignored elsewhere.
    #[serde(default)]
    pub provider_hint: Option<Vec<String>>,
    /// `ephemeral` (the default) or `persistent` (KER-1; not built: refused, never run ephemerally).
    #[serde(default)]
    pub kernel: Option<String>,
    /// Per-run bounds, each no higher than the deployment's.
    #[serde(default)]
    pub bounds: Option<Value>,
    /// How long to wait for a worker, capped by `SANDBOX_ACQUIRE_WAIT_SECONDS`.
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

/// An answer: its HTTP status and body.
pub type Reply = (StatusCode, Value);

fn refusal(status: StatusCode, code: &str, message: impl Into<String>, extra: Value) -> Reply {
    let mut error = json!({ "code": code, "message": message.into() });
    if let (Some(error), Value::Object(extra)) = (error.as_object_mut(), extra) {
        error.extend(extra);
    }
    (status, json!({ "outcome": "refused", "error": error }))
}

/// A run refused before it ran (PKG-6): a `not_run` record beside a nonzero exit, nothing leased.
fn not_run(run_id: &str, reason: &str) -> Reply {
    (
        StatusCode::OK,
        json!({
            "run_id": run_id,
            "outcome": "not_run",
            "model": { "exit_code": 1, "not_run": reason, "stdout": empty_stream(), "stderr": empty_stream(),
                       "bound": null, "diagnostics": [], "downloads": [] },
            "member": { "outcome": "not_run", "exit_code": 1, "references": [] },
        }),
    )
}

fn empty_stream() -> Value {
    json!({ "text": "", "truncated": false, "bytes_total": 0, "bytes_dropped": 0 })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks the request; the refusal names the field.
fn admit(request: &RunCode, code_max_bytes: u64) -> Result<(), Reply> {
    for (field, value) in [
        ("actor", &request.actor),
        ("conversation", &request.conversation),
        ("member", &request.member),
    ] {
        if !identity_is_valid(value) {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                "invalid_identity",
                format!("{field} must be 1 to 256 bytes with no control character"),
                json!({ "field": field }),
            ));
        }
    }
    if request.code.len() as u64 > code_max_bytes {
        return Err(refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "code_too_large",
            format!("the code is over {code_max_bytes} bytes (SANDBOX_WORKSPACE_MAX_BYTES)"),
            json!({ "setting": "SANDBOX_WORKSPACE_MAX_BYTES" }),
        ));
    }
    Ok(())
}

/// Runs `request`. Spawned, so that it finishes (lease released, worker reset) whatever the caller
/// does.
pub async fn run_code(state: Arc<AppState>, request: RunCode) -> Reply {
    match tokio::spawn(run(state, request)).await {
        Ok(reply) => reply,
        Err(e) => refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            e.to_string(),
            Value::Null,
        ),
    }
}

async fn run(state: Arc<AppState>, request: RunCode) -> Reply {
    let settings = &state.settings;
    if let Err(reply) = admit(&request, settings.bounds.workspace_max_bytes) {
        return reply;
    }
    let run_id = hex(&crate::egress::random_bytes());
    match request.kernel.as_deref() {
        None | Some("ephemeral") => {}
        Some("persistent") => {
            state.metrics.run("not_run");
            return not_run(&run_id, "persistent_kernel_unavailable");
        }
        Some(_) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                "kernel_unknown",
                "kernel must be ephemeral or persistent",
                json!({ "field": "kernel" }),
            );
        }
    }
    let language = match Language::parse(&request.language) {
        Ok(language) => language,
        Err(reason) => {
            state.metrics.run("not_run");
            return not_run(&run_id, reason.code());
        }
    };
    // The lease.
    let pool = settings.pool();
    let wait_ms = request.wait_seconds.map_or(pool.acquire_wait_ms, |s| {
        s.saturating_mul(1_000).min(pool.acquire_wait_ms)
    });
    let mut watch = None;
    // A worker that refuses the connection never saw the code: it is discarded and the run is
    // taken to another, at most this many times in all.
    let mut attempts_left = 3u32;
    loop {
        attempts_left -= 1;
        let ticket = TicketId(u64::from_le_bytes(
            crate::egress::random_bytes()[..8]
                .try_into()
                .unwrap_or_default(),
        ));
        let acquire = Command::Acquire {
            ticket,
            member: MemberId(request.member.clone()),
            scope: LeaseScope {
                namespace: LeaseNamespace::Code,
                actor: ActorId(request.actor.clone()),
                conversation: ConversationId(request.conversation.clone()),
            },
            wait_ms,
        };
        let started = Instant::now();
        let granted = match lease::acquire(
            &state.store,
            &pool,
            &acquire,
            Duration::from_millis(wait_ms),
            &mut watch,
        )
        .await
        {
            Ok(granted) => granted,
            Err(error) => return admission_refused(&state, &error, wait_ms),
        };
        let acquired = started.elapsed();
        state.metrics.acquired(acquired);
        let heartbeat = tokio::spawn(heartbeats(state.clone(), granted));
        let mut phases = Phases::default();
        phases.mark("acquire_us", acquired);
        let ran = leased(&state, &request, language, &run_id, granted, phases).await;
        heartbeat.abort();
        match ran {
            Leased::Done(reply, disposition) => {
                release(state, granted, disposition).await;
                return reply;
            }
            Leased::Unreachable(message) => {
                release(state.clone(), granted, Disposition::Discard).await;
                if attempts_left == 0 {
                    state.metrics.run("worker_lost");
                    return refusal(
                        StatusCode::BAD_GATEWAY,
                        "worker_lost",
                        format!(
                            "no leased worker could be reached: {message}; the code did not run"
                        ),
                        json!({ "run_id": run_id }),
                    );
                }
            }
        }
    }
}

/// How a leased run ended.
enum Leased {
    /// With this answer; the lease ends this way.
    Done(Reply, Disposition),
    /// The worker could not be reached: the code did not run.
    Unreachable(String),
}

fn admission_refused(state: &AppState, error: &AcquireError, wait_ms: u64) -> Reply {
    let code = error.code();
    state.metrics.refusal(code);
    let (status, message, retry) = match error {
        AcquireError::Refused("queue_full") => (
            StatusCode::TOO_MANY_REQUESTS,
            "the wait queue is full (SANDBOX_ACQUIRE_QUEUE_MAX)",
            1,
        ),
        AcquireError::WaitTimeout => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no worker became free within the wait (SANDBOX_ACQUIRE_WAIT_SECONDS)",
            wait_ms.div_ceil(1_000).clamp(1, 30),
        ),
        AcquireError::Refused("inventory_unavailable") | AcquireError::CoordinationUnavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "coordination is unavailable: admission fails closed (POOL-11)",
            5,
        ),
        AcquireError::Refused(_) => (StatusCode::CONFLICT, "the pool refused the ticket", 1),
    };
    refusal(
        status,
        code,
        message,
        json!({ "retry_after_seconds": retry }),
    )
}

/// Renews the lease every `SANDBOX_LEASE_HEARTBEAT_SECONDS` until aborted.
async fn heartbeats(state: Arc<AppState>, granted: Granted) {
    let period = Duration::from_secs(state.settings.lease_heartbeat_seconds.max(1));
    loop {
        tokio::time::sleep(period).await;
        let beat = Command::Heartbeat {
            worker: granted.worker,
            lease: granted.ticket,
            token: granted.token,
        };
        let _ = state
            .store
            .commit(&beat, &state.settings.pool(), lease::RETRIES)
            .await;
    }
}

/// Ends the lease, then resets the worker and reports its evidence, in the background.
async fn release(state: Arc<AppState>, granted: Granted, disposition: Disposition) {
    let command = Command::Release {
        worker: granted.worker,
        lease: granted.ticket,
        token: granted.token,
        disposition,
    };
    let pool = state.settings.pool();
    let Some(applied) = state.store.commit(&command, &pool, lease::RETRIES).await else {
        // Unreachable coordination: the lease expires and the worker is taken over (POOL-9).
        return;
    };
    tokio::spawn(async move {
        for effect in applied.effects {
            if let Effect::Reset { worker, token } = effect {
                // No evidence is no proof: the pool's reset deadline discards the worker.
                if let Some(evidence) = state.workers.reset(worker, token).await {
                    let report = Command::ResetReported {
                        worker,
                        token,
                        evidence,
                    };
                    let _ = state.store.commit(&report, &pool, lease::RETRIES).await;
                }
            }
        }
    });
}

/// Where a run's time went, in microseconds, reported as `model.durations.api`.
#[derive(Default)]
struct Phases {
    marks: serde_json::Map<String, Value>,
    since: Option<Instant>,
}

impl Phases {
    fn mark(&mut self, name: &str, took: Duration) {
        self.marks
            .insert(name.to_owned(), json!(took.as_micros() as u64));
        self.since = Some(Instant::now());
    }

    /// Marks the time since the last mark.
    fn lap(&mut self, name: &str) {
        let took = self.since.map_or(Duration::ZERO, |s| s.elapsed());
        self.mark(name, took);
    }
}

/// The part of a run that holds the lease. Returns the answer and how the lease should end.
async fn leased(
    state: &AppState,
    request: &RunCode,
    language: Language,
    run_id: &str,
    granted: Granted,
    mut phases: Phases,
) -> Leased {
    let settings = &state.settings;
    let key = corral_core::workspace::storage_key(&request.actor, &request.conversation);
    // Deployment time at the grant, from the lease itself: no extra round trip.
    let now = corral_core::time::UnixMillis(
        granted
            .expires_at
            .0
            .saturating_sub(settings.lease_ttl_seconds.saturating_mul(1_000)),
    );
    let actor = ActorId(request.actor.clone());
    // The policy and the snapshot are independent: read both at once.
    let (egress, snapshot) = tokio::join!(
        state.egress.for_run(
            &state.store,
            run_id,
            &actor,
            request.provider_hint.as_deref(),
            now,
        ),
        async {
            if settings.workspace_persist {
                state.workspaces.latest(&key).await
            } else {
                Ok(None)
            }
        }
    );
    state.metrics.egress(egress.effective_mode);
    let snapshot = match snapshot {
        Ok(snapshot) => snapshot,
        Err(e) => return Leased::Done(storage_refusal(&e, run_id), Disposition::Reset),
    };
    phases.lap("egress_and_restore_us");
    let mut body = json!({
        "language": language.as_str(),
        "code": request.code,
        "declared": request.declared_outputs,
        "token": granted.token.0,
        "grant": egress.grant,
        "workspace": snapshot.as_ref().map(|s| BASE64.encode(&s.archive)),
    });
    if let Some(bounds) = &request.bounds {
        body["bounds"] = bounds.clone();
    }
    let wall = Duration::from_secs(settings.bounds.max_wall_seconds);
    let result = match state.workers.execute(granted.worker, &body, wall).await {
        Ok(result) => {
            phases.lap("execute_us");
            result
        }
        Err(ExecuteError::Unreachable(message)) => return Leased::Unreachable(message),
        Err(ExecuteError::WorkerLost(message)) => {
            state.metrics.run("worker_lost");
            // Nobody can vouch for a worker that vanished mid-run: discard it.
            let reply = refusal(
                StatusCode::BAD_GATEWAY,
                "worker_lost",
                format!(
                    "the worker stopped answering during the run: {message}; the workspace was not changed"
                ),
                json!({ "run_id": run_id }),
            );
            return Leased::Done(reply, Disposition::Discard);
        }
        Err(ExecuteError::Refused { status, body }) => {
            state.metrics.run("refused");
            // The worker's refusals are `{"error": code, "detail": ...}`.
            let code = body["error"]
                .as_str()
                .unwrap_or("worker_refused")
                .to_owned();
            let reply = refusal(
                StatusCode::from_u16(status)
                    .ok()
                    .filter(|s| s.is_client_error())
                    .unwrap_or(StatusCode::BAD_GATEWAY),
                &code,
                "the worker refused the run before it started",
                json!({ "run_id": run_id, "details": body["detail"] }),
            );
            return Leased::Done(reply, Disposition::Reset);
        }
    };
    Leased::Done(
        finish(
            state,
            run_id,
            &key,
            snapshot.map(|s| (s.generation, s.archive)),
            request,
            result,
            egress.report,
            granted,
            phases,
        )
        .await,
        Disposition::Reset,
    )
}

/// Whether `archive` is what was restored: the same bytes, or (with nothing restored) no entry.
/// An unchanged workspace is not written again.
fn unchanged(restored: Option<&Bytes>, archive: &[u8]) -> bool {
    match restored {
        Some(bytes) => bytes.as_ref() == archive,
        None => tar::Archive::new(archive)
            .entries()
            .is_ok_and(|mut entries| entries.next().is_none()),
    }
}

fn storage_refusal(error: &StorageError, run_id: &str) -> Reply {
    let status = match error {
        StorageError::Conflict { .. } => StatusCode::CONFLICT,
        StorageError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    refusal(
        status,
        error.code(),
        error.to_string(),
        json!({ "run_id": run_id }),
    )
}

/// Saves what the run left and builds the projections.
#[allow(clippy::too_many_arguments)]
async fn finish(
    state: &AppState,
    run_id: &str,
    key: &str,
    restored: Option<(u64, Bytes)>,
    request: &RunCode,
    mut result: Value,
    egress: Value,
    granted: Granted,
    mut phases: Phases,
) -> Reply {
    let base = restored.as_ref().map_or(0, |(generation, _)| *generation);
    let exit_code = result["exit_code"].as_i64();
    let not_run = result["not_run"].as_str().map(str::to_owned);
    let bound = result["bound"].as_str().map(str::to_owned);
    // PKG-6: a not_run record counts only beside a nonzero exit; one beside success is not trusted.
    let inconsistent = not_run.is_some() && exit_code == Some(0);
    let archive = result
        .as_object_mut()
        .and_then(|o| o.remove("workspace_archive"))
        .and_then(|a| a.as_str().and_then(|t| BASE64.decode(t).ok()));
    let pack_error = result["workspace_error"].clone();
    let mut error = Value::Null;
    let mut generation = (base > 0).then_some(base);
    let mut saved = false;
    // Whether the stored snapshot (if any) already holds exactly what the run left.
    let mut kept = false;
    if let Some(setting) = &bound {
        state.metrics.bound(setting);
    }
    if inconsistent {
        error = json!({ "code": "worker_record_inconsistent",
                        "message": "the worker reported not_run beside a zero exit; the prior snapshot stays authoritative" });
    } else if not_run.is_none() && state.settings.workspace_persist {
        match archive {
            Some(archive) if unchanged(restored.as_ref().map(|(_, bytes)| bytes), &archive) => {
                kept = true;
            }
            Some(archive) => match state.workspaces.save(key, base, Bytes::from(archive)).await {
                Ok(new) => {
                    generation = Some(new);
                    saved = true;
                }
                Err(e) => error = json!({ "code": e.code(), "message": e.to_string() }),
            },
            None => {
                error = json!({
                    "code": pack_error["reason"].as_str().unwrap_or("workspace_not_returned"),
                    "setting": pack_error["setting"],
                    "message": "the workspace could not be packed; the prior snapshot stays authoritative",
                });
            }
        }
    }
    phases.lap("save_us");
    let mut durations = result["durations"].clone();
    if durations.is_object() {
        durations["api"] = Value::Object(phases.marks);
    }
    let downloads: Vec<Value> = result["downloads"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut d| {
            if let (true, Some(path), Some(generation)) =
                (saved || kept, d["path"].as_str(), generation)
            {
                d["reference"] = json!(format!("workspace:{generation}/{path}"));
            } else {
                d["reference"] = Value::Null;
            }
            d
        })
        .collect();
    // OUT-4: a run asked for a document succeeds only with a durable attachment of it.
    let delivered: Vec<&str> = downloads
        .iter()
        .filter(|d| d["reference"].is_string())
        .filter_map(|d| d["path"].as_str())
        .collect();
    let missing =
        corral_core::downloads::undelivered_documents(&request.declared_outputs, &delivered);
    if !missing.is_empty()
        && error.is_null()
        && not_run.is_none()
        && bound.is_none()
        && exit_code == Some(0)
    {
        error = json!({
            "code": "declared_document_missing",
            "paths": missing,
            "message": "a declared .pdf, .docx, .pptx or .xlsx was not delivered as a verified, saved attachment",
        });
    }
    let outcome: &'static str = if error.is_object() {
        "error"
    } else if not_run.is_some() {
        "not_run"
    } else if bound.is_some() {
        "bound_exceeded"
    } else if exit_code == Some(0) {
        "succeeded"
    } else {
        "failed"
    };
    state.metrics.run(outcome);
    let status = match error["code"].as_str() {
        Some("workspace_conflict") => StatusCode::CONFLICT,
        Some("workspace_storage_unavailable") => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    };
    let references: Vec<Value> = downloads
        .iter()
        .filter(|d| d["reference"].is_string())
        .map(|d| json!({ "path": d["path"], "media_type": d["media_type"], "bytes": d["bytes"], "reference": d["reference"] }))
        .collect();
    let model = json!({
        "exit_code": exit_code,
        "stdout": result["stdout"],
        "stderr": result["stderr"],
        "bound": bound,
        "bounds": result["bounds"],
        "not_run": not_run,
        "diagnostics": result["diagnostics"],
        "downloads": downloads,
        "declared_outputs": request.declared_outputs,
        "egress": egress,
        "workspace": { "generation": generation, "saved": saved, "unchanged": kept },
        "warm": result["warm"],
        "worker": granted.worker.to_string(),
        "durations": durations,
    });
    (
        status,
        json!({
            "run_id": run_id,
            "outcome": outcome,
            "error": error,
            "model": model,
            "member": { "outcome": outcome, "exit_code": exit_code, "references": references },
        }),
    )
}
