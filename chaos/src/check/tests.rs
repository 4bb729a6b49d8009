//! The checker's own tests: a clean history passes, and each planted violation is caught with the
//! operations involved.

use std::collections::BTreeMap;

use super::*;
use crate::history::{Fault, PoolSample, Via};

/// A history of `ops` with a ceiling of 4, a warm target of 2, a member limit of 1, recovered.
fn history(ops: Vec<Op>) -> History {
    History {
        seed: 1,
        clock_origin_ns: 0,
        ceiling: 4,
        warm_target: 2,
        member_limit: 1,
        ops,
        pool: vec![
            PoolSample {
                requested_ns: 0,
                at_ns: 0,
                allocated: 2,
                warm: 2,
                quarantined: 0,
                workers: BTreeMap::new(),
                epoch: None,
            },
            PoolSample {
                requested_ns: 9_990,
                at_ns: 10_000,
                allocated: 3,
                warm: 2,
                quarantined: 0,
                workers: BTreeMap::new(),
                epoch: None,
            },
        ],
        faults: Vec::new(),
        quiet_ns: 9_000,
        end_ns: 11_000,
        mark: String::new(),
        canary_hits: Vec::new(),
    }
}

/// A succeeded operation `id` of `kind` in `conv` (actor and member `a`), sent at `start`,
/// running on `worker` over `start+1..end-1`, having seen `seen`.
fn ok(id: u64, kind: Kind, conv: &str, worker: &str, start: u64, end: u64, seen: &[&str]) -> Op {
    Op {
        id,
        kind,
        actor: "a".to_owned(),
        conversation: conv.to_owned(),
        member: format!("m-{conv}"),
        token: format!("t{id}"),
        via: Via::Run,
        replica: 0,
        ran: None,
        start_ns: start,
        end_ns: end,
        answer: Answer::Succeeded {
            worker: worker.to_owned(),
            generation: Some(id),
            seen: seen.iter().map(|s| (*s).to_owned()).collect(),
            exec_start_ns: start + 1,
            exec_end_ns: end - 1,
        },
        mark: None,
        session: None,
        fetched: None,
    }
}

/// `op` as a Hashline edit: it ran on no worker.
fn edited(mut op: Op) -> Op {
    op.via = Via::Edit;
    if let Answer::Succeeded { worker, .. } = &mut op.answer {
        worker.clear();
    }
    op
}

fn with(mut op: Op, answer: Answer) -> Op {
    op.answer = answer;
    op
}

fn rules(verdict: &Verdict) -> Vec<&'static str> {
    verdict.violations.iter().map(|v| v.rule).collect()
}

/// A workspace and a kernel, each three operations one after the other on two workers.
fn clean() -> Vec<Op> {
    vec![
        ok(1, Kind::Workspace, "c1", "w-1", 100, 200, &[]),
        ok(2, Kind::Workspace, "c1", "w-2", 300, 400, &["t1"]),
        ok(3, Kind::Workspace, "c1", "w-1", 500, 600, &["t1", "t2"]),
        ok(4, Kind::Kernel, "c2", "w-2", 100, 200, &[]),
        ok(5, Kind::Kernel, "c2", "w-1", 300, 400, &["t4"]),
        ok(6, Kind::Kernel, "c2", "w-2", 700, 800, &["t4", "t5"]),
    ]
}

#[test]
fn a_clean_history_has_no_violation() {
    let verdict = check(&history(clean()));
    assert!(verdict.violations.is_empty(), "{verdict}");
    assert_eq!(verdict.summary.answers.get("succeeded"), Some(&6));
    assert_eq!(verdict.summary.final_recovery, Some(1_000));
}

#[test]
fn pool_05_a_planted_double_lease_is_caught_with_both_holders() {
    let mut ops = clean();
    // Op 5 ran on w-1 while op 3 did: one worker, two holders.
    ops[4] = ok(5, Kind::Kernel, "c2", "w-1", 520, 580, &["t4"]);
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["double_lease"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [3, 5]);
    assert!(
        verdict.violations[0]
            .detail
            .contains("w-1 ran two operations at once")
    );
    assert!(
        verdict.violations[0].detail.contains("#5 Kernel a/c2"),
        "{verdict}"
    );
}

