//! One simulated deployment: API replicas whose clients hold leases through corral-core's
//! [`LeaseHolder`], a controller driven by corral-core's [`Reconciler`], workers, a faulty store
//! (the Valkey model) and a faulty inventory (the backend model), all driven from one seed by a
//! discrete event queue. The simulator is only the shell: every decision is the core's, so a bug
//! in the pool, the holder or the reconciler is a bug it can find. Invariants are judged against
//! the simulator's ground truth (which workers exist, who executes where, what is dirty, which
//! commands were sent by whom and which writes landed), never against the pool's view of itself.
//!
//! The modules, by what each holds:
//! - [`store`]: the store model with its faults, and the one commit path (which records every
//!   write that landed, whether or not its reply was lost);
//! - [`clients`]: the API replicas' clients: acquire, wait, run;
//! - [`holders`]: the lease holders the clients drive;
//! - [`controller`]: the controller shell around the reconciler;
//! - [`backend`]: the workers themselves: create, delete, list, reset, crash;
//! - [`chaos`]: the faults drawn each step, pauses and zombies, restarts, the liveness phase;
//! - [`truth`]: the ground truth recorded from every landed write;
//! - [`checks`]: every invariant.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use corral_core::holder::LeaseHolder;
use corral_core::ids::{ImageId, LeaseNamespace, MemberId, OpToken, TicketId, WorkerId};
use corral_core::pool::{Applied, Command, Mutation, PoolConfig, PoolDoc, PoolMode};
use corral_core::reconcile::{Reconciler, StoreCall, Work};
use corral_core::reset::ResetEvidence;
use corral_core::store::Unavailable;
use corral_core::time::UnixMillis;

use crate::faults::{Fault, FaultMix, Invariant, Stats};
use crate::rng::Rng;

mod backend;
mod browser;
mod chaos;
mod checks;
mod clients;
mod controller;
mod holders;
mod store;
mod truth;

use store::SimStore;
use truth::Truth;

/// How long the safety phase (with faults) runs, in simulated milliseconds.
const SAFETY_MS: u64 = 120_000;
/// How long new clients keep arriving in the liveness phase.
const LIVENESS_ARRIVALS_MS: u64 = 20_000;
/// How long the backend takes to answer a create or delete whose reply is lost (a shell timeout).
const CALL_TIMEOUT_MS: u64 = 3_000;
/// The reconciler's own bound on a call; longer than the backend's timeout, shorter than the
/// pool's create timeout.
const RECONCILER_CALL_TIMEOUT_MS: u64 = 4_000;
/// How often the controller reconciles.
const CONTROLLER_PERIOD_MS: u64 = 500;
/// How often a waiting client looks at its ticket (the notification fallback).
const POLL_MS: u64 = 200;
/// A browser session's idle limit (`CORRAL_BROWSER_IDLE_SECONDS`, scaled like the simulated
/// run times): a session left idle holds its worker this much longer before it is reaped.
const BROWSER_IDLE_MS: u64 = 20_000;
/// The final stretch of the liveness phase in which the pool must be seen settled.
const CONVERGENCE_WINDOW_MS: u64 = 30_000;

/// A violation found in one seed.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Which invariant.
    pub invariant: Invariant,
    /// Simulated time.
    pub at_ms: u64,
    /// What happened.
    pub detail: String,
}

/// The outcome of one seed.
pub struct SeedReport {
    /// Counters.
    pub stats: Stats,
    /// The first violation, if any (with a mutation: of an invariant the mutation targets).
    pub violation: Option<Violation>,
    /// With a mutation: the first violation of an invariant it does not target, if any. The run
    /// goes on past it, so that the targeted invariant has its chance.
    pub off_target: Option<Violation>,
    /// The event trace, when asked for.
    pub trace: Vec<String>,
}

/// Who sent a command to the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Actor {
    /// A client's shell (its acquire, its ticket reads).
    Client(u64),
    /// A client's lease holder.
    Holder(u64),
    /// One incarnation of the controller.
    Controller(u64),
    /// A duplicate delivery of a command some actor sent earlier: nobody hears the reply.
    Ghost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GrantSource {
    Store,
    Fallback,
}

/// Who asked a worker to reset, and gets its evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Requester {
    Holder { client: u64 },
    Controller { incarnation: u64 },
}

