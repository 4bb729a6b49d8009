//! The controller (`corral controller`): a reconciler that keeps the warm pool.
//!
//! Each pass publishes this controller's worker image if the pool does not hold it (POOL-12),
//! reports the backend's inventory, ticks the pool, and performs the effects the pool orders:
//! creates and deletes through a [`Backend`], resets through [`WorkerControl`]. Every decision is
//! corral-core's: the pool's (`PoolDoc::apply`) and the pass's own order and reading of answers
//! (`corral_core::reconcile`); the controller only performs and reports. When the store is
//! unavailable it does nothing at all: it never builds a pool of its own (POOL-11).

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

// The reconciler's clock is tokio's: the real one in production, the world's under simulation.
use tokio::time::Instant;

use futures::FutureExt as _;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

use corral_contract::WorkerClient;
use corral_core::ids::{ImageId, OpToken, WorkerId};
use corral_core::pool::{Applied, Effect, Outcome, PoolConfig};
use corral_core::reconcile::{
    Reconciler as CoreReconciler, ReconcilerConfig, ReconcilerEvent, StoreCall, Work,
};
use corral_core::reset::ResetEvidence;
use corral_core::store::{Loaded, Unavailable};
use corral_core::time::{MonoMillis, UnixMillis};
use corral_store::ValkeyStore;

pub mod claim;
pub mod kube;
pub mod local;
pub mod network_policy;

/// Where workers come from: processes on this machine, pods, or platform claims.
pub trait Backend: Send + Sync {
    /// The image this backend creates workers from (a digest of the worker and its runtime).
    fn image(&self) -> ImageId;
    /// Creates `worker`; `Done` once it is ready, `Failed` when it definitely does not exist,
    /// `Unknown` when nobody can tell.
    fn create(
        &self,
        worker: WorkerId,
        image: &ImageId,
        claim_deadline: Option<UnixMillis>,
    ) -> impl Future<Output = Outcome> + Send;
    /// Deletes `worker`; `Done` only once it is confirmed absent.
    fn delete(&self, worker: WorkerId) -> impl Future<Output = Outcome> + Send;
    /// Every worker that exists.
    fn list(&self) -> impl Future<Output = Result<BTreeSet<WorkerId>, Unavailable>> + Send;
}

/// A backend shared (for example with a shutdown that deletes every worker) is a backend.
impl<B: Backend> Backend for std::sync::Arc<B> {
    fn image(&self) -> ImageId {
        B::image(self)
    }
    fn create(
        &self,
        worker: WorkerId,
        image: &ImageId,
        claim_deadline: Option<UnixMillis>,
    ) -> impl Future<Output = Outcome> + Send {
        B::create(self, worker, image, claim_deadline)
    }
    fn delete(&self, worker: WorkerId) -> impl Future<Output = Outcome> + Send {
        B::delete(self, worker)
    }
    fn list(&self) -> impl Future<Output = Result<BTreeSet<WorkerId>, Unavailable>> + Send {
        B::list(self)
    }
}

/// How the controller asks a worker to reset.
pub trait WorkerControl: Send + Sync {
    /// Resets `worker` under `token`; `None` when the worker did not answer with evidence
    /// (unproven: the pool's reset deadline discards it).
    fn reset(
        &self,
        worker: WorkerId,
        token: OpToken,
    ) -> impl Future<Output = Option<ResetEvidence>> + Send;
}

/// The one worker client resets through the worker's control API.
impl WorkerControl for WorkerClient {
    async fn reset(&self, worker: WorkerId, token: OpToken) -> Option<ResetEvidence> {
        WorkerClient::reset(self, worker, token)
            .await
            .ok()
            .map(|reply| reply.reset_evidence.evidence)
    }
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// False when the store was unavailable and nothing was done.
    pub coordinated: bool,
    /// Whether this pass published the image.
    pub published: bool,
    /// Workers created (reported done).
    pub created: u32,
    /// Workers deleted and confirmed absent.
    pub deleted: u32,
    /// Resets performed.
    pub resets: u32,
}

/// How many times a report whose outcome is unknown is applied again.
const RETRIES: u32 = 20;

/// A call's answer, for the core reconciler.
enum Answered {
    Image(Result<Option<ImageId>, Unavailable>),
    Committed(Option<Applied>),
    Listed(Result<(UnixMillis, BTreeSet<WorkerId>), Unavailable>),
    Created(WorkerId, OpToken, Outcome),
    Deleted(WorkerId, OpToken, Outcome),
    Reset(WorkerId, OpToken, Option<ResetEvidence>),
}

