//! Browser sessions through the whole stack (BROW-1, BROW-3, BROW-4, BROW-6, BROW-7, BROW-10,
//! BROW-12, BROW-13): `corral up`, sessions opened and driven through the API as an agent
//! platform would, a page served from another network namespace and reached through the egress
//! proxy. Needs root, Valkey, network namespaces and Debian's chromium, xvfb and openbox; without
//! them each test skips through `corral_testkit::skip`, which CI forbids.

mod common;

#[path = "../../egress-proxy/tests/support/netns.rs"]
#[allow(dead_code)]
mod netns;

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::stack::{Stack, python, stdout};
use serde_json::{Value, json};

const FORM: &str = r#"<html><head><title>Form</title></head><body>
<input id="name"><button id="go" onclick="document.getElementById('out').textContent = 'Hi ' + document.getElementById('name').value">Go</button>
<p id="out">nothing yet</p></body></html>"#;

fn runtime_or_skip(test: &str) -> bool {
    corral_testkit::programs_or_skip(test, &corral_worker::RUNTIME_PROGRAMS)
        && corral_testkit::programs_or_skip(test, &[("coturn", "/usr/bin/turnserver")])
}

/// A namespace serving `FORM` at `http://<ip>/form.html` and `COLOURS` at `/colours.html`.
fn site(test: &str) -> Option<(netns::Netns, String)> {
    let mut ns = netns::netns_or_skip(test)?;
    let dir = std::env::temp_dir().join(format!("corral-site-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("form.html"), FORM).unwrap();
    std::fs::write(dir.join("colours.html"), COLOURS).unwrap();
    let ip = ns.ns_ip.to_string();
    ns.serve_directory(&dir).unwrap();
    Some((ns, ip))
}

async fn open(stack: &Stack, member: &str, conversation: &str, url: Option<&str>) -> (u16, Value) {
    let mut body = json!({ "actor": member, "conversation": conversation, "member": member });
    if let Some(url) = url {
        body["url"] = json!(url);
    }
    stack
        .caller
        .post("/v1/browser_sessions", &body)
        .await
        .expect("the API answers")
}

async fn act(stack: &Stack, id: &str, who: (&str, &str), action: Value) -> (u16, Value) {
    stack
        .caller
        .post(
            &format!("/v1/browser_sessions/{id}/actions"),
            &json!({ "actor": who.0, "conversation": who.1, "action": action }),
        )
        .await
        .expect("the API answers")
}

async fn close(stack: &Stack, id: &str, who: (&str, &str)) -> (u16, Value) {
    stack
        .caller
        .post(
            &format!("/v1/browser_sessions/{id}/close"),
            &json!({ "actor": who.0, "conversation": who.1 }),
        )
        .await
        .expect("the API answers")
}

async fn allow(stack: &Stack, ip: &str) {
    let policy = json!({
        "SANDBOX_EGRESS_MODE": "private_network",
        "SANDBOX_EGRESS_PRIVATE_CIDRS": format!("{ip}/32"),
        "SANDBOX_EGRESS_ALLOWED_PORTS": "80,443",
    });
    let (status, described) = stack
        .admin
        .put("/v1/admin/egress_policy", &policy)
        .await
        .unwrap();
    assert_eq!(status, 200, "{described}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brow_01_brow_03_brow_07_brow_10_brow_12_brow_13_an_agent_drives_a_page_through_the_proxy()
{
    let test =
        "brow_01_brow_03_brow_07_brow_10_brow_12_brow_13_an_agent_drives_a_page_through_the_proxy";
    if !runtime_or_skip(test) {
        return;
    }
    let Some((_ns, ip)) = site(test) else {
        return;
    };
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    allow(&stack, &ip).await;
    let ann = ("ann", "research");
    let url = format!("http://{ip}/form.html");
    // An open whose first navigation the proxy refuses says so, and leaves no session open.
    let (status, refused) = open(&stack, "ann", "research", Some("http://127.0.0.1:8091/")).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (422, Some("navigation_failed")),
        "{refused}"
    );
    let settled = stack.settled().await;
    assert_eq!(settled.counts().leased, 0, "{:?}", settled.counts());
    let (status, opened) = open(&stack, "ann", "research", Some(&url)).await;
    assert_eq!(status, 200, "{opened}");
    assert_eq!(opened["navigated"]["result"]["title"], "Form", "{opened}");
    let id = opened["session"].as_str().unwrap().to_owned();
    // Structured actions on the page, through the proxy.
    let (status, typed) = act(
        &stack,
        &id,
        ann,
        json!({ "action": "type", "selector": "#name", "text": "Ann" }),
    )
    .await;
    assert_eq!(status, 200, "{typed}");
    let (status, clicked) = act(
        &stack,
        &id,
        ann,
        json!({ "action": "click", "selector": "#go" }),
    )
    .await;
    assert_eq!(status, 200, "{clicked}");
    let (_, text) = act(&stack, &id, ann, json!({ "action": "text" })).await;
    assert!(
        text["result"]["text"].as_str().unwrap().contains("Hi Ann"),
        "{text}"
    );
    let (_, shot) = act(&stack, &id, ann, json!({ "action": "screenshot" })).await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["result"]["png"].as_str().unwrap())
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    std::fs::write(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("brow_form.png"),
        &png,
    )
    .unwrap();
    // BROW-7: the worker's own ports are not reachable from a page: loopback goes to the proxy,
    // which refuses it.
    for port in [8091, 8080] {
        let (status, refused) = act(
            &stack,
            &id,
            ann,
            json!({ "action": "navigate", "url": format!("http://127.0.0.1:{port}/") }),
        )
        .await;
        assert_eq!(
            (status, refused["error"]["code"].as_str()),
            (422, Some("navigation_failed")),
            "{refused}"
        );
    }
    // …and a page's own fetch of them goes to the proxy too, which refuses it.
    for port in [8091, 8080] {
        let (status, fetched) = act(
            &stack,
            &id,
            ann,
            json!({ "action": "evaluate", "expression": format!(
                "fetch('http://127.0.0.1:{port}/v1/health').then(r => 'status ' + r.status, e => 'failed')"
            ) }),
        )
        .await;
        assert_eq!(status, 200, "{fetched}");
        // Cross-origin, the refusal is an opaque failure; from the refused page's own origin,
        // the proxy's 403 is readable. Either way nothing answered but the proxy.
        assert!(
            ["\"failed\"", "\"status 403\""]
                .contains(&fetched["result"]["value"].as_str().unwrap_or_default()),
            "{fetched}"
        );
    }
    // Bad input: a selector that matches nothing, a hung script, each its own code.
    let (_, missing) = act(
        &stack,
        &id,
        ann,
        json!({ "action": "click", "selector": "#nope" }),
    )
    .await;
    assert_eq!(missing["error"]["code"], "selector_not_found", "{missing}");
    let (_, hung) = act(
        &stack,
        &id,
        ann,
        json!({ "action": "evaluate", "expression": "while (true) {}", "timeout_ms": 1000 }),
    )
    .await;
    assert_eq!(hung["error"]["code"], "action_timed_out", "{hung}");
    // Another member's or another conversation's call finds no session.
    let (status, _) = act(
        &stack,
        &id,
        ("bob", "research"),
        json!({ "action": "text" }),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = act(&stack, &id, ("ann", "other"), json!({ "action": "text" })).await;
    assert_eq!(status, 404);
    // BROW-12: a private interval refuses the agent's reads and actions.
    let (status, _) = stack
        .caller
        .post(
            &format!("/v1/browser_sessions/{id}/private"),
            &json!({ "actor": "ann", "conversation": "research", "private": true }),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let (status, refused) = act(&stack, &id, ann, json!({ "action": "text" })).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (403, Some("session_private"))
    );
    stack
        .caller
        .post(
            &format!("/v1/browser_sessions/{id}/private"),
            &json!({ "actor": "ann", "conversation": "research", "private": false }),
        )
        .await
        .unwrap();
    let (status, _) = act(&stack, &id, ann, json!({ "action": "text" })).await;
    assert_eq!(status, 200);
    // BROW-6: the session does not evict the member's code lease: a run goes on beside it.
    let (status, ran) = stack
        .run(python("ann", "research", "print('beside')"))
        .await;
    assert_eq!((status, stdout(&ran)), (200, "beside\n"), "{ran}");
    // BROW-3 over a minute of browsing: navigating, typing, clicking, scrolling and reading.
    let browsing = Instant::now();
    let mut rounds = 0;
    while browsing.elapsed() < Duration::from_secs(60) {
        for action in [
            json!({ "action": "navigate", "url": format!("{url}?round={rounds}") }),
            json!({ "action": "type", "selector": "#name", "text": "Ann" }),
            json!({ "action": "click", "selector": "#go" }),
            json!({ "action": "scroll", "dy": 400 }),
            json!({ "action": "text" }),
        ] {
            let (status, done) = act(&stack, &id, ann, action).await;
            assert_eq!(status, 200, "{done}");
        }
        rounds += 1;
    }
    // Every request of this session that reached the proxy is one of the page's own or one of
    // the refused loopback ones above: no vendor service, no background fetch, no other host.
    let log = std::fs::read_to_string(stack.state.join("egress-proxy.log")).unwrap_or_default();
    let targets: Vec<String> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["event"] == "egress_decision" && event["actor"] == "ann")
        .map(|event| event["target"].as_str().unwrap_or_default().to_owned())
        .collect();
    let page = targets
        .iter()
        .filter(|t| t.starts_with(&format!("http://{ip}/form.html?round=")))
        .count();
    assert!(
        page >= rounds,
        "{rounds} rounds of navigation but {page} requests to the page:\n{log}"
    );
    let refused_loopback = log
        .lines()
        .filter(|line| line.contains("\"actor\":\"ann\"") && line.contains("\"decision\":\"deny\""))
        .filter(|line| line.contains("127.0.0.1:8091") || line.contains("127.0.0.1:8080"))
        .count();
    assert!(
        refused_loopback >= 4,
        "two navigations and two fetches of the worker's ports, {refused_loopback} refusals:\n{log}"
    );
    for target in &targets {
        let allowed = target.starts_with(&format!("http://{ip}/"))
            || ["127.0.0.1:8091", "127.0.0.1:8080"]
                .iter()
                .any(|refused| target.contains(refused));
        assert!(allowed, "{target} reached the proxy:\n{log}");
    }
    // BROW-13: close stops everything and resets with evidence.
    let (status, closed) = close(&stack, &id, ann).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["confirmed"], true, "{closed}");
    assert_eq!(closed["reset_evidence"]["verdict"], "clean", "{closed}");
    let (status, _) = act(&stack, &id, ann, json!({ "action": "text" })).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brow_06_brow_13_sessions_share_the_ceiling_are_reaped_when_idle_and_an_unconfirmed_close_discards()
 {
    let test = "brow_06_brow_13_sessions_share_the_ceiling_are_reaped_when_idle_and_an_unconfirmed_close_discards";
    if !runtime_or_skip(test) {
        return;
    }
    let Some(stack) = Stack::start(
        test,
        &[
            ("SANDBOX_WARM_POOL_MIN", "1"),
            ("SANDBOX_POOL_TARGET_IDLE", "0"),
            ("SANDBOX_POOL_MAX_ALLOCATED", "1"),
            ("SANDBOX_MAX_CONCURRENT_CREATES", "1"),
            ("SANDBOX_MAX_CONCURRENT_PER_MEMBER", "1"),
            ("CORRAL_BROWSER_IDLE_SECONDS", "3"),
        ],
        &[],
    ) else {
        return;
    };
    // A full pool queues both: the session holds the only worker, so a run waits and times out.
    let (status, opened) = open(&stack, "cy", "queue", None).await;
    assert_eq!(status, 200, "{opened}");
    let id = opened["session"].as_str().unwrap().to_owned();
    let mut run = python("dee", "queue", "print(1)");
    run["wait_seconds"] = json!(1);
    let (status, waited) = stack.run(run.clone()).await;
    assert_eq!(
        (status, waited["error"]["code"].as_str()),
        (503, Some("wait_timeout")),
        "{waited}"
    );
    // Idle: reaped after its limit, the worker reset and back in the pool.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _) = stack
            .caller
            .post(
                &format!("/v1/browser_sessions/{id}/private"),
                &json!({ "actor": "cy", "conversation": "queue", "private": false }),
            )
            .await
            .unwrap();
        if status == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle session was never reaped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let settled = stack.settled().await;
    assert_eq!(settled.counts().leased, 0, "{:?}", settled.counts());
    run["wait_seconds"] = json!(60);
    let (status, ran) = stack.run(run).await;
    assert_eq!((status, stdout(&ran)), (200, "1\n"), "{ran}");
    // A close the worker does not confirm discards the worker instead of reusing it.
    let (status, opened) = open(&stack, "cy", "stuck", None).await;
    assert_eq!(status, 200, "{opened}");
    let id = opened["session"].as_str().unwrap().to_owned();
    let worker = opened["worker"].as_str().unwrap().to_owned();
    // Tests run side by side, so only this stack's descendants count.
    let bridges: Vec<u32> = descendants(stack.child.id())
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"/usr/bin/python3\0/run/corral/bridge.py"))
        })
        .collect();
    assert_eq!(bridges.len(), 1, "{bridges:?}");
    common::stack::nix_kill(bridges[0], "STOP").unwrap();
    let (status, closed) = close(&stack, &id, ("cy", "stuck")).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["confirmed"], false, "{closed}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let doc = stack.doc().await;
        if !doc.workers().keys().any(|w| w.to_string() == worker) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the unconfirmed worker was not discarded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brow_14_a_second_api_replica_serves_the_session_and_its_close_releases_the_lease() {
    let test = "brow_14_a_second_api_replica_serves_the_session_and_its_close_releases_the_lease";
    if !runtime_or_skip(test) {
        return;
    }
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let other = stack.second_replica().await;
    let ann = json!({ "actor": "ann", "conversation": "replicas" });
    // Opened on corral up's replica, which holds the lease.
    let (status, opened) = open(&stack, "ann", "replicas", None).await;
    assert_eq!(status, 200, "{opened}");
    let id = opened["session"].as_str().unwrap().to_owned();
    let on = |replica: &corral_api::client::Client, path: &str, extra: Value| {
        let mut body = ann.clone();
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let path = format!("/v1/browser_sessions/{id}/{path}");
        let replica = replica.clone();
        async move { replica.post(&path, &body).await.unwrap() }
    };
    // Served by the other replica, which never saw the open.
    let (status, evaluated) = on(
        &other.caller,
        "actions",
        json!({ "action": { "action": "evaluate", "expression": "6 * 7" } }),
    )
    .await;
    assert_eq!(status, 200, "{evaluated}");
    assert_eq!(evaluated["result"]["value"], "42", "{evaluated}");
    // Authorized there too: another conversation finds nothing.
    let (status, _) = other
        .caller
        .post(
            &format!("/v1/browser_sessions/{id}/actions"),
            &json!({ "actor": "ann", "conversation": "elsewhere", "action": { "action": "text" } }),
        )
        .await
        .unwrap();
    assert_eq!(status, 404);
    // Privacy marked on one replica holds on the other.
    let (status, _) = on(&other.caller, "private", json!({ "private": true })).await;
    assert_eq!(status, 200);
    let (status, refused) = on(
        &stack.caller,
        "actions",
        json!({ "action": { "action": "text" } }),
    )
    .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (403, Some("session_private")),
        "{refused}"
    );
    let (status, _) = on(&stack.caller, "private", json!({ "private": false })).await;
    assert_eq!(status, 200);
    // Closed on the other replica: confirmed clean, and the holder releases the lease.
    let (status, closed) = on(&other.caller, "close", json!({})).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["confirmed"], true, "{closed}");
    assert_eq!(closed["reset_evidence"]["verdict"], "clean", "{closed}");
    let settled = stack.settled().await;
    assert_eq!(settled.counts().leased, 0, "{:?}", settled.counts());
    // Gone on both.
    for replica in [&stack.caller, &other.caller] {
        let (status, _) = on(
            replica,
            "actions",
            json!({ "action": { "action": "text" } }),
        )
        .await;
        assert_eq!(status, 404);
    }
}

