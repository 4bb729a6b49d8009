//! The deployment world (issue 28, items 1 to 3): Valkey, three API replicas, the controller and
//! workers as hosts on turmoil's network, each running the shells' own code.
//!
//! - `valkey`: the simulated Valkey ([`crate::valkey`]) running the store's own scripts; crashed
//!   and restarted empty or from its last state.
//! - `controller`: the controller's real reconciler (`corral_controller::Reconciler`) over the
//!   store's link to `valkey`, with a backend that gives each created worker one of the world's
//!   worker slots, and the real worker client for resets; crashed and restarted.
//! - `api-1` to `api-3`: runs and persistent cells sequenced by corral-core's run machine, their
//!   leases taken with the store's one acquire (`corral_store::lease::acquire`) and held by the
//!   API's own lease holder driver (`corral_api::run::lease::Holder`), a kernel's lease kept
//!   between its cells by the API's own sessions (`corral_api::run::affinity`, KER-4), their code
//!   sent with the real worker client, their workspaces read and kept with the API's own workspace
//!   store and keeping (`corral_api::workspaces`, `corral_api::run::keep`).
//! - `objects`: the simulated object store ([`crate::objects`]); its objects outlive its crashes.
//! - `api-4`: the API itself ([`crate::api_http`]): `corral_api`'s own state and router served on
//!   the world's network, its runs sent over HTTP by the world's `client`, every step of them the
//!   API's own (admission, the lease, `run/mod.rs` performing corral-core's run machine, keeping,
//!   the answer). A crash of `api-4` kills the requests it holds; the client waits while it is
//!   down.
//! - `slot-0`...: simulated workers (the contract's execute and reset routes over HTTP), which
//!   judge every execute that reaches them against the pool document current at that instant.
//!
//! Faults from the seed: partitions between a replica or the controller and Valkey, or a replica
//! and a worker (held and healed); messages held and released; Valkey crashed and restarted empty
//! or from its last state; the controller, an API replica (mid-run) and workers crashed and
//! restarted; a replica cut off from the object store, and the object store crashed; lookups of
//! a host's name (Valkey's, the object store's, a worker's) failing at once or after the
//! resolver's timeout ([`crate::dns`]).
//!
//! Invariants: code runs only on a worker the pool holds for that very lease
//! (`executed_without_lease`); a run that finds its lease held after its code ran still holds it
//! in the pool (`kept_after_lease_lost`: the lease holder's word against the pool's); every pool document written is sound, its ceiling and bounds
//! included (`pool_doc_unsound`, corral-core's own checks); a run executes at most once
//! (`deploy_run_executed_twice`); every refusal carries a stable code (`refusal_without_code`);
//! every run is answered (`deploy_run_unanswered`); a run answered `succeeded` has its workspace
//! stored as the generation it names, holding what the run left, and any other outcome reports
//! its failure (`answered_without_save`); no worker is deleted while the pool holds it
//! under a live lease (`deleted_while_leased`); and after the faults stop the pool returns to
//! its warm target with nothing quarantined (`pool_not_restored`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use corral_api::run::affinity::{self, ClaimGuard, HoldsSessions, Sessions};
use corral_api::run::keep::{self, Keeping};
use corral_api::run::lease::{Holder, HolderPorts};
use corral_api::workspaces::{Snapshot, Workspaces};
use corral_contract::ExecuteReply;
use corral_contract::client::{Connection, Dial, Dialing, WorkerClient};
use corral_contract::locate::{CONTROL_PORT, Locator};
use corral_controller::{Backend, Reconciler};
use corral_core::ids::{
    ActorId, ConversationId, ImageId, LeaseNamespace, LeaseScope, MemberId, OpToken, TicketId,
    WorkerId,
};
use corral_core::pool::{Command, Outcome as Done, PoolConfig, PoolDoc, WorkerState};
use corral_core::run::outcome::{Decided, Kept as Stored, Outcome as RunOutcome};
use corral_core::run::sequence::{
    Answer, Call, Effect, Event, Kept, Sequence, SessionEnded, Taken,
};
use corral_core::store::Unavailable;
use corral_core::time::UnixMillis;
use corral_store::lease::{self, AcquireError};
use corral_store::{ValkeyStore, VersionWatch};
use object_store::memory::InMemory;

use crate::api_http;
use crate::dns::{self, Dns};
use crate::objects::{self, TurmoilObjects};
use crate::valkey::{self, Data};
use crate::{
    Outcome, Response, Rng, execute_order, run_of, serve_worker, status, step_with_faults,
    worker_routes,
};

/// This world's invariants, each checked and counted.
pub const INVARIANTS: [&str; 9] = [
    "executed_without_lease",
    "kept_after_lease_lost",
    "deleted_while_leased",
    "pool_doc_unsound",
    "deploy_run_executed_twice",
    "refusal_without_code",
    "deploy_run_unanswered",
    "answered_without_save",
    "pool_not_restored",
];

const POOL: &str = "sim";
/// Replicas whose runs the world sequences with corral-core's machine and the API's parts.
const REPLICAS: u64 = 3;
/// The replica that is the API itself, its runs sent by the world's client over HTTP.
const API: &str = "api-4";
/// Every replica, the API's own among them: the hosts faults may strike.
const API_HOSTS: u64 = REPLICAS + 1;
/// Worker slots: the ceiling, and room for workers still being deleted.
const SLOTS: u64 = 6;
/// Simulated time the world may take before its outstanding runs count as stuck.
const WORLD_SECONDS: u64 = 900;
/// How long after the last run and the last fault the pool has to be warm again.
const SETTLE_SECONDS: u64 = 120;

/// The pool's settings in this world: the test pool's bounds with leases, resets and creates on
/// a scale of seconds, so that a partition outlasts a lease.
fn pool_config() -> PoolConfig {
    PoolConfig {
        lease_heartbeat_ms: 1_000,
        lease_ttl_ms: 4_000,
        reset_timeout_ms: 4_000,
        create_timeout_ms: 8_000,
        delete_retry_ms: 2_000,
        inventory_stale_ms: 6_000,
        acquire_wait_ms: 30_000,
        ..corral_store::harness::test_pool_config()
    }
}

/// What happened, as the hosts saw it.
#[derive(Default)]
struct Truth {
    /// Stores made so far (each draws its own entropy).
    stores: u64,
    /// Tickets drawn so far.
    tickets: u64,
    /// Runs a replica started.
    started: BTreeSet<u64>,
    /// Runs that died with their replica, unanswered.
    died: BTreeSet<u64>,
    /// The API's runs whose requests are out, unanswered.
    in_flight: BTreeSet<u64>,
    /// Hosts crashed and not yet restarted.
    down: BTreeSet<String>,
    /// The world's name service.
    dns: Dns,
    /// The object store host's objects (they outlive its crashes).
    objects: Arc<InMemory>,
    /// Each slot's current worker id, as the backend assigned it.
    slots: BTreeMap<u64, Option<WorkerId>>,
    /// The pool document current now (none after Valkey lost its data), with its version.
    doc: Option<(String, PoolDoc)>,
    /// Executions: run -> where.
    executions: BTreeMap<u64, Vec<String>>,
    answers: BTreeMap<u64, Answer>,
    checks: BTreeMap<&'static str, u64>,
    violations: Vec<(&'static str, String)>,
    trace: Vec<String>,
}

impl Truth {
    fn verify(&mut self, name: &'static str, holds: bool, what: impl FnOnce() -> String) {
        *self.checks.entry(name).or_default() += 1;
        if !holds {
            let what = what();
            self.note(format!("VIOLATION {name}: {what}"));
            self.violations.push((name, what));
        }
    }

