//! The one client of the worker's control routes, used by the API (execute, and the reset after
//! a lease) and the controller (the resets the pool orders).
//!
//! Every request opens a fresh connection: a worker that died while idle then refuses the
//! connection ([`CallError::Unreachable`]: the request never arrived, the code did not run),
//! where a pooled connection would fail mid-send and leave it unknowable whether it arrived.
//! Every reply is read up to the route's bound and decoded as the route's type; anything else is
//! [`CallError::ReplyInvalid`]. One deadline covers the whole call: the connection, the request
//! and the reply.
//!
//! The connection is opened through [`Dial`], the client's one seam with the network: TCP in
//! production ([`TcpDial`]), a simulated network under deterministic simulation (issue 28). HTTP
//! is hyper's client connection API over whatever the seam returns.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::time::Instant;

use corral_core::bounds::ExecutionBounds;
use corral_core::ids::{OpToken, WorkerId};
use serde::de::DeserializeOwned;

use crate::error::{ErrorBody, ErrorCode};
use crate::limits::{
    SMALL_REPLY_MAX_BYTES, execute_reply_max_bytes, output_frame_max_bytes,
    streamed_output_max_bytes,
};
use crate::locate::Locator;
use crate::messages::{
    BrowserActReply, BrowserCloseReply, BrowserCloseRequest, BrowserOpenReply, BrowserOpenRequest,
    BrowserPrivateReply, BrowserPrivateRequest, BrowserSignalReply, BrowserSignalRequest,
    BrowserTurnReply, ExecuteFrame, ExecuteReply, ExecuteRequest, HealthReply, LiveViewOrder,
    ResetReply, ResetRequest,
};
use crate::routes::{
    BROWSER_ACT, BROWSER_CLOSE, BROWSER_OPEN, BROWSER_PRIVATE, BROWSER_SIGNAL, BROWSER_TURN,
    EXECUTE, HEALTH, RESET, WORKER_ID_HEADER,
};

/// How long a reset may take before it counts as unanswered (unproven).
pub const RESET_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a health check may take.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Time an execute may take beyond its wall bound: staging, packing, the reply.
pub const EXECUTE_MARGIN: Duration = Duration::from_secs(30);

/// Why a call produced no reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The request never reached the worker: it has no address, the connection was refused, or
    /// its address now answers for another worker (421). Nothing ran.
    Unreachable(String),
    /// The connection broke or timed out after the request was sent: the operation may have
    /// happened; nobody can vouch for the worker.
    Lost(String),
    /// The worker refused, with its typed error.
    Refused(ErrorBody),
    /// The worker answered with something that is not the route's reply.
    ReplyInvalid(String),
}

impl CallError {
    /// What the run's sequence reads of it (`corral_core::run::sequence`): unreachable (nothing
    /// ran), lost (nobody can vouch for the worker), or refused before or after anything ran.
    #[must_use]
    pub fn as_call(&self) -> corral_core::run::sequence::Call {
        use corral_core::run::sequence::Call;
        match self {
            Self::Unreachable(_) => Call::Unreachable,
            Self::Lost(_) | Self::ReplyInvalid(_) => Call::Lost,
            Self::Refused(body) => Call::Refused {
                before_anything_ran: body.error.before_anything_ran(),
            },
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable(why) => write!(f, "unreachable: {why}"),
            Self::Lost(why) => write!(f, "lost: {why}"),
            Self::Refused(body) => write!(f, "refused: {}", body.error.code()),
            Self::ReplyInvalid(why) => write!(f, "invalid reply: {why}"),
        }
    }
}

/// A connection the client can speak HTTP/1.1 over.
pub trait Connection:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static
{
}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// What [`Dial::dial`] returns.
pub type Dialing<'a> =
    Pin<Box<dyn Future<Output = std::io::Result<Box<dyn Connection>>> + Send + 'a>>;

