//! The Valkey store against a real valkey-server started by each test (POOL-5, POOL-6, POOL-11).
//! Where no server binary is found, each test skips through `corral_testkit::skip`; CI installs one
//! and sets `CORRAL_REQUIRE_SERVICES`, under which a missing server fails the test.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use corral_core::ids::{ImageId, OpToken, TicketId, WorkerId};
use corral_core::pool::{Command, Event, PoolDoc, Refusal};
use corral_core::store::{CasOutcome, Loaded, Transacted, Version};
use corral_core::time::UnixMillis;
use corral_store::harness::{PaperController, commit, test_pool_config};
use corral_store::valkey_server::ValkeyServer;
use corral_store::{ValkeyStore, fresh_epoch};

fn server(test: &str) -> Option<ValkeyServer> {
    ValkeyServer::start_or_skip(test)
}

async fn warm_pool(store: &ValkeyStore, controller: &mut PaperController) {
    let config = test_pool_config();
    for _ in 0..10 {
        assert!(controller.step(store, &config).await, "the store answers");
        if let Ok(Loaded::Found { doc, .. }) = store.load().await
            && doc.counts().warm >= config.warm_min
        {
            return;
        }
    }
    panic!("the pool never warmed");
}

/// A store of pool `pool` on the server at `url`, and the paper controller that warmed it.
async fn warmed(url: &str, pool: &str) -> (ValkeyStore, PaperController) {
    let store = ValkeyStore::connect(url, pool).await.expect("connects");
    let mut controller = PaperController::new("img-1");
    warm_pool(&store, &mut controller).await;
    (store, controller)
}

/// After the pool's document was lost or distrusted: lease 1's heartbeat, sent through `holder`,
/// is told the lease is unknown, and warming the pool again through `store` deletes every worker
/// of the old epoch (`worker` among them) instead of adopting it.
async fn old_epoch_forgotten(
    holder: &ValkeyStore,
    store: &ValkeyStore,
    controller: &mut PaperController,
    worker: WorkerId,
    token: OpToken,
) {
    let config = test_pool_config();
    let heartbeat = Command::Heartbeat {
        worker,
        lease: TicketId(1),
        token,
    };
    let answer = commit(holder, &heartbeat, &config).await.expect("answers");
    assert!(
        answer.events.contains(&Event::Refused {
            ticket: TicketId(1),
            reason: Refusal::LeaseUnknown
        }),
        "{answer:?}"
    );
    let survivors = controller.workers.clone();
    assert!(survivors.contains(&worker));
    warm_pool(store, controller).await;
    for old in &survivors {
        assert!(
            !controller.workers.contains(old),
            "{old} was deleted, not adopted"
        );
    }
}

fn acquire(ticket: u64, member: &str) -> Command {
    corral_store::harness::code_acquire(ticket, member, 1_000)
}