/// Every process below `root`, read from `/proc` (the host's view of the jails' pids).
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name may hold spaces and parentheses; the fields after its last ')' do not.
            let rest = &stat[stat.rfind(')')? + 2..];
            let ppid = rest.split(' ').nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        next += 1;
    }
    found.split_off(1)
}

/// A process's arguments, read from `/proc` (none once it has ended).
fn args(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| {
            bytes
                .split(|b| *b == 0)
                .filter(|arg| !arg.is_empty())
                .map(|arg| String::from_utf8_lossy(arg).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()
}

/// Whether `pid` is still a live (not zombie) process running `program`.
fn alive_as(pid: u32, program: &str) -> bool {
    let running = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X"))
    });
    running && args(pid).first().map(String::as_str) == Some(program)
}

/// PulseAudio, as the bridge starts it (`corral_worker::RUNTIME_PROGRAMS`).
const PULSEAUDIO: &str = corral_worker::RUNTIME_PROGRAMS[3].1;

/// A browser session's jail seen from the host through `/proc` (the tests run as root): the
/// worker process that supervises it, the jail's first process, and its run directory in the
/// worker's mount namespace.
#[derive(Debug)]
struct SessionJail {
    supervisor: u32,
    init: u32,
    run_dir: String,
}

impl SessionJail {
    /// The processes in the jail (below its first) whose program is `program`.
    fn running(&self, program: &str) -> Vec<u32> {
        descendants(self.init)
            .into_iter()
            .chain(descendants(self.supervisor))
            .filter(|pid| alive_as(*pid, program))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// The session's profile (the jail's `/tmp/profile`), seen through the worker's namespace:
    /// it lives in the run's scratch space, which the worker mounts and unmounts.
    fn profile(&self) -> std::path::PathBuf {
        Path::new(&format!("/proc/{}/root", self.supervisor))
            .join(self.run_dir.trim_start_matches('/'))
            .join("scratch/tmp/profile")
    }
}

/// The jail of the browser session on worker `worker` (the id `corral up` gave it, which its
/// process carries as `CORRAL_WORKER_ID`): the jail there whose program is the bridge.
fn session_jail(stack: &Stack, worker: &str) -> SessionJail {
    let marker = format!("CORRAL_WORKER_ID={worker}");
    let workers: Vec<u32> = descendants(stack.child.id())
        .into_iter()
        .filter(|pid| {
            args(*pid).iter().any(|a| a == "serve")
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|e| e.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
        })
        .collect();
    assert_eq!(workers.len(), 1, "the process of worker {worker}");
    let jails: Vec<(u32, String)> = descendants(workers[0])
        .into_iter()
        .filter_map(|pid| {
            let argv = args(pid);
            let plan = argv.iter().position(|a| a == "__stage2")?;
            let plan: Value = serde_json::from_str(argv.get(plan + 1)?).ok()?;
            let bridge = descendants(pid)
                .into_iter()
                .any(|child| is_bridge(&args(child)));
            Some((pid, plan["run_dir"].as_str()?.to_owned())).filter(|_| bridge)
        })
        .collect();
    assert_eq!(
        jails.len(),
        1,
        "the session's jail on worker {worker}: {jails:?}"
    );
    let (init, run_dir) = jails.into_iter().next().unwrap();
    assert!(run_dir.starts_with('/'), "{run_dir}");
    // The jail's first process is stage 2; stage 1 above it; the worker's supervisor above that.
    let supervisor = parent(init)
        .and_then(parent)
        .expect("the jail's supervisor");
    SessionJail {
        supervisor,
        init,
        run_dir,
    }
}

/// Whether `args` are the bridge's (the session's program in its jail).
fn is_bridge(args: &[String]) -> bool {
    args.len() >= 2 && args[0] == "/usr/bin/python3" && args[1] == "/run/corral/bridge.py"
}

/// The rows of one column of the picture a viewer decoded, at fraction `x` of its width, top to
/// bottom, each `[r, g, b]`.
fn column_at(x: f64) -> String {
    common::viewer::from_picture(&format!(
        "const d = context.getImageData(Math.floor({x} * canvas.width), 0, 1, canvas.height).data;\n  \
         const rows = [];\n  \
         for (let i = 0; i < d.length; i += 4) rows.push([d[i], d[i + 1], d[i + 2]]);\n  \
         return rows;"
    ))
}

/// The most rows Chromium's own tab strip and toolbar take at a device scale of 1 (87 in Debian's
/// Chromium 156; the --no-sandbox warning bar adds 57 more).
const CHROMIUM_TOOLBAR_ROWS_MAX: usize = 100;

/// One HTTP/1.1 request to the API as a member's browser makes it, with `headers` and `body`: the
/// status and the response's headers (names as sent).
fn http_request(
    stack: &Stack,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>) {
    use std::io::{Read as _, Write as _};
    let host = stack
        .api
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !headers.iter().any(|(name, _)| *name == "Connection") {
        request.push_str("Connection: close\r\n");
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert!(head.len() < 64 * 1024, "no end of headers");
        let n = stream.read(&mut byte).expect("the API answers");
        assert_eq!(n, 1, "the API closed before its headers ended: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_owned(), value.trim().to_owned()))
        .collect();
    (status, headers)
}

fn http_get(stack: &Stack, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>) {
    http_request(stack, "GET", path, headers, "")
}

/// BROW-9: an open mints one TURN REST credential for the one configured authority (corral up's
/// coturn), which that real server accepts while it refuses a forged or an expired one; a request
/// cannot name a TURN server; and missing, malformed or unreachable TURN configuration refuses
/// the open with its own code, leasing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brow_09_an_open_mints_the_one_authoritys_credential_and_bad_turn_configuration_refuses_it()
{
    use common::turn_client::{Allocation, allocate};
    use corral_core::browser::turn::{TurnAuthority, mint};
    use corral_core::time::UnixMillis;

    let test =
        "brow_09_an_open_mints_the_one_authoritys_credential_and_bad_turn_configuration_refuses_it";
    if !runtime_or_skip(test) {
        return;
    }
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let url = common::stack::turn_url(&stack.state);
    let server: std::net::SocketAddr = url.trim_start_matches("turn:").parse().unwrap();
    let (status, opened) = open(&stack, "ann", "watch", None).await;
    assert_eq!(status, 200, "{opened}");
    let id = opened["session"].as_str().unwrap().to_owned();
    let live = &opened["live_view"];
    assert_eq!(live["ice_transport_policy"], "relay", "{opened}");
    let ice = &live["ice_servers"][0];
    assert_eq!(
        ice["urls"],
        json!([
            format!("{url}?transport=udp"),
            format!("{url}?transport=tcp")
        ]),
        "{opened}"
    );
    let username = ice["username"].as_str().unwrap();
    let password = ice["credential"].as_str().unwrap();
    assert!(username.ends_with(&format!(":{id}")), "{username}");
    // The real server accepts the minted credential…
    assert!(
        matches!(
            allocate(server, username, password),
            Allocation::Relayed(relayed) if relayed.ip() == server.ip()
        ),
        "coturn refused the minted credential"
    );
    // …and refuses it forged.
    let other = if password.starts_with('x') { 'y' } else { 'x' };
    let forged = format!("{other}{}", &password[1..]);
    assert_ne!(forged, password);
    assert_eq!(
        allocate(server, username, &forged),
        Allocation::Refused(401)
    );
    // The scheme with the real secret: an expired credential is refused, a current one is not.
    let secret = std::fs::read(stack.state.join("turn-secret")).unwrap();
    let secret = secret.trim_ascii_end();
    let authority = TurnAuthority::parse(Some(&url)).unwrap();
    let now = UnixMillis(
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap(),
    );
    let expired = mint(&authority, secret, &id, UnixMillis(now.0 - 7_200_000), 60);
    assert_eq!(
        allocate(server, &expired.username, &expired.password),
        Allocation::Refused(401)
    );
    let current = mint(&authority, secret, &id, now, 60);
    assert!(matches!(
        allocate(server, &current.username, &current.password),
        Allocation::Relayed(_)
    ));
    // A request cannot name a TURN server, in any field.
    for field in ["turn", "turn_url", "ice_servers"] {
        let mut body = json!({ "actor": "ann", "conversation": "watch2", "member": "ann" });
        body[field] = json!("turn:10.9.9.9:3478");
        let (status, refused) = stack
            .caller
            .post("/v1/browser_sessions", &body)
            .await
            .unwrap();
        assert_eq!(status, 400, "{field}: {refused}");
    }
    let (status, closed) = close(&stack, &id, ("ann", "watch")).await;
    assert_eq!(status, 200, "{closed}");
    // Bad configuration refuses the open, on replicas configured so.
    let short = stack.state.join("short-turn-secret");
    std::fs::write(&short, "too short\n").unwrap();
    let closed_port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let silent = format!("turn:127.0.0.1:{closed_port}");
    type Env<'a> = &'a [(&'a str, Option<&'a str>)];
    let cases: [(Env, &str); 5] = [
        (&[("CORRAL_TURN_URL", None)], "turn_not_configured"),
        (&[("CORRAL_TURN_SECRET_FILE", None)], "turn_not_configured"),
        (
            &[("CORRAL_TURN_URL", Some("turn:127.0.0.1:3478?transport=udp"))],
            "turn_config_invalid",
        ),
        (
            &[("CORRAL_TURN_SECRET_FILE", Some(short.to_str().unwrap()))],
            "turn_config_invalid",
        ),
        (&[("CORRAL_TURN_URL", Some(&silent))], "turn_unreachable"),
    ];
    for (env, code) in cases {
        let replica = stack.replica_with(env).await;
        let (status, refused) = replica
            .caller
            .post(
                "/v1/browser_sessions",
                &json!({ "actor": "ann", "conversation": "watch3", "member": "ann" }),
            )
            .await
            .unwrap();
        assert_eq!(
            (status, refused["error"]["code"].as_str()),
            (503, Some(code)),
            "{env:?}: {refused}"
        );
    }
    let settled = stack.settled().await;
    assert_eq!(settled.counts().leased, 0, "{:?}", settled.counts());
}

/// A page whose every click turns it the next of three colours.
const COLOURS: &str = r#"<html><head><title>colours</title></head>
<body style="margin:0;height:100vh;background:rgb(200,30,30)" onclick="
  const next = {'rgb(200, 30, 30)': 'rgb(30, 200, 30)', 'rgb(30, 200, 30)': 'rgb(30, 30, 200)'};
  document.body.style.background = next[getComputedStyle(document.body).backgroundColor] || 'rgb(200, 30, 30)';
  document.title = 'clicked ' + (++window.clicks || (window.clicks = 1));
"></body></html>"#;
const RED: [u8; 3] = [200, 30, 30];
const GREEN: [u8; 3] = [30, 200, 30];
const BLUE: [u8; 3] = [30, 30, 200];

/// Spellings of the adapter's `api/` namespace under the viewport: each is refused, whatever
/// encoding or dot segments it hides behind (BROW-8).
const API_SPELLINGS: [&str; 14] = [
    "api/room",
    "api/login",
    "API/room/screen",
    "api%2Froom",
    "api%2froom",
    "%61pi/room",
    "./api/room",
    "x/../api/room",
    "x/..%2Fapi/room",
    "api%252Froom",
    "%252e%252e/api/room",
    "a/b/../../api/",
    "api;jsessionid=1/room",
    "x%5C..%5Capi%5Croom",
];

async fn viewer_ticket(stack: &Stack, id: &str, owner: (&str, &str), member: &str) -> Value {
    let (status, ticket) = stack
        .caller
        .post(
            &format!("/v1/browser_sessions/{id}/viewers"),
            &json!({ "actor": owner.0, "conversation": owner.1, "member": member }),
        )
        .await
        .expect("the API answers");
    assert_eq!(status, 200, "{ticket}");
    ticket
}

/// GET `path` on the API without the caller's credential (as a member's browser asks).
async fn anonymous(stack: &Stack, path: &str) -> (u16, String) {
    let (status, body) = corral_api::client::Client::new(&stack.api, "")
        .unwrap()
        .get(path)
        .await
        .expect("the API answers");
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The live view end to end (BROW-2, BROW-8, BROW-9, BROW-10, BROW-11, BROW-12): coturn on
/// loopback, a session on a real worker, and headless Chromium as each member's viewer loading the
/// viewport page. The viewer connects through TURN only (the selected pair is relay-relay),
/// shows the agent's page (its colour read back from the video), and its click, carried by the
/// data channel into the display, changes the page. A second member's viewer is closed and cut
/// off when the first marks private text, while the first keeps watching; the viewport serves
/// its client and refuses every spelling of the adapter's `api/` paths and any bad ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brow_02_brow_05_brow_08_brow_09_brow_10_brow_11_brow_12_members_watch_through_turn_and_take_over()
 {
    use common::viewer::{STATE, Viewer, colour_at, near};
    let test = "brow_02_brow_05_brow_08_brow_09_brow_10_brow_11_brow_12_members_watch_through_turn_and_take_over";
    if !runtime_or_skip(test) {
        return;
    }
    let Some((ns, ip)) = site(test) else {
        return;
    };
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    allow(&stack, &ip).await;
    let ann = ("ann", "research");
    let (status, opened) = open(
        &stack,
        "ann",
        "research",
        Some(&format!("http://{ip}/colours.html")),
    )
    .await;
    assert_eq!(status, 200, "{opened}");
    assert_eq!(
        opened["navigated"]["result"]["title"], "colours",
        "{opened}"
    );
    assert_eq!(opened["live_view"]["ice_transport_policy"], "relay");
    let id = opened["session"].as_str().unwrap().to_owned();
    // BROW-1, BROW-13: the session's jail, on the worker it leased, runs PulseAudio and holds a
    // fresh profile while it is open (both looked at again after the close).
    let jail = session_jail(&stack, opened["worker"].as_str().unwrap());
    let pulse = jail.running(PULSEAUDIO);
    assert_eq!(pulse.len(), 1, "PulseAudio in the session's jail: {jail:?}");
    let profile = jail.profile();
    assert!(
        profile.join("Default/Preferences").is_file(),
        "the session's profile at {}",
        profile.display()
    );

    // The viewport: the client is served with a valid ticket, and nothing else is.
    let bob = viewer_ticket(&stack, &id, ann, "bob").await;
    let ticket = bob["ticket"].as_str().unwrap();
    let viewport = bob["viewport"].as_str().unwrap();
    let (status, page) = anonymous(&stack, viewport).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("viewer.js?ticket="), "{page}");
    let base = format!("/api/browser-sessions/{id}/viewport/");
    let (status, script) = anonymous(&stack, &format!("{base}viewer.js?ticket={ticket}")).await;
    assert_eq!(status, 200);
    assert!(script.contains("RTCPeerConnection"), "the client's script");
    for spelling in API_SPELLINGS {
        let (status, body) = anonymous(&stack, &format!("{base}{spelling}?ticket={ticket}")).await;
        assert!(
            (status == 403 && body.contains("viewport_path_refused"))
                || (status == 400 && body.contains("viewport_path_invalid")),
            "{spelling}: {status} {body}"
        );
    }
    let (status, body) = anonymous(&stack, &format!("{base}secrets.txt?ticket={ticket}")).await;
    assert_eq!(status, 404, "{body}");
    let last = if ticket.ends_with('A') { 'B' } else { 'A' };
    let forged = format!("{}{last}", &ticket[..ticket.len() - 1]);
    for bad in [String::new(), forged, "garbage".to_owned()] {
        let (status, body) = anonymous(&stack, &format!("{base}?ticket={bad}")).await;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("viewer_ticket_invalid"), "{body}");
    }
    // Another conversation's caller cannot have a ticket for this session.
    let (status, body) = stack
        .caller
        .post(
            &format!("/v1/browser_sessions/{id}/viewers"),
            &json!({ "actor": "ann", "conversation": "elsewhere", "member": "bob" }),
        )
        .await
        .unwrap();
    assert_eq!(status, 404, "{body}");
    // BROW-2: no response on the viewport's path sets a cookie: the page, its script, the ticket's
    // mint, and the signaling relay's upgrade.
    let caller_token = std::fs::read_to_string(stack.state.join("api-token")).unwrap();
    let mint = json!({ "actor": "ann", "conversation": "research", "member": "erin" }).to_string();
    let signal_path = bob["signal"].as_str().unwrap().to_owned();
    for (what, request, expected) in [
        ("the viewport page", http_get(&stack, viewport, &[]), 200),
        (
            "the client's script",
            http_get(&stack, &format!("{base}viewer.js?ticket={ticket}"), &[]),
            200,
        ),
        (
            "the ticket's mint",
            http_request(
                &stack,
                "POST",
                &format!("/v1/browser_sessions/{id}/viewers"),
                &[
                    ("Authorization", &format!("Bearer {}", caller_token.trim())),
                    ("Content-Type", "application/json"),
                ],
                &mint,
            ),
            200,
        ),
        (
            "the signaling upgrade",
            http_get(
                &stack,
                &signal_path,
                &[
                    ("Connection", "Upgrade"),
                    ("Upgrade", "websocket"),
                    ("Sec-WebSocket-Version", "13"),
                    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ],
            ),
            101,
        ),
    ] {
        let (status, headers) = request;
        assert_eq!(status, expected, "{what}: {headers:?}");
        assert!(
            !headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("set-cookie")),
            "{what} sets a cookie: {headers:?}"
        );
    }

    // Bob watches: relay to relay through corral up's coturn, the agent's page on his screen.
    let url = format!("{}{viewport}", stack.api);
    let mut bob_view = tokio::task::block_in_place(|| Viewer::open(&url, 1600, 1000));
    let state = tokio::task::block_in_place(|| {
        // A frame decoded and its size known: the size arrives with the first decoded frame's
        // metadata, a moment after the frame counter moves.
        bob_view.wait("bob connects through TURN", Duration::from_secs(20), |s| {
            s["state"] == "connected"
                && s["frames"].as_u64() > Some(0)
                && s["width"].as_u64() > Some(0)
        })
    });
    assert_eq!(state["pair"], json!(["relay", "relay"]), "{state}");
    assert_eq!(
        state["width"], 1600,
        "new sessions capture 1600x1000: {state}"
    );
    let centre = colour_at(0.5, 0.6);
    tokio::task::block_in_place(|| {
        bob_view.wait_for(
            &centre,
            "bob sees the red page",
            Duration::from_secs(10),
            |c| near(c, RED, 24),
        )
    });
    // BROW-2: the member's browser holds no cookie, neither one a script could read nor any in
    // its whole store.
    let cookies =
        tokio::task::block_in_place(|| (bob_view.eval("document.cookie"), bob_view.cookies()));
    assert_eq!(
        cookies,
        (json!(""), json!([])),
        "bob's browser holds cookies"
    );
    // No warning bar across the window (decision 0027): down the middle of the frame bob decoded,
    // Chromium's own tab strip and toolbar come first, then the agent's red page to the bottom,
    // starting where Chromium says its content starts and within the height of the tab strip and
    // toolbar. The --no-sandbox bar would sit between them and push the page 57 rows down.
    let column = tokio::task::block_in_place(|| bob_view.eval(&column_at(0.5)));
    let rows = column.as_array().expect("the frame's middle column");
    assert_eq!(rows.len(), 1000, "the frame's height");
    let first_page_row = rows
        .iter()
        .position(|c| near(c, RED, 48))
        .expect("the page in the frame");
    let page_rows = rows[first_page_row..]
        .iter()
        .filter(|c| near(c, RED, 48))
        .count();
    assert!(
        page_rows + 2 >= rows.len() - first_page_row,
        "the page is not whole below row {first_page_row}: {column}"
    );
    let (status, content_top) = act(
        &stack,
        &id,
        ann,
        json!({ "action": "evaluate", "expression": "window.outerHeight - window.innerHeight" }),
    )
    .await;
    assert_eq!(status, 200, "{content_top}");
    let content_top: usize = content_top["result"]["value"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("a row");
    assert!(
        first_page_row.abs_diff(content_top) <= 2,
        "the page starts at row {first_page_row}, Chromium's content at {content_top}"
    );
    assert!(
        first_page_row <= CHROMIUM_TOOLBAR_ROWS_MAX,
        "the page starts at row {first_page_row}: a bar sits above it"
    );
    let png = tokio::task::block_in_place(|| bob_view.screenshot());
    std::fs::write(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("brow_live_view_no_flag_bar.png"),
        png,
    )
    .unwrap();
    // His click, through the data channel and XTest, changes the page the agent drives.
    tokio::task::block_in_place(|| bob_view.click(800, 600));
    tokio::task::block_in_place(|| {
        bob_view.wait_for(
            &centre,
            "bob sees his click's green",
            Duration::from_secs(10),
            |c| near(c, GREEN, 24),
        )
    });
    let (status, title) = act(
        &stack,
        &id,
        ann,
        json!({ "action": "evaluate", "expression": "document.title" }),
    )
    .await;
    assert_eq!(status, 200, "{title}");
    assert_eq!(title["result"]["value"], "\"clicked 1\"", "{title}");

    // Carl watches too.
    let carl = viewer_ticket(&stack, &id, ann, "carl").await;
    let carl_url = format!("{}{}", stack.api, carl["viewport"].as_str().unwrap());
    let mut carl_view = tokio::task::block_in_place(|| Viewer::open(&carl_url, 1600, 1000));
    tokio::task::block_in_place(|| {
        carl_view.wait_for(
            &centre,
            "carl sees the green page",
            Duration::from_secs(20),
            |c| near(c, GREEN, 24),
        )
    });

    // Bob marks private text: Carl's relay is closed and his peer removed; Bob keeps watching.
    let (status, private) = stack
        .caller
        .post(
            &format!("/v1/browser_sessions/{id}/private"),
            &json!({ "actor": "ann", "conversation": "research", "private": true, "member": "bob" }),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{private}");
    assert_eq!(private["viewers_removed"], 1, "{private}");
    let closed = tokio::task::block_in_place(|| {
        carl_view.wait("carl's relay is closed", Duration::from_secs(10), |s| {
            s["closed"] == "private_text"
        })
    });
    let cut = Instant::now();
    let carl_frames = closed["frames"].as_u64().unwrap();
    // A new viewer cannot start while the interval lasts.
    let dave = viewer_ticket(&stack, &id, ann, "dave").await;
    let (status, body) = anonymous(&stack, dave["viewport"].as_str().unwrap()).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("private_text"), "{body}");
    let (status, refused) = act(&stack, &id, ann, json!({ "action": "text" })).await;
    assert_eq!(status, 403, "{refused}");
    // Bob's click still reaches the page, and he sees it; Carl's screen gets nothing more.
    tokio::task::block_in_place(|| bob_view.click(800, 600));
    tokio::task::block_in_place(|| {
        bob_view.wait_for(&centre, "bob sees blue", Duration::from_secs(10), |c| {
            near(c, BLUE, 24)
        })
    });
    let after = tokio::task::block_in_place(|| carl_view.eval(STATE));
    assert_eq!(
        after["frames"].as_u64(),
        Some(carl_frames),
        "carl decoded frames after his peer was removed: {after}"
    );
    let carl_colour = tokio::task::block_in_place(|| carl_view.eval(&centre));
    assert!(
        !near(&carl_colour, BLUE, 60),
        "carl saw the private page: {carl_colour:?}"
    );
    // Why Carl was cut off stays on his page, in words over the picture and as its code, and the
    // page connects no more: read until ten seconds after the cut, well past its first delay
    // before connecting again, it has made no second signaling connection.
    let retry_ms = tokio::task::block_in_place(|| carl_view.eval("window.corralViewer.retryMs[0]"));
    assert!(retry_ms.as_u64().is_some_and(|ms| ms < 5_000), "{retry_ms}");
    let held = tokio::task::block_in_place(|| {
        carl_view.holds_for(
            STATE,
            "carl's page shows why he was cut off",
            Duration::from_secs(10).saturating_sub(cut.elapsed()),
            |s| {
                s["code"] == "private_text"
                    && s["closed"] == "private_text"
                    && s["final"] == true
                    && s["connections"] == 1
                    && s["text"]
                        .as_str()
                        .is_some_and(|text| text.contains("private text"))
                    && s["notice"] == s["text"]
            },
        )
    });
    assert!(cut.elapsed() >= Duration::from_secs(10), "{held}");
    let png = tokio::task::block_in_place(|| carl_view.screenshot());
    std::fs::write(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("brow_live_view_private_cut.png"),
        png,
    )
    .unwrap();

    let (status, ended) = stack
        .caller
        .post(
            &format!("/v1/browser_sessions/{id}/private"),
            &json!({ "actor": "ann", "conversation": "research", "private": false }),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{ended}");
    // BROW-5: the driver's pane (Bob's, who took over) sets the desktop: 1001x667 CSS pixels at
    // a ratio of 1.5 become a 1502x1000 screen, Chromium's window follows, and the picture keeps
    // its aspect in his pane.
    // The adapter answers each pane message with the capture it asked for and the screen's mode
    // after it (BROW-11).
    let resized = json!({ "width": 1502, "height": 1000 });
    tokio::task::block_in_place(|| bob_view.metrics(1001, 667, 1.5));
    tokio::task::block_in_place(|| {
        bob_view.wait_for(
            "window.corralViewer.panes[window.corralViewer.panes.length - 1]",
            "the adapter answers bob's new pane",
            Duration::from_secs(10),
            |answer| answer["capture"] == resized && answer["screen"] == resized,
        )
    });
    tokio::task::block_in_place(|| {
        bob_view.wait(
            "the picture follows bob's pane",
            Duration::from_secs(10),
            |s| s["width"] == 1502 && s["height"] == 1000,
        )
    });
    let geometry =
        "JSON.stringify([screen.width, screen.height, window.outerWidth, window.outerHeight])";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, sizes) = act(
            &stack,
            &id,
            ann,
            json!({ "action": "evaluate", "expression": geometry }),
        )
        .await;
        assert_eq!(status, 200, "{sizes}");
        if sizes["result"]["value"] == "\"[1502,1000,1502,1000]\"" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Chromium's window did not follow the mode: {sizes}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Bad pane sizes reach nothing: each is answered with its refusal and the screen's mode
    // unchanged, and a good pane sent after them (answered after them: the channel is ordered)
    // keeps it too.
    let answered = tokio::task::block_in_place(|| {
        bob_view.eval("(() => { const v = window.corralViewer; const before = v.paneAnswers; const video = document.getElementById('screen'); for (const p of [{t:'pane',width:-1,height:5,ratio:1},{t:'pane',width:NaN,height:5,ratio:1},{t:'what'},{t:'pane',width:video.clientWidth,height:video.clientHeight,ratio:window.devicePixelRatio}]) v.channel.send(JSON.stringify(p)); return before; })()")
    });
    let before = answered.as_u64().expect("a count");
    let answers = tokio::task::block_in_place(|| {
        bob_view.wait_for(
            &format!("(() => {{ const v = window.corralViewer; return v.paneAnswers >= {before} + 3 ? v.panes.slice(-3) : null; }})()"),
            "the adapter answers the three pane messages",
            Duration::from_secs(10),
            |answers| answers.is_array(),
        )
    });
    assert_eq!(
        answers,
        json!([
            { "t": "pane", "refused": "resize_invalid", "screen": resized },
            { "t": "pane", "refused": "input_invalid", "screen": resized },
            { "t": "pane", "capture": resized, "screen": resized },
        ]),
        "{answers}"
    );
    // Both sides of the screen, Chromium's window, and the picture bob decodes are 1502x1000,
    // and the picture keeps that aspect in his 1001x667 pane.
    let (_, sizes) = act(
        &stack,
        &id,
        ann,
        json!({ "action": "evaluate", "expression": geometry }),
    )
    .await;
    assert_eq!(
        sizes["result"]["value"], "\"[1502,1000,1502,1000]\"",
        "{sizes}"
    );
    let picture = tokio::task::block_in_place(|| {
        bob_view.eval("(() => { const v = document.getElementById('screen'); return [v.videoWidth, v.videoHeight, v.clientWidth, v.clientHeight, getComputedStyle(v).objectFit]; })()")
    });
    assert_eq!(
        (&picture[0], &picture[1], &picture[4]),
        (&json!(1502), &json!(1000), &json!("contain")),
        "{picture}"
    );
    let aspect = |w: &Value, h: &Value| w.as_f64().unwrap() / h.as_f64().unwrap();
    assert!(
        (aspect(&picture[0], &picture[1]) - aspect(&picture[2], &picture[3])).abs() < 0.01,
        "the picture's aspect is not the pane's: {picture}"
    );
    // Bad signaling gets a bounded answer: not JSON, an SDP that is not one, an offer whose only
    // candidate is a host address (relay only), each with its code, and the relay stays open.
    let signal = bob["signal"].as_str().unwrap();
    let probe = format!(
        r#"(async () => {{
  const ws = new WebSocket(location.origin.replace('http', 'ws') + '{signal}');
  const next = () => new Promise((resolve) => {{ ws.onmessage = (e) => resolve(JSON.parse(e.data)); }});
  let message = next();
  await new Promise((resolve) => {{ ws.onopen = resolve; }});
  const config = await message;
  const codes = [config.t, config.ice_transport_policy];
  for (const text of ['not json', JSON.stringify({{ t: 'offer', sdp: 'garbage' }}),
      JSON.stringify({{ t: 'offer', sdp: 'v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=candidate:1 1 udp 2122260223 192.168.1.5 50000 typ host\r\n' }}),
      JSON.stringify({{ t: 'hello' }})]) {{
    message = next();
    ws.send(text);
    codes.push((await message).code);
  }}
  codes.push(ws.readyState);
  ws.close();
  return codes;
}})()"#
    );
    let codes = tokio::task::block_in_place(|| bob_view.eval(&probe));
    assert_eq!(
        codes,
        json!([
            "config",
            "relay",
            "signal_invalid",
            "sdp_invalid",
            "sdp_invalid",
            "signal_invalid",
            1
        ]),
        "{codes}"
    );
    // A flood of input is bounded (the excess dropped), and the adapter keeps serving: Bob's next
    // click still changes the page, and he sees it.
    let flooded = tokio::task::block_in_place(|| {
        bob_view.eval("(() => { const c = window.corralViewer.channel; for (let i = 0; i < 3000; i++) c.send(JSON.stringify({t: 'move', x: (i % 100) / 100, y: 0.5})); for (const bad of ['{', '{\"t\":\"move\",\"x\":7,\"y\":0}', '{\"t\":\"key\",\"code\":\"NoSuchKey\",\"down\":true}']) c.send(bad); return c.readyState; })()")
    });
    assert_eq!(flooded, "open");
    // The budget refills at 240 events a second, so a click right after the flood may be dropped:
    // click until one lands (the page then turns from blue to red).
    let landed = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            bob_view.click(800, 600);
            let tried = Instant::now();
            while tried.elapsed() < Duration::from_secs(1) {
                // Only red ends it: a click that lands turns the page from blue to red (a
                // picture caught mid-change is looked at again).
                if near(&bob_view.eval(&centre), RED, 48) {
                    return true;
                }
            }
        }
        false
    });
    assert!(landed, "no click reached the page after the flood");
    // A passing close (the relay's connection dropped) is retried: Bob's page connects again
    // after its first delay and shows the page again.
    let dropped = tokio::task::block_in_place(|| {
        bob_view.eval("(() => { const v = window.corralViewer; v.socket.close(4000, 'dropped'); return [v.connections, v.retryMs[0]]; })()")
    });
    assert_eq!(dropped[0], 1, "{dropped}");
    tokio::task::block_in_place(|| {
        bob_view.wait(
            "bob's page connects again after the drop",
            Duration::from_secs(20),
            |s| {
                s["connections"] == 2
                    && s["reconnects"] == 1
                    && s["state"] == "connected"
                    && s["final"] == false
                    && s["frames"].as_u64() > Some(0)
            },
        )
    });
    let (status, closed) = close(&stack, &id, ann).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["confirmed"], true, "{closed}");
    // BROW-1, BROW-13: the jail's PulseAudio has stopped and the profile is gone; the worker that
    // held it is still there to be looked through.
    assert!(
        Path::new(&format!("/proc/{}/root", jail.supervisor)).exists(),
        "the worker that held the session ended: {jail:?}"
    );
    assert!(
        pulse.iter().all(|pid| !alive_as(*pid, PULSEAUDIO)),
        "PulseAudio outlived the close: {pulse:?}"
    );
    assert!(jail.running(PULSEAUDIO).is_empty(), "{jail:?}");
    assert!(
        !profile.exists(),
        "the profile outlived the close: {}",
        profile.display()
    );
    // Closing ends the relay: the viewport and its signaling are gone with the session, and Bob's
    // page says so in words (its code beside them) and connects no more.
    let (status, _) = anonymous(&stack, viewport).await;
    assert_eq!(status, 404);
    let ended = tokio::task::block_in_place(|| {
        bob_view.wait(
            "bob's page says the session ended",
            Duration::from_secs(10),
            |s| s["code"] == "session_not_found",
        )
    });
    assert_eq!(
        (
            &ended["text"],
            &ended["notice"],
            &ended["final"],
            &ended["connections"]
        ),
        (
            &json!("The session has ended."),
            &json!("The session has ended."),
            &json!(true),
            &json!(2)
        ),
        "{ended}"
    );
    drop((bob_view, carl_view, ns));
    let settled = stack.settled().await;
    assert_eq!(settled.counts().leased, 0, "{:?}", settled.counts());
}

