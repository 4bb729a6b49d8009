//! Workspace snapshots (WS-1, WS-2, WS-5) against real stores: every case runs, with the same
//! assertions, on the local filesystem (`filesystem::*`, through `Workspaces::open("file://...")`)
//! and on an S3-compatible server (`s3::*`, moto's server from PyPI, started here on a free
//! loopback port and reached through `object_store`'s real S3 client).
//!
//! Without moto (`pip install 'moto[server]'`) the S3 tests skip through `corral_testkit::skip`,
//! unless `CORRAL_REQUIRE_SERVICES` is set (CI installs moto), where a missing server is a failure.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use corral_api::workspaces::{FileLookup, Snapshot, StorageError, Workspaces, find_file};
use corral_core::workspace::storage_key;
use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};

/// The bucket every S3 test shares; each test works under its own root prefix in it.
const BUCKET: &str = "corral-workspaces";

/// One store to run the cases on, and what keeps it alive.
struct Backend {
    workspaces: Workspaces,
    /// The same store, for looking underneath `Workspaces`.
    store: Arc<dyn ObjectStore>,
    /// The root `workspaces` was given.
    root: Path,
    _dir: Option<TempDir>,
    _moto: Option<Arc<Moto>>,
}

impl Backend {
    /// A fresh, not yet existing directory, opened the way the API opens it (a `file://` URL).
    fn filesystem(case: &str) -> Self {
        let dir = TempDir::new(case);
        let root = dir.0.join("store");
        let url = format!("file://{}", root.display());
        let workspaces = Workspaces::open(&url).unwrap_or_else(|e| panic!("open {url}: {e}"));
        let store = object_store::local::LocalFileSystem::new_with_prefix(&root)
            .unwrap_or_else(|e| panic!("{}: {e}", root.display()));
        Self {
            workspaces,
            store: Arc::new(store),
            root: Path::from(""),
            _dir: Some(dir),
            _moto: None,
        }
    }

    /// The shared moto server's bucket under the root `cases/<case>`, or `None` after the test
    /// `s3::<case>` skipped.
    fn s3(case: &str) -> Option<Self> {
        let moto = Moto::shared_or_skip(&format!("s3::{case}"))?;
        corral_api::ensure_crypto_provider();
        let store = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(format!("http://127.0.0.1:{}", moto.port))
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_access_key_id("corral-test")
            .with_secret_access_key("corral-test")
            .with_region("us-east-1")
            .with_bucket_name(BUCKET)
            .build()
            .expect("an S3 store for moto");
        let store: Arc<dyn ObjectStore> = Arc::new(store);
        let root = format!("cases/{case}");
        Some(Self {
            workspaces: Workspaces::new(Arc::clone(&store), &root),
            store,
            root: Path::from(root.as_str()),
            _dir: None,
            _moto: Some(moto),
        })
    }

    fn dir(&self, key: &str) -> Path {
        self.root.clone().join("ws").join(key)
    }

    /// The generations stored under `key`, ascending, listed straight from the object store; any
    /// other object there fails the test.
    async fn generations(&self, key: &str) -> Vec<u64> {
        let listed: Vec<_> = self
            .store
            .list(Some(&self.dir(key)))
            .try_collect()
            .await
            .expect("list the workspace's objects");
        let mut generations: Vec<u64> = listed
            .iter()
            .map(|meta| {
                let name = meta.location.filename().unwrap_or_default();
                name.strip_prefix('g')
                    .and_then(|rest| rest.strip_suffix(".tar"))
                    .filter(|digits| digits.len() == 20)
                    .and_then(|digits| digits.parse().ok())
                    .unwrap_or_else(|| panic!("not a generation: {}", meta.location))
            })
            .collect();
        generations.sort_unstable();
        generations
    }

    /// Generation `generation` of `key` as stored, read straight from the object store.
    async fn stored(&self, key: &str, generation: u64) -> Option<Bytes> {
        let path = self.dir(key).join(format!("g{generation:020}.tar"));
        match self.store.get(&path).await {
            Ok(found) => Some(found.bytes().await.expect("read a generation")),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => panic!("get {path}: {e}"),
        }
    }
}

/// A directory under the system temporary directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(case: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            "corral-api-workspaces-{}-{}-{nanos}-{case}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// moto's S3 server, shared by the tests that run while it lives; killed (SIGKILL) when the last
/// of them drops it, and exits by itself if this process dies (it watches its stdin).
struct Moto {
    child: Child,
    _stdin: ChildStdin,
    port: u16,
}

