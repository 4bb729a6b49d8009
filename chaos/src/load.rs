//! The load: clients that each own one workspace or one persistent kernel and extend it one
//! operation at a time, recording every operation and its answer in the history.
//!
//! An ephemeral run prints the tokens file of its workspace and appends its own token; a
//! persistent cell prints the list its kernel keeps and appends its own token. Both print when
//! their code started and ended on the host's monotonic clock, which the jail shares, so that the
//! checker can tell which operations ran on one worker at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use corral_api::client::Client;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::history::{Act, Answer, Fetched, Kind, Op, Ran, Session, Via};
use crate::rng::Rng;

/// How long a client waits for one answer before recording none.
pub const ANSWER_WAIT: Duration = Duration::from_secs(90);

/// A long operation's least pause inside its code: most of the lease's time to live.
const LONG_MS: u64 = 3_000;

/// The line the code prints: `CHAOS <start> <end> <token> <token> ...`.
const LINE: &str = "CHAOS";

/// The workspace file every run and edit of a workspace appends its token to.
const TOKENS_FILE: &str = "tokens.txt";

/// One in this many workspace operations is a Hashline edit (once the file exists).
const EDIT_ONE_IN: u64 = 4;

/// One in this many of the other workspace operations installs [`PACKAGE`] first.
const INSTALL_ONE_IN: u64 = 6;

/// The package an install asks for: not in the baked stack, served by the harness's registry only
/// (through the API's broker), with a module that holds the run's mark.
pub const PACKAGE: &str = "corral-chaos-mark";

/// The module [`PACKAGE`] installs; its `MARK` is the run's.
pub const PACKAGE_MODULE: &str = "corral_chaos_mark";

/// The line an install's code prints first: `INSTALLED <mark>` (not a prefix of [`LINE`]'s).
const MARK_LINE: &str = "INSTALLED";

/// One in this many runs of a workspace also fetches `http://<egress::NAME>/<token>` through the
/// egress proxy, after its line.
const FETCH_ONE_IN: u64 = 3;

/// The line a fetch prints: `FETCHED <status> <what it said>`.
const FETCH_LINE: &str = "FETCHED";

/// How long the code's fetch waits for an answer, in seconds.
const FETCH_TIMEOUT_SECONDS: u64 = 15;

/// How many actions a browser session gets, at most, before its close.
const ACTS_MAX: u64 = 5;

/// The harness's clock: nanoseconds since `origin`, and `CLOCK_MONOTONIC` at `origin`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    /// `CLOCK_MONOTONIC` in nanoseconds at `origin`.
    pub origin_ns: u64,
}

impl Clock {
    /// Starts the clock now.
    #[must_use]
    pub fn start() -> Self {
        let origin = Instant::now();
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| {
                u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
                    + u64::try_from(t.tv_nsec()).unwrap_or(0)
            })
            .unwrap_or(0);
        Self {
            origin,
            origin_ns: now,
        }
    }

    /// Nanoseconds since the clock started.
    #[must_use]
    pub fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A `CLOCK_MONOTONIC` reading on this clock.
    #[must_use]
    pub fn from_monotonic(&self, ns: u64) -> u64 {
        ns.saturating_sub(self.origin_ns)
    }
}

/// The code of one operation appending `token`, after a pause of `pause_ms` inside the code (the
/// window a fault can land in). An install's code first imports [`PACKAGE_MODULE`] and prints
/// its mark.
#[must_use]
pub fn code(kind: Kind, via: Via, token: &str, pause_ms: u64, fetch: bool) -> String {
    let import = if via == Via::Install {
        format!("import {PACKAGE_MODULE}\nprint('{MARK_LINE}', {PACKAGE_MODULE}.MARK)\n")
    } else {
        String::new()
    };
    let read = match kind {
        Kind::Workspace => format!(
            "try:\n    seen = open('{TOKENS_FILE}').read().split()\nexcept FileNotFoundError:\n    seen = []\n\
             time.sleep({pause})\nopen('{TOKENS_FILE}', 'a').write('{token}\\n')\n",
            pause = pause_ms as f64 / 1000.0
        ),
        Kind::Kernel => format!(
            "try:\n    chaos_list\nexcept NameError:\n    chaos_list = []\nseen = list(chaos_list)\n\
             time.sleep({pause})\nchaos_list.append('{token}')\n",
            pause = pause_ms as f64 / 1000.0
        ),
        // A session runs no code.
        Kind::Browser => String::new(),
    };
    let fetch = if fetch {
        format!(
            "import urllib.request, urllib.error\ntry:\n    \
             answer = urllib.request.urlopen('http://{name}/{token}', timeout={FETCH_TIMEOUT_SECONDS})\n    \
             print('{FETCH_LINE}', answer.status, answer.read().decode())\n\
             except urllib.error.HTTPError as refused:\n    \
             print('{FETCH_LINE}', refused.code, refused.headers.get('{reason}'))\n\
             except Exception as failed:\n    print('{FETCH_LINE}', 0, type(failed).__name__)\n",
            name = crate::egress::NAME,
            reason = corral_core::egress::reason::REASON_HEADER,
        )
    } else {
        String::new()
    };
    format!(
        "{import}import time\nstarted = time.monotonic_ns()\n{read}print('{LINE}', started, time.monotonic_ns(), *seen)\n{fetch}"
    )
}