/// An answer to the controller's store call.
#[derive(Clone, Debug)]
enum StoreAnswer {
    Image(Result<Option<ImageId>, Unavailable>),
    Committed(Option<Applied>),
}

/// A backend's or worker's reply to the controller.
#[derive(Clone, Debug)]
enum WorkReply {
    Listed(Result<(UnixMillis, BTreeSet<WorkerId>), Unavailable>),
    Created {
        worker: WorkerId,
        token: OpToken,
        outcome: corral_core::pool::Outcome,
    },
    Deleted {
        worker: WorkerId,
        token: OpToken,
        outcome: corral_core::pool::Outcome,
    },
    Reset {
        worker: WorkerId,
        token: OpToken,
        evidence: Option<ResetEvidence>,
    },
}

#[derive(Clone, Debug)]
enum Ev {
    ClientArrive {
        client: u64,
    },
    ClientPoll {
        client: u64,
    },
    /// The client's shell sends the code to its leased worker.
    RunStart {
        client: u64,
        worker: WorkerId,
        token: OpToken,
        granted_at: UnixMillis,
        source: GrantSource,
    },
    /// A browser session's agent calls it.
    BrowserAct {
        client: u64,
    },
    /// A replica sweeps for idle browser sessions.
    BrowserSweep {
        replica: usize,
    },
    /// The code finished on the worker (the worker's side: never deferred).
    RunEnd {
        client: u64,
        worker: WorkerId,
    },
    /// The client's shell learns that the run ended (`discard`: the worker died under it).
    RunEnded {
        client: u64,
        worker: WorkerId,
        discard: bool,
    },
    HolderWake {
        client: u64,
        generation: u64,
    },
    HolderAnswer {
        client: u64,
        answer: Option<Applied>,
    },
    /// A zombie holder resumes and sends the command it held through its pause.
    HolderSend {
        client: u64,
        command: Command,
    },
    HolderResetDone {
        client: u64,
        worker: WorkerId,
        token: OpToken,
        evidence: Option<ResetEvidence>,
    },
    /// A worker receives a reset.
    WorkerReset {
        requester: Requester,
        worker: WorkerId,
        token: OpToken,
    },
    ControllerWake {
        incarnation: u64,
        generation: u64,
    },
    ControllerAnswer {
        incarnation: u64,
        answer: StoreAnswer,
    },
    /// The backend receives the controller's call.
    ControllerCall {
        incarnation: u64,
        work: Work,
    },
    ControllerReply {
        incarnation: u64,
        reply: WorkReply,
    },
    /// A paused controller resumes and sends the store call it held.
    ControllerSend {
        incarnation: u64,
        call: StoreCall,
        replaced: bool,
    },
    /// A command delivered a second time.
    Ghost {
        command: Command,
    },
    ControllerRestart,
    ReplicaRestart {
        replica: usize,
    },
    Chaos,
    PlatformExpire {
        worker: WorkerId,
    },
    Liveness,
    ArrivalsEnd,
}

