//! `run_code`, end to end (ISO-1, POOL-3, WS-1 to WS-6, OUT-1 to OUT-4, KER-1, PKG-6, EGR-8).
//!
//! A shell: corral-core decides and this module performs, in one line of steps.
//! 1. Admit the request (`corral_core::run::admission`): a refusal or a `not_run` record answers
//!    before any lease.
//! 2. Lease a worker ([`lease`]), with one wait for the whole request however many workers are
//!    tried, and renew the lease while the run lasts.
//! 3. Read the egress policy and mint the run's grant (EGR-9), and restore the workspace.
//! 4. Execute on the leased worker through the one worker client. A worker that refused the
//!    connection never saw the code: it is discarded and the run taken to another.
//! 5. Plan what may be kept (`corral_core::run::outcome::plan`), keep it ([`keep`]), and decide
//!    the outcome (`corral_core::run::outcome::decide`).
//! 6. Release the lease, as the outcome says: reset and reused on evidence, or discarded.
//!
//! The run is a task of its own: a caller that hangs up does not cancel it halfway, so a lease is
//! always released and a worker always reset or discarded. Code never runs anywhere but a leased
//! worker: no step falls back to running it here (ISO-1).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use corral_contract::messages::ExecuteFrame;
use corral_contract::messages::{InstallOrder, KernelOrder, archive_text};
use corral_contract::{CallError, ExecuteRequest};
use corral_core::bounds::Bound;
use corral_core::jail::NotRun;
use corral_core::kernel::Kernel;
use corral_core::pool::Disposition;
use corral_core::run::admission::{Admission, Admitted, RunCodeRequest, admit};
use corral_core::run::outcome::{Kept, Packed, Plan, Reported, decide, plan};
use corral_store::lease::AcquireError;
use serde_json::{Value, json};

use crate::AppState;
use crate::egress::RunEgress;
use crate::workspaces::Snapshot;
use answer::{Context, Reply};

pub mod affinity;
pub mod answer;
pub mod events;
pub mod keep;
pub mod lease;
pub mod resources;

/// How many leases one request may take: a worker that refuses the connection is discarded and
/// the run taken to the next, at most this many in all.
pub const LEASES_MAX: u32 = 3;

/// Where a run's progress events go (WS-7): the event's name
/// (`corral_core::run::progress`) and its data.
pub type Progress = tokio::sync::mpsc::UnboundedSender<(&'static str, Value)>;

/// Runs `request`. Spawned, so that it finishes (lease released, worker reset) whatever the
/// caller does.
pub async fn run_code(state: Arc<AppState>, request: RunCodeRequest) -> Reply {
    run_code_with_progress(state, request, new_run_id(), None).await
}

/// A fresh run id: 128 random bits in hex.
#[must_use]
pub fn new_run_id() -> String {
    corral_core::ids::hex(&corral_contract::credential::random_bytes())
}

/// [`run_code`] as run `run_id`, telling `progress` when the run is queued, when it runs, and
/// its output as the code writes it (WS-7).
pub async fn run_code_with_progress(
    state: Arc<AppState>,
    request: RunCodeRequest,
    run_id: String,
    progress: Option<Progress>,
) -> Reply {
    // Every line of the run carries its id, and its lease and worker once granted; never its
    // code, its output or a credential.
    let span = tracing::info_span!(
        "run",
        corral.run_id = %run_id,
        corral.lease = tracing::field::Empty,
        corral.worker = tracing::field::Empty,
        corral.outcome = tracing::field::Empty,
        corral.bound = tracing::field::Empty,
        corral.egress_mode = tracing::field::Empty
    );
    match tokio::spawn(tracing::Instrument::instrument(
        run(state, request, run_id, progress),
        span,
    ))
    .await
    {
        Ok(reply) => reply,
        Err(e) => answer::refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            e.to_string(),
            Value::Null,
        ),
    }
}