#[test]
fn a_double_lease_hidden_behind_a_long_run_is_caught() {
    // A long run on w-1, then two short ones inside it: both overlap the long one.
    let ops = vec![
        ok(1, Kind::Workspace, "c1", "w-1", 0, 1_000, &[]),
        ok(2, Kind::Workspace, "c3", "w-1", 100, 200, &[]),
        ok(3, Kind::Workspace, "c4", "w-1", 300, 400, &[]),
    ];
    let verdict = check(&history(ops));
    assert_eq!(
        rules(&verdict),
        ["double_lease", "double_lease"],
        "{verdict}"
    );
    assert_eq!(verdict.violations[1].ops, [1, 3]);
}

#[test]
fn ws_05_a_planted_lost_write_is_caught() {
    let mut ops = clean();
    // Op 3 began after op 2 succeeded, and does not see op 2's token.
    ops[2] = ok(3, Kind::Workspace, "c1", "w-1", 500, 600, &["t1"]);
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["lost_write"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [2, 3]);
}

#[test]
fn ws_05_a_generation_that_goes_back_is_caught() {
    let mut ops = clean();
    if let Answer::Succeeded { generation, .. } = &mut ops[2].answer {
        *generation = Some(1);
    }
    let verdict = check(&history(ops));
    assert_eq!(
        rules(&verdict),
        ["generation_regressed", "generation_regressed"]
    );
    assert_eq!(verdict.violations[0].ops, [1, 3]);
}

#[test]
fn ker_02_a_planted_lost_kernel_element_is_caught() {
    let mut ops = clean();
    ops[5] = ok(6, Kind::Kernel, "c2", "w-2", 700, 800, &["t5"]);
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["lost_element"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [4, 6]);
}

#[test]
fn ker_02_a_kernel_element_shown_twice_is_caught() {
    let mut ops = clean();
    ops[5] = ok(6, Kind::Kernel, "c2", "w-2", 700, 800, &["t4", "t5", "t5"]);
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["duplicate_element"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [5, 6]);
}

#[test]
fn pool_04_a_planted_ceiling_breach_is_caught() {
    let mut h = history(clean());
    h.pool.push(PoolSample {
        requested_ns: 440,
        at_ns: 450,
        allocated: 5,
        warm: 3,
        quarantined: 0,
        workers: BTreeMap::new(),
        epoch: None,
    });
    h.pool.sort_by_key(|s| s.at_ns);
    let verdict = check(&h);
    assert_eq!(rules(&verdict), ["ceiling"], "{verdict}");
    assert!(
        verdict.violations[0]
            .detail
            .contains("5 workers allocated at 450 (ceiling 4)")
    );
}

#[test]
fn an_indefinite_operation_may_be_seen_or_not_but_a_refused_one_never() {
    let mut ops = clean();
    // Op 2 got no answer: op 3 may see its token (it does) ...
    ops[1] = with(
        ops[1].clone(),
        Answer::NoAnswer {
            why: "connection reset".to_owned(),
        },
    );
    // ... and op 5's failure may have taken effect or not (op 6 does not see it).
    ops[4] = with(
        ops[4].clone(),
        Answer::Failed {
            status: 502,
            outcome: None,
            code: Some("worker_lost".to_owned()),
        },
    );
    ops[5] = ok(6, Kind::Kernel, "c2", "w-2", 700, 800, &["t4"]);
    let verdict = check(&history(ops.clone()));
    assert!(verdict.violations.is_empty(), "{verdict}");
    // A refusal is definite: its token must never be seen.
    ops[1] = with(
        ops[1].clone(),
        Answer::Refused {
            status: 503,
            code: Some("coordination_unavailable".to_owned()),
        },
    );
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["refused_applied"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [2, 3]);
}

#[test]
fn a_token_never_written_or_seen_before_its_write_is_a_phantom() {
    let mut ops = clean();
    ops[1] = ok(2, Kind::Workspace, "c1", "w-2", 300, 400, &["t1", "t9"]);
    ops[2] = ok(3, Kind::Workspace, "c1", "w-1", 500, 600, &["t1", "t2"]);
    ops[0] = ok(1, Kind::Workspace, "c1", "w-1", 100, 200, &["t3"]);
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["phantom", "phantom"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [3, 1]);
    assert_eq!(verdict.violations[1].ops, [2]);
}

