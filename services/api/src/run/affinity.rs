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
use std::time::{Duration, Instant};

use bytes::Bytes;
use corral_core::kernel::AFFINITY_IDLE_SECONDS;
use corral_core::pool::Disposition;

use super::lease::Holder;
use crate::AppState;

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
    /// Its session, now this cell's until it is put back or ended.
    Session(Session),
    /// None: the cell starts empty. `ended` says why an earlier session is gone, if it is.
    Absent {
        /// Why the previous session ended, when one did.
        ended: Option<&'static str>,
    },
    /// Another cell of the same kernel is running.
    Busy,
}

enum Slot {
    Busy,
    Idle(Session),
}

/// The sessions this replica holds, by workspace key.
#[derive(Default)]
pub struct Sessions {
    slots: Mutex<HashMap<String, Slot>>,
    sweeping: std::sync::atomic::AtomicBool,
}

impl Sessions {
    /// Takes `key`'s session for a cell. A session whose lease was lost is ended here.
    pub fn take(&self, key: &str) -> Taken {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match slots.remove(key) {
            Some(Slot::Busy) => {
                slots.insert(key.to_owned(), Slot::Busy);
                Taken::Busy
            }
            Some(Slot::Idle(session)) => {
                slots.insert(key.to_owned(), Slot::Busy);
                if session.holder.lost() {
                    session.holder.release(Disposition::Discard);
                    Taken::Absent {
                        ended: Some("the kernel's lease was lost; its state with it"),
                    }
                } else {
                    Taken::Session(session)
                }
            }
            None => {
                slots.insert(key.to_owned(), Slot::Busy);
                Taken::Absent { ended: None }
            }
        }
    }

    /// Puts `key`'s session back after its cell, idle from now.
    pub fn put(&self, state: &Arc<AppState>, key: &str, mut session: Session) {
        session.idle_since = Instant::now();
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.to_owned(), Slot::Idle(session));
        if !self
            .sweeping
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            tokio::spawn(sweep(Arc::downgrade(state)));
        }
    }

    /// Ends `key`'s cell without a session to put back (the cell ended it, or never had one).
    pub fn forget(&self, key: &str) {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }

    /// Frees `key`'s slot if a cell still marks it busy (its session was not put back).
    pub fn forget_if_busy(&self, key: &str) {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if matches!(slots.get(key), Some(Slot::Busy)) {
            slots.remove(key);
        }
    }

    /// Ends every session idle for `idle` or longer: each lease released, its worker reset.
    fn end_idle(&self, idle: Duration) {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let expired: Vec<String> = slots
            .iter()
            .filter(|(_, slot)| {
                matches!(slot, Slot::Idle(session) if session.idle_since.elapsed() >= idle || session.holder.lost())
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in &expired {
            if let Some(Slot::Idle(session)) = slots.remove(key) {
                let disposition = if session.holder.lost() {
                    Disposition::Discard
                } else {
                    Disposition::Reset
                };
                session.holder.release(disposition);
            }
        }
    }
}

/// How often idle sessions are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Ends idle sessions until the API is gone.
async fn sweep(state: Weak<AppState>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        state
            .affinity
            .end_idle(Duration::from_secs(AFFINITY_IDLE_SECONDS));
    }
}
