//! The controller with real workers: `corral worker serve` processes started by the local backend,
//! reset through their control API, with the pool in a real Valkey. Needs root (the worker's jail
//! does) and a Valkey server; without them it skips through `corral_testkit::skip`, and CI
//! requires both (`CORRAL_REQUIRE_ROOT`, `CORRAL_REQUIRE_SERVICES`).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use corral_contract::{Locator, WorkerClient};
use corral_controller::local::LocalBackend;
use corral_controller::{Backend, Pass, Reconciler};
use corral_core::ids::{ActorId, ConversationId, LeaseNamespace, LeaseScope, MemberId, TicketId};
use corral_core::pool::{Command, Disposition, Event, PoolConfig, PoolDoc, StateKind};
use corral_core::store::Loaded;
use corral_store::ValkeyStore;
use corral_store::harness::commit;

async fn doc(store: &ValkeyStore) -> PoolDoc {
    match store.load().await {
        Ok(Loaded::Found { doc, .. }) => doc,
        other => panic!("no pool document: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_08_real_workers_are_created_leased_reset_through_their_api_and_published_warm() {
    let Some(server) = common::root_and_valkey_or_skip(
        "pool_08_real_workers_are_created_leased_reset_through_their_api_and_published_warm",
    ) else {
        return;
    };
    let state = std::env::temp_dir().join(format!("corral-workers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let credential = "test-credential-0123456789abcdef";
    let corral = Path::new(env!("CARGO_BIN_EXE_corral"));
    let backend = LocalBackend::new(
        &state,
        corral,
        &["worker", "serve", "--listen", "127.0.0.1:{port}"],
        &[Path::new("/usr/bin/python3")],
    )
    .expect("backend")
    .with_env("CORRAL_WORKER_TOKEN", credential);
    let control = WorkerClient::new(Locator::StateDir(state.clone()), credential.to_string())
        .expect("client");
    let config = PoolConfig {
        warm_min: 2,
        max_allocated: 3,
        max_concurrent_creates: 2,
        inventory_stale_ms: 60_000,
        ..PoolConfig::default()
    };
    let store = ValkeyStore::connect(&server.url(), "workers")
        .await
        .expect("connects");
    let reconciler = Reconciler::new(store, backend, control, config.clone());

    let started = Instant::now();
    assert!(
        reconciler.pass().await.published,
        "the first pass publishes the image"
    );
    while doc(reconciler.store()).await.counts().warm < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the warm minimum was never reached"
        );
        let _ = reconciler.pass().await;
    }
    let workers = reconciler.backend().list().await.expect("lists");
    assert_eq!(workers.len(), 2, "two real worker processes");

    let scope = LeaseScope {
        namespace: LeaseNamespace::Code,
        actor: ActorId("a".into()),
        conversation: ConversationId("c".into()),
    };
    let acquire = Command::Acquire {
        ticket: TicketId(1),
        member: MemberId("m".into()),
        scope,
        wait_ms: 5_000,
        stack: false,
    };
    let applied = commit(reconciler.store(), &acquire, &config)
        .await
        .expect("store up");
    let Some(&Event::Granted { worker, token, .. }) = applied.answer(TicketId(1)) else {
        panic!("a warm pool grants at once: {applied:?}")
    };
    let release = Command::Release {
        worker,
        lease: TicketId(1),
        token,
        disposition: Disposition::Reset,
    };
    let applied = commit(reconciler.store(), &release, &config)
        .await
        .expect("store up");
    let mut pass = Pass::default();
    reconciler.perform(applied.effects, &mut pass).await;
    assert_eq!(pass.resets, 1);
    let after = doc(reconciler.store()).await;
    assert_eq!(
        after.workers()[&worker].state.kind(),
        StateKind::Warm,
        "the real worker proved itself clean and is warm again"
    );
    assert!(
        after.workers()[&worker].token != token,
        "under a new operation token"
    );

    for id in workers {
        let outcome = reconciler.backend().delete(id).await;
        assert_eq!(
            outcome,
            corral_core::pool::Outcome::Done,
            "deleted and confirmed absent"
        );
    }
    assert!(
        reconciler.backend().list().await.expect("lists").is_empty(),
        "no worker process left"
    );
    let _ = std::fs::remove_dir_all(&state);
}
