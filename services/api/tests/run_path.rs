//! The run path's shell against a real Valkey and a real filesystem store, with workers that are
//! pool records whose control addresses refuse every connection (so a lease on one is a worker
//! that died after the pool last saw it warm). Needs a Valkey server; without one it says why and
//! skips, and CI (`CORRAL_REQUIRE_SERVICES`) requires it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_api::AppState;
use corral_api::workspaces::Workspaces;
use corral_contract::locate::LocalRecord;
use corral_contract::{Locator, WorkerClient};
use corral_core::config::Settings;
use corral_core::ids::WorkerId;
use corral_core::pool::{Command, Disposition, Effect, Event, PoolDoc};
use corral_core::run::admission::RunCodeRequest;
use corral_core::store::Loaded;
use corral_store::ValkeyStore;
use corral_store::harness::{PaperController, code_acquire, commit, paper_reset};
use corral_store::valkey_server::ValkeyServer;

/// A loopback port nobody listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port()
}

async fn doc(store: &ValkeyStore) -> PoolDoc {
    match store.load().await {
        Ok(Loaded::Found { doc, .. }) => doc,
        other => panic!("no pool document: {other:?}"),
    }
}

/// Polls the pool until `found` finds something in it (bounded).
async fn until<T>(store: &ValkeyStore, what: &str, found: impl Fn(&PoolDoc) -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = found(&doc(store).await) {
            return value;
        }
        assert!(Instant::now() < deadline, "never saw {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct Fixture {
    _server: ValkeyServer,
    state: Arc<AppState>,
    store: ValkeyStore,
    _controller: PaperController,
    dir: PathBuf,
}

impl Fixture {
    /// One warm paper worker, whose control address refuses connections.
    async fn one_dead_worker(test: &str, settings: Settings) -> Option<(Fixture, WorkerId)> {
        let server = ValkeyServer::start_or_skip(test)?;
        let dir =
            std::env::temp_dir().join(format!("corral-run-path-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("workers")).expect("dir");
        let store = ValkeyStore::connect(&server.url(), test)
            .await
            .expect("connects");
        let mut controller = PaperController::new("paper");
        assert!(controller.step(&store, &settings.pool()).await);
        let worker = *controller.workers.iter().next().expect("a paper worker");
        let record = LocalRecord {
            pid: 1,
            port: closed_port(),
        };
        std::fs::write(
            LocalRecord::path(&dir.join("workers"), worker),
            record.render(),
        )
        .expect("record");
        let workspaces = Workspaces::open(&format!("file://{}", dir.join("workspaces").display()))
            .expect("store");
        let workers = WorkerClient::new(
            Locator::StateDir(dir.join("workers")),
            String::from("worker-credential-0123456789"),
        )
        .expect("client");
        let state = Arc::new(AppState::of(corral_api::Core {
            settings,
            store: store.clone(),
            workspaces,
            workers,
            field_key: None,
            caller_credential: String::from("caller-credential-0123456789"),
            admin_credential: String::from("admin-credential-0123456789"),
        }));
        Some((
            Fixture {
                _server: server,
                state,
                store,
                _controller: controller,
                dir,
            },
            worker,
        ))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn request(wait_seconds: u64) -> RunCodeRequest {
    RunCodeRequest {
        actor: String::from("runner"),
        conversation: String::from("c"),
        member: String::from("runner"),
        language: String::from("python"),
        code: String::from("print(1)"),
        wait_seconds: Some(wait_seconds),
        ..RunCodeRequest::default()
    }
}

/// POOL-3: a request waits at most its one wait, however many workers it is taken to. The run's
/// first ticket queues behind a held lease; once granted, the worker refuses the connection (it
/// died), is discarded, and the run queues again: its second ticket must end no later than its
/// first (before: a fresh full wait per worker tried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_03_one_request_waits_once_however_many_workers_it_tries() {
    let settings = Settings::from_pairs(&[
        ("SANDBOX_WARM_POOL_MIN", "1"),
        ("SANDBOX_POOL_TARGET_IDLE", "0"),
        ("SANDBOX_POOL_MAX_ALLOCATED", "2"),
        ("SANDBOX_MAX_CONCURRENT_CREATES", "1"),
    ])
    .expect("settings");
    let test = "pool_03_one_request_waits_once_however_many_workers_it_tries";
    let Some((fixture, worker)) = Fixture::one_dead_worker(test, settings).await else {
        return;
    };
    let pool = fixture.state.settings.pool();
    // Someone else holds the only worker.
    let held = commit(&fixture.store, &code_acquire(1, "holder", 5_000), &pool)
        .await
        .expect("acquired");
    let Some(Event::Granted { token, .. }) = held.answer(corral_core::ids::TicketId(1)).cloned()
    else {
        panic!("the holder's ticket was not granted: {held:?}");
    };
    let run = tokio::spawn(corral_api::run::run_code(fixture.state.clone(), request(4)));
    let first = until(&fixture.store, "the run's first ticket", |doc| {
        doc.tickets().next().map(|t| (t.id, t.deadline))
    })
    .await;
    // The holder keeps the worker a while longer (a lease held 1.5 s, not a wait for anything),
    // then releases it; the worker is reset clean and goes to the run's ticket.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let released = commit(
        &fixture.store,
        &Command::Release {
            worker,
            lease: corral_core::ids::TicketId(1),
            token,
            disposition: Disposition::Reset,
        },
        &pool,
    )
    .await
    .expect("released");
    let Some(Effect::Reset { token, .. }) = released.effects.first().cloned() else {
        panic!("no reset ordered: {released:?}");
    };
    let reported = commit(&fixture.store, &paper_reset(worker, token), &pool)
        .await
        .expect("reset reported");
    assert!(
        matches!(reported.answer(first.0), Some(Event::Granted { .. })),
        "the clean worker goes to the run's ticket: {reported:?}"
    );
    // The run finds its worker dead, discards it and queues again.
    let second = until(&fixture.store, "the run's second ticket", |doc| {
        doc.tickets()
            .find(|t| t.id != first.0)
            .map(|t| (t.id, t.deadline))
    })
    .await;
    // Both end with the request's one wait (a few milliseconds apart: each is set from the time
    // left when its ticket was taken); a fresh wait would end 1.5 s later.
    assert!(
        second.1.0 <= first.1.0 + 500,
        "the second ticket waits until {:?}, past the request's wait ending {:?}",
        second.1,
        first.1
    );
    // Nothing else can come: the request ends with its wait, as a timeout, having run nothing.
    let (status, body) = run.await.expect("the run");
    assert_eq!(
        (status.as_u16(), body["error"]["code"].as_str()),
        (503, Some("wait_timeout")),
        "{body}"
    );
    // The dead worker's lease ended as Discard: the pool ordered its deletion, which the API
    // cannot perform and hands to the controller, counted rather than dropped.
    let counted = "corral_unperformed_total{what=\"delete_left_to_controller\"} 1";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = fixture
            .state
            .metrics
            .render(None, fixture.store.write_counts());
        if metrics.contains(counted) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{counted} missing from:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let doc = doc(&fixture.store).await;
    assert_eq!(
        doc.counts().warm,
        0,
        "the discarded worker is never warm again"
    );
}