async fn run(
    state: Arc<AppState>,
    request: RunCodeRequest,
    run_id: String,
    progress: Option<Progress>,
) -> Reply {
    // A run's tool calls are taken while it runs (KER-5).
    let tools_token = request
        .tools
        .clone()
        .map(|tools| state.tool_runs.start(tools));
    let reply = attempt(&state, request, &run_id, tools_token.as_deref(), progress).await;
    let (status, body) = &reply;
    let span = tracing::Span::current();
    if let Some(outcome) = body["outcome"].as_str() {
        span.record("corral.outcome", outcome);
    }
    if let Some(bound) = body["model"]["bound"].as_str() {
        span.record("corral.bound", bound);
    }
    tracing::info!(
        status = status.as_u16(),
        outcome = body["outcome"].as_str().unwrap_or_default(),
        error = body["error"]["code"].as_str(),
        "run answered"
    );
    if let Some(broker) = &state.broker {
        broker.end(&run_id);
    }
    if let Some(token) = &tools_token {
        state.tool_runs.end(token);
    }
    reply
}

/// The run `run_id`, from admission to its answer.
async fn attempt(
    state: &Arc<AppState>,
    request: RunCodeRequest,
    run_id: &str,
    tools_token: Option<&str>,
    progress: Option<Progress>,
) -> Reply {
    let run_id = run_id.to_owned();
    let admitted = match admitted(state, request, &run_id) {
        Ok(admitted) => admitted,
        Err(reply) => return reply,
    };
    // The turn's scope, read at admission, before any lease (PROJ-2, PROJ-3).
    let turn = match resources::admit(state, &admitted, &run_id).await {
        Ok(turn) => turn,
        Err(reply) => return reply,
    };
    let key = corral_core::workspace::storage_key(&admitted.actor.0, &admitted.conversation.0);
    // KER-4: without workspace persistence, a persistent kernel's lease outlives its cell.
    let affinity = admitted.kernel == Kernel::Persistent && !state.settings.workspace_persist;
    let mut cell = Cell {
        mode: if affinity {
            KernelMode::Affinity { ended: None }
        } else {
            KernelMode::Store
        },
        retained: None,
        tools_token: tools_token.map(str::to_owned),
        turn,
        progress,
    };
    cell.tell(
        corral_core::run::progress::QUEUED,
        json!({ "run_id": run_id, "declared": corral_core::run::progress::pending(&admitted.declared) }),
    );
    let (taken, claim) = if affinity {
        state.affinity.take(&key)
    } else {
        (affinity::Taken::Absent { ended: None }, None)
    };
    // Should this cell end without saying what becomes of its session (a panic), the slot is
    // not left busy forever.
    let _unclaimed = claim.as_ref().map(|claim| state.affinity.guard(claim));
    if affinity
        && let Some(reply) =
            in_session(state, &admitted, &run_id, taken, claim.as_ref(), &mut cell).await
    {
        return reply;
    }
    leased_anywhere(state, &admitted, &run_id, claim.as_ref(), &cell).await
}

/// `request` admitted (`corral_core::run::admission`), or the answer that refuses it, or records
/// it `not_run`, before any lease: a persistent kernel needs the deployment's seal root, and tools
/// the deployment cannot forward are refused, not dropped (KER-5).
fn admitted(
    state: &AppState,
    request: RunCodeRequest,
    run_id: &str,
) -> Result<Box<Admitted>, Reply> {
    let admitted = match admit(request, &state.settings, state.packages()) {
        Admission::Admitted(admitted) => {
            tracing::info!(
                language = ?admitted.language,
                kernel = ?admitted.kernel,
                "admitted"
            );
            admitted
        }
        Admission::NotRun(reason) => {
            state.metrics.run("not_run");
            return Err(answer::not_run_before_lease(run_id, reason));
        }
        Admission::Refused(refused) => {
            state.metrics.refusal(refused.code.code());
            return Err(answer::request_refused(&refused));
        }
        Admission::Dependencies(failure) => {
            state.metrics.run("not_run");
            return Err(answer::dependencies_failed(run_id, &failure, &[]));
        }
        Admission::UnsupportedLanguage(refused) => {
            state.metrics.run("not_run");
            return Err(answer::unsupported_language(run_id, &refused));
        }
    };
    // A persistent kernel's checkpoints are sealed under a key derived from the field key.
    if admitted.kernel == Kernel::Persistent && state.kernel_seal_root.is_none() {
        state.metrics.run("not_run");
        return Err(answer::not_run_before_lease(
            run_id,
            NotRun::PersistentKernelUnavailable,
        ));
    }
    if admitted.tools.is_some()
        && (state.settings.tool_endpoint_url.is_none()
            || state.settings.packages.broker_url.is_none())
    {
        state.metrics.refusal("tools_unavailable");
        return Err(answer::refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "tools_unavailable",
            "this deployment forwards no tool calls: CORRAL_TOOL_ENDPOINT_URL (and the address \
             workers reach the API at, SANDBOX_PACKAGE_BROKER_URL) must be set",
            json!({ "run_id": run_id }),
        ));
    }
    Ok(admitted)
}