/// Runs moto's server with werkzeug serving one request at a time. moto checks `If-None-Match: *`
/// and then stores the object as two steps; served by concurrent threads, two create-only puts
/// of one key could both pass the check, which real S3 never allows. One request at a time makes
/// moto's conditional put atomic, as S3's is, so the concurrency tests test `Workspaces`, not
/// moto. The requests themselves still arrive concurrently.
const MOTO_SERVER: &str = r"
import os, sys, threading
import moto.server as server

def orphaned():
    sys.stdin.buffer.read()
    os._exit(0)

threading.Thread(target=orphaned, daemon=True).start()
run_simple = server.run_simple
server.run_simple = lambda *args, **kwargs: run_simple(*args, **dict(kwargs, threaded=False))
server.main(sys.argv[1:])
";

impl Moto {
    /// The server the S3 tests share, started by the first; `None` after skipping the test `test`.
    fn shared_or_skip(test: &str) -> Option<Arc<Self>> {
        static SHARED: Mutex<Weak<Moto>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(moto) = shared.upgrade() {
            return Some(moto);
        }
        match Self::start() {
            Ok(moto) => {
                let moto = Arc::new(moto);
                *shared = Arc::downgrade(&moto);
                Some(moto)
            }
            Err(why) => {
                corral_testkit::skip(test, corral_testkit::Need::Services, &why);
                None
            }
        }
    }

