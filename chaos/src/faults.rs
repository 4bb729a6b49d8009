//! The faults, injected one at a time at points of the load a seed chooses, each healed before
//! the next.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::deploy::{Deployment, REPLICAS, StoreKind};
use crate::rng::Rng;

/// Every kind of fault, by its name in the report.
pub const KINDS: [&str; 18] = [
    "kill_api",
    "pause_api",
    "kill_controller",
    "kill_worker",
    "pause_worker",
    "kill_egress_proxy",
    "kill_coturn",
    "valkey_stop",
    "valkey_restart_empty",
    "valkey_restart_snapshot",
    "partition_api_valkey",
    "clock_step",
    "store_full",
    "store_read_only",
    "store_pause",
    "dns_servfail",
    "dns_timeout",
    "dns_mixed",
];

/// The kinds that apply to a deployment with `store`: a local store can be filled and made
/// read-only, an S3 server paused.
#[must_use]
pub fn kinds_for(store: StoreKind) -> Vec<&'static str> {
    KINDS
        .into_iter()
        .filter(|kind| match *kind {
            "store_full" | "store_read_only" => store == StoreKind::Local,
            "store_pause" => store == StoreKind::S3,
            _ => true,
        })
        .collect()
}

/// A fault in progress: how to heal it.
pub enum Healing {
    /// Nothing to heal (the pool replaces a killed worker).
    Nothing,
    /// Restart this API replica.
    RestartApi(usize),
    /// Resume this process.
    Resume(i32),
    /// Restart the controller.
    RestartController,
    /// Restart the egress proxy.
    RestartProxy,
    /// Restart coturn.
    RestartCoturn,
    /// Answer the egress target's name with the target alone again.
    Dns,
    /// Restart Valkey from its snapshot.
    RestartValkey,
    /// Heal this replica's link.
    HealLink(usize),
    /// Remove the ballast that filled the store.
    EmptyStore,
    /// Make the store writable again.
    StoreWritable,
    /// Step this replica's clock back to the true time.
    ClockBack(usize),
}

fn signal(pid: i32, signal: Signal) -> Result<(), String> {
    kill(Pid::from_raw(pid), signal).map_err(|e| format!("{signal:?} {pid}: {e}"))
}

/// Fills the filesystem at `dir` with a ballast file until it is full.
fn fill(dir: &Path) -> Result<(), String> {
    use std::io::Write as _;
    let mut file = std::fs::File::create(dir.join(".chaos-ballast")).map_err(|e| e.to_string())?;
    let block = vec![0u8; 1 << 20];
    loop {
        match file.write(&block) {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => {}
        }
    }
}

/// What the pool showed of its workers at the last read before a fault: each worker's state, and
/// which members are persistent kernels' (whose workers, leased, are running or checkpointing a
/// cell).
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Each worker's state, as [`crate::history::PoolSample::workers`] has it.
    pub states: BTreeMap<String, String>,
    /// The members of the kernel clients.
    pub kernel_members: BTreeSet<String>,
}

