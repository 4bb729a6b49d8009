//! The contract of the store that holds a pool's document (Valkey in production, a faulty model in
//! the simulator), and the one compare-and-set loop that applies a command through it.
//!
//! The store holds no logic of its own: it loads the versioned document and writes a new one only
//! if the version is unchanged. Every rule runs in [`PoolDoc::apply`](crate::pool::PoolDoc::apply).

use crate::pool::{Applied, Command, Mutation, PoolConfig, PoolDoc};
use crate::time::UnixMillis;

/// A document's version in the store; bumped by every successful compare-and-set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u64);

/// The store could not be reached or did not answer in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unavailable;

/// What a load found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loaded {
    /// The document and its version.
    Found {
        /// Its version.
        version: Version,
        /// The document.
        doc: PoolDoc,
    },
    /// No document: a new deployment, or the store lost its data.
    Absent,
    /// A document written before the store last restarted (or failed over). What it says may
    /// have been rolled back: a snapshot older than the last write, a replica that had not
    /// received it. Nothing of it is trusted: a write replaces it with a new epoch, exactly as
    /// if the store had come back empty, and a reader treats it as absent.
    Outlived {
        /// Its version.
        version: Version,
        /// The document, for the record only (and for the simulator's mutation that trusts it).
        doc: PoolDoc,
    },
}

/// The stored document a write must find: its version, of its epoch, and whether it was written
/// before the store last restarted. A write that expects a current document never lands on an
/// outlived one, even when its version and epoch match (a replica that remembers version V of a
/// document restored from a snapshot that also holds V still knows nothing of what came after).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    /// Its version.
    pub version: Version,
    /// Its epoch.
    pub epoch: u64,
    /// Whether it was written before the store last restarted.
    pub outlived: bool,
}

impl Expected {
    /// The current (not outlived) document of `doc`'s epoch at `version`.
    #[must_use]
    pub fn current(version: Version, doc: &PoolDoc) -> Self {
        Self {
            version,
            epoch: doc.epoch(),
            outlived: false,
        }
    }
}

/// The outcome of a compare-and-set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CasOutcome {
    /// Written; the document now has `version`.
    Ok {
        /// The new version.
        version: Version,
    },
    /// Someone else wrote first; nothing was written.
    Conflict,
    /// The store was not reached; nothing was written.
    Unavailable,
    /// The write may or may not have happened (a lost reply).
    Unknown,
}

/// A store of pool documents. `expected: None` means "create only if absent".
pub trait PoolStore {
    /// The deployment's clock, read from the store (Valkey's `TIME`).
    fn now(&mut self) -> Result<UnixMillis, Unavailable>;
    /// Loads the document.
    fn load(&mut self) -> Result<Loaded, Unavailable>;
    /// Writes `doc` if the stored document is exactly the `expected` one.
    fn write_if(&mut self, expected: Option<Expected>, doc: &PoolDoc) -> CasOutcome;
    /// Writes `doc` if the stored document is still the current version `expected` of `doc`'s
    /// epoch.
    fn compare_and_set(&mut self, expected: Option<Version>, doc: &PoolDoc) -> CasOutcome {
        self.write_if(expected.map(|v| Expected::current(v, doc)), doc)
    }
}

/// How a command fared through the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transacted {
    /// Written: perform the effects and deliver the events.
    Committed {
        /// What the transition produced.
        applied: Applied,
        /// The document as written.
        doc: PoolDoc,
        /// The deployment time it was applied at.
        now: UnixMillis,
    },
    /// The store is unavailable: admission fails closed (POOL-11). Nothing was written.
    Unavailable,
    /// The write's outcome is unknown. Apply the same command again later (every command is
    /// idempotent); never assume either outcome.
    Unknown,
    /// Every attempt met a conflict. Nothing was written.
    Contended,
}

/// One attempt of a transaction: the document as it would be written, and what to do next.
/// Both the synchronous loop below and the async shells drive a transaction with it, so the rule
/// for each outcome is written once.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// The document the write must find (`None`: the document must still be absent).
    pub expected: Option<Expected>,
    /// The document to write.
    pub doc: PoolDoc,
    /// What the transition produced.
    pub applied: Applied,
    /// The deployment time it was applied at.
    pub now: UnixMillis,
}

