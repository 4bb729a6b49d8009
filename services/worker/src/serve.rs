//! `corral worker serve`: the worker's control API (issue 4 item 5), on
//! `CORRAL_WORKER_CONTROL_PORT`.
//!
//! Every request, `/health` included, must carry `Authorization: Bearer <credential>`, the
//! credential only the controller and the API hold (`CORRAL_WORKER_TOKEN_FILE` or
//! `CORRAL_WORKER_TOKEN`); the server refuses to start without one and compares in constant time.
//!
//! - `GET /health`: the posture, whether a run is in progress, whether a prepared jail (its
//!   interpreter started, its imports done) waits for the next execute (`prepared`), and for
//!   which languages (`prepared_languages`).
//! - `POST /v1/execute`: runs code in the jail exactly as `corral jail run` does, with an optional
//!   workspace archive (base64 tar) unpacked first and the workspace packed after; returns the same
//!   result object plus `workspace_archive`.
//! - `POST /v1/reset`: kills anything left (every prepared jail too), wipes, returns the reset
//!   evidence under the token given, then prepares the next jails.
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
//! a request may ask is bounded: the body (workspace bound in base64, plus code, plus a margin),
//! each bound override (never above the configured one, `corral_core::jail::lowered_bounds`), the
//! grant and the declared names.
//!
//! The grant (EGR-8) goes to the run's egress relay, never into the jail: the relay adds it to
//! every connection it carries to `SANDBOX_EGRESS_PROXY_URL` (read once, at start). The prepared
//! jail's relay listens from its preparation and gets the grant when an execute takes it.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use corral_core::config::{ExecutionBounds, Settings};
use corral_core::ids::OpToken;
use corral_core::jail::{BoundOverrides, Language, lowered_bounds};
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::Mutex;

use crate::archive::{self, ArchiveError};
use crate::result::{EvidenceResult, RunResult};
use crate::supervisor::{Reexec, RunRequest, Worker};

/// Usage of `corral worker`.
pub const USAGE: &str = "usage: corral worker serve [--listen ADDR]

serve   the worker's control API: GET /health, POST /v1/execute, POST /v1/reset, each
        authenticated with `Authorization: Bearer <credential>`. The credential is read from the
        file named by CORRAL_WORKER_TOKEN_FILE, else from CORRAL_WORKER_TOKEN; without one the
        server does not start. It listens on 0.0.0.0:CORRAL_WORKER_CONTROL_PORT (8091) unless
        --listen ADDR says otherwise, and prints `listening on ADDR` once bound.
";

/// Shortest credential accepted: shorter ones are guessable.
pub const TOKEN_MIN_BYTES: usize = 16;
/// Longest credential (and credential file) read.
pub const TOKEN_MAX_BYTES: usize = 4_096;
/// Longest grant string a request may carry.
pub const GRANT_MAX_BYTES: usize = 4_096;
/// Most names a request may declare as outputs, and the longest name.
pub const DECLARED_MAX: usize = 64;
/// See [`DECLARED_MAX`].
pub const DECLARED_NAME_MAX_BYTES: usize = 1_024;
/// Room in a request body beyond the workspace and the code: the JSON around them.
const BODY_MARGIN_BYTES: u64 = 64 * 1024;
/// Where requests' workspaces are staged, in the supervisor's private mount namespace.
const STAGING_DIR: &str = "/run/corral-worker-api";

const EXIT_USAGE: u8 = 2;

/// The largest request body for a workspace bound of `workspace_max_bytes`: the archive in
/// base64, the code (at most as large as a workspace) twice over for JSON escaping, and a margin.
#[must_use]
pub fn body_max_bytes(workspace_max_bytes: u64) -> u64 {
    let base64_bytes = workspace_max_bytes.div_ceil(3).saturating_mul(4);
    base64_bytes
        .saturating_add(workspace_max_bytes.saturating_mul(2))
        .saturating_add(BODY_MARGIN_BYTES)
}

/// One operation on the worker, run on its thread.
type Job = Box<dyn FnOnce(&mut Worker) + Send>;

/// The one thread that owns the worker and runs every operation on it. One thread, because a
/// jail dies with the thread that started it (the parent-death signal follows the thread), and a
/// prepared jail must outlive the request that prepared it: the runtime's blocking threads come
/// and go.
struct JailThread {
    jobs: std::sync::mpsc::SyncSender<Job>,
    /// What `/health` reports, updated after every job (before a waiting job's answer goes
    /// out, so that no answer is followed by a stale report).
    prepared: Arc<PreparedLanguages>,
}

/// Jobs that may wait for the thread: the one of the request holding the lock, and the
/// preparation that follows a reset.
const JOBS_QUEUED_MAX: usize = 2;

