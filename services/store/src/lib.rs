//! The Valkey store of Corral's pool documents (POOL-5, POOL-6, POOL-11).
//!
//! Valkey is the sole allocation authority. It holds each pool's document, version and epoch in
//! one hash and changes them only by compare-and-set: a script that compares the version and epoch
//! (and the time the command was applied at with its own clock) and writes, with no rule of its
//! own. Every rule runs in `corral_core::pool::PoolDoc::apply`, in the replica, inside
//! [`ValkeyStore::transact`]. Deployment time is Valkey's `TIME`, not a replica's clock.
//!
//! A transaction is one round trip when nothing else wrote: the replica applies the command to the
//! document it last saw, at its estimate of Valkey's clock, and the compare-and-set proves both;
//! a refusal carries the current document and time, so a retry is one round trip too. Commands
//! that callers of one replica commit at once share a write ([`group`]). Decision 0011.
//!
//! Failure is never guessed. A read that fails is `Unavailable` (admission fails closed). A write
//! that fails after it may have reached the server is `Unknown`: the caller applies the same
//! command again later, which every pool command tolerates.
//!
//! This crate must never hold a pool of its own: when Valkey cannot be reached, it says so. What
//! a replica remembers of the document is only ever a starting point the next write must prove.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use corral_core::ids::TicketId;
use corral_core::pool::{Command, PoolConfig, PoolDoc};
use corral_core::store::{
    Batch, CasOutcome, Expected, Loaded, Settled, Transacted, Unavailable, Version,
};
use corral_core::time::UnixMillis;
use fred::prelude::{Builder, ClientLike, Config, ReconnectPolicy};
// The store's clock for what it last saw is tokio's: the real clock in production, the world's
// under simulation.
use tokio::time::Instant;

pub use link::{FredLink, Heard, Link, Reply, Subscription};

pub mod browser;
pub mod events;
pub mod group;
pub mod harness;
pub mod lease;
pub mod link;
pub mod policy;
pub mod valkey_server;

/// What both scripts start with, defined once: `now`, Valkey's `TIME` in milliseconds, and `run`,
/// this server's `run_id` (new at every start), which a document records as the run that wrote it.
macro_rules! script_prelude {
    () => {
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
"
    };
}

/// Compare-and-set, and nothing else. Writes the document if the stored one is the expected one,
/// bumps the version, and announces it for waiters. "The expected one" is its version (`ARGV[1]`,
/// `''` expects no document), its epoch (`ARGV[7]`) and whether it was written by an earlier run
/// of this server (`ARGV[8]`, `'1'`): versions start again at 1 after a restart that lost the
/// data, so a version alone could match a different document of a later epoch; and a document
/// restored from a snapshot or kept through a failover may have lost writes made after it, so
/// only a write that knows it is replacing such a document may land on it.
///
/// A server's run is its `run_id`, new at every start: the script records the one that wrote the
/// document beside it (`run`), and a document whose `run` is not the server's own is *outlived*.
///
/// When the caller names the deployment time it applied the command at (`ARGV[5]`), the write
/// also requires that time to be Valkey's `TIME` or at most `ARGV[6]` ms behind it, so a replica
/// that reuses its estimate of the clock can never apply a command in the future or far in the
/// past. Every reply carries Valkey's time; a refusal because the document moved on carries the
/// current document, so the caller's next attempt needs no read of its own.
///
/// Replies: `{1, now}` written; `{2, now}` the time was refused (the document is the caller's);
/// `{3, now}` there is no document; `{0, now, version, doc, outlived}` another document is
/// current.
const CAS_SCRIPT: &str = concat!(
    script_prelude!(),
    r"
local stored = redis.call('HMGET', KEYS[1], 'version', 'epoch', 'run')
local version, epoch = stored[1], stored[2]
local outlived = (stored[3] ~= run)
local expected
if ARGV[1] == '' then
  expected = (version == false)
else
  expected = (version == ARGV[1] and epoch == ARGV[7] and outlived == (ARGV[8] == '1'))
end
if expected then
  if ARGV[5] ~= '' then
    local claimed = tonumber(ARGV[5])
    if claimed > now or now - claimed > tonumber(ARGV[6]) then
      return {2, now}
    end
  end
  redis.call('HSET', KEYS[1], 'version', ARGV[2], 'epoch', ARGV[4], 'doc', ARGV[3], 'run', run)
  redis.call('PUBLISH', KEYS[2], ARGV[9])
  return {1, now}
end
if version == false then
  return {3, now}
end
return {0, now, version, redis.call('HGET', KEYS[1], 'doc'), outlived and 1 or 0}
"
);

