//! The transition: one `match` over the command, one arm per case.

use std::collections::{BTreeMap, BTreeSet};

use super::config::{Mutation, PoolConfig, PoolMode};
use super::doc::{
    Applied, Command, Disposition, Effect, Event, Lease, Outcome, PoolDoc, Refusal, Removal,
    RemovalReason, StateCounts, StateKind, Ticket, TicketStatus, Worker, WorkerState,
};
use crate::ids::{ImageId, LeaseId, LeaseScope, MemberId, OpToken, TicketId, WorkerId};
use crate::reset::{self, ResetEvidence, Verdict};
use crate::time::UnixMillis;

/// Removal is either by plan (retire) or for cause (quarantine).
#[derive(Clone, Copy, PartialEq, Eq)]
enum RemovalKind {
    Retire,
    Quarantine,
}

impl RemovalKind {
    fn for_reason(reason: RemovalReason) -> Self {
        if reason.is_for_cause() { Self::Quarantine } else { Self::Retire }
    }
}

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
        }
        counts
    }

    /// Where `ticket` stands.
    #[must_use]
    pub fn ticket_status(&self, ticket: TicketId) -> TicketStatus {
        if let Some(position) = self.tickets.iter().position(|t| t.id == ticket) {
            return TicketStatus::Queued { position: u32::try_from(position).unwrap_or(u32::MAX) };
        }
        for (id, worker) in &self.workers {
            if let WorkerState::Leased(lease) = &worker.state
                && lease.id == ticket
            {
                return TicketStatus::Granted { worker: *id, token: worker.token, expires_at: lease.expires_at };
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
                WorkerState::Retiring(removal) | WorkerState::Quarantined(removal) => removal.holds_member.as_ref(),
                WorkerState::Creating { .. } | WorkerState::Warm | WorkerState::Resetting { .. } => None,
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
        match self.inventory_as_of {
            Some(as_of) => now.ms_since(as_of) <= config.inventory_stale_ms,
            None => false,
        }
    }

    /// Applies one command at deployment time `now`. A refused command changes nothing but the
    /// housekeeping every command does (expiring tickets whose deadline passed).
    pub fn apply(&mut self, command: Command, now: UnixMillis, config: &PoolConfig) -> Applied {
        let now = now.max(self.clock);
        self.clock = now;
        let mut out = Applied::default();
        // No ticket outlives its deadline, whatever the command (so none is granted after it).
        self.expire_tickets(now, &mut out);
        match command {
            Command::Acquire { ticket, member, scope, wait_ms } => {
                self.acquire(ticket, member, scope, wait_ms, now, config, &mut out);
            }
            Command::Cancel { ticket } => self.cancel(ticket, now, config, &mut out),
            Command::Heartbeat { worker, lease, token } => self.heartbeat(worker, lease, token, now, config, &mut out),
            Command::Release { worker, lease, token, disposition } => {
                self.release(worker, lease, token, disposition, now, config, &mut out);
            }
            Command::CreateReported { worker, token, outcome } => {
                self.create_reported(worker, token, outcome, now, config, &mut out);
            }
            Command::ResetReported { worker, token, evidence } => {
                self.reset_reported(worker, token, &evidence, now, config, &mut out);
            }
            Command::DeleteReported { worker, token, outcome } => {
                self.delete_reported(worker, token, outcome, now, config, &mut out);
            }
            Command::PublishImage { image } => self.publish_image(image, now, config, &mut out),
            Command::InventoryObserved { as_of, present } => self.inventory_observed(as_of, &present, now, config, &mut out),
            Command::Tick { image } => self.tick(&image, now, config, &mut out),
        }
        if !config.any_broken() {
            self.invariants(config);
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        ticket: TicketId,
        member: MemberId,
        scope: LeaseScope,
        wait_ms: u64,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        // A repeated acquire (after an unknown write outcome) answers with where the ticket stands.
        if let Some(existing) = self.tickets.iter().find(|t| t.id == ticket)
            && (existing.member != member || existing.scope != scope)
        {
            out.events.push(Event::Refused { ticket, reason: Refusal::TicketConflict });
            return;
        }
        match self.ticket_status(ticket) {
            TicketStatus::Queued { position } => {
                out.events.push(Event::Queued { ticket, position });
                return;
            }
            TicketStatus::Granted { worker, token, expires_at } => {
                out.events.push(Event::Granted { ticket, worker, token, expires_at });
                return;
            }
            TicketStatus::Gone => {}
        }
        if !self.admission_open(now, config) {
            out.events.push(Event::Refused { ticket, reason: Refusal::InventoryUnavailable });
            return;
        }
        if self.tickets.len() >= config.acquire_queue_max as usize {
            out.events.push(Event::Refused { ticket, reason: Refusal::QueueFull });
            return;
        }
        let deadline = now.plus_ms(wait_ms.min(config.acquire_wait_ms));
        self.tickets.push_back(Ticket { id: ticket, member, scope, deadline });
        self.dispatch(now, config, out);
        if let TicketStatus::Queued { position } = self.ticket_status(ticket) {
            out.events.push(Event::Queued { ticket, position });
        }
    }

    fn cancel(&mut self, ticket: TicketId, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        if let Some(index) = self.tickets.iter().position(|t| t.id == ticket) {
            self.tickets.remove(index);
            out.events.push(Event::Withdrawn { ticket });
            return;
        }
        if let TicketStatus::Granted { worker, token, .. } = self.ticket_status(ticket) {
            self.release(worker, ticket, token, Disposition::Reset, now, config, out);
            return;
        }
        out.events.push(Event::Refused { ticket, reason: Refusal::TicketUnknown });
    }

    /// Finds the lease `lease` on `worker` when `token` is its token; otherwise says why not.
    fn lease_check(&self, worker: WorkerId, lease: LeaseId, token: OpToken) -> Result<&Lease, Refusal> {
        let Some(found) = self.workers.get(&worker) else {
            return Err(Refusal::LeaseUnknown);
        };
        match &found.state {
            WorkerState::Leased(current) if current.id == lease => {
                if found.token == token { Ok(current) } else { Err(Refusal::StaleToken) }
            }
            WorkerState::Retiring(removal) | WorkerState::Quarantined(removal) if removal.lease == Some(lease) => {
                Err(match removal.reason {
                    RemovalReason::ClaimExpired => Refusal::ClaimExpired,
                    _ => Refusal::LeaseExpired,
                })
            }
            _ => Err(Refusal::LeaseUnknown),
        }
    }

    fn heartbeat(&mut self, worker: WorkerId, lease: LeaseId, token: OpToken, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let expires_at = match self.lease_check(worker, lease, token) {
            Ok(current) => current.expires_at,
            Err(reason) => {
                out.events.push(Event::Refused { ticket: lease, reason });
                return;
            }
        };
        let claim_deadline = self.workers.get(&worker).and_then(|w| w.claim_deadline);
        if claim_deadline.is_some_and(|deadline| deadline <= now) {
            // A renewal only confirms the worker still exists; past its claim's deadline it is gone.
            self.take_over(worker, RemovalReason::ClaimExpired, now, config, out);
            out.events.push(Event::Refused { ticket: lease, reason: Refusal::ClaimExpired });
            return;
        }
        if expires_at <= now {
            // Expired but not yet swept: the holder is too late; take the worker over now.
            self.take_over(worker, RemovalReason::LeaseExpired, now, config, out);
            out.events.push(Event::Refused { ticket: lease, reason: Refusal::LeaseExpired });
            return;
        }
        let renewed = lease_expiry(now, config, claim_deadline);
        if let Some(WorkerState::Leased(current)) = self.workers.get_mut(&worker).map(|w| &mut w.state) {
            current.expires_at = renewed;
        }
        out.events.push(Event::Renewed { lease, expires_at: renewed });
    }

    #[allow(clippy::too_many_arguments)]
    fn release(
        &mut self,
        worker: WorkerId,
        lease: LeaseId,
        token: OpToken,
        disposition: Disposition,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        // A repeated release (after an unknown write outcome) re-issues the reset it ordered.
        if let Some(found) = self.workers.get(&worker)
            && let WorkerState::Resetting { after, .. } = &found.state
            && *after == lease
        {
            out.effects.push(Effect::Reset { worker, token: found.token });
            out.events.push(Event::Released { lease });
            return;
        }
        if let Some(removal) = self.workers.get(&worker).and_then(|w| w.state.removal())
            && removal.lease == Some(lease)
            && removal.reason == RemovalReason::DiscardedByHolder
        {
            out.events.push(Event::Released { lease });
            return;
        }
        let expires_at = match self.lease_check(worker, lease, token) {
            Ok(current) => current.expires_at,
            Err(reason) => {
                out.events.push(Event::Refused { ticket: lease, reason });
                return;
            }
        };
        if expires_at <= now {
            self.take_over(worker, RemovalReason::LeaseExpired, now, config, out);
            out.events.push(Event::Refused { ticket: lease, reason: Refusal::LeaseExpired });
            return;
        }
        let stale_image = self.workers.get(&worker).is_some_and(|w| Some(&w.image) != self.image.as_ref());
        match disposition {
            Disposition::Discard => {
                self.begin_removal(worker, RemovalReason::DiscardedByHolder, None, Some(lease), now, out);
            }
            Disposition::Reset if stale_image => {
                self.begin_removal(worker, RemovalReason::StaleImage, None, Some(lease), now, out);
            }
            Disposition::Reset => {
                let deadline = now.plus_ms(config.reset_timeout_ms);
                let token = self.set_state(worker, WorkerState::Resetting { after: lease, deadline }, now, config);
                out.effects.push(Effect::Reset { worker, token });
            }
        }
        out.events.push(Event::Released { lease });
        self.dispatch(now, config, out);
    }

    fn create_reported(&mut self, worker: WorkerId, token: OpToken, outcome: Outcome, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let Some(found) = self.workers.get(&worker) else {
            out.events.push(Event::StaleReport { worker });
            return;
        };
        if found.token != token || found.state.kind() != StateKind::Creating {
            out.events.push(Event::StaleReport { worker });
            return;
        }
        match outcome {
            Outcome::Done => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.confirmed_at = Some(now);
                }
                self.become_warm(worker, now, config, out);
            }
            Outcome::Failed => self.forget(worker, out),
            Outcome::Unknown if config.broken(Mutation::AmbiguousFree) => self.forget(worker, out),
            Outcome::Unknown => self.begin_removal(worker, RemovalReason::AmbiguousCreate, None, None, now, out),
        }
    }

    fn reset_reported(&mut self, worker: WorkerId, token: OpToken, evidence: &ResetEvidence, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let Some(found) = self.workers.get(&worker) else {
            out.events.push(Event::StaleReport { worker });
            return;
        };
        let expected = if config.broken(Mutation::ResetToken) {
            // The broken rule: believe whatever token the report carries, in any live state.
            if !matches!(found.state.kind(), StateKind::Resetting | StateKind::Leased) {
                out.events.push(Event::StaleReport { worker });
                return;
            }
            evidence.token
        } else {
            if found.token != token || found.state.kind() != StateKind::Resetting {
                out.events.push(Event::StaleReport { worker });
                return;
            }
            found.token
        };
        match reset::judge(evidence, expected) {
            Verdict::Clean => self.become_warm(worker, now, config, out),
            Verdict::Discard(unproven) => {
                self.begin_removal(worker, RemovalReason::ResetUnproven(unproven), None, None, now, out);
            }
        }
    }

    /// A worker proven ready (created, or reset clean) is published warm, unless it was built from
    /// an image that is no longer the published one: then it retires.
    fn become_warm(&mut self, worker: WorkerId, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let stale_image = self.workers.get(&worker).is_some_and(|w| Some(&w.image) != self.image.as_ref());
        if stale_image {
            self.begin_removal(worker, RemovalReason::StaleImage, None, None, now, out);
            return;
        }
        self.set_state(worker, WorkerState::Warm, now, config);
        out.events.push(Event::WorkerWarm { worker });
        self.dispatch(now, config, out);
    }

    fn delete_reported(&mut self, worker: WorkerId, token: OpToken, outcome: Outcome, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let Some(found) = self.workers.get(&worker) else {
            out.events.push(Event::StaleReport { worker });
            return;
        };
        if found.token != token || found.state.removal().is_none() {
            out.events.push(Event::StaleReport { worker });
            return;
        }
        match outcome {
            Outcome::Done => {
                self.forget(worker, out);
                self.dispatch(now, config, out);
            }
            // Not confirmed: the worker stays counted and the delete is ordered again later.
            Outcome::Failed | Outcome::Unknown => {}
        }
    }

    fn publish_image(&mut self, image: ImageId, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        self.image = Some(image);
        self.retire_stale_image(now, out);
        self.dispatch(now, config, out);
    }

    fn inventory_observed(&mut self, as_of: UnixMillis, present: &BTreeSet<WorkerId>, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let as_of = as_of.min(now);
        self.inventory_as_of = Some(self.inventory_as_of.map_or(as_of, |seen| seen.max(as_of)));
        // Unknown workers are never adopted on trust: counted, deleted, confirmed absent, freed.
        for id in present {
            match self.workers.get_mut(id) {
                Some(known) => {
                    known.confirmed_at = Some(known.confirmed_at.map_or(as_of, |c| c.max(as_of)));
                }
                None => self.adopt_orphan(*id, as_of, now, out),
            }
        }
        let absent: Vec<WorkerId> = self.workers.keys().filter(|id| !present.contains(id)).copied().collect();
        for id in absent {
            let Some(worker) = self.workers.get(&id) else { continue };
            let proven_gone = match worker.state.removal() {
                Some(removal) => as_of > removal.absent_after,
                None => worker.state.kind() != StateKind::Creating && worker.confirmed_at.is_some_and(|c| as_of > c),
            };
            if !proven_gone {
                continue;
            }
            if let WorkerState::Leased(lease) = &worker.state {
                out.events.push(Event::LeaseLost { lease: lease.id, worker: id, reason: RemovalReason::Orphan });
            }
            self.forget(id, out);
        }
        self.dispatch(now, config, out);
    }

    fn adopt_orphan(&mut self, id: WorkerId, as_of: UnixMillis, now: UnixMillis, out: &mut Applied) {
        let token = self.mint_token();
        let removal = Removal {
            reason: RemovalReason::Orphan,
            holds_member: None,
            lease: None,
            absent_after: as_of,
            delete_ordered_at: now,
        };
        let image = ImageId(String::from("unknown"));
        self.workers.insert(
            id,
            Worker { image, state: WorkerState::Quarantined(removal), token, since: now, confirmed_at: Some(as_of), claim_deadline: None },
        );
        out.effects.push(Effect::Delete { worker: id, token });
        out.events.push(Event::WorkerRemoving { worker: id, reason: RemovalReason::Orphan });
    }

    fn tick(&mut self, controller_image: &ImageId, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        self.fire_deadlines(now, config, out);
        self.retry_deletes(now, config, out);
        self.retire_stale_image(now, out);
        self.dispatch(now, config, out);
        self.shrink(now, config, out);
        self.plan_creates(controller_image, now, config, out);
    }

    /// Expired leases, platform claims past their deadline, and unreported creates and resets.
    fn fire_deadlines(&mut self, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let mut due: Vec<(WorkerId, RemovalReason)> = Vec::new();
        for (id, worker) in &self.workers {
            let claim_over = worker.claim_deadline.is_some_and(|deadline| deadline <= now) && worker.state.removal().is_none();
            let reason = match &worker.state {
                _ if claim_over => Some(RemovalReason::ClaimExpired),
                WorkerState::Leased(lease) if lease.expires_at <= now => Some(RemovalReason::LeaseExpired),
                WorkerState::Resetting { deadline, .. } if *deadline <= now => Some(RemovalReason::ResetTimeout),
                WorkerState::Creating { deadline } if *deadline <= now => Some(RemovalReason::CreateTimeout),
                _ => None,
            };
            if let Some(reason) = reason {
                due.push((*id, reason));
            }
        }
        for (id, reason) in due {
            self.take_over(id, reason, now, config, out);
        }
    }

    /// Ends whatever a worker is doing because of `reason`: a lease on it is lost, and the worker
    /// is deleted and confirmed absent before its capacity (and its member's slot) is freed.
    fn take_over(&mut self, id: WorkerId, reason: RemovalReason, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let Some(worker) = self.workers.get(&id) else { return };
        let lease = match &worker.state {
            WorkerState::Leased(lease) => Some(lease.clone()),
            _ => None,
        };
        if let Some(lease) = &lease {
            out.events.push(Event::LeaseLost { lease: lease.id, worker: id, reason });
            if reason == RemovalReason::LeaseExpired && config.broken(Mutation::TakeoverReassign) {
                // The broken rule: hand the expired endpoint straight to the next ticket.
                self.set_state(id, WorkerState::Warm, now, config);
                return;
            }
        }
        let holds_member = lease.as_ref().map(|l| l.member.clone());
        self.begin_removal(id, reason, holds_member, lease.map(|l| l.id), now, out);
    }

    fn retry_deletes(&mut self, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        for (id, worker) in &mut self.workers {
            let removal = match &mut worker.state {
                WorkerState::Retiring(removal) | WorkerState::Quarantined(removal) => removal,
                WorkerState::Creating { .. } | WorkerState::Warm | WorkerState::Leased(_) | WorkerState::Resetting { .. } => continue,
            };
            if now.ms_since(removal.delete_ordered_at) >= config.delete_retry_ms {
                removal.delete_ordered_at = now;
                out.effects.push(Effect::Delete { worker: *id, token: worker.token });
            }
        }
    }

    fn retire_stale_image(&mut self, now: UnixMillis, out: &mut Applied) {
        let Some(image) = self.image.clone() else { return };
        let stale: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| w.state.kind() == StateKind::Warm && w.image != image)
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            self.begin_removal(id, RemovalReason::StaleImage, None, None, now, out);
        }
    }

    /// Serves the oldest ticket whose member is under
    /// its limit, while warm workers last (POOL-3, resolved reading).
    fn dispatch(&mut self, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        if !self.admission_open(now, config) {
            return;
        }
        let mut warm: Vec<(UnixMillis, WorkerId)> = self
            .workers
            .iter()
            .filter(|(_, w)| w.state.kind() == StateKind::Warm)
            .filter(|(_, w)| w.claim_deadline.is_none_or(|d| d > now.plus_ms(config.lease_heartbeat_ms)))
            .map(|(id, w)| (w.since, *id))
            .collect();
        warm.sort();
        warm.reverse(); // pop() yields the worker warm the longest
        if warm.is_empty() || self.tickets.is_empty() {
            return;
        }
        let mut usage = self.member_usage();
        let newest_first = config.broken(Mutation::Fifo);
        let mut index = 0;
        while index < self.tickets.len() && !warm.is_empty() {
            let at = if newest_first { self.tickets.len() - 1 - index } else { index };
            let member = &self.tickets[at].member;
            let used = usage.get(member).copied().unwrap_or(0);
            if used >= config.max_per_member && !config.broken(Mutation::MemberLimit) {
                index += 1;
                continue;
            }
            let Some(ticket) = self.tickets.remove(at) else { break };
            let Some((_, worker)) = warm.pop() else { break };
            *usage.entry(ticket.member.clone()).or_insert(0) += 1;
            // Removing at `at` moves the next candidate to `index` (oldest first) or keeps it at
            // `len - 1 - index` (newest first): either way `index` stays.
            self.grant(worker, ticket, now, config, out);
        }
    }

    fn grant(&mut self, worker: WorkerId, ticket: Ticket, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let claim_deadline = self.workers.get(&worker).and_then(|w| w.claim_deadline);
        let expires_at = lease_expiry(now, config, claim_deadline);
        let lease = Lease { id: ticket.id, member: ticket.member, scope: ticket.scope, expires_at };
        let token = self.set_state(worker, WorkerState::Leased(lease), now, config);
        out.events.push(Event::Granted { ticket: ticket.id, worker, token, expires_at });
    }

    fn expire_tickets(&mut self, now: UnixMillis, out: &mut Applied) {
        let before = self.tickets.len();
        let mut expired = Vec::new();
        self.tickets.retain(|t| {
            let keep = t.deadline >= now;
            if !keep {
                expired.push(t.id);
            }
            keep
        });
        debug_assert_eq!(before, self.tickets.len() + expired.len());
        for ticket in expired {
            out.events.push(Event::Refused { ticket, reason: Refusal::WaitTimeout });
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
        let wanted = config.warm_min.max(counts.leased + config.target_idle.max(servable));
        wanted.min(config.max_allocated)
    }

    /// Retires idle workers above the target once they have idled for the burst TTL.
    fn shrink(&mut self, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let surplus = self.counts().provisioned().saturating_sub(self.desired(config));
        if surplus == 0 {
            return;
        }
        let mut idle: Vec<(UnixMillis, WorkerId)> = self
            .workers
            .iter()
            .filter(|(_, w)| w.state.kind() == StateKind::Warm && now.ms_since(w.since) >= config.burst_idle_ttl_ms)
            .map(|(id, w)| (w.since, *id))
            .collect();
        idle.sort();
        for (_, id) in idle.into_iter().take(surplus as usize) {
            self.begin_removal(id, RemovalReason::BurstShrink, None, None, now, out);
        }
    }

    /// Orders creates toward the target, within the ceiling and the creation concurrency, only
    /// while admission is open and only from the image this controller published (POOL-12).
    fn plan_creates(&mut self, controller_image: &ImageId, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        if !self.admission_open(now, config) {
            return;
        }
        let Some(image) = self.image.clone() else { return };
        if &image != controller_image && !config.broken(Mutation::StaleImage) {
            return;
        }
        let counts = self.counts();
        let missing = self.desired(config).saturating_sub(counts.provisioned());
        let create_room = config.max_concurrent_creates.saturating_sub(counts.creating);
        // Orphans count here: their capacity is freed only once they are confirmed absent.
        let allocated = u32::try_from(self.workers.len()).unwrap_or(u32::MAX);
        let ceiling_room = if config.broken(Mutation::Ceiling) { u32::MAX } else { config.max_allocated.saturating_sub(allocated) };
        let creates = missing.min(create_room).min(ceiling_room);
        for _ in 0..creates {
            let worker = WorkerId { epoch: self.epoch, seq: self.next_seq };
            self.next_seq += 1;
            let token = self.mint_token();
            let claim_deadline = match config.mode {
                PoolMode::Controller => None,
                PoolMode::PlatformOperator { claim_lifetime_ms } => Some(now.plus_ms(claim_lifetime_ms)),
            };
            let deadline = now.plus_ms(config.create_timeout_ms);
            self.workers.insert(
                worker,
                Worker { image: image.clone(), state: WorkerState::Creating { deadline }, token, since: now, confirmed_at: None, claim_deadline },
            );
            out.effects.push(Effect::Create { worker, token, image: image.clone(), claim_deadline });
        }
    }

    /// Workers this document planned: everything except orphans found in inventory (a lost document
    /// planned those, so they may exceed a ceiling lowered since). The ceiling bounds this number.
    pub(crate) fn allocated_within_ceiling(&self) -> u32 {
        let orphans = self
            .workers
            .values()
            .filter(|w| w.state.removal().is_some_and(|r| r.reason == RemovalReason::Orphan))
            .count();
        u32::try_from(self.workers.len() - orphans).unwrap_or(u32::MAX)
    }

    fn begin_removal(
        &mut self,
        id: WorkerId,
        reason: RemovalReason,
        holds_member: Option<MemberId>,
        lease: Option<LeaseId>,
        now: UnixMillis,
        out: &mut Applied,
    ) {
        let removal = Removal { reason, holds_member, lease, absent_after: now, delete_ordered_at: now };
        let state = match RemovalKind::for_reason(reason) {
            RemovalKind::Retire => WorkerState::Retiring(removal),
            RemovalKind::Quarantine => WorkerState::Quarantined(removal),
        };
        let token = self.enter_state(id, state, now, true);
        out.effects.push(Effect::Delete { worker: id, token });
        out.events.push(Event::WorkerRemoving { worker: id, reason });
    }

    /// Removes a worker from the document: its capacity is free.
    fn forget(&mut self, id: WorkerId, out: &mut Applied) {
        if self.workers.remove(&id).is_some() {
            out.events.push(Event::WorkerGone { worker: id });
        }
    }

    fn mint_token(&mut self) -> OpToken {
        let token = OpToken(self.next_token);
        self.next_token += 1;
        token
    }

    /// Moves a worker to `state` with a fresh token, asserting the transition is legal.
    fn set_state(&mut self, id: WorkerId, state: WorkerState, now: UnixMillis, config: &PoolConfig) -> OpToken {
        self.enter_state(id, state, now, !config.any_broken())
    }

    /// Every state change goes through here: a fresh token, the entry time, and (unless the
    /// simulator broke a rule on purpose) the table of legal transitions.
    fn enter_state(&mut self, id: WorkerId, state: WorkerState, now: UnixMillis, check_legal: bool) -> OpToken {
        let token = self.mint_token();
        let Some(worker) = self.workers.get_mut(&id) else {
            unreachable!("state change for unknown worker {id}");
        };
        let (from, to) = (worker.state.kind(), state.kind());
        assert!(!check_legal || from.may_become(to), "illegal transition {} -> {} for {id}", from.code(), to.code());
        worker.state = state;
        worker.token = token;
        worker.since = now;
        token
    }
}

fn lease_expiry(now: UnixMillis, config: &PoolConfig, claim_deadline: Option<UnixMillis>) -> UnixMillis {
    let by_ttl = now.plus_ms(config.lease_ttl_ms);
    claim_deadline.map_or(by_ttl, |deadline| by_ttl.min(deadline))
}
