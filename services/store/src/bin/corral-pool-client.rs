//! A pool client in its own process, for the multi-process tests and the allocation benchmark:
//! `corral-pool-client URL MEMBER[,MEMBER…] CYCLES HOLD_MS TICKET_BASE [bench] [shared]` runs one
//! client per member concurrently and prints one line per lease held (`lease WORKER MEMBER START
//! END`), per grant latency (`latency_us N`), per refusal (`refused CODE`), and how its writes
//! fared (`writes SENT REFUSED READS`). Each client has its own connection, or with `shared` all
//! share one store (as the runs of one API replica do, with group commit).

use std::time::Duration;

use corral_store::ValkeyStore;
use corral_store::harness::{ClientReport, run_client};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (fixed, profile) = args.split_at(args.len().min(5));
    let [url, members, cycles, hold_ms, base] = fixed else {
        eprintln!(
            "usage: corral-pool-client URL MEMBER[,MEMBER...] CYCLES HOLD_MS TICKET_BASE [bench]"
        );
        return std::process::ExitCode::from(2);
    };
    let (Ok(cycles), Ok(hold_ms), Ok(base)) = (
        cycles.parse::<u32>(),
        hold_ms.parse::<u64>(),
        base.parse::<u64>(),
    ) else {
        eprintln!("CYCLES, HOLD_MS and TICKET_BASE are numbers");
        return std::process::ExitCode::from(2);
    };
    // Every client of one pool must apply the same rules with the same limits.
    let config = if profile.iter().any(|p| p == "bench") {
        corral_store::harness::bench_pool_config()
    } else {
        corral_store::harness::test_pool_config()
    };
    let shared = profile.iter().any(|p| p == "shared");
    let mut one: Option<ValkeyStore> = None;
    let mut stores = Vec::new();
    let mut tasks = Vec::new();
    for (index, member) in members.split(',').enumerate() {
        let store = match (&one, shared) {
            (Some(store), true) => store.clone(),
            _ => match ValkeyStore::connect(url, "test").await {
                Ok(store) => store,
                Err(error) => {
                    eprintln!("{error}");
                    return std::process::ExitCode::from(1);
                }
            },
        };
        if one.is_none() || !shared {
            stores.push(store.clone());
        }
        if shared {
            one.get_or_insert_with(|| store.clone());
        }
        let (member, config) = (member.to_string(), config.clone());
        let ticket_base = base + (index as u64) * 1_000_000;
        tasks.push(tokio::spawn(async move {
            run_client(
                &store,
                &config,
                &member,
                ticket_base,
                cycles,
                Duration::from_millis(hold_ms),
            )
            .await
        }));
    }
    for task in tasks {
        let Ok(report) = task.await else {
            return std::process::ExitCode::from(1);
        };
        print_report(&report);
    }
    for store in &stores {
        print_writes(store);
    }
    std::process::ExitCode::SUCCESS
}

/// One client's lines: each lease held, each grant's latency, each refusal.
fn print_report(report: &ClientReport) {
    for held in &report.held {
        println!(
            "lease {} {} {} {}",
            held.worker, held.member, held.start.0, held.end.0
        );
    }
    for latency in &report.grant_latencies {
        println!("latency_us {}", latency.as_micros());
    }
    for code in &report.refused {
        println!("refused {code}");
    }
}

/// How one store's writes fared: sent, refused, and its reads.
fn print_writes(store: &ValkeyStore) {
    let counts = store.write_counts();
    println!(
        "writes {} {} {}",
        counts.attempted.load(std::sync::atomic::Ordering::Relaxed),
        counts.conflicted.load(std::sync::atomic::Ordering::Relaxed),
        counts.reads.load(std::sync::atomic::Ordering::Relaxed),
    );
}
