//! What the chaos run's clients record: operations, pool observations and faults, each stamped
//! with the harness's monotonic clock (nanoseconds since the run started).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Nanoseconds on the harness's monotonic clock. Code inside a jail reads the same clock
/// (`CLOCK_MONOTONIC`; the jail makes no time namespace), offset by [`History::clock_origin_ns`].
pub type Nanos = u64;

/// Which state an operation reads and extends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An ephemeral run: it prints the tokens file of its workspace, then appends its own token.
    Workspace,
    /// A persistent cell: it prints the list kept in its kernel, then appends its own token.
    Kernel,
    /// A browser session: opened, driven by actions that each push a token onto a list its page
    /// keeps and read the list back, and closed.
    Browser,
}

/// How an operation reached its workspace or kernel.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// `POST /v1/run_code`: code on a leased worker.
    #[default]
    Run,
    /// A Hashline edit (`GET /v1/read_workspace?view=hashline`, then `POST /v1/edit_workspace`
    /// appending after the last line shown): no worker; the API saves the workspace itself.
    Edit,
    /// `POST /v1/run_code` with `packages`: a package the stack does not bake, installed through
    /// the API's broker in the run's jail before the code, which imports it and prints its mark.
    Install,
    /// `POST /v1/browser_sessions`, its actions and its close: a session held on a leased worker.
    Session,
}

/// One client operation and its answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Unique in the history.
    pub id: u64,
    /// Workspace or kernel.
    pub kind: Kind,
    /// The actor.
    pub actor: String,
    /// The conversation (with the actor, the workspace).
    pub conversation: String,
    /// The member who asked.
    pub member: String,
    /// The token this operation appends; unique in the history.
    pub token: String,
    /// A run or a Hashline edit.
    #[serde(default)]
    pub via: Via,
    /// The API replica it was sent to (0-based).
    #[serde(default)]
    pub replica: usize,
    /// When the request was sent.
    pub start_ns: Nanos,
    /// When the answer (or the failure to get one) arrived.
    pub end_ns: Nanos,
    /// What the client was told.
    pub answer: Answer,
    /// Where and when its code ran, when an answer other than `succeeded` still carried the line
    /// the code printed (a succeeded answer carries it itself).
    #[serde(default)]
    pub ran: Option<Ran>,
    /// An install's code: the mark it printed from the installed package.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mark: Option<String>,
    /// A browser session's actions and close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Session>,
    /// What a run's fetch through the egress proxy got, as its code printed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched: Option<Fetched>,
}

/// A fetch of `http://<egress::NAME>/<token>` through the egress proxy, as the code saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fetched {
    /// The HTTP status; 0 when no answer came (the code's own timeout, a refused connection).
    pub status: u16,
    /// The body of a 200; the proxy's `X-Corral-Egress-Reason` of a refusal; the exception's
    /// name when no answer came.
    pub said: String,
}

/// What happened to a browser session after it opened. Its operation's answer is `succeeded`
/// when its own close answered `closed`; its "execution", the time it provably held its worker,
/// runs from the open's answer to the close's sending when the worker confirmed the close, else
/// to the last action answered (the operation's `ran` when the close did not answer `closed`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The session's id.
    pub id: String,
    /// The worker the open's answer named.
    pub worker: String,
    /// The actions, in order.
    pub acts: Vec<Act>,
    /// When the close was sent, if it was.
    pub close_sent_ns: Option<Nanos>,
    /// What the close answered: `Some(confirmed)` when it closed the session.
    pub confirmed: Option<bool>,
}

/// One action on a session: push `token` onto the page's list and read the list back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Act {
    /// The token pushed; unique in the history.
    pub token: String,
    /// When it was sent.
    pub sent_ns: Nanos,
    /// When it was answered (or given up).
    pub answered_ns: Nanos,
    /// The list the page held after the push, when the action was answered with it.
    pub seen: Option<Vec<String>>,
    /// The code of a refusal, or why nothing came back.
    pub refused: Option<String>,
}

