//! Scenario tests of the allocation rules, named after the requirement each proves, and property
//! tests of the transition. A small driver jumps deployment time; nothing sleeps.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::ids::{
    ActorId, ConversationId, ImageId, LeaseNamespace, LeaseScope, MemberId, OpToken, TicketId,
    WorkerId,
};
use crate::reset::ResetEvidence;
use crate::time::UnixMillis;

struct Driver {
    doc: PoolDoc,
    config: PoolConfig,
    now: UnixMillis,
    image: ImageId,
    next_ticket: u64,
}

struct Grant {
    ticket: TicketId,
    worker: WorkerId,
    token: OpToken,
}

fn scope(namespace: LeaseNamespace, actor: &str) -> LeaseScope {
    LeaseScope {
        namespace,
        actor: ActorId(actor.into()),
        conversation: ConversationId("c1".into()),
    }
}

impl Driver {
    fn new(config: PoolConfig) -> Self {
        Self {
            doc: PoolDoc::new(7, UnixMillis(1_000)),
            config,
            now: UnixMillis(1_000),
            image: ImageId("img-1".into()),
            next_ticket: 1,
        }
    }

    /// A pool brought to its warm minimum: image published, inventory seen, creates reported.
    fn warm(config: PoolConfig) -> Self {
        let mut d = Self::new(config);
        let image = d.image.clone();
        let _ = d.apply(Command::PublishImage { image });
        let _ = d.observe();
        d.tick_and_create_all();
        assert_eq!(d.doc.counts().warm, d.config.warm_min);
        d
    }

    fn apply(&mut self, command: Command) -> Applied {
        self.doc.apply(command, self.now, &self.config)
    }

    fn advance(&mut self, ms: u64) {
        self.now = self.now.plus_ms(ms);
    }

    fn present(&self) -> BTreeSet<WorkerId> {
        self.doc
            .workers()
            .iter()
            .filter(|(_, w)| w.state.kind() != StateKind::Creating)
            .map(|(id, _)| *id)
            .collect()
    }

    fn observe(&mut self) -> Applied {
        let present = self.present();
        self.apply(Command::InventoryObserved {
            as_of: self.now,
            present,
        })
    }

    fn tick(&mut self) -> Applied {
        let image = self.image.clone();
        self.apply(Command::Tick { image })
    }

    /// Ticks and reports every create done, until the pool orders no more creates.
    fn tick_and_create_all(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        for _ in 0..64 {
            let applied = self.tick();
            events.extend(applied.events);
            let creates: Vec<(WorkerId, OpToken)> = applied
                .effects
                .iter()
                .filter_map(|e| match e {
                    Effect::Create { worker, token, .. } => Some((*worker, *token)),
                    _ => None,
                })
                .collect();
            if creates.is_empty() {
                return events;
            }
            for (worker, token) in creates {
                events.extend(
                    self.apply(Command::CreateReported {
                        worker,
                        token,
                        outcome: Outcome::Done,
                    })
                    .events,
                );
            }
        }
        panic!("creation never settled");
    }

    fn acquire(&mut self, member: &str) -> (TicketId, Applied) {
        self.acquire_in(member, LeaseNamespace::Code)
    }

    fn acquire_in(&mut self, member: &str, namespace: LeaseNamespace) -> (TicketId, Applied) {
        self.acquire_waiting(member, namespace, u64::MAX)
    }

    fn acquire_waiting(
        &mut self,
        member: &str,
        namespace: LeaseNamespace,
        wait_ms: u64,
    ) -> (TicketId, Applied) {
        self.acquire_with(member, namespace, wait_ms, false)
    }

    fn acquire_with(
        &mut self,
        member: &str,
        namespace: LeaseNamespace,
        wait_ms: u64,
        stack: bool,
    ) -> (TicketId, Applied) {
        let ticket = TicketId(self.next_ticket);
        self.next_ticket += 1;
        let applied = self.apply(Command::Acquire {
            ticket,
            member: MemberId(member.into()),
            scope: scope(namespace, member),
            wait_ms,
            stack,
        });
        (ticket, applied)
    }

    /// A code lease for `member`, granted at once, for a run that uses the data stack or not.
    fn lease(&mut self, member: &str, stack: bool) -> Grant {
        let (ticket, _) = self.acquire_with(member, LeaseNamespace::Code, u64::MAX, stack);
        self.granted(ticket).expect("a warm worker serves it")
    }

    /// Ends `grant` and reports its worker's reset clean: the worker is warm again.
    fn release_clean(&mut self, grant: &Grant) {
        let token = self.release(grant);
        let applied = self.apply(Command::ResetReported {
            worker: grant.worker,
            token,
            evidence: ResetEvidence::clean(token),
        });
        assert!(
            applied
                .events
                .iter()
                .any(|e| matches!(e, Event::WorkerWarm { worker } if *worker == grant.worker)),
            "{applied:?}"
        );
    }

    fn granted(&self, ticket: TicketId) -> Option<Grant> {
        match self.doc.ticket_status(ticket) {
            TicketStatus::Granted { worker, token, .. } => Some(Grant {
                ticket,
                worker,
                token,
            }),
            TicketStatus::Queued { .. } | TicketStatus::Gone => None,
        }
    }