/// A read of the clock and the document in one round trip, with whether the document was written
/// by an earlier run of this server (see [`CAS_SCRIPT`]). Replies `{now}` when there is no
/// document, `{now, version, doc, outlived}` otherwise.
const READ_SCRIPT: &str = concat!(
    script_prelude!(),
    r"
local stored = redis.call('HMGET', KEYS[1], 'version', 'doc', 'run')
if stored[1] == false and stored[2] == false then
  return {now}
end
return {now, stored[1], stored[2], (stored[3] == run) and 0 or 1}
"
);

/// How far behind Valkey's clock a replica's estimate of it may be when it applies a command.
/// Deadlines in the pool are seconds long; an estimate is normally a round trip behind.
pub const CLOCK_TOLERANCE_MS: u64 = 50;

/// How long one Valkey command may take before the store gives up on it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// A fresh epoch for a pool document this process may have to start (after data loss nothing of
/// the old one is trusted, so the new one's worker ids must differ): wall-clock nanoseconds mixed
/// with the process id and a counter.
pub fn fresh_epoch() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = nanos
        ^ (u64::from(std::process::id()) << 40)
        ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(20);
    // Worker ids print the epoch in hex; keep it short enough to read.
    mixed & 0x0000_ffff_ffff_ffff
}

/// A connection to the Valkey that holds one pool's document. Clones share the connection, what
/// the replica last saw, and one queue of pending commands (see [`group`]).
#[derive(Clone)]
pub struct ValkeyStore {
    link: Arc<dyn Link>,
    key: String,
    channel: String,
    seen: Arc<Mutex<Seen>>,
    writes: Arc<WriteCounts>,
    group: Arc<Mutex<group::Queue>>,
}

/// How this replica's compare-and-sets fared, for benchmarks and metrics.
#[derive(Debug, Default)]
pub struct WriteCounts {
    /// Compare-and-sets sent.
    pub attempted: std::sync::atomic::AtomicU64,
    /// Of those, refused because the document had moved on (or the time was refused).
    pub conflicted: std::sync::atomic::AtomicU64,
    /// Transactions that started from a read rather than from what this replica last saw.
    pub reads: std::sync::atomic::AtomicU64,
}

/// What this replica last saw of the store: the document (or its absence) and Valkey's clock with
/// the local instant it was read at. A transaction starts from it instead of reading again; the
/// compare-and-set proves it current (version, epoch and time), and a refusal brings the
/// current document back. It is forgotten whenever an answer is lost.
#[derive(Default)]
struct Seen {
    doc: Option<Loaded>,
    clock: Option<(UnixMillis, Instant)>,
}

impl Seen {
    /// The last document seen and the deployment time now, estimated from the last reading of
    /// Valkey's clock (never ahead of it while both clocks tick at one rate).
    fn snapshot(&self) -> Option<(UnixMillis, Loaded)> {
        let (read, at) = self.clock?;
        let elapsed = u64::try_from(at.elapsed().as_millis()).ok()?;
        Some((UnixMillis(read.0 + elapsed), self.doc.clone()?))
    }
}

/// The store could not be set up.
#[derive(Debug)]
pub struct ConnectError(pub String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "coordination store: {}", self.0)
    }
}

impl std::error::Error for ConnectError {}

