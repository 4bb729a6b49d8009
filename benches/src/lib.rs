//! Fixtures for Corral's benchmarks: pool documents in the states worth measuring, built through
//! `PoolDoc::apply` as the store would build them. The benchmarks themselves live in `benches/`.
//!
//! The fixtures are library code (with their own tests) so that `cargo test --workspace` keeps
//! them working even though it does not build the benchmarks.

pub mod load;
pub mod up;

use std::collections::BTreeSet;

use corral_core::ids::{
    ActorId, ConversationId, ImageId, LeaseNamespace, LeaseScope, MemberId, OpToken, TicketId,
    WorkerId,
};
use corral_core::pool::{Applied, Command, Effect, Event, PoolConfig, PoolDoc, StateKind};
use corral_core::time::UnixMillis;

/// A pool document with the configuration and deployment time it is driven at.
#[derive(Clone, Debug)]
pub struct Bench {
    /// The document.
    pub doc: PoolDoc,
    /// Its configuration.
    pub config: PoolConfig,
    /// Deployment time; the fixtures never move it, so no deadline passes while measuring.
    pub now: UnixMillis,
    /// The published image the controller ticks with.
    pub image: ImageId,
    /// The next ticket id to hand out.
    pub next_ticket: u64,
}

/// The lease that a granted ticket received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The ticket (and lease) id.
    pub ticket: TicketId,
    /// The leased worker.
    pub worker: WorkerId,
    /// The lease's token.
    pub token: OpToken,
}

/// The longest a creation loop may run before the fixture is declared broken.
const CREATE_ROUNDS_MAX: usize = 1_000;

impl Bench {
    /// A pool at its warm minimum: image published, inventory observed, every create reported done.
    #[must_use]
    pub fn warm(config: PoolConfig) -> Self {
        let now = UnixMillis(1_700_000_000_000);
        let image = ImageId("sha256:bench".to_owned());
        let mut bench = Self {
            doc: PoolDoc::new(1, now),
            config,
            now,
            image: image.clone(),
            next_ticket: 1,
        };
        let _ = bench.apply(Command::PublishImage { image });
        let _ = bench.apply(Command::InventoryObserved {
            as_of: now,
            present: BTreeSet::new(),
        });
        bench.create_until_settled();
        assert_eq!(
            bench.doc.counts().warm,
            bench.config.warm_min,
            "the fixture reaches the warm minimum"
        );
        bench
    }

    /// A pool of `workers` workers, every one leased, with `queued` more tickets waiting.
    #[must_use]
    pub fn saturated(workers: u32, queued: u32) -> Self {
        let config = PoolConfig {
            warm_min: workers,
            max_allocated: workers,
            max_concurrent_creates: workers,
            acquire_queue_max: queued.max(PoolConfig::default().acquire_queue_max),
            ..PoolConfig::default()
        };
        let mut bench = Self::warm(config);
        // One member per ticket, so the per-member limit never holds a ticket back.
        for _ in 0..workers {
            let _ = bench.acquire_granted();
        }
        for _ in 0..queued {
            let (ticket, applied) = bench.acquire();
            let queued = applied
                .events
                .iter()
                .any(|e| matches!(e, Event::Queued { ticket: t, .. } if *t == ticket));
            assert!(queued, "ticket {ticket} waits behind the leased workers");
        }
        let counts = bench.doc.counts();
        assert_eq!(counts.leased, workers);
        assert_eq!(bench.doc.tickets().count(), queued as usize);
        bench
    }

    /// Applies `command` at the fixture's time.
    pub fn apply(&mut self, command: Command) -> Applied {
        self.doc.apply(command, self.now, &self.config)
    }

    /// A tick of the controller with the published image.
    pub fn tick(&mut self) -> Applied {
        let image = self.image.clone();
        self.apply(Command::Tick { image })
    }

