//! `corral-chaos`: chaos on real processes (issue 27).
//!
//! - `corral-chaos run [--seed N] [--duration SECONDS] [--faults KIND,...] [--dir DIR]
//!   [--store local|s3] [--corral PATH] [--history FILE]`: starts a deployment of the real binaries in DIR (default
//!   `/var/tmp/corral-chaos`), drives the load and injects faults for SECONDS (default 150) from
//!   the seed (default: from the clock, printed), lets the pool recover, stops everything, writes
//!   the history (default DIR.history.json), checks it and prints the report. Exit 1 on a
//!   violation; 2 when the run could not be made or left something behind. Needs root.
//! - `corral-chaos check HISTORY.json`: checks a recorded history and prints the report.
//! - `corral-chaos clean [--dir DIR]`: removes what an interrupted run left behind.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use corral_chaos::check::{Verdict, check};
use corral_chaos::deploy::{PoolSettings, StoreKind};
use corral_chaos::faults::{KINDS, kinds_for};
use corral_chaos::harness::{self, Plan};
use corral_chaos::history::History;

const USAGE: &str = "usage: corral-chaos run [--seed N] [--duration SECONDS] [--faults KIND,...] [--store local|s3] [--dir DIR] [--corral PATH] [--history FILE]
       corral-chaos check HISTORY.json
       corral-chaos clean [--dir DIR]";
const DEFAULT_DIR: &str = "/var/tmp/corral-chaos";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("check") if args.len() == 2 => return check_file(&args[1]),
        Some("run") => options(&args[1..]).and_then(run),
        Some("clean") => options(&args[1..]).map(|o| {
            let dir = o.dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
            let left = corral_chaos::hygiene::clean(&dir);
            let _ = std::fs::remove_dir_all(&dir);
            for line in &left {
                eprintln!("corral-chaos: could not remove {line}");
            }
            if left.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }),
        _ => Err(USAGE.to_owned()),
    };
    result.unwrap_or_else(|error| {
        eprintln!("corral-chaos: {error}");
        ExitCode::from(2)
    })
}

#[derive(Default)]
struct Options {
    seed: Option<u64>,
    duration: Option<u64>,
    faults: Option<Vec<String>>,
    dir: Option<PathBuf>,
    corral: Option<PathBuf>,
    history: Option<PathBuf>,
    store: Option<StoreKind>,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut options = Options::default();
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} {value:?}: not a number"))
        };
        match flag.as_str() {
            "--seed" => options.seed = Some(number()?),
            "--duration" => options.duration = Some(number()?),
            "--faults" => {
                let kinds: Vec<String> = value.split(',').map(str::to_owned).collect();
                if let Some(unknown) = kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
                    return Err(format!(
                        "--faults: no fault {unknown:?} (the faults: {})",
                        KINDS.join(", ")
                    ));
                }
                options.faults = Some(kinds);
            }
            "--dir" => options.dir = Some(PathBuf::from(value)),
            "--corral" => options.corral = Some(PathBuf::from(value)),
            "--history" => options.history = Some(PathBuf::from(value)),
            "--store" => {
                options.store = Some(match value.as_str() {
                    "local" => StoreKind::Local,
                    "s3" => StoreKind::S3,
                    other => return Err(format!("--store {other:?}: local or s3")),
                });
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(options)
}

