//! The pool document and the vocabulary of its transitions.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::ids::{ImageId, LeaseId, LeaseScope, MemberId, OpToken, TicketId, WorkerId};
use crate::reset::{ResetEvidence, Unproven};
use crate::time::UnixMillis;

/// The whole shared state of one pool. Changed only by [`PoolDoc::apply`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolDoc {
    /// This document's lifetime; a document rebuilt after coordination data loss has a new epoch,
    /// so its worker ids never collide with the workers of a lost one.
    pub(crate) epoch: u64,
    /// The latest deployment time applied; a clock that steps back never moves it back.
    pub(crate) clock: UnixMillis,
    pub(crate) next_seq: u64,
    pub(crate) next_token: u64,
    pub(crate) image: Option<ImageId>,
    /// Deployment time of the last inventory observation, if any since this epoch began.
    pub(crate) inventory_as_of: Option<UnixMillis>,
    pub(crate) workers: BTreeMap<WorkerId, Worker>,
    pub(crate) tickets: VecDeque<Ticket>,
}

/// One worker the pool accounts for. Every worker in the document counts toward the ceiling.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Worker {
    /// The image it was created from.
    pub image: ImageId,
    /// Its state.
    pub state: WorkerState,
    /// The token of its current state; reports must carry it.
    pub token: OpToken,
    /// Deployment time it entered its current state.
    pub since: UnixMillis,
    /// Deployment time its existence was last confirmed (create reported, or seen in inventory).
    pub confirmed_at: Option<UnixMillis>,
    /// In platform-operator mode, the claim's deadline, fixed at creation (POOL-7).
    pub claim_deadline: Option<UnixMillis>,
    /// Whether any of its leases was for a run that uses the data stack
    /// (`CORRAL_WORKER_PYTHON_PREIMPORT`): after such a run the worker prepares a Python jail that
    /// pre-imports it (decision 0056), and keeps it through the runs that do not take it (decision
    /// 0060), which [`Worker::suits`] reads (decision 0058). A hint for routing only: it changes
    /// no state, no proof and no order of service.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stack: bool,
    /// Whether it has been granted a lease since it was created (one that has not prepares the
    /// stack's jail after a shorter idle wait, [`super::FIRST_IDLE_BEFORE_PREIMPORT_MS`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leased: bool,
}

impl Worker {
    /// Whether dispatch may grant this worker at `now`: warm, and its claim (platform-operator
    /// mode) lasting at least one heartbeat more.
    #[must_use]
    pub fn grantable(&self, now: UnixMillis, config: &super::PoolConfig) -> bool {
        self.state.kind() == StateKind::Warm
            && self
                .claim_deadline
                .is_none_or(|d| d > now.plus_ms(config.lease_heartbeat_ms))
    }

    /// Whether this worker, warm since [`Worker::since`], is taken to hold a Python jail that
    /// pre-imports the data stack at `now`: one of its leases' runs used the stack (the reset
    /// after it prepared one, decision 0056, and the resets after other runs keep it, decision
    /// 0060), or it has waited idle twice the idle re-preparation's wait (decision 0037; a worker
    /// that has run nothing yet waits less). A hint for routing only (decision 0058).
    #[must_use]
    pub fn holds_stack(&self, now: UnixMillis, config: &super::PoolConfig) -> bool {
        let idle = config.stack_idle_ms.map(|idle| {
            if self.leased {
                idle
            } else {
                idle.min(super::FIRST_IDLE_BEFORE_PREIMPORT_MS)
            }
        });
        self.stack || idle.is_some_and(|idle| now.ms_since(self.since) >= idle.saturating_mul(2))
    }

    /// Whether a ticket whose run uses the data stack (`stack`) or not is served as it wants by
    /// this worker (decision 0058): a run that uses the stack by a worker that holds its jail
    /// ([`Worker::holds_stack`]); any other by any worker, since a worker keeps its stack jail
    /// through a run that takes its plain one (decision 0060), so the one warm the longest, whose
    /// plain jail is the readiest, serves it.
    #[must_use]
    pub fn suits(&self, stack: bool, now: UnixMillis, config: &super::PoolConfig) -> bool {
        !stack || self.holds_stack(now, config)
    }
}

