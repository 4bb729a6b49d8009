//! One run, from the request to the result: refused early, cold or warm, then reset.

use std::process::ChildStdin;
use std::time::{Duration, Instant};

use corral_contract::messages::EvidenceReport;
use corral_core::bounds::{ExecutionBounds, code_fits};
use corral_core::ids::OpToken;
use corral_core::jail::NotRun;
use corral_core::reset::ResetEvidence;
use corral_core::run::outcome::NOT_RUN_EXIT_CODE;

use super::launch::Started;
use super::prepare::restore_priority;
use super::supervise::millis;
use super::{ActiveRun, Prepared, RunRequest, Worker};
use crate::capture;
use crate::result::{RunResult, note};
use crate::workspace::RunDirs;

/// A run whose result is complete and whose reset is still to come: everything of it is held
/// here until [`Worker::reset_unreset`] or [`Worker::reset_later`] takes it.
#[must_use = "a run's jail, directories and cgroups stay until its reset"]
pub struct Unreset {
    run: ActiveRun,
    token: OpToken,
    started: Instant,
}

impl Unreset {
    /// `run`, to be reset under `token`; `started` is when its request began.
    pub(super) fn new(run: ActiveRun, token: OpToken, started: Instant) -> Self {
        Self {
            run,
            token,
            started,
        }
    }
}

impl Worker {
    /// Runs one piece of code in a fresh jail and resets after it. The jail dies with the thread
    /// that calls this (the parent-death signal follows the thread), which this call outlives.
    pub fn run(&mut self, request: &RunRequest) -> RunResult {
        let (mut result, unreset) = self.run_before_reset(request);
        if let Some(unreset) = unreset {
            self.reset_unreset(unreset, &mut result);
        }
        result
    }

    /// The reset of `unreset`, with its evidence and durations in `result`.
    pub fn reset_unreset(&mut self, unreset: Unreset, result: &mut RunResult) {
        let Unreset {
            mut run,
            token,
            started,
        } = unreset;
        let reset_started = Instant::now();
        let evidence = self.reset(&mut run, token, &mut result.reply.diagnostics);
        result.reply.reset_evidence = Some(EvidenceReport::judged(evidence));
        result.reply.durations.reset_ms = millis(reset_started.elapsed());
        result.reply.durations.total_ms = millis(started.elapsed());
    }

    /// The reset of `unreset`, after its result was answered (the control API's execute): what
    /// it leaves and notes is counted by the next reset between leases ([`Worker::reset_all`]),
    /// whose evidence is the one the pool judges; nothing of the run is handed on before it.
    pub fn reset_later(&mut self, unreset: Unreset) {
        let Unreset { mut run, .. } = unreset;
        let mut notes = Vec::new();
        let evidence = self.reset_proving(&mut run, OpToken(0), &mut notes, false);
        let (left, earlier_notes) = self
            .reset_after_answer
            .get_or_insert_with(|| (ResetEvidence::clean(OpToken(0)), Vec::new()));
        super::reset::add_evidence(left, &evidence);
        earlier_notes.extend(notes);
    }

    /// [`Worker::run`] up to its reset, which the caller performs: the result (its durations
    /// up to here, no reset evidence), and the run to reset (`None` when a refusal already did).
    pub fn run_before_reset(&mut self, request: &RunRequest) -> (RunResult, Option<Unreset>) {
        let started = Instant::now();
        let mut result = RunResult::default();
        self.ran_any = true;
        // What the run imports: its code's, and a persistent cell's restore's (the checkpoint's
        // hint), which decide whether it waits for a pre-importing jail and what the next
        // prepares.
        let imports_of = super::kernel::imports_of(request);
        if request.language == corral_core::jail::Language::Python {
            self.remember_imports(&imports_of.code);
        }
        // A persistent cell: the program is the kernel's driver around the cell.
        let kernel = match &request.kernel {
            None => None,
            Some(order) => match self.kernel_cell(request.language, order) {
                Ok(cell) => Some(cell),
                Err(why) => {
                    let mut refused = self.refuse(NotRun::JailSetupFailed, request.token);
                    note(&mut refused.reply.diagnostics, format!("kernel: {why}"));
                    return (refused, None);
                }
            },
        };
        let wrapped = kernel.as_ref().map(|cell| RunRequest {
            code: super::kernel::program(
                request.language,
                &request.code,
                cell,
                &super::command::code_path(request.language),
            ),
            ..request.clone()
        });
        let cell = request;
        let request = wrapped.as_ref().unwrap_or(cell);
        // A run that installs goes cold: its installer runs in the jail before the interpreter.
        // So does a run with a projection: a prepared jail's mounts and environment are fixed.
        let prepared = if request.install.is_some() || request.resources.is_some() {
            None
        } else {
            // Judged by the cell's own imports and its restore's, not the driver's.
            self.take_prepared(&imports_of, &mut result.reply.diagnostics)
        };
        self.note_grant_refusals(request, &mut result.reply.diagnostics);
        let (run, executed) = self.execute_bounded(request, prepared, kernel, &mut result);
        if let Err(reason) = executed {
            // PKG-6: a not_run record goes beside a nonzero exit.
            result.reply.not_run = Some(reason);
            result.reply.exit_code = Some(NOT_RUN_EXIT_CODE);
        }
        result.reply.durations.total_ms = millis(started.elapsed());
        let unreset = Unreset {
            run,
            token: request.token,
            started,
        };
        (result, Some(unreset))
    }

