//! The lease a run holds: taken with one wait for the whole request, then held by corral-core's
//! lease holder (`corral_core::holder`), which this module drives: renewed while the run lasts,
//! released as the outcome says, and what the pool orders performed or handed on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// Deadlines and the holder's clock are tokio's: the real one in production, the world's under
// simulation.
use tokio::time::Instant;

use corral_core::holder::{Grant, HolderConfig, HolderEvent, LeaseHolder};
use corral_core::ids::{LeaseNamespace, LeaseScope, OpToken, TicketId, WorkerId};
use corral_core::pool::PoolConfig;
use corral_core::pool::{Applied, Command, Disposition, Effect};
use corral_core::reset::ResetEvidence;
use corral_core::run::admission::Admitted;
use corral_core::time::MonoMillis;
use corral_store::lease::{self, AcquireError, Granted};
use corral_store::{ValkeyStore, VersionWatch};

use crate::AppState;

/// What a lease holder's driver needs of the replica it runs in: the store its commands commit
/// to, the pool's settings, the worker client its resets go through, and a count of what it left
/// to others. The API's state in production; a replica of the shell world under simulation.
pub trait HolderPorts: Send + Sync + 'static {
    /// The coordination store.
    fn store(&self) -> &ValkeyStore;
    /// The pool's settings.
    fn pool(&self) -> PoolConfig;
    /// The worker client.
    fn workers(&self) -> &corral_contract::WorkerClient;
    /// Counts something the holder could not perform itself.
    fn unperformed(&self, what: &'static str);
}

impl HolderPorts for AppState {
    fn store(&self) -> &ValkeyStore {
        &self.store
    }
    fn pool(&self) -> PoolConfig {
        self.settings.pool()
    }
    fn workers(&self) -> &corral_contract::WorkerClient {
        &self.workers
    }
    fn unperformed(&self, what: &'static str) {
        self.metrics.unperformed(what);
    }
}

/// Takes a FIFO ticket for `admitted` and waits for its grant until `deadline`: one wait for the
/// whole request, so that trying another worker never starts the wait again. Returns the grant
/// and when its acquire was first sent (the lease cannot expire before that plus its TTL).
///
/// # Errors
/// Why no lease was granted.
pub async fn acquire(
    state: &AppState,
    admitted: &Admitted,
    deadline: Instant,
    watch: &mut Option<VersionWatch>,
) -> Result<(Granted, Instant), AcquireError> {
    let scope = LeaseScope {
        namespace: LeaseNamespace::Code,
        actor: admitted.actor.clone(),
        conversation: admitted.conversation.clone(),
    };
    let stack = admitted.uses_stack(&state.settings);
    acquire_in(state, &admitted.member, scope, stack, deadline, watch).await
}

/// [`acquire`] for `member` in `scope`: a code run's, or a browser session's (BROW-6: the same
/// queue, ceiling and fairness, in its own namespace); `stack` when the run uses the data stack
/// (decision 0058).
///
/// # Errors
/// Why no lease was granted.
pub async fn acquire_in(
    state: &AppState,
    member: &corral_core::ids::MemberId,
    scope: LeaseScope,
    stack: bool,
    deadline: Instant,
    watch: &mut Option<VersionWatch>,
) -> Result<(Granted, Instant), AcquireError> {
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
        member: member.clone(),
        scope,
        wait_ms,
        stack,
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
    Ok((granted, granted.since))
}

/// A held lease, driven by corral-core's [`LeaseHolder`] in a task of its own: renewed while the
/// run lasts, released as the run's outcome says, and whatever the pool orders on the way
/// performed (the worker's reset and its evidence reported) or counted as left to the
/// controller; never dropped. The task outlives the run's answer until the holder is done.
pub struct Holder {
    granted: Granted,
    lost: Arc<AtomicBool>,
    release: tokio::sync::oneshot::Sender<Disposition>,
}

impl Holder {
    /// Starts holding `granted`, whose acquire was first sent at `asked_at`.
    #[must_use]
    pub fn start<P: HolderPorts>(state: Arc<P>, granted: Granted, asked_at: Instant) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let (release, released) = tokio::sync::oneshot::channel();
        // The holder's clock is tokio's: the real one in production, the world's under simulation.
        let epoch = asked_at;
        let grant = Grant {
            ticket: granted.ticket,
            worker: granted.worker,
            token: granted.token,
        };
        let config = HolderConfig::from_pool(&state.pool());
        let holder = LeaseHolder::granted(grant, MonoMillis(0), config, mono(epoch));
        tokio::spawn(drive(state, holder, epoch, released, lost.clone()));
        Self {
            granted,
            lost,
            release,
        }
    }

    /// The lease.
    #[must_use]
    pub fn granted(&self) -> Granted {
        self.granted
    }

    /// Whether the lease is known lost (a renewal refused, the lease taken over, or no renewal
    /// confirmed in time): the worker is no longer this run's to vouch for.
    #[must_use]
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Ends the lease as `disposition` says. The holder's task performs the rest in the
    /// background (the release, the worker's reset, its evidence reported).
    pub fn release(self, disposition: Disposition) {
        // An Err means the task already ended (its lease was lost): nothing to release.
        let _ = self.release.send(disposition);
    }
}

/// Milliseconds since `epoch`, the holder's monotonic clock.
fn mono(epoch: tokio::time::Instant) -> MonoMillis {
    MonoMillis(u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX))
}

/// What came back for the holder.
enum Answer {
    Committed(Option<Applied>),
    Reset {
        worker: WorkerId,
        token: OpToken,
        evidence: Option<ResetEvidence>,
    },
}

