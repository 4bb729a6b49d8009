//! The ground truth the checks judge by, recorded from the simulator's own knowledge: every write
//! that landed (with the command that made it and what it did), every reset a worker performed,
//! every listing reported. Nothing here is read back from the pool's view of itself.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::ids::{OpToken, TicketId, WorkerId};
use corral_core::time::UnixMillis;

/// How a lease ended, by what landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LeaseEnd {
    /// Its holder's release (or cancel) ended it.
    Released,
    /// The pool ended it without its holder asking.
    TakenOver,
}

/// A lease as it really stands.
#[derive(Clone, Debug)]
pub(super) struct LeaseTruth {
    /// The worker it is on.
    pub(super) worker: WorkerId,
    /// The token its grant carried.
    pub(super) token: OpToken,
    /// When its grant, or the last renewal its holder sent, was applied.
    pub(super) renewed_at: UnixMillis,
    /// How it ended, once it has.
    pub(super) ended: Option<LeaseEnd>,
}

/// Everything the simulator knows happened.
#[derive(Default)]
pub(super) struct Truth {
    /// Creates handed to the backend and not yet received by it, with the epoch that ordered them.
    pub(super) creates_in_flight: BTreeMap<WorkerId, u64>,
    /// Epochs whose document was lost, with when.
    pub(super) lost_epochs: BTreeMap<u64, u64>,
    /// Workers the pool ordered deleted, with when it was first seen.
    pub(super) condemned: BTreeMap<WorkerId, u64>,
    /// The order in which tickets joined the queue.
    pub(super) ticket_order: BTreeMap<TicketId, u64>,
    /// Each ticket's deadline, as its acquire landed.
    pub(super) ticket_deadline: BTreeMap<TicketId, UnixMillis>,
    /// Every lease granted, by its id.
    pub(super) leases: BTreeMap<TicketId, LeaseTruth>,
    /// Every reset a worker performed, by worker and token: whether it left the worker clean.
    pub(super) resets: BTreeMap<(WorkerId, OpToken), bool>,
    /// The latest listing reported to each epoch's document.
    pub(super) inventory_as_of: BTreeMap<u64, UnixMillis>,
    /// Every worker the backend ever created.
    pub(super) created: BTreeSet<WorkerId>,
    /// Each platform claim's deadline, as its create was ordered.
    pub(super) claim_deadline: BTreeMap<WorkerId, UnixMillis>,
}

impl Truth {
    /// True when the document of `epoch` has a listing no older than `stale_ms` at `now`.
    pub(super) fn inventory_fresh(&self, epoch: u64, now: UnixMillis, stale_ms: u64) -> bool {
        self.inventory_as_of
            .get(&epoch)
            .is_some_and(|as_of| now.ms_since(*as_of) <= stale_ms)
    }

    /// When a lease expires unless renewed: its last renewal plus the time to live, capped by its
    /// worker's claim.
    pub(super) fn lease_expiry(&self, lease: &LeaseTruth, ttl_ms: u64) -> UnixMillis {
        let by_ttl = lease.renewed_at.plus_ms(ttl_ms);
        match self.claim_deadline.get(&lease.worker) {
            Some(claim) => by_ttl.min(*claim),
            None => by_ttl,
        }
    }
}
