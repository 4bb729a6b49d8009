//! Drivers of a real store for tests and benchmarks: a pool client that acquires, holds and
//! releases leases, and a paper controller whose workers are records, not processes. (The real
//! controller and its worker backends drive the same commands; this one lets the store be tested
//! and measured on its own.)

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use corral_core::ids::{
    ActorId, ConversationId, ImageId, LeaseNamespace, LeaseScope, MemberId, OpToken, TicketId,
    WorkerId,
};
use corral_core::pool::{Command, Disposition, Effect, Event, Outcome, PoolConfig};
use corral_core::reset::ResetEvidence;
use corral_core::store::Loaded;
use corral_core::time::UnixMillis;

use crate::ValkeyStore;

/// How many times a command whose outcome is unknown or contended is applied again.
const RETRIES: u32 = 50;

/// Applies `command` until it commits, retrying unknown and contended outcomes; `None` when the
/// store is unavailable (the caller fails closed).
pub async fn commit(
    store: &ValkeyStore,
    command: &Command,
    config: &PoolConfig,
) -> Option<corral_core::pool::Applied> {
    store.commit(command, config, RETRIES).await
}

/// A controller whose workers exist only as records: it publishes its image, observes its own
/// records as inventory, ticks, and performs creates, deletes and resets at once.
pub struct PaperController {
    /// The workers that "exist".
    pub workers: BTreeSet<WorkerId>,
    image: ImageId,
}

impl PaperController {
    /// A controller running `image`.
    pub fn new(image: &str) -> Self {
        Self {
            workers: BTreeSet::new(),
            image: ImageId(image.into()),
        }
    }

    /// One reconcile pass; false when the store was unavailable.
    pub async fn step(&mut self, store: &ValkeyStore, config: &PoolConfig) -> bool {
        let published = match store.load().await {
            Ok(Loaded::Found { doc, .. }) => doc.image() == Some(&self.image),
            Ok(Loaded::Absent | Loaded::Outlived { .. }) => false,
            Err(_) => return false,
        };
        if !published
            && commit(
                store,
                &Command::PublishImage {
                    image: self.image.clone(),
                },
                config,
            )
            .await
            .is_none()
        {
            return false;
        }
        let Ok(as_of) = store.now().await else {
            return false;
        };
        let present = self.workers.clone();
        let Some(observed) = commit(
            store,
            &Command::InventoryObserved { as_of, present },
            config,
        )
        .await
        else {
            return false;
        };
        let Some(ticked) = commit(
            store,
            &Command::Tick {
                image: self.image.clone(),
            },
            config,
        )
        .await
        else {
            return false;
        };
        let mut effects = observed.effects;
        effects.extend(ticked.effects);
        self.perform(store, config, effects).await
    }

    async fn perform(
        &mut self,
        store: &ValkeyStore,
        config: &PoolConfig,
        effects: Vec<Effect>,
    ) -> bool {
        let mut pending = effects;
        while let Some(effect) = pending.pop() {
            let report = match effect {
                Effect::Create { worker, token, .. } => {
                    self.workers.insert(worker);
                    Command::CreateReported {
                        worker,
                        token,
                        outcome: Outcome::Done,
                    }
                }
                Effect::Delete { worker, token } => {
                    self.workers.remove(&worker);
                    Command::DeleteReported {
                        worker,
                        token,
                        outcome: Outcome::Done,
                    }
                }
                Effect::Reset { worker, token } => paper_reset(worker, token),
            };
            let Some(applied) = commit(store, &report, config).await else {
                return false;
            };
            pending.extend(applied.effects);
        }
        true
    }
}

/// The report of a paper worker's reset, done at once and proven clean.
pub fn paper_reset(worker: WorkerId, token: OpToken) -> Command {
    Command::ResetReported {
        worker,
        token,
        evidence: ResetEvidence::clean(token),
    }
}

/// One lease as a client held it, timed on the deployment clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The worker.
    pub worker: WorkerId,
    /// The member.
    pub member: String,
    /// Deployment time just after the grant was seen.
    pub start: UnixMillis,
    /// Deployment time just before the release.
    pub end: UnixMillis,
}

/// What a client saw.
#[derive(Clone, Debug, Default)]
pub struct ClientReport {
    /// Leases held.
    pub held: Vec<Held>,
    /// Acquire-to-grant latencies.
    pub grant_latencies: Vec<Duration>,
    /// Tickets refused (with their codes).
    pub refused: Vec<String>,
    /// Leases lost (refused heartbeat or release).
    pub lost: u32,
}

