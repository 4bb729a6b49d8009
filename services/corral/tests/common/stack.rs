//! A running `corral up` for the service tests, driven over HTTP as an agent platform would.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use corral_api::client::Client;
use corral_core::pool::PoolDoc;
use corral_core::store::Loaded;
use corral_store::ValkeyStore;
use corral_store::valkey_server::ValkeyServer;
use serde_json::{Value, json};

/// A running `corral up`, stopped with SIGTERM when dropped.
pub struct Stack {
    pub child: Child,
    pub api: String,
    pub caller: Client,
    pub admin: Client,
    pub state: PathBuf,
    pub valkey: String,
    /// The other API replicas' URLs (`corral up --api-replicas`).
    pub replicas: Vec<String>,
    _server: ValkeyServer,
}

impl Stack {
    /// Starts `corral up` with `env` and `args` for the test `test`, or skips the test.
    pub fn start(test: &str, env: &[(&str, &str)], args: &[&str]) -> Option<Stack> {
        Self::start_with_stderr(test, env, args, Stdio::inherit())
    }

    /// [`Stack::start`] with `corral up`'s stderr (its logs) going to `stderr`.
    pub fn start_with_stderr(
        test: &str,
        env: &[(&str, &str)],
        args: &[&str],
        stderr: Stdio,
    ) -> Option<Stack> {
        let server = super::root_and_valkey_or_skip(test)?;
        // Under Cargo's target directory rather than the system's temporary one, which may be a
        // tmpfs: the failed-save check needs a filesystem that keeps the immutable flag.
        static STACKS: AtomicU32 = AtomicU32::new(0);
        let state = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "corral-e2e-{}-{}",
            std::process::id(),
            STACKS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&state);
        let mut command = Command::new(env!("CARGO_BIN_EXE_corral"));
        command
            .args([
                "up",
                "--listen",
                "127.0.0.1:0",
                "--valkey",
                &server.url(),
                "--state-dir",
            ])
            .arg(&state)
            .args(args)
            .env("SANDBOX_WARM_POOL_MIN", "2")
            .env("SANDBOX_POOL_TARGET_IDLE", "1")
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("corral up starts");
        let stdout = child.stdout.take().expect("stdout");
        // The ready line, read on a thread so that a stack that never comes up fails in time.
        let (lines, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut replicas = Vec::new();
        let api = loop {
            let line = ready
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("{test}: corral up printed no ready line"));
            if let Some(url) = line.strip_prefix("corral API replica: ") {
                replicas.push(url.trim().to_owned());
            }
            if let Some(rest) = line.strip_prefix("corral is ready: API ") {
                break rest.split_whitespace().next().expect("url").to_owned();
            }
        };
        let read = |name: &str| {
            std::fs::read_to_string(state.join(name))
                .expect(name)
                .trim()
                .to_owned()
        };
        Some(Stack {
            caller: Client::new(&api, &read("api-token")).expect("client"),
            admin: Client::new(&api, &read("admin-token")).expect("client"),
            child,
            api,
            state,
            valkey: server.url(),
            replicas,
            _server: server,
        })
    }

    /// The stack the client suites run against: two API replicas (a stream dropped on one
    /// resumes on the other) and two workers at most (the suite fills the pool to see a full
    /// pool's refusal); with the second replica's URL.
    pub fn for_client_suite(test: &str) -> Option<(Stack, String)> {
        let stack = Stack::start(
            test,
            &[
                ("SANDBOX_POOL_MAX_ALLOCATED", "2"),
                ("SANDBOX_MAX_CONCURRENT_CREATES", "2"),
            ],
            &["--api-replicas", "2"],
        )?;
        let replica = stack
            .replicas
            .first()
            .expect("corral up printed its second replica")
            .clone();
        Some((stack, replica))
    }

    pub async fn run(&self, body: Value) -> (u16, Value) {
        self.caller.run_code(&body).await.expect("the API answers")
    }

    /// Sets the deployment's egress policy as its administrator and returns the policy as
    /// described back.
    pub async fn put_egress_policy(&self, policy: &Value) -> Value {
        let (status, described) = self
            .admin
            .put("/v1/admin/egress_policy", policy)
            .await
            .expect("admin");
        assert_eq!(status, 200, "{described}");
        described
    }

    pub async fn doc(&self) -> PoolDoc {
        let store = ValkeyStore::connect(&self.valkey, "default")
            .await
            .expect("valkey");
        match store.load().await {
            Ok(Loaded::Found { doc, .. }) => doc,
            other => panic!("no pool document: {other:?}"),
        }
    }

    /// Waits until no worker is leased or resetting and none is leaving (every lease ended, every
    /// worker reset or gone).
    pub async fn settled(&self) -> PoolDoc {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let doc = self.doc().await;
            let counts = doc.counts();
            if counts.leased == 0
                && counts.resetting == 0
                && counts.retiring == 0
                && counts.quarantined == 0
            {
                return doc;
            }
            assert!(
                Instant::now() < deadline,
                "the pool did not settle: {counts:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn read_output(
        &self,
        actor: &str,
        conversation: &str,
        reference: &str,
    ) -> (u16, Vec<u8>) {
        let query = format!(
            "/v1/read_output?actor={}&conversation={}&reference={}",
            encode(actor),
            encode(conversation),
            encode(reference)
        );
        self.caller.get(&query).await.expect("the API answers")
    }

    pub async fn read(&self, actor: &str, conversation: &str, path: &str) -> (u16, Vec<u8>) {
        let query = format!(
            "/v1/read_workspace?actor={}&conversation={}&path={}",
            encode(actor),
            encode(conversation),
            encode(path)
        );
        self.caller.get(&query).await.expect("the API answers")
    }
}

