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

use crate::history::{Answer, Kind, Op, Ran, Via};
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
/// window a fault can land in).
#[must_use]
pub fn code(kind: Kind, token: &str, pause_ms: u64) -> String {
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
    };
    format!(
        "import time\nstarted = time.monotonic_ns()\n{read}print('{LINE}', started, time.monotonic_ns(), *seen)\n"
    )
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
}

impl Shared {
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
/// in [`EDIT_ONE_IN`] a Hashline edit once the file exists.
pub async fn client(shared: Arc<Shared>, index: usize, stream: Stream, mut rng: Rng) {
    let mut n = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        n += 1;
        let token = format!("c{index}n{n}");
        // Mostly short; one in twenty outlasts the lease's time to live, so that a paused
        // holder's lease can expire while its code still runs.
        let pause_ms = if rng.below(20) == 0 {
            rng.between(LONG_MS, 2 * LONG_MS)
        } else {
            rng.between(0, 300)
        };
        let replica_index = usize::try_from(rng.below(shared.replicas.len() as u64)).unwrap_or(0);
        let try_edit = stream.kind == Kind::Workspace && rng.below(EDIT_ONE_IN) == 0;
        let replica = &shared.replicas[replica_index];
        let long = pause_ms >= LONG_MS && !try_edit;
        shared.in_flight[replica_index].fetch_add(1, Ordering::Relaxed);
        if long {
            shared.long_in_flight[replica_index].fetch_add(1, Ordering::Relaxed);
        }
        let edited = if try_edit {
            edit(&shared, replica, &stream, &token).await
        } else {
            None
        };
        let (via, answer, ran, start_ns, end_ns) = match edited {
            Some((answer, start_ns, end_ns)) => (Via::Edit, answer, None, start_ns, end_ns),
            None => {
                let (answer, ran, start_ns, end_ns) =
                    run(&shared, replica, &stream, &token, pause_ms).await;
                (Via::Run, answer, ran, start_ns, end_ns)
            }
        };
        shared.in_flight[replica_index].fetch_sub(1, Ordering::Relaxed);
        if long {
            shared.long_in_flight[replica_index].fetch_sub(1, Ordering::Relaxed);
        }
        let definite_refusal = matches!(answer, Answer::Refused { .. });
        let op = Op {
            id: shared.next_id.fetch_add(1, Ordering::Relaxed),
            kind: stream.kind,
            actor: stream.actor.clone(),
            conversation: stream.conversation.clone(),
            member: stream.member.clone(),
            token,
            via,
            replica: replica_index,
            ran,
            start_ns,
            end_ns,
            answer,
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

/// One run appending `token` after a pause of `pause_ms` in its code: the answer, where its code
/// ran when an answer other than `succeeded` still says, and when it was sent and answered.
async fn run(
    shared: &Shared,
    replica: &Client,
    stream: &Stream,
    token: &str,
    pause_ms: u64,
) -> (Answer, Option<Ran>, u64, u64) {
    let mut body = json!({
        "actor": stream.actor,
        "conversation": stream.conversation,
        "member": stream.member,
        "language": "python",
        "code": code(stream.kind, token, pause_ms),
    });
    if stream.kind == Kind::Kernel {
        body["kernel"] = json!("persistent");
    }
    let start_ns = shared.clock.now();
    let answered = within(replica.run_code(&body)).await;
    let end_ns = shared.clock.now();
    let mut ran = None;
    let answer = match answered {
        Ok((status, body)) => {
            let answer = classify(&shared.clock, status, &body);
            // Code that ran but was not answered `succeeded` still ran where it says.
            if !matches!(answer, Answer::Succeeded { .. }) {
                ran = execution(&shared.clock, &body);
            }
            answer
        }
        Err(none) => none,
    };
    (answer, ran, start_ns, end_ns)
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
            let code = code(kind, "c3n9", 50);
            let read = code.find("seen =").expect("reads");
            let append = code.find("c3n9").expect("appends");
            assert!(read < append, "{code}");
            assert!(code.contains("time.sleep(0.05)"), "{code}");
        }
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
