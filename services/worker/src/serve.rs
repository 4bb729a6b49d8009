//! `corral worker serve`: the worker's control API (issue 4 item 5), on
//! `CORRAL_WORKER_CONTROL_PORT`.
//!
//! Every request, `/health` included, must carry `Authorization: Bearer <credential>`, the
//! credential only the controller and the API hold (`CORRAL_WORKER_TOKEN_FILE` or
//! `CORRAL_WORKER_TOKEN`); the server refuses to start without one and compares in constant time.
//!
//! The routes, their messages, their refusal codes and their limits are corral-contract's (one
//! definition, shared with the API and the controller; docs/decisions/0012):
//! - `GET /health` ([`HealthReply`]): the posture, whether a run is in progress, whether a
//!   prepared jail (its interpreter started, its imports done) waits for the next execute, and
//!   for which languages.
//! - `POST /v1/execute` ([`ExecuteRequest`] → [`ExecuteReply`]): runs code in the jail exactly
//!   as `corral jail run` does, with an optional workspace archive (base64 tar) unpacked first
//!   and the workspace packed after, into the reply's `workspace`. It answers as soon as the
//!   result is complete (no `reset_evidence`); the run's own reset follows on the worker's
//!   thread before any other operation, and what it left is counted in the evidence of the next
//!   `/v1/reset`, the one the pool judges (decision 0036).
//! - `POST /v1/reset` ([`ResetRequest`] → [`ResetReply`]): kills anything left (every prepared
//!   jail too), wipes, returns the reset evidence under the token given, then prepares the next
//!   jails.
//!
//! A body that is not the route's message (truncated, not JSON, an unknown or missing field, a
//! language the contract does not name) is refused with the contract's code before anything of it
//! is acted on, and the worker serves the next request as before.
//!
//! A warm worker keeps one jail prepared per language of `CORRAL_WORKER_PREPARE_LANGUAGES`
//! (ARCHITECTURE.md, "Running code"; docs/decisions/0010): each built at start-up and after every
//! reset exactly as a cold run's, with the language's interpreter started in it and waiting for
//! the code on its stdin (Python's after importing `CORRAL_WORKER_PYTHON_PREIMPORT`). An execute
//! that fits the one of its language (the configured memory and process bounds) runs there; any
//! other, or one that finds none, builds its own, and says why in `diagnostics` when preparation
//! failed. A prepared jail serves one run and goes with its reset; the others wait, untouched,
//! until the next reset tears them all down. Every operation runs on one thread that owns the
//! worker (see `JailThread`).
//!
//! A worker started with `CORRAL_WORKER_ID` (every backend sets it) refuses an execute or reset
//! whose `X-Corral-Worker-Id` names another worker, with 421 `wrong_worker`, before anything runs:
//! an address outlives its worker, and a request meant for a dead one must never run on a newcomer
//! that took its port.
//!
//! One operation at a time: a second one while a run or reset is in progress gets 409. The worker
//! never checks operation tokens against anything (the pool does, POOL-9); it echoes them. What
//! a request may ask is bounded (`ExecuteRequest::accept`, with the same corral-core functions
//! the API admitted it by): the body, the code, each bound override (never above the configured
//! one), the grant (corral-core's limit) and the declared names.
//!
//! The grant (EGR-8) goes to the run's egress relay, never into the jail: the relay adds it to
//! every connection it carries to `SANDBOX_EGRESS_PROXY_URL` (read once, at start). The prepared
//! jail's relay listens from its preparation and gets the grant when an execute takes it.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use corral_contract::error::{ErrorBody, ErrorCode, ErrorDetail};
use corral_contract::limits::execute_body_max_bytes;
use corral_contract::messages::{
    BrowserCloseRequest, BrowserOpenRequest, BrowserPrivateReply, BrowserPrivateRequest,
    BrowserSignalReply, BrowserSignalRequest, BrowserTurnReply, EvidenceReport, ExecuteFrame,
    ExecuteReply, ExecuteRequest, HealthReply, LiveViewOrder, ResetReply, ResetRequest,
    ValidateReply, ValidateRequest, WireFile, WorkspaceReturn,
};
use corral_contract::{credential, routes};
use corral_core::bounds::ExecutionBounds;
use corral_core::config::Settings;
use corral_core::jail::Language;
use tokio::sync::Mutex;

use crate::archive::{self, ArchiveError};
use crate::result::RunResult;
use crate::supervisor::{Reexec, RunRequest, SessionError, Unreset, Validation, Worker};

/// `corral worker`'s commands.
#[derive(clap::Subcommand)]
pub enum WorkerCommand {
    /// The worker's authenticated control API
    ///
    /// GET /health, POST /v1/execute, POST /v1/reset, each authenticated with `Authorization:
    /// Bearer <credential>`. The credential is read from the file named by
    /// CORRAL_WORKER_TOKEN_FILE, else from CORRAL_WORKER_TOKEN; without one the server does not
    /// start. It prints `listening on ADDR` once bound.
    Serve(ServeArgs),
}

/// The arguments of `corral worker serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Where to listen (default 0.0.0.0:CORRAL_WORKER_CONTROL_PORT, which is 8091 unless set)
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
}

