//! The controller's shell around corral-core's [`Reconciler`]: it performs each store call (the
//! answer comes back after a delay), hands each backend or worker call to the backend model, and
//! sleeps until `poll_timeout`. It decides nothing.
//!
//! A zombie controller pauses with a store call in hand. While it is away the orchestrator may
//! replace it (a new incarnation, perhaps a new release); the zombie then sends its held call, with
//! its old image and tokens, and is gone.

use corral_core::ids::ImageId;
use corral_core::reconcile::{Reconciler, ReconcilerConfig, StoreCall, Work};
use corral_core::store::Loaded;
use corral_core::time::MonoMillis;

use super::{
    Actor, CONTROLLER_PERIOD_MS, Ev, RECONCILER_CALL_TIMEOUT_MS, StoreAnswer, WorkReply, World,
    ZombieHold,
};
use crate::faults::Fault;

/// The reconciler the simulated controller runs.
pub(super) fn new_machine(image: ImageId, now_ms: u64) -> Reconciler {
    let config = ReconcilerConfig {
        pass_period_ms: CONTROLLER_PERIOD_MS,
        call_timeout_ms: RECONCILER_CALL_TIMEOUT_MS,
        ..ReconcilerConfig::default()
    };
    Reconciler::new(image, config, MonoMillis(now_ms))
}

impl World {
    /// Drains every output of the controller's reconciler and sets its next wake-up.
    pub(super) fn drive_controller(&mut self) {
        if !self.controller.alive || self.controller.paused_until > self.now {
            return;
        }
        let incarnation = self.controller.incarnation;
        if let Some(call) = self.controller.machine.poll_command() {
            // It pauses in the middle of a pass, with the pass's publication, listing or tick in
            // hand.
            let held = matches!(
                (&call, self.controller.zombie_pending),
                (
                    StoreCall::Commit(
                        corral_core::pool::Command::Tick { .. }
                            | corral_core::pool::Command::PublishImage { .. },
                    ),
                    Some(ZombieHold::PublishOrTick),
                ) | (
                    StoreCall::Commit(corral_core::pool::Command::InventoryObserved { .. }),
                    Some(ZombieHold::Listing),
                )
            );
            if held {
                self.controller.zombie_pending = None;
                self.zombie_controller(call);
                return;
            }
            let answer = self.store_call(incarnation, &call);
            let delay = self.latency();
            self.schedule(
                delay,
                Ev::ControllerAnswer {
                    incarnation,
                    answer,
                },
            );
        }
        while let Some(work) = self.controller.machine.poll_effect() {
            if let Work::Create { worker, .. } = &work {
                self.truth.creates_in_flight.insert(*worker, worker.epoch);
            }
            let delay = self.latency();
            self.schedule(delay, Ev::ControllerCall { incarnation, work });
        }
        while let Some(event) = self.controller.machine.poll_event() {
            self.note(|| format!("          controller: {event:?}"));
        }
        assert!(
            self.controller.machine.poll_effect().is_none()
                && self.controller.machine.poll_event().is_none(),
            "the reconciler's outputs are drained"
        );
        if let Some(at) = self.controller.machine.poll_timeout() {
            self.controller.generation += 1;
            let generation = self.controller.generation;
            self.schedule_at(
                at.0,
                Ev::ControllerWake {
                    incarnation,
                    generation,
                },
            );
        }
    }

    /// Performs one store call as controller `incarnation`.
    fn store_call(&mut self, incarnation: u64, call: &StoreCall) -> StoreAnswer {
        match call {
            StoreCall::ReadImage => StoreAnswer::Image(match self.load() {
                Ok(Loaded::Found { doc, .. }) => Ok(doc.image().cloned()),
                Ok(Loaded::Absent | Loaded::Outlived { .. }) => Ok(None),
                Err(unavailable) => Err(unavailable),
            }),
            StoreCall::Commit(command) => {
                let answer = self.commit(Actor::Controller(incarnation), command);
                if matches!(
                    command,
                    corral_core::pool::Command::CreateReported { .. }
                        | corral_core::pool::Command::DeleteReported { .. }
                        | corral_core::pool::Command::ResetReported { .. }
                ) {
                    self.maybe_duplicate(command);
                }
                StoreAnswer::Committed(answer)
            }
        }
    }

