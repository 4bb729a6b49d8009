//! The whole stack through real processes: `corral up` (Valkey, API, controller with the `local`
//! backend, `corral worker serve` workers, the egress proxy) driven over HTTP as an agent
//! platform would (issue 6). Needs root (the jail) and a Valkey server; without them each test
//! skips through `corral_testkit::skip`, and CI requires both (`CORRAL_REQUIRE_ROOT`,
//! `CORRAL_REQUIRE_SERVICES`).

mod common;

use common::stack::{Stack, fetcher, python, stdout};

#[path = "../../egress-proxy/tests/support/netns.rs"]
#[allow(dead_code)]
mod netns;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use corral_api::client::Client;
use corral_core::pool::PoolDoc;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iso_01_ws_01_ws_04_out_02_python_node_workspaces_isolation_and_reads() {
    let Some(stack) = Stack::start(
        "iso_01_ws_01_ws_04_out_02_python_node_workspaces_isolation_and_reads",
        &[],
        &[],
    ) else {
        return;
    };
    // The API describes itself and is ready.
    let (status, _) = stack.caller.get("/readyz").await.expect("readyz");
    assert_eq!(status, 200);
    let (status, openapi) = stack.caller.get("/openapi.json").await.expect("openapi");
    assert_eq!(status, 200);
    let openapi: Value = serde_json::from_slice(&openapi).expect("json");
    for path in [
        "/v1/run_code",
        "/v1/read_workspace",
        "/v1/read_output",
        "/v1/admin/egress_policy",
        "/v1/egress/verifying_key",
    ] {
        assert!(openapi["paths"][path].is_object(), "{path} is documented");
    }

    // Python and Node.
    let (status, body) = stack
        .run(python(
            "alice",
            "room",
            "print(6 * 7)\nopen('notes.txt', 'w').write('alice was here')",
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "succeeded");
    assert_eq!(stdout(&body), "42\n");
    let first_worker = body["model"]["worker"].as_str().expect("worker").to_owned();
    let (status, body) = stack
        .run(json!({ "actor": "alice", "conversation": "room", "member": "alice", "language": "node",
                      "code": "const fs = require('fs'); console.log(fs.readFileSync('notes.txt', 'utf8'), 1 + 1)" }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stdout(&body), "alice was here 2\n", "{body}");

    // The member's projection carries no diagnostics, streams or sandbox details (OUT-2).
    let member = body["member"].as_object().expect("member");
    let keys: Vec<&str> = member.keys().map(String::as_str).collect();
    assert_eq!(keys, ["exit_code", "outcome", "references"]);

    // Another actor in the same conversation never sees alice's files (WS-1).
    let (_, body) = stack
        .run(python(
            "bob",
            "room",
            "import os\nprint(sorted(os.listdir('.')))",
        ))
        .await;
    assert_eq!(stdout(&body), "[]\n", "{body}");
    let (status, _) = stack.read("bob", "room", "notes.txt").await;
    assert_eq!(status, 404, "bob has no notes.txt");
    let (status, bytes) = stack.read("alice", "room", "notes.txt").await;
    assert_eq!(
        (status, bytes.as_slice()),
        (200, b"alice was here".as_slice())
    );

    // read_workspace refuses anything but a relative path inside (WS-4), and links never resolve.
    let (_, body) = stack
        .run(python(
            "alice",
            "room",
            "import os\nos.symlink('/etc/passwd', 'passwd')\nos.symlink('..', 'up')",
        ))
        .await;
    assert_eq!(body["outcome"], "succeeded", "{body}");
    for (path, code) in [
        ("/etc/passwd", "archive_path_absolute"),
        ("../x", "archive_path_parent"),
        ("a/../../x", "archive_path_parent"),
        ("", "archive_path_empty"),
    ] {
        let (status, reply) = stack.read("alice", "room", path).await;
        let reply: Value = serde_json::from_slice(&reply).expect("json");
        assert_eq!(status, 400, "{path}: {reply}");
        assert_eq!(reply["error"]["code"], code, "{path}");
    }
    for path in ["passwd", "up/etc/passwd", "up"] {
        let (status, reply) = stack.read("alice", "room", path).await;
        assert_eq!(
            status,
            404,
            "{path} must not resolve: {}",
            String::from_utf8_lossy(&reply)
        );
    }

    // The workspace survives on another worker: the one that served the first run is killed.
    let record = std::fs::read_to_string(
        stack
            .state
            .join("workers")
            .join(format!("{first_worker}.worker")),
    )
    .expect("the first worker's record in the state directory");
    let pid = record.split_whitespace().next().expect("pid");
    assert!(
        Command::new("kill")
            .args(["-KILL", pid])
            .status()
            .expect("kill")
            .success(),
        "worker {pid} could not be killed"
    );
    // Dead once it is gone, or a zombie whose every other thread has exited: the leader turns
    // zombie while a thread busy in a reset is still exiting, and the threads share the open
    // files, so until the last one goes its port still accepts connections (that a run sent then
    // is rightly `worker_lost`: nobody can tell whether it arrived).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !process_fully_exited(pid) {
        assert!(Instant::now() < deadline, "worker {pid} did not die");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (status, body) = stack
        .run(python("alice", "room", "print(open('notes.txt').read())"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stdout(&body), "alice was here\n");
    assert_ne!(
        body["model"]["worker"].as_str(),
        Some(first_worker.as_str())
    );

    // Typed downloads (OUT-4): a valid document is a member reference; an invalid one, declared
    // or not, is removed from the downloads and makes the run an error naming the file and the
    // check it failed, with no reference to it anywhere.
    const GOOD_PDF: &[u8] = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n";
    let mut documents = python(
        "alice",
        "docs",
        "open('good.pdf', 'wb').write(b'%PDF-1.4\\n1 0 obj<<>>endobj\\ntrailer<<>>\\n%%EOF\\n')\nopen('bad.pdf', 'wb').write(b'not a pdf')",
    );
    for declared in [json!(["good.pdf"]), json!(["bad.pdf"]), json!([])] {
        documents["declared_outputs"] = declared.clone();
        let (status, body) = stack.run(documents.clone()).await;
        assert_eq!(
            (
                status,
                body["outcome"].as_str(),
                body["error"]["code"].as_str()
            ),
            (200, Some("error"), Some("output_invalid")),
            "declared {declared}: {body}"
        );
        assert_eq!(
            body["error"]["checks"],
            json!([{ "path": "bad.pdf", "check": "pdf_header_missing" }]),
            "{body}"
        );
        let references: Vec<&str> = body["member"]["references"]
            .as_array()
            .expect("references")
            .iter()
            .filter_map(|r| r["path"].as_str())
            .collect();
        assert_eq!(references, ["good.pdf"], "{body}");
        assert!(!body["member"].to_string().contains("bad.pdf"), "{body}");
    }
    let only_good = python(
        "alice",
        "docs",
        "import os\nos.remove('bad.pdf')\nopen('good.pdf', 'ab').write(b'')",
    );
    let mut declared_good = only_good.clone();
    declared_good["declared_outputs"] = json!(["good.pdf"]);
    let (status, body) = stack.run(declared_good).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("succeeded")),
        "{body}"
    );
    let reference = body["member"]["references"][0]["reference"]
        .as_str()
        .expect("a reference to good.pdf")
        .to_owned();

    // OUT-1: the reference names the retained output, which later saves (pruning the generation
    // it was written in) never take away; another actor cannot read it.
    for n in 0..3 {
        let (status, body) = stack
            .run(python(
                "alice",
                "docs",
                &format!("open('n{n}.txt', 'w').write('{n}')"),
            ))
            .await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (200, Some("succeeded")),
            "{body}"
        );
    }
    let (status, bytes) = stack.read_output("alice", "docs", &reference).await;
    assert_eq!((status, bytes.as_slice()), (200, GOOD_PDF), "{reference}");
    let (status, _) = stack.read_output("bob", "docs", &reference).await;
    assert_eq!(status, 404, "another actor's output");
    let (status, reply) = stack
        .read_output("alice", "docs", "workspace:1/good.pdf")
        .await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&reply));

    // An unsupported language: not run, beside a nonzero exit (PKG-6).
    let (status, body) = stack
        .run(json!({ "actor": "alice", "conversation": "room", "member": "alice", "language": "ruby", "code": "puts 1" }))
        .await;
    assert_eq!(
        (
            status,
            body["outcome"].as_str(),
            body["model"]["not_run"].as_str()
        ),
        (200, Some("not_run"), Some("unsupported_language"))
    );
    assert_ne!(body["model"]["exit_code"], 0);
    // ... and the error says what to write instead, naming what was asked and what runs.
    assert_eq!(
        (
            body["error"]["code"].as_str(),
            body["error"]["language"].as_str(),
            &body["error"]["supported"]
        ),
        (
            Some("unsupported_language"),
            Some("ruby"),
            &json!(["python", "node"])
        ),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("\"ruby\"")
            && message.contains("\"python\"")
            && message.contains("\"node\""),
        "{body}"
    );
    // Every spelling gets an answer an agent can act on, never a 500: an empty, unknown,
    // hostile or 10,000-character name is echoed bounded and escaped; an alias runs.
    for asked in [
        String::new(),
        "typescript".into(),
        "x".repeat(10_000),
        "py\u{0}\"\n".into(),
    ] {
        let (status, body) = stack
            .run(json!({ "actor": "alice", "conversation": "room", "member": "alice", "language": asked, "code": "1" }))
            .await;
        assert_eq!(
            (
                status,
                body["outcome"].as_str(),
                body["error"]["code"].as_str()
            ),
            (200, Some("not_run"), Some("unsupported_language")),
            "{asked:.40}: {body}"
        );
        let echoed = body["error"]["language"].as_str().unwrap_or_default();
        assert!(
            echoed.chars().count() <= 65 && !echoed.chars().any(char::is_control),
            "{echoed:?}"
        );
    }
    let (status, body) = stack
        .run(json!({ "actor": "alice", "conversation": "room", "member": "alice", "language": "JavaScript",
                      "code": "console.log(6 * 7)" }))
        .await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("succeeded")),
        "{body}"
    );
    assert_eq!(body["model"]["stdout"]["text"], "42\n", "{body}");
    // A persistent kernel runs where a field key seals its checkpoints (the keyless stack of
    // the egress test answers `persistent_kernel_unavailable`).
    let (_, body) = stack
        .run(json!({ "actor": "alice", "conversation": "room", "member": "alice", "language": "python",
                      "code": "print(1)", "kernel": "persistent" }))
        .await;
    assert_eq!(body["model"]["kernel"]["mode"], "persistent", "{body}");

    // Bad input gets a specific error.
    let (status, body) = stack.run(python("", "room", "print(1)")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_identity"))
    );
    let unauthenticated = Client::new(&stack.api, "wrong-credential-0123456789").expect("client");
    let (status, body) = unauthenticated
        .run_code(&python("a", "b", "print(1)"))
        .await
        .expect("answer");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );

    // Nothing leaked: every lease ended and every used worker was reset or replaced.
    stack.settled().await;

    // The counters saw it all.
    let (status, metrics) = stack.caller.get("/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&metrics);
    for line in [
        "corral_runs_total{outcome=\"succeeded\"}",
        "corral_runs_total{outcome=\"not_run\"}",
        "corral_egress_dispatch_total{effective_mode=\"public_internet\"}",
        "corral_pool_workers{state=\"warm\"}",
        "corral_pool_queue_depth 0",
        "corral_acquire_seconds_count",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
    let written: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("corral_coordination_writes_total{result=\"written\"} "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no coordination writes counted:\n{metrics}"));
    assert!(
        written > 0,
        "every run wrote to the pool document:\n{metrics}"
    );
    let (status, ready) = stack.caller.get("/readyz").await.expect("readyz");
    let ready: Value = serde_json::from_slice(&ready).expect("json");
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["coordination"], "ok");
    assert_eq!(ready["storage"], "ok");
    assert_eq!(ready["egress_proxy"], "reachable");
    assert_eq!(ready["field_key"], "present");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_1_through_the_api_each_bound_returns_its_own_error() {
    let Some(stack) = Stack::start(
        "bound_1_through_the_api_each_bound_returns_its_own_error",
        &[
            ("SANDBOX_TMP_MAX_BYTES", "4194304"),
            ("SANDBOX_WORKSPACE_MAX_BYTES", "4194304"),
        ],
        &[],
    ) else {
        return;
    };
    let cases: [(&str, Value, &str); 7] = [
        (
            "open('big.txt', 'wb').write(b'x' * 64 * 1024)",
            json!({ "artifact_bytes": 1024 }),
            "SANDBOX_MAX_ARTIFACT_BYTES",
        ),
        (
            "while True: pass",
            json!({ "wall_seconds": 1 }),
            "SANDBOX_MAX_WALL_SECONDS",
        ),
        (
            "import sys\nsys.stdout.write('x' * 100000)",
            json!({ "output_bytes": 1000 }),
            "SANDBOX_MAX_OUTPUT_BYTES",
        ),
        (
            "b = bytearray(256 * 1024 * 1024)\nprint(len(b))",
            json!({ "memory_bytes": 64 * 1024 * 1024 }),
            "SANDBOX_MAX_MEMORY_BYTES",
        ),
        (
            "import os, time\nfor _ in range(40):\n    if os.fork() == 0:\n        time.sleep(5)\n        os._exit(0)",
            json!({ "processes": 8 }),
            "SANDBOX_MAX_PROCESSES",
        ),
        (
            "open('/tmp/fill', 'wb').write(b'x' * 8 * 1024 * 1024)",
            json!({}),
            "SANDBOX_TMP_MAX_BYTES",
        ),
        (
            "open('big', 'wb').write(b'x' * 8 * 1024 * 1024)",
            json!({}),
            "SANDBOX_WORKSPACE_MAX_BYTES",
        ),
    ];
    for (code, bounds, setting) in cases {
        let mut request = python("bounded", "b", code);
        request["bounds"] = bounds;
        let (status, body) = stack.run(request).await;
        assert_eq!(status, 200, "{setting}: {body}");
        assert_eq!(body["outcome"], "bound_exceeded", "{setting}: {body}");
        assert_eq!(body["model"]["bound"], setting, "{setting}: {body}");
        assert_eq!(body["member"]["outcome"], "bound_exceeded");
    }
    stack.settled().await;
}

/// Polls the pool until `ready` holds of it.
async fn until(stack: &Stack, what: &str, ready: impl Fn(&PoolDoc) -> bool) -> PoolDoc {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let doc = stack.doc().await;
        if ready(&doc) {
            return doc;
        }
        assert!(
            Instant::now() < deadline,
            "never saw: {what}: {:?}",
            doc.counts()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn sleeper(actor: &str, member: &str, seconds: f64) -> Value {
    json!({ "actor": actor, "conversation": "q", "member": member, "language": "python",
            "code": format!("import time\ntime.sleep({seconds})\nprint('done')") })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pool_03_queues_refusals_conflicts_and_a_killed_worker() {
    let Some(stack) = Stack::start(
        "pool_03_queues_refusals_conflicts_and_a_killed_worker",
        &[
            ("SANDBOX_WARM_POOL_MIN", "3"),
            ("SANDBOX_POOL_MAX_ALLOCATED", "3"),
            ("SANDBOX_MAX_CONCURRENT_PER_MEMBER", "2"),
            ("SANDBOX_ACQUIRE_QUEUE_MAX", "2"),
        ],
        &[],
    ) else {
        return;
    };
    let stack = std::sync::Arc::new(stack);
    let spawn = |body: Value| {
        let stack = stack.clone();
        tokio::spawn(async move { stack.run(body).await })
    };

    // A third concurrent run for one member waits in the queue, then is served (POOL-3).
    let runs: Vec<_> = (0..3)
        .map(|i| spawn(sleeper(&format!("m-{i}"), "m", 3.0)))
        .collect();
    until(&stack, "two leases for m and one queued ticket", |doc| {
        doc.counts().leased == 2 && doc.tickets().count() == 1
    })
    .await;
    for run in runs {
        let (status, body) = run.await.expect("run");
        assert_eq!(
            (status, body["outcome"].as_str()),
            (200, Some("succeeded")),
            "{body}"
        );
    }
    stack.settled().await;

    // With every worker busy: a short wait times out, and beyond the queue bound a run is refused
    // at once, each with when to retry.
    let busy: Vec<_> = (0..3)
        .map(|i| spawn(sleeper(&format!("b-{i}"), &format!("busy-{i}"), 8.0)))
        .collect();
    until(&stack, "three leases", |doc| doc.counts().leased == 3).await;
    let mut short = sleeper("w", "waiter", 0.1);
    short["wait_seconds"] = json!(1);
    let (status, body) = stack.run(short).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("wait_timeout")),
        "{body}"
    );
    assert!(body["error"]["retry_after_seconds"].as_u64().is_some());
    let queued: Vec<_> = (0..2)
        .map(|i| spawn(sleeper(&format!("q-{i}"), &format!("queued-{i}"), 0.1)))
        .collect();
    until(&stack, "two queued tickets", |doc| {
        doc.tickets().count() == 2
    })
    .await;
    let (status, body) = stack.run(sleeper("full", "full", 0.1)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("queue_full")),
        "{body}"
    );
    for run in busy.into_iter().chain(queued) {
        let (status, body) = run.await.expect("run");
        assert_eq!(status, 200, "{body}");
    }
    stack.settled().await;

    // Two concurrent runs of one workspace: one save commits, the other is refused, not lost.
    let racer = |member: &str| {
        json!({ "actor": "shared", "conversation": "ws", "member": member, "language": "python",
                "code": format!("import time\ntime.sleep(1)\nopen('who', 'w').write('{member}')") })
    };
    let (a, b) = tokio::join!(stack.run(racer("first")), stack.run(racer("second")));
    let statuses = [a.0, b.0];
    assert!(
        statuses.contains(&200) && statuses.contains(&409),
        "{a:?} {b:?}"
    );
    let (winner, loser) = if a.0 == 200 {
        (&a.1, &b.1)
    } else {
        (&b.1, &a.1)
    };
    assert_eq!(loser["error"]["code"], "workspace_conflict", "{loser}");
    assert_eq!(loser["model"]["workspace"]["saved"], false);
    let (_, who) = stack.read("shared", "ws", "who").await;
    let winner_member = if a.0 == 200 { "first" } else { "second" };
    assert_eq!(String::from_utf8_lossy(&who), winner_member, "{winner}");

    // A worker killed mid-run: a clear error, no leaked lease, and the member may run again.
    let killed = spawn(sleeper("victim", "victim", 30.0));
    let doc = until(&stack, "the victim's lease", |doc| {
        doc.workers().values().any(|w| matches!(&w.state, corral_core::pool::WorkerState::Leased(l) if l.member.0 == "victim"))
    })
    .await;
    let (worker, _) = doc
        .workers()
        .iter()
        .find(|(_, w)| matches!(&w.state, corral_core::pool::WorkerState::Leased(l) if l.member.0 == "victim"))
        .expect("leased");
    let record =
        std::fs::read_to_string(stack.state.join("workers").join(format!("{worker}.worker")))
            .expect("record");
    let (pid, port) = record.trim().split_once(' ').expect("pid port");
    // Killed only once the execute is in the worker (its /health says busy): before that, the
    // API would find it unreachable and take the run to another worker, which is right too.
    let worker_api = Client::new(
        &format!("http://127.0.0.1:{port}"),
        std::fs::read_to_string(stack.state.join("worker-token"))
            .expect("worker token")
            .trim(),
    )
    .expect("client");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, health) = worker_api.get("/health").await.expect("health");
        let health: Value = serde_json::from_slice(&health).expect("json");
        if health["busy"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the execute never reached the worker: {health}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        Command::new("kill")
            .args(["-KILL", pid])
            .status()
            .expect("kill")
            .success()
    );
    let (status, body) = killed.await.expect("run");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (502, Some("worker_lost")),
        "{body}"
    );
    let doc = stack.settled().await;
    assert!(
        !doc.workers().contains_key(worker),
        "the killed worker is gone from the pool"
    );
    assert!(
        doc.workers()
            .values()
            .all(|w| !matches!(w.state, corral_core::pool::WorkerState::Leased(_))),
        "no lease leaked"
    );
    let (status, _) = stack.run(sleeper("victim", "victim", 0.0)).await;
    assert_eq!(status, 200);
}