/// BROW-9: a live view outlives its TURN credential. With credentials of a minute, the replica
/// holding the session mints a new one in the credential's last quarter, the worker allocates a
/// new relay with it, and the viewer's page is handed the new configuration and reconnects
/// through it; after the first credential has expired (so coturn refuses anything of it), the
/// viewer still watches relay to relay and its click still reaches the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brow_09_a_live_view_is_moved_to_a_renewed_credential_before_the_old_one_lapses() {
    use common::viewer::{STATE, Viewer, colour_at, near};
    let test = "brow_09_a_live_view_is_moved_to_a_renewed_credential_before_the_old_one_lapses";
    if !runtime_or_skip(test) {
        return;
    }
    let Some((_ns, ip)) = site(test) else {
        return;
    };
    let Some(stack) = Stack::start(test, &[("CORRAL_TURN_CREDENTIAL_TTL_SECONDS", "60")], &[])
    else {
        return;
    };
    allow(&stack, &ip).await;
    let ann = ("ann", "renewal");
    let url = format!("http://{ip}/colours.html");
    let (status, opened) = open(&stack, "ann", "renewal", Some(&url)).await;
    assert_eq!(status, 200, "{opened}");
    let id = opened["session"].as_str().unwrap().to_owned();
    let first = opened["live_view"]["ice_servers"][0]["username"]
        .as_str()
        .unwrap()
        .to_owned();
    let lapses_at = opened["live_view"]["expires_at_ms"].as_u64().unwrap();
    let ticket = viewer_ticket(&stack, &id, ann, "bob").await;
    let viewport = format!("{}{}", stack.api, ticket["viewport"].as_str().unwrap());
    let mut view = tokio::task::block_in_place(|| Viewer::open(&viewport, 1600, 1000));
    tokio::task::block_in_place(|| {
        view.wait("bob connects", Duration::from_secs(20), |s| {
            s["state"] == "connected" && s["frames"].as_u64() > Some(0)
        })
    });
    assert_eq!(
        tokio::task::block_in_place(|| view.eval("window.corralViewer.username")),
        first
    );
    // The renewal comes in the last quarter of the minute (the sweep runs every 10 s).
    let renewed = tokio::task::block_in_place(|| {
        view.wait_for(
            "JSON.stringify([window.corralViewer.renewed, window.corralViewer.username])",
            "the viewer is handed a renewed credential",
            Duration::from_secs(70),
            |v| v.as_str().is_some_and(|v| v.starts_with("[1,")),
        )
    });
    assert!(!renewed.as_str().unwrap().contains(&first), "{renewed}");
    tokio::task::block_in_place(|| {
        view.wait(
            "bob reconnects through the new relay",
            Duration::from_secs(20),
            |s| s["state"] == "connected" && s["frames"].as_u64() > Some(0),
        )
    });
    // Past the first credential's expiry, by the wall clock coturn judges it by.
    let now = || {
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap()
    };
    while now() < lapses_at + 2_000 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let state = tokio::task::block_in_place(|| view.eval(STATE));
    assert_eq!(state["pair"], json!(["relay", "relay"]), "{state}");
    let centre = colour_at(0.5, 0.6);
    tokio::task::block_in_place(|| view.click(800, 600));
    tokio::task::block_in_place(|| {
        view.wait_for(
            &centre,
            "bob's click shows after the old credential lapsed",
            Duration::from_secs(10),
            |c| near(c, GREEN, 48),
        )
    });
    let (status, closed) = close(&stack, &id, ann).await;
    assert_eq!(status, 200, "{closed}");
}