/// How the client reaches a worker's host and port: the one place it touches the network.
pub trait Dial: Send + Sync {
    /// A connection to `host:port`. An error means nothing was sent.
    fn dial<'a>(&'a self, host: &'a str, port: u16) -> Dialing<'a>;
}

/// Production's [`Dial`]: TCP, the name resolved by the system's resolver, without Nagle's
/// delay (a request is one write).
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpDial;

impl Dial for TcpDial {
    fn dial<'a>(&'a self, host: &'a str, port: u16) -> Dialing<'a> {
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect((host, port)).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as Box<dyn Connection>)
        })
    }
}

/// The client.
#[derive(Clone)]
pub struct WorkerClient {
    locator: Locator,
    credential: String,
    dial: Arc<dyn Dial>,
}

impl WorkerClient {
    /// A client presenting `credential` to workers found through `locator`, over TCP.
    ///
    /// # Errors
    /// None today; kept so that a client that cannot be built says why.
    pub fn new(locator: Locator, credential: String) -> Result<Self, String> {
        Ok(Self::with_dial(locator, credential, Arc::new(TcpDial)))
    }

    /// A client that opens its connections through `dial`.
    #[must_use]
    pub fn with_dial(locator: Locator, credential: String, dial: Arc<dyn Dial>) -> Self {
        Self {
            locator,
            credential,
            dial,
        }
    }

    /// Where the workers are.
    #[must_use]
    pub fn locator(&self) -> &Locator {
        &self.locator
    }

