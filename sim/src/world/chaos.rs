//! The faults drawn at every chaos step (store outages and data loss, worker and replica crashes,
//! replica pauses, controller crashes and zombies), and the start of the liveness phase, in which
//! every fault stops and the system must converge.

use super::{Ev, World, ZombieHold};
use crate::faults::{Fault, FaultMix};

impl World {
    /// Draws this step's faults.
    pub(super) fn chaos(&mut self) {
        if self.liveness {
            return;
        }
        if self.rng.chance(self.mix.rate(Fault::StoreOutage)) {
            self.stats.fault(Fault::StoreOutage);
            self.store.unavailable_until_ms = self.now + self.rng.range(200, 6_000);
        }
        if self.rng.chance(self.mix.rate(Fault::StoreDataLoss) / 4) && self.store.peek().is_some() {
            self.stats.fault(Fault::StoreDataLoss);
            if let Some(doc) = self.store.lose_data() {
                self.truth.lost_epochs.insert(doc.epoch(), self.now);
            }
            self.store.unavailable_until_ms = self.now + self.rng.range(100, 3_000);
        }
        self.store.maybe_save();
        if self.rng.chance(self.mix.rate(Fault::StoreRollback) / 4)
            && self.store.stored_epoch().is_some()
        {
            self.stats.fault(Fault::StoreRollback);
            let current = self.store.stored_epoch();
            let restored = self.store.restart_from_snapshot();
            // A snapshot of another epoch (or of none) loses the current one outright; one of the
            // same epoch is lost when a write replaces it (`World::commit`).
            if let Some(current) = current
                && restored != Some(current)
            {
                self.truth.lost_epochs.entry(current).or_insert(self.now);
            }
            self.store.unavailable_until_ms = self.now + self.rng.range(100, 3_000);
        }
        if self.rng.chance(self.mix.rate(Fault::WorkerCrash)) && !self.workers.is_empty() {
            self.stats.fault(Fault::WorkerCrash);
            let index = self.rng.range(0, self.workers.len() as u64 - 1) as usize;
            if let Some(worker) = self.workers.keys().nth(index).copied() {
                self.destroy(worker);
            }
        }
        if self.rng.chance(self.mix.rate(Fault::ReplicaCrash)) {
            let replica = self.rng.range(0, self.replicas.len() as u64 - 1) as usize;
            if self.replicas[replica].alive {
                self.stats.fault(Fault::ReplicaCrash);
                self.replicas[replica].alive = false;
                self.replicas[replica].cache = None;
                // Its holders die with it; their leases expire and are taken over.
                for client in self.clients.values_mut() {
                    if client.replica == replica {
                        client.holder = None;
                    }
                }
                let down = self.rng.range(500, 10_000);
                self.schedule(down, Ev::ReplicaRestart { replica });
            }
        }
        if self.rng.chance(self.mix.rate(Fault::ReplicaPause)) {
            let replica = self.rng.range(0, self.replicas.len() as u64 - 1) as usize;
            if self.replicas[replica].alive && self.replicas[replica].paused_until <= self.now {
                self.stats.fault(Fault::ReplicaPause);
                let ttl = self.config.lease_ttl_ms;
                let pause = self.rng.range(ttl / 2, ttl * 2);
                self.replicas[replica].paused_until = self.pause_end(pause);
            }
        }
        if self.rng.chance(self.mix.rate(Fault::ZombieController)) && self.controller.alive {
            // The next store call the controller makes is held through a pause.
            self.controller.zombie_pending = Some(if self.rng.chance(333) {
                ZombieHold::Listing
            } else {
                ZombieHold::PublishOrTick
            });
        }
        if self.rng.chance(self.mix.rate(Fault::ControllerCrash)) && self.controller.alive {
            self.stats.fault(Fault::ControllerCrash);
            self.controller.alive = false;
            let down = self.rng.range(200, 10_000);
            self.schedule(down, Ev::ControllerRestart);
        }
        self.schedule(250, Ev::Chaos);
    }

    pub(super) fn begin_liveness(&mut self) {
        self.note(|| String::from("---- liveness phase: faults off"));
        self.liveness = true;
        self.mix = FaultMix::none();
        self.store.mix = FaultMix::none();
        self.store.unavailable_until_ms = self.now;
        for replica in 0..self.replicas.len() {
            if !self.replicas[replica].alive {
                self.replicas[replica].alive = true;
                self.replicas[replica].incarnation += 1;
            }
        }
        self.controller.zombie_pending = None;
        if !self.controller.alive {
            self.start_controller();
        }
        self.schedule(super::LIVENESS_ARRIVALS_MS, Ev::ArrivalsEnd);
    }
}
