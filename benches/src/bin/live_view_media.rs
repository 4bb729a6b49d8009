//! The live view's media pipeline (issue 18, BROW-5, BROW-11), in one run: Xvfb at a new
//! session's 1600x1000 with the same headed Chromium the sessions use showing a page that
//! changes every animation frame, captured when Damage says it changed, converted to I420 and
//! encoded with OpenH264 at the bitrate corral-core derives. Reports frames per second, each
//! stage's time per frame (one thread, so wall time is that thread's CPU), bits per pixel per
//! frame, and the pipeline's CPU while the screen does not change (Chromium gone, the display
//! still).
//!
//! Not yet measured here: open to the viewer's first decoded frame and input to photon, which
//! need the WebRTC side. `live_view_media [--seconds N]`; needs Debian's xvfb and chromium.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_core::browser::media::{Capture, FRAME_RATE};
use corral_media::FrameTimes;
use corral_media::capture::Display;
use corral_media::encode::H264;
use corral_media::xvfb::Xvfb;
use nix::sys::resource::{UsageWho, getrusage};

// No `#` or `%` in it: a data URL would end at the one and decode the other.
const PAGE: &str = "data:text/html,<html><body style='margin:0;overflow:hidden'><canvas id=c></canvas><script>\
const c=document.getElementById('c');c.width=innerWidth;c.height=innerHeight;const g=c.getContext('2d');let n=0;\
function f(){n++;for(let i=0;i<40;i++){g.fillStyle='rgb('+((n*7+i*13)&255)+','+((n*3+i*29)&255)+','+((i*53)&255)+')';\
g.fillRect((n*17+i*97)-c.width*Math.floor((n*17+i*97)/c.width),(n*11+i*61)-c.height*Math.floor((n*11+i*61)/c.height),120,80);}\
g.fillStyle='black';g.font='28px sans-serif';g.fillText('frame '+n,40,60);requestAnimationFrame(f);}f();</script></body></html>";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cpu() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let time = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or_default())
            + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or_default())
    };
    time(usage.user_time()) + time(usage.system_time())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let seconds: u64 = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .map_or(10, |s| s.parse().expect("--seconds N"));
    let capture = Capture::NEW_SESSION;
    let xvfb = Xvfb::start(capture).expect("Xvfb (scripts/setup-services)");
    let name = xvfb.display.clone();
    let profile = std::env::temp_dir().join(format!("corral-media-bench-{}", std::process::id()));
    let chromium = Killed(
        Command::new(corral_worker::RUNTIME_PROGRAMS[0].1)
            .args([
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-proxy-server",
                "--kiosk",
                "--window-position=0,0",
                &format!("--window-size={},{}", capture.width, capture.height),
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(PAGE)
            .env("DISPLAY", &name)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium"),
    );
    let mut display = Display::connect(&name).expect("the display");
    let mut encoder = H264::new(capture, FRAME_RATE).expect("the encoder");
    // Let the page start drawing before measuring.
    let warm = Instant::now() + Duration::from_secs(3);
    while Instant::now() < warm {
        if display
            .wait_change(Duration::from_millis(100))
            .expect("wait")
        {
            let pixels = display.grab().expect("grab");
            let _ = encoder.encode(&pixels, false, &mut FrameTimes::default());
        }
    }
    println!(
        "capture {}x{} ({}), target {} fps, bitrate {} bit/s (derived); changing page for {seconds} s",
        capture.width,
        capture.height,
        if display.shared_memory() {
            "shared memory"
        } else {
            "through the socket"
        },
        FRAME_RATE,
        encoder.bitrate
    );
    let period = Duration::from_secs(1) / FRAME_RATE;
    let (mut frames, mut skipped, mut bytes) = (0u64, 0u64, 0u64);
    let mut total = FrameTimes::default();
    let began = Instant::now();
    let cpu_began = cpu();
    let mut next = began;
    while began.elapsed() < Duration::from_secs(seconds) {
        // At most the target frame rate: a change is taken at the next frame time.
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
        }
        next += period;
        if !display.wait_change(period).expect("wait") {
            continue;
        }
        let mut times = FrameTimes::default();
        let grabbed = Instant::now();
        let pixels = display.grab().expect("grab");
        times.capture = grabbed.elapsed();
        let encoded = encoder
            .encode(&pixels, frames == 0, &mut times)
            .expect("encode");
        if encoded.data.is_empty() {
            skipped += 1;
        } else {
            frames += 1;
            bytes += encoded.data.len() as u64;
        }
        total.capture += times.capture;
        total.convert += times.convert;
        total.encode += times.encode;
    }
    let wall = began.elapsed();
    let busy = cpu() - cpu_began;
    let n = (frames + skipped).max(1);
    #[allow(clippy::cast_precision_loss)]
    let (fps, per) = (frames as f64 / wall.as_secs_f64(), n as f64);
    #[allow(clippy::cast_precision_loss)]
    let bpp = bytes as f64 * 8.0 / (frames.max(1) as f64 * capture.pixels() as f64);
    println!("frames per second: {fps:.1} ({frames} sent, {skipped} dropped by rate control)");
    println!(
        "per frame: capture {:.2} ms, conversion {:.2} ms, encode {:.2} ms; process CPU {:.1} % of one core",
        ms(total.capture) / per,
        ms(total.convert) / per,
        ms(total.encode) / per,
        100.0 * busy.as_secs_f64() / wall.as_secs_f64()
    );
    println!(
        "bits per pixel per frame: {bpp:.4} (target {:.4})",
        f64::from(encoder.bitrate) / (f64::from(FRAME_RATE) * capture.pixels() as f64)
    );
    // Idle: the page gone, nothing draws; the pipeline waits on Damage.
    drop(chromium);
    while display
        .wait_change(Duration::from_millis(500))
        .expect("wait")
    {
        let _ = display.grab().expect("grab");
    }
    let idle_began = Instant::now();
    let idle_cpu = cpu();
    let mut idle_frames = 0;
    while idle_began.elapsed() < Duration::from_secs(5) {
        if display
            .wait_change(Duration::from_millis(200))
            .expect("wait")
        {
            let pixels = display.grab().expect("grab");
            let _ = encoder.encode(&pixels, false, &mut FrameTimes::default());
            idle_frames += 1;
        }
    }
    let idle = cpu() - idle_cpu;
    println!(
        "idle (nothing changes) for 5 s: {idle_frames} frames, CPU {:.2} ms ({:.3} % of one core)",
        ms(idle),
        100.0 * idle.as_secs_f64() / idle_began.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&profile);
}
