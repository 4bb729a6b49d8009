//! The live view end to end (issue 18; BROW-2, BROW-9, BROW-10, BROW-11), through a `corral up`
//! it starts (with its coturn on loopback) and headless Chromium as the member's viewer:
//!
//! - open to the viewer's first decoded frame: from asking for a session (warm pool) to the
//!   viewer page's first shown frame, over `--runs` sessions, each closed before the next; with
//!   the open's own answer time beside it;
//! - input to photon through TURN: the viewer sends a click over the data channel, the page in
//!   the session changes colour, and the time until the viewer shows a frame of the new colour
//!   (read back from the video at each presented frame), `--clicks` per session;
//! - frames per second received on a page that changes every animation frame, at 1600x1000.
//!
//! The capture, conversion and encode split, the idle CPU and the bits per pixel are
//! `live_view_media`'s, which `scripts/bench-live-view` runs in the same invocation.
//!
//! `live_view --corral PATH [--runs N] [--pause-ms MS] [--clicks N] [--seconds N]`

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corral_benches::up::{Args, Up, summary};
use corral_testkit::registries::TempDir;
use serde_json::{Value, json};

#[allow(dead_code)]
#[path = "../../../services/egress-proxy/tests/support/netns.rs"]
mod netns;

#[allow(dead_code)]
#[path = "../../../services/corral/tests/common/viewer.rs"]
mod viewer;

use viewer::{STATE, Viewer};

/// Each click toggles the page between two colours.
const TOGGLE: &str = r#"<html><head><title>toggle</title></head>
<body style="margin:0;height:100vh;background:rgb(200,30,30)" onclick="
  document.body.style.background = document.body.style.background === 'rgb(200, 30, 30)' ? 'rgb(30, 30, 200)' : 'rgb(200, 30, 30)';
"></body></html>"#;

/// A page that repaints much of itself every animation frame.
const ANIMATED: &str = r"<html><body style='margin:0;overflow:hidden'><canvas id=c></canvas><script>
const c=document.getElementById('c');c.width=innerWidth;c.height=innerHeight;const g=c.getContext('2d');let n=0;
function f(){n++;for(let i=0;i<40;i++){g.fillStyle='rgb('+((n*7+i*13)&255)+','+((n*3+i*29)&255)+','+((i*53)&255)+')';
g.fillRect((n*17+i*97)%c.width,(n*11+i*61)%c.height,120,80);}
g.fillStyle='black';g.font='28px sans-serif';g.fillText('frame '+n,40,60);requestAnimationFrame(f);}f();</script></body></html>";

/// In the viewer: clicks the middle of the picture over the data channel and resolves with the
/// milliseconds until a presented frame's middle is another colour than before the click.
const CLICK_TO_PHOTON: &str = r"(async () => {
  const v = document.getElementById('screen');
  const canvas = document.createElement('canvas');
  canvas.width = 8; canvas.height = 8;
  const g = canvas.getContext('2d', { willReadFrequently: true });
  const middle = () => { g.drawImage(v, v.videoWidth / 2 - 4, v.videoHeight / 2 - 4, 8, 8, 0, 0, 8, 8); return g.getImageData(4, 4, 1, 1).data; };
  const before = middle();
  const channel = window.corralViewer.channel;
  const t = performance.now();
  channel.send(JSON.stringify({ t: 'button', x: 0.5, y: 0.5, button: 1, down: true }));
  channel.send(JSON.stringify({ t: 'button', x: 0.5, y: 0.5, button: 1, down: false }));
  return await new Promise((resolve) => {
    const deadline = t + 5000;
    const check = (now) => {
      const c = middle();
      if (Math.abs(c[0] - before[0]) + Math.abs(c[2] - before[2]) > 150) return resolve(now - t);
      if (now > deadline) return resolve(-1);
      v.requestVideoFrameCallback(check);
    };
    v.requestVideoFrameCallback(check);
  });
})()";

