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
    /// The store restarts from its last snapshot, losing the writes made since (a Valkey killed
    /// between RDB saves, or failed over to a replica that had not received them).
    StoreRollback,
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
    /// A delete times out without effect: its outcome is unknown and the worker survives.
    DeleteUnknownSurvives,
    /// The inventory cannot be listed.
    InventoryUnavailable,
    /// A worker dies on its own.
    WorkerCrash,
    /// A reset leaves the worker dirty, and its evidence says so in one measurement: processes,
    /// workspace entries, scratch entries or mounts left, or one of them not measured at all.
    DirtyReset,
    /// An API replica crashes and restarts.
    ReplicaCrash,
    /// The controller crashes and restarts.
    ControllerCrash,
    /// The controller restarts with a new release image.
    NewRelease,
    /// Replicas' clocks are skewed.
    ClockSkew,
    /// A command (a holder's heartbeat, release or reset report, or a controller's report) is
    /// delivered twice, the second time late and with its old token; nobody hears the second reply.
    DuplicateReport,
    /// A lease holder pauses with a command in hand for longer than its lease, then sends it.
    ZombieHolder,
    /// The controller pauses with a store call in hand; it may be replaced meanwhile, and then
    /// sends the call with its old image and tokens when it resumes.
    ZombieController,
    /// An API replica pauses: its holders' timers, answers and resets wait until it resumes.
    ReplicaPause,
}

