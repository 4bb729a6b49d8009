//! The store model, and the one path by which every actor commits a command through it.
//!
//! The model is corral-core's `MemoryStore` (the same model the store contract tests hold the Valkey
//! store to), wrapped with the simulator's faults: outages, lost replies, unknown outcomes and
//! conflicts. Its clock is the deployment clock (true simulated time). The commit path is the store
//! shell's: compare-and-set attempts through `Attempt::prepare`/`settle`, the command sent again
//! after an unknown outcome or a conflict (every command is idempotent), `None` when the store is
//! unreachable or the attempts run out. It records every write that landed, with what the
//! transition did, even when the reply was lost: that is the ground truth the checks judge.

use std::collections::BTreeSet;

use corral_core::pool::{Applied, Command, PoolDoc};
use corral_core::store::{
    Attempt, CasOutcome, Expected, Loaded, MemoryStore, PoolStore, Snapshot, Unavailable,
};
use corral_core::time::UnixMillis;

use super::{Actor, World};
use crate::faults::{Fault, FaultMix, Invariant};
use crate::rng::Rng;

/// How many compare-and-set attempts one commit makes before it answers `None`.
const COMMIT_ATTEMPTS: u32 = 4;

/// How often the store saves a snapshot while it is written to (Valkey's `save 1 1`).
const SNAPSHOT_EVERY_MS: u64 = 1_000;

/// The faulty store.
pub(super) struct SimStore {
    model: MemoryStore,
    now_ms: u64,
    pub(super) unavailable_until_ms: u64,
    rng: Rng,
    pub(super) mix: FaultMix,
    injected: Vec<Fault>,
    /// Whether the last compare-and-set wrote, whatever its reply said.
    landed: bool,
    /// The last snapshot saved, and when.
    saved: (Snapshot, u64),
}

impl SimStore {
    pub(super) fn new(rng: Rng, mix: FaultMix) -> Self {
        Self {
            model: MemoryStore::default(),
            now_ms: 0,
            unavailable_until_ms: 0,
            rng,
            mix,
            injected: Vec::new(),
            landed: false,
            saved: (Snapshot::default(), 0),
        }
    }

    pub(super) fn set_now(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
    }

    fn sync(&mut self) {
        self.model.now = UnixMillis(self.now_ms);
        self.model.down = self.now_ms < self.unavailable_until_ms;
    }

    /// The stored document, for ground-truth checks (not a request: no fault applies).
    pub(super) fn peek(&self) -> Option<&PoolDoc> {
        self.model.peek()
    }

    /// The epoch of the stored document, current or outlived.
    pub(super) fn stored_epoch(&self) -> Option<u64> {
        self.model.stored_epoch()
    }

    /// Restarts the store empty; returns the document it lost.
    pub(super) fn lose_data(&mut self) -> Option<PoolDoc> {
        self.model.lose_data()
    }

    /// Saves a snapshot when the last one is old enough (at most every [`SNAPSHOT_EVERY_MS`]).
    pub(super) fn maybe_save(&mut self) {
        if self.now_ms >= self.saved.1 + SNAPSHOT_EVERY_MS {
            self.saved = (self.model.snapshot(), self.now_ms);
        }
    }

    /// Restarts the store from its last snapshot: every write since is lost. Returns the epoch
    /// of the document restored, if any.
    pub(super) fn restart_from_snapshot(&mut self) -> Option<u64> {
        let restored = self.saved.0.epoch();
        self.model.restart_from(self.saved.0.clone());
        restored
    }

