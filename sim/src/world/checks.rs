//! Every invariant: those checked after every step against the world as it is, those checked on
//! every write that landed (against the command that made it and what really happened), and the
//! liveness checks at the end of a seed.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::ids::{MemberId, TicketId, WorkerId};
use corral_core::pool::{
    Applied, Command, Effect, Event, PoolDoc, Refusal, RemovalReason, StateKind, WorkerState,
};
use corral_core::time::UnixMillis;

use super::truth::{LeaseEnd, LeaseTruth};
use super::{Actor, CONVERGENCE_WINDOW_MS, ClientState, World};
use crate::faults::Invariant;

/// The pool's target as decision 0004 reads POOL-2, computed here on its own:
/// `max(warm minimum, leased + max(idle target, tickets that could be served now))`, within the
/// ceiling. Workers provisioned above it are burst capacity.
fn target(doc: &PoolDoc, config: &corral_core::pool::PoolConfig) -> u32 {
    let mut leased = 0;
    let mut usage: BTreeMap<&MemberId, u32> = BTreeMap::new();
    for worker in doc.workers().values() {
        let member = match &worker.state {
            WorkerState::Leased(lease) => {
                leased += 1;
                Some(&lease.member)
            }
            WorkerState::Retiring(removal) | WorkerState::Quarantined(removal) => {
                removal.holds_member.as_ref()
            }
            WorkerState::Creating { .. } | WorkerState::Warm | WorkerState::Resetting { .. } => {
                None
            }
        };
        if let Some(member) = member {
            *usage.entry(member).or_insert(0) += 1;
        }
    }
    let mut servable = 0;
    for ticket in doc.tickets() {
        let used = usage.entry(&ticket.member).or_insert(0);
        if *used < config.max_per_member {
            *used += 1;
            servable += 1;
        }
    }
    config
        .warm_min
        .max(leased + config.target_idle.max(servable))
        .min(config.max_allocated)
}

/// Workers that are or will become usable.
fn provisioned(doc: &PoolDoc) -> u32 {
    doc.workers()
        .values()
        .filter(|w| {
            matches!(
                w.state.kind(),
                StateKind::Creating | StateKind::Warm | StateKind::Leased | StateKind::Resetting
            )
        })
        .count() as u32
}

/// Grants this transition made (a repeated acquire's answer repeats an older grant).
fn new_grants<'a>(
    applied: &'a Applied,
    after: &'a PoolDoc,
    now: UnixMillis,
) -> impl Iterator<Item = (TicketId, WorkerId)> + 'a {
    applied.events.iter().filter_map(move |event| match event {
        Event::Granted { ticket, worker, .. }
            if after.workers().get(worker).is_some_and(|w| w.since == now) =>
        {
            Some((*ticket, *worker))
        }
        _ => None,
    })
}

impl World {
    /// Judges one write that landed: `command`, sent by `actor`, turned `before` (none: the store
    /// held no document) into `after` at deployment time `now`, doing `applied`.
    pub(super) fn after_write(
        &mut self,
        actor: Actor,
        command: &Command,
        before: Option<&PoolDoc>,
        applied: &Applied,
        after: &PoolDoc,
        now: UnixMillis,
    ) {
        self.check_inventory_order(command, before, after, now);
        self.record_inventory(command, after, now);
        self.record_tickets(command, applied, now);
        for effect in &applied.effects {
            if let Effect::Create {
                worker,
                claim_deadline: Some(deadline),
                ..
            } = effect
            {
                self.truth.claim_deadline.insert(*worker, *deadline);
            }
        }
        self.check_stale_image(actor, command, applied);
        self.check_fifo(applied, after, now);
        self.check_refusals(command, before, applied, now);
        self.check_admission(applied, after, now);
        if let Some(before) = before {
            self.check_stack_routed(command, before, applied, after, now);
            self.check_lease_integrity(command, before, after, now);
            self.check_clean_not_discarded(command, before, after);
            if let Command::Tick { .. } = command {
                self.check_burst_linger(before, after, now);
                self.check_churn(before, applied, after);
                self.check_wasteful_create(applied, after);
            }
            self.record_lease_ends(command, before, after, now);
        }
        self.record_leases(command, applied, after, now);
    }

