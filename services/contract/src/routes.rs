//! The worker's control routes and headers (BROW-7: port 8091, authenticated).
//!
//! Every request carries `Authorization: Bearer <credential>` (see [`crate::credential`]). Every
//! request to a route under `/v1/` names the worker it is meant for in [`WORKER_ID_HEADER`]: an
//! address outlives its worker, and a worker started with `CORRAL_WORKER_ID` refuses a request
//! naming another (421 `wrong_worker`) before anything runs.

/// `GET`: the worker's posture and whether a prepared jail waits ([`crate::HealthReply`]).
pub const HEALTH: &str = "/health";
/// `POST` an [`crate::ExecuteRequest`]: run code; answered with an [`crate::ExecuteReply`].
pub const EXECUTE: &str = "/v1/execute";
/// The media type of a streamed execute answer: one [`crate::messages::ExecuteFrame`] per line.
pub const NDJSON: &str = "application/x-ndjson";
/// `POST` a [`crate::messages::ValidateRequest`]: validate an authored Pi package (PI-1);
/// answered with a [`crate::messages::ValidateReply`] before the validation's own reset.
pub const VALIDATE_PACKAGE: &str = "/v1/validate_package";
/// `POST` a [`crate::ResetRequest`]: kill, wipe, measure; answered with a [`crate::ResetReply`].
pub const RESET: &str = "/v1/reset";

/// `POST` a [`crate::messages::BrowserOpenRequest`]: start a browser session's runtime in a jail
/// (BROW-1, BROW-13); answered with a [`crate::messages::BrowserOpenReply`].
pub const BROWSER_OPEN: &str = "/v1/browser/open";
/// `POST` a `corral_core::browser::Action`: one action on the open session (BROW-10); answered
/// with a [`crate::messages::BrowserActReply`].
pub const BROWSER_ACT: &str = "/v1/browser/act";
/// `POST` a [`crate::messages::BrowserCloseRequest`]: stop every process of the session, delete
/// its profile, reset (BROW-13); answered with a [`crate::messages::BrowserCloseReply`].
pub const BROWSER_CLOSE: &str = "/v1/browser/close";
/// `POST` a [`crate::messages::BrowserSignalRequest`]: a viewer's SDP offer for the session's
/// live view (BROW-2), relayed by the API after conversation authorization; answered with a
/// [`crate::messages::BrowserSignalReply`].
pub const BROWSER_SIGNAL: &str = "/v1/browser/signal";
/// `POST` a [`crate::messages::BrowserPrivateRequest`]: start or end a private interval on the
/// live view (BROW-12): every other member's peer is removed; answered with a
/// [`crate::messages::BrowserPrivateReply`].
pub const BROWSER_PRIVATE: &str = "/v1/browser/private";
/// `POST` a [`crate::messages::LiveViewOrder`]: the session's renewed TURN credential (BROW-9);
/// the adapter allocates a new relay with it for the viewers that connect from now on, and keeps
/// the old one while a viewer still uses it; answered with a
/// [`crate::messages::BrowserTurnReply`].
pub const BROWSER_TURN: &str = "/v1/browser/turn";

/// The API's route a worker's supervisor posts a run's tool call to (KER-5): a
/// [`crate::messages::ToolCall`] with the run's token as the bearer, answered with the platform's
/// bounded payload. A worker-to-API route: it is not under a worker's `/v1/`.
pub const TOOL_CALL: &str = "/v1/tools/call";

/// The header naming the worker a request is meant for (its `WorkerId`'s text).
pub const WORKER_ID_HEADER: &str = "x-corral-worker-id";

/// Whether a request to `path` must name its worker in [`WORKER_ID_HEADER`].
#[must_use]
pub fn names_its_worker(path: &str) -> bool {
    path.starts_with("/v1/")
}

/// Whether a request to `path` naming `named` in [`WORKER_ID_HEADER`] may be served by the worker
/// `this`: a route that names its worker must name this one (an address outlives its worker, and a
/// request delayed on the way may reach the next one there).
#[must_use]
pub fn meant_for(path: &str, named: Option<&[u8]>, this: &str) -> bool {
    !names_its_worker(path) || named == Some(this.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_naming_another_worker_or_none_is_not_for_this_one() {
        assert!(meant_for(EXECUTE, Some(b"w-1-2"), "w-1-2"));
        assert!(!meant_for(EXECUTE, Some(b"w-1-3"), "w-1-2"));
        assert!(!meant_for(RESET, None, "w-1-2"));
        assert!(!meant_for(RESET, Some(b"w-1-22"), "w-1-2"));
        assert!(meant_for(HEALTH, None, "w-1-2"));
    }
}
