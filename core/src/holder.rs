//! The lease holder: one lease, from its grant to the end of its business with the pool, as a
//! sans-IO state machine (or one ticket its owner gave up on, being withdrawn).
//!
//! It decides when a heartbeat is due, what each answer means (a refused heartbeat is a lost lease,
//! and the run must learn it), how the lease ends (a release with a [`Disposition`]), and what to do
//! with every effect the pool returns: a `Reset` is performed once and its evidence reported; a
//! `Delete` (a Discard release, or a takeover found by a late heartbeat) is handed to the shell,
//! never dropped. What a missing answer means is decided here too: a heartbeat without an answer is
//! sent again, and with no renewal confirmed by `asked_at + lease_ttl` the lease counts as lost; a
//! release without an answer is sent again until the lease would have expired anyway.
//!
//! # How a shell drives it
//!
//! Inputs are `handle_*(…, now)`; outputs are the `#[must_use]` `poll_*` methods. After every
//! input, drain every output before waiting again (STYLE.md item 3). `now` is the shell's monotonic
//! clock ([`MonoMillis`]); the holder never sees deployment time.
//!
//! ```text
//! let mut holder = LeaseHolder::granted(grant, asked_at, HolderConfig::from_pool(&pool), now);
//! loop {
//!     while let Some(command) = holder.poll_command() {      // at most one out at a time
//!         spawn: answer = store.commit(&command, &pool, RETRIES)   // Option<Applied>: None = no answer
//!                -> holder.handle_committed(answer, now)
//!     }
//!     while let Some(effect) = holder.poll_effect() {
//!         match effect {
//!             Effect::Reset { worker, token } => spawn: evidence = workers.reset(worker, token)
//!                                                  -> holder.handle_reset(worker, token, evidence, now),
//!             Effect::Delete { .. } | Effect::Create { .. } => perform it, or hand it to the controller
//!                                                  (its reconciler takes it with `handle_handoff`),
//!         }
//!     }
//!     while let Some(event) = holder.poll_event() {
//!         match event {
//!             HolderEvent::Lost(reason) => tell the run: its lease is gone, its result is not trusted,
//!             HolderEvent::Ended(ending) => record how the lease ended,
//!         }
//!     }
//!     if holder.is_done() { break }
//!     wait (biased) for: the run ending -> holder.handle_release(disposition, now),
//!                        an answer or an evidence (above),
//!                        sleep until holder.poll_timeout() -> holder.handle_timeout(now)
//! }
//! ```
//!
//! A holder whose owner stopped waiting for a ticket is [`LeaseHolder::withdrawing`]: it sends the
//! `Cancel` and performs whatever the answer orders (a lease granted meanwhile ends with a reset).

use std::collections::{BTreeMap, VecDeque};

use crate::ids::{OpToken, TicketId, WorkerId};
use crate::pool::{
    Applied, Command, Disposition, Effect, Event, PoolConfig, Refusal, RemovalReason,
};
use crate::reset::ResetEvidence;
use crate::time::MonoMillis;

/// The most resets one holder tracks at once (a lease is on one worker; a repeated release re-issues
/// the same reset). Beyond it, a reset is still handed out but not deduplicated.
pub const RESET_JOBS_MAX: usize = 8;
/// The most effects waiting to be polled.
pub const EFFECTS_MAX: usize = 64;

/// The timings a holder runs by, all from the pool's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderConfig {
    /// `SANDBOX_LEASE_HEARTBEAT_SECONDS`: how often the lease is renewed.
    pub heartbeat_ms: u64,
    /// `SANDBOX_LEASE_TTL_SECONDS`: how long the lease lives without a renewal.
    pub lease_ttl_ms: u64,
    /// `CORRAL_RESET_TIMEOUT_SECONDS`: after this a reset's evidence is no longer worth reporting.
    pub reset_timeout_ms: u64,
    /// How long a command that got no answer waits before it is sent again.
    pub retry_ms: u64,
}