    /// A listing older than one the document already took changes no worker.
    fn check_inventory_order(
        &mut self,
        command: &Command,
        before: Option<&PoolDoc>,
        after: &PoolDoc,
        now: UnixMillis,
    ) {
        let (Command::InventoryObserved { as_of, .. }, Some(before)) = (command, before) else {
            return;
        };
        let Some(seen) = self.truth.inventory_as_of.get(&before.epoch()).copied() else {
            return;
        };
        if (*as_of).min(now) >= seen {
            return;
        }
        let unchanged = before.workers() == after.workers();
        self.check(Invariant::InventoryInOrder, unchanged, || {
            format!("a listing as of {as_of}, older than {seen}, changed the pool's workers")
        });
    }

    fn record_inventory(&mut self, command: &Command, after: &PoolDoc, now: UnixMillis) {
        if let Command::InventoryObserved { as_of, .. } = command {
            let as_of = (*as_of).min(now);
            let seen = self
                .truth
                .inventory_as_of
                .entry(after.epoch())
                .or_insert(as_of);
            *seen = (*seen).max(as_of);
        }
    }

    fn record_tickets(&mut self, command: &Command, applied: &Applied, now: UnixMillis) {
        let Command::Acquire {
            ticket, wait_ms, ..
        } = command
        else {
            return;
        };
        let admitted = matches!(
            applied.answer(*ticket),
            Some(Event::Queued { .. } | Event::Granted { .. })
        );
        if admitted && !self.truth.ticket_order.contains_key(ticket) {
            let order = self.truth.ticket_order.len() as u64;
            self.truth.ticket_order.insert(*ticket, order);
            let deadline = now.plus_ms((*wait_ms).min(self.config.acquire_wait_ms));
            self.truth.ticket_deadline.insert(*ticket, deadline);
        }
    }

    fn record_leases(
        &mut self,
        command: &Command,
        applied: &Applied,
        after: &PoolDoc,
        now: UnixMillis,
    ) {
        let grants: Vec<(TicketId, WorkerId)> = new_grants(applied, after, now).collect();
        for (ticket, worker) in grants {
            let token = after.workers()[&worker].token;
            self.truth.leases.insert(
                ticket,
                LeaseTruth {
                    worker,
                    token,
                    renewed_at: now,
                    ended: None,
                },
            );
        }
        if let Command::Heartbeat { lease, token, .. } = command
            && applied
                .events
                .iter()
                .any(|e| matches!(e, Event::Renewed { lease: l, .. } if l == lease))
            && let Some(truth) = self.truth.leases.get_mut(lease)
            && truth.token == *token
        {
            truth.renewed_at = now;
        }
    }

    /// Leases that ended in this write: by their holder's release, or taken over.
    fn record_lease_ends(
        &mut self,
        command: &Command,
        before: &PoolDoc,
        after: &PoolDoc,
        now: UnixMillis,
    ) {
        for (id, worker) in before.workers() {
            let WorkerState::Leased(lease) = &worker.state else {
                continue;
            };
            let still = matches!(
                after.workers().get(id).map(|w| &w.state),
                Some(WorkerState::Leased(l)) if l.id == lease.id
            );
            if still {
                continue;
            }
            // A release that comes after the lease expired finds it taken over, not released.
            let over = lease.expires_at <= now
                || worker
                    .claim_deadline
                    .is_some_and(|deadline| deadline <= now);
            let by_holder = !over
                && match command {
                    Command::Release { lease: l, .. } => *l == lease.id,
                    Command::Cancel { ticket } => *ticket == lease.id,
                    _ => false,
                };
            if let Some(truth) = self.truth.leases.get_mut(&lease.id) {
                truth.ended = Some(if by_holder {
                    LeaseEnd::Released
                } else {
                    LeaseEnd::TakenOver
                });
            }
        }
    }

    /// POOL-12: every create is from the image of the controller whose tick ordered it, and that
    /// controller, when it is the live one, runs the current release.
    fn check_stale_image(&mut self, actor: Actor, command: &Command, applied: &Applied) {
        for effect in &applied.effects {
            let Effect::Create { image, worker, .. } = effect else {
                continue;
            };
            let ordered_by = match command {
                Command::Tick { image } => Some(image.clone()),
                _ => None,
            };
            let live = actor == Actor::Controller(self.controller.incarnation);
            let release = self.controller.release.clone();
            let fresh = ordered_by.as_ref() == Some(image) && (!live || *image == release);
            self.check(Invariant::NoStaleImage, fresh, || {
                format!(
                    "{worker} created from {image}, ordered by {actor:?} ticking {ordered_by:?}, while the controller runs {release}"
                )
            });
        }
    }