    /// Runs `request` on `worker`, whose bounds for it are `bounds` (the wait and the reply's
    /// size follow from them).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn execute(
        &self,
        worker: WorkerId,
        request: &ExecuteRequest,
        bounds: &ExecutionBounds,
    ) -> Result<ExecuteReply, CallError> {
        let body =
            serde_json::to_vec(request).map_err(|e| CallError::Unreachable(e.to_string()))?;
        let timeout = Duration::from_secs(bounds.max_wall_seconds) + EXECUTE_MARGIN;
        // Only a world that turned the defect on pays for keeping the body.
        #[cfg(feature = "sim-mutations")]
        let again = mutation::retries_lost_executes().then(|| body.clone());
        let answer = self
            .call(
                worker,
                EXECUTE,
                Some(body),
                timeout,
                execute_reply_max_bytes(bounds),
            )
            .await;
        #[cfg(feature = "sim-mutations")]
        if let (Some(again), Err(CallError::Lost(_))) = (again, &answer) {
            // The deliberate defect: a run whose answer was lost may have run; sending it again
            // may run it twice.
            return self
                .call(
                    worker,
                    EXECUTE,
                    Some(again),
                    timeout,
                    execute_reply_max_bytes(bounds),
                )
                .await;
        }
        answer
    }

    /// Runs `request` on `worker` with its output streamed ([`ExecuteRequest::stream_output`]):
    /// `on_output` gets each output and bound frame as the worker sends it, in order, and the
    /// answer is the reply that ends the stream. The frames are checked as they come: a line
    /// over its bound, an empty chunk, more text than the output bound keeps, a frame after the
    /// reply or a stream that ends without one is [`CallError::ReplyInvalid`] or
    /// [`CallError::Lost`], as [`Self::execute`] reports them.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn execute_streamed(
        &self,
        worker: WorkerId,
        request: &ExecuteRequest,
        bounds: &ExecutionBounds,
        mut on_output: impl FnMut(ExecuteFrame),
    ) -> Result<ExecuteReply, CallError> {
        let mut request = request.clone();
        request.stream_output = true;
        let body =
            serde_json::to_vec(&request).map_err(|e| CallError::Unreachable(e.to_string()))?;
        let timeout = Duration::from_secs(bounds.max_wall_seconds) + EXECUTE_MARGIN;
        let deadline = Instant::now() + timeout;
        let mut response = self.send(worker, EXECUTE, Some(body), deadline).await?;
        let status = response.status().as_u16();
        if status != 200 {
            let bytes =
                read_bounded(worker, &mut response, SMALL_REPLY_MAX_BYTES, deadline).await?;
            return Err(refused(worker, status, &bytes));
        }
        let invalid = |why: String| CallError::ReplyInvalid(format!("worker {worker}: {why}"));
        let frame_max = output_frame_max_bytes();
        let reply_max = execute_reply_max_bytes(bounds);
        let mut text_left = streamed_output_max_bytes(bounds);
        let mut line = Vec::new();
        loop {
            let chunk = next_chunk(worker, &mut response, deadline).await?;
            let Some(chunk) = chunk else {
                return Err(CallError::Lost(format!(
                    "worker {worker}: the streamed answer ended without a reply"
                )));
            };
            let mut rest: &[u8] = &chunk;
            while !rest.is_empty() {
                let (part, ended) = match rest.iter().position(|&b| b == b'\n') {
                    Some(at) => (&rest[..at], true),
                    None => (rest, false),
                };
                rest = &rest[part.len() + usize::from(ended)..];
                if (line.len() + part.len()) as u64 > frame_max.max(reply_max) {
                    return Err(invalid(format!(
                        "a line over {} bytes",
                        frame_max.max(reply_max)
                    )));
                }
                line.extend_from_slice(part);
                if !ended {
                    break;
                }
                let frame: ExecuteFrame =
                    serde_json::from_slice(&line).map_err(|e| invalid(e.to_string()))?;
                let length = line.len() as u64;
                line.clear();
                let passed = pass_frame(
                    worker,
                    frame,
                    length,
                    frame_max,
                    &mut text_left,
                    &mut on_output,
                )?;
                if let Some(reply) = passed {
                    // The reply is the last line: nothing may follow it.
                    let ended =
                        matches!(next_chunk(worker, &mut response, deadline).await, Ok(None));
                    return if rest.is_empty() && ended {
                        Ok(*reply)
                    } else {
                        Err(invalid("a frame after the reply".to_owned()))
                    };
                }
            }
        }
    }

    /// Validates a package on `worker` (PI-1).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn validate_package(
        &self,
        worker: WorkerId,
        request: &crate::messages::ValidateRequest,
    ) -> Result<crate::messages::ValidateReply, CallError> {
        let body =
            serde_json::to_vec(request).map_err(|e| CallError::Unreachable(e.to_string()))?;
        let timeout = Duration::from_millis(request.deadline_ms) + EXECUTE_MARGIN;
        self.call(
            worker,
            crate::routes::VALIDATE_PACKAGE,
            Some(body),
            timeout,
            crate::messages::VALIDATE_REPLY_MAX_BYTES,
        )
        .await
    }

    /// Resets `worker` under `token`.
    ///
    /// # Errors
    /// See [`CallError`]; any error means the reset proved nothing.
    pub async fn reset(&self, worker: WorkerId, token: OpToken) -> Result<ResetReply, CallError> {
        let body = serde_json::to_vec(&ResetRequest { token })
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        self.call(
            worker,
            RESET,
            Some(body),
            RESET_TIMEOUT,
            SMALL_REPLY_MAX_BYTES,
        )
        .await
    }

    /// `worker`'s health.
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn health(&self, worker: WorkerId) -> Result<HealthReply, CallError> {
        self.call(worker, HEALTH, None, HEALTH_TIMEOUT, SMALL_REPLY_MAX_BYTES)
            .await
    }

    /// Opens a browser session on `worker` (BROW-1, BROW-13).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn browser_open(
        &self,
        worker: WorkerId,
        request: &BrowserOpenRequest,
    ) -> Result<BrowserOpenReply, CallError> {
        let body =
            serde_json::to_vec(request).map_err(|e| CallError::Unreachable(e.to_string()))?;
        let timeout = Duration::from_secs(corral_core::browser::OPEN_MAX_SECONDS) + EXECUTE_MARGIN;
        self.call(
            worker,
            BROWSER_OPEN,
            Some(body),
            timeout,
            SMALL_REPLY_MAX_BYTES,
        )
        .await
    }

    /// One action on `worker`'s session (BROW-10).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn browser_act(
        &self,
        worker: WorkerId,
        action: &corral_core::browser::Action,
    ) -> Result<BrowserActReply, CallError> {
        let body = serde_json::to_vec(action).map_err(|e| CallError::Unreachable(e.to_string()))?;
        let timeout = Duration::from_millis(corral_core::browser::STEP_MAX_MS) + EXECUTE_MARGIN;
        let reply_max = (corral_core::browser::SCREENSHOT_MAX_BYTES as u64 / 3 * 4)
            .saturating_add(SMALL_REPLY_MAX_BYTES)
            .saturating_add(corral_core::browser::REPLY_MAX_BYTES as u64 * 6);
        self.call(worker, BROWSER_ACT, Some(body), timeout, reply_max)
            .await
    }

    /// Relays a viewer's offer to `worker`'s live view (BROW-2).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn browser_signal(
        &self,
        worker: WorkerId,
        request: &BrowserSignalRequest,
    ) -> Result<BrowserSignalReply, CallError> {
        let body =
            serde_json::to_vec(request).map_err(|e| CallError::Unreachable(e.to_string()))?;
        self.call(
            worker,
            BROWSER_SIGNAL,
            Some(body),
            RESET_TIMEOUT,
            SMALL_REPLY_MAX_BYTES,
        )
        .await
    }

    /// Gives `worker`'s live view its session's renewed TURN credential (BROW-9).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn browser_turn(
        &self,
        worker: WorkerId,
        order: &LiveViewOrder,
    ) -> Result<BrowserTurnReply, CallError> {
        let body = serde_json::to_vec(order).map_err(|e| CallError::Unreachable(e.to_string()))?;
        self.call(
            worker,
            BROWSER_TURN,
            Some(body),
            RESET_TIMEOUT,
            SMALL_REPLY_MAX_BYTES,
        )
        .await
    }

    /// Starts or ends a private interval on `worker`'s live view (BROW-12).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn browser_private(
        &self,
        worker: WorkerId,
        member: Option<String>,
    ) -> Result<BrowserPrivateReply, CallError> {
        let body = serde_json::to_vec(&BrowserPrivateRequest { member })
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        self.call(
            worker,
            BROWSER_PRIVATE,
            Some(body),
            RESET_TIMEOUT,
            SMALL_REPLY_MAX_BYTES,
        )
        .await
    }

    /// Closes `worker`'s session and resets it under `token` (BROW-13).
    ///
    /// # Errors
    /// See [`CallError`].
    pub async fn browser_close(
        &self,
        worker: WorkerId,
        token: OpToken,
    ) -> Result<BrowserCloseReply, CallError> {
        let body = serde_json::to_vec(&BrowserCloseRequest { token })
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        self.call(
            worker,
            BROWSER_CLOSE,
            Some(body),
            RESET_TIMEOUT,
            SMALL_REPLY_MAX_BYTES,
        )
        .await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        worker: WorkerId,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
        reply_max_bytes: u64,
    ) -> Result<T, CallError> {
        let deadline = Instant::now() + timeout;
        let mut response = self.send(worker, path, body, deadline).await?;
        let status = response.status().as_u16();
        let bytes = read_bounded(worker, &mut response, reply_max_bytes, deadline).await?;
        if status == 200 {
            return serde_json::from_slice(&bytes)
                .map_err(|e| CallError::ReplyInvalid(format!("worker {worker}: {e}")));
        }
        Err(refused(worker, status, &bytes))
    }

    /// Sends a request to `worker`'s `path` on a connection of its own, before `deadline`: the
    /// response, whatever its status. Until the connection is open nothing was sent
    /// ([`CallError::Unreachable`]); after, the request may have arrived ([`CallError::Lost`]).
    async fn send(
        &self,
        worker: WorkerId,
        path: &str,
        body: Option<Vec<u8>>,
        deadline: Instant,
    ) -> Result<hyper::Response<Incoming>, CallError> {
        let (host, port) = self
            .locator
            .address(worker)
            .ok_or_else(|| CallError::Unreachable(format!("worker {worker} has no address")))?;
        let unreachable = |why: String| CallError::Unreachable(format!("worker {worker}: {why}"));
        let lost = |why: String| CallError::Lost(format!("worker {worker}: {why}"));
        let connection = tokio::time::timeout_at(deadline, self.dial.dial(&host, port))
            .await
            .map_err(|_| unreachable(format!("connecting to {host}:{port} timed out")))?
            .map_err(|e| unreachable(format!("connecting to {host}:{port}: {e}")))?;
        let (mut sender, driver) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(connection))
                .await
                .map_err(|e| unreachable(format!("HTTP over {host}:{port}: {e}")))?;
        // Drives the connection until the response is read; it closes after this one request.
        tokio::spawn(driver);
        let request = self
            .request(worker, &host, port, path, body)
            .map_err(|e| unreachable(format!("the request: {e}")))?;
        tokio::time::timeout_at(deadline, sender.send_request(request))
            .await
            .map_err(|_| lost("no answer in time".to_owned()))?
            .map_err(|e| lost(e.to_string()))
    }

    /// The request for `worker`'s `path`: a POST of the JSON `body`, or a GET without one, with
    /// the credential and the worker's id, on a connection that closes after it.
    fn request(
        &self,
        worker: WorkerId,
        host: &str,
        port: u16,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<hyper::Request<Full<Bytes>>, http::Error> {
        let builder = hyper::Request::builder()
            .uri(path)
            .header(http::header::HOST, format!("{host}:{port}"))
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.credential),
            )
            .header(WORKER_ID_HEADER, worker.to_string())
            .header(http::header::CONNECTION, "close");
        match body {
            Some(body) => builder
                .method(http::Method::POST)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body))),
            None => builder
                .method(http::Method::GET)
                .body(Full::new(Bytes::new())),
        }
    }
}