    fn release(&mut self, grant: &Grant) -> OpToken {
        let applied = self.apply(Command::Release {
            worker: grant.worker,
            lease: grant.ticket,
            token: grant.token,
            disposition: Disposition::Reset,
        });
        reset_token(&applied).expect("a release orders a reset")
    }
}

fn reset_token(applied: &Applied) -> Option<OpToken> {
    applied.effects.iter().find_map(|e| match e {
        Effect::Reset { token, .. } => Some(*token),
        _ => None,
    })
}

fn refusal(applied: &Applied, ticket: TicketId) -> Option<Refusal> {
    applied.events.iter().find_map(|e| match e {
        Event::Refused { ticket: t, reason } if *t == ticket => Some(*reason),
        _ => None,
    })
}

fn deletes(applied: &Applied) -> Vec<(WorkerId, OpToken)> {
    applied
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Delete { worker, token } => Some((*worker, *token)),
            _ => None,
        })
        .collect()
}

/// Decisions 0058 and 0060: a run that uses the data stack goes to a worker that has run one (it
/// prepared the stack's jail after that run, and keeps it through the runs that do not take it),
/// the one warm the longest among them; any other run, and a stack run without such a worker, to
/// the worker warm the longest. FIFO and the member limit are untouched: only which warm worker a
/// ticket gets.
#[test]
fn pool_03_a_run_that_uses_the_stack_goes_first_to_a_worker_that_has_run_the_stack() {
    let mut d = Driver::warm(PoolConfig {
        warm_min: 3,
        target_idle: 0,
        max_allocated: 3,
        ..PoolConfig::default()
    });
    let stacked = d.lease("a", true);
    d.advance(10);
    d.release_clean(&stacked);
    assert!(d.doc.workers()[&stacked.worker].stack);
    // The two others are warm the longest now; plain leases take them, and coming back after the
    // stack's worker they leave it warm the longest.
    d.advance(10);
    let plain: Vec<Grant> = ["b", "c"].iter().map(|m| d.lease(m, false)).collect();
    assert!(plain.iter().all(|g| g.worker != stacked.worker));
    for grant in &plain {
        d.advance(10);
        d.release_clean(grant);
    }
    d.advance(10);
    // A plain run takes the worker warm the longest, the stack's: its plain jail is the readiest.
    let other = d.lease("d", false);
    assert_eq!(other.worker, stacked.worker, "the worker warm the longest");
    d.advance(10);
    d.release_clean(&other);
    assert!(
        d.doc.workers()[&stacked.worker].stack,
        "a plain run made the pool forget the stack's jail, which the worker keeps"
    );
    d.advance(10);
    // A run that uses the stack goes to it, though the two others are warm longer.
    let again = d.lease("e", true);
    assert_eq!(again.worker, stacked.worker);
    // With no such worker warm, a stack run takes the worker warm the longest.
    let fallback = d.lease("f", true);
    assert_eq!(fallback.worker, plain[0].worker);
    d.advance(10);
    d.release_clean(&fallback);
    assert!(d.doc.workers()[&fallback.worker].stack);
}

/// Decision 0058 and an idle pool: a worker warm twice the idle re-preparation's wait holds the
/// stack's jail whatever its last run (decision 0037), and, warm longer, its jail is readier than
/// that of a worker whose stack run just ended; a run that uses the stack takes it. With the idle
/// re-preparation off, only the flag counts.
#[test]
fn pool_03_a_run_that_uses_the_stack_counts_a_worker_long_idle_as_holding_it() {
    let config = PoolConfig {
        warm_min: 2,
        target_idle: 0,
        max_allocated: 2,
        stack_idle_ms: Some(1_000),
        ..PoolConfig::default()
    };
    let mut d = Driver::warm(config.clone());
    d.advance(5_000);
    let stacked = d.lease("a", true);
    d.advance(10);
    d.release_clean(&stacked);
    let idle = d
        .doc
        .workers()
        .keys()
        .copied()
        .find(|w| *w != stacked.worker)
        .expect("the other worker");
    assert!(d.doc.workers()[&idle].holds_stack(d.now, &d.config));
    let again = d.lease("b", true);
    assert_eq!(
        again.worker, idle,
        "the long-idle worker's jail is the readier"
    );
    // Not while it has waited less than twice the wait: the flagged worker, then.
    let mut d = Driver::warm(config.clone());
    let stacked = d.lease("a", true);
    d.advance(10);
    d.release_clean(&stacked);
    d.advance(1_500);
    assert_eq!(d.lease("b", true).worker, stacked.worker);
    // A worker that has run nothing waits less (`FIRST_IDLE_BEFORE_PREIMPORT_MS`), whatever the
    // configured wait: after twice that, it holds the stack, and is warm the longer.
    let mut d = Driver::warm(PoolConfig {
        stack_idle_ms: Some(600_000),
        ..config.clone()
    });
    d.advance(2 * FIRST_IDLE_BEFORE_PREIMPORT_MS);
    let stacked = d.lease("a", true);
    d.advance(10);
    d.release_clean(&stacked);
    let fresh = d.lease("b", true).worker;
    assert_ne!(
        fresh, stacked.worker,
        "the never-leased worker holds the stack"
    );
    // Without idle re-preparation, never.
    let mut d = Driver::warm(PoolConfig {
        stack_idle_ms: None,
        ..config
    });
    d.advance(3_600_000);
    let _ = d.observe();
    let stacked = d.lease("a", true);
    d.advance(10);
    d.release_clean(&stacked);
    assert_eq!(d.lease("b", true).worker, stacked.worker);
}

