//! A burst through the API (issue 29): N concurrent `run_code` calls at once, each from a fresh
//! actor, conversation and member, against a running deployment, beside the same N as bare
//! interpreter spawns and as `bwrap --unshare-all` spawns, all in the same run. For each it prints
//! p50, p95, p99 and max of request to answer and of request to the first statement of the code
//! (the code's first statement reads the wall clock, which the jail shares with the host), the
//! throughput, every answer's outcome (a `queue_full` refusal and whether it carried
//! `Retry-After`), CPU seconds per run split by process (with `--stack-pid`: the API and
//! controller, the worker supervisors, the jails and the code they reaped, Valkey, the egress
//! proxy), counted from the burst's start until every worker is warm again and the machine quiet
//! (a run's reset and the next jail's preparation come after its answer; the burst's window alone
//! is shown beside it), and the pool's workers before and after. The bwrap baseline's CPU is the
//! machine's until it is quiet again, so that the floor a fresh interpreter in fresh namespaces
//! sets is measured the way the API's runs are.
//!
//! `--serial K` (default 20; 0: none) also runs K `print` runs and K pandas runs one at a time,
//! each beside its bare interpreter, before the burst and again after it once the machine is
//! quiet (and after `--pause-seconds P` first, default 0): the ratios before and after a burst,
//! on the pool the burst grew. Then K `print` runs back to back, each sent as the last answers,
//! beside K bare spawns back to back: a client that loops on the API leaves the pool no time
//! between runs, and meets the machine's CPU per run.
//!
//! `--mixed` sends what an agent platform sends, interleaved: `print` runs, runs that import
//! pandas, numpy and matplotlib, and Node runs, each kind beside its own bare interpreter.
//!
//! `--rounds R` (default 1, at most 10) sends the burst R times, each after the last has answered
//! and the machine is quiet again: an agent platform's next turns, on the pool the first grew,
//! each worker's next jail as its last run left it (decision 0058's routing is what the later
//! rounds measure). Each round is reported, and its ratios are to the same bare burst.
//!
//! The harness refuses a target other than loopback, sends at most 1,000 requests, and stops by
//! itself at its deadline (default 300 s), reporting what had answered by then.
//! `scripts/bench-burst` starts a stack with the default pool and one pre-scaled to N and runs it
//! against each.
//!
//! `burst --api URL --token-file FILE [--requests N] [--mixed] [--rounds R] [--serial K] [--pause-seconds P]
//!  [--stack-pid PID]
//!  [--label TEXT] [--deadline-seconds S] [--python PATH] [--stack-python PATH] [--node PATH]
//!  [--bwrap PATH]`

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use corral_api::client::Client;
use corral_benches::load::{bwrap_prefix, wait_quiet};
use serde_json::json;

/// The most requests one burst sends.
const REQUESTS_MAX: usize = 1_000;
/// The longest deadline a burst may be given.
const DEADLINE_MAX: Duration = Duration::from_secs(600);
/// The most rounds of the burst one run sends.
const ROUNDS_MAX: usize = 10;

/// What a run does; each kind's code reads the wall clock first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    Print,
    Pandas,
    Node,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Print => "print",
            Self::Pandas => "pandas",
            Self::Node => "node",
        }
    }

    fn language(self) -> &'static str {
        match self {
            Self::Print | Self::Pandas => "python",
            Self::Node => "node",
        }
    }

    /// The code: its first statement prints the wall clock in seconds, as the first line.
    fn code(self) -> &'static str {
        match self {
            Self::Print => "import time\nprint(time.time())\n",
            Self::Pandas => {
                "import time\nt = time.time()\nimport pandas, numpy, matplotlib\nprint(t)\n"
            }
            Self::Node => "console.log(Date.now() / 1000)\n",
        }
    }

    /// The kind of request `index` of a burst.
    fn of(index: usize, mixed: bool) -> Self {
        if !mixed {
            return Self::Print;
        }
        [Self::Print, Self::Pandas, Self::Node][index % 3]
    }
}

