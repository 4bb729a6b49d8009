//! Load through the API: `print(1)` via `POST /v1/run_code` at concurrency 1, 8 and 32 (at 32,
//! sixteen members with two runs each in flight), beside two baselines measured in the same run,
//! each at concurrency 1 and 32: a bare `python3 -c 'print(1)'` spawn (an explicit interpreter
//! path), and the same under bubblewrap with every namespace unshared (`bwrap --unshare-all`,
//! the read-only host root, a fresh /dev, /proc and /tmp): what a sandbox that does no more than
//! unshare costs. Prints p50, p99 and runs per second for each, and the ratios the goals are
//! stated in. `scripts/bench-api` starts a stack and runs it.
//!
//! `api_load --api URL --token-file FILE [--runs N] [--python PATH] [--bwrap PATH]`

use std::time::{Duration, Instant};

use corral_api::client::Client;
use corral_benches::load::{bwrap_prefix, cpu_jiffies, wait_quiet};
use serde_json::json;

struct Figures {
    /// Share of the machine's CPU time busy during the level, in percent.
    cpu_busy: f64,
    p50: Duration,
    p99: Duration,
    per_second: f64,
    /// The API replica's writes to the pool document per run, and the share refused as
    /// contended (from its `/metrics`).
    coordination: Option<(f64, f64)>,
    /// Median of each phase the API reports in `model.durations` (microseconds or milliseconds,
    /// as named), over the runs.
    phases: Vec<(String, u64)>,
}

/// The medians of every numeric field of `durations` (and of `durations.api`).
fn phase_medians(samples: &[serde_json::Value]) -> Vec<(String, u64)> {
    let mut by_name: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for sample in samples {
        let mut fields: Vec<(String, &serde_json::Value)> = Vec::new();
        if let Some(object) = sample.as_object() {
            for (name, value) in object {
                match value.as_object() {
                    Some(inner) => {
                        fields.extend(inner.iter().map(|(n, v)| (format!("api.{n}"), v)))
                    }
                    None => fields.push((format!("worker.{name}"), value)),
                }
            }
        }
        for (name, value) in fields {
            if let Some(n) = value.as_u64() {
                by_name.entry(name).or_default().push(n);
            }
        }
    }
    by_name
        .into_iter()
        .map(|(name, mut values)| {
            values.sort_unstable();
            (name, values[values.len() / 2])
        })
        .collect()
}

fn figures(
    mut latencies: Vec<Duration>,
    elapsed: Duration,
    samples: &[serde_json::Value],
    cpu_before: (u64, u64),
) -> Figures {
    let cpu_after = cpu_jiffies();
    let busy = cpu_after.0.saturating_sub(cpu_before.0) as f64;
    let total = cpu_after.1.saturating_sub(cpu_before.1).max(1) as f64;
    latencies.sort_unstable();
    let at = |q: f64| {
        let index = ((latencies.len() as f64 - 1.0) * q).round() as usize;
        latencies.get(index).copied().unwrap_or_default()
    };
    Figures {
        cpu_busy: 100.0 * busy / total,
        p50: at(0.50),
        p99: at(0.99),
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        phases: phase_medians(samples),
        coordination: None,
    }
}

fn show(label: &str, f: &Figures) {
    println!(
        "{label:<34} p50 {:>8.2} ms   p99 {:>8.2} ms   {:>8.1} runs/s   CPU busy {:>3.0}%",
        f.p50.as_secs_f64() * 1e3,
        f.p99.as_secs_f64() * 1e3,
        f.per_second,
        f.cpu_busy
    );
    if !f.phases.is_empty() {
        let phases: Vec<String> = f.phases.iter().map(|(n, v)| format!("{n}={v}")).collect();
        println!("{:<34} medians: {}", "", phases.join(" "));
    }
    if let Some((per_run, refused)) = f.coordination {
        println!(
            "{:<34} pool-document writes per run {per_run:.2}, {refused:.0}% refused as contended",
            ""
        );
    }
}