impl HolderConfig {
    /// The holder's timings for `pool`: a command without an answer is sent again after a quarter
    /// of a heartbeat period.
    #[must_use]
    pub fn from_pool(pool: &PoolConfig) -> Self {
        Self {
            heartbeat_ms: pool.lease_heartbeat_ms.max(1),
            lease_ttl_ms: pool.lease_ttl_ms.max(1),
            reset_timeout_ms: pool.reset_timeout_ms.max(1),
            retry_ms: (pool.lease_heartbeat_ms / 4).max(1),
        }
    }
}

/// A lease the pool granted: what every heartbeat and the release must carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The ticket, which is also the lease's id.
    pub ticket: TicketId,
    /// The leased worker.
    pub worker: WorkerId,
    /// The token the grant carried.
    pub token: OpToken,
}

/// Why the lease is gone without its holder releasing it. The run must be told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// The pool refused a heartbeat or the release.
    Refused(Refusal),
    /// The pool took the lease away (expired, claim over, worker gone).
    TakenOver(RemovalReason),
    /// No renewal was confirmed before the lease would have expired (the store did not answer).
    Unconfirmed,
}

/// How the holder's business with the lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The release was applied.
    Released,
    /// The lease was lost (a [`HolderEvent::Lost`] said why).
    Lost,
    /// The release got no answer before the lease would have expired, or an answer that cannot
    /// tell whether an earlier attempt was applied: the pool takes the worker over if it was not.
    Unconfirmed,
    /// The ticket was withdrawn (or was already gone); a lease granted meanwhile was released.
    Withdrawn,
}

/// What the holder tells its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderEvent {
    /// The lease is gone: stop trusting the run on it. Emitted at most once.
    Lost(LossReason),
    /// The holder's business with the lease is over (resets may still be reported). Emitted once.
    Ended(Ending),
}

/// A timer of the holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKind {
    /// The next heartbeat is due.
    Heartbeat,
    /// Without a confirmed renewal, the lease may have expired by now.
    LeaseDeadline,
    /// A command that got no answer may be sent again.
    Retry,
}

impl crate::time::TimerKind for TimerKind {
    const ALL: &'static [Self] = &[Self::Heartbeat, Self::LeaseDeadline, Self::Retry];

    fn index(self) -> usize {
        match self {
            Self::Heartbeat => 0,
            Self::LeaseDeadline => 1,
            Self::Retry => 2,
        }
    }
}

/// The deadline table: one optional deadline per [`TimerKind`].
type Timers = crate::time::Deadlines<TimerKind, 3>;

/// Where the lease stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Held: heartbeats go out when due.
    Holding,
    /// The run ended: the release goes out until answered. `unanswered` when an attempt got no
    /// answer (it may have been applied).
    Releasing {
        disposition: Disposition,
        unanswered: bool,
    },
    /// The ticket is being withdrawn (until the lease deadline, when trying stops).
    Withdrawing,
    /// Nothing more to send about the lease itself.
    Over(Ending),
}

/// The one command out, awaiting its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Sent {
    Heartbeat { at: MonoMillis },
    Release,
    Cancel,
    ResetReport { worker: WorkerId, token: OpToken },
}

/// A reset this holder was ordered to perform.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ResetStep {
    /// Handed to the shell; its evidence is awaited.
    Performing,
    /// Evidence in hand; the report goes out.
    Reporting(ResetEvidence),
    /// Reported (or abandoned): a re-issued order for it is not performed again.
    Finished,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ResetJob {
    step: ResetStep,
    /// After this the pool has timed the reset out; a report would only be stale.
    deadline: MonoMillis,
}