/// One answer.
struct Sample {
    kind: Kind,
    answered: Duration,
    /// From the request to the code's first statement, when the code ran and said so.
    first_statement: Option<Duration>,
    /// `ok`, or the refusal's code (`queue_full`, ...), or `status NNN`.
    outcome: String,
    retry_after: bool,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// From `sent` (seconds since the epoch) to the time the code printed first, if it printed one.
fn first_statement(sent: f64, stdout: &str) -> Option<Duration> {
    let at: f64 = stdout.lines().next()?.trim().parse().ok()?;
    Some(Duration::from_secs_f64((at - sent).max(0.0)))
}

/// The burst through the API: every request sent at once, answers collected until `deadline`.
async fn api_burst(
    client: &Client,
    requests: usize,
    mixed: bool,
    tag: &str,
    deadline: Duration,
) -> (Vec<Sample>, Duration) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..requests)
        .map(|index| {
            let client = client.clone();
            let kind = Kind::of(index, mixed);
            let request = json!({
                "actor": format!("burst-{tag}-{index}"),
                "conversation": format!("c-{index}"),
                "member": format!("m-{index}"),
                "language": kind.language(),
                "code": kind.code(),
            });
            tokio::spawn(async move {
                let sent = unix_now();
                let t = Instant::now();
                let answer = client.run_code_retry_after(&request).await;
                let answered = t.elapsed();
                let (outcome, first, retry_after) = match answer {
                    Ok((200, body, _)) => {
                        let stdout = body["model"]["stdout"]["text"].as_str().unwrap_or("");
                        let outcome = body["member"]["outcome"]
                            .as_str()
                            .map_or("ok", |o| if o == "succeeded" { "ok" } else { o })
                            .to_owned();
                        (outcome, first_statement(sent, stdout), false)
                    }
                    Ok((status, body, retry_after)) => {
                        let code = body["error"]
                            .as_str()
                            .map_or_else(|| format!("status {status}"), str::to_owned);
                        (code, None, retry_after.is_some())
                    }
                    Err(e) => (format!("unanswered ({e})"), None, false),
                };
                Sample {
                    kind,
                    answered,
                    first_statement: first,
                    outcome,
                    retry_after,
                }
            })
        })
        .collect();
    let mut samples = Vec::with_capacity(requests);
    let until = tokio::time::Instant::now() + deadline;
    for task in tasks {
        match tokio::time::timeout_at(until, task).await {
            Ok(Ok(sample)) => samples.push(sample),
            Ok(Err(e)) => eprintln!("burst: a request's task failed: {e}"),
            Err(_) => {
                eprintln!("burst: the deadline passed; reporting what had answered");
                break;
            }
        }
    }
    (samples, started.elapsed())
}

/// The interpreter command of a bare spawn of `kind`.
fn bare_command(kind: Kind, paths: &Paths, bwrap: bool) -> Vec<String> {
    let mut command: Vec<String> = if bwrap {
        bwrap_prefix(&paths.bwrap)
    } else {
        Vec::new()
    };
    let (program, flag) = match kind {
        Kind::Print => (&paths.python, "-c"),
        Kind::Pandas => (&paths.stack_python, "-c"),
        Kind::Node => (&paths.node, "-e"),
    };
    command.extend([program.clone(), flag.to_owned(), kind.code().to_owned()]);
    command
}