/// The next chunk of `response`'s body before `deadline`, `None` at its end. A broken or late
/// body is [`CallError::Lost`]: the operation may have happened.
async fn next_chunk(
    worker: WorkerId,
    response: &mut hyper::Response<Incoming>,
    deadline: Instant,
) -> Result<Option<Bytes>, CallError> {
    let lost = |why: String| CallError::Lost(format!("worker {worker}: reply: {why}"));
    loop {
        let frame = tokio::time::timeout_at(deadline, response.body_mut().frame())
            .await
            .map_err(|_| lost("not read in time".to_owned()))?;
        match frame {
            None => return Ok(None),
            Some(Err(e)) => return Err(lost(e.to_string())),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
                // Trailers carry nothing the client reads.
            }
        }
    }
}

/// One frame of a streamed answer, `length` bytes on its line: the reply, returned; an output or
/// bound frame within its bounds, handed to `on_output` (an output's text counted off
/// `text_left`); or the refusal or the invalid frame as the error.
fn pass_frame(
    worker: WorkerId,
    frame: ExecuteFrame,
    length: u64,
    frame_max: u64,
    text_left: &mut u64,
    on_output: &mut impl FnMut(ExecuteFrame),
) -> Result<Option<Box<ExecuteReply>>, CallError> {
    let invalid = |why: String| CallError::ReplyInvalid(format!("worker {worker}: {why}"));
    match frame {
        ExecuteFrame::Reply(reply) => return Ok(Some(reply)),
        ExecuteFrame::Refused(body) => return Err(refusal(worker, body)),
        _ if length > frame_max => {
            return Err(invalid(format!("an output frame over {frame_max} bytes")));
        }
        ExecuteFrame::Output { ref text, .. } => {
            let size = text.len() as u64;
            if size == 0 || size > *text_left {
                return Err(invalid(
                    "an empty chunk, or more output than the bound keeps".to_owned(),
                ));
            }
            *text_left -= size;
            on_output(frame);
        }
        ExecuteFrame::Bound { .. } => on_output(frame),
    }
    Ok(None)
}

