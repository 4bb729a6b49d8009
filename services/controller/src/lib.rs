//! The controller (`corral controller`): a reconciler that keeps the warm pool.
//!
//! Each pass publishes this controller's worker image if the pool does not hold it (POOL-12),
//! reports the backend's inventory, ticks the pool, and performs the effects the pool orders:
//! creates and deletes through a [`Backend`], resets through [`WorkerControl`]. Every decision is
//! corral-core's (`PoolDoc::apply`); the controller only performs and reports. When the store is
//! unavailable it does nothing at all: it never builds a pool of its own (POOL-11).

use std::collections::BTreeSet;
use std::future::Future;

use corral_contract::WorkerClient;
use corral_core::ids::{ImageId, OpToken, WorkerId};
use corral_core::pool::{Applied, Command, Effect, Outcome, PoolConfig};
use corral_core::reset::ResetEvidence;
use corral_core::store::{Loaded, Unavailable};
use corral_core::time::UnixMillis;
use corral_store::ValkeyStore;

pub mod claim;
pub mod kube;
pub mod local;

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

/// The reconciler.
pub struct Reconciler<B, C> {
    store: ValkeyStore,
    backend: B,
    control: C,
    config: PoolConfig,
}

impl<B: Backend, C: WorkerControl> Reconciler<B, C> {
    /// A reconciler of the pool in `store`.
    pub fn new(store: ValkeyStore, backend: B, control: C, config: PoolConfig) -> Self {
        Self {
            store,
            backend,
            control,
            config,
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

    async fn commit(&self, command: &Command) -> Option<Applied> {
        self.store.commit(command, &self.config, RETRIES).await
    }

    /// One pass: publish, observe, tick, perform.
    pub async fn pass(&self) -> Pass {
        let mut pass = Pass::default();
        let image = self.backend.image();
        let published = match self.store.load().await {
            Ok(Loaded::Found { doc, .. }) => doc.image() == Some(&image),
            Ok(Loaded::Absent) => false,
            Err(Unavailable) => return pass,
        };
        if !published {
            // Publication comes first after any outage; the pool refuses to create from anything
            // else, so a stale release image can never be used (POOL-12).
            if self
                .commit(&Command::PublishImage {
                    image: image.clone(),
                })
                .await
                .is_none()
            {
                return pass;
            }
            pass.published = true;
        }
        let Ok(as_of) = self.store.now().await else {
            return pass;
        };
        let mut effects = Vec::new();
        if let Ok(present) = self.backend.list().await {
            let Some(observed) = self
                .commit(&Command::InventoryObserved { as_of, present })
                .await
            else {
                return pass;
            };
            effects.extend(observed.effects);
        }
        let Some(ticked) = self.commit(&Command::Tick { image }).await else {
            return pass;
        };
        effects.extend(ticked.effects);
        pass.coordinated = true;
        self.perform(effects, &mut pass).await;
        pass
    }

    /// Performs effects and reports each outcome, performing whatever those reports order in turn.
    pub async fn perform(&self, effects: Vec<Effect>, pass: &mut Pass) {
        let mut pending = effects;
        let mut budget = 1_000u32;
        while let Some(effect) = pending.pop() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                break;
            }
            let report = match effect {
                Effect::Create {
                    worker,
                    token,
                    image,
                    claim_deadline,
                } => {
                    let outcome = self.backend.create(worker, &image, claim_deadline).await;
                    if outcome == Outcome::Done {
                        pass.created += 1;
                    }
                    Command::CreateReported {
                        worker,
                        token,
                        outcome,
                    }
                }
                Effect::Delete { worker, token } => {
                    let outcome = self.backend.delete(worker).await;
                    if outcome == Outcome::Done {
                        pass.deleted += 1;
                    }
                    Command::DeleteReported {
                        worker,
                        token,
                        outcome,
                    }
                }
                Effect::Reset { worker, token } => {
                    pass.resets += 1;
                    match self.control.reset(worker, token).await {
                        Some(evidence) => Command::ResetReported {
                            worker,
                            token,
                            evidence,
                        },
                        // No answer is no proof: the reset times out in the pool and the worker is
                        // discarded.
                        None => continue,
                    }
                }
            };
            let Some(applied) = self.commit(&report).await else {
                return;
            };
            pending.extend(applied.effects);
        }
    }
}