    /// FIFO as POOL-3 resolves it: a grant never passes over an older waiting ticket whose member
    /// is under the limit (even after every grant of this transition).
    fn check_fifo(&mut self, applied: &Applied, after: &PoolDoc, now: UnixMillis) {
        let usage = after.member_usage();
        let grants: Vec<(TicketId, WorkerId)> = new_grants(applied, after, now).collect();
        for (ticket, _) in grants {
            let Some(granted_order) = self.truth.ticket_order.get(&ticket).copied() else {
                continue;
            };
            let passed = after
                .tickets()
                .find(|waiting| {
                    let older = self
                        .truth
                        .ticket_order
                        .get(&waiting.id)
                        .is_some_and(|o| *o < granted_order);
                    older
                        && usage.get(&waiting.member).copied().unwrap_or(0)
                            < self.config.max_per_member
                })
                .map(|t| t.id);
            self.check(Invariant::Fifo, passed.is_none(), || {
                format!("{ticket} granted past older eligible {passed:?}")
            });
        }
    }

    /// A grant hands a ticket a worker that does not suit its run
    /// ([`corral_core::pool::Worker::suits`]) only when no worker that does is still grantable
    /// after every grant of this transition (decision 0058).
    fn check_stack_routed(
        &mut self,
        command: &Command,
        before: &PoolDoc,
        applied: &Applied,
        after: &PoolDoc,
        now: UnixMillis,
    ) {
        let grants: Vec<(TicketId, WorkerId)> = new_grants(applied, after, now).collect();
        for (ticket, worker) in grants {
            let wanted = match command {
                Command::Acquire {
                    ticket: t, stack, ..
                } if *t == ticket => Some(*stack),
                _ => before.tickets().find(|t| t.id == ticket).map(|t| t.stack),
            };
            let Some(wanted) = wanted else {
                continue;
            };
            let Some(suited) = before
                .workers()
                .get(&worker)
                .map(|w| w.suits(wanted, now, &self.config))
            else {
                continue;
            };
            let passed = after
                .workers()
                .iter()
                .find(|(_, w)| w.grantable(now, &self.config) && w.suits(wanted, now, &self.config))
                .map(|(id, _)| *id);
            self.check(Invariant::StackRouted, suited || passed.is_none(), || {
                format!(
                    "{ticket} (stack: {wanted}) granted {worker}, which did not suit it, \
                         while {passed:?} did and stayed warm"
                )
            });
        }
    }

    /// Every refusal names what actually happened.
    fn check_refusals(
        &mut self,
        command: &Command,
        before: Option<&PoolDoc>,
        applied: &Applied,
        now: UnixMillis,
    ) {
        for event in &applied.events {
            let Event::Refused { ticket, reason } = event else {
                continue;
            };
            let truthful = self.refusal_is_truthful(command, before, *ticket, *reason, now);
            self.check(Invariant::RefusalTruthful, truthful.is_ok(), || {
                format!(
                    "{ticket} refused {} on {command:?}, but {}",
                    reason.code(),
                    truthful.err().unwrap_or_default()
                )
            });
        }
    }

