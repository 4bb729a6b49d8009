//! Resets and their evidence: one run's, every run's between leases, and warm jails no run took.

use corral_core::ids::OpToken;
use corral_core::reset::ResetEvidence;

use super::{ActiveRun, HOST_UID_BASE, Prepared, RUNS_PER_SUPERVISOR, Worker};
use crate::cgroup::RunCgroups;
use crate::result::note;
use crate::sweep;
use crate::workspace::RunDirs;

impl Worker {
    /// The reset the control API orders between leases (POOL-4): kills every process of any of
    /// this supervisor's runs, removes every run directory left, and measures. Each run already
    /// resets itself; this proves it again, under the caller's token, and cleans up after a run
    /// whose own reset failed.
    pub fn reset_all(&mut self, token: OpToken, diagnostics: &mut Vec<String>) -> ResetEvidence {
        // Every prepared jail goes too, its teardown counted in the evidence: the next tenant
        // gets jails prepared after this reset.
        let discarded = self.discard_prepared(diagnostics);
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
            .collect();
        let (processes_remaining, _) = sweep::kill_run(None, &RunCgroups::default(), &uids);
        let (mut workspace_entries, mut scratch_entries) = (Some(0u32), Some(0u32));
        let run_dirs: Vec<_> = (0..RUNS_PER_SUPERVISOR)
            .map(|number| self.base.join(format!("run-{number}")))
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

    /// Tears down every prepared jail no run took. Returns what their teardowns left, summed
    /// (each measured after its own kill by its cgroups' members), for the reset between leases
    /// to count; notes each teardown that did not come out clean. The scan of every process's
    /// uids is the caller's, once for every run of the supervisor, these included: on a machine
    /// of a hundred workers one scan reads a thousand status files.
    pub(super) fn discard_prepared(&mut self, diagnostics: &mut Vec<String>) -> ResetEvidence {
        let mut left = ResetEvidence::clean(OpToken(0));
        self.upgrade_failed = false;
        self.upgrade_slot = None;
        let upgrade = self.upgrade.take();
        for prepared in std::mem::take(&mut self.prepared)
            .into_values()
            .chain(upgrade)
        {
            let evidence = self.teardown_prepared(prepared, diagnostics, false);
            add_evidence(&mut left, &evidence);
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