/// The process whose environment names `CORRAL_WORKER_ID=<worker>` (a local worker).
fn worker_pid(worker: &str) -> Option<u32> {
    let marker = format!("CORRAL_WORKER_ID={worker}");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            environ
                .split(|b| *b == 0)
                .any(|var| var == marker.as_bytes())
                .then_some(pid)
        })
}

/// A process's CPU time so far (user and system, all its threads).
fn process_cpu(pid: u32) -> Duration {
    // USER_HZ is 100 on Linux.
    Duration::from_millis(corral_benches::load::process_jiffies(pid) * 10)
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn main() {
    let mut clicks = 10usize;
    let mut seconds = 5u64;
    let args = Args::parse(10, Duration::from_millis(1_000), |flag, value| match flag {
        "--clicks" => {
            clicks = value.parse().expect("--clicks N");
            true
        }
        "--seconds" => {
            seconds = value.parse().expect("--seconds N");
            true
        }
        _ => false,
    });
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(measure(&args, clicks, seconds));
}

async fn viewport(up: &Up, id: &str, conversation: &str) -> String {
    let (status, ticket) = up
        .client
        .post(
            &format!("/v1/browser_sessions/{id}/viewers"),
            &json!({ "actor": "bench", "conversation": conversation, "member": "viewer" }),
        )
        .await
        .expect("the API answers");
    assert_eq!(status, 200, "{ticket}");
    ticket["viewport"].as_str().expect("a viewport").to_owned()
}

async fn close(up: &Up, id: &str, conversation: &str) {
    let (status, body) = up
        .client
        .post(
            &format!("/v1/browser_sessions/{id}/close"),
            &json!({ "actor": "bench", "conversation": conversation }),
        )
        .await
        .expect("the API answers");
    assert_eq!(status, 200, "{body}");
}

#[allow(clippy::too_many_lines)]
async fn measure(args: &Args, clicks: usize, seconds: u64) {
    let state = TempDir::new("bench-live-view");
    let site = state.path().join("site");
    std::fs::create_dir_all(&site).expect("site");
    std::fs::write(site.join("toggle.html"), TOGGLE).expect("page");
    std::fs::write(site.join("animated.html"), ANIMATED).expect("page");
    let mut ns = netns::Netns::create().expect("a network namespace for the pages (root, ip)");
    let ip = ns.ns_ip.to_string();
    ns.serve_directory(&site).expect("the page server");
    let cidr = format!("{ip}/32");
    let up = Up::start(
        &args.corral,
        &state.path().join("corral"),
        &[
            ("SANDBOX_WARM_POOL_MIN", "2"),
            ("SANDBOX_EGRESS_MODE", "private_network"),
            ("SANDBOX_EGRESS_PRIVATE_CIDRS", &cidr),
            ("SANDBOX_EGRESS_ALLOWED_PORTS", "80"),
        ],
    );
    // The member's browser, started once: each session's viewport is loaded into it.
    let mut view = tokio::task::block_in_place(|| Viewer::open("about:blank", 1600, 1000));
    println!(
        "runs: {}, pause between sessions: {} ms, clicks per session: {clicks}",
        args.runs,
        args.pause.as_millis()
    );
    let mut first_frames = Vec::new();
    let mut opens = Vec::new();
    let mut photons = Vec::new();
    let toggle = format!("http://{ip}/toggle.html");
    // One session first, unmeasured: the pool's first browser start loads the programs.
    for i in 0..=args.runs {
        tokio::time::sleep(args.pause).await;
        let conversation = format!("bench-{i}");
        let asked_at = epoch_ms();
        let started = Instant::now();
        let (status, opened) = up
            .client
            .post(
                "/v1/browser_sessions",
                &json!({ "actor": "bench", "conversation": conversation, "member": "bench", "url": toggle }),
            )
            .await
            .expect("the API answers");
        let open = started.elapsed();
        assert_eq!(status, 200, "{opened}");
        let id = opened["session"].as_str().expect("a session").to_owned();
        let url = format!("{}{}", up.api, viewport(&up, &id, &conversation).await);
        let shown = tokio::task::block_in_place(|| {
            view.navigate(&url);
            view.wait_for(
                "window.corralViewer ? window.corralViewer.firstFrameAt : null",
                "the viewer's first frame",
                Duration::from_secs(20),
                Value::is_u64,
            )
        });
        let first =
            Duration::from_millis(shown.as_u64().unwrap_or_default().saturating_sub(asked_at));
        let state = tokio::task::block_in_place(|| view.eval(STATE));
        assert_eq!(state["pair"], json!(["relay", "relay"]), "{state}");
        let mut samples = Vec::new();
        for _ in 0..clicks {
            let took = tokio::task::block_in_place(|| view.eval(CLICK_TO_PHOTON));
            let took = took.as_f64().expect("a latency");
            assert!(took >= 0.0, "a click never showed");
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            samples.push(Duration::from_micros((took * 1000.0) as u64));
        }
        if i == args.runs {
            // The last session, still and watched: what its worker spends while nothing changes
            // (the adapter's thread and its WebRTC timers included).
            let worker = opened["worker"].as_str().unwrap_or_default();
            if let Some(pid) = worker_pid(worker) {
                let before = process_cpu(pid);
                let started = Instant::now();
                tokio::time::sleep(Duration::from_secs(seconds)).await;
                let spent = process_cpu(pid).saturating_sub(before);
                let frames = tokio::task::block_in_place(|| view.eval(STATE))["frames"].clone();
                println!(
                    "the worker while the watched page is still, for {seconds} s: CPU {:.1} ms ({:.3} % of one core), frames decoded so far {frames}",
                    spent.as_secs_f64() * 1000.0,
                    spent.as_secs_f64() * 100.0 / started.elapsed().as_secs_f64()
                );
            } else {
                println!("the worker's process was not found: no idle figure");
            }
        }
        close(&up, &id, &conversation).await;
        if i > 0 {
            first_frames.push(first);
            opens.push(open);
            photons.extend(samples);
        }
    }
    summary(
        "open to the viewer's first decoded frame (warm pool; relay-relay through coturn on loopback)",
        &first_frames,
    );
    summary(
        "  of which the open's answer (runtime started, first navigation)",
        &opens,
    );
    summary(
        "input to photon through TURN (data channel click, page change, frame shown)",
        &photons,
    );
    // Frames received while the page changes every animation frame.
    let conversation = "bench-animated";
    let (status, opened) = up
        .client
        .post(
            "/v1/browser_sessions",
            &json!({ "actor": "bench", "conversation": conversation, "member": "bench", "url": format!("http://{ip}/animated.html") }),
        )
        .await
        .expect("the API answers");
    assert_eq!(status, 200, "{opened}");
    let id = opened["session"].as_str().expect("a session").to_owned();
    let url = format!("{}{}", up.api, viewport(&up, &id, conversation).await);
    let frames = |view: &mut Viewer| view.eval(STATE)["frames"].as_u64().unwrap_or_default();
    let (received, width) = tokio::task::block_in_place(|| {
        view.navigate(&url);
        view.wait("frames arrive", Duration::from_secs(20), |s| {
            s["frames"].as_u64() > Some(10)
        });
        let before = frames(&mut view);
        let started = Instant::now();
        std::thread::sleep(Duration::from_secs(seconds));
        let after = frames(&mut view);
        let width = view.eval(STATE)["width"].clone();
        #[allow(clippy::cast_precision_loss)]
        let fps = (after - before) as f64 / started.elapsed().as_secs_f64();
        (fps, width)
    });
    println!(
        "frames per second received by the viewer on a page changing every animation frame ({width} px wide): {received:.1}"
    );
    close(&up, &id, conversation).await;
    drop(view);
    drop(ns);
}