    /// Notes why the egress relay will refuse every connection of a run given a grant: no proxy,
    /// or a grant that is not a header-safe token.
    fn note_grant_refusals(&self, request: &RunRequest, diagnostics: &mut Vec<String>) {
        if let (Some(_), Err(why)) = (&request.grant, &self.egress_proxy) {
            note(
                diagnostics,
                format!("a grant was given, but {why}: the egress relay refused every connection"),
            );
        }
        if request
            .grant
            .as_deref()
            .is_some_and(|grant| !corral_core::egress::grant::grant_is_sendable(grant))
        {
            note(
                diagnostics,
                "the grant is not a header-safe token: the egress relay refused every connection",
            );
        }
    }

    /// Executes `request` in the `prepared` jail (warm) or a new one (cold), under the request's
    /// bounds: the run to reset, and the reason the code was not run, if it was not.
    fn execute_bounded(
        &mut self,
        request: &RunRequest,
        prepared: Option<Prepared>,
        kernel: Option<super::kernel::KernelCell>,
        result: &mut RunResult,
    ) -> (ActiveRun, Result<(), NotRun>) {
        // The run's bounds stand in for the configured ones until it is over; every step reads
        // them from the settings, so this is the one place that has to know.
        let configured = request
            .bounds
            .clone()
            .map(|bounds| std::mem::replace(&mut self.settings.bounds, bounds));
        let (run, executed) = match prepared {
            Some(prepared) => {
                result.reply.warm = true;
                let Prepared {
                    mut run,
                    started: jail,
                    program,
                    ..
                } = prepared;
                run.kernel = kernel;
                let executed = self.execute_warm(request, &mut run, jail, program, result);
                (run, executed)
            }
            None => {
                let mut run = self.new_run();
                run.kernel = kernel;
                let executed = self.execute(request, &mut run, result);
                (run, executed)
            }
        };
        if let Some(configured) = configured {
            self.settings.bounds = configured;
        }
        (run, executed)
    }

    /// The answer to a request refused before anything of it ran (`reason`): the posture it would
    /// have had, the `not_run` record beside a nonzero exit (PKG-6), and the evidence of a reset
    /// under `token`.
    pub fn refuse(&mut self, reason: NotRun, token: OpToken) -> RunResult {
        let mut result = RunResult::default();
        // Recorded so that the refusal reports the posture; the reason given stands regardless.
        let _posture = self.decide_posture(&mut result);
        result.reply.not_run = Some(reason);
        result.reply.exit_code = Some(NOT_RUN_EXIT_CODE);
        let mut run = self.new_run();
        let evidence = self.reset(&mut run, token, &mut result.reply.diagnostics);
        result.reply.reset_evidence = Some(EvidenceReport::judged(evidence));
        result
    }