/// A persistent cell in affinity mode (KER-4): refused while another cell of its kernel runs; run
/// on the lease its session holds, which then goes on; or, its worker unreachable, the session
/// ended and `cell` left to run anywhere (`None`), as when there was no session.
async fn in_session(
    state: &Arc<AppState>,
    admitted: &Admitted,
    run_id: &str,
    taken: affinity::Taken,
    claim: Option<&affinity::Claim>,
    cell: &mut Cell,
) -> Option<Reply> {
    match taken {
        affinity::Taken::Busy => {
            state.metrics.refusal("kernel_busy");
            Some(answer::refusal(
                StatusCode::CONFLICT,
                "kernel_busy",
                "another cell of this kernel is running; a kernel runs one cell at a time",
                json!({ "run_id": run_id }),
            ))
        }
        affinity::Taken::Session(session) => {
            cell.retained = session.archive.clone();
            match leased(state, admitted, run_id, &session.holder, cell).await {
                Leased::Done(reply, disposition, retained) => {
                    let retained = match retained {
                        // A cell that kept nothing changed nothing: the session goes on.
                        Retained::Nothing => {
                            session.archive.map_or(Retained::Nothing, Retained::Archive)
                        }
                        other => other,
                    };
                    if let Some(claim) = claim {
                        keep_session(state, claim, session.holder, disposition, retained);
                    }
                    Some(reply)
                }
                Leased::Unreachable(_) => {
                    session.holder.release(Disposition::Discard);
                    cell.retained = None;
                    cell.mode = KernelMode::Affinity {
                        ended: Some("the kernel's worker could not be reached; its state with it"),
                    };
                    None
                }
            }
        }
        affinity::Taken::Absent { ended } => {
            cell.mode = KernelMode::Affinity { ended };
            None
        }
    }
}

/// Takes a lease from the pool (trying at most [`LEASES_MAX`] workers within one wait) and runs.
async fn leased_anywhere(
    state: &Arc<AppState>,
    admitted: &Admitted,
    run_id: &str,
    claim: Option<&affinity::Claim>,
    cell: &Cell,
) -> Reply {
    let deadline = Instant::now() + Duration::from_millis(admitted.wait_ms);
    let mut watch = None;
    let mut unreachable = String::new();
    for _ in 0..LEASES_MAX {
        let (granted, asked_at) = match lease::acquire(state, admitted, deadline, &mut watch).await
        {
            Ok(acquired) => acquired,
            Err(error) => {
                let reply = answer::admission_refused(state, &error, admitted.wait_ms);
                if let AcquireError::WaitTimeout { orders } = error {
                    lease::perform_orders(state.clone(), orders);
                }
                if let Some(claim) = claim {
                    state.affinity.end(claim, None);
                }
                return reply;
            }
        };
        let holder = lease::Holder::start(state.clone(), granted, asked_at);
        match leased(state, admitted, run_id, &holder, cell).await {
            Leased::Done(reply, disposition, retained) => {
                match claim {
                    Some(claim) => keep_session(state, claim, holder, disposition, retained),
                    None => holder.release(disposition),
                }
                return reply;
            }
            Leased::Unreachable(message) => {
                holder.release(Disposition::Discard);
                unreachable = message;
            }
        }
    }
    state.metrics.run("worker_lost");
    if let Some(claim) = claim {
        state.affinity.end(claim, None);
    }
    answer::worker_lost(
        run_id,
        format!("no leased worker could be reached ({unreachable}); the code did not run"),
    )
}

/// After an affinity-mode cell: the lease is held on with the workspace it left, unless the cell
/// ended it (its worker to be discarded, its lease lost, nothing retained to continue from, or
/// its checkpoint refused).
fn keep_session(
    state: &Arc<AppState>,
    claim: &affinity::Claim,
    holder: lease::Holder,
    disposition: Disposition,
    retained: Retained,
) {
    match retained {
        Retained::Archive(archive) if disposition == Disposition::Reset && !holder.lost() => {
            state.affinity.put(
                state,
                claim,
                affinity::Session {
                    holder,
                    archive: Some(archive),
                    idle_since: Instant::now(),
                },
            );
        }
        Retained::EndSession(reason) => {
            holder.release(disposition);
            state.affinity.end(claim, Some(reason));
        }
        Retained::Archive(_) | Retained::Nothing => {
            let reason = (disposition == Disposition::Discard || holder.lost()).then_some(
                "the kernel's worker was discarded after its last cell; its state with it",
            );
            holder.release(disposition);
            state.affinity.end(claim, reason);
        }
    }
}