    /// `Ok` when `reason` is what really happened to `ticket`; otherwise what did.
    fn refusal_is_truthful(
        &self,
        command: &Command,
        before: Option<&PoolDoc>,
        ticket: TicketId,
        reason: Refusal,
        now: UnixMillis,
    ) -> Result<(), String> {
        let about = |what: &str| what.to_string();
        match reason {
            Refusal::QueueFull => {
                let waiting =
                    before.map_or(0, |doc| doc.tickets().filter(|t| t.deadline >= now).count());
                let is_acquire =
                    matches!(command, Command::Acquire { ticket: t, .. } if *t == ticket);
                if is_acquire && waiting >= self.config.acquire_queue_max as usize {
                    Ok(())
                } else {
                    Err(format!(
                        "{waiting} tickets waited, bound {}",
                        self.config.acquire_queue_max
                    ))
                }
            }
            Refusal::WaitTimeout => match self.truth.ticket_deadline.get(&ticket) {
                Some(deadline) if *deadline < now => Ok(()),
                Some(deadline) => Err(format!("its deadline {deadline} had not passed")),
                None => Err(about("it never waited")),
            },
            Refusal::InventoryUnavailable => {
                let fresh = before.is_some_and(|doc| {
                    self.truth
                        .inventory_fresh(doc.epoch(), now, self.config.inventory_stale_ms)
                });
                if fresh {
                    Err(about("the inventory was fresh"))
                } else {
                    Ok(())
                }
            }
            Refusal::TicketConflict => Err(about("every ticket id is unique")),
            Refusal::TicketUnknown => {
                // A ticket past its deadline expires first, in the same transition.
                let known = before.is_some_and(|doc| {
                    doc.tickets().any(|t| t.id == ticket && t.deadline >= now)
                        || doc
                            .workers()
                            .values()
                            .any(|w| matches!(&w.state, WorkerState::Leased(l) if l.id == ticket))
                });
                if known {
                    Err(about("the ticket was waiting or held"))
                } else {
                    Ok(())
                }
            }
            Refusal::LeaseUnknown | Refusal::StaleToken | Refusal::LeaseExpired => {
                self.lease_refusal_is_truthful(command, before, ticket, reason, now)
            }
            Refusal::ClaimExpired => {
                let worker = match command {
                    Command::Heartbeat { worker, .. } | Command::Release { worker, .. } => {
                        Some(*worker)
                    }
                    _ => None,
                };
                match worker.and_then(|w| self.truth.claim_deadline.get(&w)) {
                    Some(deadline) if *deadline <= now => Ok(()),
                    _ => Err(about("no claim had ended")),
                }
            }
        }
    }

    fn lease_refusal_is_truthful(
        &self,
        command: &Command,
        before: Option<&PoolDoc>,
        lease: TicketId,
        reason: Refusal,
        now: UnixMillis,
    ) -> Result<(), String> {
        let (worker, token) = match command {
            Command::Heartbeat { worker, token, .. } | Command::Release { worker, token, .. } => {
                (*worker, *token)
            }
            // A cancel releases the lease its ticket got, with the lease's own token.
            Command::Cancel { ticket } => {
                let held = before.and_then(|doc| {
                    doc.workers().iter().find_map(|(id, w)| match &w.state {
                        WorkerState::Leased(l) if l.id == *ticket => Some((*id, w.token)),
                        _ => None,
                    })
                });
                match held {
                    Some(held) => held,
                    None => return Err(format!("{ticket} held no lease")),
                }
            }
            other => return Err(format!("{other:?} is not about a lease")),
        };
        let state = before.and_then(|doc| doc.workers().get(&worker));
        let held = state.and_then(|w| match &w.state {
            WorkerState::Leased(l) if l.id == lease => Some(w.token),
            _ => None,
        });
        let removed_under_it = state
            .and_then(|w| w.state.removal())
            .is_some_and(|r| r.lease == Some(lease));
        let truth = self.truth.leases.get(&lease);
        let ended = truth.and_then(|t| t.ended);
        let expired =
            truth.is_some_and(|t| self.truth.lease_expiry(t, self.config.lease_ttl_ms) <= now);
        match reason {
            // Never granted there, gone with its worker, or ended by its holder's own release.
            Refusal::LeaseUnknown
                if held.is_none() && (!removed_under_it || ended == Some(LeaseEnd::Released)) =>
            {
                Ok(())
            }
            Refusal::StaleToken if held.is_some_and(|t| t != token) => Ok(()),
            Refusal::LeaseExpired
                if (held == Some(token) && expired)
                    || (removed_under_it && ended == Some(LeaseEnd::TakenOver)) =>
            {
                Ok(())
            }
            _ => Err(format!(
                "the lease was {}held on {worker} (token {held:?}, sent {token}), removed under it: {removed_under_it}, expired: {expired}, ended: {ended:?}",
                if held.is_some() { "" } else { "not " }
            )),
        }
    }

    /// POOL-11: nothing granted or created while the inventory is stale.
    fn check_admission(&mut self, applied: &Applied, after: &PoolDoc, now: UnixMillis) {
        let fresh = self
            .truth
            .inventory_fresh(after.epoch(), now, self.config.inventory_stale_ms);
        let granted: Vec<(TicketId, WorkerId)> = new_grants(applied, after, now).collect();
        let created = applied
            .effects
            .iter()
            .filter(|e| matches!(e, Effect::Create { .. }))
            .count();
        for (ticket, worker) in &granted {
            let existed = self.truth.created.contains(worker);
            self.check(Invariant::GrantedWorkerExisted, existed, || {
                format!("{ticket} granted {worker}, which was never created")
            });
        }
        if granted.is_empty() && created == 0 {
            return;
        }
        let last = self.truth.inventory_as_of.get(&after.epoch()).copied();
        self.check(Invariant::AdmissionClosed, fresh, || {
            format!(
                "{granted:?} granted and {created} created at {now} with the last listing at {last:?}"
            )
        });
    }

