//! The lease holder's commands: acquire a ticket, cancel it, renew a lease, release it.

use super::config::{Mutation, PoolConfig};
use super::doc::{
    Applied, Disposition, Effect, Event, Lease, PoolDoc, Refusal, RemovalReason, Ticket,
    TicketStatus, WorkerState,
};
use crate::ids::{LeaseId, OpToken, TicketId, WorkerId};
use crate::time::UnixMillis;

impl PoolDoc {
    /// Queues `asked` (its deadline the wait asked for, capped) and serves the queue.
    pub(super) fn acquire(
        &mut self,
        asked: Ticket,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let ticket = asked.id;
        // A repeated acquire (after an unknown write outcome) answers with where the ticket stands.
        if let Some(existing) = self.tickets.iter().find(|t| t.id == ticket)
            && (existing.member != asked.member || existing.scope != asked.scope)
        {
            out.events.push(Event::Refused {
                ticket,
                reason: Refusal::TicketConflict,
            });
            return;
        }
        match self.ticket_status(ticket) {
            TicketStatus::Queued { position } => {
                out.events.push(Event::Queued { ticket, position });
                return;
            }
            TicketStatus::Granted {
                worker,
                token,
                expires_at,
            } => {
                out.events.push(Event::Granted {
                    ticket,
                    worker,
                    token,
                    expires_at,
                });
                return;
            }
            TicketStatus::Gone => {}
        }
        if !self.admission_open(now, config) {
            out.events.push(Event::Refused {
                ticket,
                reason: Refusal::InventoryUnavailable,
            });
            return;
        }
        if self.tickets.len() >= config.acquire_queue_max as usize
            && !config.broken(Mutation::QueueBound)
        {
            let reason = if config.broken(Mutation::RefusalReason) {
                Refusal::WaitTimeout
            } else {
                Refusal::QueueFull
            };
            out.events.push(Event::Refused { ticket, reason });
            return;
        }
        self.tickets.push_back(asked);
        self.dispatch(now, config, out);
        if let TicketStatus::Queued { position } = self.ticket_status(ticket) {
            out.events.push(Event::Queued { ticket, position });
        }
    }

    pub(super) fn cancel(
        &mut self,
        ticket: TicketId,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        if let Some(index) = self.tickets.iter().position(|t| t.id == ticket) {
            self.tickets.remove(index);
            out.events.push(Event::Withdrawn { ticket });
            return;
        }
        if let TicketStatus::Granted { worker, token, .. } = self.ticket_status(ticket) {
            self.release(worker, ticket, token, Disposition::Reset, now, config, out);
            return;
        }
        out.events.push(Event::Refused {
            ticket,
            reason: Refusal::TicketUnknown,
        });
    }

    /// Finds the lease `lease` on `worker` when `token` is its token; otherwise says why not.
    /// The broken rule of the stale-heartbeat and stale-release mutations: whatever lease the
    /// worker holds, whoever asks.
    fn lease_on(&self, worker: WorkerId) -> Result<&Lease, Refusal> {
        match self.workers.get(&worker).map(|w| &w.state) {
            Some(WorkerState::Leased(current)) => Ok(current),
            _ => Err(Refusal::LeaseUnknown),
        }
    }

    pub(super) fn lease_check(
        &self,
        worker: WorkerId,
        lease: LeaseId,
        token: OpToken,
    ) -> Result<&Lease, Refusal> {
        let Some(found) = self.workers.get(&worker) else {
            return Err(Refusal::LeaseUnknown);
        };
        match &found.state {
            WorkerState::Leased(current) if current.id == lease => {
                if found.token == token {
                    Ok(current)
                } else {
                    Err(Refusal::StaleToken)
                }
            }
            WorkerState::Retiring(removal) | WorkerState::Quarantined(removal)
                if removal.lease == Some(lease) =>
            {
                Err(match removal.reason {
                    RemovalReason::ClaimExpired => Refusal::ClaimExpired,
                    RemovalReason::LeaseExpired => Refusal::LeaseExpired,
                    // Its holder's own release ended it (a discard, or a stale image retired at
                    // the release): the lease is over, not expired.
                    RemovalReason::DiscardedByHolder
                    | RemovalReason::StaleImage
                    | RemovalReason::BurstShrink
                    | RemovalReason::ResetUnproven(_)
                    | RemovalReason::ResetTimeout
                    | RemovalReason::AmbiguousCreate
                    | RemovalReason::CreateTimeout
                    | RemovalReason::Orphan => Refusal::LeaseUnknown,
                })
            }
            _ => Err(Refusal::LeaseUnknown),
        }
    }