impl Fault {
    /// Every fault kind.
    pub const ALL: [Fault; 24] = [
        Self::StoreOutage,
        Self::StoreLostReply,
        Self::StoreUnknownNoCommit,
        Self::StoreConflict,
        Self::StoreDataLoss,
        Self::StoreRollback,
        Self::StoreSlow,
        Self::CreateFails,
        Self::CreateLostReply,
        Self::CreateHangs,
        Self::DeleteFails,
        Self::DeleteLostReply,
        Self::DeleteUnknownSurvives,
        Self::InventoryUnavailable,
        Self::WorkerCrash,
        Self::DirtyReset,
        Self::ReplicaCrash,
        Self::ControllerCrash,
        Self::NewRelease,
        Self::ClockSkew,
        Self::DuplicateReport,
        Self::ZombieHolder,
        Self::ZombieController,
        Self::ReplicaPause,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::StoreOutage => "store_outage",
            Self::StoreLostReply => "store_lost_reply",
            Self::StoreUnknownNoCommit => "store_unknown_no_commit",
            Self::StoreConflict => "store_conflict",
            Self::StoreDataLoss => "store_data_loss",
            Self::StoreRollback => "store_rollback",
            Self::StoreSlow => "store_slow",
            Self::CreateFails => "create_fails",
            Self::CreateLostReply => "create_lost_reply",
            Self::CreateHangs => "create_hangs",
            Self::DeleteFails => "delete_fails",
            Self::DeleteLostReply => "delete_lost_reply",
            Self::DeleteUnknownSurvives => "delete_unknown_survives",
            Self::InventoryUnavailable => "inventory_unavailable",
            Self::WorkerCrash => "worker_crash",
            Self::DirtyReset => "dirty_reset",
            Self::ReplicaCrash => "replica_crash",
            Self::ControllerCrash => "controller_crash",
            Self::NewRelease => "new_release",
            Self::ClockSkew => "clock_skew",
            Self::DuplicateReport => "duplicate_report",
            Self::ZombieHolder => "zombie_holder",
            Self::ZombieController => "zombie_controller",
            Self::ReplicaPause => "replica_pause",
        }
    }

    /// The highest rate (per mille of opportunities) a seed may draw for this kind.
    fn max_rate(self) -> u64 {
        match self {
            Self::StoreOutage
            | Self::StoreDataLoss
            | Self::StoreRollback
            | Self::WorkerCrash
            | Self::ReplicaCrash
            | Self::ControllerCrash
            | Self::ZombieController
            | Self::ReplicaPause => 40,
            Self::ZombieHolder => 60,
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
            | Self::DeleteLostReply
            | Self::DeleteUnknownSurvives => 150,
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
    /// A ticket gets a worker that suits its run (`Worker::suits`: holding the data stack's jail for
    /// a run that uses it, not flagged for one that does not) whenever one is warm after the
    /// grants of the same transition (decision 0058).
    StackRouted,
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
    /// The lease holders' and the reconciler's own assertions held.
    MachineSound,
    /// A lease is renewed or ended only by its own holder's command carrying its token, or by the
    /// pool's takeover once it truly expired (or its claim ended, or its worker is proven gone).
    LeaseIntegrity,
    /// A reset is never performed on a worker where a run still executes.
    RunUndisturbed,
    /// A lease holder never believes it holds a lease past the lease's true expiry, and never
    /// reports as released a lease the pool took away.
    LossLearned,
    /// No worker with clean evidence is discarded: a reset is judged unproven only on dirty
    /// evidence reported under the reset's own token.
    CleanNotDiscarded,
    /// Idle capacity above the target lingers for its burst TTL, and no longer.
    BurstLinger,
    /// Nothing is created while warm capacity serves the demand.
    NoWastefulCreate,
    /// Every refusal's reason is what actually happened (queue full, wait over, inventory stale,
    /// lease expired or unknown, token stale).
    RefusalTruthful,
    /// Nothing is granted or created while the inventory is stale (POOL-11).
    AdmissionClosed,
    /// A grant names a worker that was really created.
    GrantedWorkerExisted,
    /// A listing older than one already reported changes nothing (it could show workers since
    /// confirmed gone).
    InventoryInOrder,
    /// A document that outlived a store restart is never written as current: the write that
    /// replaces it starts a new epoch.
    RestoredDistrusted,
    /// Burst retirement never takes the provisioned capacity below the target, and never retires
    /// in the transition that orders a create (churn).
    NoChurn,
    /// A browser session's close is claimed by a sweep exactly when it has been idle for the
    /// limit on the deployment clock, whatever the sweeping replica's own clock says (BROW-6).
    IdleReapExact,
    /// No call on a browser session reaches its worker once its close was claimed (BROW-13).
    NoCallAfterClose,
    /// Without faults, every ticket is served or refused before its deadline.
    LivenessServed,
    /// Without faults, the pool returns to its target with nothing orphaned.
    LivenessConverged,
}

impl Invariant {
    /// Every invariant.
    pub const ALL: [Invariant; 32] = [
        Self::SingleTenant,
        Self::CleanHandoff,
        Self::NoReassignOfCondemned,
        Self::Ceiling,
        Self::MemberLimit,
        Self::QueueBound,
        Self::CreatesInFlight,
        Self::WarmIsClean,
        Self::Fifo,
        Self::StackRouted,
        Self::NoGrantWithoutStore,
        Self::NoGrantAfterDeadline,
        Self::NoStaleImage,
        Self::AmbiguousCounted,
        Self::DocumentSound,
        Self::MachineSound,
        Self::LeaseIntegrity,
        Self::RunUndisturbed,
        Self::LossLearned,
        Self::CleanNotDiscarded,
        Self::BurstLinger,
        Self::NoWastefulCreate,
        Self::RefusalTruthful,
        Self::AdmissionClosed,
        Self::InventoryInOrder,
        Self::GrantedWorkerExisted,
        Self::RestoredDistrusted,
        Self::NoChurn,
        Self::IdleReapExact,
        Self::NoCallAfterClose,
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
            Self::StackRouted => "stack_routed",
            Self::NoGrantWithoutStore => "no_grant_without_store",
            Self::NoGrantAfterDeadline => "no_grant_after_deadline",
            Self::NoStaleImage => "no_stale_image",
            Self::AmbiguousCounted => "ambiguous_counted",
            Self::DocumentSound => "document_sound",
            Self::MachineSound => "machine_sound",
            Self::LeaseIntegrity => "lease_integrity",
            Self::RunUndisturbed => "run_undisturbed",
            Self::LossLearned => "loss_learned",
            Self::CleanNotDiscarded => "clean_not_discarded",
            Self::BurstLinger => "burst_linger",
            Self::NoWastefulCreate => "no_wasteful_create",
            Self::RefusalTruthful => "refusal_truthful",
            Self::AdmissionClosed => "admission_closed",
            Self::InventoryInOrder => "inventory_in_order",
            Self::GrantedWorkerExisted => "granted_worker_existed",
            Self::RestoredDistrusted => "restored_distrusted",
            Self::NoChurn => "no_churn",
            Self::IdleReapExact => "idle_reap_exact",
            Self::NoCallAfterClose => "no_call_after_close",
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