/// What an affinity-mode cell leaves for the next.
enum Retained {
    /// This workspace.
    Archive(bytes::Bytes),
    /// Nothing new (the run kept nothing).
    Nothing,
    /// The session must end, for this reason.
    EndSession(&'static str),
}

/// How a persistent kernel's checkpoints travel between cells.
#[derive(Clone, Copy)]
enum KernelMode {
    /// In the workspace snapshot, through the object store (the default, and every ephemeral run).
    Store,
    /// In the workspace this replica retains beside the held lease (KER-4); `ended` says why an
    /// earlier session is gone.
    Affinity { ended: Option<&'static str> },
}

/// What a run carries besides its request.
struct Cell {
    mode: KernelMode,
    /// An affinity session's retained workspace.
    retained: Option<bytes::Bytes>,
    /// The run's tool-callback token, when it was given tools.
    tools_token: Option<String>,
    /// The turn's scope at admission, when the authority knows its room (PROJ-1).
    turn: Option<resources::TurnScope>,
    /// Where its progress goes, when the caller asked for a stream (WS-7).
    progress: Option<Progress>,
}

impl Cell {
    /// Tells the caller's stream, if there is one; a caller that hung up is not waited for.
    fn tell(&self, event: &'static str, data: Value) {
        if let Some(progress) = &self.progress {
            let _ = progress.send((event, data));
        }
    }
}

/// How a leased run ended.
enum Leased {
    /// With this answer; the lease ends this way; in affinity mode, what to retain.
    Done(Reply, Disposition, Retained),
    /// The worker could not be reached: the code did not run.
    Unreachable(String),
}

/// Where a run's time went, in microseconds, reported as `model.durations.api`.
struct Phases {
    marks: serde_json::Map<String, Value>,
    since: Instant,
}

impl Phases {
    fn new() -> Self {
        Self {
            marks: serde_json::Map::new(),
            since: Instant::now(),
        }
    }

    /// Marks the time since the last mark.
    fn lap(&mut self, name: &str) {
        let took = self.since.elapsed();
        self.marks.insert(
            name.to_owned(),
            json!(u64::try_from(took.as_micros()).unwrap_or(u64::MAX)),
        );
        self.since = Instant::now();
    }
}

/// The part of a run that holds the lease, in its order: the inputs read (egress policy and
/// grant, the workspace), the run's documents projected, the code executed on the leased worker,
/// what may be kept kept, and the answer decided ([`answered`]).
async fn leased(
    state: &AppState,
    admitted: &Admitted,
    run_id: &str,
    holder: &lease::Holder,
    cell: &Cell,
) -> Leased {
    let granted = holder.granted();
    let span = tracing::Span::current();
    span.record("corral.lease", granted.token.0);
    span.record("corral.worker", tracing::field::display(granted.worker));
    tracing::info!(ticket = granted.ticket.0, "leased");
    let mut phases = Phases::new();
    let key = corral_core::workspace::storage_key(&admitted.actor.0, &admitted.conversation.0);
    let (egress, snapshot) = inputs(state, admitted, run_id, cell, &key, &granted).await;
    state.metrics.egress(egress.effective_mode);
    span.record("corral.egress_mode", egress.effective_mode);
    let snapshot = match snapshot {
        Ok(snapshot) => snapshot,
        Err(e) => {
            let reply = answer::refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                e.code(),
                e.to_string(),
                json!({ "run_id": run_id }),
            );
            return Leased::Done(reply, Disposition::Reset, Retained::Nothing);
        }
    };
    phases.lap("egress_and_restore_us");
    let projected = match &cell.turn {
        Some(turn) => match resources::dispatch(state, admitted, turn, run_id).await {
            Ok(projected) => Some(projected),
            Err(reply) => return Leased::Done(reply, Disposition::Reset, Retained::Nothing),
        },
        None => None,
    };
    phases.lap("projection_us");
    let (resources_order, resources_report) =
        projected.map_or((None, Value::Null), |p| (p.order, p.report));
    let order = Order {
        run_id,
        key: &key,
        granted: &granted,
        snapshot: snapshot.as_ref(),
    };
    let request = execute_request(state, admitted, cell, &order, egress.grant, resources_order);
    cell.tell(
        corral_core::run::progress::RUNNING,
        json!({
            "run_id": run_id,
            "worker": granted.worker.to_string(),
            "declared": corral_core::run::progress::pending(&admitted.declared),
        }),
    );
    let reply = match execute(state, admitted, cell, granted.worker, &request).await {
        Ok(reply) => reply,
        Err(error) => return call_failed(state, run_id, error),
    };
    phases.lap("execute_us");
    let reports = Reports {
        egress: egress.report,
        resources: resources_report,
        phases,
    };
    answered(state, admitted, cell, &order, &reply, reports).await
}

/// What a leased run was given: its id, its workspace's storage key, its lease, and the
/// workspace restored for it.
struct Order<'a> {
    run_id: &'a str,
    key: &'a str,
    granted: &'a corral_store::lease::Granted,
    snapshot: Option<&'a Snapshot>,
}