/// `corral worker` on its own (the `corral-worker` binary); `corral` embeds [`WorkerCommand`].
#[derive(clap::Parser)]
#[command(
    name = "worker",
    bin_name = "corral worker",
    version,
    args_override_self = true
)]
#[command(about = "The worker's control API")]
struct WorkerCli {
    #[command(subcommand)]
    command: WorkerCommand,
}

/// The usage of `corral worker`, rendered from its definition when displayed.
pub const USAGE: Usage = Usage;

/// Displays the usage of `corral worker` (see [`USAGE`]).
pub struct Usage;

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use clap::CommandFactory as _;
        write!(f, "{}", WorkerCli::command().render_help())
    }
}

/// Where requests' workspaces are staged, in the supervisor's private mount namespace.
const STAGING_DIR: &str = "/run/corral-worker-api";

const EXIT_USAGE: u8 = 2;

/// One operation on the worker, run on its thread.
type Job = Box<dyn FnOnce(&mut Worker) + Send>;

/// The one thread that owns the worker and runs every operation on it. One thread, because a
/// jail dies with the thread that started it (the parent-death signal follows the thread), and a
/// prepared jail must outlive the request that prepared it: the runtime's blocking threads come
/// and go.
struct JailThread {
    jobs: std::sync::mpsc::SyncSender<Job>,
    /// The thread's id, once it has started (0 before): a request waiting for it hastens it.
    tid: Arc<std::sync::atomic::AtomicI32>,
    /// What `/health` reports, updated after every job (before a waiting job's answer goes
    /// out, so that no answer is followed by a stale report).
    prepared: Arc<PreparedLanguages>,
}

/// How often a prepared jail that is still importing is asked whether it waits.
const PREPARE_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Jobs that may wait for the thread: the one of the request holding the lock, and the
/// preparation that follows a reset.
const JOBS_QUEUED_MAX: usize = 2;

impl JailThread {
    /// Starts the thread, which prepares the first jails before it takes any job.
    /// `prepared` tells which languages' prepared jails wait, after each job (for `/health`).
    fn start(mut worker: Worker, prepared: Arc<PreparedLanguages>) -> Result<Self, String> {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(JOBS_QUEUED_MAX);
        let reported = prepared.clone();
        let tid = Arc::new(std::sync::atomic::AtomicI32::new(0));
        let own_tid = tid.clone();
        std::thread::Builder::new()
            .name("corral-jail".to_owned())
            .spawn(move || {
                own_tid.store(nix::unistd::gettid().as_raw(), Ordering::SeqCst);
                prepare_next(&mut worker);
                reported.set(&worker.prepared_languages());
                loop {
                    // While a prepared jail is still importing, jobs are taken as they come (a
                    // run that needs none of its imports goes cold rather than wait), and the
                    // jail is polled between them until it says it waits.
                    let job = if worker.is_preparing() {
                        match queue.recv_timeout(PREPARE_POLL) {
                            Ok(job) => job,
                            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                                worker.poll_prepared(std::time::Instant::now());
                                reported.set(&worker.prepared_languages());
                                continue;
                            }
                            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                    } else if worker.could_preimport() {
                        // Idle with a Python jail prepared without the stack: once nothing has
                        // come for a while, prepare it again with the stack (decision 0037).
                        match queue.recv_timeout(worker.preimport_idle()) {
                            Ok(job) => job,
                            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                                worker.prepare_with_preimport();
                                reported.set(&worker.prepared_languages());
                                continue;
                            }
                            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                    } else {
                        match queue.recv() {
                            Ok(job) => job,
                            Err(_) => return,
                        }
                    };
                    job(&mut worker);
                    reported.set(&worker.prepared_languages());
                }
            })
            .map_err(|e| format!("start the jail thread: {e}"))?;
        Ok(Self {
            jobs,
            tid,
            prepared,
        })
    }

    /// A request is about to wait for the thread: whatever it is preparing gets the normal
    /// priority back (`crate::supervisor::hasten`).
    fn hasten(&self) {
        let tid = self.tid.load(Ordering::SeqCst);
        if tid != 0 {
            crate::supervisor::hasten(tid);
        }
    }

    /// Runs `job` on the thread and waits for its answer.
    async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Worker) -> T + Send + 'static,
    ) -> Result<T, String> {
        self.answer_then(move |worker| (job(worker), None)).await
    }

    /// Runs `job` on the thread and waits for its answer, the first of what it returns; the
    /// second, if any, runs on the thread once the answer is out, before any other job.
    async fn answer_then<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Worker) -> (T, Option<Job>) + Send + 'static,
    ) -> Result<T, String> {
        self.hasten();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let prepared = self.prepared.clone();
        self.jobs
            .try_send(Box::new(move |worker| {
                let (value, then) = job(worker);
                prepared.set(&worker.prepared_languages());
                let _ = answer.send(value);
                if let Some(then) = then {
                    then(worker);
                }
            }))
            .map_err(|e| format!("the jail thread: {e}"))?;
        answered
            .await
            .map_err(|_| "the jail thread ended".to_owned())
    }

    /// Queues `job` without waiting for it.
    fn queue(&self, job: Job) -> Result<(), String> {
        self.jobs
            .try_send(job)
            .map_err(|e| format!("the jail thread: {e}"))
    }
}

