//! Resets and their evidence: one run's, every run's between leases, and warm jails no run took.

use corral_core::ids::OpToken;
use corral_core::reset::ResetEvidence;

use corral_core::jail::Language;

use super::prepare::still_waits;
use super::{ActiveRun, HOST_UID_BASE, Prepared, RUNS_PER_SUPERVISOR, Worker};
use crate::cgroup::RunCgroups;
use crate::result::note;
use crate::sweep;
use crate::workspace::RunDirs;

impl Worker {
    /// The reset the control API orders between leases (POOL-4): kills every process of any of
    /// this supervisor's runs, removes every run directory left, and measures, all but those of
    /// the prepared jails no run took, which it keeps (decision 0060). Each run already
    /// resets itself; this proves it again, under the caller's token, and cleans up after a run
    /// whose own reset failed.
    pub fn reset_all(&mut self, token: OpToken, diagnostics: &mut Vec<String>) -> ResetEvidence {
        // The prepared jails no run took stay, for the next tenant, while they still wait with an
        // empty workspace (decision 0060); every other goes, its teardown counted in the evidence.
        let discarded = self.keep_untaken(diagnostics);
        let kept: Vec<&ActiveRun> = self
            .prepared
            .values()
            .chain(&self.upgrade)
            .map(|prepared| &prepared.run)
            .collect();
        let kept_uids: Vec<u32> = kept.iter().flat_map(|run| run.uids).collect();
        let kept_dirs: Vec<std::path::PathBuf> =
            kept.iter().map(|run| run.run_dir.clone()).collect();
        // What the resets of runs answered before their reset left (`Worker::reset_later`).
        let after_answer = self.reset_after_answer.take().map(|(left, notes)| {
            for line in notes {
                note(diagnostics, line);
            }
            left
        });
        // A browser session nobody closed goes too: its processes, profile and cgroups.
        let session = self
            .session
            .take()
            .map(|mut session| self.reset(&mut session.run, token, diagnostics));
        let pair_base = std::process::id().saturating_mul(RUNS_PER_SUPERVISOR);
        let uids: Vec<u32> = (0..RUNS_PER_SUPERVISOR * 2)
            .map(|offset| {
                HOST_UID_BASE
                    .saturating_add(pair_base.saturating_mul(2))
                    .saturating_add(offset)
            })
            .filter(|uid| !kept_uids.contains(uid))
            .collect();
        let (processes_remaining, _) = sweep::kill_run(None, &RunCgroups::default(), &uids);
        let (mut workspace_entries, mut scratch_entries) = (Some(0u32), Some(0u32));
        let run_dirs: Vec<_> = (0..RUNS_PER_SUPERVISOR)
            .map(|number| self.base.join(format!("run-{number}")))
            .filter(|dir| !kept_dirs.contains(dir))
            .collect();
        for run_dir in &run_dirs {
            if std::fs::symlink_metadata(run_dir).is_ok() {
                let wiped = RunDirs {
                    run_dir: run_dir.clone(),
                }
                .wipe();
                workspace_entries = add(workspace_entries, wiped.workspace_entries);
                scratch_entries = add(scratch_entries, wiped.scratch_entries);
                for failure in wiped.failures {
                    note(diagnostics, failure);
                }
            }
        }
        // Measured once every directory is wiped, from one reading of the mount table.
        let dirs: Vec<&std::path::Path> =
            run_dirs.iter().map(std::path::PathBuf::as_path).collect();
        let mounts_remaining = sweep::mounts_under_each(&dirs)
            .into_iter()
            .fold(Some(0u32), add);
        let mut evidence = ResetEvidence {
            token,
            processes_remaining,
            workspace_entries,
            scratch_entries,
            mounts_remaining,
        };
        add_evidence(&mut evidence, &discarded);
        if let Some(left) = &after_answer {
            add_evidence(&mut evidence, left);
        }
        if let Some(session) = &session {
            add_evidence(&mut evidence, session);
        }
        evidence
    }

    /// Keeps every prepared jail no run took whose interpreter still waits and whose workspace is
    /// still empty (decision 0060): nothing of any run has reached it (its own namespaces, uids,
    /// cgroups and directories), so it is as fresh as one prepared after this reset. Tears down
    /// the others and returns what their teardowns left, summed (each measured after its own
    /// kill by its cgroups' members), for the reset between leases to count; notes each teardown
    /// that did not come out clean. The scan of every process's uids is the caller's, once for
    /// every run of the supervisor but the jails kept: on a machine of a hundred workers one scan
    /// reads a thousand status files.
    pub(super) fn keep_untaken(&mut self, diagnostics: &mut Vec<String>) -> ResetEvidence {
        let mut left = ResetEvidence::clean(OpToken(0));
        self.upgrade_failed = false;
        let mut prepared = std::mem::take(&mut self.prepared);
        let mut upgrade = self.upgrade.take();
        // After `stack_in_place`, the jail prepared without the stack waits in the
        // re-preparation's place: each goes back to its own (the stack's, if no run took it).
        if upgrade.as_ref().is_some_and(|jail| !jail.importing) {
            let plain = upgrade.take();
            upgrade = prepared.remove(&Language::Python);
            prepared.extend(plain.map(|jail| (Language::Python, jail)));
        }
        for (language, mut jail) in prepared {
            if untouched(&mut jail) {
                self.prepared.insert(language, jail);
            } else {
                add_evidence(&mut left, &self.teardown_prepared(jail, diagnostics, false));
            }
        }
        if let Some(mut jail) = upgrade {
            if jail.importing && untouched(&mut jail) {
                self.upgrade = Some(jail);
            } else {
                self.upgrade_slot = None;
                add_evidence(&mut left, &self.teardown_prepared(jail, diagnostics, false));
            }
        }
        left
    }