/// A worker's state. The legal transitions are in [`StateKind::may_become`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WorkerState {
    /// A create was ordered and not yet reported; ambiguous after `deadline`.
    Creating {
        /// When an unreported create becomes ambiguous.
        deadline: UnixMillis,
    },
    /// Ready, proven clean, waiting for a lease.
    Warm,
    /// Held by one lease: single-tenant.
    Leased(Lease),
    /// A reset was ordered after a lease ended; unproven after `deadline`.
    Resetting {
        /// The lease whose end ordered this reset (a repeated release re-issues the reset).
        after: LeaseId,
        /// When an unreported reset becomes unproven.
        deadline: UnixMillis,
    },
    /// Leaving the pool for an ordinary reason; still counted until confirmed absent.
    Retiring(Removal),
    /// Leaving the pool because it could not be trusted; still counted until confirmed absent.
    Quarantined(Removal),
}

/// A lease on one worker.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    /// The lease's id (its ticket's id).
    pub id: LeaseId,
    /// The member it counts against.
    pub member: MemberId,
    /// What it is for.
    pub scope: LeaseScope,
    /// Ownership ends here unless renewed (POOL-6).
    pub expires_at: UnixMillis,
}

/// A worker on its way out: a delete was ordered and its absence is not yet confirmed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Removal {
    /// Why it is leaving.
    pub reason: RemovalReason,
    /// A member whose slot stays taken until the worker is gone (its lease expired or was lost
    /// while its code may still be running there).
    pub holds_member: Option<MemberId>,
    /// The lease that was on it, if any.
    pub lease: Option<LeaseId>,
    /// Inventory that omits the worker proves it gone only if taken after this time.
    pub absent_after: UnixMillis,
    /// When the delete was last ordered.
    pub delete_ordered_at: UnixMillis,
}

/// Why a worker leaves the pool. Codes are stable.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum RemovalReason {
    /// Idle capacity above target outlived the burst TTL.
    BurstShrink,
    /// Built from an image that is no longer the published one.
    StaleImage,
    /// Its platform claim reached its fixed deadline.
    ClaimExpired,
    /// A reset did not prove it clean.
    ResetUnproven(Unproven),
    /// A reset was not reported in time.
    ResetTimeout,
    /// Its lease was not renewed in time: crash takeover (POOL-9).
    LeaseExpired,
    /// Its create's outcome is unknown (POOL-10).
    AmbiguousCreate,
    /// Its create was not reported in time (POOL-10).
    CreateTimeout,
    /// Inventory shows it and this document does not know it.
    Orphan,
    /// Its holder could not confirm a clean close (BROW-13).
    DiscardedByHolder,
}

impl RemovalReason {
    /// The stable reason code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::BurstShrink => "burst_shrink",
            Self::StaleImage => "stale_image",
            Self::ClaimExpired => "claim_expired",
            Self::ResetUnproven(unproven) => unproven.code(),
            Self::ResetTimeout => "reset_timeout",
            Self::LeaseExpired => "lease_expired",
            Self::AmbiguousCreate => "ambiguous_create",
            Self::CreateTimeout => "create_timeout",
            Self::Orphan => "orphan",
            Self::DiscardedByHolder => "discarded_by_holder",
        }
    }

    /// True when the worker leaves because it cannot be trusted (quarantine) rather than by plan.
    #[must_use]
    pub fn is_for_cause(self) -> bool {
        match self {
            Self::BurstShrink | Self::StaleImage | Self::ClaimExpired => false,
            Self::ResetUnproven(_)
            | Self::ResetTimeout
            | Self::LeaseExpired
            | Self::AmbiguousCreate
            | Self::CreateTimeout
            | Self::Orphan
            | Self::DiscardedByHolder => true,
        }
    }
}

/// A waiting acquire ticket.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ticket {
    /// The caller's id for it; also the id of the lease it receives.
    pub id: TicketId,
    /// The member it counts against.
    pub member: MemberId,
    /// What the lease will be for.
    pub scope: LeaseScope,
    /// It is refused if not granted by then.
    pub deadline: UnixMillis,
    /// The lease is for a run that uses the data stack (decision 0058).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stack: bool,
}