/// What a run's fetch printed, from an answer of any outcome.
#[must_use]
pub fn printed_fetch(body: &Value) -> Option<Fetched> {
    let stdout = body["model"]["stdout"]["text"].as_str()?;
    let rest = stdout.lines().find_map(|l| l.strip_prefix(FETCH_LINE))?;
    let (status, said) = rest.trim().split_once(' ').unwrap_or((rest.trim(), ""));
    Some(Fetched {
        status: status.parse().ok()?,
        said: said.to_owned(),
    })
}

/// The mark an install's code printed, from an answer of any outcome.
#[must_use]
pub fn printed_mark(body: &Value) -> Option<String> {
    let stdout = body["model"]["stdout"]["text"].as_str()?;
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(MARK_LINE))
        .map(|mark| mark.trim().to_owned())
}

/// The line the code printed, read from an answer of any outcome: where and when the code ran,
/// and what it saw.
#[must_use]
pub fn execution(clock: &Clock, body: &Value) -> Option<Ran> {
    let stdout = body["model"]["stdout"]["text"].as_str()?;
    let mut words = stdout
        .lines()
        .find_map(|l| l.strip_prefix(LINE).map(str::split_whitespace))?;
    let worker = body["model"]["worker"].as_str()?.to_owned();
    let start = words.next()?.parse().ok()?;
    let end = words.next()?.parse().ok()?;
    Some(Ran {
        worker,
        start_ns: clock.from_monotonic(start),
        end_ns: clock.from_monotonic(end),
        seen: words.map(str::to_owned).collect(),
    })
}

/// What the answer `(status, body)` to `kind` tells, or why it tells nothing.
#[must_use]
pub fn classify(clock: &Clock, status: u16, body: &Value) -> Answer {
    let code = body["error"]["code"].as_str().map(str::to_owned);
    let outcome = body["outcome"].as_str().map(str::to_owned);
    match outcome.as_deref() {
        Some("succeeded") => {
            if let Some(ran) = execution(clock, body) {
                return Answer::Succeeded {
                    worker: ran.worker,
                    generation: body["model"]["workspace"]["generation"].as_u64(),
                    seen: ran.seen,
                    exec_start_ns: ran.start_ns,
                    exec_end_ns: ran.end_ns,
                };
            }
            // Succeeded, but not with what the code prints: the answer lost the code's output.
            Answer::Failed {
                status,
                outcome,
                code: Some("chaos_unreadable_success".to_owned()),
            }
        }
        // Nothing of the code ran.
        Some("not_run") => Answer::Refused {
            status,
            code: body["model"]["not_run"]
                .as_str()
                .map(str::to_owned)
                .or(code),
        },
        // Another run saved the workspace first: the create-only save was refused, so nothing of
        // this run was kept (WS-5).
        Some("error") if code.as_deref() == Some("workspace_conflict") => {
            Answer::Refused { status, code }
        }
        // A refusal (`outcome: refused`): admission, the store, a lost worker; nothing of the
        // run was kept.
        Some("refused") => Answer::Refused { status, code },
        Some(_) => Answer::Failed {
            status,
            outcome,
            code,
        },
        // No outcome at all: not an answer the API gives, so nothing can be concluded from it.
        None => Answer::Failed {
            status,
            outcome: None,
            code,
        },
    }
}

