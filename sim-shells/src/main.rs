//! corral-sim-shells: the service shells' own code under deterministic network simulation
//! (issue 28).
//!
//! The simulator in `sim/` drives corral-core's machines with a model of the shells; this world
//! runs the shells' code itself on turmoil's simulated network and clock, from one seed:
//! - the worker client (`corral_contract::client::WorkerClient`), dialling through its `Dial`
//!   seam onto turmoil's TCP, and corral-core's run sequence
//!   (`corral_core::run::sequence::Sequence`) deciding each run's steps and each lease's end;
//! - simulated workers serving the contract's execute and reset routes over HTTP (hyper), where a
//!   run is a delay and a deterministic answer and a reset returns clean evidence, and which
//!   record every execute that reached them: the world's truth;
//! - faults from the seed: a partition between the API and a worker (held and healed), messages
//!   held and released (delay and reordering), and a worker crashed and restarted mid-run.
//!
//! Invariants, checked against the workers' truth: a run executes at most once
//! (`run_executed_twice`); a call the client called unreachable never reached the worker
//! (`unreachable_but_ran`, ISO-1: the code did not run, so the run may go elsewhere); a run
//! answered from its worker's reply executed exactly there (`answered_without_execution`); no
//! discarded worker is used again (`discarded_worker_used`); and every run is answered before the
//! world's time runs out (`run_unanswered`, naming the stuck runs). A failing seed replays exactly:
//! `--seed N --trace` prints its events, and `--replay N` runs it twice and compares.
//!
//! Each seed also builds a deployment ([`deploy`]): Valkey, the controller and three API replicas
//! as hosts, each running the shells' own code over the store's link to a simulated Valkey
//! ([`valkey`]).

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use corral_contract::client::{Connection, Dial, Dialing, WorkerClient};
use corral_contract::locate::{CONTROL_PORT, Locator};
use corral_contract::messages::{
    EvidenceReport, ExecuteReply, ExecuteRequest, ResetReply, ResetRequest,
};
use corral_core::bounds::ExecutionBounds;
use corral_core::ids::{OpToken, WorkerId};
use corral_core::pool::Disposition;
use corral_core::reset::ResetEvidence;
use corral_core::run::sequence::{Answer, Call, Effect, Event, Kept, Sequence};
use http_body_util::{BodyExt, Full};

mod api_http;
mod deploy;
mod dns;
mod objects;
mod valkey;

/// The invariants, each checked and counted.
const INVARIANTS: [&str; 5] = [
    "run_executed_twice",
    "unreachable_but_ran",
    "answered_without_execution",
    "discarded_worker_used",
    "run_unanswered",
];

/// How long the world may run in simulated time before its outstanding runs count as stuck.
const WORLD_SECONDS: u64 = 600;

/// A small deterministic generator (xorshift64*), so that the schedule is the seed's alone.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What happened, as the workers saw it and the API answered it.
#[derive(Default)]
struct Truth {
    /// Every execute that reached a worker: (simulated ms, worker, run).
    executions: Vec<(u128, String, u64)>,
    /// Workers the API discarded, with when.
    discarded: BTreeMap<String, u128>,
    /// Each run's execute calls: (worker, what the client said).
    calls: BTreeMap<u64, Vec<(String, Call)>>,
    /// Each run's answer.
    answers: BTreeMap<u64, Answer>,
    /// The events of the world, in order, for a replay.
    trace: Vec<String>,
}

type Shared = Arc<Mutex<Truth>>;

fn lock(truth: &Shared) -> MutexGuard<'_, Truth> {
    truth.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The simulated time, in ms; 0 outside a host.
fn now_ms() -> u128 {
    turmoil::sim_elapsed().unwrap_or_default().as_millis()
}

fn note(truth: &Shared, line: String) {
    lock(truth).trace.push(format!("{:>7} ms {line}", now_ms()));
}

/// The worker client's `Dial` on turmoil's network.
struct TurmoilDial;

