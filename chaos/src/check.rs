//! The history checker: every rule the deployment promises under faults, read from what its
//! clients were told. Each violation names its rule and the operations involved.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use corral_core::ids::WorkerId;
use corral_core::run::outcome::Outcome;

use crate::history::{Answer, History, Kind, Nanos, Op, Via};

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule's name (`double_lease`, `lost_write`, ...).
    pub rule: &'static str,
    /// What was seen.
    pub detail: String,
    /// The operations involved, by id.
    pub ops: Vec<u64>,
}

/// What a history shows, beside its violations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Operations by answer (`succeeded`, `refused`, `failed`, `no_answer`).
    pub answers: BTreeMap<&'static str, u64>,
    /// Of those, the Hashline edits, by answer.
    pub edits: BTreeMap<&'static str, u64>,
    /// Of those, the installs through the broker, by answer.
    pub installs: BTreeMap<&'static str, u64>,
    /// The fetches through the egress proxy, by what they got: `200`, the refusal's status and
    /// reason, or `no answer` and why.
    pub fetches: BTreeMap<String, u64>,
    /// Of those, the browser sessions, by answer (`succeeded`: closed by its own close), and by
    /// how a close went (`confirmed`, `unconfirmed`); `actions` counts the actions answered.
    pub sessions: BTreeMap<&'static str, u64>,
    /// Faults by kind.
    pub faults: BTreeMap<String, u64>,
    /// Refusal and failure codes seen, with how often.
    pub codes: BTreeMap<String, u64>,
    /// The longest a fault's healing took the pool to be back at its warm target, and which.
    pub longest_recovery: Option<(Nanos, String)>,
    /// From the load's end until the pool was back at its warm target with nothing quarantined.
    pub final_recovery: Option<Nanos>,
}

/// A checked history.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Every violation, in the order the rules were checked.
    pub violations: Vec<Violation>,
    /// What it shows.
    pub summary: Summary,
}

/// The violations printed in full; the rest are counted by rule.
const SHOWN_MAX: usize = 25;

/// The longest a code may be: a code is a word for machines, not a message.
const CODE_MAX_CHARS: usize = 64;

/// Whether `code` reads as a stable code: lower-case ASCII words joined by `_`.
fn is_stable_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= CODE_MAX_CHARS
        && code.starts_with(|c: char| c.is_ascii_lowercase())
        && code
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !code.ends_with('_')
        && !code.contains("__")
}

fn answer_name(answer: &Answer) -> &'static str {
    match answer {
        Answer::Succeeded { .. } => "succeeded",
        Answer::Refused { .. } => "refused",
        Answer::Failed { .. } => "failed",
        Answer::NoAnswer { .. } => "no_answer",
    }
}

/// How an operation reads in a violation.
fn describe(op: &Op) -> String {
    let answer = match &op.answer {
        Answer::Succeeded {
            worker,
            generation,
            seen,
            exec_start_ns,
            exec_end_ns,
        } => {
            let how = match op.via {
                Via::Run | Via::Install => format!("succeeded on {worker}"),
                Via::Edit => "applied by an edit".to_owned(),
                Via::Session => format!("held {worker} and closed it"),
            };
            format!(
                "{how} (generation {generation:?}, ran {exec_start_ns}..{exec_end_ns}, saw {} token(s))",
                seen.len()
            )
        }
        Answer::Refused { status, code } => format!("refused {status} {code:?}"),
        Answer::Failed {
            status,
            outcome,
            code,
        } => format!("failed {status} {outcome:?} {code:?}"),
        Answer::NoAnswer { why } => format!("no answer ({why})"),
    };
    let via = match op.via {
        Via::Run => "",
        Via::Edit => " edit",
        Via::Install => " install",
        Via::Session => " session",
    };
    format!(
        "#{} {:?}{via} {}/{} member {} token {} sent {} answered {}: {answer}",
        op.id, op.kind, op.actor, op.conversation, op.member, op.token, op.start_ns, op.end_ns
    )
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for violation in self.violations.iter().take(SHOWN_MAX) {
            writeln!(f, "VIOLATION {}: {}", violation.rule, violation.detail)?;
        }
        if self.violations.len() > SHOWN_MAX {
            let mut rest: BTreeMap<&str, usize> = BTreeMap::new();
            for violation in &self.violations[SHOWN_MAX..] {
                *rest.entry(violation.rule).or_default() += 1;
            }
            writeln!(
                f,
                "... and {} more: {rest:?}",
                self.violations.len() - SHOWN_MAX
            )?;
        }
        Ok(())
    }
}

