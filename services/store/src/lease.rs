//! Taking a lease: one FIFO ticket, granted at once, queued, or refused (POOL-3).
//!
//! The one acquire every holder uses (the API for `run_code`, the test harness and the allocation
//! benchmark). A queued ticket waits for a version announcement, polling as the fallback, and is
//! withdrawn when the caller stops waiting, so an abandoned ticket never receives a worker.

use std::time::Duration;

use tokio::time::Instant;

use corral_core::ids::{OpToken, TicketId, WorkerId};
use corral_core::pool::{Command, Effect, Event, PoolConfig, TicketStatus};
use corral_core::store::Loaded;
use corral_core::time::UnixMillis;

use crate::{ValkeyStore, VersionWatch};

/// How many times one command whose outcome is unknown or contended is applied again.
pub const RETRIES: u32 = 50;
/// The longest a waiter sleeps between two reads when it has no subscription to announcements.
const POLL: Duration = Duration::from_millis(50);
/// The longest a subscribed waiter waits between two reads when no announcement concerns its
/// ticket: a lost announcement is reported as missed (and a closed subscription falls back to
/// [`POLL`]), so this only bounds what an unreported loss could delay.
const WATCHED_POLL: Duration = Duration::from_millis(1_000);

/// A lease the pool granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The ticket (and lease) id.
    pub ticket: TicketId,
    /// The leased worker.
    pub worker: WorkerId,
    /// The token every heartbeat and the release must carry.
    pub token: OpToken,
    /// When the lease expires unless renewed, on the deployment clock.
    pub expires_at: UnixMillis,
    /// The latest instant of this process's clock the grant cannot have preceded: when the
    /// request that made it was first sent, or, for a grant made to the queued ticket by someone
    /// else, when the last read that still found it queued was sent. The lease's TTL runs from
    /// no earlier than this, so a holder counting from it never outlives the lease; counting from
    /// the first request instead would take a ticket that queued longer than the TTL for lost the
    /// moment it is granted.
    pub since: Instant,
}

/// Why no lease was granted. Codes are stable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireError {
    /// The pool refused the ticket (queue full, member limit, admission closed, ...): the core's
    /// refusal code.
    Refused(&'static str),
    /// The ticket waited its whole wait and was withdrawn. When a grant arrived as it was
    /// withdrawn, the withdrawal released that lease, and `orders` is what the pool ordered for
    /// the worker (its reset): the caller must perform them.
    WaitTimeout {
        /// What the withdrawal ordered.
        orders: Vec<Effect>,
    },
    /// The ticket left the queue before its wait was over without being granted: the
    /// coordination store lost it (data loss, a new epoch). Nothing was leased.
    TicketLost,
    /// The coordination store could not be reached, or lost the ticket: fail closed (POOL-11).
    CoordinationUnavailable,
}

impl AcquireError {
    /// The stable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Refused(code) => code,
            Self::WaitTimeout { .. } => "wait_timeout",
            Self::TicketLost => "ticket_lost",
            Self::CoordinationUnavailable => "coordination_unavailable",
        }
    }
}

/// How long before its wait is over a ticket may be expired by the pool, whose clock (Valkey's)
/// may run a little ahead of this process's.
const CLOCK_ALLOWANCE: Duration = Duration::from_secs(1);

/// Why a queued ticket that is no longer in the pool after `waited` of its `wait` got nothing: the
/// pool expires a ticket at the end of its wait; one gone sooner was lost with the store's data.
fn gone(waited: Duration, wait: Duration) -> AcquireError {
    if waited + CLOCK_ALLOWANCE >= wait {
        AcquireError::WaitTimeout { orders: Vec::new() }
    } else {
        AcquireError::TicketLost
    }
}

