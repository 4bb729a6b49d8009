//! The faults the simulator injects and the invariants it checks, by name, with their counters.

use std::collections::BTreeMap;

use crate::rng::Rng;

/// A kind of fault. Each seed draws its own mix (swarm testing): every kind is on or off for the
/// seed, and an enabled kind has its own rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// The store refuses every request for a while.
    StoreOutage,
    /// A compare-and-set commits but its reply is lost.
    StoreLostReply,
    /// A compare-and-set does not commit and its reply is lost.
    StoreUnknownNoCommit,
    /// A compare-and-set meets a concurrent writer.
    StoreConflict,
    /// The store restarts with its data lost.
    StoreDataLoss,
    /// The store answers slowly, delaying whoever waits on it.
    StoreSlow,
    /// A create fails outright.
    CreateFails,
    /// A create succeeds but its reply is lost.
    CreateLostReply,
    /// A create hangs; it may or may not have happened.
    CreateHangs,
    /// A delete fails.
    DeleteFails,
    /// A delete succeeds but its reply is lost.
    DeleteLostReply,
    /// The inventory cannot be listed.
    InventoryUnavailable,
    /// A worker dies on its own.
    WorkerCrash,
    /// A reset leaves a process behind (and says so).
    DirtyReset,
    /// An API replica crashes and restarts.
    ReplicaCrash,
    /// The controller crashes and restarts.
    ControllerCrash,
    /// The controller restarts with a new release image.
    NewRelease,
    /// Replicas' clocks are skewed.
    ClockSkew,
    /// A report is delivered twice, the second time late.
    DuplicateReport,
}

impl Fault {
    /// Every fault kind.
    pub const ALL: [Fault; 19] = [
        Self::StoreOutage,
        Self::StoreLostReply,
        Self::StoreUnknownNoCommit,
        Self::StoreConflict,
        Self::StoreDataLoss,
        Self::StoreSlow,
        Self::CreateFails,
        Self::CreateLostReply,
        Self::CreateHangs,
        Self::DeleteFails,
        Self::DeleteLostReply,
        Self::InventoryUnavailable,
        Self::WorkerCrash,
        Self::DirtyReset,
        Self::ReplicaCrash,
        Self::ControllerCrash,
        Self::NewRelease,
        Self::ClockSkew,
        Self::DuplicateReport,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::StoreOutage => "store_outage",
            Self::StoreLostReply => "store_lost_reply",
            Self::StoreUnknownNoCommit => "store_unknown_no_commit",
            Self::StoreConflict => "store_conflict",
            Self::StoreDataLoss => "store_data_loss",
            Self::StoreSlow => "store_slow",
            Self::CreateFails => "create_fails",
            Self::CreateLostReply => "create_lost_reply",
            Self::CreateHangs => "create_hangs",
            Self::DeleteFails => "delete_fails",
            Self::DeleteLostReply => "delete_lost_reply",
            Self::InventoryUnavailable => "inventory_unavailable",
            Self::WorkerCrash => "worker_crash",
            Self::DirtyReset => "dirty_reset",
            Self::ReplicaCrash => "replica_crash",
            Self::ControllerCrash => "controller_crash",
            Self::NewRelease => "new_release",
            Self::ClockSkew => "clock_skew",
            Self::DuplicateReport => "duplicate_report",
        }
    }

    /// The highest rate (per mille of opportunities) a seed may draw for this kind.
    fn max_rate(self) -> u64 {
        match self {
            Self::StoreOutage
            | Self::StoreDataLoss
            | Self::WorkerCrash
            | Self::ReplicaCrash
            | Self::ControllerCrash => 40,
            Self::NewRelease => 500,
            Self::ClockSkew => 1000,
            Self::StoreLostReply
            | Self::StoreUnknownNoCommit
            | Self::StoreConflict
            | Self::StoreSlow => 60,
            Self::CreateFails
            | Self::CreateLostReply
            | Self::CreateHangs
            | Self::DeleteFails
            | Self::DeleteLostReply => 150,
            Self::InventoryUnavailable | Self::DirtyReset | Self::DuplicateReport => 150,
        }
    }
}

/// One seed's fault mix: a rate per mille for each enabled kind.
#[derive(Clone, Debug, Default)]
pub struct FaultMix {
    rates: BTreeMap<Fault, u64>,
}

impl FaultMix {
    /// Draws a mix: each kind enabled with probability one half, at a random rate.
    pub fn draw(rng: &mut Rng) -> Self {
        let mut rates = BTreeMap::new();
        for fault in Fault::ALL {
            if rng.chance(500) {
                rates.insert(fault, rng.range(1, fault.max_rate()));
            }
        }
        Self { rates }
    }