/// Prepares the next jails, one per language of `CORRAL_WORKER_PREPARE_LANGUAGES`, in order,
/// where the posture allows runs at all. A failure is reported by the next run of that
/// language, which goes cold; the other languages are prepared regardless.
fn prepare_next(worker: &mut Worker) {
    if worker.posture().is_err() {
        return;
    }
    for language in worker.languages_to_prepare() {
        if let Err(why) = worker.prepare(language) {
            tracing::warn!(
                language = language.as_str(),
                why = %why,
                "no prepared jail: its runs go cold"
            );
        }
    }
}

/// The languages whose prepared jails wait, as the jail thread last saw them: one bit per
/// language, so that `/health` reads it without waiting for the thread.
#[derive(Default)]
struct PreparedLanguages(std::sync::atomic::AtomicU8);

impl PreparedLanguages {
    const ALL: [Language; 2] = [Language::Python, Language::Node];

    fn bit(language: Language) -> u8 {
        match language {
            Language::Python => 1,
            Language::Node => 2,
        }
    }

    fn set(&self, languages: &[Language]) {
        let bits = languages.iter().fold(0, |bits, l| bits | Self::bit(*l));
        self.0.store(bits, Ordering::Relaxed);
    }

    fn get(&self) -> Vec<Language> {
        let bits = self.0.load(Ordering::Relaxed);
        Self::ALL
            .into_iter()
            .filter(|l| bits & Self::bit(*l) != 0)
            .collect()
    }
}

/// What every handler shares.
struct AppState {
    token: Vec<u8>,
    /// The one worker's thread; held for the whole of a run or reset, so that a second one gets
    /// 409. Taken only through [`AppState::hold`].
    worker: Arc<Mutex<JailThread>>,
    /// Whether a run or reset holds the worker, for `/health`. A flag rather than a look at the
    /// lock: trying the lock takes it for an instant, and an execute arriving in that instant
    /// would be turned away with 409 by a mere probe.
    busy: Arc<AtomicBool>,
    /// Which languages' prepared jails wait for the next execute.
    prepared: Arc<PreparedLanguages>,
    /// The open session's live view (its media adapter), apart from the worker's thread so that
    /// a viewer's signaling never waits behind an action.
    live: Arc<std::sync::Mutex<Option<corral_media::live::Handle>>>,
    bounds: ExecutionBounds,
    posture: &'static str,
    staging: PathBuf,
    body_max_bytes: u64,
    requests: AtomicU64,
    /// This worker's id (`CORRAL_WORKER_ID`, set by every backend): an execute or reset must name
    /// it in `X-Corral-Worker-Id`, so that a request meant for a worker that died (whose port a
    /// new worker may have taken) is refused rather than run on the wrong worker.
    worker_id: Option<String>,
}

/// Runs `corral worker <args>`. `prefix` is what re-executes this binary into the jail's stages
/// (`["jail"]` for `corral`).
pub fn main(args: &[String], prefix: &[&str]) -> ExitCode {
    use clap::Parser as _;
    let cli =
        WorkerCli::parse_from(std::iter::once("worker").chain(args.iter().map(String::as_str)));
    run_command(cli.command, prefix)
}

/// Runs one parsed `corral worker` command.
pub fn run_command(command: WorkerCommand, prefix: &[&str]) -> ExitCode {
    match command {
        WorkerCommand::Serve(args) => match start(args.listen, prefix) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("corral worker: {message}");
                ExitCode::from(EXIT_USAGE)
            }
        },
    }
}

/// Reads the credential: the file named by `CORRAL_WORKER_TOKEN_FILE`, else
/// `CORRAL_WORKER_TOKEN`.
fn read_token() -> Result<Vec<u8>, String> {
    credential::from_env(|name| std::env::var(name).ok(), "CORRAL_WORKER_TOKEN")?
        .map(String::into_bytes)
        .ok_or_else(|| {
            "no credential: set CORRAL_WORKER_TOKEN_FILE or CORRAL_WORKER_TOKEN; the control API never runs unauthenticated"
                .to_owned()
        })
}

