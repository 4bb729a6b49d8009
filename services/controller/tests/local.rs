//! The controller on the local backend with real worker processes and a real Valkey.
//!
//! The worker process here is a stand-in that only accepts connections on its port (the worker's
//! control API is tested in its own crate); its reset is answered by a stub that the test sets to
//! clean or unproven. Everything else is real: processes, signals, Valkey, the pool's rules.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use corral_controller::local::LocalBackend;
use corral_controller::{Backend, Reconciler, WorkerControl};
use corral_core::ids::{OpToken, TicketId, WorkerId};
use corral_core::pool::{Command, Disposition, Event, PoolConfig, PoolDoc, Refusal, StateKind};
use corral_core::reset::ResetEvidence;
use corral_core::store::Loaded;
use corral_store::ValkeyStore;
use corral_store::harness::commit;
use corral_store::valkey_server::ValkeyServer;

const STAND_IN: &str = "import socket, sys\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen(16)\nwhile True:\n    c, _ = s.accept()\n    c.close()\n";

struct Stub {
    clean: AtomicBool,
}

impl WorkerControl for Stub {
    async fn reset(&self, _worker: WorkerId, token: OpToken) -> Option<ResetEvidence> {
        let mut evidence = ResetEvidence::clean(token);
        if !self.clean.load(Ordering::Relaxed) {
            evidence.processes_remaining = Some(1);
        }
        Some(evidence)
    }
}

struct Fixture {
    server: ValkeyServer,
    reconciler: Reconciler<LocalBackend, Stub>,
    state: tempdir::Dir,
}