    fn note(&mut self, line: String) {
        let at = turmoil::sim_elapsed().unwrap_or_default();
        self.note_at(at, line);
    }

    fn note_at(&mut self, at: Duration, line: String) {
        self.trace.push(format!("{:>7} ms {line}", at.as_millis()));
    }
}

type Shared = Arc<Mutex<Truth>>;

fn lock(truth: &Shared) -> MutexGuard<'_, Truth> {
    truth.lock().unwrap_or_else(PoisonError::into_inner)
}

fn slot_name(slot: u64) -> String {
    format!("slot-{slot}")
}

fn replica_name(replica: u64) -> String {
    format!("api-{}", replica + 1)
}

/// The world's shape, drawn from its seed.
struct Plan {
    runs_per_replica: u64,
    run_ms: u64,
    /// How long every fifth run takes: longer than a lease, so that a fault during it can cost
    /// its holder the lease.
    long_ms: u64,
    stagger_ms: u64,
    faults: Vec<Fault>,
}

#[derive(Clone, Debug)]
struct Fault {
    at_ms: u64,
    heal_ms: u64,
    kind: FaultKind,
}

#[derive(Clone, Debug)]
enum FaultKind {
    /// A replica (or the controller) and Valkey cannot reach each other.
    PartitionValkey(String),
    /// A replica and a worker slot cannot reach each other.
    PartitionWorker(String, u64),
    /// Messages between a replica and a worker slot are held, then released together.
    HoldWorker(String, u64),
    /// Valkey crashes; it restarts from its last state, or empty.
    CrashValkey { keep: bool },
    /// The controller crashes and restarts.
    CrashController,
    /// An API replica crashes mid-run and restarts.
    CrashReplica(String),
    /// A worker slot's process crashes and restarts.
    CrashWorker(u64),
    /// A replica and the object store cannot reach each other.
    PartitionObjects(String),
    /// The object store host crashes and restarts (its objects are durable).
    CrashObjects,
    /// Lookups of a host's name fail, at once or after the resolver's timeout.
    Dns(String, dns::Failure),
}

impl Plan {
    fn from_seed(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0xDE_9107);
        let runs_per_replica = 2 + rng.below(5);
        let run_ms = 20 + rng.below(600);
        let long_ms = pool_config().lease_ttl_ms + rng.below(5_000);
        let stagger_ms = 50 + rng.below(400);
        // The runs start after the pool's first warm workers (a few seconds).
        let span = start_ms(runs_per_replica, stagger_ms) + run_ms;
        let replica = |rng: &mut Rng| replica_name(rng.below(API_HOSTS));
        let faults = (0..rng.below(5))
            .map(|_| Fault {
                // Half the faults strike while the runs go on.
                at_ms: if rng.below(2) == 0 {
                    rng.below(span)
                } else {
                    5_000 + rng.below(span - 5_000)
                },
                heal_ms: 200 + rng.below(12_000),
                kind: match rng.below(10) {
                    0 => FaultKind::PartitionValkey(if rng.below(2) == 0 {
                        "controller".to_owned()
                    } else {
                        replica(&mut rng)
                    }),
                    1 => FaultKind::PartitionWorker(replica(&mut rng), rng.below(SLOTS)),
                    2 => FaultKind::HoldWorker(replica(&mut rng), rng.below(SLOTS)),
                    3 => FaultKind::CrashValkey {
                        keep: rng.below(2) == 0,
                    },
                    4 => FaultKind::CrashController,
                    5 => FaultKind::CrashReplica(replica(&mut rng)),
                    6 => FaultKind::CrashWorker(rng.below(SLOTS)),
                    7 => FaultKind::PartitionObjects(replica(&mut rng)),
                    8 => FaultKind::CrashObjects,
                    _ => {
                        let name = match rng.below(3) {
                            0 => "valkey".to_owned(),
                            1 => "objects".to_owned(),
                            _ => slot_name(rng.below(SLOTS)),
                        };
                        let failure = if rng.below(2) == 0 {
                            dns::Failure::NotFound
                        } else {
                            dns::Failure::Timeout
                        };
                        FaultKind::Dns(name, failure)
                    }
                },
            })
            .collect();
        Self {
            runs_per_replica,
            run_ms,
            long_ms,
            stagger_ms,
            faults,
        }
    }

    fn runs(&self) -> u64 {
        self.runs_per_replica * API_HOSTS
    }

    fn lengths(&self) -> Lengths {
        Lengths {
            run_ms: self.run_ms,
            long_ms: self.long_ms,
        }
    }
}

/// Dials a worker by its id: the slot the backend gave it, on turmoil's network.
struct SlotDial(Shared);

impl Dial for SlotDial {
    fn dial<'a>(&'a self, host: &'a str, port: u16) -> Dialing<'a> {
        Box::pin(async move {
            let slot = lock(&self.0)
                .slots
                .iter()
                .find(|(_, id)| id.is_some_and(|id| id.to_string() == host))
                .map(|(slot, _)| slot_name(*slot));
            let Some(slot) = slot else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no worker {host}"),
                ));
            };
            let dns = lock(&self.0).dns.clone();
            let stream = dns.connect(&slot, port).await?;
            Ok(Box::new(stream) as Box<dyn Connection>)
        })
    }
}

fn worker_client(truth: &Shared) -> WorkerClient {
    WorkerClient::with_dial(
        Locator::Template(format!("http://{{id}}:{CONTROL_PORT}")),
        "sim".to_owned(),
        Arc::new(SlotDial(truth.clone())),
    )
}

/// A store over the world's network to `valkey`, its entropy drawn from `seed` and from how many
/// stores the world has made before (a restarted host draws epochs of its own, as a restarted
/// process does from the wall clock).
fn store(seed: u64, truth: &Shared) -> ValkeyStore {
    let (made, dns) = {
        let mut truth = lock(truth);
        truth.stores += 1;
        (truth.stores, truth.dns.clone())
    };
    let seed = seed ^ made.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ValkeyStore::over(
        Arc::new(valkey::TurmoilLink::new("valkey", seed, dns)),
        POOL,
    )
}

/// The backend: a created worker takes a free slot; a deleted one frees it.
struct SlotBackend(Shared);

impl Backend for SlotBackend {
    fn image(&self) -> ImageId {
        ImageId("sim-image".to_owned())
    }