/// Prepares the worker and the staging directory, then serves until the process ends.
fn start(listen: Option<SocketAddr>, prefix: &[&str]) -> Result<(), String> {
    let settings =
        Settings::from_lookup(|name| std::env::var(name).ok()).map_err(|e| e.to_string())?;
    let token = read_token()?;
    let listen =
        listen.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], settings.worker.control_port)));
    // Before any thread exists: the worker enters a private mount namespace, which threads
    // started afterwards (the runtime's) inherit, so every run sees the same run directories.
    let worker = Worker::start(settings.clone(), Reexec::for_stages(prefix));
    let posture = match worker.posture() {
        Ok(corral_core::jail::Posture::Full) => "full",
        Ok(corral_core::jail::Posture::Weaker { .. }) => "weaker",
        Err(_) => "refused",
    };
    let bounds = settings.bounds.clone();
    let staging = prepare_staging(Path::new(STAGING_DIR), bounds.workspace_max_bytes)?;
    // After the staging mount, so that the thread shares the mount namespace as it is now.
    let prepared = Arc::new(PreparedLanguages::default());
    let worker = JailThread::start(worker, prepared.clone())?;
    let state = Arc::new(AppState {
        token,
        prepared,
        worker: Arc::new(Mutex::new(worker)),
        busy: Arc::new(AtomicBool::new(false)),
        live: Arc::default(),
        body_max_bytes: execute_body_max_bytes(bounds.workspace_max_bytes),
        bounds,
        posture,
        staging,
        requests: AtomicU64::new(0),
        worker_id: std::env::var("CORRAL_WORKER_ID")
            .ok()
            .filter(|id| !id.is_empty()),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(serve(state, listen))
}

/// A tmpfs for staged workspaces, sized for two (one being unpacked, one in use) and a margin.
fn prepare_staging(dir: &Path, workspace_max_bytes: u64) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let size = workspace_max_bytes
        .saturating_mul(2)
        .saturating_add(1 << 20);
    nix::mount::mount(
        Some("corral-worker-api"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(format!("size={size},mode=0700").as_str()),
    )
    .map_err(|e| format!("mount {}: {e}", dir.display()))?;
    Ok(dir.to_path_buf())
}

/// The router, with authentication and the body bound around every route (and the fallback).
fn router(state: Arc<AppState>) -> Router {
    let body_max = usize::try_from(state.body_max_bytes).unwrap_or(usize::MAX);
    Router::new()
        .route(routes::HEALTH, get(health))
        .route(routes::EXECUTE, post(execute))
        .route(routes::RESET, post(reset))
        .route(routes::VALIDATE_PACKAGE, post(validate_package))
        .route(routes::BROWSER_OPEN, post(browser_open))
        .route(routes::BROWSER_ACT, post(browser_act))
        .route(routes::BROWSER_CLOSE, post(browser_close))
        .route(routes::BROWSER_SIGNAL, post(browser_signal))
        .route(routes::BROWSER_PRIVATE, post(browser_private))
        .route(routes::BROWSER_TURN, post(browser_turn))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_max))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

async fn serve(state: Arc<AppState>, listen: SocketAddr) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("listen on {listen}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("listen on {listen}: {e}"))?;
    // One line, flushed, so that whoever started the server knows when and where it listens.
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "listening on {bound}");
    let _ = stdout.flush();
    axum::serve(listener, router(state))
        .await
        .map_err(|e| format!("serve: {e}"))
}

/// A refusal: the contract's code, its status and body.
fn error(code: ErrorCode, detail: ErrorDetail) -> Response {
    refusal(ErrorBody::new(code, detail))
}

fn refusal(body: ErrorBody) -> Response {
    let status = StatusCode::from_u16(body.error.status()).unwrap_or(StatusCode::BAD_REQUEST);
    (status, axum::Json(body)).into_response()
}

/// Refuses a request without the credential (401), or with a declared body over the bound (413)
/// before any of it is read.
async fn authenticate(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| credential::bearer(value.as_bytes()))
        .unwrap_or_default();
    if !credential::matches(presented, &state.token) {
        let mut response = error(ErrorCode::Unauthorized, ErrorDetail::default());
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return response;
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|bytes| bytes > state.body_max_bytes) {
        return error(
            ErrorCode::BodyTooLarge,
            ErrorDetail {
                max: Some(state.body_max_bytes),
                ..ErrorDetail::default()
            },
        );
    }
    if let Some(id) = &state.worker_id
        && !routes::meant_for(
            request.uri().path(),
            request
                .headers()
                .get(routes::WORKER_ID_HEADER)
                .map(|named| named.as_bytes()),
            id,
        )
    {
        // The request reached a worker it was not meant for; nothing ran.
        return error(
            ErrorCode::WrongWorker,
            ErrorDetail {
                this_worker: Some(id.clone()),
                ..ErrorDetail::default()
            },
        );
    }
    next.run(request).await
}

async fn not_found() -> Response {
    error(ErrorCode::NotFound, ErrorDetail::default())
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let prepared = state.prepared.get();
    axum::Json(HealthReply {
        status: "ok".to_owned(),
        posture: state.posture.to_owned(),
        busy: state.busy.load(Ordering::SeqCst),
        prepared: !prepared.is_empty(),
        prepared_languages: prepared,
        body_max_bytes: state.body_max_bytes,
    })
    .into_response()
}

/// A browser session call's refusal.
fn session_error(failed: &SessionError) -> Response {
    match failed {
        SessionError::Open => error(
            ErrorCode::BrowserSessionOpen,
            ErrorDetail::message("a browser session holds this worker until it is closed"),
        ),
        SessionError::Absent => error(
            ErrorCode::BrowserSessionAbsent,
            ErrorDetail::message("no browser session is open on this worker"),
        ),
        SessionError::Action(code, message) => error(
            ErrorCode::BrowserActionFailed,
            ErrorDetail {
                reason: Some(code.code().to_owned()),
                message: Some(message.clone()),
                ..ErrorDetail::default()
            },
        ),
        SessionError::Start(message, evidence) => error(
            ErrorCode::BrowserOpenFailed,
            ErrorDetail {
                reason: Some(evidence.verdict.clone()),
                message: Some(message.clone()),
                ..ErrorDetail::default()
            },
        ),
    }
}

