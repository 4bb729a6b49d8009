//! The allocation benchmark (issue: Valkey store). Starts a real valkey-server, warms a pool, then
//! measures, in the same run:
//! - a bare Valkey round trip (`PING`), p50 and p99;
//! - acquire-to-grant with a warm pool, p50 and p99, and cycles per second with three client
//!   processes on one pool (a cycle is one acquire and one release; the client also reports the
//!   paper worker's reset, a third transaction, so that the worker returns to the pool).
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
    let client_binary = std::env::current_exe()?.with_file_name("corral-pool-client");
    let started = Instant::now();
    let mut children = Vec::new();
    for process in 0..3u64 {
        let child = tokio::process::Command::new(&client_binary)
            .args([
                url.as_str(),
                &format!("m{process}"),
                &cycles.to_string(),
                "0",
                &((process + 1) * 100_000_000).to_string(),
                "bench",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    let mut latencies = Vec::new();
    let mut served = 0u64;
    let mut refused = 0u64;
    let (mut attempted, mut conflicted, mut reads) = (0u64, 0u64, 0u64);
    for child in children {
        let output = child.wait_with_output().await?;
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            if let Some(us) = line.strip_prefix("latency_us ") {
                latencies.push(Duration::from_micros(us.parse()?));
            } else if line.starts_with("lease ") {
                served += 1;
            } else if line.starts_with("refused ") {
                refused += 1;
            } else if let Some(counts) = line.strip_prefix("writes ") {
                let counts: Vec<u64> = counts.split(' ').filter_map(|n| n.parse().ok()).collect();
                if let [a, c, r] = counts[..] {
                    (attempted, conflicted, reads) = (attempted + a, conflicted + c, reads + r);
                }
            }
        }
    }
    let elapsed = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = reconciler.await;
    latencies.sort();
    let doc_bytes = match store.load().await {
        Ok(corral_core::store::Loaded::Found { doc, .. }) => serde_json::to_string(&doc)?.len(),
        _ => 0,
    };
    let (ping50, ping99) = (percentile(&pings, 0.5), percentile(&pings, 0.99));
    let (grant50, grant99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    println!("bare valkey round trip: p50 {ping50:?}, p99 {ping99:?}");
    println!(
        "acquire-to-grant (warm pool, 3 processes): p50 {grant50:?} ({:.1}x round trip), p99 {grant99:?} ({:.1}x)",
        grant50.as_secs_f64() / ping50.as_secs_f64(),
        grant99.as_secs_f64() / ping99.as_secs_f64()
    );
    let per_second = served as f64 / elapsed.as_secs_f64();
    println!(
        "cycles: {served} served, {refused} refused, in {elapsed:?} = {per_second:.0} cycles/s (one round trip = {:.0}/s)",
        1.0 / ping50.as_secs_f64()
    );
    println!(
        "compare-and-sets: {attempted} sent, {conflicted} refused ({:.0}%), {reads} transactions began with a read; the document is {doc_bytes} bytes",
        100.0 * conflicted as f64 / attempted.max(1) as f64
    );
    Ok(())
}