/// What the answer reports beside the outcome: the egress, the projection, and where the time
/// went.
struct Reports {
    egress: Value,
    resources: Value,
    phases: Phases,
}

/// The run's egress and its workspace, read at once (they are independent). A persistent cell has
/// no egress whatever the policy (KER-5); an affinity cell's workspace is the one retained beside
/// its lease (KER-4).
async fn inputs(
    state: &AppState,
    admitted: &Admitted,
    run_id: &str,
    cell: &Cell,
    key: &str,
    granted: &corral_store::lease::Granted,
) -> (
    RunEgress,
    Result<Option<Snapshot>, crate::workspaces::StorageError>,
) {
    let settings = &state.settings;
    // Deployment time at the grant, from the lease itself: no extra round trip.
    let now = corral_core::time::UnixMillis(
        granted
            .expires_at
            .0
            .saturating_sub(settings.lease_ttl_seconds.saturating_mul(1_000)),
    );
    tokio::join!(
        async {
            if admitted.kernel == Kernel::Persistent {
                RunEgress::persistent_kernel()
            } else {
                state
                    .egress
                    .for_run(
                        &state.store,
                        run_id,
                        &admitted.actor,
                        admitted.provider_hint.as_deref(),
                        now,
                    )
                    .await
            }
        },
        async {
            match (cell.mode, &cell.retained) {
                (KernelMode::Affinity { .. }, Some(archive)) => Ok(Some(Snapshot {
                    generation: 0,
                    archive: archive.clone(),
                })),
                (KernelMode::Affinity { .. }, None) => Ok(None),
                (KernelMode::Store, _) if settings.workspace_persist => {
                    state.workspaces.latest(key).await
                }
                (KernelMode::Store, _) => Ok(None),
            }
        }
    )
}

/// What the worker is asked to run: the code, its workspace, bounds, egress grant, outputs,
/// installs (with a broker token), the kernel's seal, tools and documents, under the lease's
/// token.
fn execute_request(
    state: &AppState,
    admitted: &Admitted,
    cell: &Cell,
    order: &Order<'_>,
    grant: Option<String>,
    resources: Option<corral_contract::messages::ResourceOrder>,
) -> ExecuteRequest {
    let persistent = admitted.kernel == Kernel::Persistent;
    ExecuteRequest {
        language: admitted.language,
        code: admitted.code.clone(),
        workspace: order.snapshot.map(|s| archive_text(&s.archive)),
        bounds: admitted.overrides,
        grant,
        declared: admitted.declared.clone(),
        dependencies: admitted.dependencies.needs_broker().then(|| InstallOrder {
            install: admitted.dependencies.install.clone(),
            constraints: admitted.dependencies.constraints.clone(),
            token: state
                .broker
                .as_ref()
                .map(|broker| broker.mint(order.run_id))
                .unwrap_or_default(),
        }),
        kernel: persistent
            .then_some(state.kernel_seal_root.as_ref())
            .flatten()
            .map(|root| KernelOrder::new(root, order.key)),
        tools: tool_order(&state.settings, admitted, cell),
        resources,
        token: order.granted.token,
        traceparent: crate::trace::traceparent(),
        // `execute_streamed` asks for it.
        stream_output: false,
    }
}