    async fn create(
        &self,
        worker: WorkerId,
        _image: &ImageId,
        _claim_deadline: Option<UnixMillis>,
    ) -> Done {
        let mut truth = lock(&self.0);
        if truth.slots.values().any(|id| *id == Some(worker)) {
            return Done::Done;
        }
        let free = truth
            .slots
            .iter()
            .find(|(_, id)| id.is_none())
            .map(|(slot, _)| *slot);
        match free {
            Some(slot) => {
                truth.slots.insert(slot, Some(worker));
                truth.note(format!(
                    "controller creates {worker} on {}",
                    slot_name(slot)
                ));
                Done::Done
            }
            None => Done::Failed,
        }
    }

    async fn delete(&self, worker: WorkerId) -> Done {
        let mut truth = lock(&self.0);
        judge_delete(&mut truth, worker);
        let slots: Vec<u64> = truth
            .slots
            .iter()
            .filter(|(_, id)| **id == Some(worker))
            .map(|(slot, _)| *slot)
            .collect();
        for slot in slots {
            truth.slots.insert(slot, None);
            truth.note(format!(
                "controller deletes {worker} from {}",
                slot_name(slot)
            ));
        }
        Done::Done
    }

    async fn list(&self) -> Result<BTreeSet<WorkerId>, Unavailable> {
        Ok(lock(&self.0).slots.values().flatten().copied().collect())
    }
}

async fn controller_host(seed: u64, truth: Shared) -> turmoil::Result {
    let reconciler = Reconciler::new(
        store(seed, &truth),
        SlotBackend(truth.clone()),
        worker_client(&truth),
        pool_config(),
    );
    reconciler
        .run(Duration::from_millis(500), std::future::pending(), |pass| {
            if !pass.coordinated {
                lock(&truth).note("controller: coordination unavailable".to_owned());
            }
        })
        .await;
    Ok(())
}

/// A simulated worker in slot `slot`: every execute is judged against the pool document current
/// as it arrives, then takes `run_ms`; a reset answers clean evidence under its token.
async fn worker_host(slot: u64, truth: Shared, lengths: Lengths) -> turmoil::Result {
    serve_worker(move |request| worker_answer(request, slot, truth.clone(), lengths)).await
}

/// Judges an execute under token `token` reaching `slot` now: the document current now must hold
/// the slot's worker leased under exactly that token. A worker of an epoch the document no longer
/// has (Valkey lost its data) is an orphan whose lease ended with its epoch: not judged.
fn judge_execute(truth: &mut Truth, slot: u64, token: OpToken, run: u64) {
    let worker = truth.slots.get(&slot).copied().flatten();
    let held = match (&truth.doc, worker) {
        (_, None) => Err(format!(
            "{} runs code with no worker assigned",
            slot_name(slot)
        )),
        (Some((_, doc)), Some(worker)) if doc.epoch() == worker.epoch => {
            match doc.workers().get(&worker) {
                Some(w) if matches!(w.state, WorkerState::Leased(_)) && w.token == token => Ok(()),
                Some(w) => Err(format!(
                    "run {run} under token {} reached {worker}, which the pool holds as {:?} (token {})",
                    token.0,
                    w.state.kind(),
                    w.token.0
                )),
                None => Err(format!(
                    "run {run} under token {} reached {worker}, which the pool does not have",
                    token.0
                )),
            }
        }
        _ => return,
    };
    truth.verify("executed_without_lease", held.is_ok(), || {
        held.err().unwrap_or_default()
    });
}

/// Judges a delete of `worker` as the backend performs it: the pool must not hold it under a lease
/// that is still live (POOL-6: ownership ends only at expiry). A worker of an epoch the document no
/// longer has is an orphan: not judged.
fn judge_delete(truth: &mut Truth, worker: WorkerId) {
    let now = UnixMillis(valkey::deployment_ms());
    let live = match &truth.doc {
        Some((_, doc)) if doc.epoch() == worker.epoch => match doc.workers().get(&worker) {
            Some(w) => match &w.state {
                WorkerState::Leased(lease) if lease.expires_at > now => Some(lease.expires_at),
                _ => None,
            },
            None => None,
        },
        _ => return,
    };
    truth.verify("deleted_while_leased", live.is_none(), || {
        format!(
            "{worker} deleted while its lease runs {} ms more",
            live.map_or(0, |at| at.0.saturating_sub(now.0))
        )
    });
}

/// Judges a run whose holder says, after its code ran, that it still holds its lease: the document
/// current now must agree (a worker of an epoch Valkey no longer has is an orphan: not judged).
fn judge_kept(truth: &mut Truth, run: u64, granted: lease::Granted) {
    let worker = granted.worker;
    let held = match &truth.doc {
        Some((_, doc)) if doc.epoch() == worker.epoch => match doc.workers().get(&worker) {
            Some(w) if matches!(w.state, WorkerState::Leased(_)) && w.token == granted.token => {
                Ok(())
            }
            other => Err(format!(
                "run {run} holds {worker} under token {} by its holder's word; the pool has {:?}",
                granted.token.0,
                other.map(|w| (w.state.kind(), w.token.0))
            )),
        },
        _ => return,
    };
    truth.verify("kept_after_lease_lost", held.is_ok(), || {
        held.err().unwrap_or_default()
    });
}

async fn worker_answer(
    request: hyper::Request<hyper::body::Incoming>,
    slot: u64,
    truth: Shared,
    lengths: Lengths,
) -> Result<Response, Infallible> {
    let path = request.uri().path().to_owned();
    // The worker's own guard: a request that names another worker (a delayed one reaching the
    // next worker at this address) is refused before anything runs.
    let this = lock(&truth).slots.get(&slot).copied().flatten();
    let named = request
        .headers()
        .get(corral_contract::routes::WORKER_ID_HEADER)
        .map(|named| named.as_bytes().to_vec());
    let this_text = this.map(|id| id.to_string()).unwrap_or_default();
    if this.is_none() || !corral_contract::routes::meant_for(&path, named.as_deref(), &this_text) {
        lock(&truth).note(format!(
            "{} refuses a request for {:?}: wrong_worker",
            slot_name(slot),
            named.map(|n| String::from_utf8_lossy(&n).into_owned())
        ));
        let body = corral_contract::error::ErrorBody::new(
            corral_contract::error::ErrorCode::WrongWorker,
            corral_contract::error::ErrorDetail {
                this_worker: this.map(|id| id.to_string()),
                ..corral_contract::error::ErrorDetail::default()
            },
        );
        return Ok(status(
            421,
            Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
        ));
    }
    Ok(worker_routes(request, |order| async move {
        let run = run_of(&order);
        {
            let mut truth = lock(&truth);
            truth.note(format!(
                "{} executes run {run} under token {}",
                slot_name(slot),
                order.token.0
            ));
            judge_execute(&mut truth, slot, order.token, run);
            truth
                .executions
                .entry(run)
                .or_default()
                .push(slot_name(slot));
        }
        tokio::time::sleep(lengths.of(run)).await;
        // A worker deleted while its code ran took the run with it: its process is gone, and
        // the run's connection never answers.
        if lock(&truth).slots.get(&slot).copied().flatten() != this {
            std::future::pending::<()>().await;
        }
    })
    .await)
}

