//! A run's progress as a server-sent event stream (WS-7): what `POST /v1/run_code` sends, with
//! `Accept: text/event-stream`, beside the plain JSON answer. The event names are contracts.
//!
//! `run.queued` once the request is admitted (it waits for a worker), `run.running` once its code
//! is dispatched, then exactly one `run.result` whose data is `{status, body}`: the HTTP status
//! and the JSON answer the plain request would have had. The first two list the run's declared
//! outputs as transient progress, never downloadable: a declaration grants nothing, and only the
//! answer's validated references replace them.

use serde::Serialize;

/// The request was admitted and waits for a worker.
pub const QUEUED: &str = "run.queued";
/// The code was dispatched to a leased worker.
pub const RUNNING: &str = "run.running";
/// The run's answer: `{status, body}`; the last event.
pub const RESULT: &str = "run.result";

/// The state of a declared output while the run runs.
pub const DECLARED_STATE: &str = "in_progress";

/// A declared output as progress: its name, that it is in progress, and that it cannot be
/// downloaded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pending {
    /// The declared relative path.
    pub path: String,
    /// [`DECLARED_STATE`].
    pub state: &'static str,
    /// Always false: progress is not an attachment.
    pub downloadable: bool,
}

/// The declared outputs as progress.
#[must_use]
pub fn pending(declared: &[String]) -> Vec<Pending> {
    declared
        .iter()
        .map(|path| Pending {
            path: path.clone(),
            state: DECLARED_STATE,
            downloadable: false,
        })
        .collect()
}
