//! The holder driven against a real pool document; time jumps, nothing sleeps.

use std::collections::BTreeSet;

use super::*;
use crate::ids::{ActorId, ConversationId, ImageId, LeaseNamespace, LeaseScope, MemberId};
use crate::pool::{Outcome, PoolDoc, StateKind, TicketStatus, WorkerState};
use crate::time::UnixMillis;

/// Deployment time is this far ahead of the holder's monotonic clock.
const DEPLOY_OFFSET_MS: u64 = 1_000_000;

struct Pool {
    doc: PoolDoc,
    config: PoolConfig,
    mono: MonoMillis,
    image: ImageId,
}

impl Pool {
    /// A pool with one warm worker, heartbeats every second and a four-second lease.
    fn warm() -> Self {
        let config = PoolConfig {
            warm_min: 1,
            target_idle: 1,
            max_allocated: 2,
            lease_heartbeat_ms: 1_000,
            lease_ttl_ms: 4_000,
            reset_timeout_ms: 3_000,
            inventory_stale_ms: 1_000_000,
            ..PoolConfig::default()
        };
        let mut pool = Self {
            doc: PoolDoc::new(1, UnixMillis(DEPLOY_OFFSET_MS)),
            config,
            mono: MonoMillis(0),
            image: ImageId("img".into()),
        };
        let image = pool.image.clone();
        let _ = pool.apply(Command::PublishImage { image });
        let _ = pool.apply(Command::InventoryObserved {
            as_of: pool.deploy_now(),
            present: BTreeSet::new(),
        });
        let image = pool.image.clone();
        let ticked = pool.apply(Command::Tick { image });
        for effect in ticked.effects {
            if let Effect::Create { worker, token, .. } = effect {
                let _ = pool.apply(Command::CreateReported {
                    worker,
                    token,
                    outcome: Outcome::Done,
                });
            }
        }
        assert_eq!(pool.doc.counts().warm, 1);
        pool
    }

    fn deploy_now(&self) -> UnixMillis {
        UnixMillis(DEPLOY_OFFSET_MS + self.mono.0)
    }

    fn apply(&mut self, command: Command) -> Applied {
        let now = self.deploy_now();
        self.doc.apply(command, now, &self.config)
    }

    fn holder_config(&self) -> HolderConfig {
        HolderConfig::from_pool(&self.config)
    }

    fn acquire(&mut self, ticket: u64) -> Applied {
        self.apply(Command::Acquire {
            ticket: TicketId(ticket),
            member: MemberId("m".into()),
            scope: LeaseScope {
                namespace: LeaseNamespace::Code,
                actor: ActorId("a".into()),
                conversation: ConversationId("c".into()),
            },
            wait_ms: 10_000,
            stack: false,
        })
    }

    /// Acquires a lease and hands it to a new holder.
    fn granted_holder(&mut self) -> LeaseHolder {
        let asked_at = self.mono;
        let applied = self.acquire(1);
        let Some(Event::Granted {
            ticket,
            worker,
            token,
            ..
        }) = applied.answer(TicketId(1))
        else {
            panic!("no grant: {applied:?}");
        };
        let grant = Grant {
            ticket: *ticket,
            worker: *worker,
            token: *token,
        };
        LeaseHolder::granted(grant, asked_at, self.holder_config(), self.mono)
    }

    fn advance_to(&mut self, holder: &mut LeaseHolder, at: MonoMillis) {
        self.mono = at;
        holder.handle_timeout(at);
    }

    /// Commits every command the holder has now, answering each (or losing each answer).
    fn drain_commands(&mut self, holder: &mut LeaseHolder, answered: bool) -> Vec<Command> {
        let mut sent = Vec::new();
        while let Some(command) = holder.poll_command() {
            let applied = self.apply(command.clone());
            sent.push(command);
            holder.handle_committed(answered.then_some(applied), self.mono);
        }
        sent
    }

    fn tick(&mut self) -> Applied {
        let image = self.image.clone();
        self.apply(Command::Tick { image })
    }
}