/// `POST /v1/browser/open` (BROW-1, BROW-13).
async fn browser_open(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let Some(worker) = state.hold() else {
        return busy();
    };
    let request: BrowserOpenRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return refusal(ErrorBody::of_json(&e)),
    };
    if let Some(grant) = &request.grant
        && !corral_core::egress::grant::grant_is_sendable(grant)
    {
        return error(
            ErrorCode::GrantMalformed,
            ErrorDetail::message("a grant is non-empty printable ASCII without spaces"),
        );
    }
    let live_view = request.live_view.clone();
    let opened = worker
        .run(move |worker| {
            worker
                .open_browser(&request)
                .map(|reply| (reply, worker.session_display()))
        })
        .await;
    match opened {
        Ok(Ok((mut reply, display))) => {
            if let (Some(order), Some(display)) = (live_view, display) {
                let settings = corral_media::live::Settings {
                    display: display.to_string_lossy().into_owned(),
                    turn: order.turn,
                    username: order.username,
                    password: order.password,
                };
                match tokio::task::spawn_blocking(move || corral_media::live::start(&settings))
                    .await
                {
                    Ok(Ok(handle)) => {
                        reply.relayed = Some(handle.relayed);
                        let replaced = state.live_view().replace(handle);
                        drop(replaced);
                    }
                    Ok(Err(why)) => reply.diagnostics.push(format!("live view: {why}")),
                    Err(why) => reply.diagnostics.push(format!("live view: {why}")),
                }
            }
            axum::Json(reply).into_response()
        }
        Ok(Err(e)) => session_error(&e),
        Err(e) => error(ErrorCode::RunFailed, ErrorDetail::message(e)),
    }
}

impl AppState {
    fn live_view(&self) -> std::sync::MutexGuard<'_, Option<corral_media::live::Handle>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn live_view_refused(reason: &str, message: String) -> Response {
    error(
        ErrorCode::LiveViewRefused,
        ErrorDetail {
            reason: Some(reason.to_owned()),
            message: Some(message),
            ..ErrorDetail::default()
        },
    )
}

/// Runs `call` on the open session's live view, off the async threads: `None` when there is
/// none; an error when the call panicked.
async fn on_live_view<T: Send + 'static>(
    state: Arc<AppState>,
    call: impl FnOnce(&corral_media::live::Handle) -> T + Send + 'static,
) -> Result<Option<T>, String> {
    tokio::task::spawn_blocking(move || state.live_view().as_ref().map(call))
        .await
        .map_err(|e| e.to_string())
}

fn live_view_stopped() -> Response {
    let stopped = corral_media::live::OfferRefusal::Stopped;
    live_view_refused(stopped.code(), stopped.to_string())
}

/// `POST /v1/browser/signal` (BROW-2): a viewer's offer, answered by the live view's adapter.
async fn browser_signal(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let request: BrowserSignalRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return refusal(ErrorBody::of_json(&e)),
    };
    let answered = on_live_view(state, move |handle| {
        handle.offer(&request.viewer, &request.member, &request.sdp)
    });
    match answered.await {
        Ok(Some(Ok(sdp))) => axum::Json(BrowserSignalReply { sdp }).into_response(),
        Ok(Some(Err(refusal))) => live_view_refused(refusal.code(), refusal.to_string()),
        Ok(None) => live_view_stopped(),
        Err(e) => error(ErrorCode::RunFailed, ErrorDetail::message(e)),
    }
}

/// `POST /v1/browser/turn` (BROW-9): the session's renewed TURN credential; the adapter allocates
/// a new relay with it.
async fn browser_turn(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let order: LiveViewOrder = match serde_json::from_slice(&body) {
        Ok(order) => order,
        Err(e) => return refusal(ErrorBody::of_json(&e)),
    };
    let renewed = on_live_view(state, move |handle| {
        handle.renew(&order.username, &order.password)
    });
    match renewed.await {
        Ok(Some(Ok(relayed))) => axum::Json(BrowserTurnReply { relayed }).into_response(),
        Ok(Some(Err(why))) => live_view_refused(
            corral_core::browser::turn::TurnRefusal::Unreachable(String::new()).code(),
            why,
        ),
        Ok(None) => live_view_stopped(),
        Err(e) => error(ErrorCode::RunFailed, ErrorDetail::message(e)),
    }
}

/// `POST /v1/browser/private` (BROW-12): every other member's peer removed, or the interval ended.
async fn browser_private(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let request: BrowserPrivateRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return refusal(ErrorBody::of_json(&e)),
    };
    let removed = on_live_view(state, move |handle| {
        handle.private(request.member.as_deref())
    });
    match removed.await {
        Ok(removed) => axum::Json(BrowserPrivateReply {
            removed: removed.unwrap_or_default(),
        })
        .into_response(),
        Err(e) => error(ErrorCode::RunFailed, ErrorDetail::message(e)),
    }
}