/// The same burst as bare spawns (under bwrap when `bwrap`), every one started at once.
async fn bare_burst(requests: usize, mixed: bool, paths: &Paths, bwrap: bool) -> Vec<Sample> {
    let tasks: Vec<_> = (0..requests)
        .map(|index| {
            let kind = Kind::of(index, mixed);
            let command = bare_command(kind, paths, bwrap);
            tokio::spawn(async move {
                let sent = unix_now();
                let t = Instant::now();
                let out = tokio::process::Command::new(&command[0])
                    .args(&command[1..])
                    .output()
                    .await;
                let answered = t.elapsed();
                let (outcome, first) = match out {
                    Ok(out) if out.status.success() => (
                        "ok".to_owned(),
                        first_statement(sent, &String::from_utf8_lossy(&out.stdout)),
                    ),
                    Ok(out) => (format!("exit {:?}", out.status.code()), None),
                    Err(e) => (format!("spawn failed ({e})"), None),
                };
                Sample {
                    kind,
                    answered,
                    first_statement: first,
                    outcome,
                    retry_after: false,
                }
            })
        })
        .collect();
    let mut samples = Vec::with_capacity(requests);
    for task in tasks {
        if let Ok(sample) = task.await {
            samples.push(sample);
        }
    }
    samples
}

/// One run of `kind` through the API, named by `index` and `tag`: its time to the answer, if it
/// succeeded.
async fn api_once(client: &Client, kind: Kind, tag: &str, index: usize) -> Option<Duration> {
    let request = json!({
        "actor": format!("serial-{tag}-{}-{index}", kind.name()),
        "conversation": "c",
        "member": "m",
        "language": kind.language(),
        "code": kind.code(),
    });
    let t = Instant::now();
    match client.run_code_retry_after(&request).await {
        Ok((200, body, _)) if body["member"]["outcome"] == "succeeded" => Some(t.elapsed()),
        _ => None,
    }
}

/// One bare spawn of `command`: its time to its exit, if it succeeded.
async fn bare_once(command: &[String]) -> Option<Duration> {
    let t = Instant::now();
    match tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .output()
        .await
    {
        Ok(out) if out.status.success() => Some(t.elapsed()),
        _ => None,
    }
}

/// `count` runs of `kind` one after another through the API, and as bare spawns interleaved with
/// them (one of each in turn); the p50 of each, in milliseconds.
async fn serial(
    client: &Client,
    kind: Kind,
    count: usize,
    tag: &str,
    paths: &Paths,
) -> (Option<f64>, Option<f64>) {
    let mut api = Vec::with_capacity(count);
    let mut bare = Vec::with_capacity(count);
    let command = bare_command(kind, paths, false);
    for index in 0..count {
        api.extend(api_once(client, kind, tag, index).await);
        bare.extend(bare_once(&command).await);
    }
    let p50 = |values: Vec<Duration>| quantiles(values).map(|[p50, ..]| p50);
    (p50(api), p50(bare))
}

/// `count` `print` runs through the API back to back (each sent as the last answers, nothing
/// between them), then `count` bare spawns back to back: what a client that loops on the API
/// meets. Between runs sent back to back the pool has no time of its own to reset a worker and
/// prepare its next jail, so the rate is bounded by the machine's CPU per run and its cores, where
/// the interleaved measure leaves a bare spawn's time between runs. Prints the p50 of each, their
/// ratio and each rate.
async fn show_back_to_back(client: &Client, count: usize, tag: &str, paths: &Paths, when: &str) {
    let mut api = Vec::with_capacity(count);
    let started = Instant::now();
    for index in 0..count {
        api.extend(api_once(client, Kind::Print, &format!("{tag}-b2b"), index).await);
    }
    let api_rate = api.len() as f64 / started.elapsed().as_secs_f64();
    let command = bare_command(Kind::Print, paths, false);
    let mut bare = Vec::with_capacity(count);
    let started = Instant::now();
    for _ in 0..count {
        bare.extend(bare_once(&command).await);
    }
    let bare_rate = bare.len() as f64 / started.elapsed().as_secs_f64();
    let complete = api.len() == count && bare.len() == count;
    match (complete, quantiles(api), quantiles(bare)) {
        (true, Some([api, ..]), Some([bare, ..])) => println!(
            "serial [print] back to back {when}, {count} runs: p50 API {api:.1} ms ({api_rate:.1} runs/s), \
             bare {bare:.1} ms ({bare_rate:.1} runs/s), ratio {:.2}",
            api / bare
        ),
        _ => println!("serial [print] back to back {when}: not every run succeeded"),
    }
}

