//! One store contract, two stores: corral-core's `MemoryStore` (the model the simulator wraps with
//! its faults) and the Valkey store on a real server. If the model and Valkey ever disagree about
//! versions, outages, a restart that loses the data or one that restores an older snapshot, this
//! test says which.

use corral_core::pool::PoolDoc;
use corral_core::store::{
    CasOutcome, Expected, Loaded, MemoryStore, PoolStore, Snapshot, Unavailable, Version,
};
use corral_core::time::UnixMillis;
use corral_store::ValkeyStore;
use corral_store::valkey_server::ValkeyServer;

/// What the contract needs of a store, and of the harness around it.
trait Subject {
    async fn now(&mut self) -> Result<UnixMillis, Unavailable>;
    async fn load(&mut self) -> Result<Loaded, Unavailable>;
    async fn cas(&mut self, expected: Option<Version>, doc: &PoolDoc) -> CasOutcome;
    async fn write_if(&mut self, expected: Option<Expected>, doc: &PoolDoc) -> CasOutcome;
    /// Makes the store unreachable.
    async fn go_down(&mut self);
    /// Brings it back, empty.
    async fn come_back_empty(&mut self);
    /// Saves a snapshot.
    async fn save(&mut self);
    /// Restarts it from its last snapshot.
    async fn come_back_from_snapshot(&mut self);
}

struct Model(MemoryStore, Snapshot);

impl Subject for Model {
    async fn now(&mut self) -> Result<UnixMillis, Unavailable> {
        self.0.now()
    }
    async fn load(&mut self) -> Result<Loaded, Unavailable> {
        self.0.load()
    }
    async fn cas(&mut self, expected: Option<Version>, doc: &PoolDoc) -> CasOutcome {
        self.0.compare_and_set(expected, doc)
    }
    async fn write_if(&mut self, expected: Option<Expected>, doc: &PoolDoc) -> CasOutcome {
        self.0.write_if(expected, doc)
    }
    async fn go_down(&mut self) {
        self.0.down = true;
    }
    async fn come_back_empty(&mut self) {
        let _ = self.0.lose_data();
        self.0.down = false;
    }
    async fn save(&mut self) {
        self.1 = self.0.snapshot();
    }
    async fn come_back_from_snapshot(&mut self) {
        self.0.restart_from(self.1.clone());
    }
}

struct Real {
    server: ValkeyServer,
    store: ValkeyStore,
}

impl Subject for Real {
    async fn now(&mut self) -> Result<UnixMillis, Unavailable> {
        self.store.now().await
    }
    async fn load(&mut self) -> Result<Loaded, Unavailable> {
        self.store.load().await
    }
    async fn cas(&mut self, expected: Option<Version>, doc: &PoolDoc) -> CasOutcome {
        self.store.compare_and_set(expected, doc).await
    }
    async fn write_if(&mut self, expected: Option<Expected>, doc: &PoolDoc) -> CasOutcome {
        self.store.write_if(expected, doc, None).await
    }
    async fn go_down(&mut self) {
        self.server.kill();
    }
    async fn come_back_empty(&mut self) {
        // No snapshot has been saved yet: the server comes back with nothing.
        self.come_back_from_snapshot().await;
    }
    async fn save(&mut self) {
        assert!(self.server.save(), "the server saves its snapshot");
    }
    async fn come_back_from_snapshot(&mut self) {
        self.server.restart().expect("restarts");
        self.store = ValkeyStore::connect(&self.server.url(), "contract")
            .await
            .expect("reconnects");
    }
}