/// Applies `acquire` (a [`Command::Acquire`]) and waits for its grant at most `wait` (plus a second
/// for the pool's own deadline to fire first). `watch` is the caller's subscription to version
/// announcements, opened here on first need and kept for later waits.
pub async fn acquire(
    store: &ValkeyStore,
    config: &PoolConfig,
    acquire: &Command,
    wait: Duration,
    watch: &mut Option<VersionWatch>,
) -> Result<Granted, AcquireError> {
    let Command::Acquire { ticket, .. } = acquire else {
        return Err(AcquireError::Refused("not_an_acquire"));
    };
    let ticket = *ticket;
    let asked = Instant::now();
    let applied = store
        .commit(acquire, config, RETRIES)
        .await
        .ok_or(AcquireError::CoordinationUnavailable)?;
    match applied.answer(ticket) {
        Some(Event::Granted {
            worker,
            token,
            expires_at,
            ..
        }) => {
            return Ok(Granted {
                ticket,
                worker: *worker,
                token: *token,
                expires_at: *expires_at,
                since: asked,
            });
        }
        Some(Event::Refused { reason, .. }) => return Err(AcquireError::Refused(reason.code())),
        _ => {}
    }
    if watch.is_none() {
        *watch = store.subscribe().await.ok();
    }
    if let Some(answer) = queued(store, ticket, asked, wait, watch).await {
        return answer;
    }
    // Withdraw it, so that a grant arriving now goes back to the pool rather than to nobody. A
    // withdrawal that cannot be written leaves the ticket to the pool's own deadline; a grant made
    // to it meanwhile expires unrenewed and its worker is taken over (POOL-9).
    let withdrawn = store
        .commit(&Command::Cancel { ticket }, config, RETRIES)
        .await;
    Err(AcquireError::WaitTimeout {
        orders: withdrawn.map(|applied| applied.effects).unwrap_or_default(),
    })
}

/// Waits for queued `ticket`'s grant, reading the pool at every announcement that may concern it
/// (or poll) until
/// `wait` (plus a second) has passed: its answer, or `None` when the wait ran out. The ticket was
/// queued when the acquire's answer, sent at `asked`, was written: no grant precedes that.
async fn queued(
    store: &ValkeyStore,
    ticket: TicketId,
    asked: Instant,
    wait: Duration,
    watch: &mut Option<VersionWatch>,
) -> Option<Result<Granted, AcquireError>> {
    let started = Instant::now();
    let deadline = started + wait + Duration::from_secs(1);
    let mut queued_at = asked;
    while Instant::now() < deadline {
        let sent = Instant::now();
        match store.load().await {
            Ok(Loaded::Found { doc, .. }) => match doc.ticket_status(ticket) {
                TicketStatus::Granted {
                    worker,
                    token,
                    expires_at,
                } => {
                    return Some(Ok(Granted {
                        ticket,
                        worker,
                        token,
                        expires_at,
                        since: queued_at,
                    }));
                }
                TicketStatus::Gone => return Some(Err(gone(started.elapsed(), wait))),
                TicketStatus::Queued { .. } => queued_at = sent,
            },
            Ok(Loaded::Absent | Loaded::Outlived { .. }) | Err(_) => {
                return Some(Err(AcquireError::CoordinationUnavailable));
            }
        }
        match watch.as_mut() {
            Some(watch) if !watch.closed() => {
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = watch.changed_for(ticket, WATCHED_POLL.min(left)).await;
            }
            Some(watch) => {
                let _ = watch.changed(POLL).await;
            }
            None => tokio::time::sleep(POLL / 5).await,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_03_a_ticket_gone_before_its_wait_is_lost_not_timed_out() {
        let wait = Duration::from_secs(30);
        let timeout = AcquireError::WaitTimeout { orders: Vec::new() };
        assert_eq!(gone(Duration::from_secs(30), wait), timeout);
        assert_eq!(gone(Duration::from_millis(29_500), wait), timeout);
        assert_eq!(gone(Duration::from_secs(2), wait), AcquireError::TicketLost);
        assert_eq!(AcquireError::TicketLost.code(), "ticket_lost");
    }
}