struct Scheduled {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A worker as it really is.
struct TrueWorker {
    created_at: u64,
    /// The client whose code executes there.
    tenant: Option<u64>,
    /// Left dirty by a run and not yet reset clean.
    dirty: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ClientState {
    Arriving,
    Waiting,
    /// Holding a lease (its run may not have started, or may be over).
    Leased,
    Finished,
}

struct Client {
    replica: usize,
    incarnation: u64,
    member: MemberId,
    namespace: LeaseNamespace,
    ticket: TicketId,
    wait_ms: u64,
    /// Its run uses the data stack (decision 0058).
    stack: bool,
    run_ms: u64,
    /// A browser session's agent leaves it idle past the limit (BROW-6), then may come back.
    idles: bool,
    arrived_at: u64,
    in_liveness: bool,
    state: ClientState,
    resolved_at: Option<u64>,
    holder: Option<LeaseHolder>,
    holder_generation: u64,
    /// The client's task is paused until then (a zombie holder).
    paused_until: u64,
}

struct Replica {
    alive: bool,
    incarnation: u64,
    skew_ms: i64,
    cache: Option<PoolDoc>,
    /// The replica is paused until then.
    paused_until: u64,
}

/// What a zombie controller holds through its pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ZombieHold {
    /// The pass's publication or tick.
    PublishOrTick,
    /// The pass's listing report.
    Listing,
}

struct Controller {
    alive: bool,
    incarnation: u64,
    release: ImageId,
    machine: Reconciler,
    generation: u64,
    /// Paused until then, holding a store call.
    paused_until: u64,
    /// The next store call of this kind is held through a pause (a zombie controller).
    zombie_pending: Option<ZombieHold>,
}

/// One seed's world.
pub struct World {
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    config: PoolConfig,
    mix: FaultMix,
    store: SimStore,
    workers: BTreeMap<WorkerId, TrueWorker>,
    truth: Truth,
    replicas: Vec<Replica>,
    controller: Controller,
    releases: u64,
    clients: BTreeMap<u64, Client>,
    /// Browser sessions as the deployment's store holds them, by client.
    sessions: BTreeMap<u64, browser::SimSession>,
    next_client: u64,
    members: u64,
    arrival_gap_ms: u64,
    arrivals_open: bool,
    liveness: bool,
    /// When the liveness phase starts.
    liveness_at: u64,
    end_ms: u64,
    stats: Stats,
    violation: Option<Violation>,
    off_target: Option<Violation>,
    trace: Option<Vec<String>>,
    mutation: Option<SimMutation>,
    converged_at: Option<u64>,
    last_unsettled: String,
}

impl World {
    /// A world drawn from `seed`, with `mutation` (if any) broken on purpose.
    pub fn new(seed: u64, mutation: Option<SimMutation>, tracing: bool) -> Self {
        let mut rng = Rng::new(seed);
        let mut knobs = rng.child();
        let core_mutation = match mutation {
            Some(SimMutation::Core(m)) => Some(m),
            Some(SimMutation::StoreFallback) | None => None,
        };
        let config = draw_config(&mut knobs, core_mutation);
        // The browser session's rules take no pool configuration: they read this thread's.
        corral_core::pool::break_on_this_thread(core_mutation);
        let mix = FaultMix::draw(&mut rng.child());
        let store = SimStore::new(rng.child(), mix.clone());
        let replicas = (0..knobs.range(1, 3))
            .map(|_| {
                let skew_ms = if knobs.chance(mix.rate(Fault::ClockSkew)) {
                    knobs.range(0, 4_000) as i64 - 2_000
                } else {
                    0
                };
                Replica {
                    alive: true,
                    incarnation: 0,
                    skew_ms,
                    cache: None,
                    paused_until: 0,
                }
            })
            .collect::<Vec<_>>();
        let mut stats = Stats::default();
        for replica in &replicas {
            if replica.skew_ms != 0 {
                stats.fault(Fault::ClockSkew);
            }
        }
        let members = knobs.range(1, 6);
        let arrival_gap_ms = knobs.range(50, 1_500);
        let start = 1_000_000;
        let release = ImageId("img-0".into());
        let mut world = Self {
            rng,
            now: start,
            seq: 0,
            queue: BinaryHeap::new(),
            config,
            mix,
            store,
            workers: BTreeMap::new(),
            truth: Truth::default(),
            replicas,
            controller: Controller {
                alive: true,
                incarnation: 0,
                machine: controller::new_machine(release.clone(), start),
                release,
                generation: 0,
                paused_until: 0,
                zombie_pending: None,
            },
            releases: 0,
            clients: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_client: 0,
            members,
            arrival_gap_ms,
            arrivals_open: true,
            liveness: false,
            liveness_at: start + SAFETY_MS,
            end_ms: 0,
            stats,
            violation: None,
            off_target: None,
            trace: if tracing { Some(Vec::new()) } else { None },
            mutation,
            converged_at: None,
            last_unsettled: String::from("never observed"),
        };
        world.store.set_now(world.now);
        let liveness_ms = LIVENESS_ARRIVALS_MS
            + world.config.lease_ttl_ms
            + world.config.burst_idle_ttl_ms
            + world.config.acquire_wait_ms
            + world.config.create_timeout_ms
            + 60_000;
        world.end_ms = start + SAFETY_MS + liveness_ms;
        world.drive_controller();
        world.schedule(10, Ev::Chaos);
        for replica in 0..world.replicas.len() {
            world.schedule(browser::BROWSER_SWEEP_MS, Ev::BrowserSweep { replica });
        }
        world.schedule(SAFETY_MS, Ev::Liveness);
        world.schedule_arrival();
        world
    }

