//! One chaos run: start the deployment, drive the load, inject faults from the seed, let the pool
//! recover, stop everything, and check the history.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_api::client::Client;
use corral_core::pool::WorkerState;
use corral_core::store::Loaded;
use corral_store::ValkeyStore;

use crate::deploy::{Deployment, PoolSettings, StoreKind};
use crate::faults;
use crate::history::{Fault, History, Kind, PoolSample};
use crate::load::{self, Clock, Shared, Stream};
use crate::rng::Rng;

/// What a run is asked to do.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The seed of the schedule and the load.
    pub seed: u64,
    /// How long the load and the faults last.
    pub duration: Duration,
    /// The run's directory (removed and made again).
    pub dir: PathBuf,
    /// The corral binary.
    pub corral: PathBuf,
    /// The fault kinds to inject (by default every one).
    pub kinds: Vec<String>,
    /// How many workspaces and how many kernels the load extends.
    pub clients: (usize, usize),
    /// How many clients (each its own member) extend each workspace at once.
    pub writers: usize,
    /// How many clients open, drive and close browser sessions, one after another (none when the
    /// machine has no coturn).
    pub browsers: usize,
    /// How long the pool has after the load to be back at its warm target.
    pub recovery: Duration,
    /// The pool's settings.
    pub pool: PoolSettings,
    /// Where workspaces are kept.
    pub store: StoreKind,
}

/// Runs `plan`, calling `on_start` once the deployment is up. The history is returned whatever
/// happened to the deployment; an error means the run could not be made at all, or left
/// something behind.
///
/// # Errors
/// When the directory holds what an earlier run left, or the deployment does not start, or
/// How long a run waits for what an earlier one left to finish exiting before it refuses to start.
const LEFTOVERS_SETTLE: Duration = Duration::from_secs(20);

/// something is left behind at the end.
pub async fn run(plan: Plan) -> Result<History, String> {
    crate::hygiene::become_subreaper()?;
    // What an earlier run (or a stack an earlier test stopped) left may still be exiting: a
    // killed jail at a low priority on a busy machine takes a moment to leave its group.
    for line in crate::hygiene::clear_stale(&plan.dir) {
        eprintln!("corral-chaos: cleared what a run no longer alive left: {line}");
    }
    let settled = Instant::now() + LEFTOVERS_SETTLE;
    let mut left = crate::hygiene::leftovers(&plan.dir, false);
    while !left.is_empty() && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = crate::hygiene::leftovers(&plan.dir, false);
    }
    if !left.is_empty() {
        return Err(format!(
            "an earlier run left these behind; remove them first (`corral-chaos clean --dir {}` does):\n  {}",
            plan.dir.display(),
            left.join("\n  ")
        ));
    }
    let _ = std::fs::remove_dir_all(&plan.dir);
    std::fs::create_dir_all(&plan.dir).map_err(|e| format!("{}: {e}", plan.dir.display()))?;
    let started = {
        let (dir, corral, pool, store) =
            (plan.dir.clone(), plan.corral.clone(), plan.pool, plan.store);
        let mark = mark(plan.seed);
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let _entered = handle.enter();
            Deployment::start(&dir, &corral, pool, store, &mark)
        })
        .await
        .map_err(|e| e.to_string())?
    };
    let result = match started {
        Ok(deployment) => drive(&plan, deployment).await,
        Err(error) => Err(format!("the deployment did not start: {error}")),
    };
    let remaining = tokio::task::spawn_blocking({
        let dir = plan.dir.clone();
        move || crate::hygiene::clean(&dir)
    })
    .await
    .map_err(|e| e.to_string())?;
    if !remaining.is_empty() {
        return Err(format!(
            "left behind after the run:\n  {}",
            remaining.join("\n  ")
        ));
    }
    result
}

/// The run's mark (its package holds it, its egress target answers with it): from its seed, so
/// that a replay serves the same.
fn mark(seed: u64) -> String {
    format!("mark{:016x}", Rng::new(seed).fork(0x6d61_726b).next_u64())
}