/// `POST /v1/browser/act` (BROW-10).
async fn browser_act(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let Some(worker) = state.hold() else {
        return busy();
    };
    let action: corral_core::browser::Action = match serde_json::from_slice(&body) {
        Ok(action) => action,
        Err(e) => return refusal(ErrorBody::of_json(&e)),
    };
    match worker.run(move |worker| worker.browser_act(&action)).await {
        Ok(Ok(reply)) => axum::Json(reply).into_response(),
        Ok(Err(e)) => session_error(&e),
        Err(e) => error(ErrorCode::RunFailed, ErrorDetail::message(e)),
    }
}

/// `POST /v1/browser/close` (BROW-13).
async fn browser_close(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let Some(worker) = state.hold() else {
        return busy();
    };
    let request: BrowserCloseRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return refusal(ErrorBody::of_json(&e)),
    };
    // The media adapter stops first (its peers, its relay), before the processes it watches.
    let adapter = state.live_view().take();
    if let Some(adapter) = adapter {
        let _ = tokio::task::spawn_blocking(move || adapter.stop()).await;
    }
    match worker
        .run(move |worker| worker.close_browser(request.token))
        .await
    {
        Ok(Ok(reply)) => axum::Json(reply).into_response(),
        Ok(Err(e)) => session_error(&e),
        Err(e) => error(ErrorCode::ResetFailed, ErrorDetail::message(e)),
    }
}

fn busy() -> Response {
    error(
        ErrorCode::Busy,
        ErrorDetail::message("another operation is in progress"),
    )
}

/// Why an execute was refused before the code ran.
enum Refusal {
    Archive(ArchiveError),
    Staging(String),
}

impl AppState {
    /// The worker for one run or reset, or `None` while another holds it.
    fn hold(&self) -> Option<Held> {
        let guard = self.worker.clone().try_lock_owned().ok()?;
        self.busy.store(true, Ordering::SeqCst);
        Some(Held {
            guard,
            busy: self.busy.clone(),
        })
    }
}

/// The worker held by one request; `/health` says busy until it is dropped.
struct Held {
    guard: tokio::sync::OwnedMutexGuard<JailThread>,
    busy: Arc<AtomicBool>,
}

impl std::ops::Deref for Held {
    type Target = JailThread;
    fn deref(&self) -> &JailThread {
        &self.guard
    }
}

impl Drop for Held {
    /// Lowers the flag before the lock is released (fields drop after this body).
    fn drop(&mut self) {
        self.busy.store(false, Ordering::SeqCst);
    }
}

async fn execute(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let Some(worker) = state.hold() else {
        return busy();
    };
    // A browser session holds the worker until it closes (BROW-6).
    if worker
        .run(|worker| worker.has_session())
        .await
        .unwrap_or(true)
    {
        return session_error(&SessionError::Open);
    }
    let request: ExecuteRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return refusal(ErrorBody::of_json(&e)),
    };
    drop(body);
    let accepted = match request.accept(&state.bounds) {
        Ok(accepted) => accepted,
        Err(refused) => return refusal(refused),
    };
    let number = state.requests.fetch_add(1, Ordering::Relaxed);
    let request_dir = state.staging.join(format!("request-{number}"));
    // The worker's part of the run's one trace: the API's span is its parent.
    let span = tracing::info_span!(
        "execute",
        corral.lease = request.token.0,
        corral.language = request.language.as_str(),
        corral.warm = tracing::field::Empty,
        corral.exit_code = tracing::field::Empty
    );
    crate::trace::continue_from(&span, request.traceparent.as_deref());
    // A streamed answer (WS-7): the code's output goes out as it is read, the reply last.
    let (frames, streamed) = tokio::sync::mpsc::unbounded_channel::<ExecuteFrame>();
    let tap = request.stream_output.then(|| {
        let frames = frames.clone();
        crate::capture::Tap(Arc::new(move |frame| {
            // An API that hung up is not waited for: the run goes on to its end.
            let _ = frames.send(frame);
        }))
    });
    let bounds = accepted.bounds;
    let archive = accepted.archive;
    let run = RunRequest {
        language: request.language,
        code: request.code.into_bytes(),
        workspace: Some(request_dir.join("workspace")),
        wall_seconds: None,
        declared: accepted.declared,
        token: request.token,
        bounds: Some(bounds.clone()),
        pack_workspace: true,
        grant: request.grant,
        install: request.dependencies,
        kernel: request.kernel,
        tools: request.tools,
        resources: accepted.resources.map(std::sync::Arc::new),
        tap,
    };
    // The answer goes out once the result is complete; the run's own reset follows on the jail
    // thread, before any other job (the reset between leases included, which counts what it
    // left). Nothing of the run is handed on before that reset's evidence: only the pool hands
    // a worker on, and only after the reset it orders.
    let ran = run_then_reset(worker, run, request_dir, archive, bounds);
    let ran = tracing::Instrument::instrument(ran, span);
    if !request.stream_output {
        return match ran.await {
            Ok(reply) => axum::Json(reply).into_response(),
            Err(body) => refusal(body),
        };
    }
    streamed_answer(ran, frames, streamed)
}