/// A state's kind, for the table of legal transitions.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum StateKind {
    /// See [`WorkerState::Creating`].
    Creating,
    /// See [`WorkerState::Warm`].
    Warm,
    /// See [`WorkerState::Leased`].
    Leased,
    /// See [`WorkerState::Resetting`].
    Resetting,
    /// See [`WorkerState::Retiring`].
    Retiring,
    /// See [`WorkerState::Quarantined`].
    Quarantined,
}

impl StateKind {
    /// The table of legal transitions. A worker leaves the document only from Retiring or
    /// Quarantined (once absent), or from Creating when the create definitely failed.
    #[must_use]
    pub fn may_become(self, next: StateKind) -> bool {
        use StateKind::{Creating, Leased, Quarantined, Resetting, Retiring, Warm};
        match self {
            Creating => matches!(next, Warm | Retiring | Quarantined),
            Warm => matches!(next, Leased | Retiring | Quarantined),
            Leased => matches!(next, Resetting | Retiring | Quarantined),
            Resetting => matches!(next, Warm | Retiring | Quarantined),
            Retiring => matches!(next, Quarantined),
            Quarantined => false,
        }
    }

    /// The stable name.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Warm => "warm",
            Self::Leased => "leased",
            Self::Resetting => "resetting",
            Self::Retiring => "retiring",
            Self::Quarantined => "quarantined",
        }
    }
}

impl WorkerState {
    /// This state's kind.
    #[must_use]
    pub fn kind(&self) -> StateKind {
        match self {
            Self::Creating { .. } => StateKind::Creating,
            Self::Warm => StateKind::Warm,
            Self::Leased(_) => StateKind::Leased,
            Self::Resetting { .. } => StateKind::Resetting,
            Self::Retiring(_) => StateKind::Retiring,
            Self::Quarantined(_) => StateKind::Quarantined,
        }
    }

    /// The removal record, when the worker is leaving.
    #[must_use]
    pub fn removal(&self) -> Option<&Removal> {
        match self {
            Self::Retiring(removal) | Self::Quarantined(removal) => Some(removal),
            Self::Creating { .. } | Self::Warm | Self::Leased(_) | Self::Resetting { .. } => None,
        }
    }
}

/// What a replica or the controller asks of the pool.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Command {
    /// Take a FIFO ticket for a lease; granted now or later, or refused.
    Acquire {
        /// The caller's unique id for the ticket (and the lease).
        ticket: TicketId,
        /// The member it counts against.
        member: MemberId,
        /// What the lease is for.
        scope: LeaseScope,
        /// How long the caller will wait, capped by `SANDBOX_ACQUIRE_WAIT_SECONDS`.
        wait_ms: u64,
        /// The lease is for a run that uses the data stack: it goes first to a worker that holds
        /// the stack's jail (decision 0058, [`Worker::suits`]). Routing only.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stack: bool,
    },
    /// The caller stopped waiting: withdraw the ticket, or end the lease it already received.
    Cancel {
        /// The ticket.
        ticket: TicketId,
    },
    /// Renew a lease (POOL-6).
    Heartbeat {
        /// The leased worker.
        worker: WorkerId,
        /// The lease.
        lease: LeaseId,
        /// The token the grant carried.
        token: OpToken,
    },
    /// End a lease: reset the worker, or discard it when the holder cannot vouch for it.
    Release {
        /// The leased worker.
        worker: WorkerId,
        /// The lease.
        lease: LeaseId,
        /// The token the grant carried.
        token: OpToken,
        /// Reset for reuse, or discard.
        disposition: Disposition,
    },
    /// A create effect's outcome.
    CreateReported {
        /// The worker.
        worker: WorkerId,
        /// The effect's token.
        token: OpToken,
        /// Created, failed, or unknown.
        outcome: Outcome,
    },
    /// A reset effect's evidence.
    ResetReported {
        /// The worker.
        worker: WorkerId,
        /// The effect's token.
        token: OpToken,
        /// What the worker measured.
        evidence: ResetEvidence,
    },
    /// A delete effect's outcome; `Done` means the backend confirmed the worker absent.
    DeleteReported {
        /// The worker.
        worker: WorkerId,
        /// The effect's token.
        token: OpToken,
        /// Confirmed absent, failed, or unknown.
        outcome: Outcome,
    },
    /// The controller publishes the image it creates workers from (POOL-12).
    PublishImage {
        /// The image.
        image: ImageId,
    },
    /// The deployment inventory: which workers exist, as listed at deployment time `as_of`.
    InventoryObserved {
        /// When the listing was taken (read from the deployment clock before listing).
        as_of: UnixMillis,
        /// Every worker the inventory shows.
        present: BTreeSet<WorkerId>,
    },
    /// The controller's periodic pass: fire deadlines, retry deletes, dispatch, plan creates and
    /// retirements. `image` is the image the ticking controller runs with.
    Tick {
        /// The controller's own image; creation waits until it is the published one.
        image: ImageId,
    },
}