/// What the answer `(status, body)` to a Hashline edit that read `seen` tells: `applied` is a
/// success with the generation it saved (its "execution" is the read's sending to the answer, on
/// no worker); a refusal (an anchor, a lost create-only save) is definite (nothing was changed,
/// WS-5); a server error may or may not have saved, like a run's storage failure.
#[must_use]
pub fn classify_edit(
    status: u16,
    body: &Value,
    seen: Vec<String>,
    sent_ns: u64,
    answered_ns: u64,
) -> Answer {
    let code = body["error"]["code"].as_str().map(str::to_owned);
    if status == 200 && body["outcome"] == "applied" {
        return Answer::Succeeded {
            worker: String::new(),
            generation: body["generation"].as_u64(),
            seen,
            exec_start_ns: sent_ns,
            exec_end_ns: answered_ns,
        };
    }
    // Every refusal of the edit handler comes before its create-only save, or is that save's
    // conflict: nothing was changed (WS-5). A 5xx may come after the save was sent.
    if (400..500).contains(&status) {
        Answer::Refused { status, code }
    } else {
        Answer::Failed {
            status,
            outcome: None,
            code,
        }
    }
}

/// `call`'s answer within [`ANSWER_WAIT`], or why there was none.
async fn within<T>(call: impl Future<Output = Result<T, String>>) -> Result<T, Answer> {
    match tokio::time::timeout(ANSWER_WAIT, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(why)) => Err(Answer::NoAnswer { why }),
        Err(_) => Err(Answer::NoAnswer {
            why: format!("no answer within {ANSWER_WAIT:?}"),
        }),
    }
}

/// The lines of a Hashline view (`LINE:TAG|text`), as the tokens they hold.
fn view_tokens(lines: &str) -> Option<Vec<String>> {
    lines
        .lines()
        .map(|line| {
            let (_, text) = line.split_once('|')?;
            Some(text.trim().to_owned())
        })
        .filter(|token| token.as_ref().is_none_or(|t| !t.is_empty()))
        .collect()
}

/// How a Hashline edit went before its own answer.
enum Read {
    /// The whole file, shown under one tag: its tokens, the tag and its last line.
    Shown {
        seen: Vec<String>,
        tag: String,
        last: u64,
    },
    /// No file (or no workspace) yet: the workspace's first run has not saved it.
    Missing,
    /// The read itself was answered with an error or not at all: nothing was changed.
    Failed(Answer),
}

/// Reads the whole tokens file of `stream` through Hashline views, page by page, all under one
/// tag (the file did not change between the pages).
async fn read_tokens(replica: &Client, stream: &Stream) -> Read {
    let mut seen = Vec::new();
    let mut start = 1u64;
    let mut tag: Option<String> = None;
    loop {
        let query = format!(
            "/v1/read_workspace?actor={}&conversation={}&path={TOKENS_FILE}&view=hashline&start={start}",
            corral_api::client::encode(&stream.actor),
            corral_api::client::encode(&stream.conversation),
        );
        let (status, bytes) = match within(replica.get(&query)).await {
            Ok(answer) => answer,
            Err(none) => return Read::Failed(none),
        };
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let code = body["error"]["code"].as_str().map(str::to_owned);
        if status != 200 {
            return match code.as_deref() {
                Some("workspace_path_not_found" | "workspace_not_found") => Read::Missing,
                _ => Read::Failed(Answer::Refused { status, code }),
            };
        }
        let unreadable = || {
            Read::Failed(Answer::Failed {
                status,
                outcome: None,
                code: Some("chaos_unreadable_view".to_owned()),
            })
        };
        let (Some(page_tag), Some(total), Some(lines)) = (
            body["tag"].as_str(),
            body["total_lines"].as_u64(),
            body["lines"].as_str(),
        ) else {
            return unreadable();
        };
        if tag.as_deref().is_some_and(|t| t != page_tag) {
            // Changed between two pages: as good as a stale read, nothing to edit by.
            return Read::Failed(Answer::Refused {
                status,
                code: Some("stale_anchor".to_owned()),
            });
        }
        tag = Some(page_tag.to_owned());
        let Some(tokens) = view_tokens(lines) else {
            return unreadable();
        };
        let shown = u64::try_from(lines.lines().count()).unwrap_or(0);
        seen.extend(tokens);
        if total == 0 {
            return Read::Missing;
        }
        if shown == 0 || start + shown > total {
            return Read::Shown {
                seen,
                tag: tag.unwrap_or_default(),
                last: total,
            };
        }
        start += shown;
    }
}

