//! The requirements under faults (issue 27): short chaos runs of this build's `corral` (the
//! harness of `chaos/`, on real processes), each with the faults one requirement is about, each
//! checked by the history checker and for the clause the requirement states. `just chaos` runs
//! every fault together for longer.
//!
//! Needs root (the jail, the store's tmpfs) and a Valkey server; without them each test skips,
//! which CI turns into a failure. The runs take turns: a chaos run refuses to start beside
//! another deployment's jails.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use corral_chaos::check::{Verdict, check};
use corral_chaos::deploy::{PoolSettings, StoreKind};
use corral_chaos::harness::{self, Plan};
use corral_chaos::history::{Answer, History, Kind};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A chaos run of `seconds` with `faults` and `clients` (workspaces, kernels), checked; or `None`
/// when the test skipped.
fn chaos(
    test: &str,
    faults: &[&str],
    clients: (usize, usize),
    seconds: u64,
) -> Option<(History, Verdict)> {
    chaos_on(test, StoreKind::Local, faults, clients, 0, seconds)
}

/// [`chaos`] with workspaces in `store`, and `browsers` clients of browser sessions.
fn chaos_on(
    test: &str,
    store: StoreKind,
    faults: &[&str],
    clients: (usize, usize),
    browsers: usize,
    seconds: u64,
) -> Option<(History, Verdict)> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !corral_testkit::is_root() {
        corral_testkit::skip(test, corral_testkit::Need::Root, "a chaos run builds jails");
        return None;
    }
    let moto = std::process::Command::new("python3")
        .args(["-c", "import moto.server"])
        .output()
        .is_ok_and(|o| o.status.success());
    if store == StoreKind::S3 && !moto {
        corral_testkit::skip(test, corral_testkit::Need::Services, "no moto S3 server");
        return None;
    }
    if corral_store::valkey_server::find_binary().is_none() {
        corral_testkit::skip(test, corral_testkit::Need::Services, "no valkey-server");
        return None;
    }
    let plan = Plan {
        seed: 0x00C0_FFEE ^ test.len() as u64,
        duration: Duration::from_secs(seconds),
        dir: PathBuf::from(format!("/var/tmp/corral-chaos-test-{test}")),
        corral: PathBuf::from(env!("CARGO_BIN_EXE_corral")),
        kinds: faults.iter().map(|k| (*k).to_owned()).collect(),
        clients,
        writers: 2,
        browsers,
        recovery: Duration::from_secs(90),
        pool: PoolSettings::default(),
        store,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = plan.dir.clone();
    let history = runtime
        .block_on(harness::run(plan))
        .unwrap_or_else(|e| panic!("{test}: the chaos run failed: {e}"));
    let verdict = check(&history);
    assert!(verdict.violations.is_empty(), "{test}:\n{verdict}");
    // The faults were injected, and the pool came back.
    let injected: u64 = verdict.summary.faults.values().sum();
    assert!(injected >= 3, "{test}: {:?}", verdict.summary.faults);
    assert!(
        verdict.summary.final_recovery.is_some(),
        "{test}: the pool never returned to its warm target"
    );
    // Its logs stay for a failing run only.
    let _ = std::fs::remove_dir_all(&dir);
    Some((history, verdict))
}

/// Each of `kinds` was injected at least once.
fn assert_injected(verdict: &Verdict, kinds: &[&str]) {
    for kind in kinds {
        assert!(
            verdict.summary.faults.get(*kind).is_some_and(|n| *n > 0),
            "{kind} was injected: {:?}",
            verdict.summary.faults
        );
    }
}

fn succeeded(history: &History, kind: Kind) -> impl Iterator<Item = (&str, &[String])> {
    history.ops.iter().filter_map(move |op| match &op.answer {
        Answer::Succeeded { worker, seen, .. } if op.kind == kind => {
            Some((worker.as_str(), seen.as_slice()))
        }
        _ => None,
    })
}

#[test]
fn pool_04_pool_08_killed_and_paused_workers_never_serve_two_holders_and_are_replaced() {
    let test = "pool_04_pool_08_killed_and_paused_workers_never_serve_two_holders_and_are_replaced";
    let Some((history, verdict)) = chaos(test, &["kill_worker", "pause_worker"], (3, 1), 30) else {
        return;
    };
    // Both faults hit; by the checker no worker ever ran two operations at once, and after them
    // the pool was back at its warm target with nothing quarantined.
    assert_injected(&verdict, &["kill_worker", "pause_worker"]);
    assert!(succeeded(&history, Kind::Workspace).count() > 0);
}

