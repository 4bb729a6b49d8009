//! The reconciler: the controller's passes over the pool, as a sans-IO state machine.
//!
//! It decides the order of a pass (read the published image and publish this controller's own when
//! the pool does not hold it, first of all after any outage: POOL-12; list the inventory and report
//! it; tick; perform what the pool ordered; report each outcome), a bounded budget of effects per
//! pass, and what each answer means. When the store gives no answer the pass stops and nothing else
//! is done until the next pass has read the store again: the controller never acts on a pool of its
//! own (POOL-11). A backend or worker call that is not answered within `call_timeout_ms` counts as
//! unknown: a create is reported `Unknown` (the pool quarantines it, POOL-10), a delete stays
//! unconfirmed (the pool orders it again), a reset proves nothing (the pool's reset deadline
//! discards the worker).
//!
//! # How a shell drives it
//!
//! The shell only performs: it commits a command, reads the published image, lists the backend,
//! creates, deletes, resets, and sleeps until `poll_timeout`. After every input, it drains every
//! output before waiting again. `now` is the shell's monotonic clock ([`MonoMillis`]).
//!
//! ```text
//! let mut reconciler = Reconciler::new(backend.image(), ReconcilerConfig::default(), now);
//! loop {
//!     while let Some(call) = reconciler.poll_command() {      // at most one out at a time
//!         match call {
//!             StoreCall::ReadImage => spawn: image = store.load() mapped to the document's image
//!                                     (Ok(None) when absent) -> reconciler.handle_image(image, now),
//!             StoreCall::Commit(command) => spawn: answer = store.commit(&command, &pool, RETRIES)
//!                                     -> reconciler.handle_committed(answer, now),
//!         }
//!     }
//!     while let Some(work) = reconciler.poll_effect() {
//!         match work {                                          // each may run concurrently
//!             Work::List => spawn: as_of = store.now() then present = backend.list()
//!                           -> reconciler.handle_listed(result, now),
//!             Work::Create { worker, image, claim_deadline, token } => spawn: backend.create(..)
//!                           -> reconciler.handle_created(worker, token, outcome, now),
//!             Work::Delete { worker, token } => spawn: backend.delete(worker)
//!                           -> reconciler.handle_deleted(worker, token, outcome, now),
//!             Work::Reset { worker, token } => spawn: control.reset(worker, token)
//!                           -> reconciler.handle_reset(worker, token, evidence, now),
//!         }
//!     }
//!     while let Some(event) = reconciler.poll_event() { log or count it (a pass's summary) }
//!     wait (biased) for: an answer (above), an effect handed over by a lease holder
//!                        -> reconciler.handle_handoff(effect, now), a version announcement
//!                        -> reconciler.handle_nudge(now),
//!                        sleep until reconciler.poll_timeout() -> reconciler.handle_timeout(now)
//! }
//! ```
//!
//! A controller whose image changes (a new release) is a new `Reconciler`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::ids::{ImageId, OpToken, WorkerId};
use crate::pool::{Applied, Command, Effect, Outcome};
use crate::reset::ResetEvidence;
use crate::store::Unavailable;
use crate::time::{MonoMillis, UnixMillis};

/// The most backend and worker calls out at once (each is bounded by the pool's ceiling and
/// concurrency anyway); an effect beyond it is dropped and counted, and the pool orders it again.
pub const OPERATIONS_MAX: usize = 1_024;
/// The most reports waiting to be committed.
pub const REPORTS_MAX: usize = 1_024;

/// The reconciler's timings and bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReconcilerConfig {
    /// How often a pass starts (`corral controller --period-ms`).
    pub pass_period_ms: u64,
    /// A backend or worker call not answered by then counts as unknown. Shorter than the pool's
    /// create and reset timeouts, so that its answer still counts.
    pub call_timeout_ms: u64,
    /// The most effects started per pass, reports' consequences included.
    pub pass_effects_max: u32,
    /// How often a report that got no answer is sent again before it is given up (the pool's
    /// timeouts and the next listing settle what it would have said).
    pub report_attempts_max: u32,
}

impl Default for ReconcilerConfig {
    /// Half-second passes, calls bounded at a minute, a thousand effects per pass.
    fn default() -> Self {
        Self {
            pass_period_ms: 500,
            call_timeout_ms: 60_000,
            pass_effects_max: 1_000,
            report_attempts_max: 20,
        }
    }
}

