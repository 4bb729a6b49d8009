//! The Valkey store of Corral's pool documents (POOL-5, POOL-6, POOL-11).
//!
//! Valkey is the sole allocation authority. It holds each pool's document and version in one hash
//! and changes them only by compare-and-set: a script that compares the version and writes, with no
//! rule of its own. Every rule runs in `corral_core::pool::PoolDoc::apply`, in the replica, inside
//! [`ValkeyStore::transact`]. Deployment time is Valkey's `TIME`, not a replica's clock.
//!
//! Failure is never guessed. A read that fails is `Unavailable` (admission fails closed). A write
//! that fails after it may have reached the server is `Unknown`: the caller applies the same
//! command again later, which every pool command tolerates.
//!
//! This crate must never hold a pool of its own: when Valkey cannot be reached, it says so.

use std::time::Duration;

use corral_core::pool::{Command, PoolConfig, PoolDoc};
use corral_core::store::{Attempt, CasOutcome, Loaded, Transacted, Unavailable, Version};
use corral_core::time::UnixMillis;
use fred::prelude::*;
use fred::types::scripts::Script;

pub mod harness;
pub mod lease;
pub mod policy;
pub mod valkey_server;

/// Compare-and-set, and nothing else: write the document if the version is the expected one
/// (`""` expects no document), bump the version, and announce it for waiters.
const CAS_SCRIPT: &str = r"
local current = redis.call('HGET', KEYS[1], 'version')
if (current == false and ARGV[1] == '') or current == ARGV[1] then
  redis.call('HSET', KEYS[1], 'version', ARGV[2], 'doc', ARGV[3])
  redis.call('PUBLISH', KEYS[2], ARGV[2])
  return 1
end
return 0
";

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

