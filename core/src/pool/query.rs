//! Reading the document: its parts, counts, where a ticket stands, and the target it plans toward.

use std::collections::BTreeMap;

use super::config::{Mutation, PoolConfig};
use super::doc::{
    PoolDoc, RemovalReason, StateCounts, StateKind, Ticket, TicketStatus, Worker, WorkerState,
};
use crate::ids::{ImageId, MemberId, TicketId, WorkerId};
use crate::time::UnixMillis;

impl PoolDoc {
    /// A new, empty document. `epoch` must differ from every earlier document's of this pool (the
    /// shell derives it from deployment time and randomness); the pool admits nothing until the
    /// inventory has been observed.
    #[must_use]
    pub fn new(epoch: u64, now: UnixMillis) -> Self {
        Self {
            epoch,
            clock: now,
            next_seq: 0,
            next_token: 1,
            image: None,
            inventory_as_of: None,
            workers: BTreeMap::new(),
            tickets: std::collections::VecDeque::new(),
        }
    }

    /// This document's epoch.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The latest deployment time applied.
    #[must_use]
    pub fn clock(&self) -> UnixMillis {
        self.clock
    }

    /// The published worker image, if any.
    #[must_use]
    pub fn image(&self) -> Option<&ImageId> {
        self.image.as_ref()
    }

    /// Every worker the pool accounts for.
    #[must_use]
    pub fn workers(&self) -> &BTreeMap<WorkerId, Worker> {
        &self.workers
    }

    /// The waiting tickets, oldest first.
    pub fn tickets(&self) -> impl Iterator<Item = &Ticket> {
        self.tickets.iter()
    }

    /// Workers by state.
    #[must_use]
    pub fn counts(&self) -> StateCounts {
        let mut counts = StateCounts::default();
        for worker in self.workers.values() {
            let slot = match worker.state.kind() {
                StateKind::Creating => &mut counts.creating,
                StateKind::Warm => &mut counts.warm,
                StateKind::Leased => &mut counts.leased,
                StateKind::Resetting => &mut counts.resetting,
                StateKind::Retiring => &mut counts.retiring,
                StateKind::Quarantined => &mut counts.quarantined,
            };
            *slot += 1;
            if worker.stack && worker.state.kind() == StateKind::Warm {
                counts.warm_stack += 1;
            }
        }
        counts
    }

    /// The tickets waiting in the queue, oldest first.
    pub fn queued_tickets(&self) -> impl Iterator<Item = TicketId> + '_ {
        self.tickets.iter().map(|t| t.id)
    }

    /// Where `ticket` stands.
    #[must_use]
    pub fn ticket_status(&self, ticket: TicketId) -> TicketStatus {
        if let Some(position) = self.tickets.iter().position(|t| t.id == ticket) {
            return TicketStatus::Queued {
                position: u32::try_from(position).unwrap_or(u32::MAX),
            };
        }
        for (id, worker) in &self.workers {
            if let WorkerState::Leased(lease) = &worker.state
                && lease.id == ticket
            {
                return TicketStatus::Granted {
                    worker: *id,
                    token: worker.token,
                    expires_at: lease.expires_at,
                };
            }
        }
        TicketStatus::Gone
    }

    /// Slots each member holds: its leases, plus workers still being removed under its name.
    #[must_use]
    pub fn member_usage(&self) -> BTreeMap<MemberId, u32> {
        let mut usage: BTreeMap<MemberId, u32> = BTreeMap::new();
        for worker in self.workers.values() {
            let member = match &worker.state {
                WorkerState::Leased(lease) => Some(&lease.member),
                WorkerState::Retiring(removal) | WorkerState::Quarantined(removal) => {
                    removal.holds_member.as_ref()
                }
                WorkerState::Creating { .. }
                | WorkerState::Warm
                | WorkerState::Resetting { .. } => None,
            };
            if let Some(member) = member {
                *usage.entry(member.clone()).or_insert(0) += 1;
            }
        }
        usage
    }

    /// True when the pool may grant and create: the inventory was observed recently (POOL-11).
    #[must_use]
    pub fn admission_open(&self, now: UnixMillis, config: &PoolConfig) -> bool {
        if config.broken(Mutation::AdmissionOpen) {
            return true;
        }
        match self.inventory_as_of {
            Some(as_of) => now.ms_since(as_of) <= config.inventory_stale_ms,
            None => false,
        }
    }

    /// The number of workers the pool wants provisioned (POOL-2, resolved reading):
    /// `max(warm minimum, leased + max(idle target, tickets that could be served now))`, within
    /// the ceiling.
    #[must_use]
    pub fn desired(&self, config: &PoolConfig) -> u32 {
        let counts = self.counts();
        let mut usage = self.member_usage();
        let mut servable: u32 = 0;
        for ticket in &self.tickets {
            let used = usage.entry(ticket.member.clone()).or_insert(0);
            if *used < config.max_per_member {
                *used += 1;
                servable += 1;
            }
        }
        let wanted = config
            .warm_min
            .max(counts.leased + config.target_idle.max(servable));
        wanted.min(config.max_allocated)
    }

    /// True while a worker this document does not know (found in inventory) awaits deletion. Its
    /// code may still be running for some member whose lease the lost document held, so nothing is
    /// granted until it is confirmed gone: member limits hold across a loss of coordination data.
    #[must_use]
    pub fn orphans_pending(&self) -> bool {
        self.workers.values().any(|w| {
            w.state
                .removal()
                .is_some_and(|r| r.reason == RemovalReason::Orphan)
        })
    }

    /// Workers this document planned: everything except orphans found in inventory (a lost document
    /// planned those, so they may exceed a ceiling lowered since). The ceiling bounds this number.
    pub(crate) fn allocated_within_ceiling(&self) -> u32 {
        let orphans = self
            .workers
            .values()
            .filter(|w| {
                w.state
                    .removal()
                    .is_some_and(|r| r.reason == RemovalReason::Orphan)
            })
            .count();
        u32::try_from(self.workers.len() - orphans).unwrap_or(u32::MAX)
    }
}