/// BROW-6: a member using the live view keeps the session from being reaped as idle, and it is
/// reaped once they stop. With an idle limit of 4 s, a viewer that clicks now and then keeps the
/// session open well past the limit with no call of the agent's; when the clicks stop, the sweep
/// closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brow_06_a_member_at_work_in_the_live_view_keeps_the_session_from_the_idle_reap() {
    use common::viewer::Viewer;
    let test = "brow_06_a_member_at_work_in_the_live_view_keeps_the_session_from_the_idle_reap";
    if !runtime_or_skip(test) {
        return;
    }
    let Some(stack) = Stack::start(test, &[("CORRAL_BROWSER_IDLE_SECONDS", "4")], &[]) else {
        return;
    };
    let ann = ("ann", "at-work");
    let (status, opened) = open(&stack, "ann", "at-work", None).await;
    assert_eq!(status, 200, "{opened}");
    let id = opened["session"].as_str().unwrap().to_owned();
    let ticket = viewer_ticket(&stack, &id, ann, "bob").await;
    let viewport = format!("{}{}", stack.api, ticket["viewport"].as_str().unwrap());
    let mut view = tokio::task::block_in_place(|| Viewer::open(&viewport, 1600, 1000));
    tokio::task::block_in_place(|| {
        view.wait("bob connects", Duration::from_secs(20), |s| {
            s["state"] == "connected" && s["frames"].as_u64() > Some(0)
        })
    });
    // Twice the idle limit of clicking, and no call of the agent's.
    let working = Instant::now();
    while working.elapsed() < Duration::from_secs(8) {
        tokio::task::block_in_place(|| view.click(800, 500));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let said = tokio::task::block_in_place(|| view.eval("window.corralViewer.activity"));
    assert!(
        said.as_u64() >= Some(4),
        "the viewer said it was at work {said} times"
    );
    let (status, alive) = act(&stack, &id, ann, json!({ "action": "text" })).await;
    assert_eq!(
        status, 200,
        "the session was reaped while a member used it: {alive}"
    );
    // The member stops; the session goes idle and is reaped.
    let stopped = Instant::now();
    loop {
        let (status, _) = act(&stack, &id, ann, json!({ "action": "text" })).await;
        if status == 404 {
            break;
        }
        // Each call is the agent's activity too: ask rarely, and only to see the reap.
        assert!(stopped.elapsed() < Duration::from_secs(30), "never reaped");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