/// How long runs take: most `run_ms`, every fifth `long_ms`.
#[derive(Clone, Copy)]
struct Lengths {
    run_ms: u64,
    long_ms: u64,
}

impl Lengths {
    fn of(self, run: u64) -> Duration {
        Duration::from_millis(if run % 5 == 2 {
            self.long_ms
        } else {
            self.run_ms
        })
    }
}

/// An API replica's ports for the lease holder driver, and the kernels' sessions it holds.
struct Replica {
    name: String,
    store: ValkeyStore,
    workers: WorkerClient,
    /// The API's own workspace store, over the world's object store host.
    workspaces: Workspaces,
    affinity: Sessions,
    truth: Shared,
}

impl HoldsSessions for Replica {
    fn affinity(&self) -> &Sessions {
        &self.affinity
    }
}

impl HolderPorts for Replica {
    fn store(&self) -> &ValkeyStore {
        &self.store
    }
    fn pool(&self) -> PoolConfig {
        pool_config()
    }
    fn workers(&self) -> &WorkerClient {
        &self.workers
    }
    fn unperformed(&self, what: &'static str) {
        lock(&self.truth).note(format!("{}: {what}", self.name));
    }
}

/// An API replica: performs its share of the runs, each from its scheduled time. A replica that
/// crashed and restarted starts the runs it had not started; those it had started and not
/// answered died with it (their leases expire and the pool takes the workers over).
async fn api_host(
    replica: u64,
    seed: u64,
    plan_runs: u64,
    stagger_ms: u64,
    truth: Shared,
) -> turmoil::Result {
    let ports = Arc::new(Replica {
        name: replica_name(replica),
        store: store(seed, &truth),
        workers: worker_client(&truth),
        workspaces: workspaces(&truth),
        affinity: Sessions::default(),
        truth: truth.clone(),
    });
    let mine: Vec<u64> = (0..plan_runs).map(|n| replica * plan_runs + n).collect();
    {
        let mut truth = lock(&truth);
        let died: Vec<u64> = mine
            .iter()
            .filter(|run| truth.started.contains(run) && !truth.answers.contains_key(run))
            .copied()
            .filter(|run| !truth.died.contains(run))
            .collect();
        for run in died {
            truth.note(format!("run {run} died with {}", replica_name(replica)));
            truth.died.insert(run);
        }
    }
    let mut tasks = Vec::new();
    for (n, run) in mine.into_iter().enumerate() {
        if lock(&truth).started.contains(&run) {
            continue;
        }
        let ports = ports.clone();
        let truth = truth.clone();
        let at = Duration::from_millis(start_ms(n as u64, stagger_ms));
        tasks.push(tokio::spawn(async move {
            let now = turmoil::sim_elapsed().unwrap_or_default();
            tokio::time::sleep(at.saturating_sub(now)).await;
            lock(&truth).started.insert(run);
            one_run(run, kernel_of(run, plan_runs), &ports).await;
        }));
    }
    for task in tasks {
        task.await?;
    }
    // A replica serves on; the world ends when its observer has judged it.
    std::future::pending::<()>().await;
    Ok(())
}

/// The API itself: its own state over the world's store, object store and workers, its own
/// router served on the world's network.
async fn api_http_host(seed: u64, truth: Shared) -> turmoil::Result {
    let state = api_http::state(
        &pool_config(),
        store(seed, &truth),
        workspaces(&truth),
        worker_client(&truth),
    )?;
    api_http::serve(state).await
}

/// The world's agent platform: sends the API's share of the runs to it over HTTP, one at a
/// time, each at its time or once the one before is answered, waiting while the API is down.
/// (One at a time: two answers the API writes in the same instant could reach the client in
/// either order from one process to the next, and a seed must replay exactly.)
async fn http_client(per_replica: u64, stagger_ms: u64, truth: Shared) -> turmoil::Result {
    for n in 0..per_replica {
        let run = REPLICAS * per_replica + n;
        let at = Duration::from_millis(start_ms(n, stagger_ms));
        let now = turmoil::sim_elapsed().unwrap_or_default();
        tokio::time::sleep(at.saturating_sub(now)).await;
        while lock(&truth).down.contains(API) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        http_run(run, &truth).await;
    }
    Ok(())
}

/// One run through the API's `run_code`, its answer judged as it is read.
async fn http_run(run: u64, truth: &Shared) {
    let actor = format!("actor-{}", run % 4);
    let body = api_http::run_code(run, &actor, WORKSPACE_CONVERSATION);
    {
        let mut truth = lock(truth);
        truth.note(format!("run {run} sent to {API}"));
        truth.started.insert(run);
        truth.in_flight.insert(run);
    }
    let answered = api_http::call(API, &body).await;
    let judged = match &answered {
        Ok((_, body)) => Some(judge_http_answer(run, body, truth).await),
        Err(_) => None,
    };
    let mut truth = lock(truth);
    truth.in_flight.remove(&run);
    match answered {
        Err(why) => truth.note(format!("run {run} on {API}: no answer ({why})")),
        Ok((status, body)) => {
            let outcome = body["outcome"].as_str().unwrap_or_default().to_owned();
            let code = body["error"]["code"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            truth.note(format!(
                "run {run} on {API} answered {status} {outcome} {code} workspace {}",
                body["model"]["workspace"]
            ));
            if outcome != "succeeded" {
                truth.verify("refusal_without_code", !code.is_empty(), || {
                    format!("run {run} answered {status} {outcome} without a code: {body}")
                });
            }
            if let Some(judged) = judged {
                let holds = judged.is_ok();
                truth.verify("answered_without_save", holds, || {
                    judged.err().unwrap_or_default()
                });
            }
            let answer = if outcome == "refused" {
                Answer::Refusal
            } else {
                Answer::Decided
            };
            truth.answers.insert(run, answer);
        }
    }
}

/// Judges the API's answer to run `run`: `succeeded` with its workspace saved means the object
/// store holds that generation with exactly what the run left; any other outcome carries a code.
async fn judge_http_answer(
    run: u64,
    body: &serde_json::Value,
    truth: &Shared,
) -> Result<(), String> {
    let outcome = body["outcome"].as_str().unwrap_or_default();
    if outcome != "succeeded" {
        return match body["error"]["code"].as_str() {
            Some(code) if !code.is_empty() => Ok(()),
            _ => Err(format!(
                "run {run} answered {outcome} without a reported failure"
            )),
        };
    }
    let workspace = &body["model"]["workspace"];
    if workspace["unchanged"].as_bool() == Some(true) {
        return Ok(());
    }
    let (Some(true), Some(generation)) = (
        workspace["saved"].as_bool(),
        workspace["generation"].as_u64(),
    ) else {
        return Err(format!(
            "run {run} answered succeeded with its workspace {workspace}"
        ));
    };
    stored_as(run, generation, &crate::workspace_left(run), truth).await
}

/// How far apart a replica's waves of runs are: longer than a lease, so that a fault between
/// two cells of one kernel can cost the session its lease.
const WAVE_MS: u64 = 6_000;

/// When a replica's `n`-th run starts: after the pool's first workers are warm (a few seconds),
/// in waves of two (a run and a kernel's cell) [`WAVE_MS`] apart, each `stagger_ms` after the one
/// before.
fn start_ms(n: u64, stagger_ms: u64) -> u64 {
    5_000 + n * stagger_ms + (n / 2) * WAVE_MS
}

/// Whether run `run` of a replica running `per_replica` runs is a persistent cell (KER-4,
/// affinity mode), and of which kernel: every second run is a cell of its replica's one kernel,
/// so a kernel's session is held between waves and continued by the next cell.
fn kernel_of(run: u64, per_replica: u64) -> Option<String> {
    (run % 2 == 1).then(|| format!("kernel-{}", run / per_replica.max(1)))
}

/// The workspace run `run` reads and saves: four workspaces shared by the world's runs, so that
/// two runs of one workspace race to save (WS-5).
fn workspace_of(run: u64) -> String {
    corral_core::workspace::storage_key(&format!("actor-{}", run % 4), WORKSPACE_CONVERSATION)
}

/// The conversation every run's workspace belongs to.
const WORKSPACE_CONVERSATION: &str = "conversation";

/// One run or persistent cell as it goes: what its steps have produced so far.
struct Cell<'a> {
    run: u64,
    kernel: Option<String>,
    ports: &'a Arc<Replica>,
    holder: Option<Holder>,
    watch: Option<VersionWatch>,
    claim: Option<ClaimGuard<'a>>,
    /// The snapshot the run started from.
    restored: Option<Snapshot>,
    /// The worker's reply.
    reply: Option<ExecuteReply>,
    /// What keeping did and the outcome it decided.
    kept: Option<(Keeping, Decided)>,
}

