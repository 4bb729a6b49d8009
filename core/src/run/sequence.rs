//! The order of one `run_code`, as a machine (ISO-1, KER-4, POOL-3): which step comes next, what
//! a failed step leaves, and how the lease and a persistent kernel's session end.
//!
//! The API's run path performs what this machine returns and tells it what happened; it decides
//! nothing of the order itself. One run is:
//!
//! ```text
//! Scope ─┬─ (persistent cell, affinity mode) TakeSession ─┬─ Busy ───────────────────── Answer
//!        │                                                 ├─ Session ──┐
//!        │                                                 └─ Absent ───┤
//!        └──────────────────────────────────────────────────────────────┴─ Acquire (≤ LEASES_MAX)
//!   ReadInputs → Project (when scoped) → Execute → Keep → Link (when scoped and succeeded)
//!   → the lease released (or held on by the session) → the session ended or kept → Answer
//! ```
//!
//! What the machine guarantees, whatever the shell reports (tested below over every order of
//! events): code is executed only under a lease; every lease acquired is released or held on
//! exactly once, before the answer; a worker that could not be reached is discarded and the run
//! taken to another, at most [`LEASES_MAX`] leases in all; a worker that stopped answering during
//! the run, or refused after something ran, is discarded, never reset on hope; a claimed session
//! is put back or ended exactly once; and there is exactly one answer, the last effect.

use crate::pool::Disposition;

/// How many leases one request may take: a worker that refuses the connection never saw the code,
/// so it is discarded and the run taken to the next, at most this many in all.
pub const LEASES_MAX: u32 = 3;

/// Why a persistent kernel's session (KER-4) ended, as the next cell's answer says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnded {
    /// Its worker could not be reached.
    Unreachable,
    /// Its worker was discarded (or its lease lost) after its last cell.
    Discarded,
    /// Its checkpoint was refused; nothing could ever remove it from the session.
    CheckpointRefused,
}

impl SessionEnded {
    /// What the model reads.
    #[must_use]
    pub const fn message(self) -> &'static str {
        match self {
            Self::Unreachable => "the kernel's worker could not be reached; its state with it",
            Self::Discarded => {
                "the kernel's worker was discarded after its last cell; its state with it"
            }
            Self::CheckpointRefused => {
                "the kernel's checkpoint was refused; the session ended, and this kernel starts empty"
            }
        }
    }
}

/// What the shell does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Read the turn's scope at admission, before any lease (PROJ-2); answer [`Event::Scoped`].
    Scope,
    /// Take this conversation's kernel slot (KER-4); answer [`Event::SessionTaken`].
    TakeSession,
    /// Take a lease from the pool within the request's one wait; answer [`Event::Acquired`] or
    /// [`Event::AcquireRefused`].
    Acquire,
    /// Read the run's egress grant and its workspace; answer [`Event::InputsRead`].
    ReadInputs,
    /// Project the run's documents (PROJ-1); answer [`Event::Projected`].
    Project,
    /// Execute on the leased worker; answer [`Event::Executed`].
    Execute,
    /// Plan what may be kept, keep it, decide the outcome; answer [`Event::Kept`].
    Keep,
    /// Link a succeeded run's outputs into its room (OUT-1); answer [`Event::Linked`].
    Link,
    /// Say whether the lease held for the session was lost; answer [`Event::LeaseChecked`].
    CheckLease,
    /// End the lease held, this way.
    Release(Disposition),
    /// Put the session back with the lease held and the workspace the cell left.
    HoldSession,
    /// End the claimed session, saying why when there is a reason the next cell must read.
    EndSession(Option<SessionEnded>),
    /// Answer the caller. Always the last effect.
    Answer(Answer),
}

/// Which answer the run ends with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The refusal of the step that failed (its scope, a lease, its inputs or its projection):
    /// the shell built it when it reported the failure.
    Refusal,
    /// Another cell of this kernel is running (`kernel_busy`).
    KernelBusy,
    /// No leased worker could be reached: the code did not run (`worker_lost`).
    Unreachable,
    /// The worker stopped answering, or answered nonsense, during the run (`worker_lost`).
    WorkerLost,
    /// The worker refused the run.
    WorkerRefused,
    /// The dependencies failed to install: answered with their record (PKG-6).
    DependenciesFailed,
    /// The outcome decided from the worker's reply and what was kept.
    Decided,
}

