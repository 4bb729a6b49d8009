//! The API's Prometheus counters (`GET /metrics`): run outcomes, bound hits, admission refusals,
//! grants by effective mode, acquire latency, and how this replica's writes to the pool document
//! fared (written or refused as contended); pool states and queue depth are read from the pool
//! document at scrape time. Egress decisions at the wire are the proxy's own counters
//! (`CORRAL_EGRESS_METRICS_LISTEN`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use corral_core::pool::StateCounts;
use corral_store::WriteCounts;

/// Spans this process's OTLP exporter could not send and dropped (the endpoint down or refusing):
/// counted by the binary's exporter, shown by `/metrics`.
pub static OTLP_SPANS_DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Upper bounds of the acquire-latency histogram's buckets, in seconds.
const ACQUIRE_BUCKETS: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

#[derive(Default)]
struct Counters {
    runs: BTreeMap<&'static str, u64>,
    bounds: BTreeMap<String, u64>,
    refusals: BTreeMap<&'static str, u64>,
    events: BTreeMap<(&'static str, &'static str), u64>,
    unperformed: BTreeMap<&'static str, u64>,
    grants: BTreeMap<&'static str, u64>,
    acquire_buckets: [u64; ACQUIRE_BUCKETS.len()],
    acquire_count: u64,
    acquire_sum: f64,
}

/// The counters.
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<Counters>,
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Counters)) {
        if let Ok(mut counters) = self.counters.lock() {
            f(&mut counters);
        }
    }

    /// A run ended with `outcome`.
    pub fn run(&self, outcome: &'static str) {
        self.with(|c| *c.runs.entry(outcome).or_default() += 1);
    }

    /// A run hit the bound named by `setting`.
    pub fn bound(&self, setting: &str) {
        self.with(|c| *c.bounds.entry(setting.to_owned()).or_default() += 1);
    }

    /// Admission refused a run with `code`.
    pub fn refusal(&self, code: &'static str) {
        self.with(|c| *c.refusals.entry(code).or_default() += 1);
    }

    /// An event the specification names happened (`run_code.private_selection_withheld`, ...),
    /// with its bounded reason code.
    pub fn event(&self, event: &'static str, reason: &'static str) {
        self.with(|c| *c.events.entry((event, reason)).or_default() += 1);
    }

    /// Something the pool ordered or a holder owed was not performed here, with why
    /// (`reset_unanswered`, `delete_left_to_controller`, ...): never silently.
    pub fn unperformed(&self, what: &'static str) {
        self.with(|c| *c.unperformed.entry(what).or_default() += 1);
    }

    /// A run was dispatched with effective egress `mode` (`isolated`: no grant).
    pub fn egress(&self, mode: &'static str) {
        self.with(|c| *c.grants.entry(mode).or_default() += 1);
    }

    /// A lease was granted after `waited`.
    pub fn acquired(&self, waited: Duration) {
        let seconds = waited.as_secs_f64();
        self.with(|c| {
            for (bucket, bound) in c.acquire_buckets.iter_mut().zip(ACQUIRE_BUCKETS) {
                if seconds <= bound {
                    *bucket += 1;
                }
            }
            c.acquire_count += 1;
            c.acquire_sum += seconds;
        });
    }

    /// The exposition text, with the pool's state counts and queue depth when readable.
    pub fn render(&self, pool: Option<(StateCounts, usize)>, writes: &WriteCounts) -> String {
        let mut out = String::new();
        let Ok(c) = self.counters.lock() else {
            return out;
        };
        let _ = writeln!(out, "# TYPE corral_runs_total counter");
        for (outcome, n) in &c.runs {
            let _ = writeln!(out, "corral_runs_total{{outcome=\"{outcome}\"}} {n}");
        }
        let _ = writeln!(out, "# TYPE corral_bound_hits_total counter");
        for (setting, n) in &c.bounds {
            let _ = writeln!(out, "corral_bound_hits_total{{setting=\"{setting}\"}} {n}");
        }
        let _ = writeln!(out, "# TYPE corral_admission_refusals_total counter");
        for (code, n) in &c.refusals {
            let _ = writeln!(
                out,
                "corral_admission_refusals_total{{reason=\"{code}\"}} {n}"
            );
        }
        let _ = writeln!(out, "# TYPE corral_events_total counter");
        for ((event, reason), n) in &c.events {
            let _ = writeln!(
                out,
                "corral_events_total{{event=\"{event}\",reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(out, "# TYPE corral_unperformed_total counter");
        for (what, n) in &c.unperformed {
            let _ = writeln!(out, "corral_unperformed_total{{what=\"{what}\"}} {n}");
        }
        let _ = writeln!(out, "# TYPE corral_egress_dispatch_total counter");
        for (mode, n) in &c.grants {
            let _ = writeln!(
                out,
                "corral_egress_dispatch_total{{effective_mode=\"{mode}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# TYPE corral_otlp_spans_dropped_total counter\ncorral_otlp_spans_dropped_total {}",
            OTLP_SPANS_DROPPED.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# TYPE corral_acquire_seconds histogram");
        for (bound, n) in ACQUIRE_BUCKETS.iter().zip(c.acquire_buckets) {
            let _ = writeln!(out, "corral_acquire_seconds_bucket{{le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "corral_acquire_seconds_bucket{{le=\"+Inf\"}} {}\ncorral_acquire_seconds_sum {}\ncorral_acquire_seconds_count {}",
            c.acquire_count, c.acquire_sum, c.acquire_count
        );
        render_writes(&mut out, writes);
        if let Some((counts, queued)) = pool {
            render_pool(&mut out, &counts, queued);
        }
        out
    }
}

/// The coordination store's writes, written and refused, and its reads.
fn render_writes(out: &mut String, writes: &WriteCounts) {
    let attempted = writes.attempted.load(Ordering::Relaxed);
    let conflicted = writes.conflicted.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "# TYPE corral_coordination_writes_total counter\n\
         corral_coordination_writes_total{{result=\"written\"}} {}\n\
         corral_coordination_writes_total{{result=\"refused\"}} {conflicted}\n\
         # TYPE corral_coordination_reads_total counter\n\
         corral_coordination_reads_total {}",
        attempted.saturating_sub(conflicted),
        writes.reads.load(Ordering::Relaxed)
    );
}

/// The pool's workers by state (and of the warm, those whose last run used the data stack), and
/// its queue depth.
fn render_pool(out: &mut String, counts: &StateCounts, queued: usize) {
    let _ = writeln!(out, "# TYPE corral_pool_workers gauge");
    for (state, n) in [
        ("creating", counts.creating),
        ("warm", counts.warm),
        ("leased", counts.leased),
        ("resetting", counts.resetting),
        ("retiring", counts.retiring),
        ("quarantined", counts.quarantined),
    ] {
        let _ = writeln!(out, "corral_pool_workers{{state=\"{state}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# TYPE corral_pool_warm_stack_workers gauge\ncorral_pool_warm_stack_workers {}",
        counts.warm_stack
    );
    let _ = writeln!(
        out,
        "# TYPE corral_pool_queue_depth gauge\ncorral_pool_queue_depth {queued}"
    );
}
