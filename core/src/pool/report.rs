//! What the world reports: the outcome of creates, resets and deletes, the published image, and
//! the inventory's listing.

use std::collections::BTreeSet;

use super::config::{Mutation, PoolConfig};
use super::doc::{
    Applied, Effect, Event, Outcome, PoolDoc, Removal, RemovalReason, StateKind, Worker,
    WorkerState,
};
use crate::ids::{ImageId, OpToken, WorkerId};
use crate::reset::{self, ResetEvidence, Verdict};
use crate::time::UnixMillis;

impl PoolDoc {
    pub(super) fn create_reported(
        &mut self,
        worker: WorkerId,
        token: OpToken,
        outcome: Outcome,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        if !self.report_is_current(worker, token, |kind| kind == StateKind::Creating, out) {
            return;
        }
        match outcome {
            Outcome::Done => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.confirmed_at = Some(now);
                }
                self.become_warm(worker, now, config, out);
            }
            Outcome::Failed => self.forget(worker, out),
            Outcome::Unknown if config.broken(Mutation::AmbiguousFree) => self.forget(worker, out),
            Outcome::Unknown => {
                self.begin_removal(worker, RemovalReason::AmbiguousCreate, None, None, now, out)
            }
        }
    }

    pub(super) fn reset_reported(
        &mut self,
        worker: WorkerId,
        token: OpToken,
        evidence: &ResetEvidence,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let Some(found) = self.workers.get(&worker) else {
            out.events.push(Event::StaleReport { worker });
            return;
        };
        let expected = if config.broken(Mutation::ResetToken) {
            // The broken rule: believe whatever token the report carries, in any live state.
            if !matches!(found.state.kind(), StateKind::Resetting | StateKind::Leased) {
                out.events.push(Event::StaleReport { worker });
                return;
            }
            evidence.token
        } else {
            if found.state.kind() == StateKind::Resetting
                && found.token != token
                && config.broken(Mutation::DiscardClean)
            {
                // The broken rule: a stale report's verdict lands on the reset now running.
                self.begin_removal(
                    worker,
                    RemovalReason::ResetUnproven(reset::Unproven::TokenMismatch),
                    None,
                    None,
                    now,
                    out,
                );
                return;
            }
            if found.token != token || found.state.kind() != StateKind::Resetting {
                out.events.push(Event::StaleReport { worker });
                return;
            }
            found.token
        };
        let verdict = if config.broken(Mutation::PartialEvidence) {
            // The broken rule: only the run's surviving processes are looked at.
            let processes_only = ResetEvidence {
                workspace_entries: Some(0),
                scratch_entries: Some(0),
                mounts_remaining: Some(0),
                ..evidence.clone()
            };
            reset::judge(&processes_only, expected)
        } else {
            reset::judge(evidence, expected)
        };
        match verdict {
            Verdict::Clean => self.become_warm(worker, now, config, out),
            Verdict::Discard(unproven) => {
                self.begin_removal(
                    worker,
                    RemovalReason::ResetUnproven(unproven),
                    None,
                    None,
                    now,
                    out,
                );
            }
        }
    }

    /// A worker proven ready (created, or reset clean) is published warm, unless it was built from
    /// an image that is no longer the published one: then it retires.
    pub(super) fn become_warm(
        &mut self,
        worker: WorkerId,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let stale_image = self
            .workers
            .get(&worker)
            .is_some_and(|w| Some(&w.image) != self.image.as_ref());
        if stale_image {
            self.begin_removal(worker, RemovalReason::StaleImage, None, None, now, out);
            return;
        }
        self.set_state(worker, WorkerState::Warm, now, config);
        out.events.push(Event::WorkerWarm { worker });
        self.dispatch(now, config, out);
    }

    /// True when a report names a known worker, carries its current token and finds it in a state
    /// `expected` accepts; otherwise the report is stale, changes nothing, and says so.
    pub(super) fn report_is_current(
        &self,
        worker: WorkerId,
        token: OpToken,
        expected: impl Fn(StateKind) -> bool,
        out: &mut Applied,
    ) -> bool {
        let current = self
            .workers
            .get(&worker)
            .is_some_and(|w| w.token == token && expected(w.state.kind()));
        if !current {
            out.events.push(Event::StaleReport { worker });
        }
        current
    }

    pub(super) fn delete_reported(
        &mut self,
        worker: WorkerId,
        token: OpToken,
        outcome: Outcome,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let removing = |kind| matches!(kind, StateKind::Retiring | StateKind::Quarantined);
        if !self.report_is_current(worker, token, removing, out) {
            return;
        }
        match outcome {
            Outcome::Done => {
                self.forget(worker, out);
                self.dispatch(now, config, out);
            }
            Outcome::Unknown if config.broken(Mutation::UnknownDeleteDone) => {
                self.forget(worker, out);
                self.dispatch(now, config, out);
            }
            // Not confirmed: the worker stays counted and the delete is ordered again later.
            Outcome::Failed | Outcome::Unknown => {}
        }
    }

    pub(super) fn publish_image(
        &mut self,
        image: ImageId,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        self.image = Some(image);
        self.retire_stale_image(now, out);
        self.dispatch(now, config, out);
    }

    pub(super) fn inventory_observed(
        &mut self,
        as_of: UnixMillis,
        present: &BTreeSet<WorkerId>,
        now: UnixMillis,
        config: &PoolConfig,
        out: &mut Applied,
    ) {
        let as_of = as_of.min(now);
        // A listing older than one already applied arrived out of order: it proves nothing new,
        // and it could show workers since confirmed gone.
        if self.inventory_as_of.is_some_and(|seen| as_of < seen)
            && !config.broken(Mutation::OldListing)
        {
            return;
        }
        self.inventory_as_of = Some(self.inventory_as_of.map_or(as_of, |seen| seen.max(as_of)));
        // Unknown workers are never adopted on trust: counted, deleted, confirmed absent, freed.
        for id in present {
            match self.workers.get_mut(id) {
                Some(known) => {
                    known.confirmed_at = Some(known.confirmed_at.map_or(as_of, |c| c.max(as_of)));
                }
                None => self.adopt_orphan(*id, as_of, now, out),
            }
        }
        let absent: Vec<WorkerId> = self
            .workers
            .keys()
            .filter(|id| !present.contains(id))
            .copied()
            .collect();
        for id in absent {
            let Some(worker) = self.workers.get(&id) else {
                continue;
            };
            let proven_gone = match worker.state.removal() {
                Some(removal) => as_of > removal.absent_after,
                None => {
                    worker.state.kind() != StateKind::Creating
                        && worker.confirmed_at.is_some_and(|c| as_of > c)
                }
            };
            if !proven_gone {
                continue;
            }
            if let WorkerState::Leased(lease) = &worker.state {
                out.events.push(Event::LeaseLost {
                    lease: lease.id,
                    worker: id,
                    reason: RemovalReason::Orphan,
                });
            }
            self.forget(id, out);
        }
        self.dispatch(now, config, out);
    }

    pub(super) fn adopt_orphan(
        &mut self,
        id: WorkerId,
        as_of: UnixMillis,
        now: UnixMillis,
        out: &mut Applied,
    ) {
        let token = self.mint_token();
        let removal = Removal {
            reason: RemovalReason::Orphan,
            holds_member: None,
            lease: None,
            absent_after: as_of,
            delete_ordered_at: now,
        };
        let image = ImageId(String::from("unknown"));
        self.workers.insert(
            id,
            Worker {
                image,
                state: WorkerState::Quarantined(removal),
                token,
                since: now,
                confirmed_at: Some(as_of),
                claim_deadline: None,
                stack: false,
                leased: false,
            },
        );
        out.effects.push(Effect::Delete { worker: id, token });
        out.events.push(Event::WorkerRemoving {
            worker: id,
            reason: RemovalReason::Orphan,
        });
    }
}