/// The controller's shell: corral-core's [`CoreReconciler`] decides the order of every pass and
/// what each answer means; this performs its calls (the store, the backend, the workers) and
/// feeds back the answers, draining every output after every input. When the store is
/// unavailable the core does nothing at all: it never builds a pool of its own (POOL-11).
pub struct Reconciler<B, C> {
    store: ValkeyStore,
    backend: B,
    control: C,
    config: PoolConfig,
    core: tokio::sync::Mutex<CoreReconciler>,
    core_config: ReconcilerConfig,
    epoch: Instant,
    #[cfg(feature = "sim-mutations")]
    seen: std::sync::Mutex<mutation::Seen>,
}

impl<B: Backend, C: WorkerControl> Reconciler<B, C> {
    /// A reconciler of the pool in `store`.
    pub fn new(store: ValkeyStore, backend: B, control: C, config: PoolConfig) -> Self {
        let core_config = ReconcilerConfig::default();
        let core = CoreReconciler::new(backend.image(), core_config, MonoMillis(0));
        Self {
            store,
            backend,
            control,
            config,
            core: tokio::sync::Mutex::new(core),
            core_config,
            epoch: Instant::now(),
            #[cfg(feature = "sim-mutations")]
            seen: std::sync::Mutex::default(),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The worker control.
    pub fn control(&self) -> &C {
        &self.control
    }

    /// The store.
    pub fn store(&self) -> &ValkeyStore {
        &self.store
    }

    fn now(&self) -> MonoMillis {
        MonoMillis(u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// A pass every `period` (at once when one outlasted it) until `stop` resolves; `after` sees
    /// each pass. The loop of `corral controller`, `corral up` and the shell world.
    ///
    /// Starting the next pass at once after one that created workers made a burst on two cores
    /// grow the pool faster and answer no sooner (its runs wait for the cores, which new workers'
    /// first jails share, not for the period), so the period stands.
    pub async fn run(
        &self,
        period: Duration,
        stop: impl Future<Output = ()>,
        mut after: impl FnMut(&Pass),
    ) {
        let mut interval = tokio::time::interval(period);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                biased;
                () = &mut stop => return,
                _ = interval.tick() => {
                    after(&self.pass().await);
                }
            }
        }
    }

    /// One pass, started now: publish, observe, tick, perform, report; returns once the pass
    /// has ended and every call it made has been answered (or has run out of time).
    pub async fn pass(&self) -> Pass {
        let mut core = self.core.lock().await;
        core.handle_nudge(self.now());
        core.handle_timeout(self.now());
        self.drive(&mut core, true).await
    }

    /// Performs effects another component could not (a lease holder's, a test's), and reports
    /// each outcome, performing whatever those reports order in turn.
    pub async fn perform(&self, effects: Vec<Effect>, pass: &mut Pass) {
        let mut core = self.core.lock().await;
        for effect in effects {
            core.handle_handoff(effect, self.now());
        }
        let done = self.drive(&mut core, false).await;
        pass.created += done.created;
        pass.deleted += done.deleted;
        pass.resets += done.resets;
    }

    /// Performs what the core asks until it asks nothing more and nothing is out (and, when
    /// `to_pass_end`, its pass has ended).
    async fn drive(&self, core: &mut CoreReconciler, to_pass_end: bool) -> Pass {
        let mut pass = Pass::default();
        let mut ended = !to_pass_end;
        let mut calls = FuturesUnordered::new();
        loop {
            while let Some(call) = core.poll_command() {
                calls.push(self.store_call(call).boxed());
            }
            while let Some(work) = core.poll_effect() {
                if matches!(work, Work::Reset { .. }) {
                    pass.resets += 1;
                }
                calls.push(self.work(work).boxed());
            }
            while let Some(event) = core.poll_event() {
                match event {
                    ReconcilerEvent::PassEnded(summary) => {
                        pass.coordinated = summary.coordinated;
                        pass.published = summary.published;
                        ended = true;
                    }
                    ReconcilerEvent::ReportAbandoned { worker } => {
                        tracing::warn!(
                            worker = %worker,
                            "a report got no answer; the pool's timeouts settle it"
                        );
                    }
                }
            }
            if ended && calls.is_empty() {
                return pass;
            }
            let wake = core
                .poll_timeout()
                .map(|at| self.epoch + Duration::from_millis(at.0));
            tokio::select! {
                biased;
                Some(answered) = calls.next() => {
                    let now = self.now();
                    match answered {
                        Answered::Image(image) => core.handle_image(image, now),
                        Answered::Committed(applied) => core.handle_committed(applied, now),
                        Answered::Listed(listed) => core.handle_listed(listed, now),
                        Answered::Created(worker, token, outcome) => {
                            pass.created += u32::from(outcome == Outcome::Done);
                            core.handle_created(worker, token, outcome, now);
                        }
                        Answered::Deleted(worker, token, outcome) => {
                            pass.deleted += u32::from(outcome == Outcome::Done);
                            core.handle_deleted(worker, token, outcome, now);
                        }
                        Answered::Reset(worker, token, evidence) => {
                            core.handle_reset(worker, token, evidence, now);
                        }
                    }
                }
                () = async {
                    match wake {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => core.handle_timeout(self.now()),
            }
        }
    }

    /// Performs one store call.
    async fn store_call(&self, call: StoreCall) -> Answered {
        match call {
            StoreCall::ReadImage => Answered::Image(match self.store.load().await {
                #[cfg(feature = "sim-mutations")]
                Ok(Loaded::Found { doc, .. }) if mutation::reaps_stale_leases() => {
                    self.reap_stale(&doc).await;
                    Ok(doc.image().cloned())
                }
                Ok(Loaded::Found { doc, .. }) => Ok(doc.image().cloned()),
                #[cfg(feature = "sim-mutations")]
                Err(Unavailable) if mutation::reaps_stale_leases() => {
                    self.seen
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .cut_off = true;
                    Err(Unavailable)
                }
                // A document from before Valkey restarted is not trusted: nothing is published.
                Ok(Loaded::Absent | Loaded::Outlived { .. }) => Ok(None),
                Err(Unavailable) => Err(Unavailable),
            }),
            StoreCall::Commit(command) => {
                Answered::Committed(self.store.commit(&command, &self.config, RETRIES).await)
            }
        }
    }

    /// The defect: back in touch with the store after an outage, delete the workers whose leases
    /// ran out, by the store's clock, in the document last read before the outage, without
    /// asking the pool (which heard their holders' heartbeats meanwhile).
    #[cfg(feature = "sim-mutations")]
    async fn reap_stale(&self, doc: &corral_core::pool::PoolDoc) {
        let stale = {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let stale = if seen.cut_off { seen.doc.take() } else { None };
            seen.cut_off = false;
            seen.doc = Some(doc.clone());
            stale
        };
        let (Some(stale), Ok(now)) = (stale, self.store.now().await) else {
            return;
        };
        for (worker, held) in stale.workers() {
            if let corral_core::pool::WorkerState::Leased(lease) = &held.state
                && lease.expires_at <= now
            {
                let _ = self.backend.delete(*worker).await;
            }
        }
    }

    /// Performs one backend or worker call, within the core's call timeout (past it the core
    /// has counted the outcome unknown, and a late answer changes nothing).
    async fn work(&self, work: Work) -> Answered {
        let limit = Duration::from_millis(self.core_config.call_timeout_ms);
        match work {
            Work::List => {
                let listed = tokio::time::timeout(limit, async {
                    let as_of = self.store.now().await?;
                    Ok((as_of, self.backend.list().await?))
                })
                .await
                .unwrap_or(Err(Unavailable));
                Answered::Listed(listed)
            }
            Work::Create {
                worker,
                token,
                image,
                claim_deadline,
            } => {
                let outcome = tokio::time::timeout(
                    limit,
                    self.backend.create(worker, &image, claim_deadline),
                )
                .await
                .unwrap_or(Outcome::Unknown);
                Answered::Created(worker, token, outcome)
            }
            Work::Delete { worker, token } => {
                let outcome = tokio::time::timeout(limit, self.backend.delete(worker))
                    .await
                    .unwrap_or(Outcome::Unknown);
                Answered::Deleted(worker, token, outcome)
            }
            Work::Reset { worker, token } => {
                let evidence = tokio::time::timeout(limit, self.control.reset(worker, token))
                    .await
                    .ok()
                    .flatten();
                Answered::Reset(worker, token, evidence)
            }
        }
    }
}

/// The reconciler driver's deliberate defect, for the shell simulation to prove it catches it
/// (issue 28). Compiled only with the `sim-mutations` feature, which no shipped build enables.
#[cfg(feature = "sim-mutations")]
pub mod mutation {
    use std::sync::atomic::{AtomicBool, Ordering};

    static REAP_STALE_LEASES: AtomicBool = AtomicBool::new(false);

    /// What the defective driver remembers: the document it last read, and whether the store
    /// has been out of reach since.
    #[derive(Default)]
    pub(crate) struct Seen {
        pub(crate) doc: Option<corral_core::pool::PoolDoc>,
        pub(crate) cut_off: bool,
    }

    /// Turns on (or off) the defect: back in touch with the store after an outage, the driver
    /// deletes the workers whose leases had run out in the document it read before the outage.
    pub fn reap_stale_leases(on: bool) {
        REAP_STALE_LEASES.store(on, Ordering::SeqCst);
    }

    pub(crate) fn reaps_stale_leases() -> bool {
        REAP_STALE_LEASES.load(Ordering::SeqCst)
    }
}