/// Prints `count` serial pandas runs, then `count` serial print runs (the pandas runs first, so
/// that the print runs cannot have taken the jails the pandas runs would find), each beside its
/// bare interpreter, and their ratios. Between the two, and after them, it waits (at most
/// `quiet_limit`) until the machine is quiet: each pandas run's worker prepares its next jail
/// with the stack, a core-second each, and the print runs (or the burst) measured meanwhile
/// measured those preparations, not the pool (a print ratio of 1.1 to 1.7 after 20 pandas runs on
/// a pool of 24 workers, 0.6 to 0.7 once they were done).
async fn show_serial(
    client: &Client,
    count: usize,
    tag: &str,
    paths: &Paths,
    when: &str,
    quiet_limit: Duration,
) {
    for kind in [Kind::Pandas, Kind::Print] {
        let (api, bare) = serial(client, kind, count, tag, paths).await;
        match (api, bare) {
            (Some(api), Some(bare)) => println!(
                "serial [{}] {when}, {count} runs: p50 API {api:.1} ms, bare {bare:.1} ms, ratio {:.2}",
                kind.name(),
                api / bare
            ),
            _ => println!("serial [{}] {when}: not every run succeeded", kind.name()),
        }
        quiet_again(quiet_limit).await;
    }
    show_back_to_back(client, count, tag, paths, when).await;
    quiet_again(quiet_limit).await;
}

/// Waits (at most `limit`) until the machine is quiet, and says how long it waited.
async fn quiet_again(limit: Duration) {
    let (waited, quiet) = wait_quiet(limit).await;
    println!(
        "  then waited {:.1} s for the machine to be quiet{}",
        waited.as_secs_f64(),
        if quiet { "" } else { " (it never was)" }
    );
}

/// p50, p95, p99 and max of `values`, in milliseconds.
fn quantiles(mut values: Vec<Duration>) -> Option<[f64; 4]> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let at = |q: f64| {
        let index = ((values.len() as f64 - 1.0) * q).round() as usize;
        values[index.min(values.len() - 1)].as_secs_f64() * 1e3
    };
    Some([at(0.50), at(0.95), at(0.99), at(1.0)])
}

fn show_quantiles(label: &str, q: Option<[f64; 4]>) -> String {
    match q {
        Some([p50, p95, p99, max]) => {
            format!("{label} p50 {p50:>8.1}  p95 {p95:>8.1}  p99 {p99:>8.1}  max {max:>8.1} ms")
        }
        None => format!("{label} (none)"),
    }
}