fn run(options: Options) -> Result<ExitCode, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("a chaos run needs root (it builds jails and mounts its store)".to_owned());
    }
    let corral = options
        .corral
        .or_else(|| std::env::var_os("CORRAL").map(PathBuf::from))
        .or_else(harness::sibling_corral)
        .ok_or("no corral binary: build it (cargo build -p corral) or pass --corral PATH")?;
    if !harness::executable(&corral) {
        return Err(format!("{}: not an executable", corral.display()));
    }
    let seed = options.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            % 1_000_000_007
    });
    let dir = options.dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    let store = options.store.unwrap_or(StoreKind::Local);
    let history_path = options
        .history
        .unwrap_or_else(|| PathBuf::from(format!("{}.history.json", dir.display())));
    let plan = Plan {
        seed,
        duration: Duration::from_secs(options.duration.unwrap_or(150)),
        dir,
        corral,
        kinds: options
            .faults
            .unwrap_or_else(|| kinds_for(store).into_iter().map(str::to_owned).collect()),
        clients: (2, 2),
        writers: 2,
        browsers: 1,
        recovery: Duration::from_secs(90),
        pool: PoolSettings::default(),
        store,
    };
    println!(
        "chaos: seed {seed} (replay with --seed {seed}), {} s, faults {}",
        plan.duration.as_secs(),
        plan.kinds.join(",")
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let dir = plan.dir.clone();
    let history = runtime.block_on(async move {
        tokio::select! {
            history = harness::run(plan) => history,
            _ = tokio::signal::ctrl_c() => {
                let left = tokio::task::spawn_blocking(move || corral_chaos::hygiene::clean(&dir))
                    .await
                    .unwrap_or_default();
                Err(format!("interrupted; left behind: {left:?}"))
            }
        }
    })?;
    let json = serde_json::to_vec(&history).map_err(|e| e.to_string())?;
    std::fs::write(&history_path, json).map_err(|e| format!("{}: {e}", history_path.display()))?;
    println!("chaos: history in {}", history_path.display());
    let verdict = check(&history);
    report(&history, &verdict);
    Ok(if verdict.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn check_file(path: &str) -> ExitCode {
    let history: History = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
    {
        Ok(history) => history,
        Err(error) => {
            eprintln!("corral-chaos: {path}: {error}");
            return ExitCode::from(2);
        }
    };
    let verdict = check(&history);
    report(&history, &verdict);
    if verdict.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The report table: faults by kind, operations by answer, codes, recovery, violations.
fn report(history: &History, verdict: &Verdict) {
    print!("{verdict}");
    let summary = &verdict.summary;
    println!("seed {}", history.seed);
    println!("{:<28} {:>8}", "fault", "injected");
    for (kind, count) in &summary.faults {
        println!("{kind:<28} {count:>8}");
    }
    println!("{:<28} {:>8}", "answer", "ops");
    for (answer, count) in &summary.answers {
        println!("{answer:<28} {count:>8}");
    }
    for (code, count) in &summary.codes {
        println!("  code {code:<22} {count:>8}");
    }
    for (what, counts) in [
        ("Hashline edits", &summary.edits),
        ("installs", &summary.installs),
        ("browser sessions", &summary.sessions),
    ] {
        for (answer, count) in counts {
            println!("  of them {what:<16} {answer:<11} {count:>6}");
        }
    }
    for (what, count) in &summary.fetches {
        println!("  fetch through the egress proxy {what:<30} {count:>6}");
    }
    if !history.canary_hits.is_empty() {
        println!(
            "egress canary reached {} time(s)",
            history.canary_hits.len()
        );
    }
    match &summary.longest_recovery {
        Some((nanos, fault)) => println!(
            "longest return to the warm target after a fault: {:.1} s ({fault})",
            *nanos as f64 / 1e9
        ),
        None => println!("longest return to the warm target after a fault: none measured"),
    }
    match summary.final_recovery {
        Some(nanos) => println!(
            "after the load: warm target with nothing quarantined in {:.1} s",
            nanos as f64 / 1e9
        ),
        None => println!("after the load: never back at the warm target"),
    }
    // When the first violation became evident: the latest answer among its operations.
    let evident = verdict
        .violations
        .iter()
        .filter_map(|v| {
            v.ops
                .iter()
                .filter_map(|id| history.ops.iter().find(|op| op.id == *id))
                .map(|op| op.end_ns)
                .max()
        })
        .min();
    if let Some(at) = evident {
        println!(
            "first violation evident {:.1} s into the load",
            at as f64 / 1e9
        );
    }
    println!("violations: {}", verdict.violations.len());
}