async fn sample(store: &mut Option<ValkeyStore>, url: &str, clock: &Clock) -> Option<PoolSample> {
    if store.is_none() {
        *store = tokio::time::timeout(Duration::from_secs(1), ValkeyStore::connect(url, "default"))
            .await
            .ok()
            .and_then(Result::ok);
    }
    let requested_ns = clock.now();
    let loaded = tokio::time::timeout(Duration::from_secs(1), store.as_ref()?.load()).await;
    match loaded {
        Ok(Ok(Loaded::Found { doc, .. })) => {
            let counts = doc.counts();
            let workers = doc
                .workers()
                .iter()
                .map(|(id, worker)| {
                    let state = match &worker.state {
                        WorkerState::Leased(lease) => format!("leased:{}", lease.member.0),
                        WorkerState::Warm => "warm".to_owned(),
                        WorkerState::Creating { .. } => "creating".to_owned(),
                        WorkerState::Resetting { .. } => "resetting".to_owned(),
                        WorkerState::Retiring(_) => "retiring".to_owned(),
                        WorkerState::Quarantined(_) => "quarantined".to_owned(),
                    };
                    (id.to_string(), state)
                })
                .collect();
            Some(PoolSample {
                requested_ns,
                at_ns: clock.now(),
                allocated: counts.allocated(),
                warm: counts.warm,
                quarantined: counts.quarantined,
                workers,
                epoch: Some(doc.epoch()),
            })
        }
        Ok(Ok(_)) => None,
        _ => {
            *store = None;
            None
        }
    }
}

