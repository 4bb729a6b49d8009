//! Browser sessions as corral-core rules them (BROW-6, BROW-13, BROW-14): a session held in the
//! deployment's store beside its lease, an agent whose calls pass `browser::judge_call` and touch
//! its last activity on the deployment clock, and every replica's sweep that claims the close of
//! a session `browser::is_idle` finds idle, whatever the replica's own clock says. An agent may
//! leave its session idle and come back: just before the limit, or during the close a sweep
//! claimed.

use corral_core::browser::{Action, Call, SessionRecord, SessionState, is_idle, judge_call};
use corral_core::ids::{OpToken, WorkerId};
use corral_core::store::PoolStore;
use corral_core::time::UnixMillis;

use super::{BROWSER_IDLE_MS, Ev, World};
use crate::faults::Invariant;

/// How often each replica sweeps for idle sessions: a tenth of the idle limit, as the API does.
pub(super) const BROWSER_SWEEP_MS: u64 = BROWSER_IDLE_MS / 10;

/// The conversation every simulated session belongs to (its actor is the client's member).
const CONVERSATION: &str = "c";

/// A live session, as the store holds it, with what really happened to it.
pub(super) struct SimSession {
    worker: WorkerId,
    record: SessionRecord,
    state: SessionState,
    /// Deployment time of the last call that reached the worker.
    last_reached: u64,
    /// Until when the agent keeps calling; then it closes, or leaves the session idle.
    active_until: u64,
    /// Whether the agent leaves it idle, and whether it came back since.
    idles: bool,
    came_back: bool,
}

impl World {
    /// The client's lease is on `worker`: its session opens, and the agent starts calling.
    pub(super) fn open_session(
        &mut self,
        client: u64,
        worker: WorkerId,
        token: OpToken,
        active_ms: u64,
        idles: bool,
    ) {
        let Some(c) = self.clients.get(&client) else {
            return;
        };
        let record = SessionRecord {
            actor: c.member.0.clone(),
            conversation: CONVERSATION.to_owned(),
            worker,
            token,
            networked: false,
            owner: format!("replica-{}", c.replica),
            live_view: None,
        };
        self.sessions.insert(
            client,
            SimSession {
                worker,
                record,
                state: SessionState {
                    private: false,
                    last_activity: UnixMillis(self.now),
                    closing: None,
                },
                last_reached: self.now,
                active_until: self.now + active_ms,
                idles,
                came_back: false,
            },
        );
        let gap = self.rng.range(200, 3_000);
        self.schedule(gap, Ev::BrowserAct { client });
    }

    /// The agent calls its session: the call reaches the worker only if the one rule lets it.
    pub(super) fn browser_act(&mut self, client: u64) {
        if self.client_ok(client).is_none() {
            // The replica that served the agent is gone: its calls stop, the sweep reaps it.
            return;
        }
        let Some(member) = self.clients.get(&client).map(|c| c.member.0.clone()) else {
            return;
        };
        let action = Action::Scroll { dx: 0, dy: 120 };
        let stored = self.sessions.get(&client).map(|s| (&s.record, &s.state));
        if judge_call(stored, &member, CONVERSATION, Call::Act(&action)).is_err() {
            // Gone or closing: the agent is told so, and nothing reaches the worker.
            return;
        }
        let now = self.now;
        let Some(session) = self.sessions.get_mut(&client) else {
            return;
        };
        let (worker, closing) = (session.worker, session.state.closing);
        session.state.last_activity = UnixMillis(now);
        session.last_reached = now;
        self.check(Invariant::NoCallAfterClose, closing.is_none(), || {
            format!("a call on client {client}'s session reached {worker}, whose close was claimed at {closing:?}")
        });
        let alive = self
            .workers
            .get(&worker)
            .is_some_and(|w| w.tenant == Some(client));
        let Some(session) = self.sessions.get_mut(&client) else {
            return;
        };
        if !alive || (now >= session.active_until && (!session.idles || session.came_back)) {
            // Done (or its worker is gone): the agent closes the session.
            self.claim_close(client);
        } else if now >= session.active_until {
            // Left idle: the agent comes back a little before the limit, or around the sweep
            // that reaps it, or while that close is under way.
            session.came_back = true;
            let back = self.rng.range(
                BROWSER_IDLE_MS - BROWSER_SWEEP_MS,
                BROWSER_IDLE_MS + 3 * BROWSER_SWEEP_MS,
            );
            self.schedule(back, Ev::BrowserAct { client });
        } else {
            let gap = self.rng.range(200, 3_000);
            self.schedule(gap, Ev::BrowserAct { client });
        }
    }

    /// One replica's sweep: every session idle on the deployment clock has its close claimed,
    /// and only those.
    pub(super) fn browser_sweep(&mut self, replica: usize) {
        self.schedule(BROWSER_SWEEP_MS, Ev::BrowserSweep { replica });
        let r = &self.replicas[replica];
        if !r.alive || r.paused_until > self.now {
            return;
        }
        // The deployment clock is the store's; a replica that cannot read it sweeps nothing.
        let Ok(now) = self.store.now() else {
            return;
        };
        let live: Vec<(u64, bool, u64)> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.state.closing.is_none())
            .map(|(client, s)| {
                let idle = is_idle(&s.state, now, BROWSER_IDLE_MS / 1_000);
                (*client, idle, self.now - s.last_reached)
            })
            .collect();
        for (client, idle, quiet_ms) in live {
            let truly = quiet_ms >= BROWSER_IDLE_MS;
            self.check(Invariant::IdleReapExact, idle == truly, || {
                format!(
                    "client {client}'s session, quiet for {quiet_ms} ms against a limit of \
                     {BROWSER_IDLE_MS} ms, {} by replica {replica}'s sweep",
                    if idle {
                        "reaped"
                    } else {
                        "left holding its worker"
                    }
                )
            });
            if idle {
                self.claim_close(client);
            }
        }
    }

    /// Claims the close of `client`'s session (the first claim wins) and closes it: the worker
    /// stops the browser and the lease is released.
    fn claim_close(&mut self, client: u64) {
        let now = self.now;
        let Some(session) = self.sessions.get_mut(&client) else {
            return;
        };
        if session.state.closing.is_some() {
            return;
        }
        session.state.closing = Some(UnixMillis(now));
        let worker = session.worker;
        let close_ms = self.rng.range(200, 3_000);
        self.schedule(close_ms, Ev::RunEnd { client, worker });
    }

    /// The session's close ended on the worker: the store forgets it.
    pub(super) fn session_ended(&mut self, client: u64) {
        self.sessions.remove(&client);
    }
}
