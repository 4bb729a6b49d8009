//! One simulated deployment: API replicas with their clients, a controller, workers, a faulty
//! store (the Valkey model) and a faulty inventory (the Kubernetes model), all driven from one seed
//! by a discrete event queue. Invariants are judged against the simulator's ground truth (which
//! workers exist, who is executing where, what is dirty), never against the pool's own view.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use corral_core::ids::{
    ActorId, ConversationId, ImageId, LeaseNamespace, LeaseScope, MemberId, OpToken, TicketId,
    WorkerId,
};
use corral_core::pool::{
    Applied, Command, Disposition, Effect, Event, Mutation, Outcome, PoolConfig, PoolDoc, PoolMode,
    StateKind, TicketStatus,
};
use corral_core::reset::ResetEvidence;
use corral_core::store::{
    CasOutcome, Loaded, MemoryStore, PoolStore, Transacted, Unavailable, Version, transact,
};
use corral_core::time::UnixMillis;

use crate::faults::{Fault, FaultMix, Invariant, Stats};
use crate::rng::Rng;

/// How long the safety phase (with faults) runs, in simulated milliseconds.
const SAFETY_MS: u64 = 120_000;
/// How long new clients keep arriving in the liveness phase.
const LIVENESS_ARRIVALS_MS: u64 = 20_000;
/// A shell's timeout on one create or delete call; shorter than the pool's create timeout.
const CALL_TIMEOUT_MS: u64 = 3_000;
/// How often the controller reconciles.
const CONTROLLER_PERIOD_MS: u64 = 500;
/// How often a waiting client looks at its ticket (the notification fallback).
const POLL_MS: u64 = 200;

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
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// The event trace, when asked for.
    pub trace: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Actor {
    Replica(usize),
    Controller,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GrantSource {
    Store,
    Fallback,
}

#[derive(Clone, Debug)]
enum Ev {
    ClientArrive {
        client: u64,
    },
    ClientPoll {
        client: u64,
    },
    RunStart {
        client: u64,
        worker: WorkerId,
        token: OpToken,
        granted_at: UnixMillis,
        source: GrantSource,
    },
    ClientHeartbeat {
        client: u64,
    },
    RunEnd {
        client: u64,
        worker: WorkerId,
    },
    Report {
        actor: Actor,
        incarnation: u64,
        command: Command,
        attempt: u32,
    },
    InvCreate {
        actor: Actor,
        incarnation: u64,
        worker: WorkerId,
        token: OpToken,
        image: ImageId,
        claim: Option<UnixMillis>,
    },
    CreateReply {
        actor: Actor,
        incarnation: u64,
        worker: WorkerId,
        token: OpToken,
        outcome: Outcome,
    },
    InvDelete {
        actor: Actor,
        incarnation: u64,
        worker: WorkerId,
        token: OpToken,
    },
    WorkerReset {
        actor: Actor,
        incarnation: u64,
        worker: WorkerId,
        token: OpToken,
    },
    ControllerLoop {
        incarnation: u64,
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

/// The store model: corral-core's `MemoryStore` (the same model the store contract tests hold the
/// Valkey store to), wrapped with the simulator's faults: outages, lost replies, unknown outcomes
/// and conflicts. Its clock is the deployment clock (true simulated time).
struct SimStore {
    model: MemoryStore,
    now_ms: u64,
    unavailable_until_ms: u64,
    rng: Rng,
    mix: FaultMix,
    injected: Vec<Fault>,
}

impl SimStore {
    fn sync(&mut self) {
        self.model.now = UnixMillis(self.now_ms);
        self.model.down = self.now_ms < self.unavailable_until_ms;
    }

    fn peek(&self) -> Option<&PoolDoc> {
        self.model.peek()
    }
}

impl PoolStore for SimStore {
    fn now(&mut self) -> Result<UnixMillis, Unavailable> {
        self.sync();
        self.model.now()
    }

    fn load(&mut self) -> Result<Loaded, Unavailable> {
        self.sync();
        self.model.load()
    }

    fn compare_and_set(&mut self, expected: Option<Version>, doc: &PoolDoc) -> CasOutcome {
        self.sync();
        if self.model.down {
            return CasOutcome::Unavailable;
        }
        if self.rng.chance(self.mix.rate(Fault::StoreConflict)) {
            self.injected.push(Fault::StoreConflict);
            return CasOutcome::Conflict;
        }
        if self.rng.chance(self.mix.rate(Fault::StoreUnknownNoCommit)) {
            self.injected.push(Fault::StoreUnknownNoCommit);
            return CasOutcome::Unknown;
        }
        let outcome = self.model.compare_and_set(expected, doc);
        if matches!(outcome, CasOutcome::Ok { .. })
            && self.rng.chance(self.mix.rate(Fault::StoreLostReply))
        {
            self.injected.push(Fault::StoreLostReply);
            return CasOutcome::Unknown;
        }
        outcome
    }
}

struct TrueWorker {
    created_at: u64,
    tenant: Option<u64>,
    dirty: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ClientState {
    Arriving,
    Waiting,
    Running { worker: WorkerId, token: OpToken },
    Finished,
}

struct Client {
    replica: usize,
    incarnation: u64,
    member: MemberId,
    namespace: LeaseNamespace,
    ticket: TicketId,
    wait_ms: u64,
    run_ms: u64,
    arrived_at: u64,
    in_liveness: bool,
    state: ClientState,
    resolved_at: Option<u64>,
}

struct Replica {
    alive: bool,
    incarnation: u64,
    skew_ms: i64,
    cache: Option<PoolDoc>,
}

struct Controller {
    alive: bool,
    incarnation: u64,
    release: ImageId,
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
    truth: BTreeMap<WorkerId, TrueWorker>,
    creates_in_flight: BTreeMap<WorkerId, u64>,
    lost_epochs: BTreeMap<u64, u64>,
    condemned: BTreeMap<WorkerId, u64>,
    ticket_order: BTreeMap<TicketId, u64>,
    ticket_deadline: BTreeMap<TicketId, UnixMillis>,
    replicas: Vec<Replica>,
    controller: Controller,
    releases: u64,
    clients: BTreeMap<u64, Client>,
    next_client: u64,
    members: u64,
    arrival_gap_ms: u64,
    arrivals_open: bool,
    liveness: bool,
    end_ms: u64,
    stats: Stats,
    violation: Option<Violation>,
    trace: Option<Vec<String>>,
    mutation: Option<SimMutation>,
    converged_at: Option<u64>,
    last_unsettled: String,
}

/// The final stretch of the liveness phase in which the pool must be seen settled.
const CONVERGENCE_WINDOW_MS: u64 = 30_000;

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
        let mix = FaultMix::draw(&mut rng.child());
        let store = SimStore {
            model: MemoryStore::default(),
            now_ms: 0,
            unavailable_until_ms: 0,
            rng: rng.child(),
            mix: mix.clone(),
            injected: Vec::new(),
        };
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
        let mut world = Self {
            rng,
            now: 1_000_000,
            seq: 0,
            queue: BinaryHeap::new(),
            config,
            mix,
            store,
            truth: BTreeMap::new(),
            creates_in_flight: BTreeMap::new(),
            lost_epochs: BTreeMap::new(),
            condemned: BTreeMap::new(),
            ticket_order: BTreeMap::new(),
            ticket_deadline: BTreeMap::new(),
            replicas,
            controller: Controller {
                alive: true,
                incarnation: 0,
                release: ImageId("img-0".into()),
            },
            releases: 0,
            clients: BTreeMap::new(),
            next_client: 0,
            members,
            arrival_gap_ms,
            arrivals_open: true,
            liveness: false,
            end_ms: 0,
            stats,
            violation: None,
            trace: if tracing { Some(Vec::new()) } else { None },
            mutation,
            converged_at: None,
            last_unsettled: String::from("never observed"),
        };
        world.store.now_ms = world.now;
        let start = world.now;
        let liveness_ms = LIVENESS_ARRIVALS_MS
            + world.config.lease_ttl_ms
            + world.config.burst_idle_ttl_ms
            + world.config.acquire_wait_ms
            + world.config.create_timeout_ms
            + 60_000;
        world.end_ms = start + SAFETY_MS + liveness_ms;
        world.schedule(0, Ev::ControllerLoop { incarnation: 0 });
        world.schedule(10, Ev::Chaos);
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
            self.store.now_ms = next.at;
            self.stats.steps += 1;
            self.note(|| format!("{:>9} {:?}", next.at, next.ev));
            self.handle(next.ev);
            for fault in std::mem::take(&mut self.store.injected) {
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
            trace: self.trace.unwrap_or_default(),
        }
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.push(line());
        }
    }

    fn schedule(&mut self, delay_ms: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at: self.now + delay_ms,
            seq: self.seq,
            ev,
        }));
    }

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

    fn actor_live(&self, actor: Actor, incarnation: u64) -> bool {
        match actor {
            Actor::Replica(r) => {
                self.replicas[r].alive && self.replicas[r].incarnation == incarnation
            }
            Actor::Controller => {
                self.controller.alive && self.controller.incarnation == incarnation
            }
        }
    }

    fn incarnation(&self, actor: Actor) -> u64 {
        match actor {
            Actor::Replica(r) => self.replicas[r].incarnation,
            Actor::Controller => self.controller.incarnation,
        }
    }

    /// Applies `command` through the store; on a commit, checks what the transition did and
    /// performs its effects as `actor`.
    fn commit(&mut self, actor: Actor, command: &Command) -> Transacted {
        let had_doc = self.store.peek().is_some();
        let new_epoch = self.rng.next_u64() >> 12;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            transact(&mut self.store, command, &self.config, new_epoch, 3)
        }));
        // The document asserts its own invariants inside every transition (unless a rule is
        // broken on purpose); a panic there is a violation of this seed, not a crash of the run.
        self.stats.checked(Invariant::DocumentSound);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(panic) => {
                let detail = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| String::from("panic"));
                self.check(Invariant::DocumentSound, false, || detail);
                return Transacted::Unavailable;
            }
        };
        if !had_doc && let Some(doc) = self.store.peek() {
            let epoch = doc.epoch();
            self.note(|| format!("          new pool document, epoch {epoch:x}"));
        }
        if let Transacted::Committed { applied, doc, now } = &outcome {
            self.stats.transitions += 1;
            if let Actor::Replica(r) = actor {
                self.replicas[r].cache = Some(doc.clone());
            }
            self.after_commit(actor, command, applied, doc, *now);
            let trace_line = format!(
                "          {command:?} => {:?} {:?}",
                applied.events, applied.effects
            );
            self.note(|| trace_line);
            self.perform(actor, applied.effects.clone());
        }
        outcome
    }

    fn after_commit(
        &mut self,
        actor: Actor,
        command: &Command,
        applied: &Applied,
        doc: &PoolDoc,
        now: UnixMillis,
    ) {
        if let Command::Acquire {
            ticket, wait_ms, ..
        } = command
            && !self.ticket_order.contains_key(ticket)
            && applied
                .events
                .iter()
                .any(|e| matches!(e, Event::Queued { .. } | Event::Granted { .. }))
        {
            let order = self.ticket_order.len() as u64;
            self.ticket_order.insert(*ticket, order);
            self.ticket_deadline.insert(
                *ticket,
                now.plus_ms((*wait_ms).min(self.config.acquire_wait_ms)),
            );
        }
        for effect in &applied.effects {
            if let Effect::Create { image, worker, .. } = effect {
                let fresh = actor == Actor::Controller && *image == self.controller.release;
                let release = self.controller.release.clone();
                self.check(Invariant::NoStaleImage, fresh, || {
                    format!("{worker} created from {image} while the controller runs {release}")
                });
            }
        }
        // FIFO as POOL-3 resolves it: a grant never passes over an older waiting ticket whose
        // member is under the limit (even after every grant of this transition).
        let usage = doc.member_usage();
        for event in &applied.events {
            let Event::Granted { ticket, worker, .. } = event else {
                continue;
            };
            // A repeated acquire answers with a grant made earlier; only this transition's count.
            if doc.workers().get(worker).is_none_or(|w| w.since != now) {
                continue;
            }
            let Some(granted_order) = self.ticket_order.get(ticket).copied() else {
                continue;
            };
            let passed_over = doc.tickets().find(|waiting| {
                let older = self
                    .ticket_order
                    .get(&waiting.id)
                    .is_some_and(|o| *o < granted_order);
                older
                    && usage.get(&waiting.member).copied().unwrap_or(0) < self.config.max_per_member
            });
            let passed = passed_over.map(|t| t.id);
            self.check(Invariant::Fifo, passed.is_none(), || {
                format!("{ticket} granted past older eligible {passed:?}")
            });
        }
    }

    fn perform(&mut self, actor: Actor, effects: Vec<Effect>) {
        let incarnation = self.incarnation(actor);
        for effect in effects {
            let delay = self.latency();
            match effect {
                Effect::Create {
                    worker,
                    token,
                    image,
                    claim_deadline,
                } => {
                    self.creates_in_flight.insert(worker, worker.epoch);
                    self.schedule(
                        delay,
                        Ev::InvCreate {
                            actor,
                            incarnation,
                            worker,
                            token,
                            image,
                            claim: claim_deadline,
                        },
                    );
                }
                Effect::Reset { worker, token } => self.schedule(
                    delay,
                    Ev::WorkerReset {
                        actor,
                        incarnation,
                        worker,
                        token,
                    },
                ),
                Effect::Delete { worker, token } => self.schedule(
                    delay,
                    Ev::InvDelete {
                        actor,
                        incarnation,
                        worker,
                        token,
                    },
                ),
            }
        }
    }

    fn report(&mut self, actor: Actor, delay: u64, command: Command) {
        let incarnation = self.incarnation(actor);
        self.schedule(
            delay,
            Ev::Report {
                actor,
                incarnation,
                command,
                attempt: 0,
            },
        );
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
            } => self.run_start(client, worker, token, granted_at, source),
            Ev::ClientHeartbeat { client } => self.client_heartbeat(client),
            Ev::RunEnd { client, worker } => self.run_end(client, worker),
            Ev::Report {
                actor,
                incarnation,
                command,
                attempt,
            } => self.deliver_report(actor, incarnation, command, attempt),
            Ev::InvCreate {
                actor,
                incarnation,
                worker,
                token,
                image,
                claim,
            } => self.inventory_create(actor, incarnation, worker, token, image, claim),
            Ev::CreateReply {
                actor,
                incarnation,
                worker,
                token,
                outcome,
            } => {
                if self.actor_live(actor, incarnation) {
                    self.report(
                        actor,
                        0,
                        Command::CreateReported {
                            worker,
                            token,
                            outcome,
                        },
                    );
                }
            }
            Ev::InvDelete {
                actor,
                incarnation,
                worker,
                token,
            } => self.inventory_delete(actor, incarnation, worker, token),
            Ev::WorkerReset {
                actor,
                incarnation,
                worker,
                token,
            } => self.worker_reset(actor, incarnation, worker, token),
            Ev::ControllerLoop { incarnation } => self.controller_loop(incarnation),
            Ev::ControllerRestart => self.controller_restart(),
            Ev::ReplicaRestart { replica } => {
                if !self.replicas[replica].alive {
                    self.replicas[replica].alive = true;
                    self.replicas[replica].incarnation += 1;
                }
            }
            Ev::Chaos => self.chaos(),
            Ev::PlatformExpire { worker } => {
                if self.truth.contains_key(&worker) {
                    self.destroy(worker);
                }
            }
            Ev::Liveness => self.begin_liveness(),
            Ev::ArrivalsEnd => self.arrivals_open = false,
        }
    }

    fn schedule_arrival(&mut self) {
        let gap = self.rng.range(1, self.arrival_gap_ms * 2);
        let client = self.next_client;
        self.next_client += 1;
        let replica = self.rng.range(0, self.replicas.len() as u64 - 1) as usize;
        let member = MemberId(format!("m{}", self.rng.range(0, self.members - 1)));
        let browser = self.rng.chance(150);
        let run_ms = if browser {
            self.rng.range(2_000, 40_000)
        } else if self.rng.chance(50) {
            self.rng.range(5_000, 30_000)
        } else {
            self.rng.range(20, 3_000)
        };
        let wait_ms = self.rng.range(500, self.config.acquire_wait_ms + 5_000);
        let ticket = TicketId(self.rng.next_u64());
        self.clients.insert(
            client,
            Client {
                replica,
                incarnation: self.replicas[replica].incarnation,
                member,
                namespace: if browser {
                    LeaseNamespace::Browser
                } else {
                    LeaseNamespace::Code
                },
                ticket,
                wait_ms,
                run_ms,
                arrived_at: self.now + gap,
                in_liveness: self.liveness,
                state: ClientState::Arriving,
                resolved_at: None,
            },
        );
        self.schedule(gap, Ev::ClientArrive { client });
    }

    fn local_now(&self, replica: usize) -> i64 {
        self.now as i64 + self.replicas[replica].skew_ms
    }

    fn client_ok(&self, client: u64) -> Option<usize> {
        let c = self.clients.get(&client)?;
        let r = &self.replicas[c.replica];
        (r.alive && r.incarnation == c.incarnation).then_some(c.replica)
    }

    fn resolve(&mut self, client: u64) {
        if let Some(c) = self.clients.get_mut(&client)
            && c.resolved_at.is_none()
        {
            c.resolved_at = Some(self.now);
        }
    }

    fn client_arrive(&mut self, client: u64) {
        if self
            .clients
            .get(&client)
            .is_some_and(|c| c.state == ClientState::Arriving)
            && self.arrivals_open
        {
            self.schedule_arrival();
        }
        let Some(replica) = self.client_ok(client) else {
            self.finish(client);
            return;
        };
        let c = &self.clients[&client];
        let command = Command::Acquire {
            ticket: c.ticket,
            member: c.member.clone(),
            scope: LeaseScope {
                namespace: c.namespace,
                actor: ActorId(c.member.0.clone()),
                conversation: ConversationId(format!("c{client}")),
            },
            wait_ms: c.wait_ms,
        };
        let ticket = c.ticket;
        if let Some(c) = self.clients.get_mut(&client) {
            c.state = ClientState::Waiting;
        }
        match self.commit(Actor::Replica(replica), &command) {
            Transacted::Committed { applied, doc, .. } => {
                let delay = self.latency();
                match applied.answer(ticket) {
                    Some(Event::Granted { worker, token, .. }) => {
                        let granted_at =
                            doc.workers().get(worker).map_or(UnixMillis(0), |w| w.since);
                        self.schedule(
                            delay,
                            Ev::RunStart {
                                client,
                                worker: *worker,
                                token: *token,
                                granted_at,
                                source: GrantSource::Store,
                            },
                        );
                        return;
                    }
                    Some(Event::Queued { .. }) => {
                        self.schedule(POLL_MS, Ev::ClientPoll { client });
                        return;
                    }
                    _ => {}
                }
                self.finish(client);
            }
            Transacted::Unavailable if self.config_broken_store_fallback() => {
                self.fallback_grant(client, replica)
            }
            // Admission fails closed: the caller is refused (coordination_unavailable).
            Transacted::Unavailable => self.finish(client),
            Transacted::Unknown | Transacted::Contended => {
                self.schedule(POLL_MS, Ev::ClientArrive { client })
            }
        }
    }

    fn config_broken_store_fallback(&self) -> bool {
        self.mutation == Some(SimMutation::StoreFallback)
    }

    /// The broken rule of the `store-fallback` mutation: with the store down, serve from this
    /// replica's own (stale) copy of the pool.
    fn fallback_grant(&mut self, client: u64, replica: usize) {
        let Some(cache) = self.replicas[replica].cache.clone() else {
            self.finish(client);
            return;
        };
        let warm = cache
            .workers()
            .iter()
            .find(|(_, w)| w.state.kind() == StateKind::Warm)
            .map(|(id, w)| (*id, w.token));
        match warm {
            Some((worker, token)) => {
                let delay = self.latency();
                self.schedule(
                    delay,
                    Ev::RunStart {
                        client,
                        worker,
                        token,
                        granted_at: UnixMillis(self.now),
                        source: GrantSource::Fallback,
                    },
                );
            }
            None => self.finish(client),
        }
    }

    fn finish(&mut self, client: u64) {
        self.resolve(client);
        if let Some(c) = self.clients.get_mut(&client) {
            c.state = ClientState::Finished;
        }
    }

    fn client_poll(&mut self, client: u64) {
        let Some(replica) = self.client_ok(client) else {
            return;
        };
        let (ticket, deadline_local) = {
            let c = &self.clients[&client];
            (c.ticket, c.arrived_at as i64 + c.wait_ms as i64)
        };
        if self.local_now(replica) > deadline_local {
            // The caller gives up: withdraw the ticket, or return a lease it got meanwhile.
            let _ = self.commit(Actor::Replica(replica), &Command::Cancel { ticket });
            self.finish(client);
            return;
        }
        let Ok(Loaded::Found { doc, .. }) = self.store.load() else {
            self.schedule(POLL_MS, Ev::ClientPoll { client });
            return;
        };
        match doc.ticket_status(ticket) {
            TicketStatus::Granted { worker, token, .. } => {
                let granted_at = doc
                    .workers()
                    .get(&worker)
                    .map_or(UnixMillis(0), |w| w.since);
                let delay = self.latency();
                self.schedule(
                    delay,
                    Ev::RunStart {
                        client,
                        worker,
                        token,
                        granted_at,
                        source: GrantSource::Store,
                    },
                );
            }
            TicketStatus::Queued { .. } => self.schedule(POLL_MS, Ev::ClientPoll { client }),
            TicketStatus::Gone => self.finish(client),
        }
    }

    fn run_start(
        &mut self,
        client: u64,
        worker: WorkerId,
        token: OpToken,
        granted_at: UnixMillis,
        source: GrantSource,
    ) {
        let Some(c) = self.clients.get(&client) else {
            return;
        };
        let (ticket, member, run_ms) = (c.ticket, c.member.clone(), c.run_ms);
        self.check(
            Invariant::NoGrantWithoutStore,
            source == GrantSource::Store,
            || format!("{ticket} served on {worker} without the store"),
        );
        if let Some(deadline) = self.ticket_deadline.get(&ticket).copied() {
            self.check(
                Invariant::NoGrantAfterDeadline,
                granted_at <= deadline,
                || format!("{ticket} granted at {granted_at} after its deadline {deadline}"),
            );
        }
        self.resolve(client);
        // Condemned before the grant: the pool handed out a worker it had ordered deleted.
        let condemned = self
            .condemned
            .get(&worker)
            .is_some_and(|at| *at <= granted_at.0);
        self.check(Invariant::NoReassignOfCondemned, !condemned, || {
            format!("{worker}, ordered deleted, granted to {ticket}")
        });
        let Some(truth) = self.truth.get(&worker) else {
            // The worker died meanwhile: the run fails with a clear error; nothing is violated.
            self.finish(client);
            return;
        };
        let (tenant, dirty) = (truth.tenant, truth.dirty);
        self.check(Invariant::SingleTenant, tenant.is_none(), || {
            format!("{worker} granted to client {client} while client {tenant:?} executes there")
        });
        self.check(Invariant::CleanHandoff, !dirty, || {
            format!("{worker} handed to client {client} without a clean reset")
        });
        let running = self
            .truth
            .values()
            .filter_map(|w| w.tenant)
            .filter(|t| self.clients.get(t).is_some_and(|o| o.member == member))
            .count() as u32;
        let limit = self.config.max_per_member;
        self.check(Invariant::MemberLimit, running < limit, || {
            format!(
                "member {} would run {} at once, limit {limit}",
                member.0,
                running + 1
            )
        });
        if let Some(truth) = self.truth.get_mut(&worker) {
            truth.tenant = Some(client);
            truth.dirty = true;
        }
        if let Some(c) = self.clients.get_mut(&client) {
            c.state = ClientState::Running { worker, token };
        }
        self.schedule(run_ms, Ev::RunEnd { client, worker });
        self.schedule(
            self.config.lease_heartbeat_ms,
            Ev::ClientHeartbeat { client },
        );
    }

    fn client_heartbeat(&mut self, client: u64) {
        let Some(replica) = self.client_ok(client) else {
            return;
        };
        let (ClientState::Running { worker, token }, ticket) = (
            self.clients[&client].state.clone(),
            self.clients[&client].ticket,
        ) else {
            return;
        };
        match self.commit(
            Actor::Replica(replica),
            &Command::Heartbeat {
                worker,
                lease: ticket,
                token,
            },
        ) {
            Transacted::Committed { applied, .. }
                if applied
                    .events
                    .iter()
                    .any(|e| matches!(e, Event::Refused { .. })) =>
            {
                // The lease is lost (expired, taken over, or gone with the store's data): the run
                // fails with a clear error; the code may go on until its worker is deleted.
                self.finish(client);
            }
            _ => self.schedule(
                self.config.lease_heartbeat_ms,
                Ev::ClientHeartbeat { client },
            ),
        }
    }

    fn run_end(&mut self, client: u64, worker: WorkerId) {
        if let Some(truth) = self.truth.get_mut(&worker)
            && truth.tenant == Some(client)
        {
            truth.tenant = None;
        }
        let Some(replica) = self.client_ok(client) else {
            return;
        };
        let (ClientState::Running { worker: on, token }, ticket) = (
            self.clients[&client].state.clone(),
            self.clients[&client].ticket,
        ) else {
            return;
        };
        if on != worker {
            return;
        }
        self.finish(client);
        let release = Command::Release {
            worker,
            lease: ticket,
            token,
            disposition: Disposition::Reset,
        };
        self.report(Actor::Replica(replica), 0, release);
    }

    fn deliver_report(&mut self, actor: Actor, incarnation: u64, command: Command, attempt: u32) {
        if !self.actor_live(actor, incarnation) {
            return;
        }
        match self.commit(actor, &command) {
            Transacted::Committed { .. } => {}
            Transacted::Unavailable | Transacted::Unknown | Transacted::Contended => {
                if attempt < 30 {
                    let delay = self.rng.range(100, 1_000);
                    self.schedule(
                        delay,
                        Ev::Report {
                            actor,
                            incarnation,
                            command,
                            attempt: attempt + 1,
                        },
                    );
                }
            }
        }
    }

    fn inventory_create(
        &mut self,
        actor: Actor,
        incarnation: u64,
        worker: WorkerId,
        token: OpToken,
        image: ImageId,
        claim: Option<UnixMillis>,
    ) {
        self.creates_in_flight.remove(&worker);
        let _ = &image;
        let (created, outcome, reply_ms) = if self.rng.chance(self.mix.rate(Fault::CreateFails)) {
            self.stats.fault(Fault::CreateFails);
            (false, Outcome::Failed, self.rng.range(5, 50))
        } else if self.rng.chance(self.mix.rate(Fault::CreateLostReply)) {
            self.stats.fault(Fault::CreateLostReply);
            (true, Outcome::Unknown, CALL_TIMEOUT_MS)
        } else if self.rng.chance(self.mix.rate(Fault::CreateHangs)) {
            self.stats.fault(Fault::CreateHangs);
            (self.rng.chance(500), Outcome::Unknown, CALL_TIMEOUT_MS)
        } else {
            (true, Outcome::Done, self.rng.range(100, 1_500))
        };
        if created {
            self.truth.insert(
                worker,
                TrueWorker {
                    created_at: self.now,
                    tenant: None,
                    dirty: false,
                },
            );
            if let Some(deadline) = claim {
                let at = deadline.0.saturating_sub(self.now);
                self.schedule(at, Ev::PlatformExpire { worker });
            }
        }
        self.schedule(
            reply_ms,
            Ev::CreateReply {
                actor,
                incarnation,
                worker,
                token,
                outcome,
            },
        );
    }

    fn inventory_delete(
        &mut self,
        actor: Actor,
        incarnation: u64,
        worker: WorkerId,
        token: OpToken,
    ) {
        let outcome = if self.rng.chance(self.mix.rate(Fault::DeleteFails)) {
            self.stats.fault(Fault::DeleteFails);
            Outcome::Failed
        } else {
            self.destroy(worker);
            if self.rng.chance(self.mix.rate(Fault::DeleteLostReply)) {
                self.stats.fault(Fault::DeleteLostReply);
                Outcome::Unknown
            } else {
                Outcome::Done
            }
        };
        if self.actor_live(actor, incarnation) {
            let delay = if outcome == Outcome::Unknown {
                CALL_TIMEOUT_MS
            } else {
                self.latency()
            };
            self.report(
                actor,
                delay,
                Command::DeleteReported {
                    worker,
                    token,
                    outcome,
                },
            );
        }
    }

    /// A worker stops existing; whatever ran there dies with it.
    fn destroy(&mut self, worker: WorkerId) {
        self.truth.remove(&worker);
    }

    fn worker_reset(&mut self, actor: Actor, incarnation: u64, worker: WorkerId, token: OpToken) {
        let Some(truth) = self.truth.get_mut(&worker) else {
            return;
        };
        // The run's processes die with the jail.
        truth.tenant = None;
        let mut evidence = ResetEvidence::clean(token);
        if self.rng.chance(self.mix.rate(Fault::DirtyReset)) {
            self.stats.fault(Fault::DirtyReset);
            evidence.processes_remaining = Some(1);
        } else {
            truth.dirty = false;
        }
        if !self.actor_live(actor, incarnation) {
            return;
        }
        let delay = self.latency();
        let command = Command::ResetReported {
            worker,
            token,
            evidence,
        };
        if self.rng.chance(self.mix.rate(Fault::DuplicateReport)) {
            self.stats.fault(Fault::DuplicateReport);
            let late = self.rng.range(1_000, 20_000);
            self.report(actor, late, command.clone());
        }
        self.report(actor, delay, command);
    }

    fn controller_loop(&mut self, incarnation: u64) {
        if !self.actor_live(Actor::Controller, incarnation) {
            return;
        }
        // The order of the controller's steps is drawn: the pool, not the shell, must make
        // publication come before creation (POOL-12).
        let mut steps = [0u8, 1, 2];
        let first = self.rng.range(0, 2) as usize;
        steps.swap(0, first);
        for step in steps {
            match step {
                0 => {
                    let image = self.controller.release.clone();
                    let _ = self.commit(Actor::Controller, &Command::Tick { image });
                }
                1 => {
                    if self.rng.chance(self.mix.rate(Fault::InventoryUnavailable)) {
                        self.stats.fault(Fault::InventoryUnavailable);
                        continue;
                    }
                    let as_of = UnixMillis(self.now);
                    let present: BTreeSet<WorkerId> = self.truth.keys().copied().collect();
                    let delay = self.latency();
                    self.report(
                        Actor::Controller,
                        delay,
                        Command::InventoryObserved { as_of, present },
                    );
                }
                _ => {
                    // Publish whenever the pool's image is not this controller's release: after a
                    // restart, a new release, or a store that lost its data.
                    let published = match self.store.load() {
                        Ok(Loaded::Found { doc, .. }) => {
                            doc.image() == Some(&self.controller.release)
                        }
                        Ok(Loaded::Absent) => false,
                        Err(Unavailable) => continue,
                    };
                    if !published {
                        let image = self.controller.release.clone();
                        let _ = self.commit(Actor::Controller, &Command::PublishImage { image });
                    }
                }
            }
        }
        self.schedule(CONTROLLER_PERIOD_MS, Ev::ControllerLoop { incarnation });
    }

    fn controller_restart(&mut self) {
        if self.controller.alive {
            return;
        }
        self.controller.alive = true;
        self.controller.incarnation += 1;
        if !self.liveness && self.rng.chance(self.mix.rate(Fault::NewRelease)) {
            self.stats.fault(Fault::NewRelease);
            self.releases += 1;
            self.controller.release = ImageId(format!("img-{}", self.releases));
            if self.rng.chance(500) {
                // A coordination outage at start-up, as the new release comes up.
                self.stats.fault(Fault::StoreOutage);
                self.store.unavailable_until_ms = self.now + self.rng.range(500, 8_000);
            }
        }
        let incarnation = self.controller.incarnation;
        self.schedule(0, Ev::ControllerLoop { incarnation });
    }

    /// Draws this step's faults.
    fn chaos(&mut self) {
        if self.liveness {
            return;
        }
        if self.rng.chance(self.mix.rate(Fault::StoreOutage)) {
            self.stats.fault(Fault::StoreOutage);
            self.store.unavailable_until_ms = self.now + self.rng.range(200, 6_000);
        }
        if self.rng.chance(self.mix.rate(Fault::StoreDataLoss) / 4) && self.store.peek().is_some() {
            self.stats.fault(Fault::StoreDataLoss);
            if let Some(doc) = self.store.model.lose_data() {
                self.lost_epochs.insert(doc.epoch(), self.now);
            }
            self.store.unavailable_until_ms = self.now + self.rng.range(100, 3_000);
        }
        if self.rng.chance(self.mix.rate(Fault::WorkerCrash)) && !self.truth.is_empty() {
            self.stats.fault(Fault::WorkerCrash);
            let index = self.rng.range(0, self.truth.len() as u64 - 1) as usize;
            if let Some(worker) = self.truth.keys().nth(index).copied() {
                self.destroy(worker);
            }
        }
        if self.rng.chance(self.mix.rate(Fault::ReplicaCrash)) {
            let replica = self.rng.range(0, self.replicas.len() as u64 - 1) as usize;
            if self.replicas[replica].alive {
                self.stats.fault(Fault::ReplicaCrash);
                self.replicas[replica].alive = false;
                self.replicas[replica].cache = None;
                let down = self.rng.range(500, 10_000);
                self.schedule(down, Ev::ReplicaRestart { replica });
            }
        }
        if self.rng.chance(self.mix.rate(Fault::ControllerCrash)) && self.controller.alive {
            self.stats.fault(Fault::ControllerCrash);
            self.controller.alive = false;
            let down = self.rng.range(200, 10_000);
            self.schedule(down, Ev::ControllerRestart);
        }
        self.schedule(250, Ev::Chaos);
    }

    fn begin_liveness(&mut self) {
        self.note(|| String::from("---- liveness phase: faults off"));
        self.liveness = true;
        self.mix = FaultMix::none();
        self.store.mix = FaultMix::none();
        self.store.unavailable_until_ms = self.now;
        for replica in 0..self.replicas.len() {
            if !self.replicas[replica].alive {
                self.replicas[replica].alive = true;
                self.replicas[replica].incarnation += 1;
            }
        }
        if !self.controller.alive {
            self.controller_restart();
        }
        self.schedule(LIVENESS_ARRIVALS_MS, Ev::ArrivalsEnd);
    }

    /// Checked after every step, against ground truth.
    fn check_world(&mut self) {
        let Some(doc) = self.store.peek().cloned() else {
            return;
        };
        let epoch = doc.epoch();
        // Ticket age and deadline come from the document itself, so a commit whose reply was lost
        // still dates its tickets correctly.
        for ticket in doc.tickets() {
            if !self.ticket_order.contains_key(&ticket.id) {
                let order = self.ticket_order.len() as u64;
                self.ticket_order.insert(ticket.id, order);
                self.ticket_deadline.insert(ticket.id, ticket.deadline);
            }
        }
        for (id, worker) in doc.workers() {
            if worker.state.removal().is_some() {
                self.condemned.entry(*id).or_insert(self.now);
            }
        }
        let counted: usize = self
            .truth
            .iter()
            .filter(|(id, w)| {
                id.epoch == epoch
                    || self
                        .lost_epochs
                        .get(&id.epoch)
                        .is_some_and(|lost| w.created_at <= *lost)
                    || !self.lost_epochs.contains_key(&id.epoch)
            })
            .count();
        let in_flight = self
            .creates_in_flight
            .values()
            .filter(|e| **e == epoch)
            .count();
        let ceiling = self.config.max_allocated as usize;
        self.check(Invariant::Ceiling, counted + in_flight <= ceiling, || {
            format!("{counted} workers and {in_flight} creates in flight, ceiling {ceiling}")
        });
        let creates_max = self.config.max_concurrent_creates as usize;
        self.check(Invariant::CreatesInFlight, in_flight <= creates_max, || {
            format!("{in_flight} creates in flight, bound {creates_max}")
        });
        let queued = doc.tickets().count();
        let queue_max = self.config.acquire_queue_max as usize;
        self.check(Invariant::QueueBound, queued <= queue_max, || {
            format!("{queued} tickets queued, bound {queue_max}")
        });
        let uncounted = self
            .truth
            .keys()
            .find(|id| id.epoch == epoch && !doc.workers().contains_key(id))
            .copied();
        self.check(Invariant::AmbiguousCounted, uncounted.is_none(), || {
            format!("{uncounted:?} exists but the pool does not count it")
        });
        let mut unclean = None;
        for (id, worker) in doc.workers() {
            if worker.state.kind() == StateKind::Warm
                && let Some(truth) = self.truth.get(id)
                && (truth.dirty || truth.tenant.is_some())
            {
                unclean = Some(*id);
            }
        }
        self.check(Invariant::WarmIsClean, unclean.is_none(), || {
            format!("{unclean:?} is warm but dirty or occupied")
        });
    }

    fn check_liveness(&mut self) {
        let slack_ms = 3_000;
        let late: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| c.in_liveness && c.state != ClientState::Arriving)
            .filter(|(_, c)| {
                c.resolved_at
                    .is_none_or(|at| at > c.arrived_at + c.wait_ms + slack_ms)
            })
            .map(|(id, _)| *id)
            .collect();
        self.check(Invariant::LivenessServed, late.is_empty(), || {
            format!("clients {late:?} neither served nor refused before their deadline")
        });
        let converged = self.converged_at.is_some();
        let last = self.last_unsettled.clone();
        self.check(Invariant::LivenessConverged, converged, || {
            format!("pool never returned to its target in the final window: {last}")
        });
    }

    /// In the final window of the liveness phase: is the pool at its target, with every worker it
    /// counts existing and nothing orphaned? (Platform claims expire and are replaced on their own
    /// schedule, so a single moment at the end is not enough; a settled moment in the window is.)
    fn observe_convergence(&mut self) {
        if !self.liveness
            || self.converged_at.is_some()
            || self.now + CONVERGENCE_WINDOW_MS < self.end_ms
        {
            return;
        }
        let Some(doc) = self.store.peek() else {
            return;
        };
        let counts = doc.counts();
        let target = self
            .config
            .warm_min
            .max(self.config.target_idle)
            .min(self.config.max_allocated);
        let doc_ids: BTreeSet<WorkerId> = doc.workers().keys().copied().collect();
        let true_ids: BTreeSet<WorkerId> = self.truth.keys().copied().collect();
        let settled = counts.warm == target
            && counts.allocated() == target
            && doc.tickets().count() == 0
            && doc_ids == true_ids;
        if settled {
            self.converged_at = Some(self.now);
        } else {
            self.last_unsettled =
                format!("target {target}, {counts:?}, pool knows {doc_ids:?}, {true_ids:?} exist");
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

    /// The simulator keeps its teeth: each broken rule is caught, by the invariant it breaks.
    #[test]
    fn every_mutation_is_caught() {
        for mutation in SimMutation::all() {
            let caught =
                (0..200).find_map(|seed| World::new(seed, Some(mutation), false).run().violation);
            assert!(
                caught.is_some(),
                "mutation {} survived 200 seeds",
                mutation.name()
            );
        }
    }
}
