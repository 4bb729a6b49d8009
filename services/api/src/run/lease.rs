//! The lease a run holds: taken with one wait for the whole request, renewed while the run
//! lasts, and released with what the pool ordered performed or handed on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use corral_core::ids::{LeaseNamespace, LeaseScope, TicketId};
use corral_core::pool::{Command, Disposition, Effect, Event};
use corral_core::run::admission::Admitted;
use corral_store::VersionWatch;
use corral_store::lease::{self, AcquireError, Granted};

use crate::AppState;

/// Takes a FIFO ticket for `admitted` and waits for its grant until `deadline`: one wait for the
/// whole request, so that trying another worker never starts the wait again.
///
/// # Errors
/// Why no lease was granted.
pub async fn acquire(
    state: &AppState,
    admitted: &Admitted,
    deadline: Instant,
    watch: &mut Option<VersionWatch>,
) -> Result<Granted, AcquireError> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err(AcquireError::WaitTimeout { orders: Vec::new() });
    }
    let wait_ms = u64::try_from(remaining.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let ticket = TicketId(u64::from_le_bytes(
        corral_contract::credential::random_bytes()[..8]
            .try_into()
            .unwrap_or_default(),
    ));
    let acquire = Command::Acquire {
        ticket,
        member: admitted.member.clone(),
        scope: LeaseScope {
            namespace: LeaseNamespace::Code,
            actor: admitted.actor.clone(),
            conversation: admitted.conversation.clone(),
        },
        wait_ms,
    };
    let started = Instant::now();
    let granted = lease::acquire(
        &state.store,
        &state.settings.pool(),
        &acquire,
        Duration::from_millis(wait_ms),
        watch,
    )
    .await?;
    state.metrics.acquired(started.elapsed());
    Ok(granted)
}

/// A held lease: renewed every `SANDBOX_LEASE_HEARTBEAT_SECONDS` until released.
pub struct Holder {
    state: Arc<AppState>,
    granted: Granted,
    lost: Arc<AtomicBool>,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl Holder {
    /// Starts renewing `granted`.
    #[must_use]
    pub fn start(state: Arc<AppState>, granted: Granted) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let heartbeats = tokio::spawn(heartbeats(state.clone(), granted, lost.clone()));
        Self {
            state,
            granted,
            lost,
            heartbeats,
        }
    }

    /// The lease.
    #[must_use]
    pub fn granted(&self) -> Granted {
        self.granted
    }

    /// Whether the pool refused a renewal: the lease expired or was taken over, and the worker
    /// is no longer this run's to vouch for.
    #[must_use]
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Ends the lease as `disposition` says, then performs what the pool ordered in the
    /// background: the worker's reset, with its evidence reported. A lease already lost is not
    /// released (the pool took the worker over) and its worker is never reset on hope.
    pub async fn release(self, disposition: Disposition) {
        self.heartbeats.abort();
        if self.lost() {
            return;
        }
        let state = self.state;
        let granted = self.granted;
        let command = Command::Release {
            worker: granted.worker,
            lease: granted.ticket,
            token: granted.token,
            disposition,
        };
        let pool = state.settings.pool();
        let Some(applied) = state.store.commit(&command, &pool, lease::RETRIES).await else {
            // Coordination is unreachable: the lease expires and the worker is taken over
            // (POOL-9); nothing is reset on hope.
            state.metrics.unperformed("release_unrecorded");
            return;
        };
        tokio::spawn(async move {
            for effect in applied.effects {
                perform(&state, effect).await;
            }
        });
    }
}

/// Performs, in the background, what the pool ordered when a ticket was withdrawn just as it was
/// granted (the lease's release, hence the worker's reset).
pub fn perform_orders(state: Arc<AppState>, orders: Vec<Effect>) {
    if orders.is_empty() {
        return;
    }
    tokio::spawn(async move {
        for effect in orders {
            perform(&state, effect).await;
        }
    });
}

/// Performs one effect a release ordered. A reset is this replica's to perform; creating and
/// deleting workers are the controller's (the API holds no backend): the pool keeps such an order
/// in the document and the reconciler performs it on its next pass, so it is counted here and
/// left to it, never dropped unseen.
async fn perform(state: &AppState, effect: Effect) {
    match effect {
        Effect::Reset { worker, token } => {
            // No evidence is no proof: the pool's reset deadline discards the worker.
            let Ok(reply) = state.workers.reset(worker, token).await else {
                state.metrics.unperformed("reset_unanswered");
                return;
            };
            let report = Command::ResetReported {
                worker,
                token,
                evidence: reply.reset_evidence.evidence,
            };
            let reported = state
                .store
                .commit(&report, &state.settings.pool(), lease::RETRIES)
                .await;
            if reported.is_none() {
                // The reset's deadline passes unreported and the worker is discarded.
                state.metrics.unperformed("reset_unreported");
            }
        }
        Effect::Delete { .. } => state.metrics.unperformed("delete_left_to_controller"),
        Effect::Create { .. } => state.metrics.unperformed("create_left_to_controller"),
    }
}

/// Renews the lease every `SANDBOX_LEASE_HEARTBEAT_SECONDS` until aborted; a renewal the pool
/// refuses marks the lease lost and ends the renewals.
async fn heartbeats(state: Arc<AppState>, granted: Granted, lost: Arc<AtomicBool>) {
    let period = Duration::from_secs(state.settings.lease_heartbeat_seconds.max(1));
    loop {
        tokio::time::sleep(period).await;
        let beat = Command::Heartbeat {
            worker: granted.worker,
            lease: granted.ticket,
            token: granted.token,
        };
        let applied = state
            .store
            .commit(&beat, &state.settings.pool(), lease::RETRIES)
            .await;
        match applied {
            Some(applied)
                if matches!(applied.answer(granted.ticket), Some(Event::Refused { .. })) =>
            {
                lost.store(true, Ordering::Relaxed);
                return;
            }
            Some(_) => {}
            // Unreachable coordination: try again next period; the lease's TTL bounds it.
            None => state.metrics.unperformed("heartbeat_unrecorded"),
        }
    }
}
