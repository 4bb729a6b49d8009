//! `corral-sim`: the deterministic simulator of Corral's allocation rules.
//!
//! `--seeds N` runs N seeds (plus every seed in `regressions.txt`), prints counts per fault kind and
//! per invariant, and ends with `seeds: N, violations: V` (exit 1 when V > 0). `--seed S` replays
//! one seed and prints its event trace. `--mutation NAME` breaks one rule on purpose: only a
//! violation of an invariant the mutation targets catches it (others are counted and reported,
//! and the seed goes on). `--require-every-check` fails a run in which some invariant was never
//! checked (CI's run: an invariant no seed exercises protects nothing).

use std::process::ExitCode;
use std::time::Instant;

mod faults;
mod rng;
mod world;

use faults::{Fault, Invariant, Stats};
use world::{SimMutation, World};

const USAGE: &str = "usage: corral-sim [--seeds N | --seed S] [--first-seed S] [--mutation NAME] [--time-budget-seconds T] [--stop-on-first] [--require-every-check] [--quiet]";

/// The usage line and every mutation's name.
fn usage() -> String {
    let names: Vec<&str> = SimMutation::all()
        .into_iter()
        .map(SimMutation::name)
        .collect();
    format!("{USAGE}\nmutations: {}", names.join(" "))
}

struct Args {
    seeds: u64,
    first_seed: u64,
    replay: Option<u64>,
    mutation: Option<SimMutation>,
    budget_seconds: Option<u64>,
    stop_on_first: bool,
    require_every_check: bool,
    quiet: bool,
}

fn parse_args(raw: &[String]) -> Result<Args, String> {
    let mut args = Args {
        seeds: 100,
        first_seed: 0,
        replay: None,
        mutation: None,
        budget_seconds: None,
        stop_on_first: false,
        require_every_check: false,
        quiet: false,
    };
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let number = |text: String, name: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("{name}: not a number: {text:?}"))
        };
        match flag.as_str() {
            "--seeds" => args.seeds = number(value("--seeds")?, "--seeds")?,
            "--first-seed" => args.first_seed = number(value("--first-seed")?, "--first-seed")?,
            "--seed" => args.replay = Some(number(value("--seed")?, "--seed")?),
            "--time-budget-seconds" => {
                args.budget_seconds = Some(number(
                    value("--time-budget-seconds")?,
                    "--time-budget-seconds",
                )?)
            }
            "--mutation" => {
                let name = value("--mutation")?;
                let found = SimMutation::all().into_iter().find(|m| m.name() == name);
                args.mutation = Some(found.ok_or_else(|| format!("unknown mutation {name:?}"))?);
            }
            "--stop-on-first" => args.stop_on_first = true,
            "--require-every-check" => args.require_every_check = true,
            "--quiet" => args.quiet = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn replay_command(seed: u64, mutation: Option<SimMutation>) -> String {
    match mutation {
        Some(m) => format!(
            "cargo run -p corral-sim --release -- --seed {seed} --mutation {}",
            m.name()
        ),
        None => format!("cargo run -p corral-sim --release -- --seed {seed}"),
    }
}

fn regressions_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions.txt")
}

/// Seeds that once failed; every run without a mutation replays them first.
fn regression_seeds() -> Vec<u64> {
    let text = std::fs::read_to_string(regressions_path()).unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split('#').next())
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn remember_failure(seed: u64) {
    if regression_seeds().contains(&seed) {
        return;
    }
    let path = regressions_path();
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    text.push_str(&format!("{seed}\n"));
    if let Err(error) = std::fs::write(&path, text) {
        eprintln!(
            "could not record seed {seed} in {}: {error}",
            path.display()
        );
    }
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&raw) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("corral-sim: {error}\n{}", usage());
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = args.replay {
        return replay(seed, args.mutation);
    }
    run_many(&args)
}

