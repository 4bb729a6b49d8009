//! The shell world's command, as CI and the README run it: a failing seed replays, the worker
//! client's retry defect and the lease holder driver's are each caught by their own invariant, and a schedule the world cannot honour is
//! refused at start. Each runs the built binary in a process of its own (the defect is a switch of
//! the whole process).

use std::process::Command;

fn world(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_corral-sim-shells"))
        .args(args)
        .output()
        .expect("the shell world starts");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code(), text)
}

#[test]
fn the_clients_retry_of_a_lost_execute_is_caught_by_run_executed_twice() {
    let (code, text) = world(&["--mutation", "retry-lost-execute", "300"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("by its own invariant (run_executed_twice): true"),
        "{text}"
    );
}

#[test]
fn a_holder_driver_that_keeps_a_lost_lease_is_caught_by_kept_after_lease_lost() {
    let (code, text) = world(&["--mutation", "keep-lost-lease", "300"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("by its own invariant (kept_after_lease_lost): true"),
        "{text}"
    );
}

#[test]
fn a_seed_replays_identically_and_seeds_hold_every_invariant() {
    let (code, text) = world(&["--replay", "5"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("replayed identically"), "{text}");
    let (code, text) = world(&["--seeds", "50"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("shell world: 50 seeds, 0 with violations"),
        "{text}"
    );
}

#[test]
fn bad_input_is_refused_at_start_with_a_message() {
    for args in [
        &["--seeds", "0"][..],
        &["--mutation", "nope", "3"],
        &["--bogus"],
    ] {
        let (code, text) = world(args);
        assert_eq!(code, Some(2), "{args:?}: {text}");
        assert!(text.starts_with("corral-sim-shells: "), "{args:?}: {text}");
    }
}