    /// Runs the world to its end or to its first violation.
    pub fn run(mut self) -> SeedReport {
        while let Some(Reverse(next)) = self.queue.pop() {
            if next.at > self.end_ms || self.violation.is_some() {
                break;
            }
            self.now = next.at;
            self.store.set_now(next.at);
            self.stats.steps += 1;
            self.note(|| format!("{:>9} {:?}", next.at, next.ev));
            // The holders and the reconciler assert their own invariants after every input; a
            // panic there is a violation of this seed, not a crash of the run.
            let handled =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(next.ev)));
            self.stats.checked(Invariant::MachineSound);
            if let Err(panic) = handled {
                let detail = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| String::from("panic"));
                self.violate(Invariant::MachineSound, detail);
                break;
            }
            for fault in self.store.take_injected() {
                self.stats.fault(fault);
            }
            self.check_world();
            self.observe_convergence();
        }
        if self.violation.is_none() {
            self.check_liveness();
        }
        SeedReport {
            stats: self.stats,
            violation: self.violation,
            off_target: self.off_target,
            trace: self.trace.unwrap_or_default(),
        }
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.push(line());
        }
    }

    fn schedule(&mut self, delay_ms: u64, ev: Ev) {
        self.schedule_at(self.now + delay_ms, ev);
    }

    fn schedule_at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at: at.max(self.now),
            seq: self.seq,
            ev,
        }));
    }

    /// A network or store delay.
    fn latency(&mut self) -> u64 {
        let slow = if self.rng.chance(self.mix.rate(Fault::StoreSlow)) {
            self.stats.fault(Fault::StoreSlow);
            self.rng.range(100, 800)
        } else {
            0
        };
        self.rng.range(1, 30) + slow
    }

    fn violate(&mut self, invariant: Invariant, detail: String) {
        *self.stats.violations.entry(invariant).or_insert(0) += 1;
        if let Some(mutation) = self.mutation
            && !mutation.targets().contains(&invariant)
        {
            if self.off_target.is_none() {
                self.note(|| format!("VIOLATION (off target) {}: {detail}", invariant.name()));
                self.off_target = Some(Violation {
                    invariant,
                    at_ms: self.now,
                    detail,
                });
            }
            return;
        }
        if self.violation.is_none() {
            self.note(|| format!("VIOLATION {}: {detail}", invariant.name()));
            self.violation = Some(Violation {
                invariant,
                at_ms: self.now,
                detail,
            });
        }
    }

    fn check(&mut self, invariant: Invariant, holds: bool, detail: impl FnOnce() -> String) {
        self.stats.checked(invariant);
        if !holds {
            self.violate(invariant, detail());
        }
    }

    /// When a pause of `pause_ms` starting now ends: never after the safety phase, since every
    /// fault stops for the liveness phase.
    fn pause_end(&self, pause_ms: u64) -> u64 {
        (self.now + pause_ms).min(self.liveness_at)
    }

    /// Until when `client` is paused (its own pause or its replica's); `None` when running.
    fn client_paused_until(&self, client: u64) -> Option<u64> {
        let c = self.clients.get(&client)?;
        let until = c.paused_until.max(self.replicas[c.replica].paused_until);
        (until > self.now).then_some(until)
    }

    /// Delivers `ev` to `client` now, or defers it until the client resumes. True when deferred.
    fn defer_for_client(&mut self, client: u64, ev: &Ev) -> bool {
        match self.client_paused_until(client) {
            Some(until) => {
                self.schedule_at(until, ev.clone());
                true
            }
            None => false,
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::ClientArrive { client } => self.client_arrive(client),
            Ev::ClientPoll { client } => self.client_poll(client),
            Ev::RunStart {
                client,
                worker,
                token,
                granted_at,
                source,
            } => {
                let ev = Ev::RunStart {
                    client,
                    worker,
                    token,
                    granted_at,
                    source,
                };
                if !self.defer_for_client(client, &ev) {
                    self.run_start(client, worker, token, granted_at, source);
                }
            }
            Ev::RunEnd { client, worker } => self.run_end(client, worker),
            Ev::BrowserAct { client } => {
                let ev = Ev::BrowserAct { client };
                if !self.defer_for_client(client, &ev) {
                    self.browser_act(client);
                }
            }
            Ev::BrowserSweep { replica } => self.browser_sweep(replica),
            Ev::RunEnded {
                client,
                worker,
                discard,
            } => {
                let ev = Ev::RunEnded {
                    client,
                    worker,
                    discard,
                };
                if !self.defer_for_client(client, &ev) {
                    self.run_ended(client, worker, discard);
                }
            }
            Ev::HolderWake { client, generation } => {
                let ev = Ev::HolderWake { client, generation };
                if !self.defer_for_client(client, &ev) {
                    self.holder_wake(client, generation);
                }
            }
            Ev::HolderAnswer { client, answer } => {
                let ev = Ev::HolderAnswer { client, answer };
                if !self.defer_for_client(client, &ev) {
                    let Ev::HolderAnswer { answer, .. } = ev else {
                        unreachable!()
                    };
                    self.holder_answer(client, answer);
                }
            }
            Ev::HolderSend { client, command } => self.holder_send(client, command),
            Ev::HolderResetDone {
                client,
                worker,
                token,
                evidence,
            } => {
                let ev = Ev::HolderResetDone {
                    client,
                    worker,
                    token,
                    evidence,
                };
                if !self.defer_for_client(client, &ev) {
                    let Ev::HolderResetDone { evidence, .. } = ev else {
                        unreachable!()
                    };
                    self.holder_reset_done(client, worker, token, evidence);
                }
            }
            Ev::WorkerReset {
                requester,
                worker,
                token,
            } => self.worker_reset(requester, worker, token),
            Ev::ControllerWake {
                incarnation,
                generation,
            } => self.controller_wake(incarnation, generation),
            Ev::ControllerAnswer {
                incarnation,
                answer,
            } => self.controller_answer(incarnation, answer),
            Ev::ControllerCall { incarnation, work } => self.backend_call(incarnation, work),
            Ev::ControllerReply { incarnation, reply } => self.controller_reply(incarnation, reply),
            Ev::ControllerSend {
                incarnation,
                call,
                replaced,
            } => self.controller_send(incarnation, call, replaced),
            Ev::Ghost { command } => self.ghost(command),
            Ev::ControllerRestart => self.controller_restart(),
            Ev::ReplicaRestart { replica } => {
                if !self.replicas[replica].alive {
                    self.replicas[replica].alive = true;
                    self.replicas[replica].incarnation += 1;
                }
            }
            Ev::Chaos => self.chaos(),
            Ev::PlatformExpire { worker } => {
                if self.workers.contains_key(&worker) {
                    self.destroy(worker);
                }
            }
            Ev::Liveness => self.begin_liveness(),
            Ev::ArrivalsEnd => self.arrivals_open = false,
        }
    }
}

