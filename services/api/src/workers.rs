//! Talking to a leased worker's control API: execute, and the reset after the lease. The API
//! holds the workers' credential (as the controller does); workers hold nothing of the API's.

use std::time::Duration;

use corral_controller::http_control::evidence_from_reply;
pub use corral_controller::locate::Locator;
use corral_core::ids::{OpToken, WorkerId};
use corral_core::reset::ResetEvidence;
use serde_json::Value;

/// How long a reset may take before it counts as unanswered (unproven).
const RESET_TIMEOUT: Duration = Duration::from_secs(20);
/// The header naming the worker a request is meant for; a worker refuses (421) one naming
/// another, so a request to a dead worker's address never runs on a newcomer there.
const WORKER_ID_HEADER: &str = "x-corral-worker-id";

/// Time an execute may take beyond its wall bound: staging, packing, the reply.
const EXECUTE_MARGIN: Duration = Duration::from_secs(30);

/// Why an execute produced no result. Codes are stable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecuteError {
    /// The worker could not be found or refused the connection: the request never reached it, so
    /// the code did not run and the run may be tried on another worker.
    Unreachable(String),
    /// The worker's connection broke or timed out after the request was sent: the code may have
    /// run; nobody can vouch for the worker.
    WorkerLost(String),
    /// The worker refused the request: its status, code and details.
    Refused {
        /// HTTP status.
        status: u16,
        /// The worker's error body.
        body: Value,
    },
}

/// The client.
#[derive(Clone)]
pub struct Workers {
    locator: Locator,
    credential: String,
    http: reqwest::Client,
}

impl Workers {
    /// A client presenting `credential` to workers found through `locator`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(locator: Locator, credential: String) -> Result<Self, String> {
        crate::ensure_crypto_provider();
        let http = reqwest::Client::builder()
            .no_proxy()
            // A fresh connection per request: a worker that died while idle then refuses the
            // connection (the code never ran, and the run goes to another worker), where a pooled
            // connection would fail mid-send and leave it unknowable whether the request arrived.
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            locator,
            credential,
            http,
        })
    }

    /// Runs `request` (the worker's execute body) on `worker`, waiting at most `wall` plus a margin.
    pub async fn execute(
        &self,
        worker: WorkerId,
        request: &Value,
        wall: Duration,
    ) -> Result<Value, ExecuteError> {
        let base = self
            .locator
            .base_url(worker)
            .ok_or_else(|| ExecuteError::Unreachable(format!("worker {worker} has no address")))?;
        let sent = self
            .http
            .post(format!("{base}/v1/execute"))
            .bearer_auth(&self.credential)
            .header(WORKER_ID_HEADER, worker.to_string())
            .timeout(wall + EXECUTE_MARGIN)
            .json(request)
            .send()
            .await
            .map_err(|e| {
                let message = format!("worker {worker}: {e}");
                if e.is_connect() {
                    ExecuteError::Unreachable(message)
                } else {
                    ExecuteError::WorkerLost(message)
                }
            })?;
        let status = sent.status().as_u16();
        if status == 421 {
            // Another worker holds the address now: nothing ran.
            return Err(ExecuteError::Unreachable(format!(
                "worker {worker}: its address now answers for another worker"
            )));
        }
        let body: Value = sent
            .json()
            .await
            .map_err(|e| ExecuteError::WorkerLost(format!("worker {worker}: reply: {e}")))?;
        if status == 200 {
            Ok(body)
        } else {
            Err(ExecuteError::Refused { status, body })
        }
    }

    /// Resets `worker` under `token`; `None` when it did not answer with evidence (unproven).
    pub async fn reset(&self, worker: WorkerId, token: OpToken) -> Option<ResetEvidence> {
        let base = self.locator.base_url(worker)?;
        let reply = self
            .http
            .post(format!("{base}/v1/reset"))
            .bearer_auth(&self.credential)
            .header(WORKER_ID_HEADER, worker.to_string())
            .timeout(RESET_TIMEOUT)
            .json(&serde_json::json!({ "token": token.0 }))
            .send()
            .await
            .ok()?;
        if !reply.status().is_success() {
            return None;
        }
        evidence_from_reply(&reply.bytes().await.ok()?)
    }
}
