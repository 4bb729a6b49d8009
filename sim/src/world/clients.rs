//! The API replicas' clients: each arrives, takes a ticket, waits for its grant (reading the
//! document as the notification fallback does), hands the grant to a lease holder, runs its code
//! on the worker and ends the run. The lease itself is the holder's business (`holders`).

use corral_core::holder::{Grant, HolderConfig, LeaseHolder};
use corral_core::ids::{
    ActorId, ConversationId, LeaseNamespace, LeaseScope, MemberId, OpToken, TicketId, WorkerId,
};
use corral_core::pool::{Command, Event, StateKind, TicketStatus};
use corral_core::store::Loaded;
use corral_core::time::{MonoMillis, UnixMillis};

use super::{Actor, Client, ClientState, Ev, GrantSource, POLL_MS, SimMutation, World};
use crate::faults::Invariant;

impl World {
    pub(super) fn schedule_arrival(&mut self) {
        let gap = self.rng.range(1, self.arrival_gap_ms * 2);
        let client = self.next_client;
        self.next_client += 1;
        let replica = self.rng.range(0, self.replicas.len() as u64 - 1) as usize;
        let member = MemberId(format!("m{}", self.rng.range(0, self.members - 1)));
        let browser = self.rng.chance(150);
        let run_ms = if browser {
            self.rng.range(2_000, 40_000)
        } else if self.rng.chance(50) {
            self.rng.range(5_000, 30_000)
        } else {
            self.rng.range(20, 3_000)
        };
        // A browser session left idle holds its worker until the idle limit reaps it (BROW-6).
        let idles = browser && self.rng.chance(300);
        let wait_ms = self.rng.range(500, self.config.acquire_wait_ms + 5_000);
        let ticket = TicketId(self.rng.next_u64());
        // A third of the code runs use the data stack, as in issue 29's mixed burst (decision 0058).
        let stack = !browser && self.rng.chance(333);
        self.clients.insert(
            client,
            Client {
                replica,
                incarnation: self.replicas[replica].incarnation,
                member,
                namespace: if browser {
                    LeaseNamespace::Browser
                } else {
                    LeaseNamespace::Code
                },
                ticket,
                wait_ms,
                stack,
                run_ms,
                idles,
                arrived_at: self.now + gap,
                in_liveness: self.liveness,
                state: ClientState::Arriving,
                resolved_at: None,
                holder: None,
                holder_generation: 0,
                paused_until: 0,
            },
        );
        self.schedule(gap, Ev::ClientArrive { client });
    }

    fn local_now(&self, replica: usize) -> i64 {
        self.now as i64 + self.replicas[replica].skew_ms
    }

    /// The client's replica, while the incarnation that took the client in is alive.
    pub(super) fn client_ok(&self, client: u64) -> Option<usize> {
        let c = self.clients.get(&client)?;
        let r = &self.replicas[c.replica];
        (r.alive && r.incarnation == c.incarnation).then_some(c.replica)
    }

    fn resolve(&mut self, client: u64) {
        if let Some(c) = self.clients.get_mut(&client)
            && c.resolved_at.is_none()
        {
            c.resolved_at = Some(self.now);
        }
    }

    fn finish(&mut self, client: u64) {
        self.resolve(client);
        if let Some(c) = self.clients.get_mut(&client) {
            c.state = ClientState::Finished;
        }
    }

    pub(super) fn holder_config(&self) -> HolderConfig {
        HolderConfig::from_pool(&self.config)
    }

    pub(super) fn client_arrive(&mut self, client: u64) {
        if self
            .clients
            .get(&client)
            .is_some_and(|c| c.state == ClientState::Arriving)
        {
            if self.arrivals_open {
                self.schedule_arrival();
            }
            if let Some(c) = self.clients.get_mut(&client) {
                c.state = ClientState::Waiting;
            }
        }
        if self.defer_for_client(client, &Ev::ClientArrive { client }) {
            return;
        }
        let Some(replica) = self.client_ok(client) else {
            self.finish(client);
            return;
        };
        let c = &self.clients[&client];
        let command = Command::Acquire {
            ticket: c.ticket,
            member: c.member.clone(),
            scope: LeaseScope {
                namespace: c.namespace,
                actor: ActorId(c.member.0.clone()),
                conversation: ConversationId(format!("c{client}")),
            },
            wait_ms: c.wait_ms,
            stack: c.stack,
        };
        let ticket = c.ticket;
        match self.commit(Actor::Client(client), &command) {
            Some(applied) => match applied.answer(ticket) {
                Some(Event::Granted { worker, token, .. }) => {
                    self.grant_learned(client, *worker, *token);
                }
                Some(Event::Queued { .. }) => self.schedule(POLL_MS, Ev::ClientPoll { client }),
                // Refused (its reason judged where the write landed) or withdrawn.
                Some(_) | None => self.finish(client),
            },
            None if self.mutation == Some(SimMutation::StoreFallback) => {
                self.fallback_grant(client, replica)
            }
            None => {
                // Admission fails closed (coordination_unavailable). The acquire may have landed
                // without its answer: withdraw it, so that no grant waits for nobody.
                self.finish(client);
                self.withdraw(client);
            }
        }
    }