fn drain_events(holder: &mut LeaseHolder) -> Vec<HolderEvent> {
    std::iter::from_fn(|| holder.poll_event()).collect()
}

fn drain_effects(holder: &mut LeaseHolder) -> Vec<Effect> {
    std::iter::from_fn(|| holder.poll_effect()).collect()
}

fn lease_expiry(pool: &Pool, ticket: TicketId) -> UnixMillis {
    match pool.doc.ticket_status(ticket) {
        TicketStatus::Granted { expires_at, .. } => expires_at,
        other => panic!("lease {ticket} not held: {other:?}"),
    }
}

#[test]
fn pool_06_heartbeats_go_out_every_period_and_keep_the_lease() {
    let mut pool = Pool::warm();
    let mut holder = pool.granted_holder();
    assert_eq!(holder.poll_command(), None, "nothing is due at the grant");
    assert_eq!(holder.poll_timeout(), Some(MonoMillis(1_000)));
    for period in 1..=12u64 {
        let at = holder
            .poll_timeout()
            .expect("a holder that holds has a timer");
        assert_eq!(at, MonoMillis(period * 1_000));
        pool.advance_to(&mut holder, at);
        let sent = pool.drain_commands(&mut holder, true);
        assert!(
            matches!(sent.as_slice(), [Command::Heartbeat { .. }]),
            "period {period}: {sent:?}"
        );
        // Tick as the controller would: a lease renewed on time is never taken over.
        let _ = pool.tick();
    }
    assert!(holder.holds());
    assert_eq!(drain_events(&mut holder), Vec::new());
    assert_eq!(
        lease_expiry(&pool, TicketId(1)),
        UnixMillis(DEPLOY_OFFSET_MS + 12_000 + 4_000)
    );
}

#[test]
fn pool_09_a_refused_heartbeat_tells_the_run_once_and_ends_the_lease() {
    let mut pool = Pool::warm();
    let mut holder = pool.granted_holder();
    // The store answers nothing for a while; the pool takes the lease over at its expiry.
    pool.mono = MonoMillis(4_000);
    let ticked = pool.tick();
    assert!(
        ticked
            .events
            .iter()
            .any(|e| matches!(e, Event::LeaseLost { lease, .. } if *lease == TicketId(1))),
        "{ticked:?}"
    );
    // The holder's first heartbeat (due at 1 s, sent late) is refused: the lease expired.
    holder.handle_timeout(MonoMillis(1_000));
    let sent = pool.drain_commands(&mut holder, true);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        drain_events(&mut holder),
        vec![
            HolderEvent::Lost(LossReason::Refused(Refusal::LeaseExpired)),
            HolderEvent::Ended(Ending::Lost)
        ]
    );
    assert!(!holder.holds());
    // Nothing more goes out: no heartbeat, and a release after the loss is nothing to send.
    holder.handle_release(Disposition::Reset, MonoMillis(2_000));
    holder.handle_timeout(MonoMillis(10_000));
    assert_eq!(holder.poll_command(), None);
    assert_eq!(holder.poll_timeout(), None);
    assert!(holder.is_done());
}

#[test]
fn a_lease_whose_renewals_go_unanswered_counts_as_lost_at_its_time_to_live() {
    let mut pool = Pool::warm();
    let mut holder = pool.granted_holder();
    let mut heartbeats = 0;
    let mut events = Vec::new();
    while let Some(at) = holder.poll_timeout() {
        assert!(
            at <= MonoMillis(4_000),
            "a timer past the lease's deadline: {at:?}"
        );
        pool.mono = at;
        holder.handle_timeout(at);
        // The store is unreachable: every heartbeat goes without an answer (and is not applied).
        while let Some(command) = holder.poll_command() {
            assert!(matches!(command, Command::Heartbeat { .. }), "{command:?}");
            heartbeats += 1;
            holder.handle_committed(None, at);
        }
        events.extend(drain_events(&mut holder));
    }
    assert!(
        heartbeats >= 3,
        "unanswered heartbeats are sent again: {heartbeats}"
    );
    assert_eq!(
        events,
        vec![
            HolderEvent::Lost(LossReason::Unconfirmed),
            HolderEvent::Ended(Ending::Lost)
        ]
    );
    assert_eq!(
        pool.mono,
        MonoMillis(4_000),
        "lost exactly at asked_at + ttl"
    );
}