impl ValkeyStore {
    /// Connects to the Valkey at `url` (`redis://host:port`) for the pool named `pool`.
    pub async fn connect(url: &str, pool: &str) -> Result<Self, ConnectError> {
        let config =
            Config::from_url(url).map_err(|e| ConnectError(format!("bad url {url:?}: {e}")))?;
        let client = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = COMMAND_TIMEOUT;
                // A command is sent once: a resend after a dropped connection could apply a
                // compare-and-set twice behind our back. Unknown outcomes are ours to handle.
                c.max_command_attempts = 1;
            })
            .with_performance_config(|p| p.default_command_timeout = COMMAND_TIMEOUT)
            .set_policy(ReconnectPolicy::new_constant(0, 200))
            .build()
            .map_err(|e| ConnectError(e.to_string()))?;
        client
            .init()
            .await
            .map_err(|e| ConnectError(format!("cannot reach {url}: {e}")))?;
        Ok(Self::over(Arc::new(FredLink::new(client)), pool))
    }

    /// The store of the pool named `pool` over `link` (a simulated world's own network, or a
    /// production connection).
    #[must_use]
    pub fn over(link: Arc<dyn Link>, pool: &str) -> Self {
        Self {
            link,
            key: format!("corral:pool:{pool}"),
            channel: format!("corral:pool:{pool}:version"),
            seen: Arc::default(),
            writes: Arc::default(),
            group: Arc::default(),
        }
    }

    /// The link this store speaks over.
    pub(crate) fn link(&self) -> &dyn Link {
        &*self.link
    }

    /// Runs `script`, whose reply is one integer.
    pub(crate) async fn script_int(
        &self,
        script: &'static str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<i64, Unavailable> {
        self.link
            .eval(script, keys, args)
            .await
            .ok()
            .and_then(|reply| reply.int())
            .ok_or(Unavailable)
    }

    /// The deployment clock: Valkey's `TIME`, in milliseconds.
    pub async fn now(&self) -> Result<UnixMillis, Unavailable> {
        let reply = self
            .link
            .command(vec!["TIME".to_owned()])
            .await
            .map_err(|_| Unavailable)?;
        let now = parse_time(&reply.texts().ok_or(Unavailable)?)?;
        self.seen().clock = Some((now, Instant::now()));
        Ok(now)
    }

    /// Loads the document and its version.
    pub async fn load(&self) -> Result<Loaded, Unavailable> {
        self.load_at().await.map(|(_, loaded)| loaded)
    }

    /// Reads the deployment clock and the document in one round trip.
    pub async fn load_at(&self) -> Result<(UnixMillis, Loaded), Unavailable> {
        let reply = self
            .link
            .eval(READ_SCRIPT, vec![self.key.clone()], Vec::new())
            .await;
        let received = Instant::now();
        let mut fields = reply.map_err(|_| Unavailable)?.list().into_iter();
        let now = UnixMillis(millis(fields.next()).ok_or(Unavailable)?);
        let loaded = decode(fields)?;
        *self.seen() = Seen {
            doc: Some(loaded.clone()),
            clock: Some((now, received)),
        };
        Ok((now, loaded))
    }

    /// How this replica's writes have fared so far.
    pub fn write_counts(&self) -> &WriteCounts {
        &self.writes
    }

    fn seen(&self) -> MutexGuard<'_, Seen> {
        // A panic elsewhere cannot leave `Seen` inconsistent in a way that matters: every use of
        // it is proven by the next compare-and-set.
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `doc` if the stored document is still the current one of version `expected` (and
    /// of `doc`'s epoch); `None`: only if there is none.
    pub async fn compare_and_set(&self, expected: Option<Version>, doc: &PoolDoc) -> CasOutcome {
        self.write_if(expected.map(|v| Expected::current(v, doc)), doc, None)
            .await
    }

    /// [`Self::compare_and_set`] for a document applied at deployment time `applied_at`: also
    /// refused (`Conflict`) unless `applied_at` is Valkey's time or at most
    /// [`CLOCK_TOLERANCE_MS`] behind it.
    ///
    /// Remembers what it learns: the clock always, the document written, or the current one a
    /// conflict returned.
    pub async fn cas_at(
        &self,
        expected: Option<Version>,
        doc: &PoolDoc,
        applied_at: Option<UnixMillis>,
    ) -> CasOutcome {
        self.write_if(expected.map(|v| Expected::current(v, doc)), doc, applied_at)
            .await
    }

    /// Writes `doc` if the stored document is exactly the `expected` one (version, epoch, and
    /// whether it outlived a restart of the server; `None`: there is none), applied at
    /// deployment time `applied_at` when it is named (see [`Self::cas_at`]).
    pub async fn write_if(
        &self,
        expected: Option<Expected>,
        doc: &PoolDoc,
        applied_at: Option<UnixMillis>,
    ) -> CasOutcome {
        if !self.link.connected() {
            *self.seen() = Seen::default();
            return CasOutcome::Unavailable;
        }
        let Ok(text) = serde_json::to_string(doc) else {
            return CasOutcome::Unavailable;
        };
        let next = expected.map_or(1, |e| e.version.0 + 1);
        let keys = vec![self.key.clone(), self.channel.clone()];
        let args = vec![
            expected
                .map(|e| e.version.0.to_string())
                .unwrap_or_default(),
            next.to_string(),
            text,
            doc.epoch().to_string(),
            applied_at.map(|t| t.0.to_string()).unwrap_or_default(),
            CLOCK_TOLERANCE_MS.to_string(),
            expected.map(|e| e.epoch.to_string()).unwrap_or_default(),
            String::from(if expected.is_some_and(|e| e.outlived) {
                "1"
            } else {
                ""
            }),
            announcement(next, doc),
        ];
        self.writes.attempted.fetch_add(1, Ordering::Relaxed);
        let reply = self.link.eval(CAS_SCRIPT, keys, args).await;
        let received = Instant::now();
        let Ok(reply) = reply else {
            // The script may have run before the reply was lost.
            *self.seen() = Seen::default();
            return CasOutcome::Unknown;
        };
        let mut fields = reply.list().into_iter();
        let (Some(status), Some(now)) =
            (fields.next().and_then(|v| v.int()), millis(fields.next()))
        else {
            *self.seen() = Seen::default();
            return CasOutcome::Unknown;
        };
        if status != 1 {
            self.writes.conflicted.fetch_add(1, Ordering::Relaxed);
        }
        let mut seen = self.seen();
        seen.clock = Some((UnixMillis(now), received));
        match status {
            1 => {
                seen.doc = Some(Loaded::Found {
                    version: Version(next),
                    doc: doc.clone(),
                });
                CasOutcome::Ok {
                    version: Version(next),
                }
            }
            // The time was refused; the document is still the one the caller started from.
            2 => CasOutcome::Conflict,
            3 => {
                seen.doc = Some(Loaded::Absent);
                CasOutcome::Conflict
            }
            _ => {
                seen.doc = decode(fields).ok();
                CasOutcome::Conflict
            }
        }
    }

    /// Applies `command` with compare-and-set, retrying conflicts up to `attempts` times; the rule
    /// for each outcome is corral-core's ([`Settled`]).
    pub async fn transact(
        &self,
        command: &Command,
        config: &PoolConfig,
        new_epoch: u64,
        attempts: u32,
    ) -> Transacted {
        match self
            .transact_all(std::slice::from_ref(command), config, new_epoch, attempts)
            .await
        {
            Ok(mut batch) => Transacted::Committed {
                applied: batch.applied.pop().unwrap_or_default(),
                doc: batch.doc,
                now: batch.now,
            },
            Err(None) => Transacted::Contended,
            Err(Some(Settled::Unavailable)) => Transacted::Unavailable,
            Err(Some(_)) => Transacted::Unknown,
        }
    }

    /// Applies `commands` in order in one compare-and-set ([`Batch`]), retrying conflicts up to
    /// `attempts` times. `Err(None)` when every attempt met a conflict.
    ///
    /// An attempt starts from the document and clock this replica last saw, when it has seen
    /// them, so that an uncontended transaction is one round trip; the compare-and-set proves
    /// both current, and a refusal returns what is.
    async fn transact_all(
        &self,
        commands: &[Command],
        config: &PoolConfig,
        new_epoch: u64,
        attempts: u32,
    ) -> Result<Batch, Option<Settled>> {
        for _ in 0..attempts {
            let remembered = self.seen().snapshot();
            let (now, loaded) = match remembered {
                Some(snapshot) => snapshot,
                None => {
                    self.writes.reads.fetch_add(1, Ordering::Relaxed);
                    self.load_at()
                        .await
                        .map_err(|Unavailable| Some(Settled::Unavailable))?
                }
            };
            if let Loaded::Outlived { version, doc } = &loaded {
                tracing::warn!(
                    key = %self.key,
                    version = version.0,
                    epoch = %format!("{:x}", doc.epoch()),
                    "the pool document was written before Valkey last restarted (a snapshot or a \
                     failover may have rolled it back): nothing of it is trusted; a new epoch \
                     begins and every worker of the old one is deleted"
                );
            }
            let batch = Batch::prepare(loaded, now, commands, config, new_epoch);
            let outcome = self.write_if(batch.expected, &batch.doc, Some(now)).await;
            match Settled::of(outcome) {
                Some(Settled::Committed) => return Ok(batch),
                Some(ended) => return Err(Some(ended)),
                None => {}
            }
        }
        Err(None)
    }

    /// Applies `command` until it commits: an unknown or contended outcome is applied again (every
    /// pool command is idempotent), at most `retries` times. `None` when the store is unavailable,
    /// which the caller treats as fail-closed.
    ///
    /// Commands that callers sharing this store (its clones) commit while a write is in flight
    /// wait and go together in the next one (group commit, [`group`]).
    pub async fn commit(
        &self,
        command: &Command,
        config: &PoolConfig,
        retries: u32,
    ) -> Option<corral_core::pool::Applied> {
        group::commit(self, command, config, retries).await
    }

    /// A subscription to version announcements, for waiters woken by notification (with polling
    /// as the fallback: a lost message only delays a waiter until its next poll).
    pub async fn subscribe(&self) -> Result<VersionWatch, Unavailable> {
        let subscription = self
            .link
            .subscribe(self.channel.clone())
            .await
            .map_err(|_| Unavailable)?;
        Ok(VersionWatch {
            subscription,
            closed: false,
        })
    }

    /// Deletes the pool's document (tests and operators only: the pool then starts a new epoch).
    pub async fn erase(&self) -> Result<(), Unavailable> {
        self.link
            .command(vec!["DEL".to_owned(), self.key.clone()])
            .await
            .map_err(|_| Unavailable)?;
        Ok(())
    }
}