#[test]
fn pool_05_pool_11_valkey_stopped_or_cut_off_fails_admission_closed_with_a_code() {
    let test = "pool_05_pool_11_valkey_stopped_or_cut_off_fails_admission_closed_with_a_code";
    let Some((_, verdict)) = chaos(test, &["valkey_stop", "partition_api_valkey"], (3, 1), 30)
    else {
        return;
    };
    // The outages were answered, with coordination's codes (every refusal's code is checked).
    let coordination: u64 = [
        "coordination_unavailable",
        "inventory_unavailable",
        "ticket_lost",
    ]
    .iter()
    .filter_map(|c| verdict.summary.codes.get(*c))
    .sum();
    assert!(coordination > 0, "{:?}", verdict.summary);
}

#[test]
fn pool_09_pool_12_valkey_restarted_empty_or_from_an_older_snapshot_loses_no_kept_state() {
    // A restore from the snapshot rolls the pool document back; the pool trusts nothing of it
    // (decision 0034), so the lease check finds no code on a worker the pool handed on.
    let test =
        "pool_09_pool_12_valkey_restarted_empty_or_from_an_older_snapshot_loses_no_kept_state";
    let Some((history, verdict)) = chaos(
        test,
        &[
            "valkey_restart_empty",
            "valkey_restart_snapshot",
            "kill_controller",
            "valkey_stop",
        ],
        (2, 2),
        40,
    ) else {
        return;
    };
    assert_injected(&verdict, &["valkey_restart_snapshot"]);
    // The workspaces and kernels went on growing across the restarts.
    for kind in [Kind::Workspace, Kind::Kernel] {
        let longest = succeeded(&history, kind).map(|(_, seen)| seen.len()).max();
        assert!(longest.is_some_and(|n| n >= 5), "{kind:?}: {longest:?}");
    }
}

#[test]
fn pool_05_pool_06_a_replica_whose_wall_clock_steps_leases_nothing_wrongly() {
    // Deployment time is Valkey's: a replica whose own clock jumps by up to two thirds of the
    // grant's skew bound, either way, neither grants, renews nor takes over on its own clock.
    let test = "pool_05_pool_06_a_replica_whose_wall_clock_steps_leases_nothing_wrongly";
    let Some((_, verdict)) = chaos(
        test,
        &["clock_step", "pause_api", "kill_worker"],
        (2, 1),
        30,
    ) else {
        return;
    };
    assert_injected(&verdict, &["clock_step"]);
}

#[test]
fn ws_05_a_full_or_read_only_store_loses_no_succeeded_write() {
    let test = "ws_05_a_full_or_read_only_store_loses_no_succeeded_write";
    let Some((_, verdict)) = chaos(test, &["store_full", "store_read_only"], (2, 0), 30) else {
        return;
    };
    // The store's faults were met: runs that could not keep their snapshot failed the
    // durability check (and, by the checker, none of their writes is seen, none kept is lost).
    assert!(
        verdict
            .summary
            .codes
            .get("workspace_storage_unavailable")
            .is_some_and(|n| *n > 0),
        "{:?}",
        verdict.summary
    );
}

#[test]
fn ker_02_a_kernel_continues_on_another_worker_after_its_worker_or_replica_dies() {
    let test = "ker_02_a_kernel_continues_on_another_worker_after_its_worker_or_replica_dies";
    let Some((history, _)) = chaos(test, &["kill_worker", "kill_api", "pause_api"], (1, 3), 30)
    else {
        return;
    };
    // One kernel's cells ran on several workers, each seeing every element before it (checked).
    let mut by_conversation: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        std::collections::BTreeMap::new();
    for op in &history.ops {
        if let (Kind::Kernel, Answer::Succeeded { worker, .. }) = (op.kind, &op.answer) {
            by_conversation
                .entry(&op.conversation)
                .or_default()
                .insert(worker);
        }
    }
    assert!(
        by_conversation.values().any(|workers| workers.len() >= 2),
        "{by_conversation:?}"
    );
}

#[test]
fn ws_05_on_an_s3_store_paused_under_load_no_succeeded_write_is_lost() {
    let test = "ws_05_on_an_s3_store_paused_under_load_no_succeeded_write_is_lost";
    let Some((history, verdict)) = chaos_on(
        test,
        StoreKind::S3,
        &["store_pause", "kill_worker", "valkey_restart_empty"],
        (2, 1),
        0,
        30,
    ) else {
        return;
    };
    assert_injected(&verdict, &["store_pause"]);
    // The workspaces grew on S3 across the pauses (and, by the checker, lost nothing).
    let longest = succeeded(&history, Kind::Workspace)
        .map(|(_, seen)| seen.len())
        .max();
    assert!(longest.is_some_and(|n| n >= 5), "{longest:?}");
}