#[tokio::test]
async fn pool_05_compare_and_set_is_the_only_write() {
    let Some(server) = server("pool_05_compare_and_set_is_the_only_write") else {
        return;
    };
    let store = ValkeyStore::connect(&server.url(), "contract")
        .await
        .expect("connects");
    assert_eq!(store.load().await, Ok(Loaded::Absent));
    let now = store.now().await.expect("TIME answers");
    assert!(
        now.0 > 1_600_000_000_000,
        "deployment time is Valkey's wall clock in ms: {now}"
    );
    let doc = PoolDoc::new(fresh_epoch(), now);
    assert_eq!(
        store.compare_and_set(None, &doc).await,
        CasOutcome::Ok {
            version: Version(1)
        }
    );
    assert_eq!(
        store.compare_and_set(None, &doc).await,
        CasOutcome::Conflict,
        "create-only fails when present"
    );
    assert_eq!(
        store.compare_and_set(Some(Version(7)), &doc).await,
        CasOutcome::Conflict,
        "a stale version fails"
    );
    assert_eq!(
        store.compare_and_set(Some(Version(1)), &doc).await,
        CasOutcome::Ok {
            version: Version(2)
        }
    );
    match store.load().await {
        Ok(Loaded::Found {
            version,
            doc: loaded,
        }) => {
            assert_eq!(version, Version(2));
            assert_eq!(loaded, doc);
        }
        other => panic!("expected the document, got {other:?}"),
    }
    // A command applied at a time Valkey has not reached, or long past, is never written.
    let now = store.now().await.expect("TIME answers");
    for (applied_at, why) in [
        (UnixMillis(now.0 + 60_000), "in the future"),
        (
            UnixMillis(now.0 - 10 * corral_store::CLOCK_TOLERANCE_MS),
            "too far in the past",
        ),
    ] {
        assert_eq!(
            store.cas_at(Some(Version(2)), &doc, Some(applied_at)).await,
            CasOutcome::Conflict,
            "a document applied {why} is refused"
        );
    }
    // (A stall of the test machine between the two calls longer than the tolerance would refuse
    // it too; a few tries keep the test about the rule, not the machine.)
    let mut written = CasOutcome::Conflict;
    for _ in 0..5 {
        let now = store.now().await.expect("TIME answers");
        written = store.cas_at(Some(Version(2)), &doc, Some(now)).await;
        if written != CasOutcome::Conflict {
            break;
        }
    }
    assert_eq!(
        written,
        CasOutcome::Ok {
            version: Version(3)
        },
        "and one applied at Valkey's time is written"
    );
}

#[tokio::test]
async fn pool_11_an_unreachable_store_fails_admission_closed_and_a_restart_loses_everything() {
    let Some(mut server) = server(
        "pool_11_an_unreachable_store_fails_admission_closed_and_a_restart_loses_everything",
    ) else {
        return;
    };
    let config = test_pool_config();
    let (store, mut controller) = warmed(&server.url(), "outage").await;
    let granted = commit(&store, &acquire(1, "m"), &config)
        .await
        .expect("grants");
    let Some(&Event::Granted { worker, token, .. }) = granted.answer(TicketId(1)) else {
        panic!("a warm pool grants at once: {granted:?}")
    };
    server.kill();
    // The store remembers the document, so its first contact may be the write itself, whose
    // outcome a dead connection leaves unknown; either way nothing is granted.
    let attempt = store
        .transact(&acquire(2, "m"), &config, fresh_epoch(), 3)
        .await;
    assert!(
        matches!(attempt, Transacted::Unavailable | Transacted::Unknown),
        "never committed: {attempt:?}"
    );
    assert_eq!(
        commit(&store, &acquire(2, "m"), &config).await,
        None,
        "admission fails closed"
    );
    assert!(store.load().await.is_err());
    assert!(matches!(
        store
            .compare_and_set(None, &PoolDoc::new(1, UnixMillis(1)))
            .await,
        CasOutcome::Unavailable | CasOutcome::Unknown
    ));
    assert!(
        !controller.step(&store, &config).await,
        "the controller cannot rebuild anything either"
    );

    server.restart().expect("restarts");
    let reconnected = ValkeyStore::connect(&server.url(), "outage")
        .await
        .expect("reconnects");
    assert_eq!(
        reconnected.load().await,
        Ok(Loaded::Absent),
        "restarted empty"
    );
    // The lease in flight fails with a clear error; nothing is re-adopted on trust.
    let survivors = controller.workers.clone();
    old_epoch_forgotten(&reconnected, &reconnected, &mut controller, worker, token).await;
    let regrant = commit(&reconnected, &acquire(3, "m"), &config)
        .await
        .expect("grants");
    let Some(&Event::Granted { worker: fresh, .. }) = regrant.answer(TicketId(3)) else {
        panic!("the rebuilt pool grants: {regrant:?}")
    };
    assert!(
        !survivors.contains(&fresh),
        "no double lease: a new worker, not the old one"
    );
}

