# Corral's verbs. Each recipe is the command CI runs (see .ci/run), so nothing requires `just`:
# copy the command from here when it is not installed.

# List the recipes.
default:
    @just --list

# Every test: the one command the README names.
test:
    cargo test --locked --workspace

# The simulator over many seeds (or `just sim 1` ... `just sim 10000`); ends with `seeds: N, violations: V`.
sim seeds="1000":
    cargo run --locked -p corral-sim --release -- --seeds {{seeds}}

# Replay one seed and print its event trace.
replay seed:
    cargo run --locked -p corral-sim --release -- --seed {{seed}}

# The shells' own code under turmoil (issue 28): `just sim-shells 1000`; one seed's trace with
# `cargo run -p corral-sim-shells -- --trace SEED`.
sim-shells seeds="1000":
    cargo run --locked -p corral-sim-shells -- --seeds {{seeds}}
    cargo run --locked -p corral-sim-shells -- --mutation retry-lost-execute 300
    cargo run --locked -p corral-sim-shells -- --mutation keep-lost-lease 300
    cargo run --locked -p corral-sim-shells -- --mutation answer-before-save 300
    cargo run --locked -p corral-sim-shells -- --mutation reap-stale-leases 300

# Every mutation must be caught: the simulator exits 1 on a violation, 0 when the mutation survived.
mutations:
    #!/usr/bin/env bash
    set -uo pipefail
    for mutation in ceiling reset-token takeover-reassign ambiguous-free fifo member-limit store-fallback stale-image stale-heartbeat stale-release discard-clean burst-linger-short burst-never-retired create-while-warm refusal-reason queue-bound create-concurrency admission-open grant-after-deadline revive-expired old-listing reuse-discarded trust-restored unknown-delete-done partial-evidence over-retire idle-early closing-callable; do
        echo "--- mutation $mutation"
        cargo run --locked -q -p corral-sim --release -- --mutation "$mutation" --seeds 500 --stop-on-first
        status=$?
        if [ "$status" -eq 0 ]; then
            echo "mutation $mutation survived" >&2
            exit 1
        elif [ "$status" -ne 1 ]; then
            echo "mutation $mutation: the simulator failed (exit $status)" >&2
            exit 1
        fi
    done

# Chaos on real processes: every fault for SECONDS (150 by default; 1800 for release
# qualification), checked from the history (`just chaos 1800 --seed 42` replays seed 42).
chaos seconds="150" *args:
    cargo build --locked -p corral -p corral-chaos
    target/debug/corral-chaos run --duration {{seconds}} {{args}}

# The criterion benchmarks (`just bench -- --warm-up-time 1 --measurement-time 3` for a quick run).
bench *args:
    cargo bench --locked -p corral-benches {{args}}

# Clippy with warnings as errors, with and without the simulator's mutation hooks.
lint:
    cargo clippy --locked --workspace --all-targets -- -D warnings
    cargo clippy --locked -p corral-core --all-targets --features sim-mutations -- -D warnings
    cargo clippy --locked -p corral-core --all-targets -- -D warnings

# Regenerate the README's settings table from corral_core::config::SETTINGS.
settings-docs:
    cargo run --locked -q -p corral -- config docs

# Exactly what CI runs.
ci:
    bash .ci/run