/// Valkey's `TIME` reply (seconds, microseconds) in milliseconds.
fn parse_time(reply: &[String]) -> Result<UnixMillis, Unavailable> {
    let [seconds, micros] = reply else {
        return Err(Unavailable);
    };
    let seconds: u64 = seconds.parse().map_err(|_| Unavailable)?;
    let micros: u64 = micros.parse().map_err(|_| Unavailable)?;
    Ok(UnixMillis(seconds * 1_000 + micros / 1_000))
}

/// A reply field holding milliseconds.
fn millis(field: Option<Reply>) -> Option<u64> {
    field
        .and_then(|v| v.int())
        .and_then(|n| u64::try_from(n).ok())
}

/// The stored hash's fields as a reply lists them (version, document, whether it outlived a
/// restart of the server) as what a load found, or `Unavailable` when they cannot be read.
fn decode(mut fields: impl Iterator<Item = Reply>) -> Result<Loaded, Unavailable> {
    let version = fields.next().and_then(Reply::text);
    let doc = fields.next().and_then(Reply::text);
    match (version, doc) {
        (Some(version), Some(doc)) => {
            let version = Version(version.parse().map_err(|_| Unavailable)?);
            // A document this build cannot read is not guessed at: the store is unusable.
            let doc: PoolDoc = serde_json::from_str(&doc).map_err(|_| Unavailable)?;
            Ok(match fields.next().and_then(|v| v.int()) {
                Some(0) => Loaded::Found { version, doc },
                Some(_) => Loaded::Outlived { version, doc },
                None => return Err(Unavailable),
            })
        }
        (None, None) => Ok(Loaded::Absent),
        _ => Err(Unavailable),
    }
}