#[test]
fn pool_02_warm_minimum_is_reached_and_creation_stays_within_concurrency() {
    let mut d = Driver::new(PoolConfig {
        warm_min: 7,
        max_concurrent_creates: 3,
        ..PoolConfig::default()
    });
    let image = d.image.clone();
    let _ = d.apply(Command::PublishImage { image });
    let _ = d.observe();
    let first = d.tick();
    let creates: Vec<(WorkerId, OpToken)> = first
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Create { worker, token, .. } => Some((*worker, *token)),
            _ => None,
        })
        .collect();
    assert_eq!(creates.len(), 3, "creation concurrency caps the first wave");
    assert_eq!(
        d.tick().effects.len(),
        0,
        "no more creates while three are in flight"
    );
    for (worker, token) in creates {
        let _ = d.apply(Command::CreateReported {
            worker,
            token,
            outcome: Outcome::Done,
        });
    }
    d.tick_and_create_all();
    assert_eq!(d.doc.counts().warm, 7);
}

#[test]
fn pool_02_burst_grows_then_lingers_then_shrinks_to_target() {
    let mut d = Driver::warm(PoolConfig {
        warm_min: 1,
        target_idle: 1,
        max_per_member: 10,
        ..PoolConfig::default()
    });
    let mut grants = Vec::new();
    for _ in 0..5 {
        let (ticket, _) = d.acquire("m1");
        d.tick_and_create_all();
        grants.push(ticket);
    }
    let held: Vec<Grant> = grants.iter().filter_map(|t| d.granted(*t)).collect();
    assert_eq!(
        held.len(),
        5,
        "every burst ticket is served by a created worker"
    );
    for grant in &held {
        let token = d.release(grant);
        let _ = d.apply(Command::ResetReported {
            worker: grant.worker,
            token,
            evidence: ResetEvidence::clean(token),
        });
    }
    assert_eq!(d.doc.counts().warm, 6);
    d.advance(d.config.burst_idle_ttl_ms - 1);
    let _ = d.tick();
    assert_eq!(
        d.doc.counts().warm,
        6,
        "idle burst capacity lingers for the burst TTL"
    );
    d.advance(1);
    let shrink = d.tick();
    assert_eq!(
        d.doc.counts().warm,
        1,
        "then shrinks to max(warm minimum, leased + idle target)"
    );
    assert_eq!(deletes(&shrink).len(), 5);
    assert_eq!(
        d.doc.counts().allocated(),
        6,
        "retiring workers still count until confirmed absent"
    );
}

#[test]
fn pool_02_ceiling_bounds_every_state() {
    let mut d = Driver::warm(PoolConfig {
        warm_min: 2,
        max_allocated: 3,
        max_per_member: 10,
        ..PoolConfig::default()
    });
    let tickets: Vec<TicketId> = (0..6).map(|_| d.acquire("m").0).collect();
    d.tick_and_create_all();
    let served = tickets.iter().filter(|t| d.granted(**t).is_some()).count();
    assert_eq!(served, 3);
    assert_eq!(d.doc.counts().allocated(), 3);
}

#[test]
fn pool_03_queue_is_fifo_bounded_and_waits_are_bounded() {
    let mut d = Driver::warm(PoolConfig {
        warm_min: 1,
        max_allocated: 1,
        acquire_queue_max: 2,
        ..PoolConfig::default()
    });
    let (first, _) = d.acquire("a");
    assert!(d.granted(first).is_some());
    let (second, _) = d.acquire("b");
    let (third, _) = d.acquire("c");
    let (fourth, applied) = d.acquire("d");
    assert_eq!(refusal(&applied, fourth), Some(Refusal::QueueFull));
    assert_eq!(
        d.doc.ticket_status(second),
        TicketStatus::Queued { position: 0 }
    );
    let grant = d.granted(first).unwrap();
    let token = d.release(&grant);
    let _ = d.apply(Command::ResetReported {
        worker: grant.worker,
        token,
        evidence: ResetEvidence::clean(token),
    });
    assert!(
        d.granted(second).is_some(),
        "the oldest ticket is served first"
    );
    assert!(d.granted(third).is_none());
    d.advance(d.config.acquire_wait_ms + 1);
    let applied = d.tick();
    assert_eq!(refusal(&applied, third), Some(Refusal::WaitTimeout));
    assert_eq!(d.doc.ticket_status(third), TicketStatus::Gone);
}