    /// No faults (the liveness phase).
    pub fn none() -> Self {
        Self::default()
    }

    /// The rate for `fault`, zero when disabled.
    pub fn rate(&self, fault: Fault) -> u64 {
        self.rates.get(&fault).copied().unwrap_or(0)
    }
}

/// An invariant checked against the simulator's ground truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// Never two tenants on one worker.
    SingleTenant,
    /// A tenant never starts on a worker the previous tenant left dirty.
    CleanHandoff,
    /// A worker ordered deleted (an expired endpoint among them) is never granted again.
    NoReassignOfCondemned,
    /// Never more workers than the ceiling (existing plus creations in flight).
    Ceiling,
    /// Never more runs of one member than its limit.
    MemberLimit,
    /// The queue stays within its bound.
    QueueBound,
    /// Creations in flight stay within their bound.
    CreatesInFlight,
    /// A warm worker is clean and idle.
    WarmIsClean,
    /// A grant never passes over an older ticket whose member is under the limit.
    Fifo,
    /// No grant while the store is unavailable.
    NoGrantWithoutStore,
    /// No grant after a ticket's deadline.
    NoGrantAfterDeadline,
    /// No worker created from an image other than the controller's release.
    NoStaleImage,
    /// Every worker that exists (ambiguous creates included) is counted by the pool.
    AmbiguousCounted,
    /// The pool document's own assertions held.
    DocumentSound,
    /// Without faults, every ticket is served or refused before its deadline.
    LivenessServed,
    /// Without faults, the pool returns to its target with nothing orphaned.
    LivenessConverged,
}

impl Invariant {
    /// Every invariant.
    pub const ALL: [Invariant; 16] = [
        Self::SingleTenant,
        Self::CleanHandoff,
        Self::NoReassignOfCondemned,
        Self::Ceiling,
        Self::MemberLimit,
        Self::QueueBound,
        Self::CreatesInFlight,
        Self::WarmIsClean,
        Self::Fifo,
        Self::NoGrantWithoutStore,
        Self::NoGrantAfterDeadline,
        Self::NoStaleImage,
        Self::AmbiguousCounted,
        Self::DocumentSound,
        Self::LivenessServed,
        Self::LivenessConverged,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::SingleTenant => "single_tenant",
            Self::CleanHandoff => "clean_handoff",
            Self::NoReassignOfCondemned => "no_reassign_of_condemned",
            Self::Ceiling => "ceiling",
            Self::MemberLimit => "member_limit",
            Self::QueueBound => "queue_bound",
            Self::CreatesInFlight => "creates_in_flight",
            Self::WarmIsClean => "warm_is_clean",
            Self::Fifo => "fifo",
            Self::NoGrantWithoutStore => "no_grant_without_store",
            Self::NoGrantAfterDeadline => "no_grant_after_deadline",
            Self::NoStaleImage => "no_stale_image",
            Self::AmbiguousCounted => "ambiguous_counted",
            Self::DocumentSound => "document_sound",
            Self::LivenessServed => "liveness_served",
            Self::LivenessConverged => "liveness_converged",
        }
    }
}

/// Counters of one or many runs.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Faults injected, by kind.
    pub faults: BTreeMap<Fault, u64>,
    /// Checks made, by invariant.
    pub checks: BTreeMap<Invariant, u64>,
    /// Violations found, by invariant.
    pub violations: BTreeMap<Invariant, u64>,
    /// Events processed.
    pub steps: u64,
    /// Pool transitions committed.
    pub transitions: u64,
}

impl Stats {
    /// Adds `other` into this.
    pub fn absorb(&mut self, other: &Stats) {
        for (k, v) in &other.faults {
            *self.faults.entry(*k).or_insert(0) += v;
        }
        for (k, v) in &other.checks {
            *self.checks.entry(*k).or_insert(0) += v;
        }
        for (k, v) in &other.violations {
            *self.violations.entry(*k).or_insert(0) += v;
        }
        self.steps += other.steps;
        self.transitions += other.transitions;
    }

    /// Counts one injected fault.
    pub fn fault(&mut self, fault: Fault) {
        *self.faults.entry(fault).or_insert(0) += 1;
    }

    /// Counts one check.
    pub fn checked(&mut self, invariant: Invariant) {
        *self.checks.entry(invariant).or_insert(0) += 1;
    }
}