/// Prints a burst's figures, per kind when mixed; returns each kind's answer p50 (ms).
fn report(name: &str, samples: &[Sample], elapsed: Option<Duration>) -> BTreeMap<Kind, f64> {
    let mut kinds: Vec<Kind> = samples.iter().map(|s| s.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let mut p50s = BTreeMap::new();
    for kind in kinds {
        let of_kind: Vec<&Sample> = samples.iter().filter(|s| s.kind == kind).collect();
        let ok: Vec<&&Sample> = of_kind.iter().filter(|s| s.outcome == "ok").collect();
        let answered = quantiles(ok.iter().map(|s| s.answered).collect());
        let first = quantiles(ok.iter().filter_map(|s| s.first_statement).collect());
        if let Some([p50, ..]) = answered {
            p50s.insert(kind, p50);
        }
        println!("{name} [{}], {} sent", kind.name(), of_kind.len());
        println!("  {}", show_quantiles("answer         ", answered));
        println!("  {}", show_quantiles("first statement", first));
    }
    let mut outcomes: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for sample in samples {
        let entry = outcomes.entry(sample.outcome.as_str()).or_default();
        entry.0 += 1;
        entry.1 += usize::from(sample.retry_after);
    }
    let outcomes: Vec<String> = outcomes
        .iter()
        .map(|(outcome, (count, retry))| {
            if *retry > 0 {
                format!("{outcome} {count} (Retry-After on {retry})")
            } else {
                format!("{outcome} {count}")
            }
        })
        .collect();
    println!("  outcomes: {}", outcomes.join(", "));
    if let Some(elapsed) = elapsed {
        let ok = samples.iter().filter(|s| s.outcome == "ok").count();
        println!(
            "  throughput {:.1} runs/s ({ok} in {:.2} s)",
            ok as f64 / elapsed.as_secs_f64(),
            elapsed.as_secs_f64()
        );
    }
    p50s
}

/// Clock ticks per second of /proc's CPU times.
fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// A process's parent, command line, own CPU ticks and its reaped children's, from /proc.
fn process(pid: u32) -> Option<(u32, String, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // After the command: state (0), ppid (1), ..., utime (11), stime (12), cutime (13), cstime (14).
    let parent = u32::try_from(number(1)?).ok()?;
    let own = number(11)? + number(12)?;
    let reaped = number(13)? + number(14)?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some((
        parent,
        String::from_utf8_lossy(&cmdline).replace('\0', " "),
        own,
        reaped,
    ))
}

/// The CPU spent so far: the whole machine's busy ticks, this harness's own, and those of the
/// stack's long-lived processes under `root` by part. A jail's processes are not read one by one:
/// a killed jail's interpreter is reaped by the kernel, not by a parent that would add its ticks
/// to its own, so its ticks vanish from every process's count; the machine's count keeps them
/// (the machine is quiet before a burst, and this harness's ticks are taken off).
struct Cpu {
    machine: u64,
    harness: u64,
    parts: BTreeMap<&'static str, u64>,
    /// The own ticks of the stack's other live processes (its workers' jails, a re-preparation's
    /// interpreter among them): what the stack did while a baseline ran beside it.
    jails: u64,
}

fn stack_cpu(root: Option<u32>) -> Cpu {
    let mut all = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            if let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok())
                && let Some(found) = process(pid)
            {
                all.insert(pid, found);
            }
        }
    }
    let under_root = |mut pid: u32| {
        for _ in 0..16 {
            if Some(pid) == root {
                return true;
            }
            match all.get(&pid) {
                Some((parent, ..)) if *parent > 1 => pid = *parent,
                _ => return false,
            }
        }
        false
    };
    let mut parts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut jails = 0;
    for (pid, (_, cmdline, own, reaped)) in &all {
        if !under_root(*pid) {
            continue;
        }
        let mut add = |part, ticks| *parts.entry(part).or_default() += ticks;
        if Some(*pid) == root {
            add("API and controller", *own);
        } else if cmdline.contains("worker serve") {
            add("worker supervisors", *own);
        } else if cmdline.contains("valkey-server") {
            add("Valkey", *own + *reaped);
        } else if cmdline.contains("egress-proxy") {
            add("egress proxy", *own + *reaped);
        } else {
            jails += *own;
        }
    }
    Cpu {
        machine: corral_benches::load::cpu_jiffies().0,
        harness: process(std::process::id()).map_or(0, |(_, _, own, _)| own),
        parts,
        jails,
    }
}

impl Cpu {
    /// Milliseconds per run spent from `self` to `until`, in total and by part; the jails, their
    /// code and whatever else the machine did are the rest.
    fn per_run(&self, until: &Cpu, ticks: f64, runs: f64) -> (f64, String) {
        let ms = |spent: u64| spent as f64 / ticks / runs * 1e3;
        let spent = self.spent_by_part(until);
        let named = spent.iter().map(|(_, ticks)| ticks).sum();
        let mut parts: Vec<String> = spent
            .iter()
            .map(|(part, ticks)| format!("{part} {:.1}", ms(*ticks)))
            .collect();
        let rest = self.rest(until, named);
        parts.push(format!("jails, code and the rest {:.1}", ms(rest)));
        (ms(named + rest), parts.join(", "))
    }