#[test]
fn pool_03_a_ticket_blocked_by_its_member_limit_keeps_its_place_without_holding_back_others() {
    let mut d = Driver::warm(PoolConfig {
        warm_min: 3,
        max_allocated: 3,
        max_per_member: 2,
        ..PoolConfig::default()
    });
    let a1 = d.acquire("a").0;
    let a2 = d.acquire("a").0;
    let a3 = d.acquire("a").0;
    let b1 = d.acquire("b").0;
    assert!(d.granted(a1).is_some() && d.granted(a2).is_some());
    assert!(d.granted(a3).is_none(), "member a is at its limit");
    assert!(
        d.granted(b1).is_some(),
        "b is served past the blocked ticket"
    );
    assert_eq!(
        d.doc.ticket_status(a3),
        TicketStatus::Queued { position: 0 }
    );
    let grant = d.granted(a1).unwrap();
    let token = d.release(&grant);
    let _ = d.apply(Command::ResetReported {
        worker: grant.worker,
        token,
        evidence: ResetEvidence::clean(token),
    });
    assert!(
        d.granted(a3).is_some(),
        "the blocked ticket kept its place and is served next"
    );
}

#[test]
fn pool_04_unproven_reset_discards_the_worker() {
    let mut d = Driver::warm(PoolConfig::default());
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    let token = d.release(&grant);
    let mut evidence = ResetEvidence::clean(token);
    evidence.processes_remaining = None;
    let applied = d.apply(Command::ResetReported {
        worker: grant.worker,
        token,
        evidence,
    });
    assert_eq!(deletes(&applied).len(), 1);
    assert_eq!(
        d.doc.workers()[&grant.worker].state.kind(),
        StateKind::Quarantined
    );
}

#[test]
fn pool_05_ticket_ids_are_the_callers_so_a_repeated_acquire_is_idempotent() {
    let mut d = Driver::warm(PoolConfig::default());
    let (ticket, first) = d.acquire("m");
    let again = d.apply(Command::Acquire {
        ticket,
        member: MemberId("m".into()),
        scope: scope(LeaseNamespace::Code, "m"),
        wait_ms: 1,
        stack: false,
    });
    let granted = |a: &Applied| a.events.iter().any(|e| matches!(e, Event::Granted { .. }));
    assert!(granted(&first) && granted(&again));
    assert_eq!(d.doc.counts().leased, 1, "one lease, not two");
    let other = d.apply(Command::Acquire {
        ticket,
        member: MemberId("x".into()),
        scope: scope(LeaseNamespace::Code, "x"),
        wait_ms: 1,
        stack: false,
    });
    assert_eq!(
        refusal(&other, ticket),
        None,
        "a granted ticket answers with its grant"
    );
}

#[test]
fn pool_06_heartbeats_renew_and_an_unrenewed_lease_expires_at_its_ttl() {
    let mut d = Driver::warm(PoolConfig::default());
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    d.advance(d.config.lease_ttl_ms - 1);
    let renewed = d.apply(Command::Heartbeat {
        worker: grant.worker,
        lease: ticket,
        token: grant.token,
    });
    assert!(
        renewed
            .events
            .iter()
            .any(|e| matches!(e, Event::Renewed { .. }))
    );
    let stale = d.apply(Command::Heartbeat {
        worker: grant.worker,
        lease: ticket,
        token: OpToken(grant.token.0 + 1000),
    });
    assert_eq!(refusal(&stale, ticket), Some(Refusal::StaleToken));
    d.advance(d.config.lease_ttl_ms);
    let expired = d.tick();
    assert!(expired.events.iter().any(|e| matches!(
        e,
        Event::LeaseLost {
            reason: RemovalReason::LeaseExpired,
            ..
        }
    )));
    let late = d.apply(Command::Heartbeat {
        worker: grant.worker,
        lease: ticket,
        token: grant.token,
    });
    assert_eq!(refusal(&late, ticket), Some(Refusal::LeaseExpired));
}

#[test]
fn pool_07_platform_claim_deadline_is_fixed_at_creation_and_renewal_does_not_move_it() {
    let config = PoolConfig {
        mode: PoolMode::PlatformOperator {
            claim_lifetime_ms: 3_600_000,
        },
        warm_min: 1,
        ..PoolConfig::default()
    };
    let mut d = Driver::warm(config);
    let (worker, created) = d
        .doc
        .workers()
        .iter()
        .next()
        .map(|(id, w)| (*id, w.claim_deadline))
        .unwrap();
    let deadline = created.expect("a claim has a deadline");
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    assert_eq!(grant.worker, worker);
    for _ in 0..10 {
        d.advance(d.config.lease_heartbeat_ms * 5);
        let renewed = d.apply(Command::Heartbeat {
            worker,
            lease: ticket,
            token: grant.token,
        });
        if let Some(Event::Renewed { expires_at, .. }) = renewed.events.first() {
            assert!(
                *expires_at <= deadline,
                "a renewal never extends past the claim's deadline"
            );
        }
    }
    assert_eq!(d.doc.workers()[&worker].claim_deadline, Some(deadline));
    d.now = deadline;
    let applied = d.apply(Command::Heartbeat {
        worker,
        lease: ticket,
        token: grant.token,
    });
    assert_eq!(refusal(&applied, ticket), Some(Refusal::ClaimExpired));
    assert_eq!(
        d.doc.workers()[&worker].state.kind(),
        StateKind::Retiring,
        "a worker past its deadline is gone"
    );
}