/// How a worker call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// The worker replied.
    Answered,
    /// The worker refused the connection: it never saw the code.
    Unreachable,
    /// It stopped answering during the run, or answered nonsense: nobody can vouch for it.
    Lost,
    /// It refused the run, before anything ran or not.
    Refused {
        /// Whether the refusal came before anything ran (the worker is as it was).
        before_anything_ran: bool,
    },
}

/// What became of a taken kernel slot (KER-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Another cell of this kernel runs.
    Busy,
    /// This cell runs on the session's lease; `archive` says whether it retained a workspace.
    Session {
        /// The session retained a workspace.
        archive: bool,
    },
    /// There is no session: the cell leases anywhere and may start one.
    Absent,
}

/// What the kept run left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The decided outcome is `succeeded`.
    pub succeeded: bool,
    /// Its dependencies failed to install (nothing ran, nothing kept).
    pub install_failed: bool,
    /// Its kernel's checkpoint was refused (corrupt, untrusted or incompatible).
    pub checkpoint_refused: bool,
    /// Keeping retained a workspace beside the lease (affinity mode).
    pub retained: bool,
}

/// What the shell tells the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The turn's scope was read: `Some(scoped)` (whether the authority knows its room), or
    /// `None`, refused (the shell holds the refusal).
    Scoped(Option<bool>),
    /// The kernel slot was taken.
    SessionTaken(Taken),
    /// A lease was granted.
    Acquired,
    /// No lease: refused or the wait ran out (the shell holds the refusal).
    AcquireRefused,
    /// The inputs were read (`true`), or the workspace could not be (the shell holds the refusal).
    InputsRead(bool),
    /// The documents were projected (`true`), or refused (the shell holds the refusal).
    Projected(bool),
    /// The worker call ended.
    Executed(Call),
    /// What may be kept was kept and the outcome decided.
    Kept(Kept),
    /// The outputs were linked.
    Linked,
    /// Whether the session's lease was lost while it was held.
    LeaseChecked {
        /// It was lost.
        lost: bool,
    },
}

/// A shell reported an event the machine did not ask for: a defect of the shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unexpected {
    /// What the machine was waiting for.
    pub pending: Option<Effect>,
    /// What it was told.
    pub event: Event,
}

/// How the session's workspace goes on after a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retained {
    /// A workspace to continue from.
    Archive,
    /// Nothing.
    Nothing,
    /// The session must end, for this reason.
    End(SessionEnded),
}

/// One `run_code`'s sequence. [`Sequence::start`] gives the first effects; each event the shell
/// reports gives the next, until [`Effect::Answer`].
#[derive(Clone, Debug)]
pub struct Sequence {
    /// A persistent cell in affinity mode (KER-4).
    affinity: bool,
    /// The turn's room is known: documents are projected and outputs linked.
    scoped: bool,
    /// A kernel slot was claimed: it must be put back or ended.
    claimed: bool,
    /// The session taken retained a workspace.
    session_archive: bool,
    /// The lease held is the session's (an unreachable worker does not count against the
    /// request's leases).
    on_session: bool,
    /// Leases taken from the pool.
    leases: u32,
    /// Whether a lease is held now.
    holding: bool,
    /// The effect whose event is awaited.
    pending: Option<Effect>,
    /// How the lease ends, the answer, and what is retained, once decided.
    ending: Option<(Disposition, Retained, Answer)>,
}

impl Sequence {
    /// A run; `affinity` when it is a persistent cell whose session is held by this replica
    /// (KER-4: persistent kernel, no workspace persistence). Returns its first effects.
    #[must_use]
    pub fn start(affinity: bool) -> (Self, Vec<Effect>) {
        let mut sequence = Self {
            affinity,
            scoped: false,
            claimed: false,
            session_archive: false,
            on_session: false,
            leases: 0,
            holding: false,
            pending: None,
            ending: None,
        };
        let first = sequence.ask(Effect::Scope);
        (sequence, first)
    }

    /// Whether a lease is held now.
    #[must_use]
    pub fn holding(&self) -> bool {
        self.holding
    }

    /// Whether the cell runs on its kernel's session (KER-4): from a taken session until its
    /// worker proves unreachable (the session goes with it; the cell starts empty elsewhere).
    #[must_use]
    pub fn on_session(&self) -> bool {
        self.on_session
    }