    /// The controller pauses holding `call`; the orchestrator may replace it meanwhile.
    fn zombie_controller(&mut self, call: StoreCall) {
        self.stats.fault(Fault::ZombieController);
        let pause = self.rng.range(1_000, 15_000);
        let until = self.pause_end(pause);
        let incarnation = self.controller.incarnation;
        let replaced = self.rng.chance(500);
        self.schedule_at(
            until,
            Ev::ControllerSend {
                incarnation,
                call,
                replaced,
            },
        );
        if replaced {
            // An orchestrator replaces a stuck controller, often with the release being rolled out.
            if !self.liveness && self.rng.chance(500) {
                self.stats.fault(Fault::NewRelease);
                self.releases += 1;
                self.controller.release = ImageId(format!("img-{}", self.releases));
            }
            self.start_controller();
        } else {
            self.controller.paused_until = until;
        }
    }

    /// A paused controller resumes and sends the call it held.
    pub(super) fn controller_send(&mut self, incarnation: u64, call: StoreCall, replaced: bool) {
        let answer = self.store_call(incarnation, &call);
        if replaced {
            // The zombie's reply goes to a process that no longer runs.
            return;
        }
        if incarnation != self.controller.incarnation || !self.controller.alive {
            return;
        }
        self.controller.paused_until = self.now;
        let delay = self.latency();
        self.schedule(
            delay,
            Ev::ControllerAnswer {
                incarnation,
                answer,
            },
        );
        self.drive_controller();
    }

    /// True when an event for controller `incarnation` must be dropped (a dead incarnation) or was
    /// deferred (the controller is paused).
    fn controller_unavailable(&mut self, incarnation: u64, ev: &Ev) -> bool {
        if !self.controller.alive || self.controller.incarnation != incarnation {
            return true;
        }
        if self.controller.paused_until > self.now {
            let until = self.controller.paused_until;
            self.schedule_at(until, ev.clone());
            return true;
        }
        false
    }

    pub(super) fn controller_wake(&mut self, incarnation: u64, generation: u64) {
        let ev = Ev::ControllerWake {
            incarnation,
            generation,
        };
        if self.controller_unavailable(incarnation, &ev) || self.controller.generation != generation
        {
            return;
        }
        self.controller.machine.handle_timeout(MonoMillis(self.now));
        self.drive_controller();
    }

    pub(super) fn controller_answer(&mut self, incarnation: u64, answer: StoreAnswer) {
        let ev = Ev::ControllerAnswer {
            incarnation,
            answer,
        };
        if self.controller_unavailable(incarnation, &ev) {
            return;
        }
        let Ev::ControllerAnswer { answer, .. } = ev else {
            unreachable!()
        };
        let now = MonoMillis(self.now);
        match answer {
            StoreAnswer::Image(image) => self.controller.machine.handle_image(image, now),
            StoreAnswer::Committed(applied) => {
                self.controller.machine.handle_committed(applied, now)
            }
        }
        self.drive_controller();
    }

    pub(super) fn controller_reply(&mut self, incarnation: u64, reply: WorkReply) {
        let ev = Ev::ControllerReply { incarnation, reply };
        if self.controller_unavailable(incarnation, &ev) {
            return;
        }
        let Ev::ControllerReply { reply, .. } = ev else {
            unreachable!()
        };
        let now = MonoMillis(self.now);
        let machine = &mut self.controller.machine;
        match reply {
            WorkReply::Listed(listed) => machine.handle_listed(listed, now),
            WorkReply::Created {
                worker,
                token,
                outcome,
            } => machine.handle_created(worker, token, outcome, now),
            WorkReply::Deleted {
                worker,
                token,
                outcome,
            } => machine.handle_deleted(worker, token, outcome, now),
            WorkReply::Reset {
                worker,
                token,
                evidence,
            } => machine.handle_reset(worker, token, evidence, now),
        }
        self.drive_controller();
    }

    /// A new controller incarnation starts (after a crash, or replacing a paused one), perhaps
    /// with a new release, perhaps into a coordination outage.
    pub(super) fn start_controller(&mut self) {
        self.controller.alive = true;
        self.controller.incarnation += 1;
        self.controller.paused_until = 0;
        self.controller.zombie_pending = None;
        if !self.liveness && self.rng.chance(self.mix.rate(Fault::NewRelease)) {
            self.stats.fault(Fault::NewRelease);
            self.releases += 1;
            self.controller.release = ImageId(format!("img-{}", self.releases));
            if self.rng.chance(500) {
                // A coordination outage at start-up, as the new release comes up.
                self.stats.fault(Fault::StoreOutage);
                self.store.unavailable_until_ms = self.now + self.rng.range(500, 8_000);
            }
        }
        self.controller.machine = new_machine(self.controller.release.clone(), self.now);
        self.drive_controller();
    }

    pub(super) fn controller_restart(&mut self) {
        if !self.controller.alive {
            self.start_controller();
        }
    }
}