/// Runs the staged request on the jail thread and answers once its result is complete; the run's
/// own reset and the staged copy's removal follow on the jail thread.
async fn run_then_reset(
    worker: Held,
    run: RunRequest,
    request_dir: PathBuf,
    archive: Option<Vec<u8>>,
    bounds: ExecutionBounds,
) -> Result<ExecuteReply, ErrorBody> {
    let ran = worker
        .answer_then(move |worker| {
            let ran = run_staged(worker, &run, &request_dir, archive.as_deref(), &bounds);
            let (ran, unreset) = match ran {
                Ok((result, unreset)) => (Ok(result), unreset),
                Err(refusal) => (Err(refusal), None),
            };
            let then: Job = Box::new(move |worker: &mut Worker| {
                if let Some(unreset) = unreset {
                    worker.reset_later(unreset);
                }
                // The staged copy is the request's alone; it is removed whatever happened.
                let _ = std::fs::remove_dir_all(&request_dir);
            });
            (ran, Some(then))
        })
        .await;
    drop(worker);
    if let Ok(Ok(result)) = &ran {
        let span = tracing::Span::current();
        span.record("corral.warm", result.reply.warm);
        if let Some(code) = result.reply.exit_code {
            span.record("corral.exit_code", code);
        }
    }
    executed(ran)
}

/// The streamed answer (WS-7): the code's output frames as they come, each an NDJSON line, then
/// the reply (or a refusal) as the last line.
fn streamed_answer(
    ran: impl Future<Output = Result<ExecuteReply, ErrorBody>> + Send + 'static,
    frames: tokio::sync::mpsc::UnboundedSender<ExecuteFrame>,
    streamed: tokio::sync::mpsc::UnboundedReceiver<ExecuteFrame>,
) -> Response {
    // The answer begins now; the reply (or a refusal) is its last line, after every chunk.
    tokio::spawn(async move {
        let last = match ran.await {
            Ok(reply) => ExecuteFrame::Reply(Box::new(reply)),
            Err(body) => ExecuteFrame::Refused(body),
        };
        let _ = frames.send(last);
    });
    let lines = futures::stream::unfold(streamed, |mut streamed| async move {
        let frame = streamed.recv().await?;
        let mut line = serde_json::to_vec(&frame).unwrap_or_default();
        line.push(b'\n');
        Some((
            Ok::<_, std::convert::Infallible>(Bytes::from(line)),
            streamed,
        ))
    });
    (
        [(
            axum::http::header::CONTENT_TYPE,
            corral_contract::routes::NDJSON,
        )],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

/// An execute's answer: the reply, or the refusal of a run that never got to its end.
fn executed(ran: Result<Result<RunResult, Refusal>, String>) -> Result<ExecuteReply, ErrorBody> {
    match ran {
        Ok(Ok(result)) => Ok(execute_reply(result)),
        Ok(Err(Refusal::Archive(e))) => Err(ErrorBody::new(
            ErrorCode::WorkspaceArchiveRefused,
            ErrorDetail {
                reason: Some(e.code().to_owned()),
                setting: e.setting().map(str::to_owned),
                message: Some(e.to_string()),
                ..ErrorDetail::default()
            },
        )),
        Ok(Err(Refusal::Staging(e))) => Err(ErrorBody::new(
            ErrorCode::StagingFailed,
            ErrorDetail::message(e),
        )),
        Err(e) => Err(ErrorBody::new(
            ErrorCode::RunFailed,
            ErrorDetail::message(e),
        )),
    }
}

/// `POST /v1/validate_package` (PI-1): the files decoded and checked by the same rules the API
/// checked them by, then the validation on the jail thread; answered before its reset, which
/// follows on the thread before any other job.
async fn validate_package(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let Some(worker) = state.hold() else {
        return busy();
    };
    if worker
        .run(|worker| worker.has_session())
        .await
        .unwrap_or(true)
    {
        return session_error(&SessionError::Open);
    }
    let request: ValidateRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return refusal(ErrorBody::of_json(&e)),
    };
    drop(body);
    let invalid = |message: &str| error(ErrorCode::BodyInvalid, ErrorDetail::message(message));
    if request.deadline_ms == 0
        || request.deadline_ms > corral_core::pi::DEADLINE_MAX_SECONDS * 1_000
    {
        return invalid("deadline_ms is zero or above the longest validation deadline");
    }
    let Some(files) = request
        .files
        .iter()
        .map(WireFile::decode)
        .collect::<Option<Vec<_>>>()
    else {
        return invalid("a file's bytes are not base64");
    };
    let checked = corral_core::pi::files::check_files(files).and_then(|files| {
        corral_core::pi::package::check_package(&files).map(|checked| (files, checked))
    });
    let (files, checked) = match checked {
        Ok(both) => both,
        Err(refused) => {
            // The API checks first; a package refused here never reaches a jail.
            return axum::Json(ValidateReply {
                failure: Some(refused),
                step: Some(corral_core::pi::Step::Static),
                ..ValidateReply::default()
            })
            .into_response();
        }
    };
    let order = Validation {
        files,
        checked,
        deadline: Duration::from_millis(request.deadline_ms),
        install_token: request.install_token,
        token: request.token,
    };
    let ran = worker
        .answer_then(move |worker| {
            let (reply, unreset) = worker.validate_package(&order);
            let then: Job = Box::new(move |worker: &mut Worker| {
                if let Some(unreset) = unreset {
                    worker.reset_later(unreset);
                }
            });
            (reply, Some(then))
        })
        .await;
    drop(worker);
    match ran {
        Ok(reply) => axum::Json(reply).into_response(),
        Err(e) => error(ErrorCode::RunFailed, ErrorDetail::message(e)),
    }
}

/// Unpacks the archive (if any) as the request's workspace, then runs up to the run's reset.
/// Blocking.
fn run_staged(
    worker: &mut Worker,
    run: &RunRequest,
    request_dir: &Path,
    archive: Option<&[u8]>,
    bounds: &ExecutionBounds,
) -> Result<(RunResult, Option<Unreset>), Refusal> {
    std::fs::create_dir(request_dir)
        .map_err(|e| Refusal::Staging(format!("create {}: {e}", request_dir.display())))?;
    let workspace = request_dir.join("workspace");
    match archive {
        Some(bytes) => {
            archive::unpack(bytes, &workspace, bounds.workspace_max_bytes)
                .map_err(Refusal::Archive)?;
        }
        None => std::fs::create_dir(&workspace)
            .map_err(|e| Refusal::Staging(format!("create {}: {e}", workspace.display())))?,
    }
    Ok(worker.run_before_reset(run))
}

/// The run's result as `corral jail run` prints it, with the workspace packed into it.
fn execute_reply(result: RunResult) -> ExecuteReply {
    let mut reply = result.reply;
    reply.workspace = match result.workspace_archive {
        Some(Ok(bytes)) => WorkspaceReturn::of_archive(&bytes),
        Some(Err(e)) => WorkspaceReturn::Refused {
            reason: e.code().to_owned(),
            setting: e.setting().map(str::to_owned),
            message: e.to_string(),
        },
        None => WorkspaceReturn::NotPacked,
    };
    reply
}

async fn reset(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let Some(worker) = state.hold() else {
        return busy();
    };
    let request: ResetRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return refusal(ErrorBody::of_json(&e)),
    };
    // A reset ends whatever session there was, and its live view with it.
    let adapter = state.live_view().take();
    if let Some(adapter) = adapter {
        let _ = tokio::task::spawn_blocking(move || adapter.stop()).await;
    }
    let staging = state.staging.clone();
    let done = worker
        .run(move |worker| {
            let mut diagnostics = Vec::new();
            let mut evidence = worker.reset_all(request.token, &mut diagnostics);
            // Staged workspaces are removed after every request; any left are wiped and counted.
            let left = wipe_staging(&staging, &mut diagnostics);
            evidence.workspace_entries = match (evidence.workspace_entries, left) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                _ => None,
            };
            (evidence, diagnostics)
        })
        .await;
    // The next jails are prepared once the evidence is measured (it would count as the run's
    // processes otherwise), while the answer goes out; a request arriving meanwhile waits for it
    // on the thread.
    if let Err(e) = worker.queue(Box::new(prepare_next)) {
        tracing::warn!(why = %e, "no prepared jail");
    }
    drop(worker);
    match done {
        Ok((evidence, diagnostics)) => axum::Json(ResetReply {
            reset_evidence: EvidenceReport::judged(evidence),
            diagnostics,
        })
        .into_response(),
        Err(e) => error(ErrorCode::ResetFailed, ErrorDetail::message(e)),
    }
}