/// One run or persistent cell: corral-core's sequence, performed by this replica's shells (the
/// store's acquire, the API's lease holder and kernel sessions, the worker client, the API's
/// workspace store and its keeping).
async fn one_run(run: u64, kernel: Option<String>, ports: &Arc<Replica>) {
    let (mut sequence, first) = Sequence::start(kernel.is_some());
    let mut queue = VecDeque::from(first);
    let mut cell = Cell {
        run,
        kernel,
        ports,
        holder: None,
        watch: None,
        claim: None,
        restored: None,
        reply: None,
        kept: None,
    };
    while let Some(effect) = queue.pop_front() {
        if let Effect::Answer(answer) = effect {
            let kept = cell.kept.as_ref().map(|(keeping, decided)| Judged {
                keeping,
                decided,
                left: cell.reply.as_ref().and_then(|r| r.workspace.archive()),
            });
            answered(run, ports, answer, kept).await;
            return;
        }
        let Some(event) = cell.perform(effect).await else {
            continue;
        };
        match sequence.on(event) {
            Ok(next) => queue.extend(next),
            Err(unexpected) => {
                lock(&ports.truth).note(format!("run {run}: {unexpected:?}"));
                return;
            }
        }
    }
}

impl<'a> Cell<'a> {
    /// Performs one effect; the event that answers it, if it asks one.
    async fn perform(&mut self, effect: Effect) -> Option<Event> {
        let (run, ports) = (self.run, self.ports);
        Some(match effect {
            Effect::Scope => Event::Scoped(Some(self.kernel.is_some())),
            Effect::TakeSession => self.take_session(),
            Effect::Acquire => acquire(run, ports, &mut self.holder, &mut self.watch).await,
            Effect::ReadInputs => self.read_inputs().await,
            Effect::Project => Event::Projected(true),
            Effect::Execute => {
                let (call, reply) = execute(run, ports, self.holder.as_ref()).await;
                self.reply = reply;
                Event::Executed(call)
            }
            Effect::Keep => self.keep().await,
            Effect::Link => Event::Linked,
            Effect::CheckLease => {
                let lost = self.holder.as_ref().is_none_or(Holder::lost);
                if let (false, Some(holder)) = (lost, self.holder.as_ref()) {
                    judge_kept(&mut lock(&ports.truth), run, holder.granted());
                }
                Event::LeaseChecked { lost }
            }
            Effect::Release(disposition) => {
                if let Some(holder) = self.holder.take() {
                    holder.release(disposition);
                }
                return None;
            }
            Effect::HoldSession => {
                if let (Some(guard), Some(holder)) = (&self.claim, self.holder.take()) {
                    let archive = self
                        .kept
                        .as_ref()
                        .and_then(|(keeping, _)| keeping.retained.clone());
                    let session = affinity::Session {
                        holder,
                        archive: Some(archive.unwrap_or_default()),
                        idle_since: tokio::time::Instant::now(),
                    };
                    ports.affinity.put(ports, guard.claim(), session);
                }
                return None;
            }
            Effect::EndSession(reason) => {
                if let Some(guard) = &self.claim {
                    ports
                        .affinity
                        .end(guard.claim(), reason.map(SessionEnded::message));
                }
                return None;
            }
            Effect::Answer(_) => return None,
        })
    }

    fn take_session(&mut self) -> Event {
        let (run, ports) = (self.run, self.ports);
        let key = self.kernel.as_deref().unwrap_or_default();
        let (taken, claimed) = ports.affinity.take(key);
        self.claim = claimed.map(|c| ports.affinity.guard(c));
        Event::SessionTaken(match taken {
            affinity::Taken::Busy => Taken::Busy,
            affinity::Taken::Session(session) => {
                let archive = session.archive.is_some();
                lock(&ports.truth).note(format!(
                    "run {run} continues {key} on {}",
                    session.holder.granted().worker
                ));
                self.holder = Some(session.holder);
                Taken::Session { archive }
            }
            affinity::Taken::Absent { .. } => Taken::Absent,
        })
    }

    /// The workspace's newest snapshot, read through the API's workspace store (WS-1).
    async fn read_inputs(&mut self) -> Event {
        match self.ports.workspaces.latest(&workspace_of(self.run)).await {
            Ok(restored) => {
                self.restored = restored;
                Event::InputsRead(true)
            }
            Err(error) => {
                let (run, code) = (self.run, error.code());
                let mut truth = lock(&self.ports.truth);
                truth.note(format!("run {run} cannot read its workspace: {code}"));
                truth.verify("refusal_without_code", !code.is_empty(), || {
                    format!("run {run}'s workspace read refused without a code")
                });
                Event::InputsRead(false)
            }
        }
    }