    /// The broken rule of the `store-fallback` mutation: with the store down, serve from this
    /// replica's own (stale) copy of the pool.
    fn fallback_grant(&mut self, client: u64, replica: usize) {
        let Some(cache) = self.replicas[replica].cache.clone() else {
            self.finish(client);
            return;
        };
        let warm = cache
            .workers()
            .iter()
            .find(|(_, w)| w.state.kind() == StateKind::Warm)
            .map(|(id, w)| (*id, w.token));
        match warm {
            Some((worker, token)) => {
                self.resolve(client);
                let delay = self.latency();
                self.schedule(
                    delay,
                    Ev::RunStart {
                        client,
                        worker,
                        token,
                        granted_at: UnixMillis(self.now),
                        source: GrantSource::Fallback,
                    },
                );
            }
            None => self.finish(client),
        }
    }

    pub(super) fn client_poll(&mut self, client: u64) {
        if self.defer_for_client(client, &Ev::ClientPoll { client }) {
            return;
        }
        let Some(replica) = self.client_ok(client) else {
            return;
        };
        let (ticket, deadline_local) = {
            let c = &self.clients[&client];
            (c.ticket, c.arrived_at as i64 + c.wait_ms as i64)
        };
        if self.local_now(replica) > deadline_local {
            // The caller gives up: withdraw the ticket, or release a lease it got meanwhile.
            self.finish(client);
            self.withdraw(client);
            return;
        }
        let doc = match self.load() {
            Ok(Loaded::Found { doc, .. }) => doc,
            // The document is gone with the store's data (or outlived a restart, and its next
            // write replaces it): so is the ticket.
            Ok(Loaded::Absent | Loaded::Outlived { .. }) => {
                self.finish(client);
                return;
            }
            Err(_) => {
                self.schedule(POLL_MS, Ev::ClientPoll { client });
                return;
            }
        };
        match doc.ticket_status(ticket) {
            TicketStatus::Granted { worker, token, .. } => {
                self.grant_learned(client, worker, token)
            }
            TicketStatus::Queued { .. } => self.schedule(POLL_MS, Ev::ClientPoll { client }),
            TicketStatus::Gone => self.finish(client),
        }
    }

    /// The client learned its grant: a holder takes the lease, and the code goes to the worker.
    fn grant_learned(&mut self, client: u64, worker: WorkerId, token: OpToken) {
        self.resolve(client);
        let config = self.holder_config();
        let now = MonoMillis(self.now);
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        let grant = Grant {
            ticket: c.ticket,
            worker,
            token,
        };
        // The acquire went out when the client arrived: the grant is no older.
        c.holder = Some(LeaseHolder::granted(
            grant,
            MonoMillis(c.arrived_at),
            config,
            now,
        ));
        c.state = ClientState::Leased;
        let granted_at = self
            .truth
            .leases
            .get(&grant.ticket)
            .map_or(UnixMillis(0), |l| l.renewed_at);
        let delay = self.latency();
        self.schedule(
            delay,
            Ev::RunStart {
                client,
                worker,
                token,
                granted_at,
                source: GrantSource::Store,
            },
        );
        self.drive_holder(client);
    }

    /// The client stopped waiting: a holder withdraws its ticket.
    fn withdraw(&mut self, client: u64) {
        let config = self.holder_config();
        let now = MonoMillis(self.now);
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        c.holder = Some(LeaseHolder::withdrawing(c.ticket, config, now));
        self.drive_holder(client);
    }