/// A failed save leaves the earlier snapshot authoritative (WS-5): the workspace's directory is
/// made immutable (even root cannot add to it) for one run. Needs `chattr` (e2fsprogs) and a
/// filesystem that keeps the immutable flag: the stack's state is under Cargo's target directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_05_a_failed_save_leaves_the_earlier_snapshot_authoritative() {
    const TEST: &str = "ws_05_a_failed_save_leaves_the_earlier_snapshot_authoritative";
    let Some(stack) = Stack::start(TEST, &[], &[]) else {
        return;
    };
    let (status, body) = stack
        .run(python("saver", "s", "open('v', 'w').write('one')"))
        .await;
    assert_eq!(status, 200, "{body}");
    let key = corral_core::workspace::storage_key("saver", "s");
    let dir = stack.state.join("workspaces").join("ws").join(key);
    assert!(dir.is_dir(), "the first save is in {}", dir.display());
    let Some(immutable) = Immutable::set_or_skip(TEST, &dir) else {
        return;
    };
    let (status, body) = stack
        .run(python("saver", "s", "open('v', 'w').write('two')"))
        .await;
    immutable.clear();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("workspace_storage_unavailable")),
        "{body}"
    );
    assert_eq!(body["outcome"], "error");
    let (status, v) = stack.read("saver", "s", "v").await;
    assert_eq!((status, v.as_slice()), (200, b"one".as_slice()));
}