#[test]
fn pool_08_a_release_resets_the_worker_and_reports_its_evidence() {
    let mut pool = Pool::warm();
    let mut holder = pool.granted_holder();
    let worker = holder.grant().expect("granted").worker;
    holder.handle_release(Disposition::Reset, MonoMillis(500));
    let sent = pool.drain_commands(&mut holder, true);
    assert!(
        matches!(sent.as_slice(), [Command::Release { .. }]),
        "{sent:?}"
    );
    let effects = drain_effects(&mut holder);
    let [
        Effect::Reset {
            worker: reset,
            token,
        },
    ] = effects.as_slice()
    else {
        panic!("one reset expected: {effects:?}");
    };
    assert_eq!(*reset, worker);
    assert_eq!(
        drain_events(&mut holder),
        vec![HolderEvent::Ended(Ending::Released)]
    );
    assert!(!holder.is_done(), "the reset is still pending");
    holder.handle_reset(
        worker,
        *token,
        Some(ResetEvidence::clean(*token)),
        MonoMillis(600),
    );
    let sent = pool.drain_commands(&mut holder, true);
    assert!(
        matches!(sent.as_slice(), [Command::ResetReported { .. }]),
        "{sent:?}"
    );
    assert_eq!(pool.doc.workers()[&worker].state, WorkerState::Warm);
    assert!(holder.is_done());
}

#[test]
fn a_discard_release_hands_out_the_delete_it_orders() {
    let mut pool = Pool::warm();
    let mut holder = pool.granted_holder();
    let worker = holder.grant().expect("granted").worker;
    holder.handle_release(Disposition::Discard, MonoMillis(500));
    let _ = pool.drain_commands(&mut holder, true);
    let effects = drain_effects(&mut holder);
    assert!(
        matches!(effects.as_slice(), [Effect::Delete { worker: w, .. }] if *w == worker),
        "the Discard's delete must reach the shell: {effects:?}"
    );
    assert_eq!(
        pool.doc.workers()[&worker].state.kind(),
        StateKind::Quarantined
    );
    assert_eq!(
        drain_events(&mut holder),
        vec![HolderEvent::Ended(Ending::Released)]
    );
    assert!(holder.is_done());
}

#[test]
fn an_unanswered_release_is_sent_again_and_its_reset_performed_once() {
    let mut pool = Pool::warm();
    let mut holder = pool.granted_holder();
    pool.mono = MonoMillis(500);
    holder.handle_release(Disposition::Reset, pool.mono);
    // Applied, but the answer is lost.
    let first = pool.drain_commands(&mut holder, false);
    assert_eq!(first.len(), 1);
    assert_eq!(holder.poll_command(), None, "no retry before the back-off");
    assert_eq!(drain_effects(&mut holder), Vec::new());
    let retry_at = holder.poll_timeout().expect("a retry timer");
    assert_eq!(retry_at, MonoMillis(750));
    pool.advance_to(&mut holder, retry_at);
    let second = pool.drain_commands(&mut holder, true);
    assert_eq!(second, first, "the same, idempotent release");
    let effects = drain_effects(&mut holder);
    assert_eq!(effects.len(), 1, "the re-issued reset, once: {effects:?}");
    assert_eq!(
        drain_events(&mut holder),
        vec![HolderEvent::Ended(Ending::Released)]
    );
}