/// One Hashline edit appending `token` to `stream`'s tokens file after the last line shown;
/// `None` when there is no file yet (the client runs instead). The answer and when the read was
/// sent and the edit answered.
async fn edit(
    shared: &Shared,
    replica: &Client,
    stream: &Stream,
    token: &str,
) -> Option<(Answer, u64, u64)> {
    let sent_ns = shared.clock.now();
    let (seen, tag, last) = match read_tokens(replica, stream).await {
        Read::Shown { seen, tag, last } => (seen, tag, last),
        Read::Missing => return None,
        Read::Failed(answer) => return Some((answer, sent_ns, shared.clock.now())),
    };
    let body = json!({
        "actor": stream.actor,
        "conversation": stream.conversation,
        "path": TOKENS_FILE,
        "edits": [{ "op": "insert_after", "tag": tag, "line": last, "text": token }],
    });
    let answered = within(replica.post("/v1/edit_workspace", &body)).await;
    let answered_ns = shared.clock.now();
    let answer = match answered {
        Ok((status, body)) => classify_edit(status, &body, seen, sent_ns, answered_ns),
        Err(none) => none,
    };
    Some((answer, sent_ns, answered_ns))
}

/// One client's stream: the workspace or kernel it extends, as one member. Two clients may
/// extend one workspace as two members at once (only one save of a generation may win).
#[derive(Clone, Debug)]
pub struct Stream {
    /// Workspace or kernel.
    pub kind: Kind,
    /// The actor.
    pub actor: String,
    /// The conversation.
    pub conversation: String,
    /// The member who asks.
    pub member: String,
}

/// What the clients share.
pub struct Shared {
    /// The clock.
    pub clock: Clock,
    /// Each replica's client.
    pub replicas: Vec<Client>,
    /// The recorded operations.
    pub ops: Mutex<Vec<Op>>,
    /// Raised to stop the load.
    pub stop: AtomicBool,
    /// The next operation id.
    pub next_id: AtomicU64,
    /// Requests in flight per replica: faults aimed at a replica hit the busiest, mid-operation.
    pub in_flight: Vec<AtomicU64>,
    /// Of those, the ones whose code outlasts the lease's time to live.
    pub long_in_flight: Vec<AtomicU64>,
    /// Whether the harness's registry serves [`PACKAGE`], so that installs are part of the load.
    pub installs: bool,
    /// Whether the egress target is up, so that fetches are part of the load.
    pub fetches: bool,
}

impl Shared {
    /// A replica picked by `rng`.
    pub fn any_replica(&self, rng: &mut Rng) -> usize {
        usize::try_from(rng.below(self.replicas.len() as u64)).unwrap_or(0)
    }

    /// The replica with a long operation in flight (one whose holder, paused, would wake as a
    /// zombie with its code still running), else the one with the most requests in flight, if
    /// any has one.
    #[must_use]
    pub fn busiest(&self) -> Option<usize> {
        let most = |counts: &[AtomicU64]| {
            counts
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .enumerate()
                .filter(|(_, n)| *n > 0)
                .max_by_key(|(_, n)| *n)
                .map(|(index, _)| index)
        };
        most(&self.long_in_flight).or_else(|| most(&self.in_flight))
    }
}

/// Runs one client on `stream` until the load stops: a workspace's client makes one operation
/// in [`EDIT_ONE_IN`] a Hashline edit once the file exists, and one in [`INSTALL_ONE_IN`] of the
/// others an install; a browser client opens, drives and closes one session after another.
pub async fn client(shared: Arc<Shared>, index: usize, stream: Stream, mut rng: Rng) {
    let mut n = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        n += 1;
        let token = format!("c{index}n{n}");
        let replica_index = shared.any_replica(&mut rng);
        let (op, definite_refusal) = if stream.kind == Kind::Browser {
            browse(&shared, &stream, token, replica_index, &mut rng).await
        } else {
            extend(&shared, &stream, token, replica_index, &mut rng).await
        };
        shared.ops.lock().await.push(op);
        // After a refusal, back off a little, as a platform honouring Retry-After would.
        let think = if definite_refusal {
            rng.between(200, 1_000)
        } else {
            rng.between(0, 100)
        };
        tokio::time::sleep(Duration::from_millis(think)).await;
    }
}

/// The operation a client of `stream` records, before its id and answer.
fn op(shared: &Shared, stream: &Stream, token: String, via: Via, replica: usize) -> Op {
    Op {
        id: shared.next_id.fetch_add(1, Ordering::Relaxed),
        kind: stream.kind,
        actor: stream.actor.clone(),
        conversation: stream.conversation.clone(),
        member: stream.member.clone(),
        token,
        via,
        replica,
        ran: None,
        start_ns: 0,
        end_ns: 0,
        answer: Answer::NoAnswer { why: String::new() },
        mark: None,
        session: None,
        fetched: None,
    }
}