/// Runs `request` on `worker`: streamed to the caller as the worker reads the code's output when
/// the run has a progress channel, else in one answer.
async fn execute(
    state: &AppState,
    admitted: &Admitted,
    cell: &Cell,
    worker: corral_core::ids::WorkerId,
    request: &ExecuteRequest,
) -> Result<corral_contract::ExecuteReply, CallError> {
    if cell.progress.is_none() {
        return state
            .workers
            .execute(worker, request, &admitted.bounds)
            .await;
    }
    state
        .workers
        .execute_streamed(worker, request, &admitted.bounds, |frame| match frame {
            ExecuteFrame::Output { stream, text } => cell.tell(
                corral_core::run::progress::OUTPUT,
                json!({ "stream": stream, "text": text }),
            ),
            ExecuteFrame::Bound { stream } => cell.tell(
                corral_core::run::progress::BOUND,
                json!({ "stream": stream, "bound": Bound::Output }),
            ),
            ExecuteFrame::Reply(_) | ExecuteFrame::Refused(_) => {}
        })
        .await
}

/// A worker call that failed: unreachable (the run is taken to another worker), lost or
/// answering nonsense (discarded: nobody can vouch for it), or refusing (reset when it refused
/// before anything ran, discarded otherwise).
fn call_failed(state: &AppState, run_id: &str, error: CallError) -> Leased {
    match error {
        CallError::Unreachable(message) => Leased::Unreachable(message),
        CallError::Lost(message) | CallError::ReplyInvalid(message) => {
            state.metrics.run("worker_lost");
            let reply = answer::worker_lost(
                run_id,
                format!(
                    "the worker stopped answering during the run ({message}); the workspace was not changed"
                ),
            );
            Leased::Done(reply, Disposition::Discard, Retained::Nothing)
        }
        CallError::Refused(body) => {
            state.metrics.run("refused");
            let disposition = if body.error.before_anything_ran() {
                Disposition::Reset
            } else {
                Disposition::Discard
            };
            Leased::Done(
                answer::worker_refused(run_id, &body),
                disposition,
                Retained::Nothing,
            )
        }
    }
}

/// What the worker's `reply` leaves: what may be kept kept (`corral_core::run::outcome::plan`,
/// then [`keep`]), the outcome decided, a succeeded run's outputs linked into its room (OUT-1),
/// and the answer, with what an affinity session retains.
async fn answered(
    state: &AppState,
    admitted: &Admitted,
    cell: &Cell,
    order: &Order<'_>,
    reply: &corral_contract::ExecuteReply,
    mut reports: Reports,
) -> Leased {
    let run_id = order.run_id;
    let (keeping, decided) = kept(state, admitted, cell, order, reply).await;
    reports.phases.lap("keep_us");
    state.metrics.run(decided.outcome.as_str());
    let linked = match &cell.turn {
        Some(turn) if decided.outcome == corral_core::run::outcome::Outcome::Succeeded => {
            resources::link(state, admitted, turn, &keeping.published).await
        }
        _ => json!([]),
    };
    reports.phases.lap("link_us");
    // PKG-6: an install that failed is answered with its record (nothing ran, nothing kept).
    if let (Some(_), Some(failure)) = (
        decided.not_run,
        reply.dependencies.as_ref().and_then(|d| d.failure.as_ref()),
    ) {
        return Leased::Done(
            answer::dependencies_failed(run_id, failure, &reply.diagnostics),
            Disposition::Reset,
            Retained::Nothing,
        );
    }
    if let Some(bound) = decided.bound {
        state.metrics.bound(bound.setting());
    }
    let resources = cell.turn.is_some().then(|| {
        let mut report = reports.resources;
        if report.is_null() {
            report = json!({ "files": [] });
        }
        report["linked"] = linked;
        report
    });
    let context = Context {
        run_id,
        declared: &admitted.declared,
        egress: reports.egress,
        worker: order.granted.worker.to_string(),
        phases: reports.phases.marks,
        kernel: kernel_report(admitted.kernel, cell.mode, reply, &keeping),
        compress: admitted.compress_output,
        resources,
        dependencies: json!({
            "satisfied": admitted.dependencies.satisfied,
            "installed": reply.dependencies.as_ref().map(|d| d.installed.clone()).unwrap_or_default(),
            "install_ms": reply.dependencies.as_ref().map(|d| d.install_ms),
            "notes": admitted.dependencies.notes,
        }),
    };
    // A refused checkpoint ends an affinity session: nothing could ever remove it there.
    let retained = match (decided.not_run, keeping.retained.clone()) {
        (
            Some(
                NotRun::KernelCheckpointCorrupt
                | NotRun::KernelCheckpointUntrusted
                | NotRun::KernelCheckpointIncompatible,
            ),
            _,
        ) => Retained::EndSession(
            "the kernel's checkpoint was refused; the session ended, and this kernel starts empty",
        ),
        (_, Some(archive)) => Retained::Archive(archive),
        (_, None) => Retained::Nothing,
    };
    Leased::Done(
        answer::decided(&decided, reply, &keeping, context),
        Disposition::Reset,
        retained,
    )
}