/// The whole body of `response`, at most `reply_max_bytes`, read before `deadline`.
async fn read_bounded(
    worker: WorkerId,
    response: &mut hyper::Response<Incoming>,
    reply_max_bytes: u64,
    deadline: Instant,
) -> Result<Vec<u8>, CallError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = next_chunk(worker, response, deadline).await? {
        if (bytes.len() + chunk.len()) as u64 > reply_max_bytes {
            return Err(CallError::ReplyInvalid(format!(
                "worker {worker}: reply over {reply_max_bytes} bytes"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// A refusal's body, read from a reply with status `status`.
fn refused(worker: WorkerId, status: u16, bytes: &[u8]) -> CallError {
    match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(body) => refusal(worker, body),
        Err(e) => CallError::ReplyInvalid(format!("worker {worker}: status {status}: {e}")),
    }
}

/// A worker's typed refusal; one naming another worker means nothing ran.
fn refusal(worker: WorkerId, body: ErrorBody) -> CallError {
    if body.error == ErrorCode::WrongWorker {
        // Another worker holds the address now: nothing ran.
        return CallError::Unreachable(format!(
            "worker {worker}: its address now answers for another worker"
        ));
    }
    CallError::Refused(body)
}

/// The worker client's deliberate defects, for the shell simulation to prove it catches them
/// (issue 28). Compiled only with the `sim-mutations` feature, which no shipped build enables.
#[cfg(feature = "sim-mutations")]
pub mod mutation {
    use std::sync::atomic::{AtomicBool, Ordering};

    static RETRY_LOST_EXECUTES: AtomicBool = AtomicBool::new(false);

    /// Turns on (or off) the defect: an execute whose answer was lost is sent once more.
    pub fn retry_lost_executes(on: bool) {
        RETRY_LOST_EXECUTES.store(on, Ordering::SeqCst);
    }

    pub(crate) fn retries_lost_executes() -> bool {
        RETRY_LOST_EXECUTES.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    const WORKER: WorkerId = WorkerId { epoch: 7, seq: 1 };

    /// How the simulated worker behind [`Wire`] treats the one request it is sent.
    #[derive(Clone, Copy)]
    enum Peer {
        /// Nobody listens: the dial fails.
        Refuses,
        /// Reads the request, then answers `status` with `body`.
        Answers(u16, &'static str),
        /// Reads the request and hangs up without a word.
        HangsUp,
        /// Reads the request and never answers.
        Silent,
    }

    /// A [`Dial`] with no network at all: each dial is an in-memory pipe to a task playing the
    /// worker. It records every host and port dialled and every request head it read.
    struct Wire {
        peer: Peer,
        dialled: Mutex<Vec<(String, u16)>>,
        heads: Arc<Mutex<Vec<String>>>,
    }

    impl Wire {
        fn new(peer: Peer) -> Arc<Self> {
            Arc::new(Self {
                peer,
                dialled: Mutex::new(Vec::new()),
                heads: Arc::default(),
            })
        }
    }

    impl Dial for Wire {
        fn dial<'a>(&'a self, host: &'a str, port: u16) -> Dialing<'a> {
            self.dialled.lock().unwrap().push((host.to_owned(), port));
            let (peer, heads) = (self.peer, self.heads.clone());
            Box::pin(async move {
                if matches!(peer, Peer::Refuses) {
                    return Err(std::io::ErrorKind::ConnectionRefused.into());
                }
                let (ours, theirs) = tokio::io::duplex(1 << 16);
                tokio::spawn(play(peer, theirs, heads));
                Ok(Box::new(ours) as Box<dyn Connection>)
            })
        }
    }

    /// The worker's side of one connection.
    async fn play(peer: Peer, mut stream: DuplexStream, heads: Arc<Mutex<Vec<String>>>) {
        let mut read = Vec::new();
        let mut buffer = [0_u8; 4096];
        while !read.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&buffer[..n]),
            }
        }
        heads
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(&read).into_owned());
        match peer {
            Peer::Answers(status, body) => {
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\ncontent-type: application/json\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
            Peer::HangsUp | Peer::Refuses => {}
            Peer::Silent => std::future::pending::<()>().await,
        }
    }

    fn client(wire: &Arc<Wire>) -> WorkerClient {
        WorkerClient::with_dial(
            Locator::Template("http://{id}.workers.sim:8091".to_owned()),
            "s3cret".to_owned(),
            wire.clone(),
        )
    }

    #[tokio::test]
    async fn the_client_speaks_http_over_whatever_its_dial_returns() {
        let wire = Wire::new(Peer::Answers(
            200,
            r#"{"status":"ok","posture":"full","busy":false,"prepared":true,"prepared_languages":[],"body_max_bytes":9}"#,
        ));
        let health = client(&wire).health(WORKER).await.expect("answered");
        assert!(health.prepared);
        assert_eq!(health.body_max_bytes, 9);
        assert_eq!(
            *wire.dialled.lock().unwrap(),
            [("w-7-1.workers.sim".to_owned(), 8091)]
        );
        let heads = wire.heads.lock().unwrap();
        let head = heads[0].to_ascii_lowercase();
        assert!(head.starts_with("get /health http/1.1\r\n"), "{head}");
        assert!(head.contains("authorization: bearer s3cret\r\n"), "{head}");
        assert!(
            head.contains(&format!("{WORKER_ID_HEADER}: w-7-1\r\n")),
            "{head}"
        );
        assert!(head.contains("connection: close\r\n"), "{head}");
    }

    #[tokio::test]
    async fn a_dial_that_fails_is_unreachable_and_one_that_hangs_up_after_the_request_is_lost() {
        let refused = client(&Wire::new(Peer::Refuses)).health(WORKER).await;
        assert!(
            matches!(refused, Err(CallError::Unreachable(_))),
            "{refused:?}"
        );
        let hung_up = client(&Wire::new(Peer::HangsUp))
            .reset(WORKER, OpToken(3))
            .await;
        assert!(matches!(hung_up, Err(CallError::Lost(_))), "{hung_up:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_never_answers_is_lost_at_the_calls_deadline() {
        let wire = Wire::new(Peer::Silent);
        let started = Instant::now();
        let silent = client(&wire).health(WORKER).await;
        assert!(matches!(silent, Err(CallError::Lost(_))), "{silent:?}");
        // Paused time moves only when every task waits: the call ended at its deadline exactly.
        assert_eq!(started.elapsed(), HEALTH_TIMEOUT);
        assert_eq!(wire.heads.lock().unwrap().len(), 1, "the request arrived");
    }

    #[tokio::test]
    async fn a_refusal_is_the_workers_typed_error_and_a_reply_over_its_bound_is_invalid() {
        let refusal = client(&Wire::new(Peer::Answers(409, r#"{"error":"busy"}"#)))
            .health(WORKER)
            .await;
        assert!(matches!(refusal, Err(CallError::Refused(_))), "{refusal:?}");
        let big: &'static str = Box::leak(
            "x".repeat(SMALL_REPLY_MAX_BYTES as usize + 1)
                .into_boxed_str(),
        );
        let over = client(&Wire::new(Peer::Answers(200, big)))
            .health(WORKER)
            .await;
        assert!(matches!(over, Err(CallError::ReplyInvalid(_))), "{over:?}");
    }
}