/// Checks `history`. The violations come with the operations they involve described from it.
#[must_use]
pub fn check(history: &History) -> Verdict {
    let mut checker = Checker {
        history,
        violations: Vec::new(),
    };
    checker.double_lease();
    checker.ran_without_lease();
    checker.member_limit();
    checker.streams();
    checker.installs();
    checker.sessions();
    checker.fetches();
    checker.codes();
    checker.ceiling();
    let summary = checker.summary();
    if history.quiet_ns > 0 && summary.final_recovery.is_none() {
        let last = history.pool.last();
        checker.violations.push(Violation {
            rule: "pool_not_recovered",
            detail: format!(
                "from the load's end at {} to the end at {}, the pool never had {} warm workers \
                 with none quarantined (last seen: {last:?})",
                history.quiet_ns, history.end_ns, history.warm_target
            ),
            ops: Vec::new(),
        });
    }
    Verdict {
        violations: checker.violations,
        summary,
    }
}

struct Checker<'a> {
    history: &'a History,
    violations: Vec<Violation>,
}

/// A succeeded operation's execution.
struct Execution<'a> {
    op: &'a Op,
    worker: &'a str,
    start: Nanos,
    end: Nanos,
}

impl<'a> Checker<'a> {
    fn violation(&mut self, rule: &'static str, summary: String, ops: &[&Op]) {
        let mut detail = summary;
        for op in ops {
            detail.push_str("\n    ");
            detail.push_str(&describe(op));
        }
        self.violations.push(Violation {
            rule,
            detail,
            ops: ops.iter().map(|op| op.id).collect(),
        });
    }

