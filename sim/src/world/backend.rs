//! The workers as they really are, and the backend that creates, deletes and lists them: the
//! faulty inventory (creates fail, hang or lose their reply; deletes fail or lose theirs; listings
//! fail), and each worker's reset, which kills its run and may leave a process behind.

use corral_core::ids::{ImageId, OpToken, WorkerId};
use corral_core::pool::Outcome;
use corral_core::reconcile::Work;
use corral_core::reset::ResetEvidence;
use corral_core::store::{PoolStore, Unavailable};
use corral_core::time::UnixMillis;

use super::{CALL_TIMEOUT_MS, Ev, Requester, TrueWorker, WorkReply, World};
use crate::faults::{Fault, Invariant};

impl World {
    /// The backend receives a call from controller `incarnation` (whatever became of it since).
    pub(super) fn backend_call(&mut self, incarnation: u64, work: Work) {
        match work {
            Work::List => {
                // The deployment clock is read from the store before listing.
                let listed = if self.rng.chance(self.mix.rate(Fault::InventoryUnavailable)) {
                    self.stats.fault(Fault::InventoryUnavailable);
                    Err(Unavailable)
                } else {
                    self.store.now().map(|as_of| (as_of, self.present()))
                };
                let delay = self.latency();
                self.reply(incarnation, delay, WorkReply::Listed(listed));
            }
            Work::Create {
                worker,
                token,
                image,
                claim_deadline,
            } => self.create(incarnation, worker, token, &image, claim_deadline),
            Work::Delete { worker, token } => self.delete(incarnation, worker, token),
            Work::Reset { worker, token } => {
                self.worker_reset(Requester::Controller { incarnation }, worker, token)
            }
        }
    }

    fn reply(&mut self, incarnation: u64, delay: u64, reply: WorkReply) {
        self.schedule(delay, Ev::ControllerReply { incarnation, reply });
    }

    fn create(
        &mut self,
        incarnation: u64,
        worker: WorkerId,
        token: OpToken,
        image: &ImageId,
        claim: Option<UnixMillis>,
    ) {
        self.truth.creates_in_flight.remove(&worker);
        let _ = image;
        let (created, reply) = if self.rng.chance(self.mix.rate(Fault::CreateFails)) {
            self.stats.fault(Fault::CreateFails);
            (false, Some((Outcome::Failed, self.rng.range(5, 50))))
        } else if self.rng.chance(self.mix.rate(Fault::CreateLostReply)) {
            self.stats.fault(Fault::CreateLostReply);
            (true, Some((Outcome::Unknown, CALL_TIMEOUT_MS)))
        } else if self.rng.chance(self.mix.rate(Fault::CreateHangs)) {
            // No reply at all: the reconciler's own deadline decides it is unknown.
            self.stats.fault(Fault::CreateHangs);
            (self.rng.chance(500), None)
        } else {
            (true, Some((Outcome::Done, self.rng.range(100, 1_500))))
        };
        if created {
            self.truth.created.insert(worker);
            self.workers.insert(
                worker,
                TrueWorker {
                    created_at: self.now,
                    tenant: None,
                    dirty: false,
                },
            );
            if let Some(deadline) = claim {
                let at = deadline.0.saturating_sub(self.now);
                self.schedule(at, Ev::PlatformExpire { worker });
            }
        }
        if let Some((outcome, reply_ms)) = reply {
            self.reply(
                incarnation,
                reply_ms,
                WorkReply::Created {
                    worker,
                    token,
                    outcome,
                },
            );
        }
    }

    fn delete(&mut self, incarnation: u64, worker: WorkerId, token: OpToken) {
        let outcome = if self.rng.chance(self.mix.rate(Fault::DeleteFails)) {
            self.stats.fault(Fault::DeleteFails);
            Outcome::Failed
        } else if self.rng.chance(self.mix.rate(Fault::DeleteUnknownSurvives)) {
            self.stats.fault(Fault::DeleteUnknownSurvives);
            Outcome::Unknown
        } else {
            self.destroy(worker);
            if self.rng.chance(self.mix.rate(Fault::DeleteLostReply)) {
                self.stats.fault(Fault::DeleteLostReply);
                Outcome::Unknown
            } else {
                Outcome::Done
            }
        };
        let delay = if outcome == Outcome::Unknown {
            CALL_TIMEOUT_MS
        } else {
            self.latency()
        };
        self.reply(
            incarnation,
            delay,
            WorkReply::Deleted {
                worker,
                token,
                outcome,
            },
        );
    }

    /// A worker stops existing; whatever ran there dies with it.
    pub(super) fn destroy(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
    }

    /// A worker receives a reset: it kills the run's processes and wipes itself (the worker checks
    /// no token, POOL-9), then answers `requester` with its evidence.
    pub(super) fn worker_reset(&mut self, requester: Requester, worker: WorkerId, token: OpToken) {
        let evidence = match self.workers.get(&worker) {
            // Nobody answers: no evidence, no proof.
            None => None,
            Some(truth) => {
                let tenant = truth.tenant;
                self.check(Invariant::RunUndisturbed, tenant.is_none(), || {
                    format!("{worker} reset under {token} while client {tenant:?} runs there")
                });
                let dirty = self.rng.chance(self.mix.rate(Fault::DirtyReset));
                let mut evidence = ResetEvidence::clean(token);
                if dirty {
                    self.stats.fault(Fault::DirtyReset);
                    // What was left, measured (how many) or not measured at all.
                    let left = if self.rng.chance(250) {
                        None
                    } else {
                        Some(self.rng.range(1, 3) as u32)
                    };
                    let measurement = match self.rng.range(0, 3) {
                        0 => &mut evidence.processes_remaining,
                        1 => &mut evidence.workspace_entries,
                        2 => &mut evidence.scratch_entries,
                        _ => &mut evidence.mounts_remaining,
                    };
                    *measurement = left;
                }
                if let Some(truth) = self.workers.get_mut(&worker) {
                    // The run's processes die with the jail; a process may survive the wipe.
                    truth.tenant = None;
                    truth.dirty = dirty;
                }
                self.truth.resets.insert((worker, token), !dirty);
                Some(evidence)
            }
        };
        let delay = self.latency();
        match requester {
            Requester::Holder { client } => self.schedule(
                delay,
                Ev::HolderResetDone {
                    client,
                    worker,
                    token,
                    evidence,
                },
            ),
            Requester::Controller { incarnation } => self.reply(
                incarnation,
                delay,
                WorkReply::Reset {
                    worker,
                    token,
                    evidence,
                },
            ),
        }
    }
}
