//! A `corral up` for the end-to-end benchmarks, and the few statistics they print.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_api::client::Client;
use serde_json::{Value, json};

/// A running `corral up`, stopped with SIGTERM when dropped.
pub struct Up {
    child: Child,
    /// The caller's client.
    pub client: Client,
    /// The API's base URL (`http://host:port`).
    pub api: String,
}

impl Up {
    /// Starts `corral` (`corral up` on a free port) with its state in `state` and `env` set;
    /// returns once it says it is ready.
    ///
    /// # Panics
    /// When it does not start or never becomes ready.
    #[must_use]
    pub fn start(corral: &str, state: &Path, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(corral)
            .args(["up", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(state)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("corral up");
        let stdout = child.stdout.take().expect("stdout");
        let api = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|line| {
                line.strip_prefix("corral is ready: API ").map(|rest| {
                    rest.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned()
                })
            })
            .expect("corral up became ready");
        let token = std::fs::read_to_string(state.join("api-token")).expect("token");
        let client = Client::new(&api, token.trim()).expect("client");
        Self { child, client, api }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// The flags every end-to-end benchmark takes: `--corral PATH` (default
/// `target/release/corral`), `--runs N`, `--pause-ms MS`.
pub struct Args {
    /// The `corral` binary.
    pub corral: String,
    /// Runs per measurement.
    pub runs: usize,
    /// The pause before each run.
    pub pause: Duration,
}

impl Args {
    /// Parses this process's arguments with these defaults; a flag of its own is given to
    /// `extra` with its value, which says whether it took it.
    ///
    /// # Panics
    /// On a flag without a value, a value that does not parse, or an unknown flag.
    #[must_use]
    pub fn parse(runs: usize, pause: Duration, mut extra: impl FnMut(&str, &str) -> bool) -> Self {
        let mut args = Self {
            corral: String::from("target/release/corral"),
            runs,
            pause,
        };
        let mut rest = std::env::args().skip(1);
        while let Some(flag) = rest.next() {
            let value = rest
                .next()
                .unwrap_or_else(|| panic!("{flag} needs a value"));
            match flag.as_str() {
                "--corral" => args.corral = value,
                "--runs" => args.runs = value.parse().expect("--runs N"),
                "--pause-ms" => {
                    args.pause = Duration::from_millis(value.parse().expect("--pause-ms MS"));
                }
                other if extra(other, &value) => {}
                other => panic!("unknown flag {other}"),
            }
        }
        args
    }
}

/// The `main` of a benchmark that takes only the common flags: parses them (`runs` and `pause`
/// by default) and runs `measure(corral, runs, pause)` on a two-thread runtime.
///
/// # Panics
/// On unusable flags, or when the runtime cannot be built.
pub fn run_main<F, Fut>(runs: usize, pause: Duration, measure: F)
where
    F: FnOnce(String, usize, Duration) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Args {
        corral,
        runs,
        pause,
    } = Args::parse(runs, pause, |_, _| false);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(measure(corral, runs, pause));
}

/// The median of `samples`.
///
/// # Panics
/// With no samples.
#[must_use]
pub fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[(samples.len() - 1) / 2]
}

/// The `q` quantile of `samples` (nearest rank).
///
/// # Panics
/// With no samples.
#[must_use]
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Prints `what`'s p50 and p95 in milliseconds, and returns them.
///
/// # Panics
/// With no samples.
pub fn summary(what: &str, samples: &[Duration]) -> (f64, f64) {
    let (p50, p95) = (ms(quantile(samples, 0.5)), ms(quantile(samples, 0.95)));
    println!(
        "{what}: p50 {p50:.1} ms, p95 {p95:.1} ms over {}",
        samples.len()
    );
    (p50, p95)
}

/// Milliseconds, for printing.
#[must_use]
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

/// `runs` runs of `request`, sequential, with `pause` before each: the latencies, how many ran
/// warm, and the model of the last one. Every run must succeed.
///
/// # Panics
/// When the API does not answer or a run does not succeed.
pub async fn through_api(
    client: &Client,
    request: &Value,
    runs: usize,
    pause: Duration,
) -> (Vec<Duration>, usize, Value) {
    let mut latencies = Vec::new();
    let mut warm = 0;
    let mut last = Value::Null;
    for _ in 0..runs {
        tokio::time::sleep(pause).await;
        let started = Instant::now();
        let (status, body) = client.run_code(request).await.expect("the API answers");
        latencies.push(started.elapsed());
        assert_eq!(
            (status, &body["outcome"]),
            (200, &json!("succeeded")),
            "{body:#}"
        );
        if body["model"]["warm"] == true {
            warm += 1;
        }
        last = body["model"].clone();
    }
    (latencies, warm, last)
}