    /// A lease is renewed or ended only by its holder's own command with its token, or taken over
    /// once it truly expired, its claim ended, or its worker was proven gone.
    fn check_lease_integrity(
        &mut self,
        command: &Command,
        before: &PoolDoc,
        after: &PoolDoc,
        now: UnixMillis,
    ) {
        for (id, worker) in before.workers() {
            let WorkerState::Leased(lease) = &worker.state else {
                continue;
            };
            let after_state = after.workers().get(id).map(|w| &w.state);
            let renewed_to = match after_state {
                Some(WorkerState::Leased(l)) if l.id == lease.id => {
                    if l.expires_at == lease.expires_at {
                        continue;
                    }
                    Some(l.expires_at)
                }
                _ => None,
            };
            let renewed = renewed_to.is_some();
            let by_holder = match command {
                Command::Heartbeat {
                    worker: w,
                    lease: l,
                    token,
                }
                | Command::Release {
                    worker: w,
                    lease: l,
                    token,
                    ..
                } => *w == *id && *l == lease.id && *token == worker.token,
                Command::Cancel { ticket } => !renewed && *ticket == lease.id,
                _ => false,
            };
            let over = lease.expires_at <= now
                || worker
                    .claim_deadline
                    .is_some_and(|deadline| deadline <= now);
            // A renewal (POOL-6) comes from the holder's heartbeat while the lease lives, and runs
            // exactly one time to live from now (capped by the claim): stale ownership stays bounded.
            let full_term = now.plus_ms(self.config.lease_ttl_ms);
            let term = worker
                .claim_deadline
                .map_or(full_term, |deadline| full_term.min(deadline));
            let legitimate = if let Some(renewed_to) = renewed_to {
                matches!(command, Command::Heartbeat { .. })
                    && by_holder
                    && !over
                    && renewed_to == term
            } else {
                by_holder
                    || (matches!(command, Command::Tick { .. }) && over)
                    || matches!(command, Command::InventoryObserved { present, .. } if !present.contains(id))
            };
            let lease_id = lease.id;
            self.check(Invariant::LeaseIntegrity, legitimate, || {
                format!(
                    "lease {lease_id} on {id} {} by {command:?} (its token {}, expires {})",
                    if renewed { "renewed" } else { "ended" },
                    worker.token,
                    lease.expires_at
                )
            });
        }
    }

    /// A reset is judged unproven only on the dirty evidence of the reset under its own token.
    fn check_clean_not_discarded(&mut self, command: &Command, before: &PoolDoc, after: &PoolDoc) {
        for (id, worker) in before.workers() {
            if worker.state.kind() != StateKind::Resetting {
                continue;
            }
            let discarded = matches!(
                after.workers().get(id).map(|w| &w.state),
                Some(WorkerState::Quarantined(r)) if matches!(r.reason, RemovalReason::ResetUnproven(_))
            );
            if !discarded {
                continue;
            }
            let own_report = matches!(
                command,
                Command::ResetReported { worker: w, token, .. } if w == id && *token == worker.token
            );
            let clean = self.truth.resets.get(&(*id, worker.token)).copied();
            let token = worker.token;
            self.check(
                Invariant::CleanNotDiscarded,
                own_report && clean == Some(false),
                || {
                    format!(
                        "{id} discarded as unproven by {command:?}; its reset under {token} left it clean: {clean:?}"
                    )
                },
            );
        }
    }

