//! Every change of a worker's state: fresh tokens, removal, forgetting, and the table of legal
//! transitions.

use super::config::PoolConfig;
use super::doc::{Applied, Effect, Event, PoolDoc, Removal, RemovalReason, WorkerState};
use crate::ids::{LeaseId, MemberId, OpToken, WorkerId};
use crate::time::UnixMillis;

/// Removal is either by plan (retire) or for cause (quarantine).
#[derive(Clone, Copy, PartialEq, Eq)]
enum RemovalKind {
    Retire,
    Quarantine,
}

impl RemovalKind {
    fn for_reason(reason: RemovalReason) -> Self {
        if reason.is_for_cause() {
            Self::Quarantine
        } else {
            Self::Retire
        }
    }
}

impl PoolDoc {
    pub(super) fn begin_removal(
        &mut self,
        id: WorkerId,
        reason: RemovalReason,
        holds_member: Option<MemberId>,
        lease: Option<LeaseId>,
        now: UnixMillis,
        out: &mut Applied,
    ) {
        let removal = Removal {
            reason,
            holds_member,
            lease,
            absent_after: now,
            delete_ordered_at: now,
        };
        let state = match RemovalKind::for_reason(reason) {
            RemovalKind::Retire => WorkerState::Retiring(removal),
            RemovalKind::Quarantine => WorkerState::Quarantined(removal),
        };
        let token = self.enter_state(id, state, now, true);
        out.effects.push(Effect::Delete { worker: id, token });
        out.events
            .push(Event::WorkerRemoving { worker: id, reason });
    }

    /// Removes a worker from the document: its capacity is free.
    pub(super) fn forget(&mut self, id: WorkerId, out: &mut Applied) {
        if self.workers.remove(&id).is_some() {
            out.events.push(Event::WorkerGone { worker: id });
        }
    }

    pub(super) fn mint_token(&mut self) -> OpToken {
        let token = OpToken(self.next_token);
        self.next_token += 1;
        token
    }

    /// Moves a worker to `state` with a fresh token, asserting the transition is legal.
    pub(super) fn set_state(
        &mut self,
        id: WorkerId,
        state: WorkerState,
        now: UnixMillis,
        config: &PoolConfig,
    ) -> OpToken {
        self.enter_state(id, state, now, !config.any_broken())
    }

    /// Every state change goes through here: a fresh token, the entry time, and (unless the
    /// simulator broke a rule on purpose) the table of legal transitions.
    pub(super) fn enter_state(
        &mut self,
        id: WorkerId,
        state: WorkerState,
        now: UnixMillis,
        check_legal: bool,
    ) -> OpToken {
        let token = self.mint_token();
        let Some(worker) = self.workers.get_mut(&id) else {
            unreachable!("state change for unknown worker {id}");
        };
        let (from, to) = (worker.state.kind(), state.kind());
        assert!(
            !check_legal || from.may_become(to),
            "illegal transition {} -> {} for {id}",
            from.code(),
            to.code()
        );
        worker.state = state;
        worker.token = token;
        worker.since = now;
        token
    }
}