#[test]
fn pool_08_reset_publishes_warm_only_with_clean_evidence_and_the_matching_token() {
    let mut d = Driver::warm(PoolConfig::default());
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    let token = d.release(&grant);
    let wrong = OpToken(token.0 - 1);
    let stale = d.apply(Command::ResetReported {
        worker: grant.worker,
        token: wrong,
        evidence: ResetEvidence::clean(wrong),
    });
    assert!(matches!(stale.events[..], [Event::StaleReport { .. }]));
    assert_eq!(
        d.doc.workers()[&grant.worker].state.kind(),
        StateKind::Resetting
    );
    let mismatched = d.apply(Command::ResetReported {
        worker: grant.worker,
        token,
        evidence: ResetEvidence::clean(wrong),
    });
    assert!(
        deletes(&mismatched).len() == 1,
        "evidence produced under another token proves nothing"
    );
}

#[test]
fn pool_09_crash_takeover_deletes_confirms_absent_then_frees() {
    let mut d = Driver::warm(PoolConfig {
        warm_min: 1,
        max_allocated: 1,
        ..PoolConfig::default()
    });
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    d.advance(d.config.lease_ttl_ms);
    let _ = d.observe();
    let applied = d.tick();
    let [(worker, token)] = deletes(&applied)[..] else {
        panic!("one delete")
    };
    assert_eq!(worker, grant.worker);
    let (next, _) = d.acquire("m");
    assert!(
        d.granted(next).is_none(),
        "the expired endpoint is never reassigned"
    );
    assert_eq!(
        d.doc.member_usage()[&MemberId("m".into())],
        1,
        "the member's slot stays taken until the worker is gone"
    );
    let _ = d.apply(Command::DeleteReported {
        worker,
        token,
        outcome: Outcome::Unknown,
    });
    assert!(
        d.doc.workers().contains_key(&worker),
        "an unconfirmed delete frees nothing"
    );
    let _ = d.apply(Command::DeleteReported {
        worker,
        token,
        outcome: Outcome::Done,
    });
    assert!(!d.doc.workers().contains_key(&worker));
    let _ = d.observe();
    d.tick_and_create_all();
    let replacement = d
        .granted(next)
        .expect("a clean replacement serves the waiting ticket");
    assert_ne!(replacement.worker, grant.worker);
}

#[test]
fn pool_10_an_ambiguous_create_stays_allocated_until_inventory_proves_it_absent() {
    let mut d = Driver::new(PoolConfig {
        warm_min: 1,
        max_allocated: 1,
        ..PoolConfig::default()
    });
    let image = d.image.clone();
    let _ = d.apply(Command::PublishImage { image });
    let _ = d.observe();
    let applied = d.tick();
    let Some(Effect::Create { worker, token, .. }) = applied.effects.first().cloned() else {
        panic!("a create")
    };
    let _ = d.apply(Command::CreateReported {
        worker,
        token,
        outcome: Outcome::Unknown,
    });
    assert_eq!(d.doc.counts().allocated(), 1, "still counted");
    assert!(
        d.tick()
            .effects
            .iter()
            .all(|e| !matches!(e, Effect::Create { .. })),
        "no create over the ceiling"
    );
    // An inventory taken no later than the ambiguity proves nothing.
    let _ = d.apply(Command::InventoryObserved {
        as_of: d.now,
        present: BTreeSet::new(),
    });
    assert!(d.doc.workers().contains_key(&worker));
    d.advance(1);
    let _ = d.apply(Command::InventoryObserved {
        as_of: d.now,
        present: BTreeSet::new(),
    });
    assert!(
        !d.doc.workers().contains_key(&worker),
        "a later inventory without it proves it absent"
    );
    d.tick_and_create_all();
    assert_eq!(d.doc.counts().warm, 1);
}

#[test]
fn pool_10_an_unreported_create_times_out_into_an_ambiguous_one() {
    let mut d = Driver::new(PoolConfig {
        warm_min: 1,
        ..PoolConfig::default()
    });
    let image = d.image.clone();
    let _ = d.apply(Command::PublishImage { image });
    let _ = d.observe();
    let _ = d.tick();
    d.advance(d.config.create_timeout_ms);
    let applied = d.tick();
    assert!(applied.events.iter().any(|e| matches!(
        e,
        Event::WorkerRemoving {
            reason: RemovalReason::CreateTimeout,
            ..
        }
    )));
    assert_eq!(d.doc.counts().quarantined, 1);
}

#[test]
fn pool_11_admission_fails_closed_without_fresh_inventory() {
    let mut d = Driver::new(PoolConfig::default());
    let (ticket, applied) = d.acquire("m");
    assert_eq!(
        refusal(&applied, ticket),
        Some(Refusal::InventoryUnavailable)
    );
    let mut d = Driver::warm(PoolConfig::default());
    d.advance(d.config.inventory_stale_ms + 1);
    let (ticket, applied) = d.acquire("m");
    assert_eq!(
        refusal(&applied, ticket),
        Some(Refusal::InventoryUnavailable)
    );
    let _ = d.observe();
    let (ticket, _) = d.acquire("m");
    assert!(d.granted(ticket).is_some());
}