async fn contract(subject: &mut impl Subject) {
    let doc = PoolDoc::new(42, UnixMillis(1_000));
    assert_eq!(
        subject.load().await,
        Ok(Loaded::Absent),
        "a new store holds no document"
    );
    assert!(subject.now().await.is_ok(), "the clock answers");
    assert_eq!(
        subject.cas(None, &doc).await,
        CasOutcome::Ok {
            version: Version(1)
        },
        "create-only succeeds when absent"
    );
    assert_eq!(
        subject.cas(None, &doc).await,
        CasOutcome::Conflict,
        "create-only fails when present"
    );
    assert_eq!(
        subject.cas(Some(Version(9)), &doc).await,
        CasOutcome::Conflict,
        "a wrong version fails"
    );
    assert_eq!(
        subject.cas(Some(Version(1)), &doc).await,
        CasOutcome::Ok {
            version: Version(2)
        },
        "the right version succeeds, once"
    );
    assert_eq!(
        subject.cas(Some(Version(1)), &doc).await,
        CasOutcome::Conflict,
        "and never twice"
    );
    assert_eq!(
        subject.load().await,
        Ok(Loaded::Found {
            version: Version(2),
            doc: doc.clone()
        })
    );

    subject.go_down().await;
    assert_eq!(
        subject.load().await,
        Err(Unavailable),
        "an unreachable store is unavailable, never empty"
    );
    assert_eq!(subject.now().await, Err(Unavailable));
    let write = subject.cas(Some(Version(2)), &doc).await;
    assert!(
        matches!(write, CasOutcome::Unavailable | CasOutcome::Unknown),
        "a write to an unreachable store is never reported done: {write:?}"
    );

    subject.come_back_empty().await;
    assert_eq!(
        subject.load().await,
        Ok(Loaded::Absent),
        "a restart without persistence loses the document"
    );
    assert_eq!(
        subject.cas(Some(Version(2)), &doc).await,
        CasOutcome::Conflict,
        "an old version does not resurrect it"
    );
    let later = PoolDoc::new(43, UnixMillis(2_000));
    assert_eq!(
        subject.cas(None, &later).await,
        CasOutcome::Ok {
            version: Version(1)
        },
        "versions start again"
    );
    assert_eq!(
        subject.cas(Some(Version(1)), &later).await,
        CasOutcome::Ok {
            version: Version(2)
        }
    );
    assert_eq!(
        subject.cas(Some(Version(2)), &doc).await,
        CasOutcome::Conflict,
        "a replica that last saw version 2 of the lost epoch never overwrites version 2 of the new one"
    );
    assert_eq!(
        subject.load().await,
        Ok(Loaded::Found {
            version: Version(2),
            doc: later.clone()
        })
    );

    subject.save().await;
    assert_eq!(
        subject.cas(Some(Version(2)), &later).await,
        CasOutcome::Ok {
            version: Version(3)
        },
        "a write after the snapshot"
    );
    subject.come_back_from_snapshot().await;
    assert_eq!(
        subject.load().await,
        Ok(Loaded::Outlived {
            version: Version(2),
            doc: later.clone()
        }),
        "restored from the snapshot: the write since is gone, and what is left outlived a restart"
    );
    assert_eq!(
        subject.cas(Some(Version(2)), &later).await,
        CasOutcome::Conflict,
        "an outlived document is never written over as current, though its version and epoch match"
    );
    let replacement = PoolDoc::new(44, UnixMillis(3_000));
    let outlived = Expected {
        version: Version(2),
        epoch: 43,
        outlived: true,
    };
    assert_eq!(
        subject
            .write_if(
                Some(Expected {
                    epoch: 42,
                    ..outlived
                }),
                &replacement
            )
            .await,
        CasOutcome::Conflict,
        "a replacement must name the outlived document's epoch"
    );
    assert_eq!(
        subject.write_if(Some(outlived), &replacement).await,
        CasOutcome::Ok {
            version: Version(3)
        },
        "a write that knows the document outlived a restart replaces it"
    );
    assert_eq!(
        subject.load().await,
        Ok(Loaded::Found {
            version: Version(3),
            doc: replacement
        }),
        "and its replacement is current"
    );
}

#[tokio::test]
async fn pool_05_the_model_keeps_the_store_contract() {
    contract(&mut Model(MemoryStore::default(), Snapshot::default())).await;
}

#[tokio::test]
async fn pool_05_valkey_keeps_the_store_contract() {
    let test = "pool_05_valkey_keeps_the_store_contract";
    let dir = std::env::temp_dir().join(format!("corral-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a snapshot directory");
    let server = match ValkeyServer::start_with_snapshots(&dir) {
        Ok(server) => server,
        Err(why) => {
            corral_testkit::skip(test, corral_testkit::Need::Services, &why.0);
            return;
        }
    };
    let store = ValkeyStore::connect(&server.url(), "contract")
        .await
        .expect("connects");
    contract(&mut Real { server, store }).await;
    let _ = std::fs::remove_dir_all(&dir);
}