impl Dial for TurmoilDial {
    fn dial<'a>(&'a self, host: &'a str, port: u16) -> Dialing<'a> {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect((host, port)).await?;
            Ok(Box::new(stream) as Box<dyn Connection>)
        })
    }
}

/// One world's shape, drawn from its seed.
struct Plan {
    workers: u64,
    runs: u64,
    run_ms: u64,
    /// The time between one run's start and the next's.
    stagger_ms: u64,
    faults: Vec<Fault>,
}

/// A fault of the network or of a worker, at a simulated time, healed after a while.
#[derive(Clone, Debug)]
struct Fault {
    at_ms: u64,
    heal_ms: u64,
    kind: FaultKind,
    worker: u64,
}

#[derive(Clone, Copy, Debug)]
enum FaultKind {
    /// The API and the worker cannot reach each other.
    Partition,
    /// Messages between them are held, then released together (delay and reordering).
    Hold,
    /// The worker's host crashes and restarts empty.
    Crash,
}

impl Plan {
    fn from_seed(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let workers = 2 + rng.below(3);
        let runs = 4 + rng.below(12);
        let run_ms = 20 + rng.below(400);
        let stagger_ms = 20 + rng.below(300);
        let span = runs * stagger_ms + run_ms;
        let faults = (0..rng.below(6))
            .map(|_| Fault {
                at_ms: rng.below(span),
                heal_ms: 100 + rng.below(45_000),
                kind: match rng.below(3) {
                    0 => FaultKind::Partition,
                    1 => FaultKind::Hold,
                    _ => FaultKind::Crash,
                },
                worker: rng.below(workers),
            })
            .collect();
        Self {
            workers,
            runs,
            run_ms,
            stagger_ms,
            faults,
        }
    }
}

fn worker_id(index: u64) -> WorkerId {
    WorkerId {
        epoch: 1,
        seq: index,
    }
}

/// A simulated worker: the contract's execute and reset routes over HTTP. A run takes `run_ms`
/// and answers exit 0; a reset answers clean evidence under its token.
async fn worker_host(name: String, truth: Shared, run_ms: u64) -> turmoil::Result {
    serve_worker(move |request| answer(request, name.clone(), truth.clone(), run_ms)).await
}

/// A worker's answer to one request.
async fn answer(
    request: hyper::Request<hyper::body::Incoming>,
    name: String,
    truth: Shared,
    run_ms: u64,
) -> Result<Response, Infallible> {
    Ok(worker_routes(request, |order| async move {
        let run = run_of(&order);
        lock(&truth).executions.push((now_ms(), name.clone(), run));
        note(&truth, format!("{name} executes run {run}"));
        tokio::time::sleep(Duration::from_millis(run_ms)).await;
    })
    .await)
}

/// A simulated worker's HTTP answer.
type Response = hyper::Response<Full<Bytes>>;

/// Serves a simulated worker's control port on turmoil's network until its host crashes, each
/// request answered by `answer`.
async fn serve_worker<F, A>(answer: F) -> turmoil::Result
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> A + Clone + Send + 'static,
    A: std::future::Future<Output = Result<Response, Infallible>> + Send + 'static,
{
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", CONTROL_PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let answer = answer.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(answer);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The contract's execute and reset routes as a simulated worker serves them: an execute is
/// performed by `execute` (which records it and takes the run's time), then answered exit 0; a
/// reset answers clean evidence under its token; anything unreadable is a 400, any other route a
/// 404.
async fn worker_routes<E, X>(request: hyper::Request<hyper::body::Incoming>, execute: E) -> Response
where
    E: FnOnce(ExecuteRequest) -> X,
    X: std::future::Future<Output = ()>,
{
    let path = request.uri().path().to_owned();
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        return status(400, Bytes::new());
    };
    let reply = if path == corral_contract::routes::EXECUTE {
        let Ok(order) = serde_json::from_slice::<ExecuteRequest>(&body) else {
            return status(400, Bytes::new());
        };
        let run = run_of(&order);
        execute(order).await;
        executed_reply(run)
    } else if path == corral_contract::routes::RESET {
        let Some(reply) = reset_reply(&body) else {
            return status(400, Bytes::new());
        };
        reply
    } else {
        return status(404, Bytes::new());
    };
    status(200, Bytes::from(reply))
}