/// The holder's task: performs its commands and effects, feeds back their answers, and sleeps
/// until its next timer, draining every output after every input (STYLE.md item 3).
async fn drive<P: HolderPorts>(
    state: Arc<P>,
    mut holder: LeaseHolder,
    epoch: tokio::time::Instant,
    released: tokio::sync::oneshot::Receiver<Disposition>,
    lost: Arc<AtomicBool>,
) {
    let (answer, mut answers) = tokio::sync::mpsc::unbounded_channel::<Answer>();
    let mut released = Some(released);
    loop {
        perform_outputs(&state, &mut holder, &answer, &lost);
        if holder.is_done() {
            return;
        }
        let wake = holder
            .poll_timeout()
            .map(|at| epoch + Duration::from_millis(at.0));
        tokio::select! {
            biased;
            Some(answered) = answers.recv() => match answered {
                Answer::Committed(applied) => holder.handle_committed(applied, mono(epoch)),
                Answer::Reset { worker, token, evidence } => {
                    if evidence.is_none() {
                        // No evidence is no proof: the pool's reset deadline discards the worker.
                        state.unperformed("reset_unanswered");
                    }
                    holder.handle_reset(worker, token, evidence, mono(epoch));
                }
            },
            disposition = async {
                match released.as_mut() {
                    Some(released) => released.await,
                    None => std::future::pending().await,
                }
            }, if released.is_some() => {
                released = None;
                // A run that ended without saying how (it panicked) vouches for nothing.
                holder.handle_release(disposition.unwrap_or(Disposition::Discard), mono(epoch));
            }
            () = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => holder.handle_timeout(mono(epoch)),
        }
    }
}

/// Drains every output of `holder`: each command committed and each reset asked for in a task of
/// its own, whose answer comes back on `answer`; a lost lease raised in `lost`.
fn perform_outputs<P: HolderPorts>(
    state: &Arc<P>,
    holder: &mut LeaseHolder,
    answer: &tokio::sync::mpsc::UnboundedSender<Answer>,
    lost: &AtomicBool,
) {
    while let Some(command) = holder.poll_command() {
        let (state, answer) = (state.clone(), answer.clone());
        tokio::spawn(async move {
            let applied = state
                .store()
                .commit(&command, &state.pool(), lease::RETRIES)
                .await;
            let _ = answer.send(Answer::Committed(applied));
        });
    }
    while let Some(effect) = holder.poll_effect() {
        match effect {
            Effect::Reset { worker, token } => {
                let (state, answer) = (state.clone(), answer.clone());
                tokio::spawn(async move {
                    let evidence = state.workers().reset(worker, token).await.ok();
                    let _ = answer.send(Answer::Reset {
                        worker,
                        token,
                        evidence: evidence.map(|reply| reply.reset_evidence.evidence),
                    });
                });
            }
            // The API holds no backend: the pool keeps these orders in the document and the
            // controller's reconciler performs them on its next pass.
            Effect::Delete { .. } => state.unperformed("delete_left_to_controller"),
            Effect::Create { .. } => state.unperformed("create_left_to_controller"),
        }
    }
    while let Some(event) = holder.poll_event() {
        match event {
            HolderEvent::Lost(_) => {
                #[cfg(feature = "sim-mutations")]
                if mutation::keeps_lost_leases() {
                    // The defect: the run goes on as if it still held its worker.
                    continue;
                }
                lost.store(true, Ordering::Relaxed);
                state.unperformed("lease_lost");
            }
            HolderEvent::Ended(_) => {}
        }
    }
}

/// Performs, in the background, what the pool ordered when a ticket was withdrawn just as it was
/// granted (the lease's release, hence the worker's reset).
pub fn perform_orders<P: HolderPorts>(state: Arc<P>, orders: Vec<Effect>) {
    if orders.is_empty() {
        return;
    }
    tokio::spawn(async move {
        for effect in orders {
            perform(&*state, effect).await;
        }
    });
}

/// Performs one effect a release ordered. A reset is this replica's to perform; creating and
/// deleting workers are the controller's (the API holds no backend): the pool keeps such an order
/// in the document and the reconciler performs it on its next pass, so it is counted here and
/// left to it, never dropped unseen.
async fn perform<P: HolderPorts>(state: &P, effect: Effect) {
    match effect {
        Effect::Reset { worker, token } => {
            // No evidence is no proof: the pool's reset deadline discards the worker.
            let Ok(reply) = state.workers().reset(worker, token).await else {
                state.unperformed("reset_unanswered");
                return;
            };
            let report = Command::ResetReported {
                worker,
                token,
                evidence: reply.reset_evidence.evidence,
            };
            let reported = state
                .store()
                .commit(&report, &state.pool(), lease::RETRIES)
                .await;
            if reported.is_none() {
                // The reset's deadline passes unreported and the worker is discarded.
                state.unperformed("reset_unreported");
            }
        }
        Effect::Delete { .. } => state.unperformed("delete_left_to_controller"),
        Effect::Create { .. } => state.unperformed("create_left_to_controller"),
    }
}

/// The lease holder driver's deliberate defect, for the shell simulation to prove it catches it
/// (issue 28). Compiled only with the `sim-mutations` feature, which no shipped build enables.
#[cfg(feature = "sim-mutations")]
pub mod mutation {
    use std::sync::atomic::{AtomicBool, Ordering};

    static KEEP_LOST_LEASES: AtomicBool = AtomicBool::new(false);

    /// Turns on (or off) the defect: a lease the holder found lost is still reported held, so the
    /// run goes on, vouches for its worker and releases it as if it had held it throughout.
    pub fn keep_lost_leases(on: bool) {
        KEEP_LOST_LEASES.store(on, Ordering::SeqCst);
    }

    pub(crate) fn keeps_lost_leases() -> bool {
        KEEP_LOST_LEASES.load(Ordering::SeqCst)
    }
}