    pub(super) fn take_injected(&mut self) -> Vec<Fault> {
        std::mem::take(&mut self.injected)
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

    fn write_if(&mut self, expected: Option<Expected>, doc: &PoolDoc) -> CasOutcome {
        self.sync();
        self.landed = false;
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
        let outcome = self.model.write_if(expected, doc);
        self.landed = matches!(outcome, CasOutcome::Ok { .. });
        if self.landed && self.rng.chance(self.mix.rate(Fault::StoreLostReply)) {
            self.injected.push(Fault::StoreLostReply);
            return CasOutcome::Unknown;
        }
        outcome
    }
}

impl World {
    /// Commits `command` as `actor`, the way the store shell does: `Some` with what the
    /// transition did, or `None` when the store gave no answer. Every write that lands is recorded
    /// and judged, whether or not its reply reaches the actor.
    pub(super) fn commit(&mut self, actor: Actor, command: &Command) -> Option<Applied> {
        for _ in 0..COMMIT_ATTEMPTS {
            let now = self.store.now().ok()?;
            let loaded = self.store.load().ok()?;
            let before = match &loaded {
                Loaded::Found { doc, .. } | Loaded::Outlived { doc, .. } => Some(doc.clone()),
                Loaded::Absent => None,
            };
            let new_epoch = self.rng.next_u64() >> 12;
            let config = self.config.clone();
            let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Attempt::prepare(loaded, now, command, &config, new_epoch)
            }));
            // The document asserts its own invariants inside every transition (unless a rule is
            // broken on purpose); a panic there is a violation of this seed, not a crash.
            self.stats.checked(Invariant::DocumentSound);
            let attempt = match prepared {
                Ok(attempt) => attempt,
                Err(panic) => {
                    let detail = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .unwrap_or_else(|| String::from("panic"));
                    self.check(Invariant::DocumentSound, false, || detail);
                    return None;
                }
            };
            let outcome = self.store.write_if(attempt.expected, &attempt.doc);
            // A document that outlived a restart is replaced by a new epoch (unless a rule is
            // broken on purpose): the transition is from nothing, and the old epoch is lost.
            let before = before.filter(|b| b.epoch() == attempt.doc.epoch());
            if self.store.landed {
                if let Some(expected) = attempt.expected {
                    let epoch = attempt.doc.epoch();
                    if expected.outlived {
                        self.check(Invariant::RestoredDistrusted, epoch != expected.epoch, || {
                            format!(
                                "version {} of epoch {epoch:x} outlived a store restart and was written as current",
                                expected.version.0
                            )
                        });
                    }
                    if epoch != expected.epoch {
                        self.truth
                            .lost_epochs
                            .entry(expected.epoch)
                            .or_insert(self.now);
                    }
                }
                self.stats.transitions += 1;
                if before.is_none() {
                    let epoch = attempt.doc.epoch();
                    self.note(|| format!("          new pool document, epoch {epoch:x}"));
                }
                let line = format!(
                    "          {actor:?} {command:?} => {:?} {:?}",
                    attempt.applied.events, attempt.applied.effects
                );
                self.note(|| line);
                self.after_write(
                    actor,
                    command,
                    before.as_ref(),
                    &attempt.applied,
                    &attempt.doc,
                    now,
                );
            }
            let doc = attempt.doc.clone();
            match attempt.settle(outcome) {
                Some(corral_core::store::Transacted::Committed { applied, .. }) => {
                    if let Actor::Client(client) | Actor::Holder(client) = actor
                        && let Some(replica) = self.clients.get(&client).map(|c| c.replica)
                    {
                        self.replicas[replica].cache = Some(doc);
                    }
                    return Some(applied);
                }
                Some(corral_core::store::Transacted::Unavailable) => return None,
                // Unknown or a conflict: send it again (idempotent).
                Some(
                    corral_core::store::Transacted::Unknown
                    | corral_core::store::Transacted::Contended,
                )
                | None => {}
            }
        }
        None
    }

    /// Reads the document as a client's shell does (a ticket's status).
    pub(super) fn load(&mut self) -> Result<Loaded, Unavailable> {
        self.store.load()
    }

    /// Every worker the backend has, for a listing.
    pub(super) fn present(&self) -> BTreeSet<corral_core::ids::WorkerId> {
        self.workers.keys().copied().collect()
    }
}