/// One operation extending a workspace or a kernel, and whether it was refused.
async fn extend(
    shared: &Shared,
    stream: &Stream,
    token: String,
    replica_index: usize,
    rng: &mut Rng,
) -> (Op, bool) {
    // Mostly short; one in twenty outlasts the lease's time to live, so that a paused
    // holder's lease can expire while its code still runs.
    let pause_ms = if rng.below(20) == 0 {
        rng.between(LONG_MS, 2 * LONG_MS)
    } else {
        rng.between(0, 300)
    };
    let try_edit = stream.kind == Kind::Workspace && rng.below(EDIT_ONE_IN) == 0;
    let install = stream.kind == Kind::Workspace
        && !try_edit
        && shared.installs
        && rng.below(INSTALL_ONE_IN) == 0;
    let replica = &shared.replicas[replica_index];
    let long = pause_ms >= LONG_MS && !try_edit;
    shared.in_flight[replica_index].fetch_add(1, Ordering::Relaxed);
    if long {
        shared.long_in_flight[replica_index].fetch_add(1, Ordering::Relaxed);
    }
    let edited = if try_edit {
        edit(shared, replica, stream, &token).await
    } else {
        None
    };
    let via = match (&edited, install) {
        (Some(_), _) => Via::Edit,
        (None, true) => Via::Install,
        (None, false) => Via::Run,
    };
    let mut op = op(shared, stream, token, via, replica_index);
    match edited {
        Some((answer, start_ns, end_ns)) => {
            (op.answer, op.start_ns, op.end_ns) = (answer, start_ns, end_ns);
        }
        None => {
            let fetch = stream.kind == Kind::Workspace
                && via == Via::Run
                && shared.fetches
                && rng.below(FETCH_ONE_IN) == 0;
            run(shared, replica, stream, &mut op, pause_ms, fetch).await;
        }
    }
    shared.in_flight[replica_index].fetch_sub(1, Ordering::Relaxed);
    if long {
        shared.long_in_flight[replica_index].fetch_sub(1, Ordering::Relaxed);
    }
    let refused = matches!(op.answer, Answer::Refused { .. });
    (op, refused)
}

/// The answer `(status, body)` to a browser session's open or close when it is not the one
/// hoped for: a 4xx or a 503 carries a refusal's code (nothing was opened, or nothing closed);
/// anything else may or may not have taken effect.
#[must_use]
pub fn classify_session_call(status: u16, body: &Value) -> Answer {
    let code = body["error"]["code"].as_str().map(str::to_owned);
    if (400..500).contains(&status) || status == 503 {
        Answer::Refused { status, code }
    } else {
        Answer::Failed {
            status,
            outcome: None,
            code,
        }
    }
}

/// The JavaScript an action evaluates: push `token` onto the page's list, answer the list.
fn push_expression(token: &str) -> String {
    format!("((window.chaos = window.chaos || []).push('{token}'), window.chaos.join(' '))")
}

/// What an action's answer `(status, body)` says: the list the page held, or the refusal's code.
#[must_use]
pub fn read_act(status: u16, body: &Value) -> (Option<Vec<String>>, Option<String>) {
    if status == 200 {
        // The value is the expression's JSON.
        let list = body["result"]["value"]
            .as_str()
            .and_then(|json| serde_json::from_str::<String>(json).ok())
            .map(|list| list.split_whitespace().map(str::to_owned).collect());
        let unread = list.is_none().then(|| "chaos_unreadable_value".to_owned());
        return (list, unread);
    }
    let code = body["error"]["code"]
        .as_str()
        .map_or_else(|| format!("http_{status}"), str::to_owned);
    (None, Some(code))
}

