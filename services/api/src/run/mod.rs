//! `run_code`, end to end (ISO-1, POOL-3, WS-1 to WS-6, OUT-1 to OUT-4, KER-1, PKG-6, EGR-8).
//!
//! A shell: corral-core decides and this module performs. The request is admitted
//! (`corral_core::run::admission`: a refusal or a `not_run` record answers before any lease), and
//! from then on `corral_core::run::sequence::Sequence` says each step and [`Performer`] performs
//! it and reports what happened: the turn's scope; a persistent cell's session (KER-4); a lease
//! ([`lease`], one wait for the whole request however many workers are tried, renewed while the
//! run lasts); the egress grant (EGR-9) and the workspace; the projection; the code executed on
//! the leased worker through the one worker client; what may be kept kept ([`keep`]) and the
//! outcome decided (`corral_core::run::outcome`); the outputs linked; the lease released or held
//! by the session; the answer. A worker that refused the connection never saw the code: the
//! sequence has it discarded and the run taken to another.
//!
//! The run is a task of its own: a caller that hangs up does not cancel it halfway, so a lease is
//! always released and a worker always reset or discarded. Code never runs anywhere but a leased
//! worker: no step falls back to running it here (ISO-1).

use std::sync::Arc;
use std::time::Duration;

// The run's clock is tokio's: the real one in production, the world's under simulation.
use tokio::time::Instant;

use axum::http::StatusCode;
use corral_contract::messages::ExecuteFrame;
use corral_contract::messages::{InstallOrder, KernelOrder, archive_text};
use corral_contract::{CallError, ExecuteRequest};
use corral_core::bounds::Bound;
use corral_core::jail::NotRun;
use corral_core::kernel::Kernel;
use corral_core::pool::Disposition;
use corral_core::run::admission::{Admission, Admitted, RunCodeRequest, admit};
use corral_core::run::sequence::{self, Answer, Call, Effect, Event, Sequence, SessionEnded};
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

/// The run `run_id`, from admission to its answer: corral-core's
/// [`Sequence`](corral_core::run::sequence::Sequence) says each step, and [`Performer`] performs
/// it and reports what happened.
async fn attempt(
    state: &Arc<AppState>,
    request: RunCodeRequest,
    run_id: &str,
    tools_token: Option<&str>,
    progress: Option<Progress>,
) -> Reply {
    let admitted = match admitted(state, request, run_id) {
        Ok(admitted) => admitted,
        Err(reply) => return reply,
    };
    // KER-4: without workspace persistence, a persistent kernel's lease outlives its cell.
    let affinity = admitted.kernel == Kernel::Persistent && !state.settings.workspace_persist;
    let cell = Cell {
        mode: if affinity {
            KernelMode::Affinity { ended: None }
        } else {
            KernelMode::Store
        },
        retained: None,
        tools_token: tools_token.map(str::to_owned),
        turn: None,
        progress,
    };
    cell.tell(
        corral_core::run::progress::QUEUED,
        json!({ "run_id": run_id, "declared": corral_core::run::progress::pending(&admitted.declared) }),
    );
    let (mut sequence, first) = Sequence::start(affinity);
    let mut performer = Performer::new(state, &admitted, run_id, cell);
    let mut queue = std::collections::VecDeque::from(first);
    while let Some(effect) = queue.pop_front() {
        if let Effect::Answer(answer) = effect {
            return performer.answer(answer);
        }
        if let Some(event) = performer.perform(effect).await {
            let was_on_session = sequence.on_session();
            match sequence.on(event) {
                Ok(next) => {
                    if was_on_session && !sequence.on_session() {
                        performer.left_session();
                    }
                    queue.extend(next);
                }
                Err(unexpected) => return performer.defect(&format!("{unexpected:?}")),
            }
        }
    }
    performer.defect("the run's sequence ended without an answer")
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

    /// Marks `name` unless it was marked: a step the run did not need took no time.
    fn lap_once(&mut self, name: &str) {
        if !self.marks.contains_key(name) {
            self.lap(name);
        }
    }
}

/// What a leased run was given: its id, its workspace's storage key, its lease, and the
/// workspace restored for it.
struct Order<'a> {
    run_id: &'a str,
    key: &'a str,
    granted: &'a corral_store::lease::Granted,
    snapshot: Option<&'a Snapshot>,
}