    /// Burst capacity lingers for its idle TTL, and no longer: a tick retires idle capacity above
    /// the target only once it idled for the TTL, and leaves none that did.
    fn check_burst_linger(&mut self, before: &PoolDoc, after: &PoolDoc, now: UnixMillis) {
        let ttl = self.config.burst_idle_ttl_ms;
        for (id, worker) in before.workers() {
            if worker.state.kind() != StateKind::Warm {
                continue;
            }
            let shrunk = matches!(
                after.workers().get(id).map(|w| &w.state),
                Some(WorkerState::Retiring(r)) if r.reason == RemovalReason::BurstShrink
            );
            if shrunk {
                let idle = now.ms_since(worker.since);
                self.check(Invariant::BurstLinger, idle >= ttl, || {
                    format!("{id} retired as burst capacity after idling {idle} ms, TTL {ttl} ms")
                });
            }
        }
        let target = target(after, &self.config);
        let provisioned = provisioned(after);
        let overdue: Vec<WorkerId> = after
            .workers()
            .iter()
            .filter(|(_, w)| w.state.kind() == StateKind::Warm && now.ms_since(w.since) >= ttl)
            .map(|(id, _)| *id)
            .collect();
        self.check(
            Invariant::BurstLinger,
            provisioned <= target || overdue.is_empty(),
            || {
                format!(
                    "{provisioned} provisioned above the target {target}, and {overdue:?} idled past the TTL {ttl} ms"
                )
            },
        );
    }

    /// Burst retirement takes only the true surplus: never the provisioned capacity below the
    /// target, and never in the transition that orders a create (retired and re-created at once).
    fn check_churn(&mut self, before: &PoolDoc, applied: &Applied, after: &PoolDoc) {
        let shrunk: Vec<WorkerId> = before
            .workers()
            .iter()
            .filter(|(id, w)| {
                w.state.kind() == StateKind::Warm
                    && matches!(
                        after.workers().get(*id).map(|w| &w.state),
                        Some(WorkerState::Retiring(r)) if r.reason == RemovalReason::BurstShrink
                    )
            })
            .map(|(id, _)| *id)
            .collect();
        if shrunk.is_empty() {
            return;
        }
        let created = applied
            .effects
            .iter()
            .filter(|e| matches!(e, Effect::Create { .. }))
            .count();
        let target = target(after, &self.config);
        let provisioned = provisioned(after);
        self.check(
            Invariant::NoChurn,
            created == 0 && provisioned >= target,
            || {
                format!(
                    "{shrunk:?} retired as burst capacity with {created} created in the same \
                     transition, {provisioned} provisioned against the target {target}"
                )
            },
        );
    }

    /// Nothing is created while warm capacity serves the demand: a tick's creates never take the
    /// pool above its target.
    fn check_wasteful_create(&mut self, applied: &Applied, after: &PoolDoc) {
        let created = applied
            .effects
            .iter()
            .filter(|e| matches!(e, Effect::Create { .. }))
            .count();
        if created == 0 {
            return;
        }
        let target = target(after, &self.config);
        let provisioned = provisioned(after);
        let warm = after.counts().warm;
        self.check(Invariant::NoWastefulCreate, provisioned <= target, || {
            format!(
                "{created} created with {warm} warm: {provisioned} provisioned, target {target}"
            )
        });
    }

    /// Checked after every step, against ground truth.
    pub(super) fn check_world(&mut self) {
        self.check_holders();
        let Some(doc) = self.store.peek().cloned() else {
            return;
        };
        let epoch = doc.epoch();
        for ticket in doc.tickets() {
            if !self.truth.ticket_order.contains_key(&ticket.id) {
                let order = self.truth.ticket_order.len() as u64;
                self.truth.ticket_order.insert(ticket.id, order);
                self.truth
                    .ticket_deadline
                    .insert(ticket.id, ticket.deadline);
            }
        }
        for (id, worker) in doc.workers() {
            if worker.state.removal().is_some() {
                self.truth.condemned.entry(*id).or_insert(self.now);
            }
        }
        let counted: usize = self
            .workers
            .iter()
            .filter(|(id, w)| {
                id.epoch == epoch
                    || self
                        .truth
                        .lost_epochs
                        .get(&id.epoch)
                        .is_some_and(|lost| w.created_at <= *lost)
                    || !self.truth.lost_epochs.contains_key(&id.epoch)
            })
            .count();
        let in_flight = self
            .truth
            .creates_in_flight
            .values()
            .filter(|e| **e == epoch)
            .count();
        let ceiling = self.config.max_allocated as usize;
        self.check(Invariant::Ceiling, counted + in_flight <= ceiling, || {
            format!("{counted} workers and {in_flight} creates in flight, ceiling {ceiling}")
        });
        let creates_max = self.config.max_concurrent_creates as usize;
        self.check(Invariant::CreatesInFlight, in_flight <= creates_max, || {
            format!("{in_flight} creates in flight, bound {creates_max}")
        });
        let queued = doc.tickets().count();
        let queue_max = self.config.acquire_queue_max as usize;
        self.check(Invariant::QueueBound, queued <= queue_max, || {
            format!("{queued} tickets queued, bound {queue_max}")
        });
        let uncounted = self
            .workers
            .keys()
            .find(|id| id.epoch == epoch && !doc.workers().contains_key(id))
            .copied();
        self.check(Invariant::AmbiguousCounted, uncounted.is_none(), || {
            format!("{uncounted:?} exists but the pool does not count it")
        });
        let mut unclean = None;
        for (id, worker) in doc.workers() {
            if worker.state.kind() == StateKind::Warm
                && let Some(truth) = self.workers.get(id)
                && (truth.dirty || truth.tenant.is_some())
            {
                unclean = Some(*id);
            }
        }
        self.check(Invariant::WarmIsClean, unclean.is_none(), || {
            format!("{unclean:?} is warm but dirty or occupied")
        });
    }