    /// Every execution the history shows: a succeeded operation's, and any other operation's
    /// whose answer still carried what its code printed. An edit executes on no worker; a
    /// browser session's execution is the time it provably held its worker.
    fn executions(&self) -> Vec<Execution<'a>> {
        self.history
            .ops
            .iter()
            .filter(|op| op.via != Via::Edit)
            .filter_map(|op| match (&op.answer, &op.ran) {
                (
                    Answer::Succeeded {
                        worker,
                        exec_start_ns,
                        exec_end_ns,
                        ..
                    },
                    _,
                ) => Some(Execution {
                    op,
                    worker,
                    start: *exec_start_ns,
                    end: *exec_end_ns,
                }),
                (_, Some(ran)) => Some(Execution {
                    op,
                    worker: &ran.worker,
                    start: ran.start_ns,
                    end: ran.end_ns,
                }),
                _ => None,
            })
            .collect()
    }

    /// No worker ran two operations at once: a worker is leased to one holder at a time, and a
    /// run executes only under its lease.
    fn double_lease(&mut self) {
        let mut by_worker: BTreeMap<&str, Vec<Execution<'a>>> = BTreeMap::new();
        for execution in self.executions() {
            by_worker
                .entry(execution.worker)
                .or_default()
                .push(execution);
        }
        for (worker, mut runs) in by_worker {
            runs.sort_by_key(|r| (r.start, r.end));
            // Against the run that ends last among those before: overlaps chain.
            let mut latest: Option<&Execution<'a>> = None;
            let mut found = Vec::new();
            for run in &runs {
                if let Some(before) = latest {
                    if run.start < before.end {
                        found.push((before.op, run.op));
                    }
                    if run.end > before.end {
                        latest = Some(run);
                    }
                } else {
                    latest = Some(run);
                }
            }
            for (a, b) in found {
                self.violation(
                    "double_lease",
                    format!("{worker} ran two operations at once"),
                    &[a, b],
                );
            }
        }
    }

    /// While an operation's code ran on a worker, the pool held that worker leased to the
    /// operation's member (or, its lease expired under the code, on its way out): a read of the
    /// pool taken wholly inside the execution that shows the worker warm, creating, resetting,
    /// leased to another member or gone means it ran without its lease (a zombie's release
    /// accepted, an expired lease's worker handed on, ...).
    fn ran_without_lease(&mut self) {
        let samples = &self.history.pool;
        let mut found = Vec::new();
        for run in self.executions() {
            let wanted = format!("leased:{}", run.op.member);
            // A lease that expired under running code leaves its worker on the way out
            // (quarantined or retiring) until its deletion is confirmed (POOL-9): that is the
            // design, not a violation. So is a worker absent from a pool of another epoch: the
            // pool lost (or, restored from an older snapshot, distrusted) the document that
            // leased it, its lease ended with that epoch, and no grant of a later epoch can
            // name it (decision 0034); it is deleted as an orphan. Anything else is a violation.
            let worker_epoch = WorkerId::parse(run.worker).map(|id| id.epoch);
            // The reads are in time order: start at the first sent after the code started.
            let first = samples.partition_point(|s| s.requested_ns <= run.start);
            let inside = samples[first..]
                .iter()
                .take_while(|s| s.requested_ns < run.end)
                .filter(|s| s.at_ns < run.end);
            for sample in inside {
                let state = sample
                    .workers
                    .get(run.worker)
                    .map_or("absent", String::as_str);
                let orphaned = state == "absent"
                    && sample.epoch.is_some()
                    && worker_epoch.is_some()
                    && sample.epoch != worker_epoch;
                if state != wanted && state != "quarantined" && state != "retiring" && !orphaned {
                    // Say when Valkey was restored from a snapshot just before: a rolled-back
                    // pool document forgets the leases granted since (decision 0033).
                    let restored = self
                        .history
                        .faults
                        .iter()
                        .filter(|f| {
                            f.kind == "valkey_restart_snapshot" && f.healed_ns <= sample.at_ns
                        })
                        .map(|f| sample.at_ns - f.healed_ns)
                        .min()
                        .filter(|since| *since < 10_000_000_000)
                        .map(|since| {
                            format!(
                                " ({:.1} s after Valkey was restored from its snapshot)",
                                since as f64 / 1e9
                            )
                        })
                        .unwrap_or_default();
                    found.push((
                        run.op,
                        format!(
                            "{} was {state} in the pool read at {}..{} while this code ran on it{restored}",
                            run.worker, sample.requested_ns, sample.at_ns
                        ),
                    ));
                    break;
                }
            }
        }
        for (op, detail) in found {
            self.violation("ran_without_lease", detail, &[op]);
        }
    }

    /// No member ever had more operations executing at once than its limit.
    fn member_limit(&mut self) {
        let limit = self.history.member_limit;
        if limit == 0 {
            return;
        }
        let mut by_member: BTreeMap<&str, Vec<Execution<'a>>> = BTreeMap::new();
        for execution in self.executions() {
            by_member
                .entry(&execution.op.member)
                .or_default()
                .push(execution);
        }
        for (member, runs) in by_member {
            let mut edges: Vec<(Nanos, i32, &Op)> = Vec::new();
            // An instant (a session seen held only by its open's answer) overlaps nothing.
            for run in runs.iter().filter(|run| run.end > run.start) {
                edges.push((run.start, 1, run.op));
                edges.push((run.end, -1, run.op));
            }
            // Ends before starts at the same instant.
            edges.sort_by_key(|(at, delta, op)| (*at, *delta, op.id));
            let mut open: Vec<&Op> = Vec::new();
            for (_, delta, op) in edges {
                if delta < 0 {
                    open.retain(|o| o.id != op.id);
                    continue;
                }
                open.push(op);
                if open.len() > limit as usize {
                    let involved = open.clone();
                    self.violation(
                        "member_limit",
                        format!(
                            "member {member} had {} operations executing at once (limit {limit})",
                            involved.len()
                        ),
                        &involved,
                    );
                    return;
                }
            }
        }
    }

    /// Per workspace and per kernel: what a succeeded operation saw is exactly what the
    /// operations before it left, with nothing lost, repeated, reordered or invented.
    fn streams(&mut self) {
        let mut streams: BTreeMap<(Kind, &str, &str), Vec<&'a Op>> = BTreeMap::new();
        for op in self
            .history
            .ops
            .iter()
            .filter(|op| op.kind != Kind::Browser)
        {
            streams
                .entry((op.kind, &op.actor, &op.conversation))
                .or_default()
                .push(op);
        }
        for ((kind, actor, conversation), ops) in streams {
            let writer: BTreeMap<&str, &Op> =
                ops.iter().map(|op| (op.token.as_str(), *op)).collect();
            let succeeded: Vec<&Op> = ops
                .iter()
                .copied()
                .filter(|op| matches!(op.answer, Answer::Succeeded { .. }))
                .collect();
            // Each lost token is reported once, at the first operation that should have seen it;
            // each reordered pair once.
            let mut reported: BTreeSet<&str> = BTreeSet::new();
            let mut reordered: BTreeSet<(u64, u64)> = BTreeSet::new();
            let (lost, repeated) = match kind {
                Kind::Workspace | Kind::Browser => ("lost_write", "duplicate_write"),
                Kind::Kernel => ("lost_element", "duplicate_element"),
            };
            for reader in &succeeded {
                let Answer::Succeeded {
                    seen, generation, ..
                } = &reader.answer
                else {
                    continue;
                };
                let mut positions: BTreeMap<&str, usize> = BTreeMap::new();
                for (index, token) in seen.iter().enumerate() {
                    if positions.insert(token.as_str(), index).is_some() {
                        let writer_op = writer.get(token.as_str()).copied();
                        let involved: Vec<&Op> = writer_op.into_iter().chain([*reader]).collect();
                        self.violation(
                            repeated,
                            format!("{actor}/{conversation}: token {token} seen twice"),
                            &involved,
                        );
                    }
                    match writer.get(token.as_str()) {
                        None => self.violation(
                            "phantom",
                            format!("{actor}/{conversation}: token {token} was never written"),
                            &[*reader],
                        ),
                        Some(w) if w.id == reader.id || w.start_ns >= reader.end_ns => self
                            .violation(
                                "phantom",
                                format!(
                                    "{actor}/{conversation}: token {token} seen before it was written"
                                ),
                                &[*w, *reader],
                            ),
                        Some(w) if matches!(w.answer, Answer::Refused { .. }) => self.violation(
                            "refused_applied",
                            format!(
                                "{actor}/{conversation}: token {token} of a refused operation was kept"
                            ),
                            &[*w, *reader],
                        ),
                        Some(_) => {}
                    }
                }
                for before in &succeeded {
                    if before.end_ns >= reader.start_ns {
                        continue;
                    }
                    if !positions.contains_key(before.token.as_str())
                        && reported.insert(before.token.as_str())
                    {
                        self.violation(
                            lost,
                            format!(
                                "{actor}/{conversation}: token {} of a succeeded operation is gone",
                                before.token
                            ),
                            &[*before, *reader],
                        );
                    }
                    if kind == Kind::Workspace {
                        let Answer::Succeeded {
                            generation: earlier,
                            ..
                        } = &before.answer
                        else {
                            continue;
                        };
                        if let (Some(earlier), Some(later)) = (earlier, generation)
                            && later <= earlier
                        {
                            self.violation(
                                "generation_regressed",
                                format!(
                                    "{actor}/{conversation}: generation {later} saved after {earlier}"
                                ),
                                &[*before, *reader],
                            );
                        }
                    }
                }
                // Order: of two succeeded operations one after the other, the earlier's token
                // comes first. Swept by start time against the largest position among those
                // already ended, so a long history is checked in n log n per reader.
                let mut shown: Vec<(&Op, usize)> = succeeded
                    .iter()
                    .filter_map(|op| positions.get(op.token.as_str()).map(|p| (*op, *p)))
                    .collect();
                let mut by_end = shown.clone();
                by_end.sort_by_key(|(op, _)| op.end_ns);
                shown.sort_by_key(|(op, _)| op.start_ns);
                let mut ended = 0;
                let mut furthest: Option<(&Op, usize)> = None;
                for (second, at) in shown {
                    while let Some(&(op, position)) = by_end.get(ended)
                        && op.end_ns < second.start_ns
                    {
                        if furthest.is_none_or(|(_, p)| position > p) {
                            furthest = Some((op, position));
                        }
                        ended += 1;
                    }
                    if let Some((first, position)) = furthest
                        && position > at
                        && reordered.insert((first.id, second.id))
                    {
                        self.violation(
                            "reordered",
                            format!(
                                "{actor}/{conversation}: {} seen after {}, written the other way round",
                                first.token, second.token
                            ),
                            &[first, second, *reader],
                        );
                    }
                }
            }
        }
    }

    /// An install answered `succeeded` ran its code with the package the harness's registry
    /// serves, installed through the broker: the code printed the run's mark.
    fn installs(&mut self) {
        let mark = &self.history.mark;
        let unproven: Vec<&'a Op> = self
            .history
            .ops
            .iter()
            .filter(|op| op.via == Via::Install && matches!(op.answer, Answer::Succeeded { .. }))
            .filter(|op| op.mark.as_ref() != Some(mark))
            .collect();
        for op in unproven {
            self.violation(
                "install_unproven",
                format!(
                    "a succeeded install printed the mark {:?}, not the registry's {mark:?}",
                    op.mark
                ),
                &[op],
            );
        }
    }

    /// Egress (EGR-2, EGR-8): no connection ever reached the canary, an address the policy never
    /// admits (a mixed answer of the target and the canary must be rejected whole); a fetch
    /// answered 200 got what the target answers for its own path; a refusal (from the proxy, or
    /// the worker's relay when the proxy cannot be reached) carries a stable reason code.
    fn fetches(&mut self) {
        if !self.history.canary_hits.is_empty() {
            let dns_mixed: Vec<String> = self
                .history
                .faults
                .iter()
                .filter(|f| f.kind == "dns_mixed")
                .map(|f| format!("{}..{}", f.at_ns, f.healed_ns))
                .collect();
            self.violation(
                "egress_reached_forbidden",
                format!(
                    "the canary, which the policy never admits, was reached {} time(s): {:?} \
                     (mixed DNS answers at {dns_mixed:?})",
                    self.history.canary_hits.len(),
                    self.history.canary_hits
                ),
                &[],
            );
        }
        let mut found: Vec<(&'static str, String, &'a Op)> = Vec::new();
        for op in &self.history.ops {
            let Some(fetched) = &op.fetched else {
                continue;
            };
            let expected = format!("{} /{}", self.history.mark, op.token);
            if fetched.status == 200 && fetched.said != expected {
                found.push((
                    "egress_forged",
                    format!(
                        "a fetch answered 200 said {:?}, not {expected:?}",
                        fetched.said
                    ),
                    op,
                ));
            }
            if fetched.status >= 400 && !is_stable_code(&fetched.said) {
                found.push((
                    "refusal_without_code",
                    format!(
                        "a fetch refused {} carried the reason {:?}",
                        fetched.status, fetched.said
                    ),
                    op,
                ));
            }
        }
        for (rule, detail, op) in found {
            self.violation(rule, detail, &[op]);
        }
    }

    /// Browser sessions (BROW-13): a session's page starts empty (nothing of an earlier session
    /// on its worker), keeps every token its answered actions pushed, and a worker whose close
    /// was not confirmed clean is never used again. (A session also holds its worker alone and
    /// under its lease: it is one of [`Checker::executions`].)
    fn sessions(&mut self) {
        let sessions: Vec<(&'a Op, &'a crate::history::Session)> = self
            .history
            .ops
            .iter()
            .filter_map(|op| op.session.as_ref().map(|s| (op, s)))
            .collect();
        let executions = self.executions();
        let mut found: Vec<(&'static str, String, Vec<&'a Op>)> = Vec::new();
        for (op, session) in &sessions {
            let mut pushed: BTreeSet<&str> = BTreeSet::new();
            let mut kept: Vec<&str> = Vec::new();
            for act in &session.acts {
                pushed.insert(&act.token);
                let Some(seen) = &act.seen else {
                    continue;
                };
                if let Some(foreign) = seen.iter().find(|t| !pushed.contains(t.as_str())) {
                    found.push((
                        "browser_state_leaked",
                        format!(
                            "session {} on {}: action {} saw {foreign}, which no action of this session pushed",
                            session.id, session.worker, act.token
                        ),
                        vec![*op],
                    ));
                }
                if let Some(lost) = kept
                    .iter()
                    .chain([&act.token.as_str()])
                    .find(|t| !seen.iter().any(|s| s == **t))
                {
                    found.push((
                        "browser_state_lost",
                        format!(
                            "session {} on {}: action {} did not see {lost}, pushed by an answered action",
                            session.id, session.worker, act.token
                        ),
                        vec![*op],
                    ));
                }
                kept.push(&act.token);
            }
            if session.confirmed == Some(false)
                && let Some(close_sent) = session.close_sent_ns
                && let Some(later) = executions
                    .iter()
                    .find(|e| e.op.id != op.id && e.worker == session.worker && e.end > close_sent)
            {
                found.push((
                    "browser_worker_reused",
                    format!(
                        "{} ran an operation after session {}'s close was not confirmed clean",
                        session.worker, session.id
                    ),
                    vec![*op, later.op],
                ));
            }
        }
        for (rule, detail, ops) in found {
            self.violation(rule, detail, &ops);
        }
    }

    /// Every refusal and every failure the API answered with an error status carries a stable
    /// code; every outcome named is one of corral-core's.
    fn codes(&mut self) {
        let outcomes: BTreeSet<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        for op in &self.history.ops {
            match &op.answer {
                Answer::Refused { code, .. } => match code {
                    Some(code) if is_stable_code(code) => {}
                    _ => self.violation("refusal_without_code", "a refusal".to_owned(), &[op]),
                },
                Answer::Failed {
                    status,
                    code,
                    outcome,
                } => {
                    if let Some(outcome) = outcome
                        && !outcomes.contains(outcome.as_str())
                    {
                        self.violation(
                            "unknown_outcome",
                            format!("outcome {outcome:?} is not one of corral-core's"),
                            &[op],
                        );
                    }
                    let needs_code = *status >= 400 || outcome.as_deref() == Some("error");
                    if needs_code && !code.as_deref().is_some_and(is_stable_code) {
                        self.violation(
                            "refusal_without_code",
                            format!("an error answer ({status})"),
                            &[op],
                        );
                    }
                }
                Answer::Succeeded { .. } | Answer::NoAnswer { .. } => {}
            }
        }
    }

    /// Never more workers allocated than the ceiling.
    fn ceiling(&mut self) {
        let ceiling = self.history.ceiling;
        if let Some(sample) = self
            .history
            .pool
            .iter()
            .find(|sample| sample.allocated > ceiling)
        {
            let sample = sample.clone();
            self.violation(
                "ceiling",
                format!(
                    "{} workers allocated at {} (ceiling {ceiling})",
                    sample.allocated, sample.at_ns
                ),
                &[],
            );
        }
    }

    fn recovered_after(&self, at: Nanos, quarantine_too: bool) -> Option<Nanos> {
        self.history
            .pool
            .iter()
            .find(|s| {
                s.at_ns >= at
                    && s.warm >= self.history.warm_target
                    && (!quarantine_too || s.quarantined == 0)
            })
            .map(|s| s.at_ns - at)
    }

    fn summary(&self) -> Summary {
        let mut summary = Summary::default();
        for op in &self.history.ops {
            *summary.answers.entry(answer_name(&op.answer)).or_default() += 1;
            let by_via = match op.via {
                Via::Edit => Some(&mut summary.edits),
                Via::Install => Some(&mut summary.installs),
                Via::Session => Some(&mut summary.sessions),
                Via::Run => None,
            };
            if let Some(counts) = by_via {
                *counts.entry(answer_name(&op.answer)).or_default() += 1;
            }
            if let Some(fetched) = &op.fetched {
                let what = match fetched.status {
                    200 => "200".to_owned(),
                    0 => format!("no answer ({})", fetched.said),
                    status => format!("{status} {}", fetched.said),
                };
                *summary.fetches.entry(what).or_default() += 1;
            }
            if let Some(session) = &op.session {
                let close = match session.confirmed {
                    Some(true) => Some("confirmed"),
                    Some(false) => Some("unconfirmed"),
                    None => None,
                };
                if let Some(close) = close {
                    *summary.sessions.entry(close).or_default() += 1;
                }
                *summary.sessions.entry("actions").or_default() +=
                    session.acts.iter().filter(|a| a.seen.is_some()).count() as u64;
            }
            let code = match &op.answer {
                Answer::Refused { code, .. } | Answer::Failed { code, .. } => code.clone(),
                _ => None,
            };
            if let Some(code) = code {
                *summary.codes.entry(code).or_default() += 1;
            }
        }
        for fault in &self.history.faults {
            *summary.faults.entry(fault.kind.clone()).or_default() += 1;
            if let Some(took) = self.recovered_after(fault.healed_ns, false)
                && summary
                    .longest_recovery
                    .as_ref()
                    .is_none_or(|(t, _)| took > *t)
            {
                summary.longest_recovery =
                    Some((took, format!("{} of {}", fault.kind, fault.target)));
            }
        }
        if self.history.quiet_ns > 0 {
            summary.final_recovery = self.recovered_after(self.history.quiet_ns, true);
        }
        summary
    }
}

#[cfg(test)]
mod tests;