#[test]
fn pool_11_recovery_after_data_loss_deletes_every_unknown_worker_before_freeing_it() {
    let mut old = Driver::warm(PoolConfig {
        warm_min: 3,
        max_allocated: 4,
        ..PoolConfig::default()
    });
    let (ticket, _) = old.acquire("m");
    let grant = old.granted(ticket).unwrap();
    let survivors = old.present();
    // The store restarts empty: a new document with a new epoch.
    let mut d = Driver::new(old.config.clone());
    d.doc = PoolDoc::new(8, old.now);
    d.now = old.now;
    let image = d.image.clone();
    let _ = d.apply(Command::PublishImage { image });
    let lost = d.apply(Command::Heartbeat {
        worker: grant.worker,
        lease: ticket,
        token: grant.token,
    });
    assert_eq!(
        refusal(&lost, ticket),
        Some(Refusal::LeaseUnknown),
        "a lease in flight fails with a clear error"
    );
    let applied = d.apply(Command::InventoryObserved {
        as_of: d.now,
        present: survivors.clone(),
    });
    assert_eq!(
        deletes(&applied).len(),
        survivors.len(),
        "every unknown worker is deleted, none adopted"
    );
    assert_eq!(d.doc.counts().quarantined as usize, survivors.len());
    let creates = d.tick();
    let planned = creates
        .effects
        .iter()
        .filter(|e| matches!(e, Effect::Create { .. }))
        .count();
    assert_eq!(
        planned, 1,
        "only the room under the ceiling is used while orphans are deleted"
    );
    d.advance(1);
    let _ = d.apply(Command::InventoryObserved {
        as_of: d.now,
        present: BTreeSet::new(),
    });
    assert_eq!(
        d.doc.counts().quarantined,
        0,
        "freed once inventory proves them absent"
    );
}

#[test]
fn pool_12_creation_waits_for_this_controllers_image_to_be_published() {
    let mut d = Driver::warm(PoolConfig {
        warm_min: 2,
        ..PoolConfig::default()
    });
    // A new release: the controller runs img-2 but has not published it yet.
    d.image = ImageId("img-2".into());
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    let _ = d.release(&grant);
    d.advance(1);
    let applied = d.tick();
    assert!(
        applied
            .effects
            .iter()
            .all(|e| !matches!(e, Effect::Create { .. })),
        "nothing is created from the stale image"
    );
    let image = d.image.clone();
    let published = d.apply(Command::PublishImage { image });
    assert_eq!(
        deletes(&published).len(),
        1,
        "the idle old-image worker retires"
    );
    let creates = d.tick_and_create_all();
    assert!(!creates.is_empty());
    for worker in d
        .doc
        .workers()
        .values()
        .filter(|w| w.state.kind() == StateKind::Warm)
    {
        assert_eq!(worker.image, ImageId("img-2".into()));
    }
}

#[test]
fn brow_06_browser_and_code_leases_share_the_member_limit_in_separate_namespaces() {
    let mut d = Driver::warm(PoolConfig {
        warm_min: 3,
        max_per_member: 2,
        ..PoolConfig::default()
    });
    let code = d.acquire_in("m", LeaseNamespace::Code).0;
    let browser = d.acquire_in("m", LeaseNamespace::Browser).0;
    let third = d.acquire_in("m", LeaseNamespace::Code).0;
    let code_grant = d.granted(code).unwrap();
    let browser_grant = d.granted(browser).unwrap();
    assert_ne!(
        code_grant.worker, browser_grant.worker,
        "the browser lease did not evict the code lease"
    );
    assert!(
        d.granted(third).is_none(),
        "browser and code leases count against one member limit"
    );
    d.advance(d.config.lease_ttl_ms / 2);
    let _ = d.apply(Command::Heartbeat {
        worker: browser_grant.worker,
        lease: browser,
        token: browser_grant.token,
    });
    let _ = d.apply(Command::Heartbeat {
        worker: code_grant.worker,
        lease: code,
        token: code_grant.token,
    });
    d.advance(d.config.lease_ttl_ms / 2 + 1);
    let _ = d.tick();
    assert!(
        d.granted(browser).is_some(),
        "a renewed browser session outlives the execution ceiling"
    );
}

#[test]
fn release_with_discard_quarantines_and_frees_the_member() {
    let mut d = Driver::warm(PoolConfig::default());
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    let applied = d.apply(Command::Release {
        worker: grant.worker,
        lease: ticket,
        token: grant.token,
        disposition: Disposition::Discard,
    });
    assert_eq!(deletes(&applied).len(), 1);
    assert!(!d.doc.member_usage().contains_key(&MemberId("m".into())));
}