/// What one run's steps leave for the next, and for its answer: the shell's half of the
/// sequence. Each method performs one effect; none decides what comes next.
struct Performer<'a> {
    state: &'a Arc<AppState>,
    admitted: &'a Admitted,
    run_id: &'a str,
    /// The workspace's storage key.
    key: String,
    cell: Cell,
    /// The kernel slot this cell claimed (KER-4); ends the slot if the run fails in here.
    claim: Option<affinity::ClaimGuard<'a>>,
    /// The lease held (a session's too).
    holder: Option<lease::Holder>,
    /// The request's one wait for a lease, however many workers are tried, from the first try.
    deadline: Option<Instant>,
    watch: Option<corral_store::VersionWatch>,
    /// Why the last worker tried could not be reached.
    unreachable: String,
    /// What the steps under the current lease produced.
    leased: Option<Leased>,
    /// The answer a failed step prepared.
    refusal: Option<Reply>,
    /// How the worker call failed.
    call_error: Option<CallError>,
}

/// What a run produces under its lease, step by step.
struct Leased {
    granted: corral_store::lease::Granted,
    phases: Phases,
    egress: Option<RunEgress>,
    snapshot: Option<Snapshot>,
    resources: (Option<corral_contract::messages::ResourceOrder>, Value),
    reply: Option<corral_contract::ExecuteReply>,
    keeping: Option<keep::Keeping>,
    decided: Option<corral_core::run::outcome::Decided>,
    linked: Value,
}

impl<'a> Performer<'a> {
    fn new(state: &'a Arc<AppState>, admitted: &'a Admitted, run_id: &'a str, cell: Cell) -> Self {
        Self {
            state,
            admitted,
            run_id,
            key: corral_core::workspace::storage_key(&admitted.actor.0, &admitted.conversation.0),
            cell,
            claim: None,
            holder: None,
            deadline: None,
            watch: None,
            unreachable: String::new(),
            leased: None,
            refusal: None,
            call_error: None,
        }
    }

    /// Performs `effect` and says what happened, when the sequence waits to know. The answer is
    /// the caller's to take ([`Performer::answer`]).
    async fn perform(&mut self, effect: Effect) -> Option<Event> {
        let event = match effect {
            Effect::Scope => self.scope().await,
            Effect::TakeSession => self.take_session(),
            Effect::Acquire => self.acquire().await,
            Effect::ReadInputs => self.read_inputs().await,
            Effect::Project => self.project().await,
            Effect::Execute => self.execute().await,
            Effect::Keep => self.keep().await,
            Effect::Link => self.link().await,
            Effect::CheckLease => Event::LeaseChecked {
                lost: self.holder.as_ref().is_some_and(lease::Holder::lost),
            },
            Effect::Release(disposition) => {
                if let Some(holder) = self.holder.take() {
                    holder.release(disposition);
                }
                return None;
            }
            Effect::HoldSession => return self.hold_session(),
            Effect::EndSession(reason) => return self.end_session(reason),
            Effect::Answer(_) => return None,
        };
        Some(event)
    }

    /// The turn's scope, read at admission, before any lease (PROJ-2, PROJ-3).
    async fn scope(&mut self) -> Event {
        match resources::admit(self.state, self.admitted, self.run_id).await {
            Ok(turn) => {
                let scoped = turn.is_some();
                self.cell.turn = turn;
                Event::Scoped(Some(scoped))
            }
            Err(reply) => {
                self.refusal = Some(reply);
                Event::Scoped(None)
            }
        }
    }

    /// This conversation's kernel slot (KER-4).
    fn take_session(&mut self) -> Event {
        let state: &'a Arc<AppState> = self.state;
        let (taken, claim) = state.affinity.take(&self.key);
        self.claim = claim.map(|claim| state.affinity.guard(claim));
        Event::SessionTaken(match taken {
            affinity::Taken::Busy => sequence::Taken::Busy,
            affinity::Taken::Session(session) => {
                let archive = session.archive.is_some();
                self.cell.retained = session.archive;
                self.holder = Some(session.holder);
                sequence::Taken::Session { archive }
            }
            affinity::Taken::Absent { ended } => {
                self.cell.mode = KernelMode::Affinity { ended };
                sequence::Taken::Absent
            }
        })
    }