impl Attempt {
    /// Applies `command` to what a load found, at deployment time `now`. When the store holds no
    /// document, or only one written before it last restarted, a new one with epoch `new_epoch`
    /// is started (the caller draws it at random): after data loss, or a restore that may have
    /// rolled the document back, nothing of the old one is trusted.
    #[must_use]
    pub fn prepare(
        loaded: Loaded,
        now: UnixMillis,
        command: &Command,
        config: &PoolConfig,
        new_epoch: u64,
    ) -> Self {
        let Batch {
            expected,
            doc,
            mut applied,
            now,
        } = Batch::prepare(
            loaded,
            now,
            std::slice::from_ref(command),
            config,
            new_epoch,
        );
        Self {
            expected,
            doc,
            applied: applied.pop().unwrap_or_default(),
            now,
        }
    }

    /// What the compare-and-set's outcome means: done (`Some`) or try again (`None`, a conflict).
    #[must_use]
    pub fn settle(self, outcome: CasOutcome) -> Option<Transacted> {
        Some(match Settled::of(outcome)? {
            Settled::Committed => Transacted::Committed {
                applied: self.applied,
                doc: self.doc,
                now: self.now,
            },
            Settled::Unavailable => Transacted::Unavailable,
            Settled::Unknown => Transacted::Unknown,
        })
    }
}

/// Several commands applied in order to one document and written by one compare-and-set (group
/// commit, when one replica has several pending at once). Each command sees the document as the
/// ones before it left it, at the same deployment time: exactly what separate transactions
/// committed one after another within one millisecond produce, so a batch adds no behaviour the
/// rules do not already face.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The document the write must find (`None`: the document must still be absent).
    pub expected: Option<Expected>,
    /// The document to write.
    pub doc: PoolDoc,
    /// What each command produced, in order.
    pub applied: Vec<Applied>,
    /// The deployment time they were applied at.
    pub now: UnixMillis,
}

impl Batch {
    /// Applies `commands` in order to what a load found; see [`Attempt::prepare`].
    #[must_use]
    pub fn prepare(
        loaded: Loaded,
        now: UnixMillis,
        commands: &[Command],
        config: &PoolConfig,
        new_epoch: u64,
    ) -> Self {
        let (expected, mut doc) = match loaded {
            Loaded::Found { version, doc } => (Some(Expected::current(version, &doc)), doc),
            Loaded::Absent => (None, PoolDoc::new(new_epoch, now)),
            Loaded::Outlived { version, doc } => {
                let expected = Some(Expected {
                    version,
                    epoch: doc.epoch(),
                    outlived: true,
                });
                if config.broken(Mutation::TrustRestored) {
                    (expected, doc)
                } else {
                    (expected, PoolDoc::new(new_epoch, now))
                }
            }
        };
        let applied = commands
            .iter()
            .map(|command| doc.apply(command.clone(), now, config))
            .collect();
        Self {
            expected,
            doc,
            applied,
            now,
        }
    }
}

/// What a compare-and-set's outcome means for a transaction, when it ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Written: perform the effects and deliver the events.
    Committed,
    /// Nothing was written and the store is unavailable: fail closed (POOL-11).
    Unavailable,
    /// The write may or may not have happened: apply the same commands again later.
    Unknown,
}

impl Settled {
    /// `None` for a conflict: nothing was written, try again from the current document.
    #[must_use]
    pub fn of(outcome: CasOutcome) -> Option<Self> {
        match outcome {
            CasOutcome::Ok { .. } => Some(Self::Committed),
            CasOutcome::Conflict => None,
            CasOutcome::Unavailable => Some(Self::Unavailable),
            CasOutcome::Unknown => Some(Self::Unknown),
        }
    }
}

/// Applies `command` through `store` with compare-and-set, retrying conflicts up to `attempts`
/// times. See [`Attempt::prepare`] for `new_epoch`.
pub fn transact<S: PoolStore>(
    store: &mut S,
    command: &Command,
    config: &PoolConfig,
    new_epoch: u64,
    attempts: u32,
) -> Transacted {
    for _ in 0..attempts {
        let Ok(now) = store.now() else {
            return Transacted::Unavailable;
        };
        let Ok(loaded) = store.load() else {
            return Transacted::Unavailable;
        };
        let attempt = Attempt::prepare(loaded, now, command, config, new_epoch);
        let outcome = store.write_if(attempt.expected, &attempt.doc);
        if let Some(done) = attempt.settle(outcome) {
            return done;
        }
    }
    Transacted::Contended
}

