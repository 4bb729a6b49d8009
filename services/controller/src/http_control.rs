//! Resets through a worker's control API (`POST /v1/reset` where the [`Locator`] finds it, with
//! the credential only the controller and the API hold). A worker that does not answer, or answers with anything but
//! evidence, has proven nothing: `None`, and the pool discards it when the reset times out.

use std::time::Duration;

use corral_core::ids::{OpToken, WorkerId};
use corral_core::reset::ResetEvidence;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::WorkerControl;
use crate::locate::Locator;

/// The longest a reset may take before it counts as unanswered.
const RESET_TIMEOUT: Duration = Duration::from_secs(20);
/// The largest reply read.
const REPLY_MAX_BYTES: u64 = 64 * 1024;

/// The control client for workers found through a [`Locator`].
pub struct HttpControl {
    locator: Locator,
    credential: String,
}

impl HttpControl {
    /// A client for the workers `locator` finds, presenting `credential`.
    pub fn new(locator: Locator, credential: String) -> Self {
        Self {
            locator,
            credential,
        }
    }

    async fn post(
        &self,
        worker: WorkerId,
        (host, port): (String, u16),
        path: &str,
        body: &str,
    ) -> Option<(u16, Vec<u8>)> {
        let mut stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .ok()?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {}\r\nX-Corral-Worker-Id: {worker}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.credential,
            body.len()
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut reply = Vec::new();
        stream
            .take(REPLY_MAX_BYTES)
            .read_to_end(&mut reply)
            .await
            .ok()?;
        let head_end = reply.windows(4).position(|w| w == b"\r\n\r\n")?;
        let status_line = std::str::from_utf8(&reply[..head_end])
            .ok()?
            .lines()
            .next()?
            .to_string();
        let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, reply[head_end + 4..].to_vec()))
    }
}

/// The evidence in a worker's `POST /v1/reset` reply body; `None` when it holds none (unproven).
/// The one reading of a reset reply, for the controller and the API alike.
pub fn evidence_from_reply(reply: &[u8]) -> Option<ResetEvidence> {
    let json: serde_json::Value = serde_json::from_slice(reply).ok()?;
    let evidence = &json["reset_evidence"];
    Some(ResetEvidence {
        // The token the worker says it reset under; corral-core compares it with the order's.
        token: OpToken(evidence["token"].as_u64()?),
        processes_remaining: count(&evidence["processes_remaining"]),
        workspace_entries: count(&evidence["workspace_entries"]),
        scratch_entries: count(&evidence["scratch_entries"]),
        mounts_remaining: count(&evidence["mounts_remaining"]),
    })
}

fn count(value: &serde_json::Value) -> Option<u32> {
    value.as_u64().and_then(|n| u32::try_from(n).ok())
}

impl WorkerControl for HttpControl {
    async fn reset(&self, worker: WorkerId, token: OpToken) -> Option<ResetEvidence> {
        let address = self.locator.address(worker)?;
        let body = format!("{{\"token\":{}}}", token.0);
        let (status, reply) = tokio::time::timeout(
            RESET_TIMEOUT,
            self.post(worker, address, "/v1/reset", &body),
        )
        .await
        .ok()??;
        if status != 200 {
            return None;
        }
        evidence_from_reply(&reply)
    }
}