    /// A lease from the pool, within the request's one wait.
    async fn acquire(&mut self) -> Event {
        let wait = Duration::from_millis(self.admitted.wait_ms);
        let deadline = *self.deadline.get_or_insert_with(|| Instant::now() + wait);
        match lease::acquire(self.state, self.admitted, deadline, &mut self.watch).await {
            Ok((granted, asked_at)) => {
                self.holder = Some(lease::Holder::start(self.state.clone(), granted, asked_at));
                Event::Acquired
            }
            Err(error) => {
                let reply = answer::admission_refused(self.state, &error, self.admitted.wait_ms);
                if let AcquireError::WaitTimeout { orders } = error {
                    lease::perform_orders(self.state.clone(), orders);
                }
                self.refusal = Some(reply);
                Event::AcquireRefused
            }
        }
    }

    /// The run's egress and its workspace, the first steps under its lease.
    async fn read_inputs(&mut self) -> Event {
        let Some(holder) = &self.holder else {
            return Event::InputsRead(false);
        };
        let granted = holder.granted();
        let span = tracing::Span::current();
        span.record("corral.lease", granted.token.0);
        span.record("corral.worker", tracing::field::display(granted.worker));
        tracing::info!(ticket = granted.ticket.0, "leased");
        let phases = Phases::new();
        let (egress, snapshot) = inputs(
            self.state,
            self.admitted,
            self.run_id,
            &self.cell,
            &self.key,
            &granted,
        )
        .await;
        self.state.metrics.egress(egress.effective_mode);
        span.record("corral.egress_mode", egress.effective_mode);
        let mut leased = Leased {
            granted,
            phases,
            egress: Some(egress),
            snapshot: None,
            resources: (None, Value::Null),
            reply: None,
            keeping: None,
            decided: None,
            linked: json!([]),
        };
        leased.phases.lap("egress_and_restore_us");
        let read = match snapshot {
            Ok(snapshot) => {
                leased.snapshot = snapshot;
                true
            }
            Err(e) => {
                self.refusal = Some(answer::refusal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    e.code(),
                    e.to_string(),
                    json!({ "run_id": self.run_id }),
                ));
                false
            }
        };
        self.leased = Some(leased);
        Event::InputsRead(read)
    }

    /// The run's documents, projected into its workspace (PROJ-1).
    async fn project(&mut self) -> Event {
        let (Some(turn), Some(leased)) = (&self.cell.turn, &mut self.leased) else {
            return Event::Projected(false);
        };
        match resources::dispatch(self.state, self.admitted, turn, self.run_id).await {
            Ok(projected) => {
                leased.resources = (projected.order, projected.report);
                leased.phases.lap("projection_us");
                Event::Projected(true)
            }
            Err(reply) => {
                self.refusal = Some(reply);
                Event::Projected(false)
            }
        }
    }

    /// The code, executed on the leased worker.
    async fn execute(&mut self) -> Event {
        let Some(leased) = &mut self.leased else {
            return Event::Executed(Call::Lost);
        };
        leased.phases.lap_once("projection_us");
        let order = Order {
            run_id: self.run_id,
            key: &self.key,
            granted: &leased.granted,
            snapshot: leased.snapshot.as_ref(),
        };
        let grant = leased
            .egress
            .as_mut()
            .and_then(|egress| egress.grant.take());
        let request = execute_request(
            self.state,
            self.admitted,
            &self.cell,
            &order,
            grant,
            leased.resources.0.take(),
        );
        self.cell.tell(
            corral_core::run::progress::RUNNING,
            json!({
                "run_id": self.run_id,
                "worker": leased.granted.worker.to_string(),
                "declared": corral_core::run::progress::pending(&self.admitted.declared),
            }),
        );
        let called = execute(
            self.state,
            self.admitted,
            &self.cell,
            leased.granted.worker,
            &request,
        )
        .await;
        leased.phases.lap("execute_us");
        Event::Executed(match called {
            Ok(reply) => {
                leased.reply = Some(reply);
                Call::Answered
            }
            Err(error) => self.call_failed(error),
        })
    }

    /// The sequence left the kernel's session (its worker was unreachable): the cell starts empty
    /// elsewhere, and says why.
    fn left_session(&mut self) {
        self.cell.retained = None;
        self.cell.mode = KernelMode::Affinity {
            ended: Some(SessionEnded::Unreachable.message()),
        };
    }

    /// A worker call that failed, as the sequence reads it.
    fn call_failed(&mut self, error: CallError) -> Call {
        if let CallError::Unreachable(message) = &error {
            self.unreachable.clone_from(message);
        }
        let call = error.as_call();
        self.call_error = Some(error);
        call
    }

    /// What may be kept of the worker's reply, kept, and the outcome decided.
    async fn keep(&mut self) -> Event {
        let Some(leased) = &mut self.leased else {
            return Event::Executed(Call::Lost);
        };
        let Some(reply) = &leased.reply else {
            return Event::Executed(Call::Lost);
        };
        let order = Order {
            run_id: self.run_id,
            key: &self.key,
            granted: &leased.granted,
            snapshot: leased.snapshot.as_ref(),
        };
        let (keeping, decided) = keep::kept(
            keep::Storage::of(self.state),
            keep::Run {
                key: order.key,
                run_id: order.run_id,
                restored: order.snapshot,
                declared: &self.admitted.declared,
            },
            reply,
            keep::How {
                retain: matches!(self.cell.mode, KernelMode::Affinity { .. }),
                publish: self
                    .cell
                    .turn
                    .is_some()
                    .then_some(self.admitted.declared.as_slice()),
            },
        )
        .await;
        leased.phases.lap("keep_us");
        self.state.metrics.run(decided.outcome.as_str());
        let install_failed = decided.not_run.is_some()
            && reply
                .dependencies
                .as_ref()
                .is_some_and(|d| d.failure.is_some());
        let event = Event::Kept(sequence::Kept {
            succeeded: decided.outcome == corral_core::run::outcome::Outcome::Succeeded,
            install_failed,
            checkpoint_refused: matches!(
                decided.not_run,
                Some(
                    NotRun::KernelCheckpointCorrupt
                        | NotRun::KernelCheckpointUntrusted
                        | NotRun::KernelCheckpointIncompatible
                )
            ),
            retained: keeping.retained.is_some(),
        });
        leased.keeping = Some(keeping);
        leased.decided = Some(decided);
        event
    }

    /// A succeeded run's outputs, linked into its room (OUT-1).
    async fn link(&mut self) -> Event {
        if let (Some(turn), Some(leased)) = (&self.cell.turn, &mut self.leased)
            && let Some(keeping) = &leased.keeping
        {
            leased.linked =
                resources::link(self.state, self.admitted, turn, &keeping.published).await;
            leased.phases.lap("link_us");
        }
        Event::Linked
    }

    /// Puts the session back, holding its lease and the workspace the cell left (KER-4).
    fn hold_session(&mut self) -> Option<Event> {
        let archive = self
            .leased
            .as_ref()
            .and_then(|leased| leased.keeping.as_ref())
            .and_then(|keeping| keeping.retained.clone())
            .or_else(|| self.cell.retained.clone());
        if let (Some(claim), Some(holder)) = (&self.claim, self.holder.take()) {
            let session = affinity::Session {
                holder,
                archive,
                idle_since: tokio::time::Instant::now(),
            };
            self.state.affinity.put(self.state, claim.claim(), session);
        }
        None
    }

    /// Ends the session this cell claimed, telling the next cell why when there is a reason.
    fn end_session(&mut self, reason: Option<SessionEnded>) -> Option<Event> {
        if let Some(claim) = &self.claim {
            self.state
                .affinity
                .end(claim.claim(), reason.map(SessionEnded::message));
        }
        None
    }

    /// The answer the sequence ended with.
    fn answer(&mut self, answer: Answer) -> Reply {
        match answer {
            Answer::Refusal => self
                .refusal
                .take()
                .unwrap_or_else(|| self.defect("a refusal was answered but none was prepared")),
            Answer::KernelBusy => {
                self.state.metrics.refusal("kernel_busy");
                answer::refusal(
                    StatusCode::CONFLICT,
                    "kernel_busy",
                    "another cell of this kernel is running; a kernel runs one cell at a time",
                    json!({ "run_id": self.run_id }),
                )
            }
            Answer::Unreachable => {
                self.state.metrics.run("worker_lost");
                answer::worker_lost(
                    self.run_id,
                    format!(
                        "no leased worker could be reached ({}); the code did not run",
                        self.unreachable
                    ),
                )
            }
            Answer::WorkerLost | Answer::WorkerRefused => self.call_failure(),
            Answer::DependenciesFailed | Answer::Decided => self.decided(answer),
        }
    }

    /// The answer to a worker call that failed: lost or answering nonsense, or refusing.
    fn call_failure(&mut self) -> Reply {
        match self.call_error.take() {
            Some(CallError::Refused(body)) => {
                self.state.metrics.run("refused");
                answer::worker_refused(self.run_id, &body)
            }
            Some(CallError::Lost(message) | CallError::ReplyInvalid(message)) => {
                self.state.metrics.run("worker_lost");
                answer::worker_lost(
                    self.run_id,
                    format!(
                        "the worker stopped answering during the run ({message}); the workspace was not changed"
                    ),
                )
            }
            Some(CallError::Unreachable(_)) | None => {
                self.defect("a worker failure was answered but none was recorded")
            }
        }
    }

    /// The answer of a run its worker answered: its install's failure (PKG-6: nothing ran,
    /// nothing kept), or the outcome decided with the worker's output and the API's context.
    fn decided(&mut self, answer: Answer) -> Reply {
        let Some(mut leased) = self.leased.take() else {
            return self.defect("a run was decided that never ran");
        };
        let (Some(reply), Some(keeping), Some(decided)) =
            (&leased.reply, &leased.keeping, &leased.decided)
        else {
            return self.defect("a run was decided that was not kept");
        };
        if answer == Answer::DependenciesFailed
            && let Some(failure) = reply.dependencies.as_ref().and_then(|d| d.failure.as_ref())
        {
            return answer::dependencies_failed(self.run_id, failure, &reply.diagnostics);
        }
        if let Some(bound) = decided.bound {
            self.state.metrics.bound(bound.setting());
        }
        leased.phases.lap_once("link_us");
        let resources = self.cell.turn.is_some().then(|| {
            let mut report = std::mem::take(&mut leased.resources.1);
            if report.is_null() {
                report = json!({ "files": [] });
            }
            report["linked"] = std::mem::take(&mut leased.linked);
            report
        });
        let context = Context {
            run_id: self.run_id,
            declared: &self.admitted.declared,
            egress: leased
                .egress
                .take()
                .map(|e| e.report)
                .unwrap_or(Value::Null),
            worker: leased.granted.worker.to_string(),
            phases: std::mem::take(&mut leased.phases.marks),
            kernel: kernel_report(self.admitted.kernel, self.cell.mode, reply, keeping),
            compress: self.admitted.compress_output,
            resources,
            dependencies: dependencies_report(self.admitted, reply),
        };
        answer::decided(decided, reply, keeping, context)
    }

    /// A defect of this shell (an event the sequence did not ask for): the run is answered
    /// `internal_error`, and whatever lease is still held is discarded, never reused on hope.
    fn defect(&mut self, what: &str) -> Reply {
        tracing::error!(defect = what, "the run path broke its sequence");
        if let Some(holder) = self.holder.take() {
            holder.release(Disposition::Discard);
        }
        answer::refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("the run path broke its sequence: {what}"),
            json!({ "run_id": self.run_id }),
        )
    }
}

/// What the run's dependencies needed and what was installed (PKG-1, PKG-2).
fn dependencies_report(admitted: &Admitted, reply: &corral_contract::ExecuteReply) -> Value {
    json!({
        "satisfied": admitted.dependencies.satisfied,
        "installed": reply.dependencies.as_ref().map(|d| d.installed.clone()).unwrap_or_default(),
        "install_ms": reply.dependencies.as_ref().map(|d| d.install_ms),
        "notes": admitted.dependencies.notes,
    })
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
