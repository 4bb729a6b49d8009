//! The pool's limits and timeouts, already validated (see `crate::config` for parsing).

/// How workers are obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// The controller creates and deletes workers itself (the default).
    Controller,
    /// Workers are claimed through a platform (POOL-7); each claim's deadline is fixed when it is
    /// created, `claim_lifetime_ms` after creation, and a renewal never moves it.
    PlatformOperator {
        /// Lifetime of a claim from its creation, in milliseconds.
        claim_lifetime_ms: u64,
    },
}

/// A rule the simulator may break on purpose to prove that it notices. A shipped build has no way
/// to select one: the `mutation` field of [`PoolConfig`] exists only with the `sim-mutations`
/// feature, which only corral-sim enables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mutation {
    /// Creation ignores the ceiling.
    Ceiling,
    /// A reset report is accepted without a matching operation token.
    ResetToken,
    /// An expired lease's worker is handed to the next ticket instead of being deleted.
    TakeoverReassign,
    /// An ambiguous create frees its capacity at once.
    AmbiguousFree,
    /// Tickets are served newest first.
    Fifo,
    /// The per-member limit is not applied.
    MemberLimit,
    /// Creation uses whatever image the document holds, published by this controller or not.
    StaleImage,
    /// A heartbeat renews whatever lease its worker holds, whatever lease and token it names (a
    /// zombie holder's stale heartbeat renews the next tenant's lease).
    StaleHeartbeat,
    /// A release ends whatever lease its worker holds, whatever lease and token it names (a zombie
    /// holder's stale release ends the next tenant's lease).
    StaleRelease,
    /// A reset report under a stale token discards the worker it names instead of changing
    /// nothing (a good worker discarded because of a stale report).
    DiscardClean,
    /// Idle capacity above the target is retired without lingering for its burst TTL.
    BurstLingerShort,
    /// Idle capacity above the target is never retired.
    BurstNeverRetired,
    /// Creation does not count warm workers: it creates while warm capacity serves the demand.
    CreateWhileWarm,
    /// A full queue's refusal says the wait timed out.
    RefusalReason,
    /// The queue bound is not applied.
    QueueBound,
    /// Creation ignores the bound on creates in flight.
    CreateConcurrency,
    /// Admission stays open whatever the inventory's age (POOL-11).
    AdmissionOpen,
    /// A ticket outlives its deadline (by its whole wait again) before it is refused.
    GrantAfterDeadline,
    /// A heartbeat renews a lease already past its expiry (stale ownership revived, POOL-6).
    ReviveExpired,
    /// A listing older than one already applied is applied too.
    OldListing,
    /// A worker its holder discarded (a browser close the worker did not confirm, BROW-13) goes
    /// straight back to the pool instead of being removed.
    ReuseDiscarded,
    /// A document the store kept across a restart (a snapshot, a failover) is trusted as current,
    /// though writes made since it was saved may be gone (leases granted, workers created).
    TrustRestored,
    /// A delete whose outcome is unknown is taken as done: the worker is forgotten (and its
    /// capacity freed) though it may have survived.
    UnknownDeleteDone,
    /// Reset evidence is judged by its surviving processes alone: a workspace, scratch or mount
    /// measurement that is missing or nonzero passes.
    PartialEvidence,
    /// Burst capacity is retired one worker beyond the surplus (and re-created at once).
    OverRetire,
    /// A browser session counts as idle after a tenth of its idle limit (a unit slip).
    IdleEarly,
    /// A call on a browser session whose close was claimed still reaches its worker.
    ClosingCallable,
    /// A ticket gets the worker warm the longest whatever data stack its last lease used
    /// (decision 0058).
    StackUnrouted,
}