/// The execute a simulated API sends for run `run` under `token`, and the bounds it sends it with.
fn execute_order(run: u64, token: OpToken) -> (ExecuteRequest, ExecutionBounds) {
    let mut bounds = corral_core::config::Settings::default().bounds;
    bounds.max_wall_seconds = 2;
    let request = ExecuteRequest {
        language: corral_core::jail::Language::Python,
        code: format!("print({run})"),
        workspace: None,
        bounds: corral_core::bounds::BoundOverrides::default(),
        grant: None,
        declared: Vec::new(),
        dependencies: None,
        kernel: None,
        tools: None,
        resources: None,
        token,
        traceparent: None,
        stream_output: false,
    };
    (request, bounds)
}

/// The run an execute is for, as [`execute_order`] wrote it into the code (`u64::MAX`: none).
fn run_of(order: &ExecuteRequest) -> u64 {
    order
        .code
        .trim_start_matches("print(")
        .trim_end_matches(')')
        .parse()
        .unwrap_or(u64::MAX)
}

/// The workspace run `run` leaves: a tar holding `run-<run>.txt`.
pub(crate) fn workspace_left(run: u64) -> Vec<u8> {
    let text = format!("run {run}\n");
    let mut header = tar::Header::new_gnu();
    header.set_size(text.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    let mut archive = tar::Builder::new(Vec::new());
    let _ = archive.append_data(&mut header, format!("run-{run}.txt"), text.as_bytes());
    archive.into_inner().unwrap_or_default()
}

/// A simulated worker's reply to an execute whose run is over: exit 0, warm, and the workspace
/// it left.
fn executed_reply(run: u64) -> Vec<u8> {
    serde_json::to_vec(&ExecuteReply {
        exit_code: Some(0),
        warm: true,
        workspace: corral_contract::messages::WorkspaceReturn::of_archive(&workspace_left(run)),
        ..ExecuteReply::default()
    })
    .unwrap_or_default()
}

/// A simulated worker's reply to a reset order: clean evidence under its token; `None` when the
/// order does not parse.
fn reset_reply(body: &[u8]) -> Option<Vec<u8>> {
    let order = serde_json::from_slice::<ResetRequest>(body).ok()?;
    serde_json::to_vec(&ResetReply {
        reset_evidence: EvidenceReport::judged(ResetEvidence::clean(order.token)),
        diagnostics: Vec::new(),
    })
    .ok()
}

fn status(code: u16, body: Bytes) -> Response {
    let mut response = hyper::Response::new(Full::new(body));
    *response.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or_default();
    response
}

/// The API's side: `runs` runs at once, each leased a free worker and sequenced by corral-core.
async fn api_host(workers: u64, runs: u64, stagger_ms: u64, truth: Shared) -> turmoil::Result {
    let client = WorkerClient::with_dial(
        Locator::Template(format!("http://{{id}}:{CONTROL_PORT}")),
        "sim".to_owned(),
        Arc::new(TurmoilDial),
    );
    let free: Arc<Mutex<VecDeque<u64>>> = Arc::new(Mutex::new((0..workers).collect()));
    let mut tasks = Vec::new();
    for run in 0..runs {
        let (client, free, truth) = (client.clone(), free.clone(), truth.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(run * stagger_ms)).await;
            one_run(run, &client, &free, &truth).await;
        }));
    }
    for task in tasks {
        task.await?;
    }
    Ok(())
}