    pub(super) fn heartbeat(
        &mut self,
        worker: WorkerId,
        lease: LeaseId,
        token: OpToken,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let checked = if config.broken(Mutation::StaleHeartbeat) {
            self.lease_on(worker)
        } else {
            self.lease_check(worker, lease, token)
        };
        let expires_at = match checked {
            Ok(current) => current.expires_at,
            Err(reason) => {
                out.events.push(Event::Refused {
                    ticket: lease,
                    reason,
                });
                return;
            }
        };
        let claim_deadline = self.workers.get(&worker).and_then(|w| w.claim_deadline);
        if claim_deadline.is_some_and(|deadline| deadline <= now) {
            // A renewal only confirms the worker still exists; past its claim's deadline it is gone.
            self.take_over(worker, RemovalReason::ClaimExpired, now, config, out);
            out.events.push(Event::Refused {
                ticket: lease,
                reason: Refusal::ClaimExpired,
            });
            return;
        }
        if expires_at <= now && !config.broken(Mutation::ReviveExpired) {
            // Expired but not yet swept: the holder is too late; take the worker over now.
            self.take_over(worker, RemovalReason::LeaseExpired, now, config, out);
            out.events.push(Event::Refused {
                ticket: lease,
                reason: Refusal::LeaseExpired,
            });
            return;
        }
        let renewed = lease_expiry(now, config, claim_deadline);
        if let Some(WorkerState::Leased(current)) =
            self.workers.get_mut(&worker).map(|w| &mut w.state)
        {
            current.expires_at = renewed;
        }
        out.events.push(Event::Renewed {
            lease,
            expires_at: renewed,
        });
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn release(
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
            out.effects.push(Effect::Reset {
                worker,
                token: found.token,
            });
            out.events.push(Event::Released { lease });
            return;
        }
        // A repeated release whose first attempt removed the worker (a discard, or a stale image)
        // answers as the first did.
        if let Some(removal) = self.workers.get(&worker).and_then(|w| w.state.removal())
            && removal.lease == Some(lease)
            && matches!(
                removal.reason,
                RemovalReason::DiscardedByHolder | RemovalReason::StaleImage
            )
        {
            out.events.push(Event::Released { lease });
            return;
        }
        let checked = if config.broken(Mutation::StaleRelease) {
            self.lease_on(worker)
        } else {
            self.lease_check(worker, lease, token)
        };
        let expires_at = match checked {
            Ok(current) => current.expires_at,
            Err(reason) => {
                out.events.push(Event::Refused {
                    ticket: lease,
                    reason,
                });
                return;
            }
        };
        if expires_at <= now {
            self.take_over(worker, RemovalReason::LeaseExpired, now, config, out);
            out.events.push(Event::Refused {
                ticket: lease,
                reason: Refusal::LeaseExpired,
            });
            return;
        }
        let stale_image = self
            .workers
            .get(&worker)
            .is_some_and(|w| Some(&w.image) != self.image.as_ref());
        match disposition {
            Disposition::Discard if config.broken(Mutation::ReuseDiscarded) => {
                // The broken rule: a worker nobody vouches for goes straight back to the pool.
                self.set_state(worker, WorkerState::Warm, now, config);
            }
            Disposition::Discard => {
                self.begin_removal(
                    worker,
                    RemovalReason::DiscardedByHolder,
                    None,
                    Some(lease),
                    now,
                    out,
                );
            }
            Disposition::Reset if stale_image => {
                self.begin_removal(
                    worker,
                    RemovalReason::StaleImage,
                    None,
                    Some(lease),
                    now,
                    out,
                );
            }
            Disposition::Reset => {
                let deadline = now.plus_ms(config.reset_timeout_ms);
                let token = self.set_state(
                    worker,
                    WorkerState::Resetting {
                        after: lease,
                        deadline,
                    },
                    now,
                    config,
                );
                out.effects.push(Effect::Reset { worker, token });
            }
        }
        out.events.push(Event::Released { lease });
        self.dispatch(now, config, out);
    }
}

pub(super) fn lease_expiry(
    now: UnixMillis,
    config: &PoolConfig,
    claim_deadline: Option<UnixMillis>,
) -> UnixMillis {
    let by_ttl = now.plus_ms(config.lease_ttl_ms);
    claim_deadline.map_or(by_ttl, |deadline| by_ttl.min(deadline))
}
