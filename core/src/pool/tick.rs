//! The controller's tick: deadlines fired, deletes retried, stale images retired, the queue
//! served, burst capacity shrunk, creates planned.

use super::config::{Mutation, PoolConfig, PoolMode};
use super::doc::{
    Applied, Effect, Event, PoolDoc, Refusal, RemovalReason, StateKind, Worker, WorkerState,
};
use crate::ids::{ImageId, WorkerId};
use crate::time::UnixMillis;

impl PoolDoc {
    pub(super) fn tick(
        &mut self,
        controller_image: &ImageId,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        self.fire_deadlines(now, config, out);
        self.retry_deletes(now, config, out);
        self.retire_stale_image(now, out);
        self.dispatch(now, config, out);
        self.shrink(now, config, out);
        self.plan_creates(controller_image, now, config, out);
    }

    /// Expired leases, platform claims past their deadline, and unreported creates and resets.
    pub(super) fn fire_deadlines(
        &mut self,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let mut due: Vec<(WorkerId, RemovalReason)> = Vec::new();
        for (id, worker) in &self.workers {
            let claim_over = worker
                .claim_deadline
                .is_some_and(|deadline| deadline <= now)
                && worker.state.removal().is_none();
            let reason = match &worker.state {
                _ if claim_over => Some(RemovalReason::ClaimExpired),
                WorkerState::Leased(lease) if lease.expires_at <= now => {
                    Some(RemovalReason::LeaseExpired)
                }
                WorkerState::Resetting { deadline, .. } if *deadline <= now => {
                    Some(RemovalReason::ResetTimeout)
                }
                WorkerState::Creating { deadline } if *deadline <= now => {
                    Some(RemovalReason::CreateTimeout)
                }
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
    pub(super) fn take_over(
        &mut self,
        id: WorkerId,
        reason: RemovalReason,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let Some(worker) = self.workers.get(&id) else {
            return;
        };
        let lease = match &worker.state {
            WorkerState::Leased(lease) => Some(lease.clone()),
            _ => None,
        };
        if let Some(lease) = &lease {
            out.events.push(Event::LeaseLost {
                lease: lease.id,
                worker: id,
                reason,
            });
            if reason == RemovalReason::LeaseExpired && config.broken(Mutation::TakeoverReassign) {
                // The broken rule: hand the expired endpoint straight to the next ticket.
                self.set_state(id, WorkerState::Warm, now, config);
                return;
            }
        }
        let holds_member = lease.as_ref().map(|l| l.member.clone());
        self.begin_removal(id, reason, holds_member, lease.map(|l| l.id), now, out);
    }

    pub(super) fn retry_deletes(
        &mut self,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        for (id, worker) in &mut self.workers {
            let removal = match &mut worker.state {
                WorkerState::Retiring(removal) | WorkerState::Quarantined(removal) => removal,
                WorkerState::Creating { .. }
                | WorkerState::Warm
                | WorkerState::Leased(_)
                | WorkerState::Resetting { .. } => continue,
            };
            if now.ms_since(removal.delete_ordered_at) >= config.delete_retry_ms {
                removal.delete_ordered_at = now;
                out.effects.push(Effect::Delete {
                    worker: *id,
                    token: worker.token,
                });
            }
        }
    }

    pub(super) fn retire_stale_image(&mut self, now: UnixMillis, out: &mut Applied) {
        let Some(image) = self.image.clone() else {
            return;
        };
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

    pub(super) fn expire_tickets(
        &mut self,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let before = self.tickets.len();
        let mut expired = Vec::new();
        // The broken rule of `grant-after-deadline`: a ticket lives its whole wait again.
        let overtime_ms = if config.broken(Mutation::GrantAfterDeadline) {
            config.acquire_wait_ms
        } else {
            0
        };
        self.tickets.retain(|t| {
            let keep = t.deadline.plus_ms(overtime_ms) >= now;
            if !keep {
                expired.push(t.id);
            }
            keep
        });
        debug_assert_eq!(before, self.tickets.len() + expired.len());
        for ticket in expired {
            out.events.push(Event::Refused {
                ticket,
                reason: Refusal::WaitTimeout,
            });
        }
    }

    /// Retires idle workers above the target once they have idled for the burst TTL.
    pub(super) fn shrink(&mut self, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        let surplus = self
            .counts()
            .provisioned()
            .saturating_sub(self.desired(config));
        if surplus == 0 || config.broken(Mutation::BurstNeverRetired) {
            return;
        }
        let linger_ms = if config.broken(Mutation::BurstLingerShort) {
            0
        } else {
            config.burst_idle_ttl_ms
        };
        let mut idle: Vec<(UnixMillis, WorkerId)> = self
            .workers
            .iter()
            .filter(|(_, w)| {
                w.state.kind() == StateKind::Warm && now.ms_since(w.since) >= linger_ms
            })
            .map(|(id, w)| (w.since, *id))
            .collect();
        idle.sort();
        let retired = if config.broken(Mutation::OverRetire) {
            surplus + 1
        } else {
            surplus
        };
        for (_, id) in idle.into_iter().take(retired as usize) {
            self.begin_removal(id, RemovalReason::BurstShrink, None, None, now, out);
        }
    }

    /// Orders creates toward the target, within the ceiling and the creation concurrency, only
    /// while admission is open and only from the image this controller published (POOL-12).
    pub(super) fn plan_creates(
        &mut self,
        controller_image: &ImageId,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        if !self.admission_open(now, config) {
            return;
        }
        let Some(image) = self.image.clone() else {
            return;
        };
        if &image != controller_image && !config.broken(Mutation::StaleImage) {
            return;
        }
        let counts = self.counts();
        let provisioned = if config.broken(Mutation::CreateWhileWarm) {
            counts.provisioned() - counts.warm
        } else {
            counts.provisioned()
        };
        let missing = self.desired(config).saturating_sub(provisioned);
        let create_room = if config.broken(Mutation::CreateConcurrency) {
            u32::MAX
        } else {
            config
                .max_concurrent_creates
                .saturating_sub(counts.creating)
        };
        // Orphans count here: their capacity is freed only once they are confirmed absent.
        let allocated = u32::try_from(self.workers.len()).unwrap_or(u32::MAX);
        let ceiling_room = if config.broken(Mutation::Ceiling) {
            u32::MAX
        } else {
            config.max_allocated.saturating_sub(allocated)
        };
        let creates = missing.min(create_room).min(ceiling_room);
        for _ in 0..creates {
            let worker = WorkerId {
                epoch: self.epoch,
                seq: self.next_seq,
            };
            self.next_seq += 1;
            let token = self.mint_token();
            let claim_deadline = match config.mode {
                PoolMode::Controller => None,
                PoolMode::PlatformOperator { claim_lifetime_ms } => {
                    Some(now.plus_ms(claim_lifetime_ms))
                }
            };
            let deadline = now.plus_ms(config.create_timeout_ms);
            self.workers.insert(
                worker,
                Worker {
                    image: image.clone(),
                    state: WorkerState::Creating { deadline },
                    token,
                    since: now,
                    confirmed_at: None,
                    claim_deadline,
                    stack: false,
                    leased: false,
                },
            );
            out.effects.push(Effect::Create {
                worker,
                token,
                image: image.clone(),
                claim_deadline,
            });
        }
    }
}