    /// Keeps what the worker's reply says the run left, with the API's own keeping (WS-2, WS-5).
    async fn keep(&mut self) -> Event {
        let Some(reply) = &self.reply else {
            return Event::Executed(Call::Lost);
        };
        let key = workspace_of(self.run);
        let run_id = format!("run-{}", self.run);
        let storage = keep::Storage {
            workspaces: &self.ports.workspaces,
            persist: true,
            max_artifact_bytes: u64::MAX,
        };
        let run = keep::Run {
            key: &key,
            run_id: &run_id,
            restored: self.restored.as_ref(),
            declared: &[],
        };
        let how = keep::How {
            retain: self.kernel.is_some(),
            publish: None,
        };
        let (keeping, decided) = keep::kept(storage, run, reply, how).await;
        let kept = Kept {
            succeeded: decided.outcome == RunOutcome::Succeeded,
            install_failed: false,
            checkpoint_refused: false,
            retained: keeping.retained.is_some(),
        };
        lock(&self.ports.truth).note(format!(
            "run {} kept {:?} ({:?})",
            self.run, keeping.kept, decided.outcome
        ));
        self.kept = Some((keeping, decided));
        Event::Kept(kept)
    }
}

/// What a run kept and decided, with the workspace its worker returned.
struct Judged<'a> {
    keeping: &'a Keeping,
    decided: &'a Decided,
    left: Option<Vec<u8>>,
}

/// Answers run `run`, judging what it answers: a `succeeded` run's workspace is stored as the
/// generation it names, holding what the run left, or retained beside its kernel's lease; any
/// other decided outcome reports its failure with a stable code.
async fn answered(run: u64, ports: &Replica, answer: Answer, kept: Option<Judged<'_>>) {
    let judged = match (&answer, kept) {
        (Answer::Decided, Some(kept)) => Some(judge_kept_workspace(run, ports, kept).await),
        _ => None,
    };
    let mut truth = lock(&ports.truth);
    truth.note(format!("run {run} answered {answer:?}"));
    if let Some(judged) = judged {
        let holds = judged.is_ok();
        truth.verify("answered_without_save", holds, || {
            judged.err().unwrap_or_default()
        });
    }
    truth.answers.insert(run, answer);
}

async fn judge_kept_workspace(run: u64, ports: &Replica, kept: Judged<'_>) -> Result<(), String> {
    let Judged {
        keeping,
        decided,
        left,
    } = kept;
    if decided.outcome != RunOutcome::Succeeded {
        return match &decided.error {
            Some(_) => Ok(()),
            None => Err(format!(
                "run {run} answered {:?} without a reported failure",
                decided.outcome
            )),
        };
    }
    if keeping.retained.is_some() || keeping.unchanged {
        return Ok(());
    }
    let Stored::Stored {
        generation: Some(generation),
    } = keeping.kept
    else {
        return Err(format!(
            "run {run} answered succeeded having stored {:?}",
            keeping.kept
        ));
    };
    stored_as(run, generation, &left.unwrap_or_default(), &ports.truth).await
}

/// Whether the object store holds generation `generation` of run `run`'s workspace with exactly
/// `left`, read straight from its objects (not over the network), as the run's answer says.
async fn stored_as(run: u64, generation: u64, left: &[u8], truth: &Shared) -> Result<(), String> {
    let objects = lock(truth).objects.clone();
    let held = Workspaces::new(objects, "")
        .generation(&workspace_of(run), generation)
        .await;
    match held {
        Ok(Some(snapshot)) if snapshot.archive.as_ref() == left => Ok(()),
        other => Err(format!(
            "run {run} answered succeeded with generation {generation} of its workspace, \
             which the object store holds as {:?} bytes",
            other.map(|s| s.map(|s| s.archive.len()))
        )),
    }
}

/// A replica's workspace store: the API's own, over the world's object store host.
fn workspaces(truth: &Shared) -> Workspaces {
    let dns = lock(truth).dns.clone();
    Workspaces::new(Arc::new(TurmoilObjects::new("objects", dns)), "")
}

/// The store's one acquire; a grant is held by the API's lease holder driver.
async fn acquire(
    run: u64,
    ports: &Arc<Replica>,
    holder: &mut Option<Holder>,
    watch: &mut Option<VersionWatch>,
) -> Event {
    let member = MemberId(format!("m{}", run % 4));
    // A ticket of its own for every acquire, as the API draws one at random.
    let ticket = {
        let mut truth = lock(&ports.truth);
        truth.tickets += 1;
        TicketId(1_000 + truth.tickets)
    };
    let command = Command::Acquire {
        ticket,
        member: member.clone(),
        scope: LeaseScope {
            namespace: LeaseNamespace::Code,
            actor: ActorId(format!("actor-{run}")),
            conversation: ConversationId(format!("c-{run}")),
        },
        wait_ms: pool_config().acquire_wait_ms,
        stack: false,
    };
    lock(&ports.truth).note(format!("run {run} on {} asks for a lease", ports.name));
    let wait = Duration::from_millis(pool_config().acquire_wait_ms);
    match lease::acquire(&ports.store, &pool_config(), &command, wait, watch).await {
        Ok(granted) => {
            lock(&ports.truth).note(format!(
                "run {run} on {} leased {} (token {})",
                ports.name, granted.worker, granted.token.0
            ));
            *holder = Some(Holder::start(ports.clone(), granted, granted.since));
            Event::Acquired
        }
        Err(error) => {
            let code = error.code();
            {
                let mut truth = lock(&ports.truth);
                truth.note(format!("run {run} on {} refused {code}", ports.name));
                truth.verify("refusal_without_code", !code.is_empty(), || {
                    format!("run {run} refused without a code")
                });
            }
            if let AcquireError::WaitTimeout { orders } = error {
                corral_api::run::lease::perform_orders(ports.clone(), orders);
            }
            Event::AcquireRefused
        }
    }
}

async fn execute(
    run: u64,
    ports: &Replica,
    holder: Option<&Holder>,
) -> (Call, Option<ExecuteReply>) {
    let Some(granted) = holder.map(Holder::granted) else {
        return (Call::Lost, None);
    };
    let (request, bounds) = execute_order(run, granted.token);
    let (call, reply) = match ports
        .workers
        .execute(granted.worker, &request, &bounds)
        .await
    {
        Ok(reply) => (Call::Answered, Some(reply)),
        Err(error) => (error.as_call(), None),
    };
    lock(&ports.truth).note(format!("run {run} on {}: {call:?}", granted.worker));
    (call, reply)
}

/// Records every pool document Valkey writes, and judges it with corral-core's own checks.
fn observer(truth: Shared) -> valkey::Observer {
    let key = format!("corral:pool:{POOL}");
    Arc::new(move |data: &Data, written: &str| {
        if written != key {
            return;
        }
        let mut truth = lock(&truth);
        let Some(hash) = data.hash(&key) else {
            truth.doc = None;
            return;
        };
        let (Some(version), Some(text)) = (hash.get("version"), hash.get("doc")) else {
            return;
        };
        if truth.doc.as_ref().is_some_and(|(v, _)| v == version) {
            return;
        }
        let Ok(doc) = serde_json::from_str::<PoolDoc>(text) else {
            truth.verify("pool_doc_unsound", false, || {
                format!("version {version} does not parse")
            });
            return;
        };
        let problems = doc.check(&pool_config());
        truth.verify("pool_doc_unsound", problems.is_empty(), || {
            format!("version {version}: {problems:?}")
        });
        truth.doc = Some((version.clone(), doc));
    })
}