/// One run: the core's sequence, its effects performed on the simulated network.
async fn one_run(run: u64, client: &WorkerClient, free: &Mutex<VecDeque<u64>>, truth: &Shared) {
    let (mut sequence, first) = Sequence::start(false);
    let mut queue = VecDeque::from(first);
    let mut leased: Option<u64> = None;
    while let Some(effect) = queue.pop_front() {
        let event = match effect {
            Effect::Scope => Event::Scoped(Some(false)),
            Effect::Acquire => acquire(free, &mut leased).await,
            Effect::ReadInputs => Event::InputsRead(true),
            Effect::Execute => Event::Executed(execute(run, client, leased, truth).await),
            Effect::Keep => Event::Kept(Kept {
                succeeded: true,
                install_failed: false,
                checkpoint_refused: false,
                retained: false,
            }),
            Effect::Release(disposition) => {
                release(run, client, free, leased.take(), disposition, truth).await;
                continue;
            }
            Effect::Answer(answer) => {
                note(truth, format!("run {run} answered {answer:?}"));
                lock(truth).answers.insert(run, answer);
                return;
            }
            other => {
                note(truth, format!("run {run}: unexpected effect {other:?}"));
                return;
            }
        };
        match sequence.on(event) {
            Ok(next) => queue.extend(next),
            Err(unexpected) => {
                note(truth, format!("run {run}: {unexpected:?}"));
                return;
            }
        }
    }
}