/// A rule broken on purpose: one of corral-core's, or the replica shell's own rule never to fall
/// back to a pool of its own when the store is unavailable (POOL-11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimMutation {
    /// A rule of corral-core.
    Core(Mutation),
    /// The replica serves from its own copy of the pool while the store is down.
    StoreFallback,
}

impl SimMutation {
    /// Every mutation the simulator can run.
    pub fn all() -> Vec<SimMutation> {
        let mut all: Vec<SimMutation> = Mutation::ALL
            .iter()
            .map(|m| SimMutation::Core(*m))
            .collect();
        all.push(SimMutation::StoreFallback);
        all
    }

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Core(m) => m.name(),
            Self::StoreFallback => "store-fallback",
        }
    }

    /// The invariants that exist to catch it. A run with the mutation counts only their
    /// violations as catching it: a rule broken on purpose that only some other check notices
    /// means the check written for it has lost its teeth.
    pub fn targets(self) -> &'static [Invariant] {
        use Invariant as I;
        match self {
            Self::StoreFallback => &[I::NoGrantWithoutStore],
            Self::Core(m) => match m {
                Mutation::Ceiling => &[I::Ceiling],
                // A stale report believed: the worker published clean, or a lease ended by it.
                Mutation::ResetToken => &[I::CleanHandoff, I::LeaseIntegrity],
                Mutation::TakeoverReassign => &[I::SingleTenant, I::NoReassignOfCondemned],
                Mutation::AmbiguousFree => &[I::AmbiguousCounted],
                Mutation::Fifo => &[I::Fifo],
                Mutation::MemberLimit => &[I::MemberLimit],
                Mutation::StaleImage => &[I::NoStaleImage],
                Mutation::StaleHeartbeat | Mutation::StaleRelease | Mutation::ReviveExpired => {
                    &[I::LeaseIntegrity]
                }
                Mutation::DiscardClean => &[I::CleanNotDiscarded],
                Mutation::BurstLingerShort | Mutation::BurstNeverRetired => &[I::BurstLinger],
                Mutation::CreateWhileWarm => &[I::NoWastefulCreate],
                Mutation::RefusalReason => &[I::RefusalTruthful],
                Mutation::QueueBound => &[I::QueueBound],
                Mutation::CreateConcurrency => &[I::CreatesInFlight],
                Mutation::AdmissionOpen => &[I::AdmissionClosed],
                Mutation::GrantAfterDeadline => &[I::NoGrantAfterDeadline],
                Mutation::OldListing => &[I::InventoryInOrder],
                Mutation::ReuseDiscarded => &[I::CleanHandoff],
                Mutation::TrustRestored => &[I::RestoredDistrusted],
                Mutation::UnknownDeleteDone => &[I::AmbiguousCounted],
                Mutation::PartialEvidence => &[I::WarmIsClean, I::CleanHandoff],
                Mutation::OverRetire => &[I::NoChurn],
                Mutation::IdleEarly => &[I::IdleReapExact],
                Mutation::ClosingCallable => &[I::NoCallAfterClose],
                Mutation::StackUnrouted => &[I::StackRouted],
            },
        }
    }
}