#[test]
fn a_repeated_release_reissues_the_same_reset() {
    let mut d = Driver::warm(PoolConfig::default());
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    let first = d.release(&grant);
    let again = d.apply(Command::Release {
        worker: grant.worker,
        lease: ticket,
        token: grant.token,
        disposition: Disposition::Reset,
    });
    assert_eq!(reset_token(&again), Some(first));
}

#[test]
fn a_lease_its_holder_ended_is_refused_as_unknown_not_expired() {
    let mut d = Driver::warm(PoolConfig::default());
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    let _ = d.apply(Command::Release {
        worker: grant.worker,
        lease: ticket,
        token: grant.token,
        disposition: Disposition::Discard,
    });
    // A heartbeat delivered late, after the holder's own discard: the lease ended, it did not
    // expire (its holder would otherwise believe it lost a lease it released).
    let late = d.apply(Command::Heartbeat {
        worker: grant.worker,
        lease: ticket,
        token: grant.token,
    });
    assert_eq!(refusal(&late, ticket), Some(Refusal::LeaseUnknown));
}

#[test]
fn a_repeated_release_of_a_stale_image_worker_answers_released() {
    let mut d = Driver::warm(PoolConfig::default());
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    let _ = d.apply(Command::PublishImage {
        image: ImageId("img-2".into()),
    });
    let release = Command::Release {
        worker: grant.worker,
        lease: ticket,
        token: grant.token,
        disposition: Disposition::Reset,
    };
    let first = d.apply(release.clone());
    assert_eq!(deletes(&first).len(), 1, "a stale image retires at release");
    let again = d.apply(release);
    assert!(
        again
            .events
            .iter()
            .any(|e| matches!(e, Event::Released { lease } if *lease == ticket)),
        "{again:?}"
    );
    assert_eq!(refusal(&again, ticket), None);
}

#[test]
fn deployment_time_never_runs_backwards() {
    let mut d = Driver::warm(PoolConfig::default());
    let before = d.doc.clock();
    d.now = UnixMillis(0);
    let _ = d.tick();
    assert_eq!(d.doc.clock(), before);
}

/// One random step of a random pool's life; the transition asserts its invariants after each.
#[derive(Clone, Debug)]
enum Step {
    Acquire(u8, u16),
    Cancel(u8),
    Heartbeat(u8),
    Release(u8, bool),
    ReportCreate(u8, u8),
    ReportReset(u8, bool),
    ReportDelete(u8, u8),
    Observe(bool),
    Publish(bool),
    Tick,
    Advance(u32),
}

fn step() -> impl Strategy<Value = Step> {
    (
        0u8..17,
        any::<u8>(),
        any::<u16>(),
        any::<bool>(),
        0u32..40_000,
    )
        .prop_map(|(kind, a, b, flag, ms)| match kind {
            0..=2 => Step::Acquire(a % 6, b),
            3 => Step::Cancel(a),
            4 => Step::Heartbeat(a),
            5 | 6 => Step::Release(a, flag && a % 4 == 0),
            7 | 8 => Step::ReportCreate(a, (b % 3) as u8),
            9 | 10 => Step::ReportReset(a, !flag || a % 4 != 0),
            11 => Step::ReportDelete(a, (b % 3) as u8),
            12 => Step::Observe(flag),
            13 => Step::Publish(flag && a % 8 == 0),
            14 | 15 => Step::Tick,
            _ => Step::Advance(ms),
        })
}

fn nth<T: Clone>(items: &[T], index: u8) -> Option<T> {
    if items.is_empty() {
        None
    } else {
        Some(items[index as usize % items.len()].clone())
    }
}

fn outcome(code: u8) -> Outcome {
    match code {
        0 => Outcome::Done,
        1 => Outcome::Failed,
        _ => Outcome::Unknown,
    }
}