    /// Each part's ticks from `self` to `until`.
    fn spent_by_part(&self, until: &Cpu) -> Vec<(&'static str, u64)> {
        until
            .parts
            .iter()
            .map(|(part, ticks)| {
                let before = self.parts.get(part).copied().unwrap_or(0);
                (*part, ticks.saturating_sub(before))
            })
            .collect()
    }

    /// The machine's busy ticks from `self` to `until`, less this harness's and `named`.
    fn rest(&self, until: &Cpu, named: u64) -> u64 {
        let machine = until.machine.saturating_sub(self.machine);
        let harness = until.harness.saturating_sub(self.harness);
        machine.saturating_sub(harness).saturating_sub(named)
    }

    /// Milliseconds per run of what the machine spent from `self` to `until` beyond this harness
    /// and the stack (its long-lived processes and its live jails): a baseline's spawns, while the
    /// stack stands beside them.
    fn beside_stack_per_run(&self, until: &Cpu, ticks: f64, runs: f64) -> f64 {
        let named: u64 = self
            .spent_by_part(until)
            .iter()
            .map(|(_, t)| t)
            .sum::<u64>()
            + until.jails.saturating_sub(self.jails);
        self.rest(until, named) as f64 / ticks / runs * 1e3
    }
}

/// CPU ticks of the children this process has reaped (the bare spawns).
fn own_children_cpu() -> u64 {
    process(std::process::id()).map_or(0, |(_, _, _, reaped)| reaped)
}

/// The pool's workers by state, from the API's `/metrics`.
async fn pool(client: &Client) -> String {
    let Ok((200, body)) = client.get("/metrics").await else {
        return "unknown".to_owned();
    };
    let text = String::from_utf8_lossy(&body);
    let states: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("corral_pool_workers{state=\""))
        .filter_map(|l| l.split_once("\"} "))
        .filter(|(_, n)| *n != "0")
        .map(|(state, n)| format!("{state} {n}"))
        .collect();
    states.join(", ")
}