/// A Valkey killed between two snapshots comes back with the pool document as it was at the
/// last save: leases granted since are forgotten, their workers shown warm. Nothing of such a
/// document is trusted: a replica that never saw the lost writes (so could not tell) does not
/// hand the leased worker on; the pool starts a new epoch, the lease in flight is told it is
/// unknown, and every old worker is deleted before capacity is freed, exactly as after a restart
/// that lost everything (decision 0034).
#[tokio::test]
async fn pool_09_pool_11_a_valkey_restored_from_an_older_snapshot_is_not_trusted() {
    let test = "pool_09_pool_11_a_valkey_restored_from_an_older_snapshot_is_not_trusted";
    let dir = std::env::temp_dir().join(format!("corral-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a snapshot directory");
    let mut server = match ValkeyServer::start_with_snapshots(&dir) {
        Ok(server) => server,
        Err(why) => {
            corral_testkit::skip(test, corral_testkit::Need::Services, &why.0);
            return;
        }
    };
    let config = test_pool_config();
    let (store, mut controller) = warmed(&server.url(), "restored").await;
    assert!(server.save(), "the snapshot is saved");
    let granted = commit(&store, &acquire(1, "m"), &config)
        .await
        .expect("grants");
    let Some(&Event::Granted { worker, token, .. }) = granted.answer(TicketId(1)) else {
        panic!("a warm pool grants at once: {granted:?}")
    };
    server.restart().expect("restarts from the snapshot");

    // Another replica, which never saw the grant: the restored document says the worker is warm.
    let other = ValkeyStore::connect(&server.url(), "restored")
        .await
        .expect("connects");
    let Ok(Loaded::Outlived { doc: restored, .. }) = other.load().await else {
        panic!("a document from before the restart is read as outlived")
    };
    assert_eq!(
        restored.counts().leased,
        0,
        "the snapshot predates the grant, so it rolled the lease back"
    );
    // A write that expects it current is refused even though its version and epoch match.
    let Ok(Loaded::Outlived { version, doc }) = other.load().await else {
        panic!("still outlived")
    };
    assert_eq!(
        other.compare_and_set(Some(version), &doc).await,
        CasOutcome::Conflict,
        "a document that outlived a restart is never written over as current"
    );
    let second = commit(&other, &acquire(2, "m2"), &config)
        .await
        .expect("answers");
    assert!(
        !matches!(second.answer(TicketId(2)), Some(Event::Granted { worker: w, .. }) if *w == worker),
        "the leased worker is never handed on: {second:?}"
    );
    let Ok(Loaded::Found { doc: fresh, .. }) = other.load().await else {
        panic!("the replacement is current")
    };
    assert_ne!(fresh.epoch(), restored.epoch(), "a new epoch began");

    // The replica that granted the lease: its holder is told the lease is unknown; nothing of
    // the old epoch is re-adopted.
    old_epoch_forgotten(&store, &other, &mut controller, worker, token).await;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three client processes, three members each, one Valkey: one pool, one member limit, one
/// ceiling. Leases are timed on Valkey's clock; on one worker they never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_05_three_processes_keep_one_pool() {
    let Some(server) = server("pool_05_three_processes_keep_one_pool") else {
        return;
    };
    let url = server.url();
    let config = test_pool_config();
    let (store, mut controller) = warmed(&url, "test").await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reconciler = {
        let (url, stop, config) = (url.clone(), stop.clone(), config.clone());
        tokio::spawn(async move {
            let store = ValkeyStore::connect(&url, "test").await.expect("connects");
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                controller.step(&store, &config).await;
                peak = peak.max(controller.workers.len());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        })
    };
    let mut children = Vec::new();
    for process in 0..3u64 {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_corral-pool-client"))
            .args([
                url.as_str(),
                "m0,m1,m2",
                "6",
                "15",
                &((process + 1) * 100_000_000).to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawns a client process");
        children.push(child);
    }
    let mut leases: Vec<(String, String, u64, u64)> = Vec::new();
    for child in children {
        let output = child.wait_with_output().await.expect("client runs");
        assert!(output.status.success());
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            if let ["lease", worker, member, start, end] = parts[..] {
                leases.push((
                    worker.into(),
                    member.into(),
                    start.parse().unwrap(),
                    end.parse().unwrap(),
                ));
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = reconciler.await.expect("reconciler");
    assert!(
        leases.len() >= 27,
        "most cycles were served: {}",
        leases.len()
    );
    assert!(
        peak <= config.max_allocated as usize,
        "one ceiling: {peak} workers existed at once"
    );
    let mut by_worker: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for (worker, _, start, end) in &leases {
        by_worker.entry(worker).or_default().push((*start, *end));
    }
    assert!(
        by_worker.values().any(|spans| spans.len() >= 2),
        "some worker served two leases, so the overlap check below can fail: {by_worker:?}"
    );
    for (worker, mut spans) in by_worker {
        spans.sort();
        for pair in spans.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "{worker} held by two leases at once: {pair:?}"
            );
        }
    }
    // One member limit: at any lease's start, no more than the limit of that member's leases hold.
    for (_, member, start, _) in &leases {
        let holding = leases
            .iter()
            .filter(|(_, m, s, e)| m == member && s <= start && start < e)
            .count();
        assert!(
            holding <= config.max_per_member as usize,
            "{member} held {holding} leases at once"
        );
    }
    let image = ImageId("img-1".into());
    let Ok(Loaded::Found { doc, .. }) = store.load().await else {
        panic!("the pool document is there")
    };
    assert_eq!(doc.image(), Some(&image));
    assert_eq!(doc.counts().leased, 0, "every lease was released");
}

/// Group commit (decision 0011): commands that tasks of one replica commit at once share writes,
/// and each caller gets its own command's outcome, as if each had been its own transaction.
#[tokio::test(flavor = "current_thread")]
async fn pool_05_concurrent_commits_of_one_replica_share_writes() {
    let Some(server) = server("pool_05_concurrent_commits_of_one_replica_share_writes") else {
        return;
    };
    let config = test_pool_config();
    let (store, _controller) = warmed(&server.url(), "group").await;
    let warm = match store.load().await {
        Ok(Loaded::Found { doc, .. }) => doc.counts().warm,
        other => panic!("a warm pool: {other:?}"),
    };
    let writes_before = store
        .write_counts()
        .attempted
        .load(std::sync::atomic::Ordering::Relaxed);
    const CALLERS: u64 = 24;
    let mut tasks = Vec::new();
    for ticket in 1..=CALLERS {
        let (store, config) = (store.clone(), config.clone());
        tasks.push(tokio::spawn(async move {
            let applied = commit(&store, &acquire(ticket, &format!("m{ticket}")), &config)
                .await
                .expect("commits");
            (ticket, applied)
        }));
    }
    let mut granted = BTreeMap::new();
    let mut queued = 0;
    for task in tasks {
        let (ticket, applied) = task.await.expect("task");
        let own: Vec<&Event> = applied
            .events
            .iter()
            .filter(|e| e.ticket() == Some(TicketId(ticket)))
            .collect();
        match own[..] {
            [Event::Granted { worker, .. }] => {
                assert!(
                    granted.insert(*worker, ticket).is_none(),
                    "{worker} granted twice"
                );
            }
            [Event::Queued { .. }] => queued += 1,
            _ => panic!("ticket {ticket}: one grant or one queueing, got {own:?}"),
        }
    }
    assert_eq!(granted.len() as u32, warm, "every warm worker granted once");
    assert_eq!(granted.len() as u64 + queued, CALLERS);
    let writes = store
        .write_counts()
        .attempted
        .load(std::sync::atomic::Ordering::Relaxed)
        - writes_before;
    assert!(
        writes < CALLERS / 2,
        "{CALLERS} commands took {writes} compare-and-sets: they were not batched"
    );
}

/// One FIFO queue across processes: tickets that three client processes queue, one after
/// another, are granted in that order as one worker comes back between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_03_tickets_queued_by_three_processes_are_granted_in_order() {
    use corral_core::pool::{Disposition, Effect, TicketStatus};

    let Some(server) = server("pool_03_tickets_queued_by_three_processes_are_granted_in_order")
    else {
        return;
    };
    let url = server.url();
    let config = test_pool_config();
    let (store, _controller) = warmed(&url, "test").await;
    // Every warm worker is held, so the processes' tickets queue (the controller is not run
    // again: nothing new is created).
    let mut held = Vec::new();
    let warm = match store.load().await {
        Ok(Loaded::Found { doc, .. }) => doc.counts().warm,
        other => panic!("a warm pool: {other:?}"),
    };
    for ticket in 1..=u64::from(warm) {
        let applied = commit(&store, &acquire(ticket, &format!("h{ticket}")), &config)
            .await
            .expect("grants");
        let Some(&Event::Granted { worker, token, .. }) = applied.answer(TicketId(ticket)) else {
            panic!("a warm worker for every holder: {applied:?}")
        };
        held.push((TicketId(ticket), worker, token));
    }
    let mut children = Vec::new();
    for (index, base) in [100u64, 200, 300].into_iter().enumerate() {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_corral-pool-client"))
            .args([
                url.as_str(),
                &format!("m{index}"),
                "1",
                "20",
                &base.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawns a client process");
        children.push(child);
        // The next process starts once this one's ticket is in the queue, at the back.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Loaded::Found { doc, .. }) = store.load().await
                && let TicketStatus::Queued { position } = doc.ticket_status(TicketId(base))
            {
                assert_eq!(position as usize, index, "ticket {base} joined at the back");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "ticket {base} never queued"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    // One worker comes back; each client holds it, releases it and reports its (paper) reset.
    let (lease, worker, token) = held[0];
    let released = commit(
        &store,
        &Command::Release {
            worker,
            lease,
            token,
            disposition: Disposition::Reset,
        },
        &config,
    )
    .await
    .expect("releases");
    let resets: Vec<_> = released
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Reset { worker, token } => Some((*worker, *token)),
            _ => None,
        })
        .collect();
    let [(reset_worker, reset_token)] = resets[..] else {
        panic!("the release orders one reset: {released:?}")
    };
    assert_eq!(reset_worker, worker);
    let reset = corral_store::harness::paper_reset(worker, reset_token);
    // What it grants (the queue's head) its owner reads from the document.
    let _granted = commit(&store, &reset, &config).await.expect("reported");
    let mut starts = Vec::new();
    for child in children {
        let output = child.wait_with_output().await.expect("client runs");
        assert!(output.status.success());
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let start: u64 = text
            .lines()
            .find_map(|l| {
                let parts: Vec<&str> = l.split(' ').collect();
                match parts[..] {
                    ["lease", _, _, start, _] => start.parse().ok(),
                    _ => None,
                }
            })
            .unwrap_or_else(|| panic!("a lease: {text}"));
        starts.push(start);
    }
    assert!(
        starts.windows(2).all(|w| w[0] < w[1]),
        "granted in the order queued: {starts:?}"
    );
}

/// The server's count of client connections (`INFO clients`).
async fn connected_clients(url: &str) -> u64 {
    use fred::prelude::*;
    let client = Client::new(Config::from_url(url).expect("a url"), None, None, None);
    client.init().await.expect("connects");
    let info: String = client
        .info(Some(fred::types::InfoKind::Clients))
        .await
        .expect("INFO clients");
    let _ = client.quit().await;
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients")
}

/// A version watch (a queued acquire's subscription) closes its connection when it is dropped:
/// one left open stays subscribed, and every later pool write is published to it.
#[tokio::test]
async fn pool_05_a_dropped_version_watch_closes_its_connection() {
    let test = "pool_05_a_dropped_version_watch_closes_its_connection";
    let Some(server) = server(test) else {
        return;
    };
    let url = server.url();
    let store = ValkeyStore::connect(&url, "watches")
        .await
        .expect("connects");
    // The count includes the probe's own connection each time it is read.
    let before = connected_clients(&url).await;
    let mut watches = Vec::new();
    for _ in 0..5 {
        watches.push(store.subscribe().await.expect("a watch"));
    }
    assert_eq!(
        connected_clients(&url).await,
        before + 5,
        "one connection per watch"
    );
    drop(watches);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut now = connected_clients(&url).await;
    while now != before && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
        now = connected_clients(&url).await;
    }
    assert_eq!(now, before, "every dropped watch's connection is closed");
}

/// A queued waiter is woken only by an announcement that may concern its ticket: one that still
/// lists it as queued passes it by (with a hundred waiters, each reading the whole pool at every
/// announcement was most of a queued burst's CPU); one that no longer lists it wakes it.
#[tokio::test]
async fn pool_03_a_queued_waiter_is_woken_only_by_announcements_that_may_concern_its_ticket() {
    let test = "pool_03_a_queued_waiter_is_woken_only_by_announcements_that_may_concern_its_ticket";
    let Some(server) = server(test) else {
        return;
    };
    let url = server.url();
    let config = test_pool_config();
    let (store, _controller) = warmed(&url, "announce").await;
    let warm = match store.load().await {
        Ok(Loaded::Found { doc, .. }) => doc.counts().warm,
        other => panic!("a warm pool: {other:?}"),
    };
    // Every warm worker held, so tickets 100 and 101 queue.
    for ticket in 1..=u64::from(warm) {
        let applied = commit(&store, &acquire(ticket, &format!("h{ticket}")), &config)
            .await
            .expect("answers");
        assert!(
            matches!(
                applied.answer(TicketId(ticket)),
                Some(Event::Granted { .. })
            ),
            "{applied:?}"
        );
    }
    let (first, second) = (TicketId(100), TicketId(101));
    for ticket in [first, second] {
        let applied = commit(&store, &acquire(ticket.0, "q"), &config)
            .await
            .expect("answers");
        assert!(
            matches!(applied.answer(ticket), Some(Event::Queued { .. })),
            "{applied:?}"
        );
    }
    let mut watch_first = store.subscribe().await.expect("a watch");
    let mut watch_second = store.subscribe().await.expect("a watch");
    // A third ticket queues (both still listed), then the second is withdrawn.
    let third = commit(&store, &acquire(102, "q"), &config)
        .await
        .expect("answers");
    assert!(matches!(
        third.answer(TicketId(102)),
        Some(Event::Queued { .. })
    ));
    let withdrawn = commit(&store, &Command::Cancel { ticket: second }, &config)
        .await
        .expect("answers");
    assert!(withdrawn.answer(second).is_some(), "{withdrawn:?}");
    // The second's waiter passes the first announcement by and is woken by the withdrawal.
    assert!(
        watch_second
            .changed_for(second, Duration::from_secs(10))
            .await,
        "the withdrawal concerns the second ticket"
    );
    // Neither announcement concerns the first ticket: its waiter is not woken.
    assert!(
        !watch_first
            .changed_for(first, Duration::from_millis(500))
            .await,
        "no announcement so far concerns the first ticket"
    );
    let withdrawn = commit(&store, &Command::Cancel { ticket: first }, &config)
        .await
        .expect("answers");
    assert!(withdrawn.answer(first).is_some(), "{withdrawn:?}");
    assert!(
        watch_first
            .changed_for(first, Duration::from_secs(10))
            .await,
        "its own withdrawal concerns the first ticket"
    );
}