/// The worker a worker fault hits, and when in its life: mid-reset (one the pool shows
/// resetting), mid-cell (one leased to a kernel's member: running its cell or checkpointing
/// it), else any; each of the three asked for a third of the time, the next one when none is
/// there.
#[must_use]
pub fn pick_worker(
    workers: &[(String, i32)],
    seen: &Seen,
    rng: &mut Rng,
) -> Option<(String, i32, &'static str)> {
    let state = |id: &str| seen.states.get(id).map_or("", String::as_str);
    let resetting: Vec<&(String, i32)> = workers
        .iter()
        .filter(|(id, _)| state(id) == "resetting")
        .collect();
    let in_cell: Vec<&(String, i32)> = workers
        .iter()
        .filter(|(id, _)| {
            state(id)
                .strip_prefix("leased:")
                .is_some_and(|member| seen.kernel_members.contains(member))
        })
        .collect();
    let any: Vec<&(String, i32)> = workers.iter().collect();
    let wanted = rng.below(3);
    let order: [(&Vec<&(String, i32)>, &'static str); 3] = match wanted {
        0 => [
            (&resetting, "mid-reset"),
            (&in_cell, "mid-cell"),
            (&any, "any"),
        ],
        1 => [
            (&in_cell, "mid-cell"),
            (&resetting, "mid-reset"),
            (&any, "any"),
        ],
        _ => [
            (&any, "any"),
            (&resetting, "mid-reset"),
            (&in_cell, "mid-cell"),
        ],
    };
    order
        .into_iter()
        .find(|(candidates, _)| !candidates.is_empty())
        .map(|(candidates, when)| {
            let (id, pid) = (*rng.pick(candidates)).clone();
            (id, pid, when)
        })
}

/// Injects `kind` into `deployment`, choosing its target with `rng` (a replica: `busiest`, the one
/// with the most requests in flight, when there is one, so that it is hit mid-operation); returns
/// what it hit and how to heal it.
///
/// # Errors
/// When the fault could not be injected (its target is not there).
pub fn inject(
    deployment: &Arc<Mutex<Deployment>>,
    kind: &str,
    busiest: Option<usize>,
    seen: &Seen,
    rng: &mut Rng,
) -> Result<(String, Healing), String> {
    let mut d = deployment
        .lock()
        .map_err(|_| "the deployment's lock is poisoned")?;
    let drawn = usize::try_from(rng.below(REPLICAS as u64)).unwrap_or(0);
    let replica = busiest.filter(|r| *r < REPLICAS).unwrap_or(drawn);
    Ok(match kind {
        "kill_api" => {
            d.apis[replica].kill();
            (d.apis[replica].name.clone(), Healing::RestartApi(replica))
        }
        "pause_api" => {
            let pid = d.apis[replica].pid().ok_or("the replica is not running")?;
            signal(pid, Signal::SIGSTOP)?;
            (d.apis[replica].name.clone(), Healing::Resume(pid))
        }
        "kill_controller" => {
            d.controller.kill();
            ("controller".to_owned(), Healing::RestartController)
        }
        "kill_worker" | "pause_worker" => {
            let workers: Vec<(String, i32)> = d.workers().into_iter().collect();
            let (id, pid, when) = pick_worker(&workers, seen, rng).ok_or("no worker to hit")?;
            let target = format!("{id} ({when})");
            if kind == "kill_worker" {
                signal(pid, Signal::SIGKILL)?;
                (target, Healing::Nothing)
            } else {
                signal(pid, Signal::SIGSTOP)?;
                (target, Healing::Resume(pid))
            }
        }
        "kill_egress_proxy" => {
            d.proxy.kill();
            ("egress-proxy".to_owned(), Healing::RestartProxy)
        }
        "kill_coturn" => {
            d.coturn
                .as_mut()
                .ok_or("no coturn in this deployment")?
                .kill();
            ("coturn".to_owned(), Healing::RestartCoturn)
        }
        "valkey_stop" => {
            let pid = d.valkey.pid().ok_or("valkey is not running")?;
            signal(pid, Signal::SIGSTOP)?;
            ("valkey".to_owned(), Healing::Resume(pid))
        }
        "valkey_restart_empty" => {
            d.restart_valkey(true)?;
            ("valkey".to_owned(), Healing::Nothing)
        }
        "valkey_restart_snapshot" => {
            d.valkey.kill();
            ("valkey".to_owned(), Healing::RestartValkey)
        }
        "partition_api_valkey" => {
            d.links[replica].set_cut(true);
            (d.apis[replica].name.clone(), Healing::HealLink(replica))
        }
        "clock_step" => {
            let file = d
                .clock_files
                .get(replica)
                .ok_or("no clock shim (no C compiler)")?;
            let magnitude = rng.between(crate::clock::STEP_MIN_MS, crate::clock::STEP_MAX_MS);
            let offset = i64::try_from(magnitude).unwrap_or(0);
            let offset = if rng.below(2) == 0 { offset } else { -offset };
            crate::clock::step(file, offset)?;
            (
                format!("{} by {offset} ms", d.apis[replica].name),
                Healing::ClockBack(replica),
            )
        }
        "dns_servfail" | "dns_timeout" | "dns_mixed" => {
            d.far
                .as_ref()
                .ok_or("no egress load in this deployment")?
                .inject(kind, rng.below(2) == 0)?;
            (crate::egress::NAME.to_owned(), Healing::Dns)
        }
        "store_full" | "store_read_only" if d.store_kind != StoreKind::Local => {
            return Err(format!("{kind} is for the local store"));
        }
        "store_pause" => {
            let pid =
                d.s3.as_ref()
                    .and_then(super::deploy::Proc::pid)
                    .ok_or("store_pause is for the S3 store")?;
            signal(pid, Signal::SIGSTOP)?;
            ("S3 server".to_owned(), Healing::Resume(pid))
        }
        "store_full" => {
            fill(&d.store)?;
            ("workspace store".to_owned(), Healing::EmptyStore)
        }
        "store_read_only" => {
            crate::hygiene::remount(&d.store, true)?;
            ("workspace store".to_owned(), Healing::StoreWritable)
        }
        other => return Err(format!("no fault {other:?}")),
    })
}

/// Heals a fault.
///
/// # Errors
/// When the healing fails (a process does not start again).
pub fn heal(deployment: &Arc<Mutex<Deployment>>, healing: Healing) -> Result<(), String> {
    let mut d = deployment
        .lock()
        .map_err(|_| "the deployment's lock is poisoned")?;
    match healing {
        Healing::Nothing => Ok(()),
        Healing::RestartApi(replica) => d.apis[replica].restart(),
        Healing::Resume(pid) => signal(pid, Signal::SIGCONT).or_else(|e| {
            // A paused worker may have been deleted (and its process killed) meanwhile.
            if std::path::Path::new(&format!("/proc/{pid}")).exists() {
                Err(e)
            } else {
                Ok(())
            }
        }),
        Healing::RestartController => d.controller.restart(),
        Healing::RestartProxy => d.proxy.restart(),
        Healing::RestartCoturn => d.restart_coturn(),
        Healing::Dns => {
            if let Some(far) = &d.far {
                far.heal();
            }
            Ok(())
        }
        Healing::RestartValkey => d.restart_valkey(false),
        Healing::HealLink(replica) => {
            d.links[replica].set_cut(false);
            Ok(())
        }
        Healing::EmptyStore => std::fs::remove_file(d.store.join(".chaos-ballast"))
            .map_err(|e| format!("remove the ballast: {e}")),
        Healing::StoreWritable => crate::hygiene::remount(&d.store, false),
        Healing::ClockBack(replica) => d
            .clock_files
            .get(replica)
            .map_or(Ok(()), |file| crate::clock::step(file, 0)),
    }
}

/// How long a fault lasts: longer than the lease's time to live for a pause, so that a paused
/// holder wakes as a zombie with its old token.
#[must_use]
pub fn duration(kind: &str, lease_ttl_seconds: u32, rng: &mut Rng) -> Duration {
    let ttl_ms = u64::from(lease_ttl_seconds) * 1_000;
    let ms = match kind {
        "pause_api" | "pause_worker" | "valkey_stop" | "store_pause" => {
            rng.between(ttl_ms / 2, ttl_ms * 2)
        }
        "kill_worker" | "valkey_restart_empty" => 0,
        // Long enough for fetches to meet them, the proxy's resolver timing out among them.
        "dns_servfail" | "dns_timeout" | "dns_mixed" => rng.between(2_000, 8_000),
        _ => rng.between(500, 4_000),
    };
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_04_a_worker_fault_hits_workers_mid_reset_and_mid_cell_as_often_as_any() {
        let workers: Vec<(String, i32)> = ["w-1", "w-2", "w-3", "w-4"]
            .iter()
            .zip(1..)
            .map(|(id, pid)| ((*id).to_owned(), pid))
            .collect();
        let seen = Seen {
            states: [
                ("w-1", "resetting"),
                ("w-2", "leased:member-3-0"),
                ("w-3", "leased:member-0-0"),
                ("w-4", "warm"),
            ]
            .iter()
            .map(|(id, state)| ((*id).to_owned(), (*state).to_owned()))
            .collect(),
            kernel_members: ["member-3-0".to_owned()].into_iter().collect(),
        };
        let mut rng = Rng::new(7);
        let mut hits: BTreeMap<(&str, String), u32> = BTreeMap::new();
        for _ in 0..300 {
            let (id, _, when) = pick_worker(&workers, &seen, &mut rng).expect("a worker");
            *hits.entry((when, id)).or_default() += 1;
        }
        // Mid-reset is the resetting worker, mid-cell the kernel's; each about a third.
        for (when, id) in [("mid-reset", "w-1"), ("mid-cell", "w-2")] {
            let n = hits.get(&(when, id.to_owned())).copied().unwrap_or(0);
            assert!((70..=130).contains(&n), "{when} {id}: {n} of 300: {hits:?}");
        }
        assert!(hits.keys().all(|(when, id)| *when == "any"
            || (*when == "mid-reset" && id == "w-1")
            || (*when == "mid-cell" && id == "w-2")));
        // With nobody resetting or in a cell, any worker.
        let idle = Seen::default();
        assert_eq!(
            pick_worker(&workers, &idle, &mut rng).map(|(_, _, when)| when),
            Some("any")
        );
        assert_eq!(pick_worker(&[], &seen, &mut rng), None);
    }
}