/// A connection to the Valkey that holds one pool's document.
pub struct ValkeyStore {
    client: Client,
    key: String,
    channel: String,
    cas: Script,
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
        Ok(Self {
            client,
            key: format!("corral:pool:{pool}"),
            channel: format!("corral:pool:{pool}:version"),
            cas: Script::from_lua(CAS_SCRIPT),
        })
    }

    /// The deployment clock: Valkey's `TIME`, in milliseconds.
    pub async fn now(&self) -> Result<UnixMillis, Unavailable> {
        let reply: Vec<String> = self
            .client
            .custom(fred::cmd!("TIME"), Vec::<String>::new())
            .await
            .map_err(|_| Unavailable)?;
        parse_time(&reply)
    }

    /// Loads the document and its version.
    pub async fn load(&self) -> Result<Loaded, Unavailable> {
        let fields: (Option<String>, Option<String>) = self
            .client
            .hmget(&self.key, vec!["version", "doc"])
            .await
            .map_err(|_| Unavailable)?;
        decode(fields)
    }

    /// Reads the deployment clock and the document in one round trip (a pipeline).
    pub async fn load_at(&self) -> Result<(UnixMillis, Loaded), Unavailable> {
        let pipeline = self.client.pipeline();
        let _: () = pipeline
            .custom(fred::cmd!("TIME"), Vec::<String>::new())
            .await
            .map_err(|_| Unavailable)?;
        let _: () = pipeline
            .hmget(&self.key, vec!["version", "doc"])
            .await
            .map_err(|_| Unavailable)?;
        let mut replies = pipeline.try_all::<Value>().await.into_iter();
        let (Some(Ok(time)), Some(Ok(fields))) = (replies.next(), replies.next()) else {
            return Err(Unavailable);
        };
        let time: Vec<String> = time.convert().map_err(|_| Unavailable)?;
        let fields: (Option<String>, Option<String>) = fields.convert().map_err(|_| Unavailable)?;
        Ok((parse_time(&time)?, decode(fields)?))
    }

    /// Writes `doc` if the stored version is still `expected` (`None`: only if absent).
    pub async fn compare_and_set(&self, expected: Option<Version>, doc: &PoolDoc) -> CasOutcome {
        if !self.client.is_connected() {
            return CasOutcome::Unavailable;
        }
        let Ok(text) = serde_json::to_string(doc) else {
            return CasOutcome::Unavailable;
        };
        let next = expected.map_or(1, |v| v.0 + 1);
        let expected_text = expected.map(|v| v.0.to_string()).unwrap_or_default();
        let keys = vec![self.key.clone(), self.channel.clone()];
        let args = vec![expected_text, next.to_string(), text];
        match self
            .cas
            .evalsha_with_reload::<i64, _, _>(&self.client, keys, args)
            .await
        {
            Ok(1) => CasOutcome::Ok {
                version: Version(next),
            },
            Ok(_) => CasOutcome::Conflict,
            // The script may have run before the reply was lost.
            Err(_) => CasOutcome::Unknown,
        }
    }

    /// Applies `command` with compare-and-set, retrying conflicts up to `attempts` times; the rule
    /// for each outcome is corral-core's (`Attempt`).
    pub async fn transact(
        &self,
        command: &Command,
        config: &PoolConfig,
        new_epoch: u64,
        attempts: u32,
    ) -> Transacted {
        for _ in 0..attempts {
            let Ok((now, loaded)) = self.load_at().await else {
                return Transacted::Unavailable;
            };
            let attempt = Attempt::prepare(loaded, now, command, config, new_epoch);
            let outcome = self.compare_and_set(attempt.expected, &attempt.doc).await;
            if let Some(done) = attempt.settle(outcome) {
                return done;
            }
        }
        Transacted::Contended
    }

    /// Applies `command` until it commits: an unknown or contended outcome is applied again (every
    /// pool command is idempotent), at most `retries` times. `None` when the store is unavailable,
    /// which the caller treats as fail-closed.
    pub async fn commit(
        &self,
        command: &Command,
        config: &PoolConfig,
        retries: u32,
    ) -> Option<corral_core::pool::Applied> {
        for _ in 0..retries {
            match self.transact(command, config, fresh_epoch(), 8).await {
                Transacted::Committed { applied, .. } => return Some(applied),
                Transacted::Unavailable => return None,
                Transacted::Unknown | Transacted::Contended => {
                    tokio::time::sleep(Duration::from_millis(1)).await
                }
            }
        }
        None
    }

    /// A subscription to version announcements, for waiters woken by notification (with polling
    /// as the fallback: a lost message only delays a waiter until its next poll).
    pub async fn subscribe(&self) -> Result<VersionWatch, Unavailable> {
        let subscriber = self.client.clone_new();
        subscriber.init().await.map_err(|_| Unavailable)?;
        let messages = subscriber.message_rx();
        subscriber
            .subscribe(self.channel.clone())
            .await
            .map_err(|_| Unavailable)?;
        Ok(VersionWatch {
            _subscriber: subscriber,
            messages,
        })
    }

    /// Deletes the pool's document (tests and operators only: the pool then starts a new epoch).
    pub async fn erase(&self) -> Result<(), Unavailable> {
        let _: i64 = self.client.del(&self.key).await.map_err(|_| Unavailable)?;
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

/// The stored hash's fields as a document, or `Unavailable` when they cannot be read.
fn decode(fields: (Option<String>, Option<String>)) -> Result<Loaded, Unavailable> {
    match fields {
        (Some(version), Some(doc)) => {
            let version = Version(version.parse().map_err(|_| Unavailable)?);
            // A document this build cannot read is not guessed at: the store is unusable.
            let doc: PoolDoc = serde_json::from_str(&doc).map_err(|_| Unavailable)?;
            Ok(Loaded::Found { version, doc })
        }
        (None, None) => Ok(Loaded::Absent),
        _ => Err(Unavailable),
    }
}

/// Announcements of new document versions.
pub struct VersionWatch {
    _subscriber: Client,
    messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
}

impl VersionWatch {
    /// Waits until a new version is announced or `timeout` passes; true when one was announced.
    pub async fn changed(&mut self, timeout: Duration) -> bool {
        matches!(
            tokio::time::timeout(timeout, self.messages.recv()).await,
            Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_)))
        )
    }
}