/// A client that acquires a lease for `member`, holds it `hold`, and releases it (running the reset
/// itself, as its workers are paper), `cycles` times.
/// With `hold` zero the cycle is measured bare: no clock reads around the hold.
pub async fn run_client(
    store: &ValkeyStore,
    config: &PoolConfig,
    member: &str,
    ticket_base: u64,
    cycles: u32,
    hold: Duration,
) -> ClientReport {
    let bare = hold.is_zero();
    let mut watch = None;
    let mut report = ClientReport::default();
    let mut resets = Vec::new();
    for cycle in 0..cycles {
        let ticket = TicketId(ticket_base + u64::from(cycle));
        let started = Instant::now();
        let Some((worker, token)) =
            acquire(store, config, member, ticket, &mut watch, &mut report).await
        else {
            continue;
        };
        report.grant_latencies.push(started.elapsed());
        let start = if bare {
            UnixMillis(0)
        } else {
            store.now().await.unwrap_or_default()
        };
        if !bare {
            tokio::time::sleep(hold).await;
        }
        let end = if bare {
            UnixMillis(0)
        } else {
            store.now().await.unwrap_or_default()
        };
        let release = Command::Release {
            worker,
            lease: ticket,
            token,
            disposition: Disposition::Reset,
        };
        let Some(applied) = commit(store, &release, config).await else {
            // The store stopped answering: the lease runs out on its own; this client ends.
            report.refused.push("release_unavailable".to_owned());
            break;
        };
        if applied
            .events
            .iter()
            .any(|e| matches!(e, Event::Refused { .. }))
        {
            report.lost += 1;
            continue;
        }
        report.held.push(Held {
            worker,
            member: member.into(),
            start,
            end,
        });
        for effect in applied.effects {
            if let Effect::Reset { worker, token } = effect {
                // The paper reset is done at once; its report goes while the next cycle begins,
                // as a real reset's does (it runs beside the next run, not before it).
                let reset = paper_reset(worker, token);
                let (store, config) = (store.clone(), config.clone());
                resets.push(tokio::spawn(async move {
                    commit(&store, &reset, &config).await
                }));
            }
        }
    }
    for reset in resets {
        let _ = reset.await;
    }
    report
}

async fn acquire(
    store: &ValkeyStore,
    config: &PoolConfig,
    member: &str,
    ticket: TicketId,
    watch: &mut Option<crate::VersionWatch>,
    report: &mut ClientReport,
) -> Option<(WorkerId, OpToken)> {
    let scope = LeaseScope {
        namespace: LeaseNamespace::Code,
        actor: ActorId(member.into()),
        conversation: ConversationId(format!("c{}", ticket.0)),
    };
    let command = Command::Acquire {
        ticket,
        member: MemberId(member.into()),
        scope,
        wait_ms: config.acquire_wait_ms,
        stack: false,
    };
    let wait = Duration::from_millis(config.acquire_wait_ms);
    match crate::lease::acquire(store, config, &command, wait, watch).await {
        Ok(granted) => Some((granted.worker, granted.token)),
        Err(error) => {
            report.refused.push(error.code().into());
            if let crate::lease::AcquireError::WaitTimeout { orders } = error {
                // A grant withdrawn as it arrived: its paper worker's reset is this client's.
                for effect in orders {
                    if let Effect::Reset { worker, token } = effect {
                        let reported = commit(store, &paper_reset(worker, token), config).await;
                        if reported.is_none() {
                            report.lost += 1;
                        }
                    }
                }
            }
            None
        }
    }
}

/// The pool settings the multi-process tests and the benchmark share: a small ceiling so that
/// clients contend, and a member limit below the number of clients per member.
pub fn test_pool_config() -> PoolConfig {
    PoolConfig {
        warm_min: 2,
        target_idle: 1,
        max_allocated: 4,
        max_concurrent_creates: 2,
        max_per_member: 2,
        acquire_wait_ms: 20_000,
        inventory_stale_ms: 10_000,
        ..PoolConfig::default()
    }
}

/// The pool settings of the allocation benchmark: enough warm workers that three clients never
/// wait for a create, so a cycle measures the store and the rules.
pub fn bench_pool_config() -> PoolConfig {
    PoolConfig {
        warm_min: 8,
        target_idle: 4,
        max_allocated: 16,
        max_concurrent_creates: 3,
        max_per_member: 4,
        ..test_pool_config()
    }
}

/// A code-lease acquire for `member` in conversation `c`, for tests and tools.
pub fn code_acquire(ticket: u64, member: &str, wait_ms: u64) -> Command {
    let scope = LeaseScope {
        namespace: LeaseNamespace::Code,
        actor: ActorId(member.into()),
        conversation: ConversationId("c".into()),
    };
    Command::Acquire {
        ticket: TicketId(ticket),
        member: MemberId(member.into()),
        scope,
        wait_ms,
        stack: false,
    }
}