#[test]
fn writes_seen_out_of_order_are_caught() {
    let mut ops = clean();
    ops[2] = ok(3, Kind::Workspace, "c1", "w-1", 500, 600, &["t2", "t1"]);
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["reordered"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [1, 2, 3]);
}

#[test]
fn pool_06_a_member_over_its_limit_is_caught() {
    let mut ops = clean();
    // Op 5 of member m-c1 runs on w-2 while op 3 of the same member runs on w-1.
    ops[4] = ok(5, Kind::Kernel, "c2", "w-2", 520, 580, &["t4"]);
    ops[4].member = "m-c1".to_owned();
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["member_limit"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [3, 5]);
}

#[test]
fn every_refusal_carries_a_stable_code() {
    let mut ops = clean();
    for (index, code) in [None, Some("No capacity, try later"), Some("")]
        .iter()
        .enumerate()
    {
        ops.push(with(
            ok(
                10 + index as u64,
                Kind::Workspace,
                "c9",
                "w-1",
                900,
                950,
                &[],
            ),
            Answer::Refused {
                status: 503,
                code: code.map(str::to_owned),
            },
        ));
    }
    ops.push(with(
        ok(20, Kind::Workspace, "c9", "w-1", 960, 970, &[]),
        Answer::Failed {
            status: 200,
            outcome: Some("exploded".to_owned()),
            code: None,
        },
    ));
    ops.push(with(
        ok(21, Kind::Workspace, "c9", "w-1", 980, 990, &[]),
        Answer::Refused {
            status: 429,
            code: Some("queue_full".to_owned()),
        },
    ));
    let verdict = check(&history(ops));
    assert_eq!(
        rules(&verdict),
        [
            "refusal_without_code",
            "refusal_without_code",
            "refusal_without_code",
            "unknown_outcome"
        ],
        "{verdict}"
    );
    assert_eq!(verdict.summary.codes.get("queue_full"), Some(&1));
}

#[test]
fn pool_09_a_pool_that_never_returns_to_its_warm_target_is_caught() {
    let mut h = history(clean());
    h.pool[1].quarantined = 1;
    h.faults.push(Fault {
        kind: "kill_worker".to_owned(),
        target: "w-1".to_owned(),
        at_ns: 1_000,
        healed_ns: 1_500,
    });
    let verdict = check(&h);
    assert_eq!(rules(&verdict), ["pool_not_recovered"], "{verdict}");
    // Warm again (though one is quarantined) 8.5 µs after the fault healed.
    assert_eq!(
        verdict.summary.longest_recovery,
        Some((8_500, "kill_worker of w-1".to_owned()))
    );
}

/// A pool read at `requested..at` showing `worker` in `state`.
fn read(requested: u64, at: u64, worker: &str, state: &str) -> PoolSample {
    // Op 5 (member m-c2) runs on w-1 over the same time as op 2 on w-2.
    let mut workers = BTreeMap::from([("w-1".to_owned(), "leased:m-c2".to_owned())]);
    workers.insert(worker.to_owned(), state.to_owned());
    PoolSample {
        requested_ns: requested,
        at_ns: at,
        allocated: 3,
        warm: 2,
        quarantined: 0,
        workers,
        epoch: None,
    }
}