    fn start() -> Result<Self, String> {
        let installed = Command::new("python3")
            .args(["-c", "import moto.server"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !installed {
            return Err(String::from(
                "no moto S3 server: python3 -m pip install 'moto[server]'",
            ));
        }
        let started = Instant::now();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let mut child = Command::new("python3")
            .args([
                "-c",
                MOTO_SERVER,
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start moto: {e}"))?;
        let stdin = child.stdin.take().expect("moto's stdin is piped");
        let mut moto = Self {
            child,
            _stdin: stdin,
            port,
        };
        let deadline = started + Duration::from_secs(60);
        loop {
            if let Some(status) = moto.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!(
                    "moto exited ({status}) before answering on port {port}"
                ));
            }
            if moto.request("GET", "/").is_some() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("moto did not answer on port {port} within 60s"));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let answered = started.elapsed();
        match moto.request("PUT", &format!("/{BUCKET}")) {
            Some(status) if status.starts_with(" 200") => {}
            other => return Err(format!("moto did not create the bucket: {other:?}")),
        }
        eprintln!(
            "moto answered on 127.0.0.1:{port} {}ms after starting; bucket created after {}ms",
            answered.as_millis(),
            started.elapsed().as_millis()
        );
        Ok(moto)
    }

    /// One plain HTTP/1.1 request with no body; the status line after `HTTP/1.x`, when any.
    fn request(&self, method: &str, target: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        write!(
            stream,
            "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).ok()?;
        let response = String::from_utf8_lossy(&response);
        let status = response.lines().next()?;
        let rest = status
            .strip_prefix("HTTP/1.1")
            .or_else(|| status.strip_prefix("HTTP/1.0"))?;
        Some(rest.to_string())
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `latest` returns when `generation` holding `archive` is the newest.
fn snapshot(generation: u64, archive: &Bytes) -> Result<Option<Snapshot>, StorageError> {
    Ok(Some(Snapshot {
        generation,
        archive: archive.clone(),
    }))
}

/// The cases, each run on both backends.
mod cases {
    use super::*;

    pub async fn an_empty_workspace_has_no_snapshot(b: &Backend) {
        let key = storage_key("actor", "conversation");
        assert_eq!(b.workspaces.latest(&key).await, Ok(None));
        assert_eq!(b.generations(&key).await, Vec::<u64>::new());
    }

    pub async fn saves_number_generations_and_latest_returns_the_exact_bytes(b: &Backend) {
        let key = storage_key("actor", "conversation");
        // Every byte value, so nothing on the way may treat the archive as text.
        let first = Bytes::from((0..=255u8).cycle().take(70_000).collect::<Vec<u8>>());
        let second = Bytes::from_static(b"the second snapshot\0\xff");
        assert_eq!(b.workspaces.save(&key, 0, first.clone()).await, Ok(1));
        assert_eq!(b.workspaces.latest(&key).await, snapshot(1, &first));
        assert_eq!(b.workspaces.save(&key, 1, second.clone()).await, Ok(2));
        assert_eq!(b.workspaces.latest(&key).await, snapshot(2, &second));
        assert_eq!(b.generations(&key).await, vec![1, 2]);
        assert_eq!(b.stored(&key, 1).await, Some(first));
    }

    pub async fn of_two_saves_from_one_base_exactly_one_wins(b: &Backend) {
        // One after the other.
        let key = storage_key("actor", "sequential");
        let winner = Bytes::from_static(b"first save");
        let loser = Bytes::from_static(b"second save");
        assert_eq!(b.workspaces.save(&key, 0, winner.clone()).await, Ok(1));
        assert_eq!(
            b.workspaces.save(&key, 0, loser).await,
            Err(StorageError::Conflict { generation: 1 })
        );
        assert_eq!(b.workspaces.latest(&key).await, snapshot(1, &winner));
        assert_eq!(b.generations(&key).await, vec![1]);

        // At once, round after round on one workspace, each round from the last round's winner.
        let key = storage_key("actor", "concurrent");
        for base in 0..8u64 {
            let one = Bytes::from(format!("round {base}, save one"));
            let two = Bytes::from(format!("round {base}, save two"));
            let (saved_one, saved_two) = tokio::join!(
                b.workspaces.save(&key, base, one.clone()),
                b.workspaces.save(&key, base, two.clone()),
            );
            let taken = Err(StorageError::Conflict {
                generation: base + 1,
            });
            let winner = match (saved_one, saved_two) {
                (Ok(generation), lost) => {
                    assert_eq!(generation, base + 1, "round {base}");
                    assert_eq!(lost, taken, "round {base}");
                    one
                }
                (lost, Ok(generation)) => {
                    assert_eq!(generation, base + 1, "round {base}");
                    assert_eq!(lost, taken, "round {base}");
                    two
                }
                neither => panic!("round {base}: no save won: {neither:?}"),
            };
            assert_eq!(
                b.workspaces.latest(&key).await,
                snapshot(base + 1, &winner),
                "round {base}"
            );
            assert_eq!(b.stored(&key, base + 1).await, Some(winner), "round {base}");
        }
    }

    pub async fn a_stale_save_is_refused_and_overwrites_nothing(b: &Backend) {
        let key = storage_key("actor", "conversation");
        let first = Bytes::from_static(b"generation one");
        let second = Bytes::from_static(b"generation two");
        assert_eq!(b.workspaces.save(&key, 0, first.clone()).await, Ok(1));
        assert_eq!(b.workspaces.save(&key, 1, second.clone()).await, Ok(2));
        // A run that started from generation 1 finishes after generation 2 was saved.
        assert_eq!(
            b.workspaces
                .save(&key, 1, Bytes::from_static(b"stale"))
                .await,
            Err(StorageError::Conflict { generation: 2 })
        );
        assert_eq!(b.workspaces.latest(&key).await, snapshot(2, &second));
        assert_eq!(b.generations(&key).await, vec![1, 2]);
        assert_eq!(b.stored(&key, 1).await, Some(first));
        assert_eq!(b.stored(&key, 2).await, Some(second));
    }

    pub async fn a_save_from_a_long_pruned_base_is_refused_not_lost(b: &Backend) {
        let key = storage_key("actor", "pruned");
        for (base, text) in [(0, "one"), (1, "two"), (2, "three"), (3, "four")] {
            let saved = b.workspaces.save(&key, base, Bytes::from(text)).await;
            assert_eq!(saved, Ok(base + 1));
        }
        // Generations 1 and 2 are pruned; a run that started from nothing finishes now.
        assert_eq!(b.generations(&key).await, vec![3, 4]);
        assert_eq!(
            b.workspaces
                .save(&key, 0, Bytes::from_static(b"ancient"))
                .await,
            Err(StorageError::Conflict { generation: 4 })
        );
        assert_eq!(
            b.generations(&key).await,
            vec![3, 4],
            "nothing of it is left"
        );
        assert_eq!(
            b.workspaces.latest(&key).await,
            snapshot(4, &Bytes::from_static(b"four"))
        );
    }

    pub async fn workspaces_of_other_actors_or_conversations_are_apart(b: &Backend) {
        let alice_one = storage_key("alice", "conversation-1");
        let bob_one = storage_key("bob", "conversation-1");
        let alice_two = storage_key("alice", "conversation-2");
        assert_ne!(alice_one, bob_one);
        assert_ne!(alice_one, alice_two);
        assert_ne!(bob_one, alice_two);

        let alice = Bytes::from_static(b"alice, conversation 1");
        assert_eq!(b.workspaces.save(&alice_one, 0, alice.clone()).await, Ok(1));
        assert_eq!(b.workspaces.latest(&bob_one).await, Ok(None));
        assert_eq!(b.workspaces.latest(&alice_two).await, Ok(None));

        // Bob's first save is generation 1 of his own workspace, no conflict with Alice's.
        let bob = Bytes::from_static(b"bob, conversation 1");
        assert_eq!(b.workspaces.save(&bob_one, 0, bob.clone()).await, Ok(1));
        let alice_again = Bytes::from_static(b"alice, conversation 1, again");
        assert_eq!(
            b.workspaces.save(&alice_one, 1, alice_again.clone()).await,
            Ok(2)
        );

        assert_eq!(
            b.workspaces.latest(&alice_one).await,
            snapshot(2, &alice_again)
        );
        assert_eq!(b.workspaces.latest(&bob_one).await, snapshot(1, &bob));
        assert_eq!(b.workspaces.latest(&alice_two).await, Ok(None));
        assert_eq!(b.generations(&alice_one).await, vec![1, 2]);
        assert_eq!(b.generations(&bob_one).await, vec![1]);
        assert_eq!(b.generations(&alice_two).await, Vec::<u64>::new());
        assert_eq!(b.stored(&alice_one, 1).await, Some(alice));
    }

    pub async fn a_save_prunes_generations_older_than_its_base(b: &Backend) {
        let key = storage_key("actor", "conversation");
        let archive = |generation: u64| Bytes::from(format!("generation {generation}"));
        for generation in 1..=4u64 {
            let base = generation - 1;
            assert_eq!(
                b.workspaces.save(&key, base, archive(generation)).await,
                Ok(generation)
            );
            assert_eq!(
                b.workspaces.latest(&key).await,
                snapshot(generation, &archive(generation))
            );
            // The save's base stays (a reader may be on it); everything older is gone.
            let kept: Vec<u64> = (base.max(1)..=generation).collect();
            assert_eq!(b.generations(&key).await, kept, "after saving {generation}");
        }
        let left = b.generations(&key).await;
        assert!(left.len() <= 2, "{left:?}");
        assert_eq!(b.stored(&key, 1).await, None);
        assert_eq!(b.stored(&key, 2).await, None);
        assert_eq!(b.stored(&key, 3).await, Some(archive(3)));
        assert_eq!(b.stored(&key, 4).await, Some(archive(4)));
    }

    pub async fn find_file_reads_regular_files_only(b: &Backend) {
        let program = b"print('hello')\n".to_vec();
        let notes = b"notes at the top\n".to_vec();
        let mut builder = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_ustar();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        builder
            .append_data(&mut dir, "src/", std::io::empty())
            .expect("append a directory");
        for (path, content) in [("src/main.py", &program), ("notes.txt", &notes)] {
            let mut file = tar::Header::new_ustar();
            file.set_entry_type(tar::EntryType::Regular);
            file.set_mode(0o644);
            file.set_size(content.len() as u64);
            builder
                .append_data(&mut file, path, content.as_slice())
                .expect("append a file");
        }
        let archive = Bytes::from(builder.into_inner().expect("finish the tar"));

        let key = storage_key("actor", "conversation");
        assert_eq!(b.workspaces.save(&key, 0, archive.clone()).await, Ok(1));
        let read = b
            .workspaces
            .latest(&key)
            .await
            .expect("read the snapshot")
            .expect("a snapshot");
        assert_eq!(read.archive, archive);

        let max = 1 << 20;
        assert_eq!(
            find_file(&read.archive, "src/main.py", max),
            FileLookup::Found(program.clone())
        );
        assert_eq!(
            find_file(&read.archive, "notes.txt", max),
            FileLookup::Found(notes)
        );
        assert_eq!(
            find_file(&read.archive, "src/missing.py", max),
            FileLookup::NotFound
        );
        assert_eq!(
            find_file(&read.archive, "main.py", max),
            FileLookup::NotFound
        );
        // "src" names the directory's entry, which is not a regular file.
        assert_eq!(find_file(&read.archive, "src", max), FileLookup::NotFound);
        // At most `max` bytes are read.
        assert_eq!(
            find_file(&read.archive, "src/main.py", 5),
            FileLookup::Found(program[..5].to_vec())
        );
        // Not a tar at all.
        assert!(
            matches!(
                find_file(&[b'x'; 1024], "src/main.py", max),
                FileLookup::Corrupt(_)
            ),
            "garbage read as a tar"
        );
    }
}

/// Each case as `filesystem::<case>` and `s3::<case>`.
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod filesystem {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let backend = super::Backend::filesystem(stringify!($case));
                    super::cases::$case(&backend).await;
                }
            )*
        }

        mod s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(backend) = super::Backend::s3(stringify!($case)) else {
                        return;
                    };
                    super::cases::$case(&backend).await;
                }
            )*
        }
    };
}

on_both_backends!(
    an_empty_workspace_has_no_snapshot,
    saves_number_generations_and_latest_returns_the_exact_bytes,
    of_two_saves_from_one_base_exactly_one_wins,
    a_stale_save_is_refused_and_overwrites_nothing,
    a_save_from_a_long_pruned_base_is_refused_not_lost,
    workspaces_of_other_actors_or_conversations_are_apart,
    a_save_prunes_generations_older_than_its_base,
    find_file_reads_regular_files_only,
);