/// What may be kept of `reply`, kept, and the outcome it decides.
async fn kept(
    state: &AppState,
    admitted: &Admitted,
    cell: &Cell,
    order: &Order<'_>,
    reply: &corral_contract::ExecuteReply,
) -> (keep::Keeping, corral_core::run::outcome::Decided) {
    let archive = reply.workspace.archive();
    let packed = match (reply.workspace.packed(), &archive) {
        // A packed workspace that does not decode was not returned.
        (Packed::Archive, None) => Packed::Missing,
        (packed, _) => packed,
    };
    let reported = Reported {
        exit_code: reply.exit_code,
        not_run: reply.not_run,
        bound: reply.bound,
        downloads: &reply.downloads,
        rejected: &reply.rejected,
        packed: &packed,
    };
    let affinity = matches!(cell.mode, KernelMode::Affinity { .. });
    let keeping = match (plan(&reported), archive) {
        (Plan::Keep, Some(archive)) => {
            keep::keep(
                state,
                order.key,
                order.run_id,
                order.snapshot,
                reply,
                archive,
                keep::How {
                    retain: affinity,
                    publish: cell.turn.is_some().then_some(admitted.declared.as_slice()),
                },
            )
            .await
        }
        (Plan::Keep, None) | (Plan::KeepNothing, _) => keep::Keeping {
            kept: Kept::Nothing,
            saved: false,
            unchanged: false,
            retained: None,
            published: Vec::new(),
        },
    };
    let decided = decide(&reported, &keeping.kept, &admitted.declared, order.run_id);
    (keeping, decided)
}

/// What the model reads of a cell's kernel (KER-1 to KER-4): the mode and where its state lives,
/// what was restored, kept and not kept (by name, with why), and whether the state it reports is
/// durable: checkpointed by this cell and kept with its workspace. `null` for an ephemeral run.
fn kernel_report(
    kernel: Kernel,
    mode: KernelMode,
    reply: &corral_contract::ExecuteReply,
    keeping: &keep::Keeping,
) -> Value {
    if kernel == Kernel::Ephemeral {
        return Value::Null;
    }
    let report = reply.kernel.clone().unwrap_or_default();
    let (durability, kept, ended) = match mode {
        KernelMode::Store => ("object_store", keeping.saved || keeping.unchanged, None),
        KernelMode::Affinity { ended } => ("affinity", keeping.retained.is_some(), ended),
    };
    json!({
        "mode": kernel.as_str(),
        "durability": durability,
        "restored": report.restored,
        "checkpointed": report.checkpointed,
        "kept": report.kept,
        "not_kept": report.not_kept,
        "checkpoint_bytes": report.checkpoint_bytes,
        "durable": report.checkpointed && kept,
        "session_ended": ended,
    })
}

/// The run's tools for its supervisor (KER-5): what the platform advertised and its capability,
/// where this replica takes the calls (the URL workers reach it at), and the run's token here.
/// None without tools, a tool endpoint or that URL: the code then finds no tool relay.
fn tool_order(
    settings: &corral_core::config::Settings,
    admitted: &Admitted,
    cell: &Cell,
) -> Option<corral_contract::messages::ToolOrder> {
    settings.tool_endpoint_url.as_ref()?;
    Some(corral_contract::messages::ToolOrder {
        grant: admitted.tools.clone()?,
        callback: settings.packages.broker_url.clone()?,
        token: cell.tools_token.clone()?,
    })
}