    /// Tears down one prepared jail (closing its program pipe first); notes a teardown that did
    /// not come out clean. With `scan` false its processes are found by its cgroups alone, for a
    /// caller that scans every uid after it ([`Worker::reset_all`]).
    pub(super) fn teardown_prepared(
        &self,
        prepared: Prepared,
        diagnostics: &mut Vec<String>,
        scan: bool,
    ) -> ResetEvidence {
        let Prepared {
            mut run,
            language,
            program,
            ..
        } = prepared;
        drop(program);
        let evidence = self.reset_proving(&mut run, OpToken(0), diagnostics, scan);
        if !matches!(
            corral_core::reset::judge(&evidence, evidence.token),
            corral_core::reset::Verdict::Clean
        ) {
            note(
                diagnostics,
                format!(
                    "the unused prepared {} jail's teardown left {evidence:?}",
                    language.as_str()
                ),
            );
        }
        evidence
    }

    /// Kills every process of the run, wipes its directories, removes its cgroups, and measures.
    pub(super) fn reset(
        &self,
        run: &mut ActiveRun,
        token: OpToken,
        diagnostics: &mut Vec<String>,
    ) -> ResetEvidence {
        self.reset_proving(run, token, diagnostics, true)
    }

    /// [`Worker::reset`]; with `scan` false, the run's processes are found by its cgroups alone,
    /// for a reset whose proof the reset between leases makes (it scans every uid of every run
    /// of this supervisor): a run answered before its reset, whose processes the supervision
    /// already found gone (by its cgroups, or by a scan where it had none).
    pub(super) fn reset_proving(
        &self,
        run: &mut ActiveRun,
        token: OpToken,
        diagnostics: &mut Vec<String>,
        scan: bool,
    ) -> ResetEvidence {
        // The relays first: no connection of the run outlives them.
        drop(run.tool_relay.take());
        if let Some(relay) = run.broker_relay.take() {
            relay.close();
        }
        if let Some(relay) = run.relay.take() {
            relay.close();
        }
        let stage1 = run
            .stage1
            .take()
            .map(|child| i32::try_from(child.id()).unwrap_or(i32::MAX));
        let uids: &[u32] = if scan { &run.uids } else { &[] };
        let (processes_remaining, _) = sweep::kill_run(stage1, &run.cgroups, uids);
        let (mut workspace_entries, mut scratch_entries) = (Some(0), Some(0));
        if let Some(dirs) = run.dirs.take() {
            let wiped = dirs.wipe();
            workspace_entries = wiped.workspace_entries;
            scratch_entries = wiped.scratch_entries;
            for failure in wiped.failures {
                note(diagnostics, failure);
            }
        }
        for failure in run.cgroups.remove() {
            note(diagnostics, failure);
        }
        let mounts_remaining = sweep::mounts_under(&run.run_dir);
        ResetEvidence {
            token,
            processes_remaining,
            workspace_entries,
            scratch_entries,
            mounts_remaining,
        }
    }
}

/// Whether a prepared jail no run took may wait on for the next tenant: its interpreter still
/// waits (a jail that ended is not handed on) and its workspace, filled only when a run takes the
/// jail, is still empty.
fn untouched(jail: &mut Prepared) -> bool {
    let empty = jail.run.dirs.as_ref().is_some_and(|dirs| {
        std::fs::read_dir(dirs.workspace()).is_ok_and(|mut entries| entries.next().is_none())
    });
    empty && still_waits(jail).is_ok()
}

/// `a + b`, where either unmeasured makes the sum unmeasured.
fn add(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        _ => None,
    }
}

/// Adds what `more` left to what `total` left (the token stays `total`'s).
pub(super) fn add_evidence(total: &mut ResetEvidence, more: &ResetEvidence) {
    total.processes_remaining = add(total.processes_remaining, more.processes_remaining);
    total.workspace_entries = add(total.workspace_entries, more.workspace_entries);
    total.scratch_entries = add(total.scratch_entries, more.scratch_entries);
    total.mounts_remaining = add(total.mounts_remaining, more.mounts_remaining);
}
