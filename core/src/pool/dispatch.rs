//! Serving the queue: the oldest ticket whose member is under its limit gets a warm worker (POOL-3):
//! the one warm the longest among those that suit its run (decision 0058,
//! [`super::Worker::suits`]), or the one warm the longest.

use super::config::{Mutation, PoolConfig};
use super::doc::{Applied, Event, Lease, PoolDoc, Ticket, WorkerState};
use super::lease::lease_expiry;
use crate::ids::WorkerId;
use crate::time::UnixMillis;

impl PoolDoc {
    /// Serves the oldest ticket whose member is under
    /// its limit, while warm workers last (POOL-3, resolved reading).
    pub(super) fn dispatch(&mut self, now: UnixMillis, config: &PoolConfig, out: &mut Applied) {
        if !self.admission_open(now, config) || self.orphans_pending() {
            return;
        }
        // Each with whether it suits a run that uses the stack, and one that does not.
        let mut warm: Vec<(UnixMillis, WorkerId, [bool; 2])> = self
            .workers
            .iter()
            .filter(|(_, w)| w.grantable(now, config))
            .map(|(id, w)| {
                let suits = [w.suits(false, now, config), w.suits(true, now, config)];
                (w.since, *id, suits)
            })
            .collect();
        warm.sort();
        warm.reverse(); // the last is the worker warm the longest
        if warm.is_empty() || self.tickets.is_empty() {
            return;
        }
        let mut usage = self.member_usage();
        let newest_first = config.broken(Mutation::Fifo);
        let mut index = 0;
        while index < self.tickets.len() && !warm.is_empty() {
            let at = if newest_first {
                self.tickets.len() - 1 - index
            } else {
                index
            };
            let member = &self.tickets[at].member;
            let used = usage.get(member).copied().unwrap_or(0);
            if used >= config.max_per_member && !config.broken(Mutation::MemberLimit) {
                index += 1;
                continue;
            }
            let Some(ticket) = self.tickets.remove(at) else {
                break;
            };
            let Some(chosen) = choose(&warm, ticket.stack, config) else {
                break;
            };
            let (_, worker, _) = warm.remove(chosen);
            *usage.entry(ticket.member.clone()).or_insert(0) += 1;
            // Removing at `at` moves the next candidate to `index` (oldest first) or keeps it at
            // `len - 1 - index` (newest first): either way `index` stays.
            self.grant(worker, ticket, now, config, out);
        }
    }

    pub(super) fn grant(
        &mut self,
        worker: WorkerId,
        ticket: Ticket,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let claim_deadline = self.workers.get(&worker).and_then(|w| w.claim_deadline);
        if let Some(granted) = self.workers.get_mut(&worker) {
            // Kept once set: the worker keeps its stack jail through the runs that do not use
            // it (decision 0060).
            granted.stack |= ticket.stack;
            granted.leased = true;
        }
        let expires_at = lease_expiry(now, config, claim_deadline);
        let lease = Lease {
            id: ticket.id,
            member: ticket.member,
            scope: ticket.scope,
            expires_at,
        };
        let token = self.set_state(worker, WorkerState::Leased(lease), now, config);
        out.events.push(Event::Granted {
            ticket: ticket.id,
            worker,
            token,
            expires_at,
        });
    }
}

/// Which of `warm` (the worker warm the longest last, each with whether it suits a plain run and a
/// run that uses the data stack, [`super::Worker::suits`]) a ticket gets: the one warm the longest
/// among those that suit its run (decision 0058); without one, the one warm the longest.
fn choose(
    warm: &[(UnixMillis, WorkerId, [bool; 2])],
    stack: bool,
    config: &PoolConfig,
) -> Option<usize> {
    let longest = warm.len().checked_sub(1)?;
    if config.broken(Mutation::StackUnrouted) {
        return Some(longest);
    }
    Some(
        warm.iter()
            .rposition(|(_, _, suits)| suits[usize::from(stack)])
            .unwrap_or(longest),
    )
}