#[test]
fn pool_06_code_that_runs_on_a_worker_the_pool_gave_away_ran_without_its_lease() {
    let mut h = history(clean());
    // Op 2 (member m-c1) ran on w-2 over 301..399: a read inside it shows w-2 leased to it
    // (fine), then one shows it leased to another member, one reset, and one read that began
    // before the code started proves nothing.
    h.pool.push(read(310, 320, "w-2", "leased:m-c1"));
    h.pool.push(read(290, 330, "w-2", "warm"));
    h.pool.sort_by_key(|s| s.at_ns);
    assert!(check(&h).violations.is_empty(), "{}", check(&h));
    h.pool.push(read(340, 350, "w-2", "leased:m-c2"));
    h.pool.sort_by_key(|s| s.at_ns);
    let verdict = check(&h);
    assert_eq!(rules(&verdict), ["ran_without_lease"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [2]);
    assert!(
        verdict.violations[0].detail.contains("w-2 was leased:m-c2"),
        "{verdict}"
    );
    // Resetting under running code is as wrong; quarantined (an expired lease's worker on its
    // way out, POOL-9) is not.
    let mut h = history(clean());
    h.pool.push(read(520, 530, "w-1", "quarantined"));
    h.pool.sort_by_key(|s| s.at_ns);
    assert!(check(&h).violations.is_empty(), "{}", check(&h));
    h.pool.push(read(540, 550, "w-1", "resetting"));
    h.pool.sort_by_key(|s| s.at_ns);
    assert_eq!(rules(&check(&h)), ["ran_without_lease"]);
}

/// Code that runs on in a worker of an epoch the pool no longer holds (Valkey came back empty, or
/// from a snapshot the pool does not trust) ran under a lease that ended with its epoch: its
/// worker is absent from the new pool and can be granted to no one. The same worker absent from a
/// pool of its own epoch is a lease the pool forgot.
#[test]
fn pool_09_a_worker_absent_from_a_later_epoch_is_an_orphan_not_a_forgotten_lease() {
    let epoch_of = |id: &str| corral_core::ids::WorkerId::parse(id).map(|w| w.epoch);
    let old = "w-aa-1";
    assert_eq!(epoch_of(old), Some(0xaa));
    // The clean history, with w-1 of epoch aa.
    let ops = vec![
        ok(1, Kind::Workspace, "c1", old, 100, 200, &[]),
        ok(2, Kind::Workspace, "c1", "w-2", 300, 400, &["t1"]),
        ok(3, Kind::Workspace, "c1", old, 500, 600, &["t1", "t2"]),
        ok(4, Kind::Kernel, "c2", "w-2", 100, 200, &[]),
        ok(5, Kind::Kernel, "c2", old, 300, 400, &["t4"]),
        ok(6, Kind::Kernel, "c2", "w-2", 700, 800, &["t4", "t5"]),
    ];
    let absent_from = |epoch: u64| PoolSample {
        requested_ns: 520,
        at_ns: 530,
        allocated: 0,
        warm: 0,
        quarantined: 0,
        workers: BTreeMap::new(),
        epoch: Some(epoch),
    };
    let mut h = history(ops.clone());
    h.pool.push(absent_from(0xbb));
    h.pool.sort_by_key(|s| s.at_ns);
    assert!(check(&h).violations.is_empty(), "{}", check(&h));
    let mut h = history(ops);
    h.pool.push(absent_from(0xaa));
    h.pool.sort_by_key(|s| s.at_ns);
    assert_eq!(rules(&check(&h)), ["ran_without_lease"]);
}

#[test]
fn pool_05_code_that_ran_under_a_failed_answer_still_counts_for_single_tenancy() {
    let mut ops = clean();
    // Op 7 failed (its save was refused), but its code ran on w-1 while op 3 did.
    let mut failed = with(
        ok(7, Kind::Workspace, "c7", "w-1", 450, 650, &[]),
        Answer::Failed {
            status: 503,
            outcome: Some("error".to_owned()),
            code: Some("workspace_storage_unavailable".to_owned()),
        },
    );
    failed.ran = Some(crate::history::Ran {
        worker: "w-1".to_owned(),
        start_ns: 540,
        end_ns: 560,
        seen: Vec::new(),
    });
    ops.push(failed);
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["double_lease"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [3, 7]);
}

#[test]
fn ws_03_edits_run_on_no_worker_and_two_at_once_are_no_double_lease() {
    let mut ops = clean();
    // Two edits of two workspaces at once, beside the runs: nothing ran twice on one worker.
    ops.push(edited(ok(
        7,
        Kind::Workspace,
        "c1",
        "",
        700,
        800,
        &["t1", "t2", "t3"],
    )));
    ops.push(edited(ok(8, Kind::Workspace, "c3", "", 700, 800, &[])));
    let verdict = check(&history(ops));
    assert!(verdict.violations.is_empty(), "{verdict}");
}

#[test]
fn ws_05_an_applied_edit_lost_by_a_later_run_is_caught() {
    let mut ops = clean();
    ops.push(edited(ok(
        7,
        Kind::Workspace,
        "c1",
        "",
        700,
        800,
        &["t1", "t2", "t3"],
    )));
    // A run after the edit that does not see its token: the edit's save was lost.
    ops.push(ok(
        9,
        Kind::Workspace,
        "c1",
        "w-1",
        900,
        1_000,
        &["t1", "t2", "t3"],
    ));
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["lost_write"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [7, 9]);
    assert!(
        verdict.violations[0]
            .detail
            .contains("#7 Workspace edit a/c1"),
        "{verdict}"
    );
}

#[test]
fn ws_05_a_refused_edit_whose_line_was_kept_is_caught() {
    let mut ops = clean();
    ops.push(with(
        edited(ok(
            7,
            Kind::Workspace,
            "c1",
            "",
            700,
            800,
            &["t1", "t2", "t3"],
        )),
        Answer::Refused {
            status: 409,
            code: Some("stale_anchor".to_owned()),
        },
    ));
    ops.push(ok(
        9,
        Kind::Workspace,
        "c1",
        "w-1",
        900,
        1_000,
        &["t1", "t2", "t3", "t7"],
    ));
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["refused_applied"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [7, 9]);
}

/// A browser session `id` (member `m-<conv>`) on `worker`, held over `start..end`, whose actions
/// saw `acts` (each its token and the list it saw, `None` unanswered), closed `confirmed`.
fn session(
    id: u64,
    conv: &str,
    worker: &str,
    (start, end): (u64, u64),
    acts: &[(&str, Option<&[&str]>)],
    confirmed: Option<bool>,
) -> Op {
    let mut op = ok(id, Kind::Browser, conv, worker, start, end, &[]);
    op.via = Via::Session;
    if let Answer::Succeeded { generation, .. } = &mut op.answer {
        *generation = None;
    }
    op.session = Some(crate::history::Session {
        id: format!("s{id}"),
        worker: worker.to_owned(),
        acts: acts
            .iter()
            .map(|(token, seen)| crate::history::Act {
                token: (*token).to_owned(),
                sent_ns: start + 1,
                answered_ns: start + 2,
                seen: seen.map(|s| s.iter().map(|t| (*t).to_owned()).collect()),
                refused: None,
            })
            .collect(),
        close_sent_ns: Some(end - 1),
        confirmed,
    });
    op
}

#[test]
fn brow_13_a_clean_session_beside_runs_has_no_violation() {
    let mut ops = clean();
    ops.push(session(
        7,
        "b1",
        "w-3",
        (100, 900),
        &[
            ("a1", Some(&["a1"])),
            ("a2", None),
            ("a3", Some(&["a1", "a2", "a3"])),
        ],
        Some(true),
    ));
    // The worker serves a run once the session's close was confirmed.
    ops.push(ok(8, Kind::Workspace, "c9", "w-3", 950, 990, &[]));
    let verdict = check(&history(ops));
    assert!(verdict.violations.is_empty(), "{verdict}");
    assert_eq!(verdict.summary.sessions.get("confirmed"), Some(&1));
    assert_eq!(verdict.summary.sessions.get("actions"), Some(&2));
}

#[test]
fn brow_13_a_run_on_a_session_worker_before_its_close_is_a_double_lease() {
    let mut ops = clean();
    ops.push(session(7, "b1", "w-3", (100, 900), &[], Some(true)));
    ops.push(ok(8, Kind::Workspace, "c9", "w-3", 400, 500, &[]));
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["double_lease"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [7, 8]);
}

#[test]
fn brow_13_a_worker_used_again_after_an_unconfirmed_close_is_caught() {
    let mut ops = clean();
    ops.push(session(7, "b1", "w-3", (100, 900), &[], Some(false)));
    ops.push(ok(8, Kind::Workspace, "c9", "w-3", 950, 990, &[]));
    let verdict = check(&history(ops));
    assert_eq!(rules(&verdict), ["browser_worker_reused"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [7, 8]);
}

#[test]
fn brow_13_a_page_that_shows_another_session_or_forgets_its_own_is_caught() {
    let leaked = session(
        7,
        "b1",
        "w-3",
        (100, 900),
        &[("b1", Some(&["a1", "b1"]))],
        Some(true),
    );
    let lost = session(
        8,
        "b2",
        "w-4",
        (100, 900),
        &[("c1", Some(&["c1"])), ("c2", Some(&["c2"]))],
        Some(true),
    );
    let verdict = check(&history(vec![leaked, lost]));
    assert_eq!(
        rules(&verdict),
        ["browser_state_leaked", "browser_state_lost"],
        "{verdict}"
    );
    assert!(verdict.violations[0].detail.contains("saw a1"), "{verdict}");
    assert!(
        verdict.violations[1].detail.contains("did not see c1"),
        "{verdict}"
    );
}

#[test]
fn pkg_03_an_install_that_did_not_print_the_registry_mark_is_caught() {
    let mut ops = clean();
    let mut installed = ok(
        7,
        Kind::Workspace,
        "c1",
        "w-1",
        700,
        800,
        &["t1", "t2", "t3"],
    );
    installed.via = Via::Install;
    installed.mark = Some("mark-of-the-registry".to_owned());
    let mut other = ok(
        8,
        Kind::Workspace,
        "c1",
        "w-2",
        900,
        950,
        &["t1", "t2", "t3", "t7"],
    );
    other.via = Via::Install;
    other.mark = Some("a-baked-copy".to_owned());
    ops.extend([installed, other]);
    let mut history = history(ops);
    history.mark = "mark-of-the-registry".to_owned();
    let verdict = check(&history);
    assert_eq!(rules(&verdict), ["install_unproven"], "{verdict}");
    assert_eq!(verdict.violations[0].ops, [8]);
    assert_eq!(verdict.summary.installs.get("succeeded"), Some(&2));
}

#[test]
fn pool_06_a_session_seen_held_only_for_an_instant_overlaps_nothing() {
    // A session whose only sign of holding was its open's answer, then the member's next
    // session much later: one at a time, not two.
    let mut first = session(7, "b1", "w-3", (100, 200), &[], None);
    first.answer = Answer::NoAnswer {
        why: "the replica died".to_owned(),
    };
    first.ran = Some(crate::history::Ran {
        worker: "w-3".to_owned(),
        start_ns: 150,
        end_ns: 150,
        seen: Vec::new(),
    });
    let second = session(8, "b1", "w-4", (500, 900), &[], Some(true));
    let verdict = check(&history(vec![first, second]));
    assert!(verdict.violations.is_empty(), "{verdict}");
}

/// `op` with a fetch that got `status` and `said`.
fn fetching(mut op: Op, status: u16, said: &str) -> Op {
    op.fetched = Some(crate::history::Fetched {
        status,
        said: said.to_owned(),
    });
    op
}

#[test]
fn egr_02_fetches_answered_by_the_target_or_refused_with_a_reason_have_no_violation() {
    let mut ops = clean();
    ops[0] = fetching(ops[0].clone(), 200, "m1 /t1");
    ops[1] = fetching(ops[1].clone(), 502, "dns_failed");
    ops[2] = fetching(ops[2].clone(), 0, "TimeoutError");
    let mut history = history(ops);
    history.mark = "m1".to_owned();
    let verdict = check(&history);
    assert!(verdict.violations.is_empty(), "{verdict}");
    assert_eq!(verdict.summary.fetches.get("200"), Some(&1));
    assert_eq!(verdict.summary.fetches.get("502 dns_failed"), Some(&1));
}

#[test]
fn egr_02_a_reached_canary_a_forged_answer_and_a_refusal_without_reason_are_caught() {
    let mut ops = clean();
    // Another run's answer, and a refusal with no reason header (Python prints None).
    ops[0] = fetching(ops[0].clone(), 200, "m1 /t2");
    ops[1] = fetching(ops[1].clone(), 502, "None");
    let mut history = history(ops);
    history.mark = "m1".to_owned();
    history.canary_hits = vec!["1765000000.000 from 10.213.250.1".to_owned()];
    let verdict = check(&history);
    assert_eq!(
        rules(&verdict),
        [
            "egress_reached_forbidden",
            "egress_forged",
            "refusal_without_code"
        ],
        "{verdict}"
    );
    assert_eq!(verdict.violations[1].ops, [1]);
    assert_eq!(verdict.violations[2].ops, [2]);
}