    /// The next effects after `event`.
    ///
    /// # Errors
    /// [`Unexpected`] when `event` does not answer the effect awaited.
    pub fn on(&mut self, event: Event) -> Result<Vec<Effect>, Unexpected> {
        let unexpected = Unexpected {
            pending: self.pending,
            event,
        };
        let Some(awaited) = self.pending.take() else {
            return Err(unexpected);
        };
        let next = match (awaited, event) {
            (Effect::Scope, Event::Scoped(None)) => Self::answer(Answer::Refusal),
            (Effect::Scope, Event::Scoped(Some(scoped))) => {
                self.scoped = scoped;
                let first = if self.affinity {
                    Effect::TakeSession
                } else {
                    Effect::Acquire
                };
                self.ask(first)
            }
            (Effect::TakeSession, Event::SessionTaken(taken)) => self.taken(taken),
            (Effect::Acquire, Event::Acquired) => {
                self.leases += 1;
                self.holding = true;
                self.ask(Effect::ReadInputs)
            }
            (Effect::Acquire, Event::AcquireRefused) => self.unleased(Answer::Refusal),
            (Effect::ReadInputs, Event::InputsRead(true)) => self.ask(if self.scoped {
                Effect::Project
            } else {
                Effect::Execute
            }),
            (Effect::ReadInputs, Event::InputsRead(false))
            | (Effect::Project, Event::Projected(false)) => {
                self.end(Disposition::Reset, Retained::Nothing, Answer::Refusal)
            }
            (Effect::Project, Event::Projected(true)) => self.ask(Effect::Execute),
            (Effect::Execute, Event::Executed(call)) => self.executed(call),
            (Effect::Keep, Event::Kept(kept)) => self.kept(kept),
            (Effect::Link, Event::Linked) => self.settle_or_check(),
            (Effect::CheckLease, Event::LeaseChecked { lost }) => self.settle(lost),
            _ => {
                self.pending = Some(awaited);
                return Err(unexpected);
            }
        };
        Ok(next)
    }

    /// Asks for `effect`, whose event comes next.
    fn ask(&mut self, effect: Effect) -> Vec<Effect> {
        self.pending = Some(effect);
        vec![effect]
    }

    fn answer(answer: Answer) -> Vec<Effect> {
        vec![Effect::Answer(answer)]
    }

    fn taken(&mut self, taken: Taken) -> Vec<Effect> {
        match taken {
            // No claim was taken: the running cell holds it.
            Taken::Busy => Self::answer(Answer::KernelBusy),
            Taken::Session { archive } => {
                self.claimed = true;
                self.session_archive = archive;
                self.on_session = true;
                self.holding = true;
                self.ask(Effect::ReadInputs)
            }
            Taken::Absent => {
                self.claimed = true;
                self.ask(Effect::Acquire)
            }
        }
    }

    /// Answers without a lease held: the claimed session, if any, ends with nothing to say.
    fn unleased(&mut self, answer: Answer) -> Vec<Effect> {
        let mut effects = Vec::new();
        if self.claimed {
            effects.push(Effect::EndSession(None));
        }
        effects.push(Effect::Answer(answer));
        effects
    }

    fn executed(&mut self, call: Call) -> Vec<Effect> {
        match call {
            Call::Answered => self.ask(Effect::Keep),
            Call::Unreachable => {
                // It never saw the code: discarded, and the run taken to another worker.
                self.holding = false;
                let mut effects = vec![Effect::Release(Disposition::Discard)];
                if self.on_session {
                    // The session is gone with its worker; the cell starts empty elsewhere.
                    self.on_session = false;
                    self.session_archive = false;
                } else if self.leases >= LEASES_MAX {
                    effects.extend(self.unleased(Answer::Unreachable));
                    return effects;
                }
                effects.extend(self.ask(Effect::Acquire));
                effects
            }
            Call::Lost => self.end(Disposition::Discard, Retained::Nothing, Answer::WorkerLost),
            Call::Refused {
                before_anything_ran,
            } => {
                let disposition = if before_anything_ran {
                    Disposition::Reset
                } else {
                    Disposition::Discard
                };
                self.end(disposition, Retained::Nothing, Answer::WorkerRefused)
            }
        }
    }