/// What a lease holder asks for when it ends a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Disposition {
    /// Reset and, if proven clean, reuse.
    Reset,
    /// Delete without reuse (for example a browser close the worker did not confirm).
    Discard,
}

/// The outcome of a create or delete effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    /// It happened (for a delete: the worker is confirmed absent).
    Done,
    /// It definitely did not happen.
    Failed,
    /// Nobody knows (a lost reply, a timeout).
    Unknown,
}

/// Work the caller must perform after the write commits. Each carries the operation token its
/// report must carry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Effect {
    /// Create the worker from `image`; in platform-operator mode, a claim with `claim_deadline`.
    Create {
        /// The worker.
        worker: WorkerId,
        /// Its token.
        token: OpToken,
        /// The image to create it from.
        image: ImageId,
        /// The claim's fixed deadline, in platform-operator mode.
        claim_deadline: Option<UnixMillis>,
    },
    /// Kill the worker's run and wipe it, then report evidence.
    Reset {
        /// The worker.
        worker: WorkerId,
        /// Its token.
        token: OpToken,
    },
    /// Delete the worker, confirm it absent, then report.
    Delete {
        /// The worker.
        worker: WorkerId,
        /// Its token.
        token: OpToken,
    },
}

/// What callers are told.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Event {
    /// The ticket got a lease on `worker`; the holder must carry `token`.
    Granted {
        /// The ticket (and lease) id.
        ticket: TicketId,
        /// The worker.
        worker: WorkerId,
        /// The lease's token.
        token: OpToken,
        /// When the lease expires unless renewed.
        expires_at: UnixMillis,
    },
    /// The ticket waits at `position` (0 is the head).
    Queued {
        /// The ticket.
        ticket: TicketId,
        /// Its place in the queue.
        position: u32,
    },
    /// A request about `ticket` (or the lease it got) was refused.
    Refused {
        /// The ticket or lease.
        ticket: TicketId,
        /// Why.
        reason: Refusal,
    },
    /// A waiting ticket was withdrawn by its owner.
    Withdrawn {
        /// The ticket.
        ticket: TicketId,
    },
    /// A lease was renewed until `expires_at`.
    Renewed {
        /// The lease.
        lease: LeaseId,
        /// Its new expiry.
        expires_at: UnixMillis,
    },
    /// A lease ended with the worker handed to reset or removal.
    Released {
        /// The lease.
        lease: LeaseId,
    },
    /// A lease was lost without its holder releasing it; its run must be treated as failed.
    LeaseLost {
        /// The lease.
        lease: LeaseId,
        /// The worker it was on.
        worker: WorkerId,
        /// Why.
        reason: RemovalReason,
    },
    /// A worker became warm.
    WorkerWarm {
        /// The worker.
        worker: WorkerId,
    },
    /// A worker started leaving the pool.
    WorkerRemoving {
        /// The worker.
        worker: WorkerId,
        /// Why.
        reason: RemovalReason,
    },
    /// A worker is confirmed absent and its capacity freed.
    WorkerGone {
        /// The worker.
        worker: WorkerId,
    },
    /// A report carried a token that is not the worker's current one, or named an unknown worker;
    /// it changed nothing.
    StaleReport {
        /// The worker named.
        worker: WorkerId,
    },
}