impl JailThread {
    /// Starts the thread, which prepares the first jails before it takes any job.
    /// `prepared` tells which languages' prepared jails wait, after each job (for `/health`).
    fn start(mut worker: Worker, prepared: Arc<PreparedLanguages>) -> Result<Self, String> {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(JOBS_QUEUED_MAX);
        let reported = prepared.clone();
        std::thread::Builder::new()
            .name("corral-jail".to_owned())
            .spawn(move || {
                prepare_next(&mut worker);
                reported.set(&worker.prepared_languages());
                while let Ok(job) = queue.recv() {
                    job(&mut worker);
                    reported.set(&worker.prepared_languages());
                }
            })
            .map_err(|e| format!("start the jail thread: {e}"))?;
        Ok(Self { jobs, prepared })
    }

    /// Runs `job` on the thread and waits for its answer.
    async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Worker) -> T + Send + 'static,
    ) -> Result<T, String> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let prepared = self.prepared.clone();
        self.jobs
            .try_send(Box::new(move |worker| {
                let value = job(worker);
                prepared.set(&worker.prepared_languages());
                let _ = answer.send(value);
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
            eprintln!(
                "corral worker: no prepared {} jail, its runs go cold: {why}",
                language.as_str()
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

    fn get(&self) -> Vec<&'static str> {
        let bits = self.0.load(Ordering::Relaxed);
        Self::ALL
            .into_iter()
            .filter(|l| bits & Self::bit(*l) != 0)
            .map(Language::as_str)
            .collect()
    }
}

/// What every handler shares.
struct AppState {
    token: Vec<u8>,
    /// The one worker's thread; held for the whole of a run or reset, so that a second one gets
    /// 409.
    worker: Arc<Mutex<JailThread>>,
    /// Which languages' prepared jails wait for the next execute.
    prepared: Arc<PreparedLanguages>,
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

/// The header naming the worker a request is meant for.
pub const WORKER_ID_HEADER: &str = "x-corral-worker-id";

/// Runs `corral worker <args>`. `prefix` is what re-executes this binary into the jail's stages
/// (`["jail"]` for `corral`).
pub fn main(args: &[String], prefix: &[&str]) -> ExitCode {
    if matches!(
        args.first().map(String::as_str),
        Some("help" | "--help" | "-h")
    ) {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let listen = match parse(args) {
        Ok(listen) => listen,
        Err(message) => {
            eprintln!("corral worker: {message}\n\n{USAGE}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match start(listen, prefix) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("corral worker: {message}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Parses `serve [--listen ADDR]`.
fn parse(args: &[String]) -> Result<Option<SocketAddr>, String> {
    match args {
        [command] if command == "serve" => Ok(None),
        [command, flag, addr] if command == "serve" && flag == "--listen" => addr
            .parse()
            .map(Some)
            .map_err(|e| format!("--listen {addr:?}: {e}")),
        [command, flag] if command == "serve" && flag.starts_with("--listen=") => {
            let addr = &flag["--listen=".len()..];
            addr.parse()
                .map(Some)
                .map_err(|e| format!("--listen {addr:?}: {e}"))
        }
        _ => Err("expected `serve [--listen ADDR]`".to_owned()),
    }
}

/// Reads the credential: the file named by `CORRAL_WORKER_TOKEN_FILE`, else
/// `CORRAL_WORKER_TOKEN`. Surrounding whitespace (a file's final newline) is not part of it.
fn read_token() -> Result<Vec<u8>, String> {
    let raw = if let Some(path) = std::env::var_os("CORRAL_WORKER_TOKEN_FILE") {
        let path = PathBuf::from(path);
        let shown = |e: std::io::Error| format!("CORRAL_WORKER_TOKEN_FILE {}: {e}", path.display());
        let file = std::fs::File::open(&path).map_err(shown)?;
        // One byte past the bound, so that an oversized file is seen as such without reading it.
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, TOKEN_MAX_BYTES as u64 + 1),
            &mut raw,
        )
        .map_err(shown)?;
        raw
    } else if let Some(value) = std::env::var_os("CORRAL_WORKER_TOKEN") {
        value.into_encoded_bytes()
    } else {
        return Err(
            "no credential: set CORRAL_WORKER_TOKEN_FILE or CORRAL_WORKER_TOKEN; the control API never runs unauthenticated"
                .to_owned(),
        );
    };
    let token = raw.trim_ascii().to_vec();
    if !(TOKEN_MIN_BYTES..=TOKEN_MAX_BYTES).contains(&token.len()) {
        return Err(format!(
            "the credential must be {TOKEN_MIN_BYTES} to {TOKEN_MAX_BYTES} bytes"
        ));
    }
    if token.iter().any(|b| !b.is_ascii_graphic()) {
        return Err("the credential must be printable ASCII without spaces".to_owned());
    }
    Ok(token)
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
    let worker = Worker::start(settings.clone(), Reexec::this_binary(prefix));
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
        body_max_bytes: body_max_bytes(bounds.workspace_max_bytes),
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
        .route("/health", get(health))
        .route("/v1/execute", post(execute))
        .route("/v1/reset", post(reset))
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

/// A JSON error response.
fn error(status: StatusCode, code: &str, detail: impl Into<Value>) -> Response {
    (
        status,
        axum::Json(json!({ "error": code, "detail": detail.into() })),
    )
        .into_response()
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
        .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    // `ct_eq` on slices of different lengths is false without comparing contents; the length of
    // the credential is not the secret.
    if !bool::from(presented.ct_eq(&state.token)) {
        let mut response = error(StatusCode::UNAUTHORIZED, "unauthorized", Value::Null);
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
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            json!({ "max_bytes": state.body_max_bytes }),
        );
    }
    if let Some(id) = &state.worker_id
        && request.uri().path().starts_with("/v1/")
        && request
            .headers()
            .get(WORKER_ID_HEADER)
            .is_none_or(|named| named.as_bytes() != id.as_bytes())
    {
        // 421: the request reached a worker it was not meant for; nothing ran.
        return error(
            StatusCode::MISDIRECTED_REQUEST,
            "wrong_worker",
            json!({ "this_worker": id }),
        );
    }
    next.run(request).await
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", Value::Null)
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let prepared = state.prepared.get();
    axum::Json(json!({
        "status": "ok",
        "posture": state.posture,
        "busy": state.worker.try_lock().is_err(),
        "prepared": !prepared.is_empty(),
        "prepared_languages": prepared,
        "body_max_bytes": state.body_max_bytes,
    }))
    .into_response()
}

/// Per-run bounds a request may ask for; each no higher than the configured one.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BoundsRequest {
    wall_seconds: Option<u64>,
    output_bytes: Option<u64>,
    artifact_bytes: Option<u64>,
    memory_bytes: Option<u64>,
    processes: Option<u32>,
}

/// The body of `POST /v1/execute`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteRequest {
    language: String,
    code: String,
    /// A tar of the workspace, base64.
    #[serde(default)]
    workspace: Option<String>,
    #[serde(default)]
    bounds: BoundsRequest,
    /// The run's egress grant (EGR-8).
    #[serde(default)]
    grant: Option<String>,
    /// Names the run declares as outputs (WS-7).
    #[serde(default)]
    declared: Vec<String>,
    /// The operation token the reset evidence carries.
    #[serde(default)]
    token: u64,
}

/// The body of `POST /v1/reset`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetRequest {
    token: u64,
}

/// Why an execute was refused before the code ran.
enum Refusal {
    Archive(ArchiveError),
    Staging(String),
}

async fn execute(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let Ok(worker) = state.worker.clone().try_lock_owned() else {
        return error(
            StatusCode::CONFLICT,
            "busy",
            "another operation is in progress",
        );
    };
    let request: ExecuteRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
    };
    drop(body);
    let (bounds, archive) = match admit(&request, &state.bounds) {
        Ok(admitted) => admitted,
        Err(response) => return *response,
    };
    let number = state.requests.fetch_add(1, Ordering::Relaxed);
    let request_dir = state.staging.join(format!("request-{number}"));
    let run = RunRequest {
        language: request.language,
        code: request.code.into_bytes(),
        workspace: Some(request_dir.join("workspace")),
        wall_seconds: None,
        declared: request.declared,
        token: OpToken(request.token),
        bounds: Some(bounds.clone()),
        pack_workspace: true,
        grant: request.grant,
    };
    let ran = worker
        .run(move |worker| {
            let ran = run_staged(worker, &run, &request_dir, archive.as_deref(), &bounds);
            // The staged copy is the request's alone; it is removed whatever happened.
            let _ = std::fs::remove_dir_all(&request_dir);
            ran
        })
        .await;
    drop(worker);
    match ran {
        Ok(Ok(result)) => execute_response(result),
        Ok(Err(Refusal::Archive(e))) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "workspace_archive_refused",
            json!({ "reason": e.code(), "setting": e.setting(), "message": e.to_string() }),
        ),
        Ok(Err(Refusal::Staging(e))) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, "staging_failed", e)
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "run_failed",
            e.to_string(),
        ),
    }
}

