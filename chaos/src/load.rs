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

use crate::history::{Answer, Kind, Op, Ran};
use crate::rng::Rng;

/// How long a client waits for one answer before recording none.
pub const ANSWER_WAIT: Duration = Duration::from_secs(90);

/// A long operation's least pause inside its code: most of the lease's time to live.
const LONG_MS: u64 = 3_000;

/// The line the code prints: `CHAOS <start> <end> <token> <token> ...`.
const LINE: &str = "CHAOS";

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
            "try:\n    seen = open('tokens.txt').read().split()\nexcept FileNotFoundError:\n    seen = []\n\
             time.sleep({pause})\nopen('tokens.txt', 'a').write('{token}\\n')\n",
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

/// Runs one client on `stream` until the load stops.
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
        let mut body = json!({
            "actor": stream.actor,
            "conversation": stream.conversation,
            "member": stream.member,
            "language": "python",
            "code": code(stream.kind, &token, pause_ms),
        });
        if stream.kind == Kind::Kernel {
            body["kernel"] = json!("persistent");
        }
        let replica_index = usize::try_from(rng.below(shared.replicas.len() as u64)).unwrap_or(0);
        let replica = &shared.replicas[replica_index];
        let start_ns = shared.clock.now();
        let long = pause_ms >= LONG_MS;
        shared.in_flight[replica_index].fetch_add(1, Ordering::Relaxed);
        if long {
            shared.long_in_flight[replica_index].fetch_add(1, Ordering::Relaxed);
        }
        let answered = tokio::time::timeout(ANSWER_WAIT, replica.run_code(&body)).await;
        shared.in_flight[replica_index].fetch_sub(1, Ordering::Relaxed);
        if long {
            shared.long_in_flight[replica_index].fetch_sub(1, Ordering::Relaxed);
        }
        let end_ns = shared.clock.now();
        let mut ran = None;
        let answer = match answered {
            Ok(Ok((status, body))) => {
                let answer = classify(&shared.clock, status, &body);
                // Code that ran but was not answered `succeeded` still ran where it says.
                if !matches!(answer, Answer::Succeeded { .. }) {
                    ran = execution(&shared.clock, &body);
                }
                answer
            }
            Ok(Err(why)) => Answer::NoAnswer { why },
            Err(_) => Answer::NoAnswer {
                why: format!("no answer within {ANSWER_WAIT:?}"),
            },
        };
        let definite_refusal = matches!(answer, Answer::Refused { .. });
        let op = Op {
            id: shared.next_id.fetch_add(1, Ordering::Relaxed),
            kind: stream.kind,
            actor: stream.actor.clone(),
            conversation: stream.conversation.clone(),
            member: stream.member.clone(),
            token,
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
}