    pub(super) fn run_start(
        &mut self,
        client: u64,
        worker: WorkerId,
        token: OpToken,
        granted_at: UnixMillis,
        source: GrantSource,
    ) {
        let Some(c) = self.clients.get(&client) else {
            return;
        };
        let (ticket, member, run_ms, idles) = (c.ticket, c.member.clone(), c.run_ms, c.idles);
        let browser = c.namespace == LeaseNamespace::Browser;
        let holds = self.holder_holds(client);
        if source == GrantSource::Store && (self.client_ok(client).is_none() || !holds) {
            // The replica is gone, or the lease was lost before the code was sent: nothing runs.
            self.finish(client);
            return;
        }
        self.check(
            Invariant::NoGrantWithoutStore,
            source == GrantSource::Store,
            || format!("{ticket} served on {worker} without the store"),
        );
        if let Some(deadline) = self.truth.ticket_deadline.get(&ticket).copied() {
            self.check(
                Invariant::NoGrantAfterDeadline,
                granted_at <= deadline,
                || format!("{ticket} granted at {granted_at} after its deadline {deadline}"),
            );
        }
        // Condemned before the grant: the pool handed out a worker it had ordered deleted.
        let condemned = self
            .truth
            .condemned
            .get(&worker)
            .is_some_and(|at| *at <= granted_at.0);
        self.check(Invariant::NoReassignOfCondemned, !condemned, || {
            format!("{worker}, ordered deleted, granted to {ticket}")
        });
        let Some(truth) = self.workers.get(&worker) else {
            // The worker died meanwhile: the run fails with a clear error and the lease is
            // discarded; nothing is violated.
            self.schedule(
                0,
                Ev::RunEnded {
                    client,
                    worker,
                    discard: true,
                },
            );
            return;
        };
        let (tenant, dirty) = (truth.tenant, truth.dirty);
        self.check(Invariant::SingleTenant, tenant.is_none(), || {
            format!("{worker} granted to client {client} while client {tenant:?} executes there")
        });
        self.check(Invariant::CleanHandoff, !dirty, || {
            format!("{worker} handed to client {client} without a clean reset")
        });
        let running = self
            .workers
            .values()
            .filter_map(|w| w.tenant)
            .filter(|t| self.clients.get(t).is_some_and(|o| o.member == member))
            .count() as u32;
        let limit = self.config.max_per_member;
        self.check(Invariant::MemberLimit, running < limit, || {
            format!(
                "member {} would run {} at once, limit {limit}",
                member.0,
                running + 1
            )
        });
        if let Some(truth) = self.workers.get_mut(&worker) {
            truth.tenant = Some(client);
            truth.dirty = true;
        }
        if browser {
            self.open_session(client, worker, token, run_ms, idles);
        } else {
            self.schedule(run_ms, Ev::RunEnd { client, worker });
        }
    }

    /// The code finished on the worker (or died with it). The worker's side happens now; the
    /// client's shell learns it after a delay.
    ///
    /// A browser session's close may go unconfirmed (BROW-13): the worker stopped answering
    /// before it proved its processes gone, so it is left dirty and its holder discards it; the
    /// pool must never hand it out again (`WarmIsClean`, `CleanHandoff`).
    pub(super) fn run_end(&mut self, client: u64, worker: WorkerId) {
        let browser = self
            .clients
            .get(&client)
            .is_some_and(|c| c.namespace == LeaseNamespace::Browser);
        let unconfirmed = browser && self.rng.chance(200);
        if browser {
            self.session_ended(client);
        }
        let mut died = true;
        if let Some(truth) = self.workers.get_mut(&worker)
            && truth.tenant == Some(client)
        {
            truth.tenant = None;
            truth.dirty |= unconfirmed;
            died = false;
        }
        let delay = self.latency();
        self.schedule(
            delay,
            Ev::RunEnded {
                client,
                worker,
                discard: died || unconfirmed,
            },
        );
    }

    /// The client's shell learns the run ended: its holder releases the lease, resetting the
    /// worker, or discarding it when the worker died under the run (nobody can vouch for it).
    pub(super) fn run_ended(&mut self, client: u64, worker: WorkerId, discard: bool) {
        let _ = worker;
        self.finish(client);
        if self.client_ok(client).is_none() {
            return;
        }
        let disposition = if discard {
            corral_core::pool::Disposition::Discard
        } else {
            corral_core::pool::Disposition::Reset
        };
        let now = MonoMillis(self.now);
        if let Some(holder) = self
            .clients
            .get_mut(&client)
            .and_then(|c| c.holder.as_mut())
        {
            holder.handle_release(disposition, now);
        }
        self.drive_holder(client);
    }
}