/// Checks what an execute asks: the grant and declared names within their bounds, each bound
/// override no higher than configured, the archive's encoding. Returns the run's bounds and the
/// archive's bytes, or the response refusing the request.
fn admit(
    request: &ExecuteRequest,
    configured: &ExecutionBounds,
) -> Result<(ExecutionBounds, Option<Vec<u8>>), Box<Response>> {
    if request
        .grant
        .as_ref()
        .is_some_and(|g| g.len() > GRANT_MAX_BYTES)
    {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "grant_too_long",
            GRANT_MAX_BYTES,
        )));
    }
    // The relay puts the grant in a header: nothing that could end the header or start another.
    if request
        .grant
        .as_deref()
        .is_some_and(|g| !crate::relay::grant_is_sendable(g))
    {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "grant_malformed",
            "a grant is non-empty printable ASCII without spaces",
        )));
    }
    if request.declared.len() > DECLARED_MAX
        || request
            .declared
            .iter()
            .any(|n| n.len() > DECLARED_NAME_MAX_BYTES)
    {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "declared_too_many",
            DECLARED_MAX,
        )));
    }
    let overrides = BoundOverrides {
        max_wall_seconds: request.bounds.wall_seconds,
        max_output_bytes: request.bounds.output_bytes,
        max_artifact_bytes: request.bounds.artifact_bytes,
        max_memory_bytes: request.bounds.memory_bytes,
        max_processes: request.bounds.processes,
    };
    let bounds = match lowered_bounds(configured, &overrides) {
        Ok(bounds) => bounds,
        Err(refused) => {
            return Err(Box::new(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                refused.code(),
                json!({ "setting": refused.setting }),
            )));
        }
    };
    let archive = match request.workspace.as_deref().map(|text| BASE64.decode(text)) {
        None => None,
        Some(Ok(bytes)) => Some(bytes),
        Some(Err(e)) => {
            return Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                "workspace_not_base64",
                e.to_string(),
            )));
        }
    };
    Ok((bounds, archive))
}

