//! `corral-chaos`: chaos on real processes (issue 27).
//!
//! - `corral-chaos check HISTORY.json`: checks a recorded history, prints every violation with the
//!   operations involved and a summary; exit 1 on a violation.

use std::process::ExitCode;

use corral_chaos::check::{Verdict, check};
use corral_chaos::history::History;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("check") if args.len() == 2 => check_file(&args[1]),
        _ => {
            eprintln!("usage: corral-chaos check HISTORY.json");
            ExitCode::from(2)
        }
    }
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
    println!("violations: {}", verdict.violations.len());
}