fn replay(seed: u64, mutation: Option<SimMutation>) -> ExitCode {
    let report = World::new(seed, mutation, true).run();
    for line in &report.trace {
        println!("{line}");
    }
    let violations = u64::from(report.violation.is_some());
    if let Some(v) = &report.off_target {
        println!(
            "seed {seed} violated {} at {}ms (not an invariant the mutation targets): {}",
            v.invariant.name(),
            v.at_ms,
            v.detail
        );
    }
    if let Some(v) = &report.violation {
        println!(
            "seed {seed} violated {} at {}ms: {}",
            v.invariant.name(),
            v.at_ms,
            v.detail
        );
    }
    println!(
        "steps: {}, transitions: {}",
        report.stats.steps, report.stats.transitions
    );
    println!("seeds: 1, violations: {violations}");
    if violations > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn run_many(args: &Args) -> ExitCode {
    let started = Instant::now();
    let mut total = Stats::default();
    let mut seeds_run: u64 = 0;
    let mut violating: u64 = 0;
    let mut off_target: u64 = 0;
    let mut seeds: Vec<u64> = if args.mutation.is_none() {
        regression_seeds()
    } else {
        Vec::new()
    };
    let regressions = seeds.len();
    seeds.extend(args.first_seed..args.first_seed + args.seeds);
    for (index, seed) in seeds.into_iter().enumerate() {
        if index >= regressions
            && let Some(budget) = args.budget_seconds
            && started.elapsed().as_secs() >= budget
        {
            println!("time budget of {budget}s reached after {seeds_run} seeds");
            break;
        }
        let report = World::new(seed, args.mutation, false).run();
        seeds_run += 1;
        total.absorb(&report.stats);
        if let Some(v) = &report.off_target {
            off_target += 1;
            if !args.quiet {
                println!(
                    "seed {seed} violated {} at {}ms, which the mutation does not target: {}",
                    v.invariant.name(),
                    v.at_ms,
                    v.detail
                );
            }
        }
        if let Some(v) = report.violation {
            violating += 1;
            println!(
                "seed {seed} violated {} at {}ms: {}",
                v.invariant.name(),
                v.at_ms,
                v.detail
            );
            println!("  replay: {}", replay_command(seed, args.mutation));
            if args.mutation.is_none() {
                remember_failure(seed);
            }
            if args.stop_on_first {
                break;
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    if !args.quiet {
        print_stats(&total, seeds_run, elapsed, regressions);
    }
    if let Some(mutation) = args.mutation {
        let targets: Vec<&str> = mutation.targets().iter().map(|i| i.name()).collect();
        println!(
            "mutation {} targets {}; seeds with a violation of another invariant: {off_target}",
            mutation.name(),
            targets.join(", ")
        );
    }
    let unchecked: Vec<&str> = Invariant::ALL
        .into_iter()
        .filter(|i| total.checks.get(i).copied().unwrap_or(0) == 0)
        .map(Invariant::name)
        .collect();
    let unexercised = args.require_every_check && !unchecked.is_empty();
    if unexercised {
        println!(
            "never checked in {seeds_run} seeds (each protects nothing until a seed reaches it): {}",
            unchecked.join(", ")
        );
    }
    println!("seeds: {seeds_run}, violations: {violating}");
    if violating > 0 {
        ExitCode::from(1)
    } else if unexercised {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}

fn print_stats(total: &Stats, seeds_run: u64, elapsed: f64, regressions: usize) {
    println!("faults injected:");
    for fault in Fault::ALL {
        println!(
            "  {:<26} {}",
            fault.name(),
            total.faults.get(&fault).copied().unwrap_or(0)
        );
    }
    println!("invariants checked (violations):");
    for invariant in Invariant::ALL {
        let checks = total.checks.get(&invariant).copied().unwrap_or(0);
        let violations = total.violations.get(&invariant).copied().unwrap_or(0);
        println!("  {:<26} {checks} ({violations})", invariant.name());
    }
    println!("regression seeds replayed: {regressions}");
    println!(
        "speed: {} steps in {elapsed:.2}s = {:.0} steps/s, {:.0} transitions/s, {:.1} seeds/min",
        total.steps,
        total.steps as f64 / elapsed,
        total.transitions as f64 / elapsed,
        seeds_run as f64 * 60.0 / elapsed
    );
}