/// A request to the coordination store. At most one is out at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreCall {
    /// Read the pool document's published image; answer with [`Reconciler::handle_image`].
    ReadImage,
    /// Commit this command; answer with [`Reconciler::handle_committed`].
    Commit(Command),
}

/// A call to the backend or a worker. Several may be out at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// Read the deployment clock from the store, then list every worker the backend has; answer
    /// with [`Reconciler::handle_listed`].
    List,
    /// Create the worker; answer with [`Reconciler::handle_created`].
    Create {
        /// The worker.
        worker: WorkerId,
        /// The create's token.
        token: OpToken,
        /// The image to create it from.
        image: ImageId,
        /// The platform claim's fixed deadline, in platform-operator mode.
        claim_deadline: Option<UnixMillis>,
    },
    /// Delete the worker and confirm it absent; answer with [`Reconciler::handle_deleted`].
    Delete {
        /// The worker.
        worker: WorkerId,
        /// The delete's token.
        token: OpToken,
    },
    /// Reset the worker; answer with [`Reconciler::handle_reset`].
    Reset {
        /// The worker.
        worker: WorkerId,
        /// The reset's token.
        token: OpToken,
    },
}

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassSummary {
    /// The pass reached its tick (false: the store gave no answer and the pass stopped).
    pub coordinated: bool,
    /// The pass published this controller's image.
    pub published: bool,
    /// The inventory was listed and reported.
    pub observed: bool,
    /// Effects started during the pass.
    pub effects_started: u32,
    /// Effects dropped because the pass's budget or the bound on calls out was spent.
    pub effects_dropped: u32,
}

/// What the reconciler tells its shell (for logs and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcilerEvent {
    /// A pass ended.
    PassEnded(PassSummary),
    /// A report was given up after `report_attempts_max` attempts without an answer.
    ReportAbandoned {
        /// The worker it was about.
        worker: WorkerId,
    },
}

/// A timer of the reconciler (calls out carry their own deadlines).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKind {
    /// The next pass is due.
    Pass,
    /// The inventory listing is overdue.
    Listing,
}

impl crate::time::TimerKind for TimerKind {
    const ALL: &'static [Self] = &[Self::Pass, Self::Listing];

    fn index(self) -> usize {
        match self {
            Self::Pass => 0,
            Self::Listing => 1,
        }
    }
}

/// The deadline table: one optional deadline per [`TimerKind`].
type Timers = crate::time::Deadlines<TimerKind, 2>;

/// Where the pass stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// Between passes.
    Idle,
    /// Reading the published image.
    ReadImage,
    /// Publishing this controller's image.
    Publish,
    /// Waiting for the inventory listing.
    List,
    /// Reporting the listing.
    Observe(Command),
    /// Ticking the pool.
    Tick,
}

/// The kind of a call out to the backend or a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum OpKind {
    Create,
    Delete,
    Reset,
}

/// A report waiting to be committed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Report {
    command: Command,
    worker: WorkerId,
    attempts: u32,
}

/// The one store call out.
#[derive(Clone, Debug, PartialEq, Eq)]
enum InFlight {
    /// The pass's own step.
    Pass,
    /// A report.
    Report(Report),
}

/// The controller's reconciler. See the module documentation for the calling contract.
#[derive(Clone, Debug)]
pub struct Reconciler {
    image: ImageId,
    config: ReconcilerConfig,
    step: Step,
    timers: Timers,
    /// The last store call got no answer: reports wait until a pass has read the store again.
    store_down: bool,
    in_flight: Option<InFlight>,
    /// Whether the pending pass step's call has been handed out.
    step_sent: bool,
    reports: VecDeque<Report>,
    work: VecDeque<Work>,
    /// Calls out, with the deadline after which their outcome counts as unknown.
    operations: BTreeMap<(WorkerId, OpToken, OpKind), MonoMillis>,
    listing_out: bool,
    pass_started_at: MonoMillis,
    budget_left: u32,
    summary: PassSummary,
    events: VecDeque<ReconcilerEvent>,
}

impl Reconciler {
    /// A reconciler for a controller that creates workers from `image`. Its first pass starts at
    /// `now`, and, like every pass after an outage, reads the store before anything else.
    #[must_use]
    pub fn new(image: ImageId, config: ReconcilerConfig, now: MonoMillis) -> Self {
        let mut timers = Timers::default();
        timers.set(TimerKind::Pass, Some(now));
        let reconciler = Self {
            image,
            config,
            step: Step::Idle,
            timers,
            store_down: true,
            in_flight: None,
            step_sent: false,
            reports: VecDeque::new(),
            work: VecDeque::new(),
            operations: BTreeMap::new(),
            listing_out: false,
            pass_started_at: now,
            budget_left: config.pass_effects_max,
            summary: PassSummary::default(),
            events: VecDeque::new(),
        };
        reconciler.invariants();
        reconciler
    }