/// Runs one random life of a pool; returns how many grants it made.
fn run_steps(start_warm: bool, steps: Vec<Step>) -> Result<usize, TestCaseError> {
    let config = PoolConfig {
        warm_min: 2,
        max_allocated: 5,
        max_concurrent_creates: 2,
        acquire_queue_max: 4,
        max_per_member: 2,
        acquire_wait_ms: 50_000,
        inventory_stale_ms: 60_000,
        ..PoolConfig::default()
    };
    // Half the runs start from a warm pool, so that grants, leases and resets are exercised
    // from the first step; the others start cold, before any inventory or image.
    let mut d = if start_warm {
        Driver::warm(config)
    } else {
        Driver::new(config)
    };
    let mut tickets: Vec<TicketId> = Vec::new();
    let mut deadlines = std::collections::BTreeMap::new();
    let mut grants = 0usize;
    for s in steps {
        let workers: Vec<(WorkerId, OpToken, StateKind)> = d
            .doc
            .workers()
            .iter()
            .map(|(id, w)| (*id, w.token, w.state.kind()))
            .collect();
        let pick = |kind: StateKind, i: u8| {
            nth(
                &workers
                    .iter()
                    .filter(|w| w.2 == kind)
                    .cloned()
                    .collect::<Vec<_>>(),
                i,
            )
        };
        let leased_before: BTreeSet<WorkerId> = workers
            .iter()
            .filter(|w| w.2 == StateKind::Leased)
            .map(|w| w.0)
            .collect();
        let applied = match s {
            Step::Acquire(member, wait) => {
                let (ticket, applied) =
                    d.acquire_waiting(&format!("m{member}"), LeaseNamespace::Code, u64::from(wait));
                tickets.push(ticket);
                deadlines.insert(
                    ticket,
                    d.now.plus_ms(u64::from(wait).min(d.config.acquire_wait_ms)),
                );
                applied
            }
            Step::Cancel(i) => match nth(&tickets, i) {
                Some(ticket) => d.apply(Command::Cancel { ticket }),
                None => continue,
            },
            Step::Heartbeat(i) | Step::Release(i, _) if tickets.is_empty() => {
                let _ = i;
                continue;
            }
            Step::Heartbeat(i) => {
                let Some(ticket) = nth(&tickets, i) else {
                    continue;
                };
                let Some(g) = d.granted(ticket) else { continue };
                d.apply(Command::Heartbeat {
                    worker: g.worker,
                    lease: ticket,
                    token: g.token,
                })
            }
            Step::Release(i, discard) => {
                let Some(ticket) = nth(&tickets, i) else {
                    continue;
                };
                let Some(g) = d.granted(ticket) else { continue };
                let disposition = if discard {
                    Disposition::Discard
                } else {
                    Disposition::Reset
                };
                d.apply(Command::Release {
                    worker: g.worker,
                    lease: ticket,
                    token: g.token,
                    disposition,
                })
            }
            Step::ReportCreate(i, code) => {
                let Some((worker, token, _)) = pick(StateKind::Creating, i) else {
                    continue;
                };
                d.apply(Command::CreateReported {
                    worker,
                    token,
                    outcome: outcome(code),
                })
            }
            Step::ReportReset(i, clean) => {
                let Some((worker, token, _)) = pick(StateKind::Resetting, i) else {
                    continue;
                };
                let mut evidence = ResetEvidence::clean(token);
                if !clean {
                    evidence.workspace_entries = Some(1);
                }
                d.apply(Command::ResetReported {
                    worker,
                    token,
                    evidence,
                })
            }
            Step::ReportDelete(i, code) => {
                let removing: Vec<_> = workers
                    .iter()
                    .filter(|w| matches!(w.2, StateKind::Retiring | StateKind::Quarantined))
                    .cloned()
                    .collect();
                let Some((worker, token, _)) = nth(&removing, i) else {
                    continue;
                };
                d.apply(Command::DeleteReported {
                    worker,
                    token,
                    outcome: outcome(code),
                })
            }
            Step::Observe(with_all) => {
                let present = if with_all {
                    d.present()
                } else {
                    BTreeSet::new()
                };
                d.apply(Command::InventoryObserved {
                    as_of: d.now,
                    present,
                })
            }
            Step::Publish(new) => {
                if new {
                    d.image = ImageId(format!("img-{}", d.now.0));
                }
                let image = d.image.clone();
                d.apply(Command::PublishImage { image })
            }
            Step::Tick => d.tick(),
            Step::Advance(ms) => {
                d.advance(u64::from(ms));
                continue;
            }
        };
        grants += applied
            .events
            .iter()
            .filter(|e| matches!(e, Event::Granted { .. }))
            .count();
        for event in &applied.events {
            if let Event::Granted { ticket, worker, .. } = event {
                if let Some(deadline) = deadlines.get(ticket) {
                    prop_assert!(d.now <= *deadline, "granted after its deadline");
                }
                let fresh = !leased_before.contains(worker)
                    || matches!(d.doc.ticket_status(*ticket), TicketStatus::Granted { .. });
                prop_assert!(fresh, "a leased worker was granted again");
            }
        }
    }
    Ok(grants)
}

fn lives() -> impl Strategy<Value = (bool, Vec<Step>)> {
    (any::<bool>(), proptest::collection::vec(step(), 1..200))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any sequence of commands keeps every invariant (asserted inside `apply`), never grants a
    /// ticket after its deadline, and never hands a leased worker to a second ticket.
    #[test]
    fn pool_transitions_keep_every_invariant((start_warm, steps) in lives()) {
        run_steps(start_warm, steps)?;
    }
}

/// The random lives above are not vacuous: they grant leases.
#[test]
fn random_lives_exercise_grants() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut grants = 0;
    for _ in 0..64 {
        let (start_warm, steps) = lives().new_tree(&mut runner).expect("a value").current();
        grants += run_steps(start_warm, steps).expect("the life holds");
    }
    assert!(grants > 64 * 2, "only {grants} grants in 64 random lives");
}

/// The document crosses the coordination store as data: every field survives the round trip.
#[test]
fn pool_05_the_document_round_trips_through_its_encoding() {
    let mut d = Driver::warm(PoolConfig::default());
    let (ticket, _) = d.acquire("m");
    let grant = d.granted(ticket).unwrap();
    let _ = d.release(&grant);
    let _ = d.acquire("m");
    let text = serde_json::to_string(&d.doc).expect("encodes");
    let back: PoolDoc = serde_json::from_str(&text).expect("decodes");
    assert_eq!(back, d.doc);
}