/// The store as a model: one versioned document in memory, with the failures a real store shows
/// that matter to the rules (unreachable; restarted with its data lost; restarted from an older
/// snapshot). The simulator adds its faults around it, and the store contract tests hold it and
/// the Valkey store to the same behaviour.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    /// The document, its version, and the run of the store that wrote it.
    doc: Option<(Version, PoolDoc, u64)>,
    last_version: u64,
    /// This run of the store: every restart begins a new one.
    run: u64,
    /// Deployment time the model answers with.
    pub now: UnixMillis,
    /// While true every request is refused as unavailable.
    pub down: bool,
}

impl MemoryStore {
    /// Restarts the store empty, as a Valkey without persistence does.
    pub fn lose_data(&mut self) -> Option<PoolDoc> {
        self.run += 1;
        self.last_version = 0;
        self.doc.take().map(|(_, doc, _)| doc)
    }

    /// What a snapshot taken now holds.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.doc.clone())
    }

    /// Restarts the store from `snapshot`, as a Valkey does from its last RDB file: whatever was
    /// written since is gone, and what the snapshot holds was written by an earlier run.
    pub fn restart_from(&mut self, snapshot: Snapshot) {
        self.run += 1;
        self.last_version = snapshot.0.as_ref().map_or(0, |(v, _, _)| v.0);
        self.doc = snapshot.0;
    }

    /// The pool's current document, if any (for ground-truth checks): none when the store holds
    /// nothing, or only a document that outlived a restart (nobody acts on it; the next write
    /// replaces it).
    #[must_use]
    pub fn peek(&self) -> Option<&PoolDoc> {
        self.doc
            .as_ref()
            .filter(|(_, _, run)| *run == self.run)
            .map(|(_, doc, _)| doc)
    }

    /// The epoch of the stored document, current or outlived.
    #[must_use]
    pub fn stored_epoch(&self) -> Option<u64> {
        self.doc.as_ref().map(|(_, doc, _)| doc.epoch())
    }
}

/// What a [`MemoryStore`] held when a snapshot was taken.
#[derive(Clone, Debug, Default)]
pub struct Snapshot(Option<(Version, PoolDoc, u64)>);

impl Snapshot {
    /// The epoch of the document it holds, if any.
    #[must_use]
    pub fn epoch(&self) -> Option<u64> {
        self.0.as_ref().map(|(_, doc, _)| doc.epoch())
    }
}

impl PoolStore for MemoryStore {
    fn now(&mut self) -> Result<UnixMillis, Unavailable> {
        if self.down {
            Err(Unavailable)
        } else {
            Ok(self.now)
        }
    }

    fn load(&mut self) -> Result<Loaded, Unavailable> {
        if self.down {
            return Err(Unavailable);
        }
        Ok(match &self.doc {
            Some((version, doc, run)) if *run == self.run => Loaded::Found {
                version: *version,
                doc: doc.clone(),
            },
            Some((version, doc, _)) => Loaded::Outlived {
                version: *version,
                doc: doc.clone(),
            },
            None => Loaded::Absent,
        })
    }

    fn write_if(&mut self, expected: Option<Expected>, doc: &PoolDoc) -> CasOutcome {
        if self.down {
            return CasOutcome::Unavailable;
        }
        // The stored document must be exactly the expected one: versions start again after data
        // loss, so a version alone could name a later epoch's document; and one written before a
        // restart is only ever replaced by a write that knows it is.
        let current = self.doc.as_ref().map(|(version, stored, run)| Expected {
            version: *version,
            epoch: stored.epoch(),
            outlived: *run != self.run,
        });
        if current != expected {
            return CasOutcome::Conflict;
        }
        self.last_version = expected.map_or(1, |e| e.version.0 + 1);
        let version = Version(self.last_version);
        self.doc = Some((version, doc.clone(), self.run));
        CasOutcome::Ok { version }
    }
}
