//! Group commit: the commands that callers of one store commit while a write is in flight wait,
//! and go together in the next compare-and-set, applied in the order they arrived ([`Batch`]).
//!
//! Many callers in one replica (an API serving dozens of runs, each acquiring, heartbeating and
//! releasing) otherwise contend with each other for the one document as hard as with other
//! replicas, and every conflict costs a round trip. One writer per replica, taking whatever is
//! pending, turns that contention into batching.
//!
//! The writer is a task of its own, started when a command arrives and none is running, and
//! ending when nothing is pending, so a caller that stops waiting never strands the others.
//!
//! [`Batch`]: corral_core::store::Batch

use std::collections::VecDeque;
use std::time::Duration;

use corral_core::pool::{Applied, Command, PoolConfig};
use corral_core::store::Settled;
use tokio::sync::oneshot;

use crate::ValkeyStore;

/// The most commands one compare-and-set carries.
const MAX_BATCH: usize = 64;
/// Conflicts one write retries before the batch waits and goes again.
const ATTEMPTS: u32 = 8;
/// The longest wait after a write ended contended or unknown: the wait is random, up to 1 ms
/// doubled for each such write in a row, so that writers who keep meeting each other stop
/// meeting in step (without it one writer among many can lose every race).
const BACKOFF_MAX: Duration = Duration::from_millis(8);

/// The commands waiting for the writer.
#[derive(Default)]
pub(crate) struct Queue {
    pending: VecDeque<Pending>,
    writing: bool,
}

struct Pending {
    command: Command,
    config: PoolConfig,
    /// Writes this command may still go in before its caller is told the store is unavailable.
    tries_left: u32,
    reply: oneshot::Sender<Option<Applied>>,
}

/// See [`ValkeyStore::commit`].
pub(crate) async fn commit(
    store: &ValkeyStore,
    command: &Command,
    config: &PoolConfig,
    retries: u32,
) -> Option<Applied> {
    if retries == 0 {
        return None;
    }
    let (reply, answer) = oneshot::channel();
    let start_writer = {
        let mut queue = lock(store);
        queue.pending.push_back(Pending {
            command: command.clone(),
            config: config.clone(),
            tries_left: retries,
            reply,
        });
        !std::mem::replace(&mut queue.writing, true)
    };
    if start_writer {
        tokio::spawn(write(store.clone()));
    }
    answer.await.ok().flatten()
}

fn lock(store: &ValkeyStore) -> std::sync::MutexGuard<'_, Queue> {
    store
        .group
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Marks the writer gone however its task ends, so the next command starts another; commands of
/// a batch in flight when it ended are answered `None` by their dropped senders.
struct Writing {
    store: ValkeyStore,
    ended: bool,
}

impl Drop for Writing {
    fn drop(&mut self) {
        if !self.ended {
            lock(&self.store).writing = false;
        }
    }
}

/// The writer: takes what is pending (in order, with one pool configuration), writes it, answers,
/// and goes again until nothing is pending.
async fn write(store: ValkeyStore) {
    let mut writing = Writing {
        store: store.clone(),
        ended: false,
    };
    let store = &store;
    let mut contended_in_a_row = 0u32;
    let mut jitter = Jitter::new(store.link().entropy());
    loop {
        let batch: Vec<Pending> = {
            let mut queue = lock(store);
            let Some(first) = queue.pending.front() else {
                queue.writing = false;
                writing.ended = true;
                return;
            };
            let config = first.config.clone();
            let size = queue
                .pending
                .iter()
                .take(MAX_BATCH)
                .take_while(|p| p.config == config)
                .count();
            queue.pending.drain(..size).collect()
        };
        let commands: Vec<Command> = batch.iter().map(|p| p.command.clone()).collect();
        let written = store
            .transact_all(
                &commands,
                &batch[0].config,
                store.link().entropy(),
                ATTEMPTS,
            )
            .await;
        if written.is_ok() {
            contended_in_a_row = 0;
        }
        match written {
            Ok(done) => {
                for (pending, applied) in batch.into_iter().zip(done.applied) {
                    let _ = pending.reply.send(Some(applied));
                }
            }
            Err(Some(Settled::Unavailable)) => {
                for pending in batch {
                    let _ = pending.reply.send(None);
                }
            }
            // Unknown or contended: every command is idempotent, so each goes again (first, in
            // its order) until its tries run out.
            Err(_) => {
                let mut again = Vec::new();
                for mut pending in batch {
                    pending.tries_left -= 1;
                    if pending.tries_left == 0 {
                        let _ = pending.reply.send(None);
                    } else {
                        again.push(pending);
                    }
                }
                if !again.is_empty() {
                    contended_in_a_row = contended_in_a_row.saturating_add(1);
                    tokio::time::sleep(jitter.backoff(contended_in_a_row)).await;
                    let mut queue = lock(store);
                    for pending in again.into_iter().rev() {
                        queue.pending.push_front(pending);
                    }
                }
            }
        }
    }
}

/// A small random source for backoff (xorshift), seeded per writer.
struct Jitter(u64);

impl Jitter {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// A random wait up to 1 ms × 2^(`in_a_row` − 1), at most [`BACKOFF_MAX`].
    fn backoff(&mut self, in_a_row: u32) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let ceiling = Duration::from_millis(1)
            .saturating_mul(1 << in_a_row.saturating_sub(1).min(3))
            .min(BACKOFF_MAX);
        let micros = u64::try_from(ceiling.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        Duration::from_micros(self.0 % micros + 1)
    }
}