    /// Acquires a code lease for a member of its own; returns the ticket and what happened.
    pub fn acquire(&mut self) -> (TicketId, Applied) {
        let ticket = TicketId(self.next_ticket);
        self.next_ticket += 1;
        let member = format!("member-{}", ticket.0);
        let applied = self.apply(Command::Acquire {
            ticket,
            member: MemberId(member.clone()),
            scope: LeaseScope {
                namespace: LeaseNamespace::Code,
                actor: ActorId(member),
                conversation: ConversationId("bench".to_owned()),
            },
            wait_ms: self.config.acquire_wait_ms,
            stack: false,
        });
        (ticket, applied)
    }

    /// Acquires a lease that must be granted at once.
    pub fn acquire_granted(&mut self) -> Granted {
        let (ticket, applied) = self.acquire();
        granted(&applied, ticket)
            .unwrap_or_else(|| panic!("ticket {ticket} is granted at once: {applied:?}"))
    }

    /// Ticks and reports every ordered create done, until the pool orders no more.
    fn create_until_settled(&mut self) {
        for _ in 0..CREATE_ROUNDS_MAX {
            let creates: Vec<(WorkerId, OpToken)> = self
                .tick()
                .effects
                .iter()
                .filter_map(|effect| match effect {
                    Effect::Create { worker, token, .. } => Some((*worker, *token)),
                    Effect::Reset { .. } | Effect::Delete { .. } => None,
                })
                .collect();
            if creates.is_empty() {
                return;
            }
            for (worker, token) in creates {
                let _ = self.apply(Command::CreateReported {
                    worker,
                    token,
                    outcome: corral_core::pool::Outcome::Done,
                });
            }
            // The inventory now shows the created workers, as it would in production.
            let present = self
                .doc
                .workers()
                .iter()
                .filter(|(_, w)| w.state.kind() != StateKind::Creating)
                .map(|(id, _)| *id)
                .collect();
            let _ = self.apply(Command::InventoryObserved {
                as_of: self.now,
                present,
            });
        }
        panic!("creation did not settle within {CREATE_ROUNDS_MAX} rounds");
    }
}

/// The grant `ticket` received in `applied`, if any.
#[must_use]
pub fn granted(applied: &Applied, ticket: TicketId) -> Option<Granted> {
    applied.events.iter().find_map(|event| match event {
        Event::Granted {
            ticket: t,
            worker,
            token,
            ..
        } if *t == ticket => Some(Granted {
            ticket,
            worker: *worker,
            token: *token,
        }),
        _ => None,
    })
}

/// The token of the reset `applied` ordered for `worker`, if any.
#[must_use]
pub fn reset_token(applied: &Applied, worker: WorkerId) -> Option<OpToken> {
    applied.effects.iter().find_map(|effect| match effect {
        Effect::Reset { worker: w, token } if *w == worker => Some(*token),
        Effect::Create { .. } | Effect::Delete { .. } | Effect::Reset { .. } => None,
    })
}

#[cfg(test)]
mod tests {
    use corral_core::pool::Disposition;
    use corral_core::reset::ResetEvidence;

    use super::*;

    #[test]
    fn warm_pool_reaches_its_minimum() {
        let bench = Bench::warm(PoolConfig::default());
        assert_eq!(bench.doc.counts().warm, 3);
    }

    #[test]
    fn a_lease_cycle_returns_the_pool_to_warm() {
        let mut bench = Bench::warm(PoolConfig::default());
        let grant = bench.acquire_granted();
        let applied = bench.apply(Command::Release {
            worker: grant.worker,
            lease: grant.ticket,
            token: grant.token,
            disposition: Disposition::Reset,
        });
        let token = reset_token(&applied, grant.worker).expect("a release orders a reset");
        let _ = bench.apply(Command::ResetReported {
            worker: grant.worker,
            token,
            evidence: ResetEvidence::clean(token),
        });
        assert_eq!(bench.doc.counts().warm, 3);
    }

    #[test]
    fn saturated_pool_holds_its_workers_and_queue_and_a_tick_changes_nothing() {
        let mut bench = Bench::saturated(32, 200);
        let before = bench.doc.clone();
        let applied = bench.tick();
        assert_eq!(
            bench.doc, before,
            "a tick at the same time is a steady state"
        );
        assert!(applied.effects.is_empty());
    }
}