/// Runs the world of `seed`.
pub fn run_world(seed: u64) -> Outcome {
    let plan = Plan::from_seed(seed);
    // The API draws its ids (tickets, runs) from the world's seed.
    corral_contract::credential::simulated::seed(Some(seed ^ 0xA9_1D));
    let truth: Shared = Arc::default();
    {
        let mut t = lock(&truth);
        t.slots = (0..SLOTS).map(|slot| (slot, None)).collect();
        for name in INVARIANTS {
            t.checks.insert(name, 0);
        }
    }
    let data: Arc<Mutex<Data>> = Arc::default();

    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(Duration::from_millis(10))
        .simulation_duration(Duration::from_secs(WORLD_SECONDS))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(1 + seed % 10))
        .build();
    hosts(&mut sim, &plan, seed, &truth, &data);
    let quiet_ms = plan
        .faults
        .iter()
        .map(|f| f.at_ms + f.heal_ms)
        .max()
        .unwrap_or(0);
    sim.client("observer", settle(plan.runs(), quiet_ms, truth.clone()));
    lock(&truth).note(format!(
        "deploy seed {seed}: {} runs of {} ms (every fifth {} ms), faults {:?}",
        plan.runs(),
        plan.run_ms,
        plan.long_ms,
        plan.faults
    ));
    let ended = drive(&mut sim, &plan, &truth, &data);
    drop(sim);
    corral_contract::credential::simulated::seed(None);
    // What the hosts saw, taken whole (a task of a host could still hold the world's truth).
    let mut truth = std::mem::take(&mut *lock(&truth));
    for run in 0..plan.runs() {
        let at = truth.executions.get(&run).cloned().unwrap_or_default();
        truth.verify("deploy_run_executed_twice", at.len() <= 1, || {
            format!("run {run} executed on {at:?}")
        });
        let answered = truth.answers.contains_key(&run) || truth.died.contains(&run);
        truth.verify("deploy_run_unanswered", answered, || {
            format!("run {run} never answered ({ended:?})")
        });
    }
    Outcome {
        checks: truth.checks,
        violations: truth.violations,
        trace: truth.trace,
    }
}

/// The world's hosts: the object store, Valkey, the controller, the worker slots, the replicas
/// the world sequences, the API itself and its client.
fn hosts(
    sim: &mut turmoil::Sim<'_>,
    plan: &Plan,
    seed: u64,
    truth: &Shared,
    data: &Arc<Mutex<Data>>,
) {
    let objects = lock(truth).objects.clone();
    sim.host("objects", move || objects::host(objects.clone()));
    let starts = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let (data, observe, starts) = (data.clone(), observer(truth.clone()), starts.clone());
        sim.host("valkey", move || {
            let n = starts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            valkey::host(data.clone(), format!("{seed:x}r{n}"), observe.clone())
        });
    }
    {
        let truth = truth.clone();
        sim.host("controller", move || controller_host(seed, truth.clone()));
    }
    for slot in 0..SLOTS {
        let (truth, lengths) = (truth.clone(), plan.lengths());
        sim.host(slot_name(slot).as_str(), move || {
            worker_host(slot, truth.clone(), lengths)
        });
    }
    for replica in 0..REPLICAS {
        let (truth, runs, stagger) = (truth.clone(), plan.runs_per_replica, plan.stagger_ms);
        sim.host(replica_name(replica).as_str(), move || {
            api_host(replica, seed, runs, stagger, truth.clone())
        });
    }
    {
        let host_truth = truth.clone();
        sim.host(API, move || api_http_host(seed, host_truth.clone()));
        let (truth, runs, stagger) = (truth.clone(), plan.runs_per_replica, plan.stagger_ms);
        sim.client("client", http_client(runs, stagger, truth));
    }
}