/// Where and when an operation's code ran, as it printed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ran {
    /// The worker.
    pub worker: String,
    /// When the code started, on the harness's clock.
    pub start_ns: Nanos,
    /// When it ended.
    pub end_ns: Nanos,
    /// What it saw.
    pub seen: Vec<String>,
}

/// What a client was told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// `outcome: succeeded`: the code ran to its end and the run's state was kept (an edit:
    /// `outcome: applied`, its workspace saved).
    Succeeded {
        /// The worker that ran it (an edit: empty, it ran on none).
        worker: String,
        /// The workspace generation the run saved (none when nothing changed).
        generation: Option<u64>,
        /// The tokens the code read before appending its own, in order.
        seen: Vec<String>,
        /// When the code started and ended, on the harness's clock (an edit: its read was sent
        /// and its edit answered).
        exec_start_ns: Nanos,
        /// See `exec_start_ns`.
        exec_end_ns: Nanos,
    },
    /// A refusal before anything ran: nothing of the operation may ever be seen.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The stable code the answer carried, if any.
        code: Option<String>,
    },
    /// An answer that is neither: the code failed, timed out or its worker was lost, so the
    /// operation may or may not have taken effect.
    Failed {
        /// The HTTP status.
        status: u16,
        /// The run's outcome, when the answer had one.
        outcome: Option<String>,
        /// The stable code the answer carried, if any.
        code: Option<String>,
    },
    /// No answer: the connection failed or the client gave up. It may or may not have taken
    /// effect.
    NoAnswer {
        /// Why.
        why: String,
    },
}

/// The pool as the harness read it from Valkey, at some instant between `requested_ns` and
/// `at_ns`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSample {
    /// When the read was sent.
    #[serde(default)]
    pub requested_ns: Nanos,
    /// When its answer arrived.
    pub at_ns: Nanos,
    /// Workers that count against the ceiling (every worker the pool holds, in any state).
    pub allocated: u32,
    /// Workers warm and free.
    pub warm: u32,
    /// Workers quarantined (awaiting proof of cleanliness or deletion).
    pub quarantined: u32,
    /// Each worker's state: `leased:<member>`, `warm`, `creating`, `resetting`, `retiring` or
    /// `quarantined`.
    #[serde(default)]
    pub workers: BTreeMap<String, String>,
    /// The epoch of the pool document read (`None` in histories recorded before it was kept).
    #[serde(default)]
    pub epoch: Option<u64>,
}

/// A fault the harness injected, and when it was over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// The fault's kind (`kill_api`, `pause_worker`, `valkey_restart_empty`, ...).
    pub kind: String,
    /// What it hit.
    pub target: String,
    /// When it began.
    pub at_ns: Nanos,
    /// When it was healed (the process restarted, resumed, ...).
    pub healed_ns: Nanos,
}

/// A whole run's record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// The seed the schedule came from.
    pub seed: u64,
    /// `CLOCK_MONOTONIC` in nanoseconds when the harness's clock read zero.
    pub clock_origin_ns: u64,
    /// The pool's ceiling (`SANDBOX_POOL_CEILING`).
    pub ceiling: u32,
    /// The pool's warm target (`SANDBOX_WARM_POOL_MIN`).
    pub warm_target: u32,
    /// Most runs one member may have at once (`SANDBOX_MAX_CONCURRENT_PER_MEMBER`).
    pub member_limit: u32,
    /// Operations, in the order they ended.
    pub ops: Vec<Op>,
    /// Pool observations, in time order.
    pub pool: Vec<PoolSample>,
    /// Faults, in the order they began.
    pub faults: Vec<Fault>,
    /// When the last fault was healed and the load stopped: from here the pool must return to
    /// its warm target with nothing quarantined.
    pub quiet_ns: Nanos,
    /// When the harness stopped watching.
    pub end_ns: Nanos,
    /// The run's mark, drawn from its seed: what the package installs print (served by the
    /// harness's registry only), and what the egress target answers every fetch with.
    #[serde(default)]
    pub mark: String,
    /// Every connection the egress canary was offered (an address the policy never admits).
    #[serde(default)]
    pub canary_hits: Vec<String>,
}