/// Unpacks the archive (if any) as the request's workspace, then runs. Blocking.
fn run_staged(
    worker: &mut Worker,
    run: &RunRequest,
    request_dir: &Path,
    archive: Option<&[u8]>,
    bounds: &ExecutionBounds,
) -> Result<RunResult, Refusal> {
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
    Ok(worker.run(run))
}

/// The run's result as `corral jail run` prints it, plus the packed workspace.
fn execute_response(mut result: RunResult) -> Response {
    let packed = result.workspace_archive.take();
    let Ok(mut body) = serde_json::to_value(&result) else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "encode_failed",
            Value::Null,
        );
    };
    let (archive, archive_error) = match packed {
        Some(Ok(bytes)) => (Value::String(BASE64.encode(bytes)), Value::Null),
        Some(Err(e)) => (
            Value::Null,
            json!({ "reason": e.code(), "setting": e.setting(), "message": e.to_string() }),
        ),
        None => (Value::Null, Value::Null),
    };
    if let Some(object) = body.as_object_mut() {
        object.insert("workspace_archive".to_owned(), archive);
        object.insert("workspace_error".to_owned(), archive_error);
    }
    axum::Json(body).into_response()
}

async fn reset(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let Ok(worker) = state.worker.clone().try_lock_owned() else {
        return error(
            StatusCode::CONFLICT,
            "busy",
            "another operation is in progress",
        );
    };
    let request: ResetRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
    };
    let staging = state.staging.clone();
    let done = worker
        .run(move |worker| {
            let mut diagnostics = Vec::new();
            let mut evidence = worker.reset_all(OpToken(request.token), &mut diagnostics);
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
        eprintln!("corral worker: no prepared jail: {e}");
    }
    drop(worker);
    match done {
        Ok((evidence, diagnostics)) => axum::Json(json!({
            "reset_evidence": EvidenceResult::judged(&evidence),
            "diagnostics": diagnostics,
        }))
        .into_response(),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "reset_failed",
            e.to_string(),
        ),
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

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn arguments() {
        assert_eq!(parse(&strings(&["serve"])), Ok(None));
        assert_eq!(
            parse(&strings(&["serve", "--listen", "127.0.0.1:0"])),
            Ok(Some(SocketAddr::from(([127, 0, 0, 1], 0))))
        );
        assert!(parse(&strings(&["serve", "--listen", "nowhere"])).is_err());
        assert!(parse(&strings(&["run"])).is_err());
    }

    #[test]
    fn the_body_bound_covers_a_full_workspace_in_base64_and_the_code() {
        let eight_mib = 8 * 1024 * 1024;
        let bound = body_max_bytes(eight_mib);
        assert!(bound >= eight_mib / 3 * 4 + eight_mib);
        assert!(bound < 4 * eight_mib);
    }
}
