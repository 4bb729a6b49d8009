//! The streamed run's first byte (issue 31): through `POST /v1/run_code` with
//! `Accept: text/event-stream` on a `corral up` it starts, the time from the request to the first
//! `run.output` chunk of code that prints at once and then sleeps, against the time to the run's
//! full answer (`run.result`) in the same stream, and beside the same program run bare on the
//! host (`python3 -u -c`, time to its first stdout byte and to its exit). The sleep is
//! `--sleep-ms` (default 500): a stream that only flushed at the end would put its first byte
//! there.
//!
//! Runs are sequential (concurrency 1), `--pause-ms` apart. `scripts/bench-first-byte` builds and
//! runs it.
//!
//! `first_byte --corral PATH [--runs N] [--pause-ms MS] [--sleep-ms MS]`

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use corral_benches::up::{Args, Up, summary};
use corral_testkit::registries::TempDir;
use serde_json::json;

fn main() {
    let mut sleep_ms: u64 = 500;
    let args = Args::parse(20, Duration::from_millis(300), |flag, value| {
        if flag == "--sleep-ms" {
            sleep_ms = value.parse().expect("--sleep-ms MS");
            true
        } else {
            false
        }
    });
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(measure(&args, sleep_ms));
}

fn program(sleep_ms: u64) -> String {
    format!(
        "import time\nprint('ready', flush=True)\ntime.sleep({})\nprint('done')\n",
        sleep_ms as f64 / 1000.0
    )
}

/// The bare program on the host: time to its first stdout byte, and to its exit.
fn bare(sleep_ms: u64) -> (Duration, Duration) {
    let started = Instant::now();
    let mut child = Command::new("python3")
        .args(["-u", "-c", &program(sleep_ms)])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut byte = [0u8; 1];
    stdout.read_exact(&mut byte).expect("a first byte");
    let first = started.elapsed();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).expect("the rest");
    assert!(child.wait().expect("exit").success());
    (first, started.elapsed())
}

async fn measure(args: &Args, sleep_ms: u64) {
    let state = TempDir::new("bench-first-byte");
    let up = Up::start(&args.corral, state.path(), &[]);
    let request = json!({ "actor": "bench", "conversation": "first-byte", "member": "bench",
                          "language": "python", "code": program(sleep_ms) });
    let (mut first, mut full, mut bare_first, mut bare_full) = (vec![], vec![], vec![], vec![]);
    for _ in 0..args.runs {
        tokio::time::sleep(args.pause).await;
        let started = Instant::now();
        let mut events = up
            .client
            .run_code_stream(&request)
            .await
            .expect("the API answers");
        let mut first_at = None;
        while let Some(event) = events.next().await.expect("the stream reads") {
            if event.name == "run.output" && first_at.is_none() {
                assert_eq!(event.data["text"], "ready\n", "{event:?}");
                first_at = Some(started.elapsed());
            }
            if event.name == "run.result" {
                assert_eq!(event.data["body"]["outcome"], "succeeded", "{event:?}");
                full.push(started.elapsed());
            }
        }
        first.push(first_at.expect("a run.output chunk"));
        let (b_first, b_full) = bare(sleep_ms);
        bare_first.push(b_first);
        bare_full.push(b_full);
    }
    println!(
        "runs: {}, pause between runs: {} ms, the code sleeps {sleep_ms} ms after its first line",
        args.runs,
        args.pause.as_millis()
    );
    let (first_p50, _) = summary("first streamed byte", &first);
    let (full_p50, _) = summary("full answer", &full);
    let (bare_first_p50, _) = summary("bare python3 -u: first byte", &bare_first);
    let (bare_full_p50, _) = summary("bare python3 -u: exit", &bare_full);
    println!(
        "first byte / full answer: {:.2} (p50); first byte before the answer by {:.1} ms; \
         first byte - bare first byte: {:.1} ms; full answer - bare exit: {:.1} ms",
        first_p50 / full_p50,
        full_p50 - first_p50,
        first_p50 - bare_first_p50,
        full_p50 - bare_full_p50,
    );
}