/// A free worker within the run's wait (20 s), else refused.
async fn acquire(free: &Mutex<VecDeque<u64>>, leased: &mut Option<u64>) -> Event {
    for _ in 0..100 {
        if let Some(worker) = free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
        {
            *leased = Some(worker);
            return Event::Acquired;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Event::AcquireRefused
}

/// The execute, through the real worker client; the run's id travels as its token.
async fn execute(run: u64, client: &WorkerClient, leased: Option<u64>, truth: &Shared) -> Call {
    let Some(worker) = leased else {
        return Call::Lost;
    };
    let (request, bounds) = execute_order(run, OpToken(run));
    let name = worker_id(worker).to_string();
    let call = match client.execute(worker_id(worker), &request, &bounds).await {
        Ok(_) => Call::Answered,
        Err(error) => error.as_call(),
    };
    note(truth, format!("run {run} on {name}: {call:?}"));
    lock(truth).calls.entry(run).or_default().push((name, call));
    call
}

/// The lease's end: reset and, if proven clean, free again; otherwise discarded for good.
async fn release(
    run: u64,
    client: &WorkerClient,
    free: &Mutex<VecDeque<u64>>,
    worker: Option<u64>,
    disposition: Disposition,
    truth: &Shared,
) {
    let Some(worker) = worker else { return };
    let name = worker_id(worker).to_string();
    let clean = disposition == Disposition::Reset
        && client
            .reset(worker_id(worker), OpToken(1_000_000 + run))
            .await
            .is_ok_and(|reply| reply.reset_evidence.verdict == "clean");
    if clean {
        free.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(worker);
        return;
    }
    note(truth, format!("{name} discarded after run {run}"));
    lock(truth).discarded.insert(name, now_ms());
}

/// What one seed's world came to.
struct Outcome {
    /// Every check made, by invariant.
    checks: BTreeMap<&'static str, u64>,
    /// Every violation, with its invariant.
    violations: Vec<(&'static str, String)>,
    trace: Vec<String>,
}

/// Both worlds of `seed`: the workers' world, then the deployment's ([`deploy`]).
fn run_world(seed: u64) -> Outcome {
    let mut outcome = run_workers_world(seed);
    let deployed = deploy::run_world(seed);
    outcome.checks.extend(deployed.checks);
    outcome.violations.extend(deployed.violations);
    outcome.trace.extend(deployed.trace);
    outcome
}

/// Runs the workers' world of `seed` to its end (every run answered) or to its time limit.
fn run_workers_world(seed: u64) -> Outcome {
    let plan = Plan::from_seed(seed);
    let truth: Shared = Arc::default();
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(Duration::from_millis(5))
        .simulation_duration(Duration::from_secs(WORLD_SECONDS))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(1 + seed % 20))
        .build();
    for worker in 0..plan.workers {
        let (name, truth, run_ms) = (worker_id(worker).to_string(), truth.clone(), plan.run_ms);
        let host = name.clone();
        sim.host(host.as_str(), move || {
            worker_host(name.clone(), truth.clone(), run_ms)
        });
    }
    sim.client(
        "api",
        api_host(plan.workers, plan.runs, plan.stagger_ms, truth.clone()),
    );
    note(
        &truth,
        format!(
            "seed {seed}: {} workers, {} runs of {} ms, faults {:?}",
            plan.workers, plan.runs, plan.run_ms, plan.faults
        ),
    );
    let ended = drive(&mut sim, &plan, &truth);
    drop(sim);
    let truth = Arc::try_unwrap(truth)
        .map(|m| m.into_inner().unwrap_or_else(PoisonError::into_inner))
        .unwrap_or_default();
    check(&plan, truth, ended)
}

/// Steps the simulation, applying and healing the plan's faults at their times. `Err` says why
/// the world did not end with every client done.
fn drive(sim: &mut turmoil::Sim<'_>, plan: &Plan, truth: &Shared) -> Result<(), String> {
    let faults = plan.faults.iter().map(|f| (f.at_ms, f.heal_ms, f.clone()));
    step_with_faults(sim, faults.collect(), |sim, fault, start| {
        let name = worker_id(fault.worker).to_string();
        apply(sim, fault, &name, start);
        let what = if start { "fault" } else { "healed" };
        note(truth, format!("{what} {:?} api~{name}", fault.kind));
    })
}

/// Steps `sim` until every client is done, starting each fault (at, heal after, fault) at its time
/// and healing it after its while: `on(sim, fault, true)`, then `on(sim, fault, false)`. `Err`
/// says why the world did not end with every client done.
fn step_with_faults<F>(
    sim: &mut turmoil::Sim<'_>,
    faults: Vec<(u64, u64, F)>,
    mut on: impl FnMut(&mut turmoil::Sim<'_>, &F, bool),
) -> Result<(), String> {
    // (when, start or heal, the heal's delay, the fault)
    let mut pending: Vec<(u64, bool, u64, F)> = faults
        .into_iter()
        .map(|(at, heal, fault)| (at, true, heal, fault))
        .collect();
    loop {
        let now = u64::try_from(sim.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (due, later): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(at, ..)| *at <= now);
        pending = later;
        for (_, start, heal, fault) in due {
            on(sim, &fault, start);
            if start {
                pending.push((now + heal, false, heal, fault));
            }
        }
        match sim.step() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn apply(sim: &mut turmoil::Sim<'_>, fault: &Fault, name: &str, start: bool) {
    match (fault.kind, start) {
        (FaultKind::Partition, true) => sim.partition("api", name),
        (FaultKind::Partition, false) => sim.repair("api", name),
        (FaultKind::Hold, true) => sim.hold("api", name),
        (FaultKind::Hold, false) => sim.release("api", name),
        (FaultKind::Crash, true) => sim.crash(name),
        (FaultKind::Crash, false) => sim.bounce(name),
    }
}

/// The invariants, against what the workers recorded and what the API answered.
fn check(plan: &Plan, truth: Truth, ended: Result<(), String>) -> Outcome {
    let mut outcome = Outcome {
        checks: INVARIANTS.iter().map(|name| (*name, 0)).collect(),
        violations: Vec::new(),
        trace: truth.trace,
    };
    let mut verify = |name: &'static str, holds: bool, what: &dyn Fn() -> String| {
        *outcome.checks.entry(name).or_default() += 1;
        if !holds {
            outcome.violations.push((name, what()));
        }
    };
    let mut ran: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for (_, worker, run) in &truth.executions {
        ran.entry(*run).or_default().push(worker);
    }
    for run in 0..plan.runs {
        let at = ran.get(&run).cloned().unwrap_or_default();
        verify("run_executed_twice", at.len() <= 1, &|| {
            format!("run {run} executed on {at:?}")
        });
        for (worker, call) in truth.calls.get(&run).map(Vec::as_slice).unwrap_or_default() {
            if *call == Call::Unreachable {
                let reached = at.iter().any(|w| w == worker);
                verify("unreachable_but_ran", !reached, &|| {
                    format!("run {run}: {worker} was unreachable, yet executed it")
                });
            }
            if *call == Call::Answered {
                let there = at.iter().filter(|w| *w == worker).count();
                verify("answered_without_execution", there == 1, &|| {
                    format!("run {run} answered from {worker}, executed there {there} times")
                });
            }
        }
        let answered = truth.answers.contains_key(&run);
        verify("run_unanswered", answered, &|| {
            format!("run {run} never answered ({ended:?})")
        });
    }
    for (at, worker, run) in &truth.executions {
        let after = truth
            .discarded
            .get(worker)
            .is_some_and(|discarded| at > discarded);
        verify("discarded_worker_used", !after, &|| {
            format!("run {run} executed on {worker} after it was discarded")
        });
    }
    outcome
}

/// What the command line asked for.
enum Command {
    /// Seeds `0..seeds`, each checked.
    Seeds(u64),
    /// One seed, with its trace.
    Trace(u64),
    /// One seed twice: the traces must be identical.
    Replay(u64),
    /// A shell's defect turned on: seeds until the first violation.
    Mutation(&'static Mutation, u64),
}

fn parse(args: &[String]) -> Result<Command, String> {
    let number = |flag: &str, value: Option<&String>| -> Result<u64, String> {
        let value = value.ok_or_else(|| format!("{flag} needs a number"))?;
        value
            .parse::<u64>()
            .map_err(|_| format!("{flag} {value:?}: not a whole number of at least 0"))
    };
    match args {
        [] => Ok(Command::Seeds(100)),
        [flag, value] if flag == "--seeds" => match number(flag, Some(value))? {
            0 => Err("--seeds 0: a run of no seeds proves nothing".to_owned()),
            n => Ok(Command::Seeds(n)),
        },
        [flag, value] if flag == "--trace" => Ok(Command::Trace(number(flag, Some(value))?)),
        [flag, value] if flag == "--replay" => Ok(Command::Replay(number(flag, Some(value))?)),
        [flag, name, seeds] if flag == "--mutation" => {
            let mutation = MUTATIONS.iter().find(|m| m.name == name).ok_or_else(|| {
                let names: Vec<_> = MUTATIONS.iter().map(|m| m.name).collect();
                format!("--mutation {name:?}: the mutations are {names:?} (then a number of seeds)")
            })?;
            Ok(Command::Mutation(
                mutation,
                number("--mutation", Some(seeds))?,
            ))
        }
        other => Err(format!(
            "unknown arguments {other:?}; use --seeds N, --trace SEED, --replay SEED or --mutation NAME N"
        )),
    }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse(&args) {
        Ok(command) => command,
        Err(why) => {
            eprintln!("corral-sim-shells: {why}");
            return std::process::ExitCode::from(2);
        }
    };
    let passed = match command {
        Command::Seeds(seeds) => many(seeds),
        Command::Trace(seed) => {
            let outcome = run_world(seed);
            outcome.trace.iter().for_each(|line| println!("{line}"));
            report_violations(seed, &outcome)
        }
        Command::Replay(seed) => {
            let (first, second) = (run_world(seed).trace, run_world(seed).trace);
            println!(
                "seed {seed}: {} events, replayed {}",
                first.len(),
                if first == second {
                    "identically"
                } else {
                    "DIFFERENTLY"
                }
            );
            first == second
        }
        Command::Mutation(defect, seeds) => mutation(defect, seeds),
    };
    if passed {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

fn report_violations(seed: u64, outcome: &Outcome) -> bool {
    for (name, what) in &outcome.violations {
        println!("seed {seed}: VIOLATION {name}: {what}");
    }
    outcome.violations.is_empty()
}

/// Seeds `0..seeds`: the per-invariant check counts, the violations, the pace.
fn many(seeds: u64) -> bool {
    let started = std::time::Instant::now();
    let mut checks: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failed = 0;
    for seed in 0..seeds {
        let outcome = run_world(seed);
        for (name, count) in &outcome.checks {
            *checks.entry(name).or_default() += count;
        }
        if !report_violations(seed, &outcome) {
            failed += 1;
            println!("  replay: corral-sim-shells --trace {seed}");
        }
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    for (name, count) in &checks {
        println!("checked {name}: {count}");
    }
    let unexercised: Vec<_> = checks
        .iter()
        .filter(|(_, c)| **c == 0)
        .map(|(n, _)| *n)
        .collect();
    println!(
        "shell world: {seeds} seeds, {failed} with violations, {:.0} seeds per minute",
        seeds as f64 / minutes.max(1e-9)
    );
    if !unexercised.is_empty() {
        println!("shell world: invariants never checked: {unexercised:?}");
    }
    failed == 0 && unexercised.is_empty()
}

/// A deliberate defect of a shell, and the invariant that must catch it.
struct Mutation {
    name: &'static str,
    what: &'static str,
    /// Turns the defect on or off.
    switch: fn(bool),
    /// The invariant it breaks.
    caught_by: &'static str,
}

/// The shells' defects this world must catch (issue 28, item 6).
const MUTATIONS: [Mutation; 4] = [
    Mutation {
        name: "retry-lost-execute",
        what: "the worker client sends an execute whose answer was lost once more",
        switch: corral_contract::client::mutation::retry_lost_executes,
        caught_by: "run_executed_twice",
    },
    Mutation {
        name: "keep-lost-lease",
        what: "the API's lease holder driver reports a lease it found lost as still held",
        switch: corral_api::run::lease::mutation::keep_lost_leases,
        caught_by: "kept_after_lease_lost",
    },
    Mutation {
        name: "answer-before-save",
        what: "the API's keeping counts a workspace saved (and the run succeeded) before the \
               object store acknowledged the save",
        switch: corral_api::run::keep::mutation::answer_before_save,
        caught_by: "answered_without_save",
    },
    Mutation {
        name: "reap-stale-leases",
        what: "the controller's reconciler driver, back in touch with Valkey after a partition, \
               deletes the workers whose leases had run out in the pool it read before it",
        switch: corral_controller::mutation::reap_stale_leases,
        caught_by: "deleted_while_leased",
    },
];

/// With `defect` on, the seeds until the first violation. Passes when the defect's own invariant
/// is among the violations of that seed, within `seeds`.
fn mutation(defect: &Mutation, seeds: u64) -> bool {
    (defect.switch)(true);
    let name = defect.name;
    for seed in 0..seeds {
        let outcome = run_world(seed);
        if let Some((first, what)) = outcome.violations.first() {
            let own = outcome
                .violations
                .iter()
                .any(|(n, _)| *n == defect.caught_by);
            println!(
                "mutation {name} ({}): first caught at seed {seed} ({} seeds) by {first}: {what}; by its own invariant ({}): {own}",
                defect.what,
                seed + 1,
                defect.caught_by
            );
            (defect.switch)(false);
            return own;
        }
    }
    (defect.switch)(false);
    println!("mutation {name}: NOT caught within {seeds} seeds");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn a_schedule_the_world_cannot_honour_is_refused_at_start() {
        for bad in [
            &["--seeds", "0"][..],
            &["--seeds", "-3"],
            &["--seeds"],
            &["--trace", "x"],
            &["--mutation", "retry-everything", "3"],
            &["--partition", "nowhere"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?} was accepted");
        }
        assert!(matches!(
            parse(&args(&["--seeds", "12"])),
            Ok(Command::Seeds(12))
        ));
    }

    #[test]
    fn a_seed_replays_exactly_and_answers_every_run() {
        let (first, second) = (run_world(11), run_world(11));
        assert!(first.trace.len() > 3);
        assert_eq!(first.trace, second.trace);
        assert!(first.violations.is_empty(), "{:?}", first.violations);
        assert!(first.checks["run_unanswered"] >= 4);
    }
}