mod tempdir {
    /// A directory removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(name: &str) -> Self {
            let path = std::env::temp_dir()
                .join(format!("corral-controller-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).expect("temp dir");
            Self(path)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn backend(state: &Path) -> LocalBackend {
    let python = Path::new("/usr/bin/python3");
    LocalBackend::new(state, python, &["-c", STAND_IN, "{port}", "{id}"], &[]).expect("backend")
}

/// The fixture of the test `test` (its pool and directory named for it), or `None` after the test
/// skipped for want of a Valkey server.
async fn fixture(test: &str, config: PoolConfig) -> Option<Fixture> {
    let server = ValkeyServer::start_or_skip(test)?;
    let state = tempdir::Dir::new(test);
    let store = ValkeyStore::connect(&server.url(), test)
        .await
        .expect("connects");
    let reconciler = Reconciler::new(
        store,
        backend(&state.0),
        Stub {
            clean: AtomicBool::new(true),
        },
        config,
    );
    Some(Fixture {
        server,
        reconciler,
        state,
    })
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Leave no process behind.
        if let Ok(entries) = std::fs::read_dir(&self.state.0) {
            for entry in entries.flatten() {
                if let Some(id) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".worker"))
                    .and_then(WorkerId::parse)
                    && let Some(record) = self.reconciler.backend().record(id)
                {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(record.pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
}

async fn doc(f: &Fixture) -> PoolDoc {
    match f.reconciler.store().load().await {
        Ok(Loaded::Found { doc, .. }) => doc,
        other => panic!("no pool document: {other:?}"),
    }
}

/// Runs passes until `done` holds of the pool (bounded).
async fn until(f: &Fixture, what: &str, done: impl Fn(&PoolDoc) -> bool) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let _ = f.reconciler.pass().await;
        if done(&doc(f).await) {
            return;
        }
    }
    panic!("{what} never happened: {:?}", doc(f).await.counts());
}

fn acquire(ticket: u64, member: &str) -> Command {
    corral_store::harness::code_acquire(ticket, member, 5_000)
}

async fn grant(f: &Fixture, ticket: u64, config: &PoolConfig) -> (WorkerId, OpToken) {
    let applied = commit(f.reconciler.store(), &acquire(ticket, "m"), config)
        .await
        .expect("store up");
    match applied.answer(TicketId(ticket)) {
        Some(Event::Granted { worker, token, .. }) => (*worker, *token),
        _ => panic!("no grant: {applied:?}"),
    }
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn config() -> PoolConfig {
    PoolConfig {
        warm_min: 2,
        max_allocated: 4,
        max_concurrent_creates: 1,
        inventory_stale_ms: 60_000,
        ..PoolConfig::default()
    }
}

#[tokio::test]
async fn pool_02_the_warm_minimum_is_reached_with_real_processes_one_create_at_a_time() {
    let Some(f) = fixture(
        "pool_02_the_warm_minimum_is_reached_with_real_processes_one_create_at_a_time",
        config(),
    )
    .await
    else {
        return;
    };
    let started = Instant::now();
    loop {
        let pass = f.reconciler.pass().await;
        assert!(pass.created <= 1, "creation concurrency is 1: {pass:?}");
        if doc(&f).await.counts().warm == 2 || started.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    let present = f.reconciler.backend().list().await.expect("lists");
    assert_eq!(present.len(), 2, "two worker processes exist");
    for id in &present {
        assert!(alive(
            f.reconciler.backend().record(*id).expect("record").pid
        ));
    }
    // A restarted controller finds the same workers from their records.
    let again = backend(&f.state.0);
    assert_eq!(again.list().await.expect("lists"), present);
    assert_eq!(
        again.image(),
        f.reconciler.backend().image(),
        "the same build is the same image"
    );
}

#[tokio::test]
async fn pool_09_a_worker_killed_while_leased_is_detected_deleted_and_replaced() {
    let config = config();
    let Some(f) = fixture(
        "pool_09_a_worker_killed_while_leased_is_detected_deleted_and_replaced",
        config.clone(),
    )
    .await
    else {
        return;
    };
    until(&f, "warm minimum", |d| d.counts().warm == 2).await;
    let (worker, token) = grant(&f, 1, &config).await;
    let pid = f.reconciler.backend().record(worker).expect("record").pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9");
    until(&f, "replacement", |d| {
        !d.workers().contains_key(&worker) && d.counts().warm == 2
    })
    .await;
    let heartbeat = Command::Heartbeat {
        worker,
        lease: TicketId(1),
        token,
    };
    let answer = commit(f.reconciler.store(), &heartbeat, &config)
        .await
        .expect("store up");
    assert!(
        answer.events.contains(&Event::Refused {
            ticket: TicketId(1),
            reason: Refusal::LeaseUnknown
        }),
        "the lost lease fails clearly: {answer:?}"
    );
    assert!(
        f.reconciler.backend().record(worker).is_none(),
        "its record is gone"
    );
}

#[tokio::test]
async fn pool_04_a_reset_with_unproven_evidence_discards_the_worker() {
    let config = config();
    let Some(f) = fixture(
        "pool_04_a_reset_with_unproven_evidence_discards_the_worker",
        config.clone(),
    )
    .await
    else {
        return;
    };
    until(&f, "warm minimum", |d| d.counts().warm == 2).await;
    let (worker, token) = grant(&f, 1, &config).await;
    let pid = f.reconciler.backend().record(worker).expect("record").pid;
    f.reconciler.control().clean.store(false, Ordering::Relaxed);
    let release = Command::Release {
        worker,
        lease: TicketId(1),
        token,
        disposition: Disposition::Reset,
    };
    let applied = commit(f.reconciler.store(), &release, &config)
        .await
        .expect("store up");
    let mut pass = corral_controller::Pass::default();
    f.reconciler.perform(applied.effects, &mut pass).await;
    assert_eq!(pass.deleted, 1, "the unproven worker was deleted: {pass:?}");
    assert!(
        !doc(&f).await.workers().contains_key(&worker),
        "and freed once confirmed absent"
    );
    assert!(!alive(pid), "its process is gone");
}

#[tokio::test]
async fn pool_02_a_burst_grows_the_pool_and_idle_capacity_shrinks_after_its_ttl() {
    let config = PoolConfig {
        warm_min: 1,
        target_idle: 0,
        max_allocated: 4,
        max_concurrent_creates: 2,
        burst_idle_ttl_ms: 1_000,
        max_per_member: 4,
        inventory_stale_ms: 60_000,
        ..PoolConfig::default()
    };
    let Some(f) = fixture(
        "pool_02_a_burst_grows_the_pool_and_idle_capacity_shrinks_after_its_ttl",
        config.clone(),
    )
    .await
    else {
        return;
    };
    until(&f, "warm minimum", |d| d.counts().warm == 1).await;
    let mut leases = Vec::new();
    for ticket in 1..=3 {
        let applied = commit(f.reconciler.store(), &acquire(ticket, "m"), &config)
            .await
            .expect("store up");
        assert!(
            matches!(
                applied.answer(TicketId(ticket)),
                Some(Event::Granted { .. } | Event::Queued { .. })
            ),
            "ticket {ticket} is served or waits: {applied:?}"
        );
        until(&f, "a worker for the burst", |d| {
            matches!(
                d.ticket_status(TicketId(ticket)),
                corral_core::pool::TicketStatus::Granted { .. }
            )
        })
        .await;
        let corral_core::pool::TicketStatus::Granted { worker, token, .. } =
            doc(&f).await.ticket_status(TicketId(ticket))
        else {
            panic!("ticket {ticket} was granted and keeps its lease");
        };
        leases.push((ticket, worker, token));
    }
    assert_eq!(
        f.reconciler.backend().list().await.expect("lists").len(),
        3,
        "the burst created workers"
    );
    for (ticket, worker, token) in leases {
        let release = Command::Release {
            worker,
            lease: TicketId(ticket),
            token,
            disposition: Disposition::Reset,
        };
        let applied = commit(f.reconciler.store(), &release, &config)
            .await
            .expect("store up");
        let mut pass = corral_controller::Pass::default();
        f.reconciler.perform(applied.effects, &mut pass).await;
        assert_eq!(
            pass.resets, 1,
            "ticket {ticket}'s worker was reset: {pass:?}"
        );
    }
    assert_eq!(doc(&f).await.counts().warm, 3, "reset clean, all warm");
    until(&f, "shrink to the warm minimum", |d| {
        d.counts().allocated() == 1 && d.counts().warm == 1
    })
    .await;
    assert_eq!(
        f.reconciler.backend().list().await.expect("lists").len(),
        1,
        "the surplus processes are gone"
    );
}

#[tokio::test]
async fn pool_12_a_coordination_outage_at_start_up_delays_building_until_the_image_is_published() {
    const TEST: &str =
        "pool_12_a_coordination_outage_at_start_up_delays_building_until_the_image_is_published";
    let Some(mut f) = fixture(TEST, config()).await else {
        return;
    };
    f.server.kill();
    for _ in 0..3 {
        let pass = f.reconciler.pass().await;
        assert!(
            !pass.coordinated && !pass.published && pass.created == 0,
            "nothing is built without coordination: {pass:?}"
        );
    }
    assert!(
        f.reconciler
            .backend()
            .list()
            .await
            .expect("lists")
            .is_empty(),
        "no worker was created"
    );
    f.server.restart().expect("restarts");
    let store = ValkeyStore::connect(&f.server.url(), TEST)
        .await
        .expect("reconnects");
    let image = f.reconciler.backend().image();
    let state = f.state.0.clone();
    f.reconciler = Reconciler::new(
        store,
        backend(&state),
        Stub {
            clean: AtomicBool::new(true),
        },
        config(),
    );
    let first = f.reconciler.pass().await;
    assert!(
        first.published,
        "the first coordinated act publishes the image"
    );
    until(&f, "warm minimum", |d| d.counts().warm == 2).await;
    let pool = doc(&f).await;
    let warm: Vec<_> = pool
        .workers()
        .values()
        .filter(|w| w.state.kind() == StateKind::Warm)
        .collect();
    assert_eq!(warm.len(), 2, "{:?}", pool.counts());
    for worker in warm {
        assert_eq!(worker.image, image, "workers come from the published image");
    }
}
