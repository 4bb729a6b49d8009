//! The browser session benchmark (BROW-1, BROW-13): through `POST /v1/browser_sessions` of a
//! `corral up` it starts, the time from asking for a session with a URL to the answer that the
//! first navigation completed (a warm worker leased, the jail's display, window manager, audio
//! and headed Chromium started, the page loaded through the egress proxy), p50 and p95 over
//! `--runs` sessions, each closed (and its worker reset) before the next; against launching the
//! same Chromium headless directly on the host to load the same page (`--dump-dom`), in the same
//! run.
//!
//! The page is served by a Python HTTP server in a network namespace of its own, on 10.213.K.2 port
//! 80 (the egress proxy always refuses loopback and the documentation ranges a test host may have
//! as its address), which the stack's egress policy admits (`private_network` with that address).
//! `scripts/bench-browser` builds and runs it, as root.
//!
//! `browser_open --corral PATH [--runs N] [--pause-ms MS]`

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use corral_benches::up::{Up, summary};
use corral_testkit::registries::TempDir;
use serde_json::json;

// The egress tests' namespace helper; only part of it is used here.
#[allow(dead_code)]
#[path = "../../../services/egress-proxy/tests/support/netns.rs"]
mod netns;

const PAGE: &str = "<html><head><title>Bench</title></head><body><h1>Corral</h1><p>A page to open.</p></body></html>";

fn main() {
    corral_benches::up::run_main(
        20,
        Duration::from_millis(1_500),
        |corral, runs, pause| async move {
            measure(&corral, runs, pause).await;
        },
    );
}

async fn measure(corral: &str, runs: usize, pause: Duration) {
    let state = TempDir::new("bench-browser");
    let site = state.path().join("site");
    std::fs::create_dir_all(&site).expect("site");
    std::fs::write(site.join("page.html"), PAGE).expect("page");
    let mut ns = netns::Netns::create().expect("a network namespace for the page (root, ip)");
    let ip = ns.ns_ip.to_string();
    ns.serve_directory(&site)
        .expect("the page server in the namespace");
    let url = format!("http://{ip}/page.html");
    let cidr = format!("{ip}/32");
    let up = Up::start(
        corral,
        &state.path().join("corral"),
        &[
            ("SANDBOX_WARM_POOL_MIN", "2"),
            ("SANDBOX_EGRESS_MODE", "private_network"),
            ("SANDBOX_EGRESS_PRIVATE_CIDRS", &cidr),
            ("SANDBOX_EGRESS_ALLOWED_PORTS", "80"),
        ],
    );
    let client = &up.client;
    println!(
        "runs: {runs}, pause between sessions: {} ms; page {url}",
        pause.as_millis()
    );
    let session = |i: usize| json!({ "actor": "bench", "conversation": format!("bench-{i}"), "member": "bench", "url": url });
    let mut opened = Vec::new();
    let mut closed = Vec::new();
    let mut started_runtime = Vec::new();
    let mut started_chromium = Vec::new();
    let mut navigations = Vec::new();
    // One session first, unmeasured: the pool's first browser start loads the programs.
    for i in 0..=runs {
        tokio::time::sleep(pause).await;
        let started = Instant::now();
        let (status, body) = client
            .post("/v1/browser_sessions", &session(i))
            .await
            .expect("the API answers");
        let took = started.elapsed();
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["navigated"]["result"]["title"], "Bench", "{body}");
        let id = body["session"].as_str().expect("a session").to_owned();
        let runtime_start = Duration::from_millis(body["start_ms"].as_u64().expect("start_ms"));
        let navigation = Duration::from_millis(
            body["navigated"]["took_ms"]
                .as_u64()
                .expect("navigated.took_ms"),
        );
        let chromium_start = Duration::from_millis(
            body["start_phases_ms"]["chromium"]
                .as_u64()
                .expect("start_phases_ms.chromium"),
        );
        let started = Instant::now();
        let (status, body) = client
            .post(
                &format!("/v1/browser_sessions/{id}/close"),
                &json!({ "actor": "bench", "conversation": format!("bench-{i}") }),
            )
            .await
            .expect("the API answers");
        assert_eq!((status, &body["confirmed"]), (200, &json!(true)), "{body}");
        if i > 0 {
            opened.push(took);
            started_runtime.push(runtime_start);
            started_chromium.push(chromium_start);
            navigations.push(navigation);
            closed.push(started.elapsed());
        }
    }
    let (corral_p50, corral_p95) = summary(
        "open a session to its first navigation complete (warm pool, headed, through the proxy)",
        &opened,
    );
    summary(
        "  of which the worker started the runtime and made the first navigation (jail, display, window manager, audio, Chromium)",
        &started_runtime,
    );
    summary(
        "    of which the display and Chromium's first page (from the bridge's start)",
        &started_chromium,
    );
    summary(
        "    of which the first navigation (sent with the driver's setup, through the proxy, to its load)",
        &navigations,
    );
    summary(
        "close (stop, delete the profile, reset with evidence)",
        &closed,
    );
    // The same Chromium, headless and straight on the host: launch, load, print the DOM, exit.
    let chromium = corral_worker::RUNTIME_PROGRAMS[0].1;
    let mut direct = Vec::new();
    for i in 0..runs {
        let profile = state.path().join(format!("direct-{i}"));
        let started = Instant::now();
        let output = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-proxy-server",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(["--dump-dom", &url])
            .stderr(Stdio::null())
            .output()
            .expect("chromium");
        direct.push(started.elapsed());
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("<title>Bench</title>"),
            "headless Chromium did not load the page"
        );
    }
    let (direct_p50, direct_p95) = summary(
        "the same Chromium headless on the host (launch, load, dump, exit)",
        &direct,
    );
    println!(
        "session/direct: p50 {:.2}, p95 {:.2}",
        corral_p50 / direct_p50,
        corral_p95 / direct_p95
    );
    drop(ns);
}