/// Why a request was refused. Codes are stable.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Refusal {
    /// `SANDBOX_ACQUIRE_QUEUE_MAX` tickets already wait.
    QueueFull,
    /// The ticket waited `SANDBOX_ACQUIRE_WAIT_SECONDS` without a grant.
    WaitTimeout,
    /// The inventory has not been observed recently: admission fails closed (POOL-11).
    InventoryUnavailable,
    /// The ticket id is already in use by another member or scope.
    TicketConflict,
    /// No such lease (for example after the coordination store lost its data).
    LeaseUnknown,
    /// The lease exists but the token is not its token.
    StaleToken,
    /// The lease expired before this request.
    LeaseExpired,
    /// The platform claim reached its fixed deadline (POOL-7).
    ClaimExpired,
    /// The ticket is not known (already served, refused or cancelled).
    TicketUnknown,
}

impl Refusal {
    /// The stable reason code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::WaitTimeout => "wait_timeout",
            Self::InventoryUnavailable => "inventory_unavailable",
            Self::TicketConflict => "ticket_conflict",
            Self::LeaseUnknown => "lease_unknown",
            Self::StaleToken => "stale_token",
            Self::LeaseExpired => "lease_expired",
            Self::ClaimExpired => "claim_expired",
            Self::TicketUnknown => "ticket_unknown",
        }
    }
}

/// The result of one transition: effects to perform after the write commits, events to deliver.
#[must_use = "every effect must be performed and every event delivered"]
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Applied {
    /// Effects, in order.
    pub effects: Vec<Effect>,
    /// Events, in order.
    pub events: Vec<Event>,
}

impl Event {
    /// The ticket this event answers (granted, queued, refused or withdrawn), if it answers one.
    #[must_use]
    pub fn ticket(&self) -> Option<TicketId> {
        match self {
            Self::Granted { ticket, .. }
            | Self::Queued { ticket, .. }
            | Self::Refused { ticket, .. }
            | Self::Withdrawn { ticket } => Some(*ticket),
            _ => None,
        }
    }
}

impl Applied {
    /// What this transition answered `ticket`: its grant, its place in the queue, its refusal or
    /// its withdrawal. (A transition answers a ticket at most once.)
    #[must_use]
    pub fn answer(&self, ticket: TicketId) -> Option<&Event> {
        self.events.iter().find(|e| e.ticket() == Some(ticket))
    }
}

/// Where a ticket stands, as its owner reads it from the document.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TicketStatus {
    /// Waiting at `position`.
    Queued {
        /// Its place (0 is the head).
        position: u32,
    },
    /// Granted: a lease on `worker` with `token`.
    Granted {
        /// The worker.
        worker: WorkerId,
        /// The lease's token.
        token: OpToken,
        /// When the lease expires unless renewed.
        expires_at: UnixMillis,
    },
    /// Neither waiting nor holding a lease: refused, expired, cancelled, released, or lost with the
    /// coordination store's data.
    Gone,
}

/// Counts of workers by state, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StateCounts {
    /// Creating.
    pub creating: u32,
    /// Warm.
    pub warm: u32,
    /// Of the warm, those that have run the data stack: they hold a jail that pre-imports it
    /// (decisions 0058, 0060).
    pub warm_stack: u32,
    /// Leased.
    pub leased: u32,
    /// Resetting.
    pub resetting: u32,
    /// Retiring.
    pub retiring: u32,
    /// Quarantined.
    pub quarantined: u32,
}

impl StateCounts {
    /// Every worker the pool accounts for, in any state (what the ceiling bounds).
    #[must_use]
    pub fn allocated(&self) -> u32 {
        self.creating + self.warm + self.leased + self.resetting + self.retiring + self.quarantined
    }

    /// Workers that are or will become usable.
    #[must_use]
    pub fn provisioned(&self) -> u32 {
        self.creating + self.warm + self.leased + self.resetting
    }
}