async fn drive(plan: &Plan, deployment: Deployment) -> Result<History, String> {
    let clock = Clock::start();
    let valkey_url = deployment.valkey_url.clone();
    let pool = deployment.pool;
    let replicas = deployment
        .api_urls
        .iter()
        .map(|url| Client::new(url, &deployment.caller))
        .collect::<Result<Vec<_>, _>>()?;
    let installs = deployment.pypi.is_some();
    let fetches = deployment.far.is_some();
    let browsers = if deployment.coturn.is_some() {
        plan.browsers
    } else {
        0
    };
    let deployment = Arc::new(Mutex::new(deployment));
    let mut rng = Rng::new(plan.seed);

    // The pool must be warm before the load: what is measured is recovery, not the first fill.
    let mut store = None;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if sample(&mut store, &valkey_url, &clock)
            .await
            .is_some_and(|s| s.warm >= pool.warm_min)
        {
            break;
        }
        if Instant::now() > deadline {
            stop(&deployment);
            return Err("the pool never reached its warm minimum".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("chaos: deployment up in {}, pool warm", plan.dir.display());

    let shared = Arc::new(Shared {
        clock,
        replicas,
        ops: tokio::sync::Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        next_id: AtomicU64::new(1),
        in_flight: (0..crate::deploy::REPLICAS)
            .map(|_| AtomicU64::new(0))
            .collect(),
        long_in_flight: (0..crate::deploy::REPLICAS)
            .map(|_| AtomicU64::new(0))
            .collect(),
        installs,
        fetches,
    });
    // The pool's sampler.
    let samples = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (samples, sampling, url) = (samples.clone(), sampling.clone(), valkey_url.clone());
        async move {
            let mut store = None;
            while sampling.load(Ordering::Relaxed) {
                if let Some(s) = sample(&mut store, &url, &clock).await {
                    samples.lock().await.push(s);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });
    // The clients.
    let mut clients = Vec::new();
    let (workspaces, kernels) = plan.clients;
    let mut streams = Vec::new();
    for index in 0..workspaces + kernels {
        let (kind, writers) = if index < workspaces {
            (Kind::Workspace, plan.writers.max(1))
        } else {
            (Kind::Kernel, 1)
        };
        for writer in 0..writers {
            streams.push(Stream {
                kind,
                actor: format!("actor-{index}"),
                conversation: format!("conversation-{index}"),
                member: format!("member-{index}-{writer}"),
            });
        }
    }
    for index in 0..browsers {
        let name = format!("browser-{index}");
        streams.push(Stream {
            kind: Kind::Browser,
            actor: name.clone(),
            conversation: name.clone(),
            member: name,
        });
    }
    let kernel_members: std::collections::BTreeSet<String> = streams
        .iter()
        .filter(|s| s.kind == Kind::Kernel)
        .map(|s| s.member.clone())
        .collect();
    for (index, stream) in streams.into_iter().enumerate() {
        clients.push(tokio::spawn(load::client(
            shared.clone(),
            index,
            stream,
            rng.fork(index as u64),
        )));
    }
    // The faults.
    let mut schedule = rng.fork(u64::MAX);
    let mut fault_log = Vec::new();
    let mut bag: Vec<String> = Vec::new();
    let load_end = Instant::now() + plan.duration;
    while Instant::now() < load_end && !plan.kinds.is_empty() {
        tokio::time::sleep(Duration::from_millis(schedule.between(1_000, 4_000))).await;
        if Instant::now() >= load_end {
            break;
        }
        // Every kind once per round, in an order the seed shuffles: a long run has as many of
        // each.
        if bag.is_empty() {
            bag = plan.kinds.clone();
            for i in (1..bag.len()).rev() {
                let j = usize::try_from(schedule.below(i as u64 + 1)).unwrap_or(0);
                bag.swap(i, j);
            }
        }
        let Some(kind) = bag.pop() else {
            break;
        };
        let lasts = faults::duration(&kind, pool.lease_ttl_seconds, &mut schedule);
        let at_ns = clock.now();
        let injected = {
            let (deployment, kind) = (deployment.clone(), kind.clone());
            let mut rng = schedule.fork(at_ns);
            let busiest = shared.busiest();
            let seen = faults::Seen {
                states: samples
                    .lock()
                    .await
                    .last()
                    .map(|s| s.workers.clone())
                    .unwrap_or_default(),
                kernel_members: kernel_members.clone(),
            };
            tokio::task::spawn_blocking(move || {
                faults::inject(&deployment, &kind, busiest, &seen, &mut rng)
            })
            .await
            .map_err(|e| e.to_string())?
        };
        let (target, healing) = match injected {
            Ok(injected) => injected,
            Err(why) => {
                println!("chaos: {kind} not injected: {why}");
                continue;
            }
        };
        tokio::time::sleep(lasts).await;
        let healed = {
            let deployment = deployment.clone();
            tokio::task::spawn_blocking(move || faults::heal(&deployment, healing))
                .await
                .map_err(|e| e.to_string())?
        };
        if let Err(why) = healed {
            stop(&deployment);
            return Err(format!("{kind} of {target} could not be healed: {why}"));
        }
        let healed_ns = clock.now();
        println!(
            "chaos: {kind} of {target} at {:.1} s for {:.1} s",
            at_ns as f64 / 1e9,
            (healed_ns - at_ns) as f64 / 1e9
        );
        fault_log.push(Fault {
            kind,
            target,
            at_ns,
            healed_ns,
        });
    }
    // The load stops; every client finishes its operation in flight.
    shared.stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for client in clients {
        let _ = client.await;
    }
    let quiet_ns = clock.now();
    // The pool returns to its warm target, nothing quarantined.
    let deadline = Instant::now() + plan.recovery;
    while Instant::now() < deadline {
        let recovered =
            samples.lock().await.last().is_some_and(|s| {
                s.at_ns >= quiet_ns && s.warm >= pool.warm_min && s.quarantined == 0
            });
        if recovered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;
    let end_ns = clock.now();
    let canary_hits = deployment
        .lock()
        .ok()
        .and_then(|d| d.far.as_ref().map(crate::egress::Far::canary_hits))
        .unwrap_or_default();
    stop(&deployment);
    let mut ops = std::mem::take(&mut *shared.ops.lock().await);
    ops.sort_by_key(|op| (op.end_ns, op.id));
    let pool_samples = std::mem::take(&mut *samples.lock().await);
    Ok(History {
        seed: plan.seed,
        clock_origin_ns: clock.origin_ns,
        ceiling: pool.ceiling,
        warm_target: pool.warm_min,
        member_limit: pool.member_limit,
        ops,
        pool: pool_samples,
        faults: fault_log,
        quiet_ns,
        end_ns,
        mark: mark(plan.seed),
        canary_hits,
    })
}

fn stop(deployment: &Arc<Mutex<Deployment>>) {
    if let Ok(mut d) = deployment.lock() {
        d.stop();
    }
}

/// The corral binary beside this one (`target/<profile>/corral`), if there is one.
#[must_use]
pub fn sibling_corral() -> Option<PathBuf> {
    let me = std::env::current_exe().ok()?;
    let sibling = me.parent()?.join("corral");
    sibling.is_file().then_some(sibling)
}

/// Whether `path` is an executable file.
#[must_use]
pub fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