/// A second API replica (`corral api`) over a stack's Valkey, workers and storage, stopped with
/// SIGTERM when dropped.
pub struct Replica {
    pub child: Child,
    pub caller: Client,
}

impl Stack {
    /// Starts another API replica beside `corral up`'s, sharing its Valkey, workers, workspace
    /// storage, credentials and field key; returns once it answers `/healthz`.
    pub async fn second_replica(&self) -> Replica {
        self.replica_with(&[]).await
    }

    /// [`Stack::second_replica`] with `env` set over what it shares (`(name, None)` removes one).
    pub async fn replica_with(&self, env: &[(&str, Option<&str>)]) -> Replica {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let file = |name: &str| self.state.join(name);
        let mut command = Command::new(env!("CARGO_BIN_EXE_corral"));
        command
            .arg("api")
            .env("CORRAL_VALKEY_URL", &self.valkey)
            .env("CORRAL_POOL", "default")
            .env("CORRAL_API_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "CORRAL_WORKSPACE_URL",
                format!("file://{}", file("workspaces").display()),
            )
            .env("CORRAL_WORKER_STATE_DIR", file("workers"))
            .env("CORRAL_API_TOKEN_FILE", file("api-token"))
            .env("CORRAL_ADMIN_TOKEN_FILE", file("admin-token"))
            .env("CORRAL_WORKER_TOKEN_FILE", file("worker-token"))
            .env("SANDBOX_FIELD_KEY_FILE", file("field-key"))
            // The first replica's TURN server (corral up's coturn), the one authority.
            .env("CORRAL_TURN_URL", turn_url(&self.state))
            .env("CORRAL_TURN_SECRET_FILE", file("turn-secret"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (name, value) in env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let child = command.spawn().expect("corral api starts");
        let token = std::fs::read_to_string(file("api-token")).expect("api-token");
        let caller =
            Client::new(&format!("http://127.0.0.1:{port}"), token.trim()).expect("client");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(caller.get("/healthz").await, Ok((200, _))) {
            assert!(
                Instant::now() < deadline,
                "the second replica never answered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Replica { child, caller }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = nix_kill(self.child.id(), "TERM");
        let _ = self.child.wait();
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = nix_kill(self.child.id(), "TERM");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

pub fn nix_kill(pid: u32, signal: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
}

pub use corral_api::client::encode;

pub fn python(actor: &str, conversation: &str, code: &str) -> Value {
    json!({ "actor": actor, "conversation": conversation, "member": actor, "language": "python", "code": code })
}

pub fn stdout(body: &Value) -> &str {
    body["model"]["stdout"]["text"].as_str().unwrap_or_default()
}

/// The TURN authority `corral up` started for the stack in `state`, read from its configuration.
pub fn turn_url(state: &Path) -> String {
    let config = std::fs::read_to_string(state.join("turnserver.conf"))
        .expect("corral up wrote turnserver.conf (coturn is installed)");
    let port = config
        .lines()
        .find_map(|line| line.strip_prefix("listening-port="))
        .expect("a listening port");
    format!("turn:127.0.0.1:{port}")
}

/// Code that fetches each URL through the jail's proxy variables and prints one line per URL:
/// `status <code> <X-Corral-Egress-Reason or body>`, or `error <exception>` when nothing answered.
pub fn fetcher(urls: &[String]) -> String {
    format!(
        r#"import urllib.request, urllib.error
for url in {urls:?}:
    try:
        r = urllib.request.urlopen(url, timeout=10)
        print("status", r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print("status", e.code, e.headers.get("X-Corral-Egress-Reason"))
    except Exception as e:
        print("error", type(e).__name__)
"#
    )
}
