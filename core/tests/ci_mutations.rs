//! CI proves that the simulator catches every deliberate rule break, so `.ci/run` must list every
//! mutation corral-core defines; a mutation added to `pool::Mutation` without joining CI's list
//! would never be checked (docs/decisions/0003-sim-mutations-feature.md).

// This test reads `.ci/run` from disk; the crate's own ban on I/O (clippy.toml) is for the
// library, not for the tests that guard it.
#![allow(clippy::disallowed_methods)]

use std::path::Path;

use corral_core::pool::Mutation;

#[test]
fn ci_runs_every_core_mutation() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/run");
    let script = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let Some(list) = script.lines().find(|line| line.starts_with("MUTATIONS=(")) else {
        panic!(".ci/run has no `MUTATIONS=(...)` line");
    };
    let listed: Vec<&str> = list
        .trim_start_matches("MUTATIONS=(")
        .trim_end_matches(')')
        .split_whitespace()
        .collect();
    for mutation in Mutation::ALL {
        assert!(
            listed.contains(&mutation.name()),
            "mutation {} is defined in corral-core but .ci/run does not check that the simulator catches it",
            mutation.name()
        );
    }
}