/// One browser session: opened on `replica_index` at `about:blank`, up to [`ACTS_MAX`] actions
/// and the close each on a replica the seed picks (the holder is the opener; the others
/// announce), and whether the open was refused.
async fn browse(
    shared: &Shared,
    stream: &Stream,
    token: String,
    replica_index: usize,
    rng: &mut Rng,
) -> (Op, bool) {
    let mut op = op(shared, stream, token, Via::Session, replica_index);
    let owner = json!({ "actor": stream.actor, "conversation": stream.conversation });
    let mut body = owner.clone();
    body["member"] = json!(stream.member);
    body["url"] = json!("about:blank");
    op.start_ns = shared.clock.now();
    let opened = within(shared.replicas[replica_index].post("/v1/browser_sessions", &body)).await;
    let opened_ns = shared.clock.now();
    let (id, worker) = match opened {
        Ok((200, body)) => match (body["session"].as_str(), body["worker"].as_str()) {
            (Some(id), Some(worker)) => (id.to_owned(), worker.to_owned()),
            _ => {
                op.end_ns = opened_ns;
                op.answer = Answer::Failed {
                    status: 200,
                    outcome: None,
                    code: Some("chaos_unreadable_open".to_owned()),
                };
                return (op, false);
            }
        },
        Ok((status, body)) => {
            op.end_ns = opened_ns;
            op.answer = classify_session_call(status, &body);
            let refused = matches!(op.answer, Answer::Refused { .. });
            return (op, refused);
        }
        Err(none) => {
            op.end_ns = opened_ns;
            op.answer = none;
            return (op, false);
        }
    };
    let mut session = Session {
        id: id.clone(),
        worker: worker.clone(),
        acts: Vec::new(),
        close_sent_ns: None,
        confirmed: None,
    };
    let mut alive_until = opened_ns;
    for k in 0..rng.between(1, ACTS_MAX) {
        tokio::time::sleep(Duration::from_millis(rng.between(50, 1_500))).await;
        let replica = &shared.replicas[shared.any_replica(rng)];
        let mut call = owner.clone();
        let act_token = format!("{}a{k}", op.token);
        call["action"] = json!({ "action": "evaluate", "expression": push_expression(&act_token) });
        let sent_ns = shared.clock.now();
        let answered =
            within(replica.post(&format!("/v1/browser_sessions/{id}/actions"), &call)).await;
        let answered_ns = shared.clock.now();
        let (seen, refused) = match answered {
            Ok((status, body)) => read_act(status, &body),
            Err(Answer::NoAnswer { why }) => (None, Some(why)),
            Err(_) => (None, None),
        };
        // An answered action ran on the session's worker at some instant between its sending
        // and its answer; the session held the worker until then, so certainly until the
        // sending. Not until the answer: the worker may answer and then be deleted (its lease
        // lost while the opener was paused) before the answer reaches this client, and a read
        // of the pool in that gap rightly shows the worker gone.
        if seen.is_some() {
            alive_until = sent_ns;
        }
        let ended = refused.is_some() && seen.is_none();
        session.acts.push(Act {
            token: act_token,
            sent_ns,
            answered_ns,
            seen,
            refused,
        });
        if ended {
            break;
        }
    }
    let replica = &shared.replicas[shared.any_replica(rng)];
    let close_sent_ns = shared.clock.now();
    session.close_sent_ns = Some(close_sent_ns);
    let closed = within(replica.post(&format!("/v1/browser_sessions/{id}/close"), &owner)).await;
    op.end_ns = shared.clock.now();
    op.answer = match closed {
        Ok((200, body)) if body["closed"] == true => {
            session.confirmed = body["confirmed"].as_bool();
            // A worker that confirmed the close held the session until the close reached it;
            // otherwise the sending of the last answered action is the last sure sign the
            // session held its worker (its lease may have been lost meanwhile, and the worker
            // discarded, as the close then says).
            let held_until = if session.confirmed == Some(true) {
                close_sent_ns
            } else {
                alive_until
            };
            Answer::Succeeded {
                worker: worker.clone(),
                generation: None,
                seen: Vec::new(),
                exec_start_ns: opened_ns,
                exec_end_ns: held_until,
            }
        }
        Ok((status, body)) => classify_session_call(status, &body),
        Err(none) => none,
    };
    if !matches!(op.answer, Answer::Succeeded { .. }) {
        // Held, as far as the client can be sure, from the open's answer to the sending of the
        // last answered action.
        op.ran = Some(Ran {
            worker,
            start_ns: opened_ns,
            end_ns: alive_until,
            seen: Vec::new(),
        });
    }
    op.session = Some(session);
    (op, false)
}

