//! What must hold after every transition. Checked both ways: each bound from above and each
//! cross-reference from both ends.

use std::collections::BTreeSet;

use super::config::PoolConfig;
use super::doc::{PoolDoc, StateKind, WorkerState};

impl PoolDoc {
    /// Asserts every invariant; `apply` calls it after every transition.
    pub fn invariants(&self, config: &PoolConfig) {
        let problems = self.check(config);
        assert!(problems.is_empty(), "pool invariants broken: {problems:?}");
    }

    /// Every broken invariant, described; empty when the document is sound.
    #[must_use]
    pub fn check(&self, config: &PoolConfig) -> Vec<String> {
        let mut problems = Vec::new();
        let counts = self.counts();
        if self.tickets.len() > config.acquire_queue_max as usize {
            problems.push(format!(
                "queue holds {} tickets, bound {}",
                self.tickets.len(),
                config.acquire_queue_max
            ));
        }
        if counts.creating > config.max_concurrent_creates {
            problems.push(format!(
                "{} creates in flight, bound {}",
                counts.creating, config.max_concurrent_creates
            ));
        }
        if self.allocated_within_ceiling() > config.max_allocated {
            problems.push(format!(
                "{} workers allocated, ceiling {}",
                self.allocated_within_ceiling(),
                config.max_allocated
            ));
        }
        for (member, used) in self.member_usage() {
            if used > config.max_per_member {
                problems.push(format!(
                    "member {} holds {used} slots, limit {}",
                    member.0, config.max_per_member
                ));
            }
        }
        let mut ticket_ids = BTreeSet::new();
        for ticket in &self.tickets {
            if !ticket_ids.insert(ticket.id) {
                problems.push(format!("ticket {} queued twice", ticket.id));
            }
            if ticket.deadline < self.clock {
                problems.push(format!("ticket {} queued past its deadline", ticket.id));
            }
        }
        let mut tokens = BTreeSet::new();
        let mut leases = BTreeSet::new();
        for (id, worker) in &self.workers {
            if !tokens.insert(worker.token) || worker.token.0 >= self.next_token {
                problems.push(format!(
                    "worker {id} token {} is not unique or not minted",
                    worker.token
                ));
            }
            if id.epoch == self.epoch && id.seq >= self.next_seq {
                problems.push(format!("worker {id} was not minted by this document"));
            }
            if worker.since > self.clock {
                problems.push(format!("worker {id} entered its state in the future"));
            }
            match &worker.state {
                WorkerState::Leased(lease) => {
                    if !leases.insert(lease.id) {
                        problems.push(format!("lease {} held on two workers", lease.id));
                    }
                    if ticket_ids.contains(&lease.id) {
                        problems.push(format!("lease {} is also still queued", lease.id));
                    }
                    if worker.confirmed_at.is_none() {
                        problems.push(format!("worker {id} leased without a confirmed create"));
                    }
                }
                WorkerState::Warm => {
                    if worker.confirmed_at.is_none() {
                        problems.push(format!("worker {id} warm without a confirmed create"));
                    }
                    if self
                        .image
                        .as_ref()
                        .is_some_and(|image| *image != worker.image)
                        && worker.state.kind() == StateKind::Warm
                    {
                        problems.push(format!(
                            "worker {id} warm from an image that is not the published one"
                        ));
                    }
                }
                WorkerState::Creating { deadline } | WorkerState::Resetting { deadline, .. } => {
                    if *deadline < worker.since {
                        problems.push(format!("worker {id} has a deadline before its state began"));
                    }
                }
                WorkerState::Retiring(removal) | WorkerState::Quarantined(removal) => {
                    if removal.reason.is_for_cause()
                        != (worker.state.kind() == StateKind::Quarantined)
                    {
                        problems.push(format!(
                            "worker {id} is {} for reason {}",
                            worker.state.kind().code(),
                            removal.reason.code()
                        ));
                    }
                }
            }
        }
        problems
    }
}