/// One lease's holder. See the module documentation for the calling contract.
#[derive(Clone, Debug)]
pub struct LeaseHolder {
    ticket: TicketId,
    /// The lease, when one was granted to this holder (a withdrawing holder has none).
    grant: Option<Grant>,
    config: HolderConfig,
    phase: Phase,
    timers: Timers,
    sent: Option<Sent>,
    /// A heartbeat is due, since this instant (a lower bound of when it will be applied).
    heartbeat_due: Option<MonoMillis>,
    /// A command got no answer: nothing goes out until the retry timer fires.
    backing_off: bool,
    resets: BTreeMap<(WorkerId, OpToken), ResetJob>,
    effects: VecDeque<Effect>,
    events: VecDeque<HolderEvent>,
    lost_told: bool,
    ended_told: bool,
}

impl LeaseHolder {
    /// A holder of `grant`. `asked_at` is when the acquire was first sent: the grant was applied no
    /// earlier, so the lease cannot expire before `asked_at + lease_ttl`.
    #[must_use]
    pub fn granted(
        grant: Grant,
        asked_at: MonoMillis,
        config: HolderConfig,
        now: MonoMillis,
    ) -> Self {
        let mut holder = Self::blank(grant.ticket, Some(grant), config, Phase::Holding);
        holder
            .timers
            .set(TimerKind::Heartbeat, Some(now.plus_ms(config.heartbeat_ms)));
        holder.timers.set(
            TimerKind::LeaseDeadline,
            Some(asked_at.min(now).plus_ms(config.lease_ttl_ms)),
        );
        holder.invariants();
        holder
    }

    /// A holder that withdraws `ticket` (its owner stopped waiting). If the ticket was granted
    /// meanwhile, the lease is released with a reset, and the reset performed like any other.
    #[must_use]
    pub fn withdrawing(ticket: TicketId, config: HolderConfig, now: MonoMillis) -> Self {
        let mut holder = Self::blank(ticket, None, config, Phase::Withdrawing);
        // A granted lease outlives an unanswered cancel by at most its time to live.
        holder.timers.set(
            TimerKind::LeaseDeadline,
            Some(now.plus_ms(config.lease_ttl_ms)),
        );
        holder.invariants();
        holder
    }

    fn blank(ticket: TicketId, grant: Option<Grant>, config: HolderConfig, phase: Phase) -> Self {
        Self {
            ticket,
            grant,
            config,
            phase,
            timers: Timers::default(),
            sent: None,
            heartbeat_due: None,
            backing_off: false,
            resets: BTreeMap::new(),
            effects: VecDeque::new(),
            events: VecDeque::new(),
            lost_told: false,
            ended_told: false,
        }
    }

    /// The ticket (and lease id) this holder is about.
    #[must_use]
    pub fn ticket(&self) -> TicketId {
        self.ticket
    }

    /// The lease it was granted, if it holds one (a withdrawing holder does not).
    #[must_use]
    pub fn grant(&self) -> Option<Grant> {
        self.grant
    }

    /// True while the lease is held and not known lost: the run may go on.
    #[must_use]
    pub fn holds(&self) -> bool {
        matches!(self.phase, Phase::Holding)
    }