    /// The image this controller creates workers from.
    #[must_use]
    pub fn image(&self) -> &ImageId {
        &self.image
    }

    /// True between passes.
    #[must_use]
    pub fn idle(&self) -> bool {
        self.step == Step::Idle
    }

    /// Backend and worker calls out.
    #[must_use]
    pub fn calls_out(&self) -> usize {
        self.operations.len() + usize::from(self.listing_out)
    }

    /// Fires every timer and call deadline that is due; a call with nothing due changes nothing.
    pub fn handle_timeout(&mut self, now: MonoMillis) {
        for kind in self.timers.take_due(now) {
            match kind {
                TimerKind::Pass => self.start_pass(now),
                TimerKind::Listing => {
                    // No listing in time: the pass goes on without one, as when it fails.
                    self.listing_out = false;
                    if self.step == Step::List {
                        self.step = Step::Tick;
                    }
                }
            }
        }
        let overdue: Vec<(WorkerId, OpToken, OpKind)> = self
            .operations
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(key, _)| *key)
            .collect();
        for (worker, token, kind) in overdue {
            self.operations.remove(&(worker, token, kind));
            match kind {
                // Nobody can tell whether it was created (POOL-10).
                OpKind::Create => self.report(Command::CreateReported {
                    worker,
                    token,
                    outcome: Outcome::Unknown,
                }),
                // Unconfirmed: the pool orders the delete again.
                OpKind::Delete => {}
                // No evidence is no proof: the pool's reset deadline discards the worker.
                OpKind::Reset => {}
            }
        }
        self.invariants();
    }

    /// A version announcement (a ticket may wait): start a pass now if none is running.
    pub fn handle_nudge(&mut self, now: MonoMillis) {
        if self.step == Step::Idle {
            self.timers.set(TimerKind::Pass, Some(now));
        }
        self.invariants();
    }

    /// The answer to [`StoreCall::ReadImage`]: the document's published image (`Ok(None)` when the
    /// store holds no document), or `Err` when the store did not answer.
    pub fn handle_image(&mut self, image: Result<Option<ImageId>, Unavailable>, now: MonoMillis) {
        if self.in_flight != Some(InFlight::Pass) || self.step != Step::ReadImage {
            return;
        }
        self.in_flight = None;
        self.step_sent = false;
        match image {
            Err(Unavailable) => self.store_lost(now),
            Ok(published) => {
                self.store_down = false;
                if published.as_ref() == Some(&self.image) {
                    self.begin_listing(now);
                } else {
                    self.step = Step::Publish;
                }
            }
        }
        self.invariants();
    }

    /// The answer to [`StoreCall::Commit`]: `Some` when the store applied the command, `None` when
    /// it gave no answer (unreachable, or the outcome stayed unknown after the shell's retries).
    pub fn handle_committed(&mut self, answer: Option<Applied>, now: MonoMillis) {
        let Some(in_flight) = self.in_flight.take() else {
            return;
        };
        match (in_flight, answer) {
            (InFlight::Pass, None) => {
                self.step_sent = false;
                self.store_lost(now);
            }
            (InFlight::Report(mut report), None) => {
                report.attempts += 1;
                if report.attempts < self.config.report_attempts_max {
                    self.reports.push_front(report);
                } else {
                    self.events.push_back(ReconcilerEvent::ReportAbandoned {
                        worker: report.worker,
                    });
                }
                self.store_down = true;
            }
            (InFlight::Pass, Some(applied)) => {
                self.step_sent = false;
                self.take_effects(applied, now);
                self.pass_step_done(now);
            }
            (InFlight::Report(_), Some(applied)) => self.take_effects(applied, now),
        }
        self.invariants();
    }

    /// The answer to [`Work::List`]: when the listing was taken (the deployment clock, read before
    /// listing) and every worker the backend has, or `Err` when either could not be read.
    pub fn handle_listed(
        &mut self,
        listed: Result<(UnixMillis, BTreeSet<WorkerId>), Unavailable>,
        now: MonoMillis,
    ) {
        let _ = now;
        if !self.listing_out {
            // Late, after its deadline: the pass went on without it.
            return;
        }
        self.listing_out = false;
        self.timers.set(TimerKind::Listing, None);
        if self.step == Step::List {
            self.step = match listed {
                Ok((as_of, present)) => {
                    Step::Observe(Command::InventoryObserved { as_of, present })
                }
                Err(Unavailable) => Step::Tick,
            };
        }
        self.invariants();
    }

    /// The answer to [`Work::Create`].
    pub fn handle_created(
        &mut self,
        worker: WorkerId,
        token: OpToken,
        outcome: Outcome,
        now: MonoMillis,
    ) {
        let _ = now;
        if self
            .operations
            .remove(&(worker, token, OpKind::Create))
            .is_some()
        {
            self.report(Command::CreateReported {
                worker,
                token,
                outcome,
            });
        }
        self.invariants();
    }

    /// The answer to [`Work::Delete`]; `Done` only once the worker is confirmed absent.
    pub fn handle_deleted(
        &mut self,
        worker: WorkerId,
        token: OpToken,
        outcome: Outcome,
        now: MonoMillis,
    ) {
        let _ = now;
        if self
            .operations
            .remove(&(worker, token, OpKind::Delete))
            .is_some()
        {
            self.report(Command::DeleteReported {
                worker,
                token,
                outcome,
            });
        }
        self.invariants();
    }

    /// The answer to [`Work::Reset`]: the worker's evidence, or `None` when it did not answer.
    pub fn handle_reset(
        &mut self,
        worker: WorkerId,
        token: OpToken,
        evidence: Option<ResetEvidence>,
        now: MonoMillis,
    ) {
        let _ = now;
        if self
            .operations
            .remove(&(worker, token, OpKind::Reset))
            .is_some()
            && let Some(evidence) = evidence
        {
            self.report(Command::ResetReported {
                worker,
                token,
                evidence,
            });
        }
        self.invariants();
    }

    /// An effect another component could not perform (a lease holder's `Delete`): performed here.
    pub fn handle_handoff(&mut self, effect: Effect, now: MonoMillis) {
        self.enqueue(effect, now);
        self.invariants();
    }

    /// The next store call, if one is due and none is out.
    #[must_use]
    pub fn poll_command(&mut self) -> Option<StoreCall> {
        if self.in_flight.is_some() {
            return None;
        }
        let pass_call = if self.step_sent {
            None
        } else {
            match &self.step {
                Step::ReadImage => Some(StoreCall::ReadImage),
                Step::Publish => Some(StoreCall::Commit(Command::PublishImage {
                    image: self.image.clone(),
                })),
                Step::Observe(command) => Some(StoreCall::Commit(command.clone())),
                Step::Tick => Some(StoreCall::Commit(Command::Tick {
                    image: self.image.clone(),
                })),
                Step::Idle | Step::List => None,
            }
        };
        if let Some(call) = pass_call {
            self.step_sent = true;
            self.in_flight = Some(InFlight::Pass);
            return Some(call);
        }
        if self.store_down {
            // Publish first after an outage (POOL-12): reports wait for the next pass's read.
            return None;
        }
        let report = self.reports.pop_front()?;
        let command = report.command.clone();
        self.in_flight = Some(InFlight::Report(report));
        Some(StoreCall::Commit(command))
    }

    /// The next backend or worker call to make.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Work> {
        self.work.pop_front()
    }

    /// The next thing to log or count.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ReconcilerEvent> {
        self.events.pop_front()
    }

    /// When `handle_timeout` must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<MonoMillis> {
        self.timers
            .earliest()
            .into_iter()
            .chain(self.operations.values().copied())
            .min()
    }

    fn start_pass(&mut self, now: MonoMillis) {
        if self.step != Step::Idle {
            return;
        }
        self.pass_started_at = now;
        self.budget_left = self.config.pass_effects_max;
        self.summary = PassSummary::default();
        self.step = Step::ReadImage;
    }

    fn begin_listing(&mut self, now: MonoMillis) {
        self.step = Step::List;
        if !self.listing_out {
            self.listing_out = true;
            self.timers.set(
                TimerKind::Listing,
                Some(now.plus_ms(self.config.call_timeout_ms)),
            );
            self.work.push_back(Work::List);
        }
    }

    /// The pass's store call was answered: on to the next step.
    fn pass_step_done(&mut self, now: MonoMillis) {
        match self.step {
            Step::Publish => {
                self.summary.published = true;
                self.begin_listing(now);
            }
            Step::Observe(_) => {
                self.summary.observed = true;
                self.step = Step::Tick;
            }
            Step::Tick => {
                self.summary.coordinated = true;
                self.end_pass(now);
            }
            Step::Idle | Step::ReadImage | Step::List => {}
        }
    }

    /// The store gave no answer: the pass stops, and reports wait for the next pass's read.
    fn store_lost(&mut self, now: MonoMillis) {
        self.store_down = true;
        self.end_pass(now);
    }

    fn end_pass(&mut self, now: MonoMillis) {
        self.step = Step::Idle;
        let next = self
            .pass_started_at
            .plus_ms(self.config.pass_period_ms)
            .max(now);
        self.timers.set(TimerKind::Pass, Some(next));
        self.events
            .push_back(ReconcilerEvent::PassEnded(self.summary));
    }

    fn take_effects(&mut self, applied: Applied, now: MonoMillis) {
        for effect in applied.effects {
            self.enqueue(effect, now);
        }
    }

    /// Hands an effect to the shell, unless the same call is already out or the pass's budget is
    /// spent (the pool orders a dropped delete again, and times out a dropped create or reset).
    fn enqueue(&mut self, effect: Effect, now: MonoMillis) {
        let (key, work) = match effect {
            Effect::Create {
                worker,
                token,
                image,
                claim_deadline,
            } => (
                (worker, token, OpKind::Create),
                Work::Create {
                    worker,
                    token,
                    image,
                    claim_deadline,
                },
            ),
            Effect::Delete { worker, token } => (
                (worker, token, OpKind::Delete),
                Work::Delete { worker, token },
            ),
            Effect::Reset { worker, token } => (
                (worker, token, OpKind::Reset),
                Work::Reset { worker, token },
            ),
        };
        if self.operations.contains_key(&key) {
            return;
        }
        if self.budget_left == 0 || self.operations.len() >= OPERATIONS_MAX {
            self.summary.effects_dropped += 1;
            return;
        }
        self.budget_left -= 1;
        self.summary.effects_started += 1;
        self.operations
            .insert(key, now.plus_ms(self.config.call_timeout_ms));
        self.work.push_back(work);
    }

    fn report(&mut self, command: Command) {
        let worker = match &command {
            Command::CreateReported { worker, .. }
            | Command::DeleteReported { worker, .. }
            | Command::ResetReported { worker, .. } => *worker,
            _ => unreachable!("only reports are queued"),
        };
        if self.reports.len() >= REPORTS_MAX {
            // The pool's timeouts settle what it would have said.
            self.events
                .push_back(ReconcilerEvent::ReportAbandoned { worker });
            return;
        }
        self.reports.push_back(Report {
            command,
            worker,
            attempts: 0,
        });
    }

    /// What must hold after every input.
    pub fn invariants(&self) {
        assert_eq!(
            self.step == Step::Idle,
            self.timers.get(TimerKind::Pass).is_some(),
            "the pass timer is armed exactly between passes"
        );
        assert!(
            self.in_flight != Some(InFlight::Pass) || self.step_sent,
            "a pass call is out that the pass did not send"
        );
        if self.step_sent {
            assert!(
                matches!(
                    self.step,
                    Step::ReadImage | Step::Publish | Step::Observe(_) | Step::Tick
                ) && self.in_flight == Some(InFlight::Pass),
                "a pass step is marked sent with no call out for it"
            );
        }
        assert_eq!(
            self.listing_out,
            self.timers.get(TimerKind::Listing).is_some(),
            "a listing is out exactly while its deadline is armed"
        );
        assert!(
            self.step != Step::List || self.listing_out,
            "the pass waits for a listing that is not out"
        );
        assert!(
            self.operations.len() <= OPERATIONS_MAX && self.reports.len() <= REPORTS_MAX,
            "the reconciler is over its bounds"
        );
        assert!(
            self.budget_left <= self.config.pass_effects_max,
            "the pass's budget grew"
        );
        for work in &self.work {
            let key = match work {
                Work::List => continue,
                Work::Create { worker, token, .. } => (*worker, *token, OpKind::Create),
                Work::Delete { worker, token } => (*worker, *token, OpKind::Delete),
                Work::Reset { worker, token } => (*worker, *token, OpKind::Reset),
            };
            assert!(
                self.operations.contains_key(&key),
                "work handed out without a deadline: {work:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests;
