//! Affinity mode for persistent kernels (KER-4, decision 0016): with `SANDBOX_WORKSPACE_PERSIST`
//! off there is no object store to carry a kernel's checkpoint from cell to cell, so the
//! actor-and-conversation lease outlives the cell. This replica keeps holding it (renewed by its
//! holder as any lease is), with the workspace the last cell left retained beside it, and the
//! next cell of the same kernel runs on that one worker, in a fresh interpreter that restores the
//! checkpoint. The state lives while the lease does: a lost lease, an unreachable worker, a cell
//! that had to discard its worker, or [`corral_core::kernel::AFFINITY_IDLE_SECONDS`] without a
//! cell ends the session (the lease released, the worker reset as after any run), and the next
//! cell starts empty, saying so. A compatibility mode, not the scalable default: a second replica
//! does not see this replica's sessions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use corral_core::kernel::AFFINITY_IDLE_SECONDS;
use corral_core::pool::Disposition;

// Sessions' idleness is on tokio's clock: the real one in production, the world's under simulation.
use tokio::time::Instant;

use super::lease::Holder;
use crate::AppState;

/// A replica that holds kernels' sessions: the API's state in production, a replica of the shell
/// world under simulation.
pub trait HoldsSessions: Send + Sync + 'static {
    /// Its sessions.
    fn affinity(&self) -> &Sessions;
}

impl HoldsSessions for AppState {
    fn affinity(&self) -> &Sessions {
        &self.affinity
    }
}

/// One kernel's held lease and retained workspace, between cells.
pub struct Session {
    /// The lease, held and renewed.
    pub holder: Holder,
    /// The workspace the last cell left.
    pub archive: Option<Bytes>,
    /// Since when no cell has run.
    pub idle_since: Instant,
}

/// What taking a kernel's session found.
pub enum Taken {
    /// Its session, now this cell's (by its [`Claim`]) until it is put back or ended.
    Session(Session),
    /// None: the cell starts empty. `ended` says why an earlier session is gone, if it is.
    Absent {
        /// Why the previous session ended, when one did.
        ended: Option<&'static str>,
    },
    /// Another cell of the same kernel is running.
    Busy,
}

/// One cell's hold on its kernel's slot: only the cell that took it puts a session back or ends
/// it, so that a cell finishing late never clears another's.
pub struct Claim {
    key: String,
    id: u64,
}

enum Slot {
    Busy(u64),
    Idle(Session),
    /// A session ended without a cell to say so: the next cell is told why.
    Ended {
        reason: &'static str,
        at: Instant,
    },
}

/// The sessions this replica holds, by workspace key.
#[derive(Default)]
pub struct Sessions {
    slots: Mutex<HashMap<String, Slot>>,
    next: std::sync::atomic::AtomicU64,
    sweeping: std::sync::atomic::AtomicBool,
}

impl Sessions {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes `key`'s session for a cell, with the claim that ends its hold (none when another
    /// cell holds it). A session whose lease was lost is ended here.
    pub fn take(&self, key: &str) -> (Taken, Option<Claim>) {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let claim = Claim {
            key: key.to_owned(),
            id,
        };
        let mut slots = self.slots();
        let taken = match slots.remove(key) {
            Some(Slot::Busy(other)) => {
                slots.insert(key.to_owned(), Slot::Busy(other));
                return (Taken::Busy, None);
            }
            Some(Slot::Idle(session)) if session.holder.lost() => {
                session.holder.release(Disposition::Discard);
                Taken::Absent {
                    ended: Some(LEASE_LOST),
                }
            }
            Some(Slot::Idle(session)) => Taken::Session(session),
            Some(Slot::Ended { reason, .. }) => Taken::Absent {
                ended: Some(reason),
            },
            None => Taken::Absent { ended: None },
        };
        slots.insert(key.to_owned(), Slot::Busy(id));
        (taken, Some(claim))
    }

    /// Puts the claimed session back after its cell, idle from now.
    pub fn put<P: HoldsSessions>(&self, state: &Arc<P>, claim: &Claim, mut session: Session) {
        session.idle_since = Instant::now();
        let mut slots = self.slots();
        if matches!(slots.get(&claim.key), Some(Slot::Busy(id)) if *id == claim.id) {
            slots.insert(claim.key.clone(), Slot::Idle(session));
        } else {
            // Not this cell's slot any more: the session cannot be kept.
            session.holder.release(Disposition::Reset);
        }
        drop(slots);
        if !self
            .sweeping
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            tokio::spawn(sweep(Arc::downgrade(state)));
        }
    }

    /// Ends the claimed hold without a session: the next cell starts empty, told `reason` when
    /// there is one.
    pub fn end(&self, claim: &Claim, reason: Option<&'static str>) {
        let mut slots = self.slots();
        if matches!(slots.get(&claim.key), Some(Slot::Busy(id)) if *id == claim.id) {
            match reason {
                Some(reason) => {
                    slots.insert(
                        claim.key.clone(),
                        Slot::Ended {
                            reason,
                            at: Instant::now(),
                        },
                    );
                }
                None => {
                    slots.remove(&claim.key);
                }
            }
        }
    }

    /// A guard that ends the claimed hold when dropped, if nothing else has (a cell that
    /// panicked): the next cell is told its session ended.
    pub fn guard(&self, claim: Claim) -> ClaimGuard<'_> {
        ClaimGuard {
            sessions: self,
            claim,
        }
    }

    /// Ends every session idle for `idle` or longer (each lease released, its worker reset, a
    /// tombstone saying why), and forgets tombstones as old.
    fn end_idle(&self, idle: Duration) {
        let mut slots = self.slots();
        let expired: Vec<String> = slots
            .iter()
            .filter(|(_, slot)| match slot {
                Slot::Idle(session) => {
                    session.idle_since.elapsed() >= idle || session.holder.lost()
                }
                Slot::Ended { at, .. } => at.elapsed() >= idle,
                Slot::Busy(_) => false,
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in expired {
            match slots.remove(&key) {
                Some(Slot::Idle(session)) => {
                    let (disposition, reason) = if session.holder.lost() {
                        (Disposition::Discard, LEASE_LOST)
                    } else {
                        (Disposition::Reset, IDLE)
                    };
                    session.holder.release(disposition);
                    slots.insert(
                        key,
                        Slot::Ended {
                            reason,
                            at: Instant::now(),
                        },
                    );
                }
                Some(other @ Slot::Busy(_)) => {
                    slots.insert(key, other);
                }
                Some(Slot::Ended { .. }) | None => {}
            }
        }
    }
}

/// See [`Sessions::guard`].
pub struct ClaimGuard<'a> {
    sessions: &'a Sessions,
    claim: Claim,
}

impl ClaimGuard<'_> {
    /// The claim it guards.
    #[must_use]
    pub fn claim(&self) -> &Claim {
        &self.claim
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        // A no-op when the cell put its session back or ended it: the slot is no longer its.
        self.sessions.end(
            &self.claim,
            Some("the kernel's last cell failed inside the API; its session ended"),
        );
    }
}

/// Why a session ended, as the next cell is told.
const LEASE_LOST: &str = "the kernel's lease was lost; its state with it";
/// See [`LEASE_LOST`].
const IDLE: &str = "the kernel was idle for AFFINITY_IDLE_SECONDS (15 minutes); its lease was released and its state with it";

/// How often idle sessions are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Ends idle sessions until the API is gone.
async fn sweep<P: HoldsSessions>(state: Weak<P>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        state
            .affinity()
            .end_idle(Duration::from_secs(AFFINITY_IDLE_SECONDS));
    }
}