    /// True when nothing remains: the lease's business is over, no command is out, no reset is
    /// pending and every output was polled. The shell may drop the holder.
    #[must_use]
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Over(_))
            && self.sent.is_none()
            && self.effects.is_empty()
            && self.events.is_empty()
            && self
                .resets
                .values()
                .all(|job| job.step == ResetStep::Finished)
    }

    /// The run ended: release the lease with `disposition`. Ignored unless the lease is held (after
    /// a loss there is nothing to release; a second release is the first one's repeat).
    pub fn handle_release(&mut self, disposition: Disposition, now: MonoMillis) {
        let _ = now;
        match self.phase {
            Phase::Holding => {
                self.phase = Phase::Releasing {
                    disposition,
                    unanswered: false,
                };
                self.heartbeat_due = None;
                self.timers.set(TimerKind::Heartbeat, None);
            }
            Phase::Releasing { .. } | Phase::Withdrawing | Phase::Over(_) => {}
        }
        self.invariants();
    }

    /// The answer to the command last polled: `Some` when the store applied it, `None` when the
    /// store gave no answer (unreachable, or the outcome stayed unknown after the shell's retries).
    pub fn handle_committed(&mut self, answer: Option<Applied>, now: MonoMillis) {
        let Some(sent) = self.sent.take() else {
            // An answer to nothing: the shell's mistake, harmless here.
            return;
        };
        match answer {
            None => self.unanswered(&sent, now),
            Some(applied) => {
                self.take_effects(&applied, now);
                match sent {
                    Sent::Heartbeat { at } => self.heartbeat_answered(&applied, at, now),
                    Sent::Release => self.release_answered(&applied),
                    Sent::Cancel => self.cancel_answered(),
                    Sent::ResetReport { worker, token } => {
                        if let Some(job) = self.resets.get_mut(&(worker, token)) {
                            job.step = ResetStep::Finished;
                        }
                    }
                }
            }
        }
        self.invariants();
    }

    /// The evidence of a reset this holder handed out: `None` when the worker did not answer (no
    /// evidence is no proof: the pool's reset deadline discards the worker).
    pub fn handle_reset(
        &mut self,
        worker: WorkerId,
        token: OpToken,
        evidence: Option<ResetEvidence>,
        now: MonoMillis,
    ) {
        let _ = now;
        if let Some(job) = self.resets.get_mut(&(worker, token))
            && job.step == ResetStep::Performing
        {
            job.step = match evidence {
                Some(evidence) => ResetStep::Reporting(evidence),
                None => ResetStep::Finished,
            };
        }
        self.invariants();
    }

    /// Fires every timer that is due; a call with nothing due changes nothing.
    pub fn handle_timeout(&mut self, now: MonoMillis) {
        for kind in self.timers.take_due(now) {
            self.fire(kind, now);
        }
        for job in self.resets.values_mut() {
            if job.deadline <= now && job.step != ResetStep::Finished {
                // The pool has timed this reset out: its report would be stale.
                job.step = ResetStep::Finished;
            }
        }
        self.invariants();
    }

    /// The next command to commit to the store, if one is due and none is out.
    #[must_use]
    pub fn poll_command(&mut self) -> Option<Command> {
        if self.sent.is_some() || self.backing_off {
            return None;
        }
        let (sent, command) = match (self.phase, self.grant) {
            (Phase::Releasing { disposition, .. }, Some(grant)) => (
                Sent::Release,
                Command::Release {
                    worker: grant.worker,
                    lease: grant.ticket,
                    token: grant.token,
                    disposition,
                },
            ),
            (Phase::Withdrawing, _) => (
                Sent::Cancel,
                Command::Cancel {
                    ticket: self.ticket,
                },
            ),
            (Phase::Holding, Some(grant)) if self.heartbeat_due.is_some() => {
                // When it became due bounds from below when it is applied: see
                // `heartbeat_answered`.
                let at = self.heartbeat_due.take().unwrap_or_default();
                (
                    Sent::Heartbeat { at },
                    Command::Heartbeat {
                        worker: grant.worker,
                        lease: grant.ticket,
                        token: grant.token,
                    },
                )
            }
            (Phase::Holding | Phase::Releasing { .. } | Phase::Over(_), _) => {
                self.next_reset_report()?
            }
        };
        self.sent = Some(sent);
        Some(command)
    }

    /// The next effect to perform (or to hand to whoever can), in the order the pool gave them.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// The next thing the owner must learn.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<HolderEvent> {
        self.events.pop_front()
    }

    /// When `handle_timeout` must next be called, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<MonoMillis> {
        let jobs = self
            .resets
            .values()
            .filter(|job| job.step != ResetStep::Finished)
            .map(|job| job.deadline)
            .min();
        match (self.timers.earliest(), jobs) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn next_reset_report(&self) -> Option<(Sent, Command)> {
        self.resets
            .iter()
            .find_map(|((worker, token), job)| match &job.step {
                ResetStep::Reporting(evidence) => Some((
                    Sent::ResetReport {
                        worker: *worker,
                        token: *token,
                    },
                    Command::ResetReported {
                        worker: *worker,
                        token: *token,
                        evidence: evidence.clone(),
                    },
                )),
                ResetStep::Performing | ResetStep::Finished => None,
            })
    }

    fn fire(&mut self, kind: TimerKind, now: MonoMillis) {
        match kind {
            TimerKind::Heartbeat => {
                let next = match self.phase {
                    Phase::Holding => {
                        self.heartbeat_due = self.heartbeat_due.or(Some(now));
                        Some(now.plus_ms(self.config.heartbeat_ms))
                    }
                    Phase::Releasing { .. } | Phase::Withdrawing | Phase::Over(_) => None,
                };
                self.timers.set(TimerKind::Heartbeat, next);
            }
            TimerKind::LeaseDeadline => {
                self.timers.set(TimerKind::LeaseDeadline, None);
                match self.phase {
                    Phase::Holding => self.lose(LossReason::Unconfirmed),
                    Phase::Releasing { .. } | Phase::Withdrawing => {
                        self.end(Ending::Unconfirmed);
                    }
                    Phase::Over(_) => {}
                }
            }
            TimerKind::Retry => {
                self.timers.set(TimerKind::Retry, None);
                self.backing_off = false;
            }
        }
    }

    /// A command got no answer: it may or may not have been applied. Wait, then send it again
    /// (every command is idempotent) while it is still worth sending.
    fn unanswered(&mut self, sent: &Sent, now: MonoMillis) {
        match sent {
            Sent::Heartbeat { .. } => {
                if self.phase == Phase::Holding {
                    self.heartbeat_due = self.heartbeat_due.or(Some(now));
                }
            }
            Sent::Release => {
                if let Phase::Releasing { disposition, .. } = self.phase {
                    self.phase = Phase::Releasing {
                        disposition,
                        unanswered: true,
                    };
                }
            }
            Sent::Cancel | Sent::ResetReport { .. } => {}
        }
        self.backing_off = true;
        self.timers
            .set(TimerKind::Retry, Some(now.plus_ms(self.config.retry_ms)));
    }

    fn heartbeat_answered(&mut self, applied: &Applied, sent_at: MonoMillis, now: MonoMillis) {
        let lease = self.ticket;
        for event in &applied.events {
            match event {
                // Renewed no earlier than it was due: the lease lives at least this long. (A
                // renewal that answers after a release or a loss changes nothing.)
                Event::Renewed { lease: renewed, .. }
                    if *renewed == lease && self.phase == Phase::Holding =>
                {
                    let deadline = sent_at.min(now).plus_ms(self.config.lease_ttl_ms);
                    let current = self.timers.get(TimerKind::LeaseDeadline);
                    self.timers
                        .set(TimerKind::LeaseDeadline, current.max(Some(deadline)));
                }
                Event::Refused { ticket, reason } if *ticket == lease => {
                    self.lose(LossReason::Refused(*reason));
                }
                Event::LeaseLost {
                    lease: lost,
                    reason,
                    ..
                } if *lost == lease => self.lose(LossReason::TakenOver(*reason)),
                _ => {}
            }
        }
    }

    fn release_answered(&mut self, applied: &Applied) {
        let lease = self.ticket;
        let unanswered_before = matches!(
            self.phase,
            Phase::Releasing {
                unanswered: true,
                ..
            }
        );
        for event in &applied.events {
            match event {
                Event::Released { lease: released } if *released == lease => {
                    self.end(Ending::Released);
                }
                Event::LeaseLost {
                    lease: lost,
                    reason,
                    ..
                } if *lost == lease => self.lose(LossReason::TakenOver(*reason)),
                Event::Refused { ticket, reason } if *ticket == lease => match reason {
                    // An earlier attempt may have released it already: nothing proves a loss.
                    Refusal::LeaseUnknown if unanswered_before => self.end(Ending::Unconfirmed),
                    _ => self.lose(LossReason::Refused(*reason)),
                },
                _ => {}
            }
        }
        if matches!(self.phase, Phase::Releasing { .. }) {
            // An answer that says nothing about the lease proves nothing either way.
            self.end(Ending::Unconfirmed);
        }
    }

    fn cancel_answered(&mut self) {
        // Whether it waited, had been granted (and is now released, its reset among the effects)
        // or was already gone, the owner never used it: the ticket's business is over.
        self.end(Ending::Withdrawn);
    }

    /// Every effect of an answer is handed out; a reset already ordered under the same token is
    /// not performed twice (a repeated release re-issues it).
    fn take_effects(&mut self, applied: &Applied, now: MonoMillis) {
        for effect in &applied.effects {
            if let Effect::Reset { worker, token } = effect {
                if self.resets.contains_key(&(*worker, *token)) {
                    continue;
                }
                if self.resets.len() < RESET_JOBS_MAX {
                    self.resets.insert(
                        (*worker, *token),
                        ResetJob {
                            step: ResetStep::Performing,
                            deadline: now.plus_ms(self.config.reset_timeout_ms),
                        },
                    );
                }
            }
            assert!(
                self.effects.len() < EFFECTS_MAX,
                "holder of {} has {EFFECTS_MAX} effects unpolled: the shell is not draining",
                self.ticket
            );
            self.effects.push_back(effect.clone());
        }
    }

    fn lose(&mut self, reason: LossReason) {
        if !self.lost_told {
            self.lost_told = true;
            self.events.push_back(HolderEvent::Lost(reason));
        }
        self.end(Ending::Lost);
    }

    fn end(&mut self, ending: Ending) {
        if matches!(self.phase, Phase::Over(_)) {
            return;
        }
        self.phase = Phase::Over(ending);
        self.heartbeat_due = None;
        self.timers.set(TimerKind::Heartbeat, None);
        self.timers.set(TimerKind::LeaseDeadline, None);
        assert!(!self.ended_told, "holder of {} ended twice", self.ticket);
        self.ended_told = true;
        self.events.push_back(HolderEvent::Ended(ending));
    }

    /// What must hold after every input.
    pub fn invariants(&self) {
        let ticket = self.ticket;
        match self.phase {
            Phase::Holding => {
                assert!(
                    self.grant.is_some(),
                    "holder of {ticket} holds a lease it was never granted"
                );
                assert!(
                    self.timers.get(TimerKind::Heartbeat).is_some()
                        && self.timers.get(TimerKind::LeaseDeadline).is_some(),
                    "holder of {ticket} holds without its heartbeat and deadline timers"
                );
                assert!(!self.ended_told, "holder of {ticket} holds after it ended");
            }
            Phase::Releasing { .. } => {
                assert!(
                    self.timers.get(TimerKind::Heartbeat).is_none()
                        && self.heartbeat_due.is_none()
                        && self.grant.is_some(),
                    "holder of {ticket} heartbeats while releasing, or releases no lease"
                );
            }
            Phase::Withdrawing => {
                assert!(
                    self.timers.get(TimerKind::Heartbeat).is_none(),
                    "holder of {ticket} heartbeats a ticket it withdraws"
                );
            }
            Phase::Over(ending) => {
                assert!(
                    self.timers.get(TimerKind::Heartbeat).is_none()
                        && self.timers.get(TimerKind::LeaseDeadline).is_none()
                        && self.heartbeat_due.is_none(),
                    "holder of {ticket} keeps lease timers after it ended"
                );
                assert!(self.ended_told, "holder of {ticket} ended silently");
                assert!(
                    ending != Ending::Lost || self.lost_told,
                    "holder of {ticket} ended lost without saying why"
                );
            }
        }
        assert!(
            self.backing_off == self.timers.get(TimerKind::Retry).is_some(),
            "holder of {ticket} backs off without a retry timer, or the reverse"
        );
        assert!(
            self.resets.len() <= RESET_JOBS_MAX && self.effects.len() <= EFFECTS_MAX,
            "holder of {ticket} is over its bounds"
        );
    }
}

#[cfg(test)]
mod tests;