    fn kept(&mut self, kept: Kept) -> Vec<Effect> {
        // PKG-6: a failed install ran nothing and kept nothing, whatever else it reports.
        let (retained, answer) = if kept.install_failed {
            (Retained::Nothing, Answer::DependenciesFailed)
        } else if kept.checkpoint_refused {
            (
                Retained::End(SessionEnded::CheckpointRefused),
                Answer::Decided,
            )
        } else if kept.retained {
            (Retained::Archive, Answer::Decided)
        } else {
            (Retained::Nothing, Answer::Decided)
        };
        self.ending = Some((Disposition::Reset, retained, answer));
        if kept.succeeded && self.scoped {
            return self.ask(Effect::Link);
        }
        self.settle_or_check()
    }

    /// The lease held ends this way, with this answer.
    fn end(&mut self, disposition: Disposition, retained: Retained, answer: Answer) -> Vec<Effect> {
        self.ending = Some((disposition, retained, answer));
        self.settle_or_check()
    }

    /// A claimed session needs to know whether its lease was lost; anything else settles now.
    fn settle_or_check(&mut self) -> Vec<Effect> {
        if self.claimed {
            self.ask(Effect::CheckLease)
        } else {
            self.settle(false)
        }
    }

    /// Ends the lease and the session as decided, and answers.
    fn settle(&mut self, lost: bool) -> Vec<Effect> {
        let (disposition, retained, answer) = self.ending.take().unwrap_or((
            Disposition::Discard,
            Retained::Nothing,
            Answer::WorkerLost,
        ));
        self.holding = false;
        if !self.claimed {
            return vec![Effect::Release(disposition), Effect::Answer(answer)];
        }
        // A cell that kept nothing changed nothing: a session goes on from what it retained.
        let retained = match retained {
            Retained::Nothing if self.on_session && self.session_archive => Retained::Archive,
            other => other,
        };
        let session = match retained {
            Retained::Archive if disposition == Disposition::Reset && !lost => {
                return vec![Effect::HoldSession, Effect::Answer(answer)];
            }
            Retained::End(reason) => Some(reason),
            Retained::Archive | Retained::Nothing => {
                (disposition == Disposition::Discard || lost).then_some(SessionEnded::Discarded)
            }
        };
        vec![
            Effect::Release(disposition),
            Effect::EndSession(session),
            Effect::Answer(answer),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Drives a sequence to its answer, each awaited effect answered by `pick`; returns every
    /// effect in order.
    fn drive(affinity: bool, mut pick: impl FnMut(Effect) -> Event) -> Vec<Effect> {
        let (mut sequence, mut queue) = Sequence::start(affinity);
        let mut all = Vec::new();
        while let Some(effect) = queue.first().copied() {
            queue.remove(0);
            all.push(effect);
            if matches!(
                effect,
                Effect::Release(_)
                    | Effect::HoldSession
                    | Effect::EndSession(_)
                    | Effect::Answer(_)
            ) {
                continue;
            }
            let next = sequence
                .on(pick(effect))
                .expect("the event answers the effect");
            queue.extend(next);
        }
        all
    }

    fn happy(effect: Effect) -> Event {
        match effect {
            Effect::Scope => Event::Scoped(Some(true)),
            Effect::TakeSession => Event::SessionTaken(Taken::Absent),
            Effect::Acquire => Event::Acquired,
            Effect::ReadInputs => Event::InputsRead(true),
            Effect::Project => Event::Projected(true),
            Effect::Execute => Event::Executed(Call::Answered),
            Effect::Keep => Event::Kept(Kept {
                succeeded: true,
                install_failed: false,
                checkpoint_refused: false,
                retained: true,
            }),
            Effect::Link => Event::Linked,
            Effect::CheckLease => Event::LeaseChecked { lost: false },
            other => panic!("{other:?} has no event"),
        }
    }

    #[test]
    fn a_run_goes_scope_lease_inputs_project_execute_keep_link_release_answer() {
        assert_eq!(
            drive(false, happy),
            [
                Effect::Scope,
                Effect::Acquire,
                Effect::ReadInputs,
                Effect::Project,
                Effect::Execute,
                Effect::Keep,
                Effect::Link,
                Effect::Release(Disposition::Reset),
                Effect::Answer(Answer::Decided),
            ]
        );
    }

    #[test]
    fn iso_1_an_unreachable_worker_is_discarded_and_the_run_taken_to_another_at_most_leases_max() {
        let effects = drive(false, |effect| match effect {
            Effect::Execute => Event::Executed(Call::Unreachable),
            other => happy(other),
        });
        let acquires = effects.iter().filter(|e| **e == Effect::Acquire).count();
        assert_eq!(acquires, LEASES_MAX as usize);
        let discards = effects
            .iter()
            .filter(|e| **e == Effect::Release(Disposition::Discard))
            .count();
        assert_eq!(discards, LEASES_MAX as usize);
        assert_eq!(effects.last(), Some(&Effect::Answer(Answer::Unreachable)));
    }

    #[test]
    fn a_worker_lost_mid_run_or_refusing_after_the_code_ran_is_discarded_never_reset() {
        for (call, disposition, answer) in [
            (Call::Lost, Disposition::Discard, Answer::WorkerLost),
            (
                Call::Refused {
                    before_anything_ran: false,
                },
                Disposition::Discard,
                Answer::WorkerRefused,
            ),
            (
                Call::Refused {
                    before_anything_ran: true,
                },
                Disposition::Reset,
                Answer::WorkerRefused,
            ),
        ] {
            let effects = drive(false, |effect| match effect {
                Effect::Execute => Event::Executed(call),
                other => happy(other),
            });
            assert_eq!(
                &effects[effects.len() - 2..],
                [Effect::Release(disposition), Effect::Answer(answer)],
                "{call:?}"
            );
        }
    }

    #[test]
    fn ker_4_a_cell_that_retained_its_workspace_holds_the_session_unless_its_lease_was_lost() {
        let held = drive(true, happy);
        assert_eq!(
            &held[held.len() - 2..],
            [Effect::HoldSession, Effect::Answer(Answer::Decided)]
        );
        let lost = drive(true, |effect| match effect {
            Effect::CheckLease => Event::LeaseChecked { lost: true },
            other => happy(other),
        });
        assert_eq!(
            &lost[lost.len() - 3..],
            [
                Effect::Release(Disposition::Reset),
                Effect::EndSession(Some(SessionEnded::Discarded)),
                Effect::Answer(Answer::Decided)
            ]
        );
    }

    #[test]
    fn ker_4_a_refused_checkpoint_ends_the_session_with_its_reason() {
        let effects = drive(true, |effect| match effect {
            Effect::Keep => Event::Kept(Kept {
                succeeded: false,
                install_failed: false,
                checkpoint_refused: true,
                retained: true,
            }),
            other => happy(other),
        });
        assert!(effects.contains(&Effect::EndSession(Some(SessionEnded::CheckpointRefused))));
        assert!(!effects.contains(&Effect::HoldSession));
    }

    #[test]
    fn ker_4_a_cell_that_kept_nothing_leaves_its_session_as_it_was() {
        let effects = drive(true, |effect| match effect {
            Effect::TakeSession => Event::SessionTaken(Taken::Session { archive: true }),
            Effect::Keep => Event::Kept(Kept {
                succeeded: true,
                install_failed: false,
                checkpoint_refused: false,
                retained: false,
            }),
            other => happy(other),
        });
        assert!(
            !effects.contains(&Effect::Acquire),
            "it ran on the session's lease"
        );
        assert_eq!(
            &effects[effects.len() - 2..],
            [Effect::HoldSession, Effect::Answer(Answer::Decided)]
        );
    }

    #[test]
    fn ker_4_a_cell_leaves_its_session_when_the_sessions_worker_is_unreachable() {
        let (mut sequence, _) = Sequence::start(true);
        assert!(!sequence.on_session());
        let mut next = sequence.on(Event::Scoped(Some(false))).expect("scoped");
        assert_eq!(next, [Effect::TakeSession]);
        next = sequence
            .on(Event::SessionTaken(Taken::Session { archive: true }))
            .expect("taken");
        assert!(sequence.on_session());
        assert_eq!(next, [Effect::ReadInputs]);
        next = sequence.on(Event::InputsRead(true)).expect("inputs");
        assert_eq!(next, [Effect::Execute]);
        next = sequence
            .on(Event::Executed(Call::Unreachable))
            .expect("executed");
        assert!(!sequence.on_session(), "the session went with its worker");
        assert_eq!(
            next,
            [Effect::Release(Disposition::Discard), Effect::Acquire]
        );
    }

    #[test]
    fn an_event_the_machine_did_not_ask_for_is_refused_and_changes_nothing() {
        let (mut sequence, _) = Sequence::start(false);
        let error = sequence.on(Event::Acquired).unwrap_err();
        assert_eq!(error.pending, Some(Effect::Scope));
        assert_eq!(
            sequence.on(Event::Scoped(Some(false))),
            Ok(vec![Effect::Acquire])
        );
    }

    /// An event the shell could report for `effect`, chosen by `choice`.
    fn event_for(effect: Effect, choice: u8) -> Event {
        let bit = |n: u8| choice & (1 << n) != 0;
        match effect {
            Effect::Scope => Event::Scoped((!choice.is_multiple_of(4)).then_some(bit(2))),
            Effect::TakeSession => Event::SessionTaken(match choice % 3 {
                0 => Taken::Busy,
                1 => Taken::Session { archive: bit(2) },
                _ => Taken::Absent,
            }),
            Effect::Acquire if choice.is_multiple_of(4) => Event::AcquireRefused,
            Effect::Acquire => Event::Acquired,
            Effect::ReadInputs => Event::InputsRead(!choice.is_multiple_of(5)),
            Effect::Project => Event::Projected(!choice.is_multiple_of(5)),
            Effect::Execute => Event::Executed(match choice % 5 {
                0 => Call::Unreachable,
                1 => Call::Lost,
                2 => Call::Refused {
                    before_anything_ran: bit(3),
                },
                _ => Call::Answered,
            }),
            Effect::Keep => Event::Kept(Kept {
                succeeded: bit(0),
                install_failed: bit(1),
                checkpoint_refused: bit(2),
                retained: bit(3),
            }),
            Effect::Link => Event::Linked,
            Effect::CheckLease => Event::LeaseChecked { lost: bit(0) },
            other => panic!("{other:?} has no event"),
        }
    }

    proptest! {
        /// Whatever the shell reports at each step: code runs only under a lease, every lease
        /// ends exactly once before the one answer, which is last, a claimed session is settled
        /// exactly once (held or ended), an unreachable worker is discarded, and no more than
        /// LEASES_MAX leases come from the pool.
        #[test]
        fn every_lease_ends_once_before_the_one_answer_and_code_runs_only_under_one(
            affinity in any::<bool>(),
            choices in prop::collection::vec(any::<u8>(), 32),
        ) {
            let (mut sequence, first) = Sequence::start(affinity);
            let mut queue = std::collections::VecDeque::from(first);
            let mut choices = choices.into_iter().cycle();
            let (mut held, mut claimed, mut settled, mut acquired) = (false, false, 0, 0);
            let mut unreachable = false;
            let mut answered = None;
            while let Some(effect) = queue.pop_front() {
                prop_assert!(answered.is_none(), "{:?} after the answer", effect);
                match effect {
                    Effect::Execute => prop_assert!(held, "executed without a lease"),
                    Effect::Release(disposition) => {
                        prop_assert!(held, "released no lease");
                        prop_assert!(!unreachable || disposition == Disposition::Discard);
                        held = false;
                    }
                    Effect::HoldSession => {
                        prop_assert!(held && claimed, "held no lease for no session");
                        held = false;
                        settled += 1;
                    }
                    Effect::EndSession(_) => {
                        prop_assert!(claimed, "ended a session never claimed");
                        settled += 1;
                    }
                    Effect::Answer(answer) => {
                        prop_assert!(!held, "answered with a lease held");
                        prop_assert_eq!(settled, usize::from(claimed), "the session settled once");
                        answered = Some(answer);
                    }
                    _ => {}
                }
                if matches!(
                    effect,
                    Effect::Release(_) | Effect::HoldSession | Effect::EndSession(_) | Effect::Answer(_)
                ) {
                    continue;
                }
                prop_assert_eq!(sequence.holding(), held, "at {:?}", effect);
                let event = event_for(effect, choices.next().unwrap_or_default());
                unreachable = event == Event::Executed(Call::Unreachable);
                match event {
                    Event::Acquired => { held = true; acquired += 1; }
                    Event::SessionTaken(Taken::Session { .. }) => { held = true; claimed = true; }
                    Event::SessionTaken(Taken::Absent) => claimed = true,
                    _ => {}
                }
                let next = sequence.on(event);
                prop_assert!(next.is_ok(), "{:?} refused after {:?}", event, effect);
                queue.extend(next.unwrap_or_default());
            }
            prop_assert!(answered.is_some(), "the sequence ended without an answer");
            prop_assert!(acquired <= LEASES_MAX, "{} leases", acquired);
        }
    }
}