/// Waits, until `deadline`, for every worker to be warm again (none creating, leased or
/// resetting) and then for the machine to be quiet (the next jails prepared); how long it took.
async fn settle(client: &Client, deadline: Duration) -> Duration {
    let started = Instant::now();
    while started.elapsed() < deadline {
        let states = pool(client).await;
        let busy = ["creating", "leased", "resetting"]
            .iter()
            .any(|state| states.contains(state));
        if !busy {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _quiet = wait_quiet(deadline.saturating_sub(started.elapsed())).await;
    started.elapsed()
}

struct Paths {
    python: String,
    stack_python: String,
    node: String,
    bwrap: String,
}

/// Whether `url` (`http://HOST:PORT`) names this machine's loopback.
fn loopback(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
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
    let usage = "usage: burst --api URL --token-file FILE [--requests N] [--mixed] [--rounds R] \
                 [--serial K] [--pause-seconds P] [--stack-pid PID] [--label TEXT] [--deadline-seconds S] \
                 [--python PATH] [--stack-python PATH] [--node PATH] [--bwrap PATH]";
    let (Some(api_url), Some(token_file)) = (value("--api"), value("--token-file")) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    if !loopback(&api_url) {
        eprintln!("burst: {api_url} is not this machine's loopback; the harness loads only that");
        std::process::exit(2);
    }
    let requests: usize = value("--requests")
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    if requests == 0 || requests > REQUESTS_MAX {
        eprintln!("burst: --requests must be 1 to {REQUESTS_MAX}");
        std::process::exit(2);
    }
    let deadline = value("--deadline-seconds")
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(300), Duration::from_secs);
    if deadline > DEADLINE_MAX {
        eprintln!(
            "burst: --deadline-seconds is at most {}",
            DEADLINE_MAX.as_secs()
        );
        std::process::exit(2);
    }
    let mixed = args.iter().any(|a| a == "--mixed");
    let rounds: usize = value("--rounds").and_then(|n| n.parse().ok()).unwrap_or(1);
    if rounds == 0 || rounds > ROUNDS_MAX {
        eprintln!("burst: --rounds must be 1 to {ROUNDS_MAX}");
        std::process::exit(2);
    }
    let stack_pid: Option<u32> = value("--stack-pid").and_then(|p| p.parse().ok());
    let label = value("--label").unwrap_or_default();
    let pause = value("--pause-seconds")
        .and_then(|s| s.parse().ok())
        .map_or(Duration::ZERO, Duration::from_secs)
        .min(DEADLINE_MAX);
    let serial_runs: usize = value("--serial")
        .and_then(|n| n.parse().ok())
        .unwrap_or(20)
        .min(REQUESTS_MAX);
    let paths = Paths {
        python: value("--python").unwrap_or_else(|| "/usr/bin/python3".to_owned()),
        stack_python: value("--stack-python")
            .unwrap_or_else(|| "/opt/corral/python/bin/python3".to_owned()),
        node: value("--node").unwrap_or_else(|| "/usr/bin/node".to_owned()),
        bwrap: value("--bwrap").unwrap_or_else(|| "/usr/bin/bwrap".to_owned()),
    };
    let token = std::fs::read_to_string(&token_file).expect("token file");
    let client = Client::new(&api_url, token.trim()).expect("client");
    let tag = format!("{}-{}", std::process::id(), unix_now() as u64);
    let ticks = ticks_per_second();

    println!(
        "burst of {requests}{} {label} (cores: {})",
        if mixed { ", mixed" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let (waited, quiet) = wait_quiet(deadline).await;
    println!(
        "waited {:.1} s for the machine to be quiet{}",
        waited.as_secs_f64(),
        if quiet {
            ""
        } else {
            " (it never was: the figures include that load)"
        }
    );
    if serial_runs > 0 {
        show_serial(
            &client,
            serial_runs,
            &tag,
            &paths,
            "before the burst",
            deadline,
        )
        .await;
    }
    println!("pool before: {}", pool(&client).await);
    let cpu_before = stack_pid.map(|root| stack_cpu(Some(root)));
    let (samples, elapsed) = api_burst(&client, requests, mixed, &tag, deadline).await;
    let cpu_after = stack_pid.map(|root| stack_cpu(Some(root)));
    println!("pool after:  {}", pool(&client).await);
    // A run is paid for only once its worker is warm again: its reset and the next jail's
    // preparation come after its answer, outside the burst's window.
    let settled = match stack_pid {
        Some(root) => {
            let waited = settle(&client, deadline).await;
            println!(
                "pool warm again {:.1} s after the burst: {}",
                waited.as_secs_f64(),
                pool(&client).await
            );
            Some(stack_cpu(Some(root)))
        }
        None => None,
    };
    let api = report("API run_code", &samples, Some(elapsed));
    let mut later = Vec::new();
    for round in 2..=rounds {
        let (waited, _) = wait_quiet(deadline).await;
        println!(
            "round {round}, after {:.1} s until the machine was quiet; pool: {}",
            waited.as_secs_f64(),
            pool(&client).await
        );
        let tag = format!("{tag}-r{round}");
        let (samples, elapsed) = api_burst(&client, requests, mixed, &tag, deadline).await;
        later.push((
            round,
            report(
                &format!("API run_code, round {round}"),
                &samples,
                Some(elapsed),
            ),
        ));
    }
    let succeeded = samples.iter().filter(|s| s.outcome == "ok").count().max(1) as f64;
    let mut api_cpu = 0.0;
    let mut burst_cpu = 0.0;
    if let (Some(before), Some(after), Some(settled)) = (&cpu_before, &cpu_after, &settled) {
        let (in_burst, parts) = before.per_run(after, ticks, succeeded);
        println!("  CPU ms per run in the burst: {in_burst:.1} ({parts})");
        let (whole, parts) = before.per_run(settled, ticks, succeeded);
        println!("  CPU ms per run, resets and next jails included: {whole:.1} ({parts})");
        (api_cpu, burst_cpu) = (whole, in_burst);
    }
    let reaped = own_children_cpu();
    let started = Instant::now();
    let bare = bare_burst(requests, mixed, &paths, false).await;
    let bare_elapsed = started.elapsed();
    let bare_cpu = (own_children_cpu() - reaped) as f64 / ticks / requests as f64 * 1e3;
    let bare_p50 = report("bare interpreter", &bare, Some(bare_elapsed));
    println!("  CPU ms per run: {bare_cpu:.1}");
    // bwrap's init inside the namespace does not wait for what it started, so the kernel's count
    // of reaped children misses the interpreter: its CPU is the machine's, from the burst's start
    // until the machine is quiet again (a namespace's teardown comes after its last process), less
    // this harness's own and the idle stack's long-lived processes'.
    let unshared_before = stack_cpu(stack_pid);
    let started = Instant::now();
    let unshared = bare_burst(requests, mixed, &paths, true).await;
    let unshared_elapsed = started.elapsed();
    report("bwrap --unshare-all", &unshared, Some(unshared_elapsed));
    let (_, quiet) = wait_quiet(deadline).await;
    let unshared_ok = unshared.iter().filter(|s| s.outcome == "ok").count().max(1);
    let unshared_cpu =
        unshared_before.beside_stack_per_run(&stack_cpu(stack_pid), ticks, unshared_ok as f64);
    println!(
        "  CPU ms per run, until the machine was quiet again{}: {unshared_cpu:.1}",
        if quiet {
            ""
        } else {
            " (it never was: the figure includes that load)"
        }
    );
    for (kind, p50) in &api {
        if let Some(bare) = bare_p50.get(kind) {
            println!(
                "ratio [{}] answer p50 API/bare: {:.2}",
                kind.name(),
                p50 / bare
            );
        }
    }
    for (round, p50s) in &later {
        for (kind, p50) in p50s {
            if let Some(bare) = bare_p50.get(kind) {
                println!(
                    "ratio [{}] answer p50 API/bare, round {round}: {:.2}",
                    kind.name(),
                    p50 / bare
                );
            }
        }
    }
    if bare_cpu > 0.0 {
        println!(
            "ratio CPU per run bwrap/bare: {:.2}",
            unshared_cpu / bare_cpu
        );
    }
    if api_cpu > 0.0 && unshared_cpu > 0.0 {
        println!("ratio CPU per run API/bwrap: {:.2}", api_cpu / unshared_cpu);
    }
    if api_cpu > 0.0 && bare_cpu > 0.0 {
        println!("ratio CPU per run API/bare: {:.2}", api_cpu / bare_cpu);
        println!(
            "ratio CPU per run API/bare, the burst's window only: {:.2}",
            burst_cpu / bare_cpu
        );
    }
    if serial_runs > 0 {
        tokio::time::sleep(pause).await;
        let (waited, _) = wait_quiet(deadline).await;
        println!(
            "after a pause of {:.1} s ({} s asked, then until the machine was quiet); pool: {}",
            (pause + waited).as_secs_f64(),
            pause.as_secs(),
            pool(&client).await
        );
        show_serial(
            &client,
            serial_runs,
            &tag,
            &paths,
            "after the burst",
            deadline,
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_is_a_target() {
        for url in [
            "http://127.0.0.1:8080",
            "http://localhost:1",
            "http://[::1]:9",
        ] {
            assert!(loopback(url), "{url}");
        }
        for url in [
            "http://10.0.0.1:8080",
            "https://127.0.0.1:1",
            "http://example.invalid:80",
            "http://[2001:db8::1]:9",
            "127.0.0.1:8080",
        ] {
            assert!(!loopback(url), "{url}");
        }
    }

    #[test]
    fn the_first_statement_is_read_from_the_first_line() {
        let sent = 1_000.0;
        assert_eq!(
            first_statement(sent, "1000.25\nrest\n"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(first_statement(sent, "not a time\n"), None);
        assert_eq!(first_statement(sent, ""), None);
    }
}