#[test]
fn a_release_that_never_gets_an_answer_ends_unconfirmed_when_the_lease_would_have_expired() {
    let mut pool = Pool::warm();
    let mut holder = pool.granted_holder();
    pool.mono = MonoMillis(500);
    holder.handle_release(Disposition::Reset, pool.mono);
    let mut releases = 0;
    let mut at = pool.mono;
    loop {
        while let Some(command) = holder.poll_command() {
            assert!(matches!(command, Command::Release { .. }), "{command:?}");
            releases += 1;
            holder.handle_committed(None, at);
        }
        let Some(next) = holder.poll_timeout() else {
            break;
        };
        at = next;
        pool.mono = at;
        holder.handle_timeout(at);
    }
    assert!(releases >= 2, "sent again while worth it: {releases}");
    assert_eq!(pool.mono, MonoMillis(4_000));
    assert_eq!(
        drain_events(&mut holder),
        vec![HolderEvent::Ended(Ending::Unconfirmed)]
    );
    assert!(holder.is_done());
}

#[test]
fn a_zombie_heartbeat_learns_the_lease_is_lost_and_hands_out_the_takeover_delete() {
    let mut pool = Pool::warm();
    let mut holder = pool.granted_holder();
    let worker = holder.grant().expect("granted").worker;
    pool.advance_to(&mut holder, MonoMillis(1_000));
    let Some(heartbeat) = holder.poll_command() else {
        panic!("a heartbeat is due");
    };
    // The holder pauses with its heartbeat in hand; nobody sweeps the lease meanwhile. It resumes
    // past the lease's expiry and sends it with its old token.
    pool.mono = MonoMillis(9_000);
    let applied = pool.apply(heartbeat);
    holder.handle_committed(Some(applied), MonoMillis(9_000));
    holder.handle_timeout(MonoMillis(9_000));
    assert_eq!(
        drain_events(&mut holder),
        vec![
            HolderEvent::Lost(LossReason::TakenOver(RemovalReason::LeaseExpired)),
            HolderEvent::Ended(Ending::Lost)
        ]
    );
    let effects = drain_effects(&mut holder);
    assert!(
        matches!(effects.as_slice(), [Effect::Delete { worker: w, .. }] if *w == worker),
        "the takeover's delete must reach the shell: {effects:?}"
    );
}

#[test]
fn withdrawing_a_ticket_granted_meanwhile_releases_it_and_performs_the_reset() {
    let mut pool = Pool::warm();
    let _ = pool.acquire(1);
    let mut holder = LeaseHolder::withdrawing(TicketId(1), pool.holder_config(), MonoMillis(0));
    let sent = pool.drain_commands(&mut holder, true);
    assert_eq!(
        sent,
        vec![Command::Cancel {
            ticket: TicketId(1)
        }]
    );
    let effects = drain_effects(&mut holder);
    let [Effect::Reset { worker, token }] = effects.as_slice() else {
        panic!("the grant's release orders a reset: {effects:?}");
    };
    assert_eq!(
        drain_events(&mut holder),
        vec![HolderEvent::Ended(Ending::Withdrawn)]
    );
    holder.handle_reset(
        *worker,
        *token,
        Some(ResetEvidence::clean(*token)),
        MonoMillis(10),
    );
    let sent = pool.drain_commands(&mut holder, true);
    assert_eq!(sent.len(), 1);
    assert_eq!(pool.doc.counts().warm, 1);
    assert!(holder.is_done());
}

#[test]
fn spurious_timeouts_and_answers_change_nothing() {
    let mut pool = Pool::warm();
    let mut holder = pool.granted_holder();
    for at in [0, 10, 999] {
        holder.handle_timeout(MonoMillis(at));
        assert_eq!(holder.poll_command(), None, "at {at}");
    }
    holder.handle_committed(None, MonoMillis(999));
    holder.handle_reset(
        WorkerId { epoch: 9, seq: 9 },
        OpToken(9),
        None,
        MonoMillis(999),
    );
    assert_eq!(holder.poll_command(), None);
    assert_eq!(holder.poll_timeout(), Some(MonoMillis(1_000)));
    assert!(holder.holds());
}