    /// A holder that runs (not paused, its replica alive) never believes it holds a lease past the
    /// lease's true expiry.
    fn check_holders(&mut self) {
        let now = UnixMillis(self.now);
        let mut late: Option<(u64, TicketId, UnixMillis)> = None;
        for (id, client) in &self.clients {
            let Some(holder) = &client.holder else {
                continue;
            };
            let replica = &self.replicas[client.replica];
            let running = replica.alive
                && replica.incarnation == client.incarnation
                && client.paused_until.max(replica.paused_until) < self.now;
            if !running || !holder.holds() {
                continue;
            }
            let Some(lease) = self.truth.leases.get(&client.ticket) else {
                continue;
            };
            // The holder cannot know a claim's deadline: it learns that one from a refusal.
            let expiry = lease.renewed_at.plus_ms(self.config.lease_ttl_ms);
            if now > expiry {
                late = Some((*id, client.ticket, expiry));
            }
        }
        self.check(Invariant::LossLearned, late.is_none(), || {
            let (client, ticket, expiry) = late.unwrap_or((0, TicketId(0), UnixMillis(0)));
            format!("client {client} still believes it holds {ticket}, which expired at {expiry}")
        });
    }

    /// Without faults, every client is served or refused before its deadline, and the pool settles.
    pub(super) fn check_liveness(&mut self) {
        let slack_ms = 3_000;
        let late: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| c.in_liveness && c.state != ClientState::Arriving)
            .filter(|(_, c)| {
                c.resolved_at
                    .is_none_or(|at| at > c.arrived_at + c.wait_ms + slack_ms)
            })
            .map(|(id, _)| *id)
            .collect();
        self.check(Invariant::LivenessServed, late.is_empty(), || {
            format!("clients {late:?} neither served nor refused before their deadline")
        });
        let converged = self.converged_at.is_some();
        let last = self.last_unsettled.clone();
        self.check(Invariant::LivenessConverged, converged, || {
            format!("pool never returned to its target in the final window: {last}")
        });
    }

    /// In the final window of the liveness phase: is the pool at its target, with every worker it
    /// counts existing and nothing orphaned? (Platform claims expire and are replaced on their own
    /// schedule, so a single moment at the end is not enough; a settled moment in the window is.)
    pub(super) fn observe_convergence(&mut self) {
        if !self.liveness
            || self.converged_at.is_some()
            || self.now + CONVERGENCE_WINDOW_MS < self.end_ms
        {
            return;
        }
        let Some(doc) = self.store.peek() else {
            return;
        };
        let counts = doc.counts();
        let target = self
            .config
            .warm_min
            .max(self.config.target_idle)
            .min(self.config.max_allocated);
        let doc_ids: BTreeSet<WorkerId> = doc.workers().keys().copied().collect();
        let true_ids: BTreeSet<WorkerId> = self.workers.keys().copied().collect();
        let settled = counts.warm == target
            && counts.allocated() == target
            && doc.tickets().count() == 0
            && doc_ids == true_ids;
        if settled {
            self.converged_at = Some(self.now);
        } else {
            self.last_unsettled =
                format!("target {target}, {counts:?}, pool knows {doc_ids:?}, {true_ids:?} exist");
        }
    }
}