/// One run of `op` (its token, and `op.via`: a plain run or an install) after a pause of
/// `pause_ms` in its code, and a fetch through the egress proxy after its line when `fetch`:
/// fills in the answer, where its code ran when an answer other than `succeeded` still says, what
/// it printed of its install and its fetch, and when it was sent and answered.
async fn run(
    shared: &Shared,
    replica: &Client,
    stream: &Stream,
    op: &mut Op,
    pause_ms: u64,
    fetch: bool,
) {
    let mut body = json!({
        "actor": stream.actor,
        "conversation": stream.conversation,
        "member": stream.member,
        "language": "python",
        "code": code(stream.kind, op.via, &op.token, pause_ms, fetch),
    });
    if stream.kind == Kind::Kernel {
        body["kernel"] = json!("persistent");
    }
    if op.via == Via::Install {
        body["packages"] = json!([PACKAGE]);
    }
    op.start_ns = shared.clock.now();
    let answered = within(replica.run_code(&body)).await;
    op.end_ns = shared.clock.now();
    op.answer = match answered {
        Ok((status, body)) => {
            op.mark = printed_mark(&body);
            op.fetched = printed_fetch(&body);
            let answer = classify(&shared.clock, status, &body);
            // Code that ran but was not answered `succeeded` still ran where it says.
            if !matches!(answer, Answer::Succeeded { .. }) {
                op.ran = execution(&shared.clock, &body);
            }
            answer
        }
        Err(none) => none,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock() -> Clock {
        Clock {
            origin: Instant::now(),
            origin_ns: 1_000,
        }
    }

    #[test]
    fn a_succeeded_answer_reads_as_what_the_code_saw() {
        let body = json!({"outcome": "succeeded", "model": {
            "stdout": {"text": "CHAOS 1500 2500 c1n1 c1n2\n"}, "worker": "w-1-3",
            "workspace": {"generation": 7}}});
        assert_eq!(
            classify(&clock(), 200, &body),
            Answer::Succeeded {
                worker: "w-1-3".to_owned(),
                generation: Some(7),
                seen: vec!["c1n1".to_owned(), "c1n2".to_owned()],
                exec_start_ns: 500,
                exec_end_ns: 1_500,
            }
        );
    }

    #[test]
    fn refusals_are_definite_and_failures_are_not() {
        let refused = json!({"outcome": "refused", "error": {"code": "coordination_unavailable"}});
        assert_eq!(
            classify(&clock(), 503, &refused),
            Answer::Refused {
                status: 503,
                code: Some("coordination_unavailable".to_owned())
            }
        );
        let not_run = json!({"outcome": "not_run", "model": {"not_run": "isolation_unavailable"}});
        assert!(matches!(
            classify(&clock(), 200, &not_run),
            Answer::Refused { code: Some(c), .. } if c == "isolation_unavailable"
        ));
        let conflict = json!({"outcome": "error", "error": {"code": "workspace_conflict"}});
        assert!(matches!(
            classify(&clock(), 409, &conflict),
            Answer::Refused { code: Some(c), .. } if c == "workspace_conflict"
        ));
        let failed =
            json!({"outcome": "error", "error": {"code": "workspace_storage_unavailable"}});
        assert!(matches!(
            classify(&clock(), 503, &failed),
            Answer::Failed { code: Some(c), .. } if c == "workspace_storage_unavailable"
        ));
        let garbled = json!({"outcome": "succeeded", "model": {"stdout": {"text": "hello"}}});
        assert!(matches!(
            classify(&clock(), 200, &garbled),
            Answer::Failed { code: Some(c), .. } if c == "chaos_unreadable_success"
        ));
    }

    #[test]
    fn the_busiest_replica_is_one_with_a_long_operation_else_the_most_in_flight() {
        let shared = Shared {
            clock: clock(),
            replicas: Vec::new(),
            ops: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            in_flight: (0..3).map(|_| AtomicU64::new(0)).collect(),
            long_in_flight: (0..3).map(|_| AtomicU64::new(0)).collect(),
            installs: false,
            fetches: false,
        };
        assert_eq!(shared.busiest(), None);
        shared.in_flight[1].store(2, Ordering::Relaxed);
        shared.in_flight[2].store(1, Ordering::Relaxed);
        assert_eq!(shared.busiest(), Some(1));
        shared.long_in_flight[2].store(1, Ordering::Relaxed);
        assert_eq!(shared.busiest(), Some(2));
    }

    #[test]
    fn the_code_reads_before_it_appends() {
        for kind in [Kind::Workspace, Kind::Kernel] {
            let code = code(kind, Via::Run, "c3n9", 50, false);
            let read = code.find("seen =").expect("reads");
            let append = code.find("c3n9").expect("appends");
            assert!(read < append, "{code}");
            assert!(code.contains("time.sleep(0.05)"), "{code}");
        }
    }

    #[test]
    fn an_install_prints_the_package_mark_and_still_reads_as_what_the_code_saw() {
        // The install's code, run for real by Python beside a module standing for the package.
        let dir = std::env::temp_dir().join(format!("corral-chaos-install-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory");
        std::fs::write(dir.join(format!("{PACKAGE_MODULE}.py")), "MARK = 'm42'\n").expect("module");
        let clock = clock();
        let mut answers = Vec::new();
        for token in ["c1n1", "c1n2"] {
            let output = std::process::Command::new("/usr/bin/python3")
                .arg("-c")
                .arg(code(Kind::Workspace, Via::Install, token, 0, false))
                .current_dir(&dir)
                .env("PYTHONPATH", &dir)
                .output()
                .expect("python3 runs");
            assert!(output.status.success(), "{output:?}");
            let body = json!({
                "outcome": "succeeded",
                "model": {"worker": "w1", "stdout": {"text": String::from_utf8_lossy(&output.stdout)}},
            });
            answers.push((printed_mark(&body), classify(&clock, 200, &body)));
        }
        let _ = std::fs::remove_dir_all(&dir);
        for (mark, _) in &answers {
            assert_eq!(mark.as_deref(), Some("m42"));
        }
        let seen: Vec<Vec<String>> = answers
            .into_iter()
            .map(|(_, answer)| match answer {
                Answer::Succeeded { seen, .. } => seen,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(seen, [vec![], vec!["c1n1".to_owned()]]);
    }

    #[test]
    fn egr_02_a_fetch_asks_the_proxy_for_the_target_and_reads_as_what_it_answered() {
        use std::io::{BufRead as _, BufReader, Write as _};
        // A proxy standing in for the egress proxy: a refusal with its reason, then a 200.
        let proxy = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let address = proxy.local_addr().expect("an address");
        let answers = [
            format!(
                "HTTP/1.1 403 Forbidden\r\n{}: dns_answer_mixed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                corral_core::egress::reason::REASON_HEADER
            ),
            "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nmark7 /c1n1"
                .to_owned(),
        ];
        let served = std::thread::spawn(move || {
            let mut asked = Vec::new();
            for answer in answers {
                let (stream, _) = proxy.accept().expect("a connection");
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                reader.read_line(&mut line).expect("a request line");
                asked.push(line.trim().to_owned());
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).map_or(true, |n| n == 0) || header == "\r\n" {
                        break;
                    }
                }
                reader
                    .get_mut()
                    .write_all(answer.as_bytes())
                    .expect("answered");
            }
            asked
        });
        let mut printed = Vec::new();
        for _ in 0..2 {
            let output = std::process::Command::new("/usr/bin/python3")
                .arg("-c")
                .arg(code(Kind::Workspace, Via::Run, "c1n1", 0, true))
                .current_dir(std::env::temp_dir())
                .env("http_proxy", format!("http://{address}"))
                .output()
                .expect("python3 runs");
            let body =
                json!({"model": {"stdout": {"text": String::from_utf8_lossy(&output.stdout)}}});
            printed.push(printed_fetch(&body));
        }
        let asked = served.join().expect("the proxy's thread");
        let wanted = format!("GET http://{}/c1n1 HTTP/1.1", crate::egress::NAME);
        assert_eq!(asked, [wanted.clone(), wanted]);
        assert_eq!(
            printed,
            [
                Some(Fetched {
                    status: 403,
                    said: "dns_answer_mixed".to_owned()
                }),
                Some(Fetched {
                    status: 200,
                    said: "mark7 /c1n1".to_owned()
                }),
            ]
        );
    }

    #[test]
    fn an_edit_applied_is_a_success_on_no_worker_and_a_refusal_is_definite() {
        let applied = json!({"outcome": "applied", "generation": 12, "tag": "ab12"});
        assert_eq!(
            classify_edit(200, &applied, vec!["c1n1".to_owned()], 10, 20),
            Answer::Succeeded {
                worker: String::new(),
                generation: Some(12),
                seen: vec!["c1n1".to_owned()],
                exec_start_ns: 10,
                exec_end_ns: 20,
            }
        );
        for (status, code) in [
            (409, "stale_anchor"),
            (409, "workspace_conflict"),
            (422, "anchor_not_shown"),
        ] {
            let refused = json!({"outcome": "refused", "error": {"code": code}});
            assert_eq!(
                classify_edit(status, &refused, Vec::new(), 0, 1),
                Answer::Refused {
                    status,
                    code: Some(code.to_owned())
                }
            );
        }
        let unavailable = json!({"error": {"code": "workspace_storage_unavailable"}});
        assert!(matches!(
            classify_edit(503, &unavailable, Vec::new(), 0, 1),
            Answer::Failed { status: 503, .. }
        ));
    }

    #[test]
    fn a_hashline_view_reads_as_its_tokens() {
        assert_eq!(
            view_tokens("1:ab12|c1n1\n2:ab12|c2n4\n"),
            Some(vec!["c1n1".to_owned(), "c2n4".to_owned()])
        );
        assert_eq!(view_tokens("1:ab12|c1n1\ngarbage\n"), None);
    }
}