/// Removes everything in the staging directory; the entries left after, `None` if unreadable.
fn wipe_staging(staging: &Path, diagnostics: &mut Vec<String>) -> Option<u32> {
    if let Ok(listing) = std::fs::read_dir(staging) {
        for entry in listing.flatten() {
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                crate::result::note(diagnostics, format!("staging: {e}"));
            }
        }
    }
    crate::workspace::entries(staging)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen(args: &[&str]) -> Result<Option<SocketAddr>, clap::Error> {
        use clap::Parser as _;
        let WorkerCommand::Serve(serve) =
            WorkerCli::try_parse_from(std::iter::once(&"worker").chain(args))?.command;
        Ok(serve.listen)
    }

    #[test]
    fn arguments() {
        assert_eq!(listen(&["serve"]).ok(), Some(None));
        assert_eq!(
            listen(&["serve", "--listen", "127.0.0.1:0"]).ok(),
            Some(Some(SocketAddr::from(([127, 0, 0, 1], 0))))
        );
        assert_eq!(
            listen(&["serve", "--listen=127.0.0.1:0"]).ok(),
            Some(Some(SocketAddr::from(([127, 0, 0, 1], 0))))
        );
        for bad in [
            &["serve", "--listen", "nowhere"][..],
            &["serve", "--listen"],
            &["serve", "--lisen", "127.0.0.1:0"],
            &["run"],
            &[],
        ] {
            let error = listen(bad).expect_err("refused");
            assert_eq!(error.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn the_usage_comes_from_the_definition() {
        let usage = USAGE.to_string();
        assert!(usage.contains("Usage: corral worker"), "{usage}");
        assert!(usage.contains("serve"), "{usage}");
    }
}