impl Mutation {
    /// Every mutation, in the order the simulator runs them.
    pub const ALL: [Mutation; 28] = [
        Self::Ceiling,
        Self::ResetToken,
        Self::TakeoverReassign,
        Self::AmbiguousFree,
        Self::Fifo,
        Self::MemberLimit,
        Self::StaleImage,
        Self::StaleHeartbeat,
        Self::StaleRelease,
        Self::DiscardClean,
        Self::BurstLingerShort,
        Self::BurstNeverRetired,
        Self::CreateWhileWarm,
        Self::RefusalReason,
        Self::QueueBound,
        Self::CreateConcurrency,
        Self::AdmissionOpen,
        Self::GrantAfterDeadline,
        Self::ReviveExpired,
        Self::OldListing,
        Self::ReuseDiscarded,
        Self::TrustRestored,
        Self::UnknownDeleteDone,
        Self::PartialEvidence,
        Self::OverRetire,
        Self::IdleEarly,
        Self::ClosingCallable,
        Self::StackUnrouted,
    ];

    /// The name used on the simulator's command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ceiling => "ceiling",
            Self::ResetToken => "reset-token",
            Self::TakeoverReassign => "takeover-reassign",
            Self::AmbiguousFree => "ambiguous-free",
            Self::Fifo => "fifo",
            Self::MemberLimit => "member-limit",
            Self::StaleImage => "stale-image",
            Self::StaleHeartbeat => "stale-heartbeat",
            Self::StaleRelease => "stale-release",
            Self::DiscardClean => "discard-clean",
            Self::BurstLingerShort => "burst-linger-short",
            Self::BurstNeverRetired => "burst-never-retired",
            Self::CreateWhileWarm => "create-while-warm",
            Self::RefusalReason => "refusal-reason",
            Self::QueueBound => "queue-bound",
            Self::CreateConcurrency => "create-concurrency",
            Self::AdmissionOpen => "admission-open",
            Self::GrantAfterDeadline => "grant-after-deadline",
            Self::ReviveExpired => "revive-expired",
            Self::OldListing => "old-listing",
            Self::ReuseDiscarded => "reuse-discarded",
            Self::TrustRestored => "trust-restored",
            Self::UnknownDeleteDone => "unknown-delete-done",
            Self::PartialEvidence => "partial-evidence",
            Self::OverRetire => "over-retire",
            Self::IdleEarly => "idle-early",
            Self::ClosingCallable => "closing-callable",
            Self::StackUnrouted => "stack-unrouted",
        }
    }
}

#[cfg(feature = "sim-mutations")]
thread_local! {
    static BROKEN_ON_THIS_THREAD: std::cell::Cell<Option<Mutation>> =
        const { std::cell::Cell::new(None) };
}

/// Whether `rule` is broken on purpose, for a rule with no [`PoolConfig`] at hand (a browser
/// session's): the mutation this thread runs under ([`break_on_this_thread`]). Always false in a
/// build without the `sim-mutations` feature.
#[must_use]
pub fn broken_on_this_thread(rule: Mutation) -> bool {
    #[cfg(feature = "sim-mutations")]
    {
        BROKEN_ON_THIS_THREAD.get() == Some(rule)
    }
    #[cfg(not(feature = "sim-mutations"))]
    {
        let _ = rule;
        false
    }
}

/// Breaks `mutation` (or nothing) for the rules this thread applies with no [`PoolConfig`] at
/// hand (the simulator runs one world per thread at a time).
#[cfg(feature = "sim-mutations")]
pub fn break_on_this_thread(mutation: Option<Mutation>) {
    BROKEN_ON_THIS_THREAD.set(mutation);
}

/// How long a worker that has run nothing yet waits idle (at most `CORRAL_WORKER_PREIMPORT_IDLE_SECONDS`,
/// and up to as long again at random) before it prepares its Python jail with the data stack: its
/// first jail is prepared without it, so that a worker created for a burst serves it at once
/// (decision 0037); one created for the warm minimum has the stack a moment later. The worker
/// waits it; the pool counts such a worker as holding the stack after twice it (decision 0058).
pub const FIRST_IDLE_BEFORE_PREIMPORT_MS: u64 = 1_000;