    /// Everything before the reset. An error is the reason the code was not run.
    fn execute(
        &self,
        request: &RunRequest,
        run: &mut ActiveRun,
        result: &mut RunResult,
    ) -> Result<(), NotRun> {
        let posture = self.decide_posture(result)?;
        let language = request.language;
        let bounds = &self.settings.bounds;
        refuse_oversized_code(request, bounds, result)?;
        // In the order a run has always had: the cgroups once the workspace is accepted.
        let dirs = self.create_dirs(run, result)?;
        let mut before = self.fill_workspace(request, language, run, &dirs, result)?;
        self.create_cgroups(run, &posture, result)?;
        if let Some(order) = &request.install {
            self.install(order, language, run, &dirs, &posture, result)?;
            // What the install put in the workspace (node_modules) is not the code's output.
            if let Ok((after, _, _)) = crate::workspace::snapshot(&dirs.workspace()) {
                before = after;
            }
        }
        // After the install (which runs in this jail and could write the workspace), with
        // nothing of it alive: what is judged is what the driver restores.
        self.judge_kernel(language, run, &dirs, result)?;
        // Verified and written before the jail exists (PROJ-6).
        let projected = Self::project_resources(request, &dirs, result)?;
        let wall_seconds = request.wall_seconds.unwrap_or(bounds.max_wall_seconds);
        let mut plan = self.plan(language, run, &posture, wall_seconds, None);
        if projected && let Some(resources) = &request.resources {
            plan.resources = true;
            plan.env.extend(resources.manifest.environment());
        }
        run.tools_pending.clone_from(&request.tools);
        let grant = request.grant.as_deref();
        let (started, _) = self.start_jail(
            &plan,
            run,
            grant,
            None,
            &mut result.reply.diagnostics,
            false,
        )?;
        let (mut observed, all_dead) =
            self.supervise(started, run, result, wall_seconds, request.tap.as_ref());
        self.seal_kernel(language, run, &dirs, (&mut observed, all_dead), result);
        self.collect(request, &before, &dirs, observed, all_dead, result);
        Ok(())
    }

    /// Everything before the reset of a run in the prepared jail: the same refusals and the same
    /// workspace as a cold run, then the code is delivered to the waiting interpreter. The wall
    /// limit runs from the delivery.
    fn execute_warm(
        &self,
        request: &RunRequest,
        run: &mut ActiveRun,
        jail: Started,
        program: ChildStdin,
        result: &mut RunResult,
    ) -> Result<(), NotRun> {
        self.decide_posture(result)?;
        let language = request.language;
        let bounds = &self.settings.bounds;
        refuse_oversized_code(request, bounds, result)?;
        let dirs = RunDirs {
            run_dir: run.run_dir.clone(),
        };
        // The jail was built at preparation's low priority: the run gets the normal one back
        // before its code arrives (its children inherit it).
        restore_priority(run, jail.pid);
        let before = self.fill_workspace(request, language, run, &dirs, result)?;
        self.judge_kernel(language, run, &dirs, result)?;
        // Before the code arrives, so that its first connection already carries the grant.
        if let Some(relay) = &run.relay {
            relay.attach_grant(request.grant.as_deref());
        }
        if let Some(order) = &request.tools {
            match crate::tools::ToolRelay::open(jail.pid, order.clone()) {
                Ok(relay) => run.tool_relay = Some(relay),
                Err(e) => {
                    note(&mut result.reply.diagnostics, e);
                    return Err(NotRun::JailSetupFailed);
                }
            }
        }
        let wall_seconds = request.wall_seconds.unwrap_or(bounds.max_wall_seconds);
        let go_at = Instant::now();
        if let Err(error) = capture::deliver(
            program,
            &request.code,
            go_at + Duration::from_secs(wall_seconds),
        ) {
            // The interpreter stopped reading: what it did is reported like any run's end.
            note(
                &mut result.reply.diagnostics,
                format!("deliver the code: {error}"),
            );
        }
        let started = Started { go_at, ..jail };
        let (mut observed, all_dead) =
            self.supervise(started, run, result, wall_seconds, request.tap.as_ref());
        self.seal_kernel(language, run, &dirs, (&mut observed, all_dead), result);
        self.collect(request, &before, &dirs, observed, all_dead, result);
        Ok(())
    }
}

/// Refuses code larger than the workspace bound (`corral_core::bounds::code_fits`, the rule the
/// API admitted it by), with a note saying so.
fn refuse_oversized_code(
    request: &RunRequest,
    bounds: &ExecutionBounds,
    result: &mut RunResult,
) -> Result<(), NotRun> {
    if code_fits(request.code.len(), bounds) {
        return Ok(());
    }
    note(
        &mut result.reply.diagnostics,
        "the code is larger than SANDBOX_WORKSPACE_MAX_BYTES",
    );
    Err(NotRun::CodeTooLarge)
}