/// Waits until no worker is resetting (the pool's gauge), then lets the workers finish preparing
/// their next jails, so that a level does not pay for the one before it.
async fn settle(client: &Client) {
    for _ in 0..600 {
        if let Ok((200, body)) = client.get("/metrics").await {
            let text = String::from_utf8_lossy(&body);
            if text
                .lines()
                .any(|l| l == "corral_pool_workers{state=\"resetting\"} 0")
            {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Preparation follows the reset report on each worker's own thread, and idle workers prepare
    // the stack (decision 0037): until the machine is quiet, a minute at most.
    let _ = wait_quiet(Duration::from_secs(60)).await;
}

/// The command of a baseline run: `python -c 'print(1)'`, under `bwrap` when one is given.
fn baseline(python: &str, bwrap: Option<&str>) -> Vec<String> {
    let mut command: Vec<String> = bwrap.map(bwrap_prefix).unwrap_or_default();
    command.extend([python.to_owned(), "-c".to_owned(), "print(1)".to_owned()]);
    command
}

/// `runs` spawns of `command` (which prints `1`), `concurrency` at a time.
async fn bare(command: &[String], runs: usize, concurrency: usize) -> Figures {
    let cpu = cpu_jiffies();
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(runs);
    let mut remaining = runs;
    while remaining > 0 {
        let batch = remaining.min(concurrency);
        let spawned: Vec<_> = (0..batch)
            .map(|_| {
                let command = command.to_vec();
                tokio::spawn(async move {
                    let t = Instant::now();
                    let out = tokio::process::Command::new(&command[0])
                        .args(&command[1..])
                        .output()
                        .await
                        .expect("the baseline runs");
                    assert_eq!(out.stdout, b"1\n", "{command:?}: {out:?}");
                    t.elapsed()
                })
            })
            .collect();
        for s in spawned {
            latencies.push(s.await.expect("spawn"));
        }
        remaining -= batch;
    }
    figures(latencies, started.elapsed(), &[], cpu)
}

/// `runs` API runs of `print(1)` with `concurrency` in flight: lane `i` is member `m{i/2}`, so at
/// 32 sixteen members each hold two leases.
async fn api(client: &Client, runs: usize, concurrency: usize) -> Figures {
    let writes_before = coordination_writes(client).await;
    let cpu = cpu_jiffies();
    let started = Instant::now();
    let lanes: Vec<_> = (0..concurrency)
        .map(|lane| {
            let client = client.clone();
            let per_lane = runs / concurrency;
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_lane);
                let mut samples = Vec::with_capacity(per_lane);
                for i in 0..per_lane {
                    let request = json!({
                        "actor": format!("load-{lane}"), "conversation": format!("c{i}"),
                        "member": format!("m{}", lane / 2), "language": "python", "code": "print(1)",
                    });
                    let t = Instant::now();
                    let (status, body) = client.run_code(&request).await.expect("the API answers");
                    latencies.push(t.elapsed());
                    assert_eq!(status, 200, "{body}");
                    assert_eq!(body["model"]["stdout"]["text"], "1\n", "{body}");
                    samples.push(body["model"]["durations"].clone());
                }
                (latencies, samples)
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(runs);
    let mut samples = Vec::with_capacity(runs);
    for lane in lanes {
        let (lane_latencies, lane_samples) = lane.await.expect("lane");
        latencies.extend(lane_latencies);
        samples.extend(lane_samples);
    }
    let mut figures = figures(latencies, started.elapsed(), &samples, cpu);
    if let (Some((written0, refused0)), Some((written1, refused1))) =
        (writes_before, coordination_writes(client).await)
    {
        let (written, refused) = (written1 - written0, refused1 - refused0);
        figures.coordination = Some((
            written / runs.max(1) as f64,
            100.0 * refused / (written + refused).max(1.0),
        ));
    }
    figures
}

/// The API replica's pool-document writes so far: (written, refused as contended).
async fn coordination_writes(client: &Client) -> Option<(f64, f64)> {
    let Ok((200, body)) = client.get("/metrics").await else {
        return None;
    };
    let text = String::from_utf8_lossy(&body);
    let value = |result: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "corral_coordination_writes_total{{result=\"{result}\"}} "
                ))
            })
            .and_then(|n| n.parse::<f64>().ok())
    };
    Some((value("written")?, value("refused")?))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (Some(api_url), Some(token_file)) = (value("--api"), value("--token-file")) else {
        eprintln!(
            "usage: api_load --api URL --token-file FILE [--runs N] [--python PATH] [--bwrap PATH]"
        );
        std::process::exit(2);
    };
    let runs: usize = value("--runs").and_then(|n| n.parse().ok()).unwrap_or(64);
    let python = value("--python").unwrap_or_else(|| String::from("/usr/bin/python3"));
    let bwrap = value("--bwrap").unwrap_or_else(|| String::from("/usr/bin/bwrap"));
    let plain = baseline(&python, None);
    let unshared = baseline(&python, Some(&bwrap));
    let token = std::fs::read_to_string(&token_file).expect("token file");
    let client = Client::new(&api_url, token.trim()).expect("client");
    // Warm-up: one run per lane of the widest level, so no level pays for first connections.
    let _ = api(&client, 32, 32).await;

    settle(&client).await;
    let bare_1 = bare(&plain, runs, 1).await;
    let bwrap_1 = bare(&unshared, runs, 1).await;
    let api_1 = api(&client, runs, 1).await;
    settle(&client).await;
    let api_8 = api(&client, runs.max(8) / 8 * 8, 8).await;
    settle(&client).await;
    let api_32 = api(&client, (runs * 2).max(32) / 32 * 32, 32).await;
    settle(&client).await;
    let bare_32 = bare(&plain, (runs * 2).max(32) / 32 * 32, 32).await;
    let bwrap_32 = bare(&unshared, (runs * 2).max(32) / 32 * 32, 32).await;
    println!(
        "cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    show("bare python3 -c 'print(1)', c=1", &bare_1);
    show("bwrap --unshare-all python3, c=1", &bwrap_1);
    show("API run_code print(1), c=1", &api_1);
    show("API run_code print(1), c=8", &api_8);
    show("API run_code print(1), c=32", &api_32);
    show("bare python3 -c 'print(1)', c=32", &bare_32);
    show("bwrap --unshare-all python3, c=32", &bwrap_32);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "ratio API/bare at c=1: p50 {:.2} (goal <= 1), p99 {:.2}; API/bwrap at c=1: p50 {:.2}, p99 {:.2}",
        ratio(api_1.p50, bare_1.p50),
        ratio(api_1.p99, bare_1.p99),
        ratio(api_1.p50, bwrap_1.p50),
        ratio(api_1.p99, bwrap_1.p99),
    );
    println!(
        "ratio API/bare at c=32: p50 {:.2}, p99 {:.2}; API/bwrap at c=32: p50 {:.2}, p99 {:.2}",
        ratio(api_32.p50, bare_32.p50),
        ratio(api_32.p99, bare_32.p99),
        ratio(api_32.p50, bwrap_32.p50),
        ratio(api_32.p99, bwrap_32.p99),
    );
    println!(
        "ratio runs/s at c=32: API/bare {:.2}, API/bwrap {:.2} (1 = limited by the machine, as a bare spawn is)",
        api_32.per_second / bare_32.per_second,
        api_32.per_second / bwrap_32.per_second
    );
}
