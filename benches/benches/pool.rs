//! Pool transitions per second: what one store round trip costs corral-core.
//!
//! - `lease_cycle`: Acquire, Release and ResetReported on a warm pool (three transitions).
//! - `tick_saturated`: the controller's Tick on 32 leased workers with 200 tickets waiting.
//! - `invariants_32_workers_200_queued`: the invariant check `apply` runs after every transition,
//!   on that same document, to show its share.
//! - `clone_doc`: a full `PoolDoc` clone, which the store shell makes for every transition (it
//!   applies the command to a copy and compares-and-sets it).
//!
//! Quick run: `cargo bench -p corral-benches -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use corral_benches::{Bench, reset_token};
use corral_core::pool::{Command, Disposition, PoolConfig};
use corral_core::reset::ResetEvidence;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// Transitions in one lease cycle: Acquire, Release, ResetReported.
const CYCLE_TRANSITIONS: u64 = 3;
const SATURATED_WORKERS: u32 = 32;
const SATURATED_QUEUED: u32 = 200;

fn lease_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");
    group.throughput(Throughput::Elements(CYCLE_TRANSITIONS));
    let mut bench = Bench::warm(PoolConfig::default());
    group.bench_function("lease_cycle", |b| {
        b.iter(|| {
            // The same document each time: the cycle returns the worker to warm.
            let grant = bench.acquire_granted();
            let released = bench.apply(Command::Release {
                worker: grant.worker,
                lease: grant.ticket,
                token: grant.token,
                disposition: Disposition::Reset,
            });
            let Some(token) = reset_token(&released, grant.worker) else {
                panic!("a release orders a reset: {released:?}");
            };
            black_box(bench.apply(Command::ResetReported {
                worker: grant.worker,
                token,
                evidence: ResetEvidence::clean(token),
            }))
        });
    });
    group.finish();
}

fn tick_saturated(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");
    group.throughput(Throughput::Elements(1));
    let mut bench = Bench::saturated(SATURATED_WORKERS, SATURATED_QUEUED);
    group.bench_function("tick_32_workers_200_queued", |b| {
        // A tick at unchanged time leaves the document as it was, so every iteration measures the
        // same full pass over workers and queue.
        b.iter(|| black_box(bench.tick()));
    });
    // `apply` asserts the invariants after every transition; this shows their share of a tick.
    group.bench_function("invariants_32_workers_200_queued", |b| {
        b.iter(|| black_box(black_box(&bench.doc).check(&bench.config)));
    });
    group.finish();
}

fn clone_doc(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");
    group.throughput(Throughput::Elements(1));
    let warm = Bench::warm(PoolConfig::default());
    group.bench_function("clone_doc_warm_3", |b| {
        b.iter(|| black_box(black_box(&warm.doc).clone()));
    });
    let saturated = Bench::saturated(SATURATED_WORKERS, SATURATED_QUEUED);
    group.bench_function("clone_doc_32_workers_200_queued", |b| {
        b.iter(|| black_box(black_box(&saturated.doc).clone()));
    });
    group.finish();
}

criterion_group!(benches, lease_cycle, tick_saturated, clone_doc);
criterion_main!(benches);
