//! The clients' lease holders, driven as the API shell drives corral-core's [`LeaseHolder`]: after
//! every input, every output is drained: the one command goes to the store (its answer comes back
//! after a delay), each `Reset` goes to the worker (its evidence comes back), each `Delete` is
//! handed to the controller, each event is judged, and a wake-up is set for `poll_timeout`.
//!
//! Two faults live here: a zombie holder pauses with its command in hand for longer than its lease
//! and sends it when it resumes, with its old token; and a command is delivered twice, the second
//! time late (nobody hears that reply).

use corral_core::holder::{Ending, HolderEvent, LeaseHolder};
use corral_core::ids::{OpToken, WorkerId};
use corral_core::pool::{Applied, Command, Effect, Event};
use corral_core::reset::ResetEvidence;
use corral_core::time::MonoMillis;

use super::truth::LeaseEnd;
use super::{Actor, Ev, Requester, World};
use crate::faults::{Fault, Invariant};

impl World {
    /// Drains every output of `client`'s holder and sets its next wake-up.
    pub(super) fn drive_holder(&mut self, client: u64) {
        if self.client_paused_until(client).is_some() || self.client_ok(client).is_none() {
            return;
        }
        let Some(mut holder) = self.clients.get_mut(&client).and_then(|c| c.holder.take()) else {
            return;
        };
        let now = MonoMillis(self.now);
        // A shell that resumes first fires what fell due while it was away.
        if holder.poll_timeout().is_some_and(|at| at <= now) {
            holder.handle_timeout(now);
        }
        if let Some(command) = holder.poll_command() {
            if self.rng.chance(self.mix.rate(Fault::ZombieHolder) / 4) {
                self.stats.fault(Fault::ZombieHolder);
                let pause = self
                    .rng
                    .range(self.config.lease_ttl_ms, self.config.lease_ttl_ms * 2);
                let until = self.pause_end(pause);
                if let Some(c) = self.clients.get_mut(&client) {
                    c.paused_until = until;
                }
                self.schedule_at(until, Ev::HolderSend { client, command });
            } else {
                self.send_holder_command(client, &command);
            }
        }
        while let Some(effect) = holder.poll_effect() {
            match effect {
                Effect::Reset { worker, token } => {
                    let delay = self.latency();
                    self.schedule(
                        delay,
                        Ev::WorkerReset {
                            requester: Requester::Holder { client },
                            worker,
                            token,
                        },
                    );
                }
                // The API cannot delete: it hands the delete to the controller.
                Effect::Delete { .. } | Effect::Create { .. } => self.hand_off(effect),
            }
        }
        while let Some(event) = holder.poll_event() {
            self.holder_event(client, event);
        }
        assert!(
            holder.poll_effect().is_none() && holder.poll_event().is_none(),
            "the holder's outputs are drained"
        );
        let done = holder.is_done();
        let wake = holder.poll_timeout();
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        if !done {
            c.holder = Some(holder);
        }
        if let Some(at) = wake
            && !done
        {
            c.holder_generation += 1;
            let generation = c.holder_generation;
            self.schedule_at(at.0, Ev::HolderWake { client, generation });
        }
    }

    /// Commits a holder's command now; its answer reaches the holder after a delay. Sometimes the
    /// network delivers it a second time, late.
    fn send_holder_command(&mut self, client: u64, command: &Command) {
        let answer = self.commit(Actor::Holder(client), command);
        let delay = self.latency();
        self.schedule(delay, Ev::HolderAnswer { client, answer });
        self.maybe_duplicate(command);
    }

    /// A command delivered once more, later, with its old token; nobody hears the reply.
    pub(super) fn maybe_duplicate(&mut self, command: &Command) {
        if self.rng.chance(self.mix.rate(Fault::DuplicateReport)) {
            self.stats.fault(Fault::DuplicateReport);
            let late = self.rng.range(1_000, 20_000);
            self.schedule(
                late,
                Ev::Ghost {
                    command: command.clone(),
                },
            );
        }
    }

    pub(super) fn ghost(&mut self, command: Command) {
        let _ = self.commit(Actor::Ghost, &command);
    }

    /// An effect the sender cannot perform goes to the live controller, which performs it. With no
    /// controller it is lost, and the pool orders it again.
    fn hand_off(&mut self, effect: Effect) {
        if !self.controller.alive {
            return;
        }
        let now = MonoMillis(self.now);
        self.controller.machine.handle_handoff(effect, now);
        self.drive_controller();
    }

    pub(super) fn holder_wake(&mut self, client: u64, generation: u64) {
        let now = MonoMillis(self.now);
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        if c.holder_generation != generation {
            return;
        }
        if let Some(holder) = c.holder.as_mut() {
            holder.handle_timeout(now);
        }
        self.drive_holder(client);
    }

    pub(super) fn holder_answer(&mut self, client: u64, answer: Option<Applied>) {
        if self.client_ok(client).is_none() {
            return;
        }
        let now = MonoMillis(self.now);
        let Some(ticket) = self.clients.get(&client).map(|c| c.ticket) else {
            return;
        };
        let refused = answer.as_ref().is_some_and(|applied| {
            applied.events.iter().any(|event| match event {
                Event::Refused { ticket: t, .. } => *t == ticket,
                Event::LeaseLost { lease, .. } => *lease == ticket,
                _ => false,
            })
        });
        if let Some(holder) = self
            .clients
            .get_mut(&client)
            .and_then(|c| c.holder.as_mut())
        {
            holder.handle_committed(answer, now);
        }
        // A refusal or a loss of its lease means the lease is gone: the run must learn it now.
        let holds = self.holder_holds(client);
        self.check(Invariant::LossLearned, !(refused && holds), || {
            format!("client {client}'s lease {ticket} was refused or lost, and it still holds it")
        });
        self.drive_holder(client);
    }

    /// A zombie holder resumes and sends the command it held, old token and all.
    pub(super) fn holder_send(&mut self, client: u64, command: Command) {
        if self.client_ok(client).is_none() {
            return;
        }
        if let Some(c) = self.clients.get_mut(&client) {
            c.paused_until = self.now;
        }
        self.send_holder_command(client, &command);
    }

    pub(super) fn holder_reset_done(
        &mut self,
        client: u64,
        worker: WorkerId,
        token: OpToken,
        evidence: Option<ResetEvidence>,
    ) {
        if self.client_ok(client).is_none() {
            return;
        }
        let now = MonoMillis(self.now);
        if let Some(holder) = self
            .clients
            .get_mut(&client)
            .and_then(|c| c.holder.as_mut())
        {
            holder.handle_reset(worker, token, evidence, now);
        }
        self.drive_holder(client);
    }

    /// What the run learns. A lease the pool took away is never reported released.
    fn holder_event(&mut self, client: u64, event: HolderEvent) {
        self.note(|| format!("          client {client}: {event:?}"));
        let HolderEvent::Ended(Ending::Released) = event else {
            return;
        };
        let Some(ticket) = self.clients.get(&client).map(|c| c.ticket) else {
            return;
        };
        let ended = self.truth.leases.get(&ticket).and_then(|l| l.ended);
        self.check(
            Invariant::LossLearned,
            ended != Some(LeaseEnd::TakenOver),
            || format!("client {client} was told {ticket} was released, but the pool took it over"),
        );
    }

    /// Whether `client`'s holder still holds its lease (for the run's start).
    pub(super) fn holder_holds(&self, client: u64) -> bool {
        self.clients
            .get(&client)
            .and_then(|c| c.holder.as_ref())
            .is_some_and(LeaseHolder::holds)
    }
}
