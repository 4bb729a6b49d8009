//! The one client of the worker's control routes, used by the API (execute, and the reset after
//! a lease) and the controller (the resets the pool orders).
//!
//! Every request opens a fresh connection: a worker that died while idle then refuses the
//! connection ([`CallError::Unreachable`]: the request never arrived, the code did not run),
//! where a pooled connection would fail mid-send and leave it unknowable whether it arrived.
//! Every reply is read up to the route's bound and decoded as the route's type; anything else is
//! [`CallError::ReplyInvalid`].

use std::time::Duration;

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

/// The client.
#[derive(Clone)]
pub struct WorkerClient {
    locator: Locator,
    credential: String,
    http: reqwest::Client,
}

impl WorkerClient {
    /// A client presenting `credential` to workers found through `locator`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(locator: Locator, credential: String) -> Result<Self, String> {
        crate::ensure_crypto_provider();
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            locator,
            credential,
            http,
        })
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
        self.call(
            worker,
            EXECUTE,
            Some(body),
            timeout,
            execute_reply_max_bytes(bounds),
        )
        .await
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
        let mut response = self.send(worker, EXECUTE, Some(body), timeout).await?;
        let status = response.status().as_u16();
        if status != 200 {
            let bytes = read_bounded(worker, &mut response, SMALL_REPLY_MAX_BYTES).await?;
            return Err(refused(worker, status, &bytes));
        }
        let invalid = |why: String| CallError::ReplyInvalid(format!("worker {worker}: {why}"));
        let frame_max = output_frame_max_bytes();
        let reply_max = execute_reply_max_bytes(bounds);
        let mut text_left = streamed_output_max_bytes(bounds);
        let mut line = Vec::new();
        loop {
            let chunk = response
                .chunk()
                .await
                .map_err(|e| CallError::Lost(format!("worker {worker}: reply: {e}")))?;
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
                match frame {
                    ExecuteFrame::Reply(reply) => {
                        // The reply is the last line: nothing may follow it.
                        return if rest.is_empty() && response.chunk().await.ok().flatten().is_none()
                        {
                            Ok(*reply)
                        } else {
                            Err(invalid("a frame after the reply".to_owned()))
                        };
                    }
                    ExecuteFrame::Refused(body) => return Err(refusal(worker, body)),
                    _ if length > frame_max => {
                        return Err(invalid(format!("an output frame over {frame_max} bytes")));
                    }
                    ExecuteFrame::Output { ref text, .. } => {
                        let size = text.len() as u64;
                        if size == 0 || size > text_left {
                            return Err(invalid(
                                "an empty chunk, or more output than the bound keeps".to_owned(),
                            ));
                        }
                        text_left -= size;
                        on_output(frame);
                    }
                    ExecuteFrame::Bound { .. } => on_output(frame),
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
        let mut response = self.send(worker, path, body, timeout).await?;
        let status = response.status().as_u16();
        let bytes = read_bounded(worker, &mut response, reply_max_bytes).await?;
        if status == 200 {
            return serde_json::from_slice(&bytes)
                .map_err(|e| CallError::ReplyInvalid(format!("worker {worker}: {e}")));
        }
        Err(refused(worker, status, &bytes))
    }

    /// Sends a request to `worker`'s `path`: the response, whatever its status.
    async fn send(
        &self,
        worker: WorkerId,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<reqwest::Response, CallError> {
        let base = self
            .locator
            .base_url(worker)
            .ok_or_else(|| CallError::Unreachable(format!("worker {worker} has no address")))?;
        let url = format!("{base}{path}");
        let request = match body {
            Some(body) => self
                .http
                .post(url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body),
            None => self.http.get(url),
        };
        request
            .bearer_auth(&self.credential)
            .header(WORKER_ID_HEADER, worker.to_string())
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| {
                let message = format!("worker {worker}: {e}");
                if e.is_connect() {
                    CallError::Unreachable(message)
                } else {
                    CallError::Lost(message)
                }
            })
    }
}

/// The whole body of `response`, at most `reply_max_bytes`.
async fn read_bounded(
    worker: WorkerId,
    response: &mut reqwest::Response,
    reply_max_bytes: u64,
) -> Result<Vec<u8>, CallError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| CallError::Lost(format!("worker {worker}: reply: {e}")))?
    {
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