/// A directory with the immutable flag set (`chattr +i`) until [`Immutable::clear`], or until
/// dropped on a failing test's way out.
struct Immutable {
    dir: PathBuf,
    set: bool,
}

impl Immutable {
    /// Sets the flag on `dir`, or skips the test `test` (a need of the host's tools) where
    /// `chattr` is missing or the filesystem does not keep the flag.
    fn set_or_skip(test: &str, dir: &Path) -> Option<Self> {
        let why = match Command::new("chattr").arg("+i").arg(dir).output() {
            Ok(out) if out.status.success() => {
                return Some(Self {
                    dir: dir.to_path_buf(),
                    set: true,
                });
            }
            Ok(out) => format!(
                "chattr +i {} failed (a filesystem without the immutable flag?): {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(error) => format!("no chattr (Debian's e2fsprogs): {error}"),
        };
        corral_testkit::skip(test, corral_testkit::Need::Tools, &why);
        None
    }

    /// Clears the flag, failing the test where it cannot.
    fn clear(mut self) {
        let cleared = Command::new("chattr").arg("-i").arg(&self.dir).status();
        assert!(
            cleared.as_ref().is_ok_and(|s| s.success()),
            "chattr -i {}: {cleared:?}",
            self.dir.display()
        );
        self.set = false;
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        // The stack's directory must stay removable; a failure here is already a failing test.
        if self.set {
            let _ = Command::new("chattr").arg("-i").arg(&self.dir).status();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egr_08_egr_09_egress_through_the_whole_stack_follows_the_policy() {
    const TEST: &str = "egr_08_egr_09_egress_through_the_whole_stack_follows_the_policy";
    let Some(mut ns) = netns::netns_or_skip(TEST) else {
        return;
    };
    let upstream = ns.start_echo_server(80).expect("echo server");
    let Some(stack) = Stack::start(TEST, &[], &[]) else {
        return;
    };
    let urls = vec![
        format!("http://{}/hello", upstream.ip()),
        String::from("http://127.0.0.1/healthz"),
        format!("http://{}/other", ns.host_ip),
    ];
    let code = fetcher(&urls);

    // The packaged default, public_internet: a private upstream is refused at the proxy.
    let (_, body) = stack.run(python("net", "e", &code)).await;
    assert_eq!(
        body["model"]["egress"]["effective_mode"], "public_internet",
        "{body}"
    );
    let lines: Vec<&str> = stdout(&body).lines().collect();
    assert_eq!(lines.len(), 3, "{body}");
    assert!(lines.iter().all(|l| l.starts_with("status 403 ")), "{body}");

    // The administrator opens the upstream's address: the next run reaches it (EGR-9), while
    // loopback and a private address outside the configured ranges stay refused.
    let policy = json!({
        "SANDBOX_EGRESS_MODE": "private_network",
        "SANDBOX_EGRESS_PRIVATE_CIDRS": format!("{}/32", upstream.ip()),
        "SANDBOX_EGRESS_ALLOWED_PORTS": "80,443",
    });
    let described = stack.put_egress_policy(&policy).await;
    assert_eq!(
        described["effective_mode"], "private_network",
        "{described}"
    );
    assert_eq!(described["configured_mode"], "private_network");
    let revision = described["revision"].as_u64().expect("revision");
    let (status, _) = stack
        .caller
        .put("/v1/admin/egress_policy", &policy)
        .await
        .expect("answer");
    assert_eq!(
        status, 401,
        "the caller credential is not an admin credential"
    );

    let (_, body) = stack.run(python("net", "e", &code)).await;
    assert_eq!(
        body["model"]["egress"]["effective_mode"], "private_network",
        "{body}"
    );
    assert_eq!(body["model"]["egress"]["policy_revision"], revision);
    let lines: Vec<&str> = stdout(&body).lines().collect();
    assert_eq!(lines.len(), 3, "{body}");
    assert!(
        lines[0].starts_with("status 200 method=GET path=/hello"),
        "{body}"
    );
    assert!(
        lines[0].contains("auth=None"),
        "the grant never reaches the upstream: {body}"
    );
    assert_eq!(lines[1], "status 403 address_always_denied", "{body}");
    assert_eq!(
        lines[2], "status 403 address_private_not_configured",
        "{body}"
    );

    // host_allowlist with 200 hosts: a grant longer than the worker's old 4,096-byte limit runs
    // (the contract's limit is corral-core's). The values are padded as an administrator might
    // paste them: read as the environment's are (trimmed), so the mode is not mistaken for an
    // unknown one.
    let mut hosts: Vec<String> = (0..199)
        .map(|i| format!("api-{i:03}.example-provider.com"))
        .collect();
    hosts.push(upstream.ip().to_string());
    let policy = json!({
        "SANDBOX_EGRESS_MODE": "  host_allowlist\n",
        "SANDBOX_EGRESS_ALLOWED_HOSTS": format!(" {} ", hosts.join(",")),
        "SANDBOX_EGRESS_PRIVATE_CIDRS": format!("{}/32 ", upstream.ip()),
        "SANDBOX_EGRESS_ALLOWED_PORTS": " 80,443",
    });
    let (status, described) = stack
        .admin
        .put("/v1/admin/egress_policy", &policy)
        .await
        .expect("admin");
    assert_eq!(
        (status, described["effective_mode"].as_str()),
        (200, Some("host_allowlist")),
        "{described}"
    );
    let (status, body) = stack.run(python("net", "e", &code)).await;
    assert_eq!(
        (
            status,
            body["outcome"].as_str(),
            body["model"]["egress"]["effective_mode"].as_str()
        ),
        (200, Some("succeeded"), Some("host_allowlist")),
        "{body}"
    );
    let lines: Vec<&str> = stdout(&body).lines().collect();
    assert!(
        lines[0].starts_with("status 200 method=GET path=/hello"),
        "{body}"
    );
    assert_eq!(lines[1], "status 403 host_not_allowlisted", "{body}");
    assert_eq!(lines[2], "status 403 host_not_allowlisted", "{body}");

    // Isolated: the run gets no grant and the relay refuses everything.
    let (status, _) = stack
        .admin
        .put(
            "/v1/admin/egress_policy",
            &json!({ "SANDBOX_EGRESS_MODE": "isolated" }),
        )
        .await
        .expect("admin");
    assert_eq!(status, 200);
    let (_, body) = stack.run(python("net", "e", &code)).await;
    assert_eq!(
        body["model"]["egress"]["effective_mode"], "isolated",
        "{body}"
    );
    assert_eq!(
        stdout(&body).lines().collect::<Vec<_>>(),
        ["status 407 grant_missing"; 3],
        "{body}"
    );
    drop(stack);

    // No field key: runs proceed, with the network denied (EGR-8).
    let Some(keyless) = Stack::start(TEST, &[], &["--no-field-key"]) else {
        return;
    };
    let (status, body) = keyless.run(python("net", "e", &code)).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("succeeded")),
        "{body}"
    );
    assert_eq!(body["model"]["egress"]["effective_mode"], "isolated");
    let notes = body["model"]["egress"]["notes"].to_string();
    assert!(notes.contains("field_key_missing"), "{body}");
    assert_eq!(
        stdout(&body).lines().collect::<Vec<_>>(),
        ["status 407 grant_missing"; 3],
        "{body}"
    );
    let (status, _) = keyless
        .caller
        .get("/v1/egress/verifying_key")
        .await
        .expect("answer");
    assert_eq!(status, 404);
    // Nor a persistent kernel: nothing could seal its checkpoints (KER-1).
    let mut persistent = python("net", "k", "print(1)");
    persistent["kernel"] = json!("persistent");
    let (status, body) = keyless.run(persistent).await;
    assert_eq!(
        (
            status,
            body["outcome"].as_str(),
            body["model"]["not_run"].as_str()
        ),
        (200, Some("not_run"), Some("persistent_kernel_unavailable")),
        "{body}"
    );
    assert_ne!(body["model"]["exit_code"], 0);
}

/// True once process `pid` is gone, or is a zombie with no thread left but its leader.
fn process_fully_exited(pid: &str) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let zombie = status
        .lines()
        .any(|l| l.starts_with("State:") && l.contains('Z'));
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
    zombie && threads <= 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmp_01_compression_shortens_only_the_models_output_and_keeps_the_raw_canonical() {
    let test = "cmp_01_compression_shortens_only_the_models_output_and_keeps_the_raw_canonical";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let code = "for _ in range(200):\n    print('polling...')\nfor i in range(300):\n    print(i, i * i, i / 7)\nprint('done')\n";
    let (_, plain) = stack.run(python("cmp", "c", code)).await;
    let mut asked = python("cmp", "c", code);
    asked["compress_output"] = json!(true);
    let (status, compressed) = stack.run(asked).await;
    assert_eq!(status, 200, "{compressed}");
    assert_eq!(compressed["outcome"], "succeeded");
    let raw = stdout(&plain);
    let short = stdout(&compressed);
    assert!(short.len() * 4 < raw.len(), "{short}");
    assert!(
        short.contains("[corral: the line above repeated 199 more times]"),
        "{short}"
    );
    assert!(short.contains("numeric lines elided]"), "{short}");
    assert!(short.ends_with("done\n"));
    // The raw output is canonical, beside the model's projection, and the same as without.
    assert_eq!(compressed["raw"]["stdout"]["text"], json!(raw));
    assert_eq!(
        compressed["model"]["compression"]["stdout"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    // Nothing else of the answer changes: the member's projection, the outcome, the exit.
    assert_eq!(compressed["member"], plain["member"]);
    assert!(plain.get("raw").is_none(), "no raw without compression");
}

/// Every file under `dir`, recursively (empty when it does not exist).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_02_workspaces_persist_across_runs_in_the_object_store_only_with_persistence_on() {
    const TEST: &str =
        "ws_02_workspaces_persist_across_runs_in_the_object_store_only_with_persistence_on";
    let write = "open('note.txt', 'w').write('kept')\n";
    let read =
        "import os\nprint(open('note.txt').read() if os.path.exists('note.txt') else 'missing')\n";
    for (persist, expected) in [("true", "kept\n"), ("false", "missing\n")] {
        let Some(stack) = Stack::start(TEST, &[("SANDBOX_WORKSPACE_PERSIST", persist)], &[]) else {
            return;
        };
        // `corral up`'s object store is a directory of objects under its state directory; the
        // retained outputs (OUT-1) live under `out/` whether or not workspaces persist.
        let store = stack.state.join("workspaces");
        let (_, first) = stack.run(python("wes", "persist", write)).await;
        assert_eq!(first["outcome"], "succeeded", "{first}");
        let stored: Vec<PathBuf> = files_under(&store)
            .into_iter()
            .filter(|path| !path.starts_with(store.join("out")))
            .collect();
        // Each worker is reset with proof after a run, so the file can come back only from the
        // object store.
        let (_, second) = stack.run(python("wes", "persist", read)).await;
        assert_eq!((persist, stdout(&second)), (persist, expected), "{second}");
        assert_eq!(
            (
                persist,
                stored.is_empty(),
                first["model"]["workspace"]["saved"].as_bool()
            ),
            (persist, persist == "false", Some(persist == "true")),
            "objects under {}: {stored:?}; {first}",
            store.display()
        );
        // Another conversation of the same actor never sees it.
        let (_, other) = stack.run(python("wes", "elsewhere", read)).await;
        assert_eq!(stdout(&other), "missing\n", "{other}");
    }
}

/// Decision 0058 through the whole stack: the pool hands a run that uses the data stack
/// (`CORRAL_WORKER_PYTHON_PREIMPORT`, here `json`, which every Python has) to the worker whose last
/// run used it, whose next warm jail pre-imports it, rather than to the worker warm the longest.
/// No idle re-preparation (`CORRAL_WORKER_PREIMPORT_IDLE_SECONDS=0`): only a stack run's reset
/// prepares a jail with the stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_03_a_run_that_uses_the_stack_goes_to_the_worker_whose_last_run_used_it() {
    const TEST: &str =
        "pool_03_a_run_that_uses_the_stack_goes_to_the_worker_whose_last_run_used_it";
    let Some(stack) = Stack::start(
        TEST,
        &[
            ("SANDBOX_WARM_POOL_MIN", "3"),
            ("SANDBOX_POOL_MAX_ALLOCATED", "3"),
            ("CORRAL_WORKER_PREPARE_LANGUAGES", "python"),
            ("CORRAL_WORKER_PYTHON_PREIMPORT", "json"),
            ("CORRAL_WORKER_PREIMPORT_IDLE_SECONDS", "0"),
        ],
        &[],
    ) else {
        return;
    };
    let uses_stack = "import sys\nhad = 'json' in sys.modules\nimport json\nprint(had)\n";
    let run = |actor: &'static str, code: &'static str| {
        let stack = &stack;
        async move {
            all_warm(stack, 3).await;
            let (status, body) = stack.run(python(actor, actor, code)).await;
            assert_eq!(status, 200, "{body}");
            let worker = body["model"]["worker"].as_str().expect("worker").to_owned();
            (worker, stdout(&body).to_owned())
        }
    };
    // No worker has run anything: every jail is plain.
    let (first, printed) = run("a", uses_stack).await;
    assert_eq!(printed, "False\n");
    // A plain run goes elsewhere (to the worker warm the longest, which the first is not).
    let (plain, printed) = run("b", "print(1)").await;
    assert_eq!(printed, "1\n");
    assert_ne!(plain, first);
    // The pool says which warm worker a stack run goes to first: the first one only.
    all_warm(&stack, 3).await;
    let (status, metrics) = stack.caller.get("/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("\ncorral_pool_warm_stack_workers 1\n"),
        "{metrics}"
    );
    // The third worker is warm the longest now; the stack's run goes to the first all the same,
    // and finds the stack imported before its own import.
    let (again, printed) = run("c", uses_stack).await;
    assert_eq!(again, first, "the stack's run went to another worker");
    assert_eq!(printed, "True\n", "its jail had the stack imported");
}

/// Waits until the pool holds `n` warm workers and nothing else is under way: a check of the pool's
/// state repeated until a deadline only a stuck pool reaches.
async fn all_warm(stack: &Stack, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = stack.settled().await.counts();
        if counts.warm == n && counts.creating == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the pool never held {n} warm: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