/// What a write announces: the new version, then every ticket still queued in it. A queued waiter
/// whose ticket is listed has nothing to read ([`VersionWatch::changed_for`]): with a hundred
/// waiters, each reading the whole document at every announcement was most of the API's and
/// Valkey's CPU in a burst that queued.
fn announcement(version: u64, doc: &PoolDoc) -> String {
    let mut text = version.to_string();
    for ticket in doc.queued_tickets() {
        text.push(' ');
        text.push_str(&ticket.0.to_string());
    }
    text
}

/// Whether `announcement` lists `ticket` as still queued (an unreadable one does not).
fn lists_queued(announcement: &str, ticket: TicketId) -> bool {
    let wanted = ticket.0.to_string();
    announcement
        .split(' ')
        .skip(1)
        .any(|listed| listed == wanted)
}

/// Announcements of new document versions.
pub struct VersionWatch {
    subscription: Subscription,
    closed: bool,
}

impl VersionWatch {
    /// Waits until a new version is announced or `timeout` passes; true when one was announced
    /// (or announcements were missed).
    pub async fn changed(&mut self, timeout: Duration) -> bool {
        let started = Instant::now();
        match tokio::time::timeout(timeout, self.subscription.next()).await {
            Ok(Heard::Message(_) | Heard::Missed) => true,
            // Gone: the caller's polling is all that is left, at its own pace.
            Ok(Heard::Closed) => {
                self.closed = true;
                tokio::time::sleep_until(started + timeout).await;
                false
            }
            Err(_) => false,
        }
    }

    /// Waits until an announcement may concern queued `ticket` (one that no longer lists it as
    /// queued, or missed announcements) or `timeout` passes; true for the former.
    pub async fn changed_for(&mut self, ticket: TicketId, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.subscription.next()).await {
                Ok(Heard::Message(text)) if lists_queued(&text, ticket) => {}
                Ok(Heard::Message(_) | Heard::Missed) => return true,
                Ok(Heard::Closed) => {
                    self.closed = true;
                    tokio::time::sleep_until(deadline).await;
                    return false;
                }
                Err(_) => return false,
            }
        }
    }

    /// Whether the subscription is gone (its waiter is left to polling).
    #[must_use]
    pub fn closed(&self) -> bool {
        self.closed
    }
}