#[test]
fn brow_13_a_session_worker_is_used_again_only_after_its_close_was_confirmed_under_faults() {
    // Sessions opened, driven and closed from random replicas while workers, replicas and the
    // TURN server are killed and replicas paused. By the checker: each session held its worker
    // alone and under its lease, its page started empty and kept every answered action's token,
    // and a worker whose close was not confirmed clean never ran anything again.
    let test =
        "brow_13_a_session_worker_is_used_again_only_after_its_close_was_confirmed_under_faults";
    if !corral_testkit::programs_or_skip(test, &corral_worker::RUNTIME_PROGRAMS)
        || !corral_testkit::programs_or_skip(test, &[("coturn", "/usr/bin/turnserver")])
    {
        return;
    }
    let Some((history, verdict)) = chaos_on(
        test,
        StoreKind::Local,
        &["kill_worker", "kill_api", "kill_coturn", "pause_api"],
        (1, 0),
        2,
        45,
    ) else {
        return;
    };
    assert_injected(&verdict, &["kill_coturn", "kill_worker"]);
    let closed_clean = verdict.summary.sessions.get("confirmed").copied();
    let actions = verdict.summary.sessions.get("actions").copied();
    assert!(
        closed_clean.is_some_and(|n| n >= 3) && actions.is_some_and(|n| n >= 3),
        "{:?}",
        verdict.summary.sessions
    );
    // Workers that held a session served runs afterwards: reuse after a confirmed close was
    // exercised, not only avoided.
    let session_workers: BTreeSet<&str> = history
        .ops
        .iter()
        .filter_map(|op| op.session.as_ref())
        .filter(|s| s.confirmed == Some(true))
        .map(|s| s.worker.as_str())
        .collect();
    assert!(
        succeeded(&history, Kind::Workspace).any(|(worker, _)| session_workers.contains(worker)),
        "no worker of a confirmed session served a run afterwards: {session_workers:?}"
    );
}

#[test]
fn pkg_03_installs_through_the_broker_go_on_while_replicas_and_workers_die() {
    // One workspace operation in six installs the harness's package through the API's broker
    // (the controller's workers reach the broker on the first replica); by the checker each
    // install answered `succeeded` imported what the registry serves.
    let test = "pkg_03_installs_through_the_broker_go_on_while_replicas_and_workers_die";
    if let Some(why) = corral_testkit::registries::pypiserver_missing() {
        corral_testkit::skip(test, corral_testkit::Need::Services, &why);
        return;
    }
    let Some((_, verdict)) = chaos(
        test,
        &["kill_api", "kill_worker", "pause_worker"],
        (3, 0),
        45,
    ) else {
        return;
    };
    let installed = verdict.summary.installs.get("succeeded").copied();
    assert!(
        installed.is_some_and(|n| n >= 2),
        "{:?}",
        verdict.summary.installs
    );
}

#[test]
fn egr_02_egr_08_dns_failures_and_mixed_answers_never_reach_an_address_the_policy_refuses() {
    // One run in three fetches a name through the egress proxy while the DNS server the proxy
    // asks fails (SERVFAIL), stays silent, or answers the admitted target together with a canary
    // the policy refuses, and while the proxy itself is killed. By the checker: the canary was
    // never reached, every 200 carried the target's answer for the run's own path, every refusal
    // a stable reason.
    let test =
        "egr_02_egr_08_dns_failures_and_mixed_answers_never_reach_an_address_the_policy_refuses";
    if !corral_testkit::programs_or_skip(test, &[("ip", "/usr/sbin/ip")]) {
        return;
    }
    let Some((_, verdict)) = chaos(
        test,
        &[
            "dns_servfail",
            "dns_timeout",
            "dns_mixed",
            "kill_egress_proxy",
        ],
        (3, 0),
        60,
    ) else {
        return;
    };
    assert_injected(&verdict, &["dns_servfail", "dns_timeout", "dns_mixed"]);
    let fetches = &verdict.summary.fetches;
    // Fetches reached the target between the faults, and the faults were answered as refusals
    // with their reasons (the code's own timeouts aside).
    assert!(fetches.get("200").is_some_and(|n| *n > 0), "{fetches:?}");
    assert!(
        fetches
            .keys()
            .any(|what| what.starts_with('4') || what.starts_with('5')),
        "{fetches:?}"
    );
}