/// Draws the pool's knobs within their legal bounds (the relations `corral-core::config` checks).
fn draw_config(rng: &mut Rng, mutation: Option<Mutation>) -> PoolConfig {
    let max_allocated = rng.range(1, 8) as u32;
    let warm_min = rng.range(0, u64::from(max_allocated)) as u32;
    let lease_heartbeat_ms = rng.range(1_000, 3_000);
    let mode = if rng.chance(200) {
        PoolMode::PlatformOperator {
            claim_lifetime_ms: rng.range(20_000, 90_000),
        }
    } else {
        PoolMode::Controller
    };
    PoolConfig {
        warm_min,
        target_idle: rng.range(0, u64::from(max_allocated.min(2))) as u32,
        max_allocated,
        max_concurrent_creates: rng.range(1, u64::from(max_allocated.min(3))) as u32,
        burst_idle_ttl_ms: rng.range(2_000, 20_000),
        acquire_wait_ms: rng.range(2_000, 15_000),
        acquire_queue_max: rng.range(1, 16) as u32,
        max_per_member: rng.range(1, 3) as u32,
        lease_heartbeat_ms,
        lease_ttl_ms: lease_heartbeat_ms * rng.range(3, 5),
        create_timeout_ms: 6_000,
        reset_timeout_ms: 5_000,
        delete_retry_ms: 2_000,
        inventory_stale_ms: 5_000,
        mode,
        // Sometimes never (0), so that the stack's routing is judged on its flag alone too.
        stack_idle_ms: (!rng.chance(200)).then(|| rng.range(1_000, 10_000)),
        mutation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(seed: u64) -> Vec<String> {
        World::new(seed, None, true).run().trace
    }

    #[test]
    fn one_seed_reproduces_the_same_trace() {
        for seed in [3, 17] {
            let (first, second) = (trace(seed), trace(seed));
            assert!(first.len() > 100, "a seed's trace has events");
            assert_eq!(first, second, "seed {seed} diverged");
        }
        assert_ne!(trace(3), trace(17), "different seeds differ");
    }

    #[test]
    fn seeds_without_mutation_hold_every_invariant() {
        for seed in 0..20 {
            let report = World::new(seed, None, false).run();
            assert!(
                report.violation.is_none(),
                "seed {seed}: {:?}",
                report.violation
            );
        }
    }

    /// The simulator keeps its teeth: each broken rule is caught by the invariant written for
    /// it, within 300 seeds.
    #[test]
    fn every_mutation_is_caught_by_its_own_invariant() {
        for mutation in SimMutation::all() {
            let caught =
                (0..300).find_map(|seed| World::new(seed, Some(mutation), false).run().violation);
            assert!(
                caught
                    .as_ref()
                    .is_some_and(|v| mutation.targets().contains(&v.invariant)),
                "mutation {} survived 300 seeds ({caught:?})",
                mutation.name()
            );
        }
    }
}
