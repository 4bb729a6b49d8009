//! The allocation benchmark (issue: Valkey store). Starts a real valkey-server, warms a pool, then
//! measures, in the same run:
//! - a bare Valkey round trip (`PING`), p50 and p99;
//! - acquire-to-grant with a warm pool, p50 and p99, and cycles per second with three client
//!   processes on one pool (a cycle is one acquire and one release; the client also reports the
//!   paper worker's reset, a third transaction, so that the worker returns to the pool);
//! - one process with six concurrent callers, each with its own connection and then all sharing
//!   one store (group commit), as the runs of one API replica do.
//!
//! `cargo run -p corral-store --release --bin corral-pool-bench [CYCLES_PER_PROCESS]`

use std::time::{Duration, Instant};

use corral_store::ValkeyStore;
use corral_store::harness::{PaperController, bench_pool_config};
use corral_store::valkey_server::ValkeyServer;
use fred::prelude::*;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

// One thread, as each pool client has: the bare round trip is then measured the way they wait.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cycles: u32 = std::env::args().nth(1).map_or(Ok(2_000), |s| s.parse())?;
    let server = ValkeyServer::start().map_err(|e| e.0)?;
    let url = server.url();

    let client = Client::new(Config::from_url(&url)?, None, None, None);
    client.init().await?;
    let mut pings = Vec::new();
    for _ in 0..5_000 {
        let started = Instant::now();
        let _: String = client.ping(None).await?;
        pings.push(started.elapsed());
    }
    pings.sort();

    let config = bench_pool_config();
    let store = ValkeyStore::connect(&url, "test").await?;
    let mut controller = PaperController::new("img-bench");
    for _ in 0..20 {
        controller.step(&store, &config).await;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reconciler = {
        let (stop, config, url) = (stop.clone(), config.clone(), url.clone());
        tokio::spawn(async move {
            let Ok(store) = ValkeyStore::connect(&url, "test").await else {
                return;
            };
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                controller.step(&store, &config).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let (ping50, ping99) = (percentile(&pings, 0.5), percentile(&pings, 0.99));
    println!("bare valkey round trip: p50 {ping50:?}, p99 {ping99:?}");

    // The figure: three clients in three processes on one pool.
    let three = clients(&url, &["m0", "m1", "m2"], cycles, &[]).await?;
    let (grant50, grant99) = (three.percentile(0.5), three.percentile(0.99));
    println!(
        "acquire-to-grant (warm pool, 3 processes): p50 {grant50:?} ({:.1}x round trip), p99 {grant99:?} ({:.1}x)",
        grant50.as_secs_f64() / ping50.as_secs_f64(),
        grant99.as_secs_f64() / ping99.as_secs_f64()
    );
    println!(
        "3 processes: {} (one round trip = {:.0}/s)",
        three.summary(),
        1.0 / ping50.as_secs_f64()
    );
    // One replica with several callers at once (an API's runs): each with its own connection,
    // then all sharing one store, whose group commit batches what they commit at once.
    let callers = "m0,m1,m2,m3,m4,m5";
    let apart = clients(&url, &[callers], cycles / 2, &[]).await?;
    println!("1 process, 6 callers, 6 connections: {}", apart.summary());
    let shared = clients(&url, &[callers], cycles / 2, &["shared"]).await?;
    println!("1 process, 6 callers, 1 shared store: {}", shared.summary());

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = reconciler.await;
    let doc_bytes = match store.load().await {
        Ok(corral_core::store::Loaded::Found { doc, .. }) => serde_json::to_string(&doc)?.len(),
        _ => 0,
    };
    println!("the pool document is {doc_bytes} bytes");
    Ok(())
}

/// What a set of client processes saw.
#[derive(Default)]
struct Totals {
    latencies: Vec<Duration>,
    served: u64,
    refused: Vec<String>,
    attempted: u64,
    conflicted: u64,
    reads: u64,
    elapsed: Duration,
}

impl Totals {
    fn percentile(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }

    fn summary(&self) -> String {
        format!(
            "{} cycles, refused {:?}, in {:?} = {:.0} cycles/s; {} compare-and-sets ({:.2} per cycle), {:.0}% refused as contended, {} transactions began with a read",
            self.served,
            self.refused,
            self.elapsed,
            self.served as f64 / self.elapsed.as_secs_f64(),
            self.attempted,
            self.attempted as f64 / self.served.max(1) as f64,
            100.0 * self.conflicted as f64 / self.attempted.max(1) as f64,
            self.reads
        )
    }
}

/// Runs one `corral-pool-client` process per entry of `members` (each a comma-separated list of
/// members, one concurrent client each), `cycles` per client, and gathers what they printed.
async fn clients(
    url: &str,
    members: &[&str],
    cycles: u32,
    extra: &[&str],
) -> Result<Totals, Box<dyn std::error::Error>> {
    static NEXT_BASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let client_binary = std::env::current_exe()?.with_file_name("corral-pool-client");
    let started = Instant::now();
    let mut children = Vec::new();
    for group in members {
        let base = NEXT_BASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 100_000_000;
        let child = tokio::process::Command::new(&client_binary)
            .args([
                url,
                group,
                &cycles.to_string(),
                "0",
                &base.to_string(),
                "bench",
            ])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    let mut totals = Totals::default();
    for child in children {
        let output = child.wait_with_output().await?;
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            if let Some(us) = line.strip_prefix("latency_us ") {
                totals.latencies.push(Duration::from_micros(us.parse()?));
            } else if line.starts_with("lease ") {
                totals.served += 1;
            } else if let Some(code) = line.strip_prefix("refused ") {
                totals.refused.push(code.to_owned());
            } else if let Some(counts) = line.strip_prefix("writes ") {
                let counts: Vec<u64> = counts.split(' ').filter_map(|n| n.parse().ok()).collect();
                if let [a, c, r] = counts[..] {
                    totals.attempted += a;
                    totals.conflicted += c;
                    totals.reads += r;
                }
            }
        }
    }
    totals.elapsed = started.elapsed();
    totals.latencies.sort();
    Ok(totals)
}