/// The pool's limits (POOL-1, POOL-2, POOL-3, POOL-6) and the timeouts that bound unknown outcomes.
/// Durations are milliseconds of deployment time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// `SANDBOX_WARM_POOL_MIN`: workers kept allocated even when idle.
    pub warm_min: u32,
    /// `SANDBOX_POOL_TARGET_IDLE`: idle workers kept beside the leased ones.
    pub target_idle: u32,
    /// `SANDBOX_POOL_MAX_ALLOCATED`: the hard ceiling over every state.
    pub max_allocated: u32,
    /// `SANDBOX_MAX_CONCURRENT_CREATES`: creations in flight at once.
    pub max_concurrent_creates: u32,
    /// `SANDBOX_BURST_IDLE_TTL_SECONDS`: how long idle capacity above target lingers.
    pub burst_idle_ttl_ms: u64,
    /// `SANDBOX_ACQUIRE_WAIT_SECONDS`: the longest a ticket waits.
    pub acquire_wait_ms: u64,
    /// `SANDBOX_ACQUIRE_QUEUE_MAX`: the most tickets waiting at once.
    pub acquire_queue_max: u32,
    /// `SANDBOX_MAX_CONCURRENT_PER_MEMBER`: leases one member holds at once (code and browser).
    pub max_per_member: u32,
    /// `SANDBOX_LEASE_HEARTBEAT_SECONDS`: how often a holder renews its lease.
    pub lease_heartbeat_ms: u64,
    /// `SANDBOX_LEASE_TTL_SECONDS`: how long a lease lives without renewal.
    pub lease_ttl_ms: u64,
    /// `CORRAL_CREATE_TIMEOUT_SECONDS`: a create not reported by then is ambiguous.
    pub create_timeout_ms: u64,
    /// `CORRAL_RESET_TIMEOUT_SECONDS`: a reset not reported by then is unproven.
    pub reset_timeout_ms: u64,
    /// `CORRAL_DELETE_RETRY_SECONDS`: how often an unconfirmed delete is ordered again.
    pub delete_retry_ms: u64,
    /// `CORRAL_INVENTORY_STALE_SECONDS`: admission closes when inventory is older than this.
    pub inventory_stale_ms: u64,
    /// Controller or platform operator.
    pub mode: PoolMode,
    /// `CORRAL_WORKER_PREIMPORT_IDLE_SECONDS` (`None`: 0, never): how long a worker waits idle
    /// before it prepares its Python jail with the data stack whatever its last run (decision
    /// 0037, up to as long again at random); a worker warm twice as long is taken to hold one
    /// (decision 0058, [`super::Worker::holds_stack`]).
    pub stack_idle_ms: Option<u64>,
    /// The rule broken on purpose, in the simulator only.
    #[cfg(feature = "sim-mutations")]
    pub mutation: Option<Mutation>,
}

impl Default for PoolConfig {
    /// The specification's defaults.
    fn default() -> Self {
        Self {
            warm_min: 3,
            target_idle: 1,
            max_allocated: 32,
            max_concurrent_creates: 3,
            burst_idle_ttl_ms: 300_000,
            acquire_wait_ms: 30_000,
            acquire_queue_max: 256,
            max_per_member: 2,
            lease_heartbeat_ms: 60_000,
            lease_ttl_ms: 900_000,
            create_timeout_ms: 120_000,
            reset_timeout_ms: 30_000,
            delete_retry_ms: 10_000,
            inventory_stale_ms: 30_000,
            mode: PoolMode::Controller,
            stack_idle_ms: Some(10_000),
            #[cfg(feature = "sim-mutations")]
            mutation: None,
        }
    }
}

impl PoolConfig {
    /// True when the simulator has broken `rule` on purpose; always false in a shipped build.
    #[must_use]
    pub fn broken(&self, rule: Mutation) -> bool {
        #[cfg(feature = "sim-mutations")]
        {
            self.mutation == Some(rule)
        }
        #[cfg(not(feature = "sim-mutations"))]
        {
            let _ = rule;
            false
        }
    }

    /// True when any rule is broken on purpose (the simulator then judges by ground truth alone,
    /// and the document's own assertions stand down).
    #[must_use]
    pub fn any_broken(&self) -> bool {
        #[cfg(feature = "sim-mutations")]
        {
            self.mutation.is_some()
        }
        #[cfg(not(feature = "sim-mutations"))]
        {
            false
        }
    }
}