/// Waits for every run's answer and the last fault's healing, then gives the pool at most
/// [`SETTLE_SECONDS`] to be warm again with nothing quarantined, resetting or leased.
async fn settle(runs: u64, quiet_ms: u64, truth: Shared) -> turmoil::Result {
    loop {
        let ended = {
            let truth = lock(&truth);
            (truth.answers.len() + truth.died.len()) as u64
        };
        let now = turmoil::sim_elapsed().unwrap_or_default().as_millis();
        if ended >= runs && now >= u128::from(quiet_ms) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let config = pool_config();
    // Restored: as many workers usable as the pool itself wants (corral-core's `desired`: the
    // warm minimum, or the held leases and the idle target, within the ceiling), with nothing
    // quarantined or resetting.
    let restored = |truth: &Truth| {
        let state = truth
            .doc
            .as_ref()
            .map(|(_, doc)| (doc.counts(), doc.desired(&config)));
        let done = state.is_some_and(|(c, desired)| {
            c.warm + c.leased >= desired && c.quarantined == 0 && c.resetting == 0
        });
        (done, state)
    };
    for _ in 0..SETTLE_SECONDS * 2 {
        if restored(&lock(&truth)).0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut truth = lock(&truth);
    let (done, state) = restored(&truth);
    truth.verify("pool_not_restored", done, || {
        format!("{SETTLE_SECONDS} s after the last run and fault the pool is {state:?}")
    });
    Ok(())
}

fn drive(
    sim: &mut turmoil::Sim<'_>,
    plan: &Plan,
    truth: &Shared,
    data: &Arc<Mutex<Data>>,
) -> Result<(), String> {
    let faults = plan
        .faults
        .iter()
        .map(|f| (f.at_ms, f.heal_ms, f.kind.clone()));
    step_with_faults(sim, faults.collect(), |sim, kind, start| {
        apply(sim, kind, start, truth, data);
        let what = if start { "fault" } else { "healed" };
        lock(truth).note_at(sim.elapsed(), format!("{what} {kind:?}"));
    })
}

fn apply(
    sim: &mut turmoil::Sim<'_>,
    kind: &FaultKind,
    start: bool,
    truth: &Shared,
    data: &Arc<Mutex<Data>>,
) {
    match (kind, start) {
        (FaultKind::PartitionValkey(host), true) => sim.partition(host.as_str(), "valkey"),
        (FaultKind::PartitionValkey(host), false) => sim.repair(host.as_str(), "valkey"),
        (FaultKind::PartitionWorker(host, slot), true) => {
            sim.partition(host.as_str(), slot_name(*slot).as_str());
        }
        (FaultKind::PartitionWorker(host, slot), false) => {
            sim.repair(host.as_str(), slot_name(*slot).as_str());
        }
        (FaultKind::HoldWorker(host, slot), true) => {
            sim.hold(host.as_str(), slot_name(*slot).as_str())
        }
        (FaultKind::HoldWorker(host, slot), false) => {
            sim.release(host.as_str(), slot_name(*slot).as_str());
        }
        (FaultKind::CrashValkey { .. }, true) => sim.crash("valkey"),
        (FaultKind::CrashValkey { keep }, false) => {
            if !keep {
                data.lock().unwrap_or_else(PoisonError::into_inner).clear();
                lock(truth).doc = None;
            }
            sim.bounce("valkey");
        }
        (FaultKind::CrashReplica(host), true) => {
            sim.crash(host.as_str());
            let mut truth = lock(truth);
            truth.down.insert(host.clone());
            if host == API {
                // The API's runs out now die with it (the client's requests get no answer).
                let lost = std::mem::take(&mut truth.in_flight);
                truth.died.extend(lost);
            }
        }
        (FaultKind::CrashReplica(host), false) => {
            sim.bounce(host.as_str());
            lock(truth).down.remove(host);
        }
        (FaultKind::CrashController, true) => sim.crash("controller"),
        (FaultKind::CrashController, false) => sim.bounce("controller"),
        (FaultKind::CrashWorker(slot), true) => sim.crash(slot_name(*slot).as_str()),
        (FaultKind::CrashWorker(slot), false) => sim.bounce(slot_name(*slot).as_str()),
        (FaultKind::PartitionObjects(host), true) => sim.partition(host.as_str(), "objects"),
        (FaultKind::PartitionObjects(host), false) => sim.repair(host.as_str(), "objects"),
        (FaultKind::CrashObjects, true) => sim.crash("objects"),
        (FaultKind::CrashObjects, false) => sim.bounce("objects"),
        (FaultKind::Dns(name, failure), true) => lock(truth).dns.fail(name, *failure),
        (FaultKind::Dns(name, _), false) => lock(truth).dns.heal(name),
    }
}

/// The first seed from `from` whose world cuts a replica off from Valkey while its runs start (a
/// partition during the burst).
#[cfg(test)]
fn valkey_partition_seed(from: u64) -> u64 {
    (from..)
        .find(|seed| {
            let plan = Plan::from_seed(*seed);
            let burst = 5_000..start_ms(plan.runs_per_replica, plan.stagger_ms);
            plan.faults.iter().any(|f| {
                matches!(&f.kind, FaultKind::PartitionValkey(host) if host.starts_with("api"))
                    && f.at_ms < burst.end
                    && f.at_ms + f.heal_ms > burst.start
            })
        })
        .unwrap_or(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_seed_replays_exactly_with_every_run_answered() {
        let (first, second) = (run_world(3), run_world(3));
        assert_eq!(first.trace, second.trace);
        assert!(first.violations.is_empty(), "{:?}", first.violations);
        assert!(first.checks["executed_without_lease"] >= 1);
        assert!(first.checks["deploy_run_unanswered"] >= 6);
        assert_eq!(first.checks["pool_not_restored"], 1);
    }

    #[test]
    fn pool_11_a_valkey_partition_during_a_burst_replays_identically_and_breaks_nothing() {
        let seed = valkey_partition_seed(0);
        println!("the first seed with a Valkey partition during the burst: {seed}");
        let (first, second) = (run_world(seed), run_world(seed));
        assert!(
            first
                .trace
                .iter()
                .any(|l| l.contains("fault PartitionValkey(\"api-")),
            "seed {seed} has no partition of a replica from Valkey"
        );
        assert_eq!(first.trace, second.trace, "seed {seed}");
        assert!(
            first.violations.is_empty(),
            "seed {seed}: {:?}",
            first.violations
        );
    }

    /// When each line of `trace` happened (ms), and what it says.
    fn timed(trace: &[String]) -> Vec<(u64, &str)> {
        trace
            .iter()
            .filter_map(|line| {
                let (at, what) = line.trim_start().split_once(" ms ")?;
                Some((at.parse().ok()?, what))
            })
            .collect()
    }

    /// A run of `seed` granted its lease more than a lease's TTL after asking, on a replica the
    /// world never cuts off from Valkey: (run, replica, the line index of its grant).
    fn queued_past_ttl(seed: u64, trace: &[(u64, &str)]) -> Option<(u64, String, usize)> {
        let plan = Plan::from_seed(seed);
        let cut_off = |replica: &str| {
            plan.faults.iter().any(|f| match &f.kind {
                FaultKind::PartitionValkey(host) => host == replica,
                FaultKind::CrashValkey { .. } => true,
                FaultKind::Dns(name, _) => name == "valkey",
                _ => false,
            })
        };
        let mut asked = BTreeMap::new();
        for (index, (at, what)) in trace.iter().enumerate() {
            let words: Vec<&str> = what.split(' ').collect();
            let [first, run, on, replica, verb, ..] = words[..] else {
                continue;
            };
            let (Ok(run), "run", "on") = (run.parse::<u64>(), first, on) else {
                continue;
            };
            match verb {
                "asks" => {
                    asked.insert(run, *at);
                }
                "leased"
                    if asked
                        .get(&run)
                        .is_some_and(|asked| at - asked > pool_config().lease_ttl_ms)
                        && !cut_off(replica) =>
                {
                    return Some((run, replica.to_owned(), index));
                }
                _ => {}
            }
        }
        None
    }

    #[test]
    fn pool_06_a_lease_granted_after_queueing_longer_than_its_ttl_is_held_not_lost() {
        let (seed, run, replica, outcome, granted) = (0..50)
            .find_map(|seed| {
                let outcome = run_world(seed);
                let found = queued_past_ttl(seed, &timed(&outcome.trace));
                found.map(|(run, replica, at)| (seed, run, replica, outcome, at))
            })
            .expect("a seed within 50 queues a run longer than a lease's TTL");
        println!("seed {seed}: run {run} on {replica} queued longer than a lease's TTL");
        let trace = timed(&outcome.trace);
        let answered = format!("run {run} answered ");
        let end = trace[granted..]
            .iter()
            .position(|(_, what)| what.starts_with(&answered))
            .expect("the run is answered");
        let lost = format!("{replica}: lease_lost");
        let lost_meanwhile: Vec<_> = trace[granted..granted + end]
            .iter()
            .filter(|(_, what)| *what == lost)
            .collect();
        assert!(
            lost_meanwhile.is_empty(),
            "seed {seed}: {replica}, never cut off from Valkey, lost a lease while run {run} ran \
             on the lease it queued for: {lost_meanwhile:?}"
        );
        assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    }

    #[test]
    fn a_worker_reached_under_a_token_the_pool_does_not_hold_is_a_violation() {
        let mut truth = Truth::default();
        let worker = WorkerId { epoch: 7, seq: 0 };
        truth.slots.insert(0, Some(worker));
        // A pool of the worker's epoch that does not hold it: judged, and broken.
        let doc = PoolDoc::new(7, UnixMillis(valkey::WORLD_EPOCH_MS));
        truth.doc = Some(("1".to_owned(), doc));
        judge_execute(&mut truth, 0, OpToken(99), 1);
        assert_eq!(truth.checks["executed_without_lease"], 1);
        assert_eq!(truth.violations.len(), 1, "{:?}", truth.violations);
        // A pool of a later epoch (Valkey lost its data): the worker is an orphan, not judged.
        truth.doc = Some(("1".to_owned(), PoolDoc::new(8, UnixMillis(0))));
        judge_execute(&mut truth, 0, OpToken(99), 2);
        assert_eq!(truth.checks["executed_without_lease"], 1);
    }
}
