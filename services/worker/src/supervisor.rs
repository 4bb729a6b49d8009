//! The supervisor: one [`Worker`] per worker process, one [`Worker::run`] per piece of code.
//!
//! A run goes: refuse early (language, posture, code size) → create the run's directories and
//! cgroups → start the jail, with its egress relay (`crate::relay`) → capture its output until
//! it ends or the wall limit → kill what is left → measure the bounds → choose and verify the
//! downloads → reset (close the relay, kill again, wipe, measure) → the result, with the reset
//! evidence and the core's verdict on it. Every path that created anything goes through the
//! reset.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use corral_contract::messages::{EvidenceReport, Isolation};
use corral_core::bounds::{
    BoundObservations, ExecutionBounds, OutputStream, bounds_hit, code_fits,
};
use corral_core::config::Settings;
use corral_core::downloads;
use corral_core::ids::OpToken;
use corral_core::jail::{self, Language, NotRun, Posture, Primitive};
use corral_core::reset::ResetEvidence;
use corral_core::run::outcome::NOT_RUN_EXIT_CODE;
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::prctl;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use rustix::process::{PidfdFlags, pidfd_open};

use crate::archive::{self, ArchiveError};
use crate::capture;
use crate::cgroup::{self, RunCgroups};
use crate::plan::{
    GO_BYTE, JailPlan, LINE_ERROR, LINE_READY, LINE_WAITING, LINE_WAIVED, LINES_MAX, Limits,
    SIGNAL_EXIT_BASE,
};
use crate::probe::{self, Missing};
use crate::relay::{self, ProxyAddress, Relay};
use crate::result::{RunResult, note};
use crate::sweep;
use crate::workspace::{self, CopyInError, RunDirs};

/// Where the supervisor mounts its private tmpfs of run directories (in its own mount namespace,
/// so the host sees an empty directory and nothing outlives the supervisor).
const BASE_DIR: &str = "/run/corral-jail";
/// Host uids of runs start here: far above any distribution's or subordinate-id range. A run
/// takes two (its root and its user), derived from the supervisor's pid and the run's number, so
/// no two live runs share one and nothing else on the host has them.
const HOST_UID_BASE: u32 = 0x7000_0000;
/// Runs of one supervisor cycle through this many uid pairs.
const RUNS_PER_SUPERVISOR: u32 = 64;
/// The code's uid and gid inside a user namespace.
const INNER_ID: u32 = 1000;
/// How long building a jail may take before the run is refused.
const SETUP_DEADLINE: Duration = Duration::from_secs(10);
/// How long a prepared jail's bootstrap may take to say it waits (its pre-imports included)
/// before the preparation fails.
const BOOTSTRAP_DEADLINE: Duration = Duration::from_secs(30);
/// How long the pipes are read after a kill.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// What of a failed jail's stderr goes into the diagnostics, and how long to wait for it.
const STAGE_STDERR_MAX_BYTES: usize = 2_048;
const STAGE_STDERR_WAIT: Duration = Duration::from_millis(200);
/// `RLIM_INFINITY`.
const RLIMIT_UNLIMITED: u64 = u64::MAX;
/// Descriptors the code may hold open.
const OPEN_FILES_MAX: u64 = 1_024;
/// Tasks beyond `SANDBOX_MAX_PROCESSES` the rlimit allows when the pids controller enforces the
/// bound: the controller is the one that reports it, so the rlimit must not refuse first.
const NPROC_SLACK: u64 = 16;

/// How to re-execute this binary into a stage: the program (normally `/proc/self/exe`) and the
/// arguments before the stage's name (`["jail"]` for `corral`, nothing for `corral-jail`).
#[derive(Clone, Debug)]
pub struct Reexec {
    /// The program.
    pub program: PathBuf,
    /// The arguments before the stage's name.
    pub prefix: Vec<String>,
}

impl Reexec {
    /// This binary, with `prefix`.
    #[must_use]
    pub fn this_binary(prefix: &[&str]) -> Self {
        Self {
            program: PathBuf::from("/proc/self/exe"),
            prefix: prefix.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

/// One piece of code to run.
#[derive(Clone, Debug)]
pub struct RunRequest {
    /// The language.
    pub language: Language,
    /// The code.
    pub code: Vec<u8>,
    /// An operator's directory whose files the code sees and to which validated downloads are
    /// copied back; `None` for a fresh, empty workspace.
    pub workspace: Option<PathBuf>,
    /// A wall limit in place of `SANDBOX_MAX_WALL_SECONDS` (the operator's choice).
    pub wall_seconds: Option<u64>,
    /// Names the run declared as outputs (WS-7): offered even if unchanged, and still verified.
    pub declared: Vec<String>,
    /// The operation token the reset evidence carries.
    pub token: OpToken,
    /// Bounds in place of the configured ones for this run only; the caller has checked that none
    /// is higher than configured (`corral_core::bounds::lowered_bounds`).
    pub bounds: Option<ExecutionBounds>,
    /// Whether to pack the workspace into a tar after the run (the control API returns it).
    pub pack_workspace: bool,
    /// The run's egress grant, which the relay adds to each connection it carries to the egress
    /// proxy (EGR-8); `None`: the relay refuses every connection.
    pub grant: Option<String>,
}

/// What one run has created, for the reset.
struct ActiveRun {
    number: u32,
    dirs: Option<RunDirs>,
    run_dir: PathBuf,
    cgroups: RunCgroups,
    uids: [u32; 2],
    stage1: Option<Child>,
    /// The egress relay listening in the jail's network namespace; closed by the reset.
    relay: Option<Relay>,
}

/// A jail built before any lease (ARCHITECTURE.md, "Running code"): the same jail a cold run
/// gets, with its interpreter already started and blocked reading the program from stdin. It
/// serves exactly one run and is torn down by that run's reset, or by the next reset between
/// leases if no run took it. A worker holds at most one per language.
struct Prepared {
    run: ActiveRun,
    language: Language,
    /// The bounds it was built for: the cgroup's and the rlimits' values depend on them.
    memory_bytes: u64,
    processes: u32,
    started: Started,
    /// The write end the code is delivered through; closing it is the code's end of input.
    program: ChildStdin,
}

/// The worker's supervisor.
pub struct Worker {
    settings: Settings,
    reexec: Reexec,
    base: PathBuf,
    missing: Missing,
    runs: u32,
    /// The prepared jails, at most one per language (`CORRAL_WORKER_PREPARE_LANGUAGES`).
    prepared: BTreeMap<Language, Prepared>,
    /// Why the last preparation of a language failed, reported by the next run of it (which
    /// runs cold).
    prepare_failures: BTreeMap<Language, String>,
    /// The egress proxy the relays carry granted connections to (`SANDBOX_EGRESS_PROXY_URL`),
    /// or why there is none (every relay then refuses everything).
    egress_proxy: Result<ProxyAddress, String>,
}

impl Worker {
    /// Probes the isolation primitives and prepares the supervisor: a child subreaper (so a run's
    /// orphans come here to be reaped and counted) in a private mount namespace with a tmpfs for
    /// run directories. Call it before starting any thread: a mount namespace is per thread.
    #[must_use]
    pub fn start(settings: Settings, reexec: Reexec) -> Self {
        let cgroup_root = PathBuf::from(&settings.jail.cgroup_root);
        let mut missing = probe::probe(&reexec.program, &reexec.prefix, &cgroup_root);
        for (controller, primitive) in [
            ("memory", Primitive::CgroupMemory),
            ("pids", Primitive::CgroupPids),
        ] {
            if !missing.contains_key(&primitive) {
                cgroup::remove_stale(&cgroup_root, controller);
            }
        }
        let base = PathBuf::from(BASE_DIR);
        if !missing.contains_key(&Primitive::Privileges)
            && let Err(error) = prepare_supervisor(&base, settings.bounds.workspace_max_bytes)
        {
            missing.insert(Primitive::Namespaces, error);
        }
        // Read once, at start; a value that is not `http://host:port` fails nothing (EGR-5): the
        // relays refuse every connection, and a run with a grant says why.
        let egress_proxy = match settings.egress.proxy_url.as_deref() {
            None => Err("SANDBOX_EGRESS_PROXY_URL is unset".to_owned()),
            Some(url) => ProxyAddress::parse(url),
        };
        Self {
            settings,
            reexec,
            base,
            missing,
            runs: 0,
            prepared: BTreeMap::new(),
            prepare_failures: BTreeMap::new(),
            egress_proxy,
        }
    }

    /// Whether a prepared jail is waiting for a run.
    #[must_use]
    pub fn is_prepared(&self) -> bool {
        !self.prepared.is_empty()
    }

    /// The languages a prepared jail is waiting for, in order.
    #[must_use]
    pub fn prepared_languages(&self) -> Vec<Language> {
        self.prepared.keys().copied().collect()
    }

    /// The languages to keep a jail prepared for (`CORRAL_WORKER_PREPARE_LANGUAGES`).
    #[must_use]
    pub fn languages_to_prepare(&self) -> Vec<Language> {
        self.settings.prepare.languages.clone()
    }

    /// Builds a jail for the next run of `language` now, with its interpreter started in it and
    /// waiting for the code (a Python one after importing `CORRAL_WORKER_PYTHON_PREIMPORT`), so
    /// that a run costs less than starting the interpreter. A jail already prepared for
    /// `language` is torn down first (it is never handed on); those of other languages stay. On
    /// failure nothing is left and the next run of `language` goes the cold way, saying why in
    /// its diagnostics. The jail dies with the thread that calls this (the parent-death signal
    /// follows the thread): call it from the thread that will call [`Worker::run`].
    pub fn prepare(&mut self, language: Language) -> Result<(), String> {
        let mut notes = Vec::new();
        if let Some(old) = self.prepared.remove(&language) {
            let _ = self.teardown_prepared(old, &mut notes);
        }
        let mut run = self.new_run();
        let mut scratch = RunResult::default();
        // Preparation is background work: it runs (and its processes start) at a lower priority,
        // so that it never slows a run in flight; the run that takes the jail restores it.
        let _ = rustix::process::setpriority_process(None, PREPARE_NICE);
        let prepared = self.build_prepared(language, &mut run, &mut scratch);
        let _ = rustix::process::setpriority_process(None, 0);
        match prepared {
            Ok((started, program)) => {
                let memory_bytes = self.settings.bounds.max_memory_bytes;
                let processes = self.settings.bounds.max_processes;
                self.prepared.insert(
                    language,
                    Prepared {
                        run,
                        language,
                        memory_bytes,
                        processes,
                        started,
                        program,
                    },
                );
                self.prepare_failures.remove(&language);
                Ok(())
            }
            Err(reason) => {
                let mut why = format!(
                    "{}: {}",
                    reason.code(),
                    scratch.reply.diagnostics.join("; ")
                );
                let evidence = self.reset(&mut run, OpToken(0), &mut notes);
                if !matches!(
                    corral_core::reset::judge(&evidence, evidence.token),
                    corral_core::reset::Verdict::Clean
                ) {
                    why.push_str(&format!("; its teardown left {evidence:?}"));
                }
                self.prepare_failures.insert(language, why.clone());
                Err(why)
            }
        }
    }

    /// Tears down every prepared jail no run took. Returns what their teardowns left, summed
    /// (each measured after its own kill, its cgroups' members included), for the reset between
    /// leases to count; notes each teardown that did not come out clean.
    fn discard_prepared(&mut self, diagnostics: &mut Vec<String>) -> ResetEvidence {
        let mut left = ResetEvidence::clean(OpToken(0));
        for (_, prepared) in std::mem::take(&mut self.prepared) {
            let evidence = self.teardown_prepared(prepared, diagnostics);
            add_evidence(&mut left, &evidence);
        }
        left
    }

    /// Tears down one prepared jail (closing its program pipe first); notes a teardown that did
    /// not come out clean.
    fn teardown_prepared(
        &self,
        prepared: Prepared,
        diagnostics: &mut Vec<String>,
    ) -> ResetEvidence {
        let Prepared {
            mut run,
            language,
            program,
            ..
        } = prepared;
        drop(program);
        let evidence = self.reset(&mut run, OpToken(0), diagnostics);
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

    /// The directories, cgroups and jail of a prepared run, up to the interpreter waiting.
    fn build_prepared(
        &self,
        language: Language,
        run: &mut ActiveRun,
        result: &mut RunResult,
    ) -> Result<(Started, ChildStdin), NotRun> {
        let posture = self.decide_posture(result)?;
        self.create_dirs(run, result)?;
        self.create_cgroups(run, &posture, result)?;
        let plan = self.plan(
            language,
            run,
            &posture,
            self.settings.bounds.max_wall_seconds,
            true,
        );
        // The grant is not known yet: it is attached when a run takes the jail.
        let (mut started, program) =
            self.start_jail(&plan, run, None, &mut result.reply.diagnostics, true)?;
        let Some(program) = program else {
            note(
                &mut result.reply.diagnostics,
                "the jail's program pipe is missing",
            );
            return Err(NotRun::JailSetupFailed);
        };
        // Prepared means waiting for the code with the imports done, so that a run never waits
        // for them. Lines before it (a module that printed as it was imported) are dropped.
        let deadline = Instant::now() + BOOTSTRAP_DEADLINE;
        for _ in 0..LINES_MAX {
            match capture::read_line(&mut started.stdout, deadline) {
                Ok(Some(line)) if line == LINE_WAITING => return Ok((started, program)),
                Ok(Some(_)) => {}
                Ok(None) => {
                    note(
                        &mut result.reply.diagnostics,
                        "the bootstrap ended before it waited for the code",
                    );
                    return Err(NotRun::JailSetupFailed);
                }
                Err(error) => {
                    note(
                        &mut result.reply.diagnostics,
                        format!("the bootstrap: {error}"),
                    );
                    return Err(NotRun::JailSetupFailed);
                }
            }
        }
        note(
            &mut result.reply.diagnostics,
            "the bootstrap printed too much before it waited for the code",
        );
        Err(NotRun::JailSetupFailed)
    }

    /// A new run's number, directory and uids. Numbers the prepared jails hold are skipped.
    fn new_run(&mut self) -> ActiveRun {
        let held: BTreeSet<u32> = self.prepared.values().map(|p| p.run.number).collect();
        // At most one prepared jail per language: far fewer than the numbers, so the loop ends.
        assert!(
            held.len() < RUNS_PER_SUPERVISOR as usize,
            "{} prepared jails hold every run number",
            held.len()
        );
        let mut number = self.runs % RUNS_PER_SUPERVISOR;
        self.runs = self.runs.wrapping_add(1);
        while held.contains(&number) {
            number = self.runs % RUNS_PER_SUPERVISOR;
            self.runs = self.runs.wrapping_add(1);
        }
        let pair = std::process::id()
            .saturating_mul(RUNS_PER_SUPERVISOR)
            .saturating_add(number)
            .saturating_mul(2);
        let root_uid = HOST_UID_BASE.saturating_add(pair);
        // Both uids of the run lie in the jails' range and are ordinary ids (u32::MAX is "none").
        assert!(
            (HOST_UID_BASE..u32::MAX - 2).contains(&root_uid),
            "run uid {root_uid} out of range"
        );
        ActiveRun {
            number,
            dirs: None,
            run_dir: self.base.join(format!("run-{number}")),
            cgroups: RunCgroups::default(),
            uids: [root_uid, root_uid.saturating_add(1)],
            stage1: None,
            relay: None,
        }
    }

    /// The prepared jail of the request's language, if there is one that can take `request`
    /// (built for the same memory and process bounds) and it is still alive. A jail that cannot
    /// take it stays prepared, untouched by anyone, as do those of other languages; a dead one is
    /// torn down. Says in `diagnostics` why a run goes cold.
    fn take_prepared(
        &mut self,
        request: &RunRequest,
        diagnostics: &mut Vec<String>,
    ) -> Option<Prepared> {
        let language = request.language;
        let Some(prepared) = self.prepared.remove(&language) else {
            if let Some(why) = self.prepare_failures.get(&language) {
                note(
                    diagnostics,
                    format!("no prepared jail (its preparation failed: {why}); ran cold"),
                );
            }
            return None;
        };
        let bounds = request.bounds.as_ref().unwrap_or(&self.settings.bounds);
        // Memory and processes are in the jail's cgroup and rlimits, fixed when it was built; the
        // wall limit is the supervisor's, counted from the delivery, so a lowered one still fits
        // (only the CPU-time rlimit, a backstop behind it, stays the configured wall's).
        let fits = prepared.language == language
            && bounds.max_memory_bytes == prepared.memory_bytes
            && bounds.max_processes == prepared.processes;
        if !fits {
            self.prepared.insert(language, prepared);
            return None;
        }
        let pid = i32::try_from(prepared.started.pid).unwrap_or(i32::MAX);
        let mut prepared = prepared;
        let status = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        match status {
            // /proc that cannot tell is taken for a live interpreter: if it is not, the run
            // reports how it ended, as any run does.
            Ok(WaitStatus::StillAlive)
                if interpreter_alive(prepared.started.pid) != Some(false) =>
            {
                return Some(prepared);
            }
            // The interpreter is gone and the jail is ending: the reset kills what is left.
            Ok(WaitStatus::StillAlive) => {}
            _ => {
                // Reaped (or not ours): its pid must not be signalled again.
                if let Some(child) = prepared.run.stage1.take() {
                    drop(child);
                }
            }
        }
        note(
            diagnostics,
            format!("the prepared jail had ended ({status:?}); ran cold"),
        );
        drop(prepared.program);
        let _ = self.reset(&mut prepared.run, OpToken(0), diagnostics);
        None
    }

    /// The primitives found missing at start, with why.
    #[must_use]
    pub fn missing(&self) -> Vec<(&'static str, String)> {
        self.missing
            .iter()
            .map(|(p, why)| (p.code(), why.clone()))
            .collect()
    }

    /// The posture runs get, or the primitives that refuse them.
    pub fn posture(&self) -> Result<Posture, BTreeSet<Primitive>> {
        let missing: BTreeSet<Primitive> = self.missing.keys().copied().collect();
        jail::posture(&missing, self.settings.jail.allow_weaker_isolation)
    }

    /// Runs one piece of code in a fresh jail and resets after it. The jail dies with the thread
    /// that calls this (the parent-death signal follows the thread), which this call outlives.
    pub fn run(&mut self, request: &RunRequest) -> RunResult {
        let started = Instant::now();
        let mut result = RunResult::default();
        let prepared = self.take_prepared(request, &mut result.reply.diagnostics);
        if let (Some(_), Err(why)) = (&request.grant, &self.egress_proxy) {
            note(
                &mut result.reply.diagnostics,
                format!("a grant was given, but {why}: the egress relay refused every connection"),
            );
        }
        if request
            .grant
            .as_deref()
            .is_some_and(|grant| !corral_core::egress::grant::grant_is_sendable(grant))
        {
            note(
                &mut result.reply.diagnostics,
                "the grant is not a header-safe token: the egress relay refused every connection",
            );
        }
        // The run's bounds stand in for the configured ones until it is over; every step reads
        // them from the settings, so this is the one place that has to know.
        let configured = request
            .bounds
            .clone()
            .map(|bounds| std::mem::replace(&mut self.settings.bounds, bounds));
        let (mut run, executed) = match prepared {
            Some(prepared) => {
                result.reply.warm = true;
                let Prepared {
                    mut run,
                    started: jail,
                    program,
                    ..
                } = prepared;
                let executed = self.execute_warm(request, &mut run, jail, program, &mut result);
                (run, executed)
            }
            None => {
                let mut run = self.new_run();
                let executed = self.execute(request, &mut run, &mut result);
                (run, executed)
            }
        };
        if let Some(configured) = configured {
            self.settings.bounds = configured;
        }
        if let Err(reason) = executed {
            // PKG-6: a not_run record goes beside a nonzero exit.
            result.reply.not_run = Some(reason);
            result.reply.exit_code = Some(NOT_RUN_EXIT_CODE);
        }
        let reset_started = Instant::now();
        let evidence = self.reset(&mut run, request.token, &mut result.reply.diagnostics);
        result.reply.reset_evidence = Some(EvidenceReport::judged(evidence));
        result.reply.durations.reset_ms = millis(reset_started.elapsed());
        result.reply.durations.total_ms = millis(started.elapsed());
        result
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

    /// The reset the control API orders between leases (POOL-4): kills every process of any of
    /// this supervisor's runs, removes every run directory left, and measures. Each run already
    /// resets itself; this proves it again, under the caller's token, and cleans up after a run
    /// whose own reset failed.
    pub fn reset_all(&mut self, token: OpToken, diagnostics: &mut Vec<String>) -> ResetEvidence {
        // Every prepared jail goes too, its teardown counted in the evidence: the next tenant
        // gets jails prepared after this reset.
        let discarded = self.discard_prepared(diagnostics);
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
        let mut mounts_remaining = Some(0u32);
        for number in 0..RUNS_PER_SUPERVISOR {
            let run_dir = self.base.join(format!("run-{number}"));
            if std::fs::symlink_metadata(&run_dir).is_ok() {
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
            mounts_remaining = add(mounts_remaining, sweep::mounts_under(&run_dir));
        }
        let mut evidence = ResetEvidence {
            token,
            processes_remaining,
            workspace_entries,
            scratch_entries,
            mounts_remaining,
        };
        add_evidence(&mut evidence, &discarded);
        evidence
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
        if !code_fits(request.code.len(), bounds) {
            note(
                &mut result.reply.diagnostics,
                "the code is larger than SANDBOX_WORKSPACE_MAX_BYTES",
            );
            return Err(NotRun::CodeTooLarge);
        }
        // In the order a run has always had: the cgroups once the workspace is accepted.
        let dirs = self.create_dirs(run, result)?;
        let before = self.fill_workspace(request, language, run, &dirs, result)?;
        self.create_cgroups(run, &posture, result)?;
        let wall_seconds = request.wall_seconds.unwrap_or(bounds.max_wall_seconds);
        let plan = self.plan(language, run, &posture, wall_seconds, false);
        let grant = request.grant.as_deref();
        let (started, _) =
            self.start_jail(&plan, run, grant, &mut result.reply.diagnostics, false)?;
        let (observed, all_dead) = self.supervise(started, run, result, wall_seconds);
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
        if !code_fits(request.code.len(), bounds) {
            note(
                &mut result.reply.diagnostics,
                "the code is larger than SANDBOX_WORKSPACE_MAX_BYTES",
            );
            return Err(NotRun::CodeTooLarge);
        }
        let dirs = RunDirs {
            run_dir: run.run_dir.clone(),
        };
        // The jail was built at preparation's low priority: the run gets the normal one back
        // before its code arrives (its children inherit it).
        restore_priority(run, jail.pid);
        let before = self.fill_workspace(request, language, run, &dirs, result)?;
        // Before the code arrives, so that its first connection already carries the grant.
        if let Some(relay) = &run.relay {
            relay.attach_grant(request.grant.as_deref());
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
        let (observed, all_dead) = self.supervise(started, run, result, wall_seconds);
        self.collect(request, &before, &dirs, observed, all_dead, result);
        Ok(())
    }

    /// Creates the run's directories (recorded in `run` even when half-made, so that the reset
    /// removes what was made).
    fn create_dirs(&self, run: &mut ActiveRun, result: &mut RunResult) -> Result<RunDirs, NotRun> {
        let bounds = &self.settings.bounds;
        let setup_failed = |diagnostics: &mut Vec<String>, error: String| {
            note(diagnostics, error);
            NotRun::JailSetupFailed
        };
        let dirs = RunDirs::create(
            run.run_dir.clone(),
            (run.uids[1], run.uids[1]),
            bounds.workspace_max_bytes,
            bounds.tmp_max_bytes,
        );
        run.dirs = Some(RunDirs {
            run_dir: run.run_dir.clone(),
        });
        dirs.map_err(|e| setup_failed(&mut result.reply.diagnostics, e))
    }

    /// Creates the run's cgroups (recorded in `run`, for the reset).
    fn create_cgroups(
        &self,
        run: &mut ActiveRun,
        posture: &Posture,
        result: &mut RunResult,
    ) -> Result<(), NotRun> {
        let bounds = &self.settings.bounds;
        let waived = |primitive| matches!(posture, Posture::Weaker { waived } if waived.contains(&primitive));
        let memory_cgroup = !waived(Primitive::CgroupMemory);
        let pids_cgroup = !waived(Primitive::CgroupPids);
        run.cgroups = RunCgroups::create(
            Path::new(&self.settings.jail.cgroup_root),
            &format!("run-{}-{}", std::process::id(), run.uids[0]),
            memory_cgroup.then_some(bounds.max_memory_bytes),
            pids_cgroup.then_some(bounds.max_processes),
        )
        .map_err(|(primitive, e)| {
            note(
                &mut result.reply.diagnostics,
                format!("{}: {e}", primitive.code()),
            );
            NotRun::JailSetupFailed
        })?;
        Ok(())
    }

    /// Copies the request's workspace in and writes the code file; returns the workspace as it
    /// was before the code ran.
    fn fill_workspace(
        &self,
        request: &RunRequest,
        language: Language,
        run: &ActiveRun,
        dirs: &RunDirs,
        result: &mut RunResult,
    ) -> Result<downloads::Snapshot, NotRun> {
        let bounds = &self.settings.bounds;
        let setup_failed = |diagnostics: &mut Vec<String>, error: String| {
            note(diagnostics, error);
            NotRun::JailSetupFailed
        };
        if let Some(source) = &request.workspace {
            match workspace::copy_in(
                source,
                &dirs.workspace(),
                (run.uids[1], run.uids[1]),
                bounds.workspace_max_bytes,
                &mut result.reply.diagnostics,
            ) {
                Ok(()) => {}
                Err(CopyInError::TooLarge(why)) => {
                    note(
                        &mut result.reply.diagnostics,
                        format!("workspace: {why} (SANDBOX_WORKSPACE_MAX_BYTES)"),
                    );
                    return Err(NotRun::WorkspaceTooLarge);
                }
                Err(CopyInError::Io(why)) => {
                    return Err(setup_failed(&mut result.reply.diagnostics, why));
                }
            }
        }
        // Also in a warm run, though the code arrives on the pipe: the code may read its own
        // file, as it can in a cold run.
        let code_name = format!("main.{}", language.extension());
        dirs.write_code(&code_name, &request.code)
            .map_err(|e| setup_failed(&mut result.reply.diagnostics, e))?;
        let (before, _, _) = workspace::snapshot(&dirs.workspace())
            .map_err(|e| setup_failed(&mut result.reply.diagnostics, e))?;
        Ok(before)
    }

    /// What the stages need to build this run's jail.
    fn plan(
        &self,
        language: Language,
        run: &ActiveRun,
        posture: &Posture,
        wall_seconds: u64,
        warm: bool,
    ) -> JailPlan {
        let bounds = &self.settings.bounds;
        let waived = |primitive| matches!(posture, Posture::Weaker { waived } if waived.contains(&primitive));
        let user_namespace = !waived(Primitive::UserNamespaces);
        let (inner_uid, inner_gid) = if user_namespace {
            (INNER_ID, INNER_ID)
        } else {
            (run.uids[1], run.uids[1])
        };
        let memory_cgroup = !waived(Primitive::CgroupMemory);
        let pids_cgroup = !waived(Primitive::CgroupPids);
        let code_name = format!("main.{}", language.extension());
        JailPlan {
            reexec_prefix: self.reexec.prefix.clone(),
            run_dir: run.run_dir.to_string_lossy().into_owned(),
            user_namespace,
            inner_uid,
            inner_gid,
            seccomp_waivable: waived(Primitive::Seccomp),
            argv: if warm {
                bootstrap(
                    language,
                    &format!("/run/corral/{code_name}"),
                    &self.settings.prepare.python_preimport,
                )
            } else {
                interpreter(language, &format!("/run/corral/{code_name}"))
            },
            env: environment(),
            limits: Limits {
                processes: u64::from(bounds.max_processes)
                    + if pids_cgroup { NPROC_SLACK } else { 0 },
                // With the memory controller, the cgroup is the bound: it counts what is used,
                // not what is reserved, and it reports being hit. An address-space rlimit would
                // refuse a large allocation silently before the cgroup could say so. Without the
                // controller, the data rlimit is the only bound there is.
                data_bytes: if memory_cgroup {
                    RLIMIT_UNLIMITED
                } else {
                    bounds.max_memory_bytes
                },
                // A backstop above both tmpfs sizes, so that a full tmpfs says "no space" first.
                file_bytes: bounds
                    .workspace_max_bytes
                    .max(bounds.tmp_max_bytes)
                    .saturating_add(1 << 20),
                open_files: OPEN_FILES_MAX,
                cpu_seconds: wall_seconds.saturating_add(5),
            },
        }
    }

    /// Records the posture in `result`, or refuses with the missing primitives.
    fn decide_posture(&self, result: &mut RunResult) -> Result<Posture, NotRun> {
        result.reply.isolation.missing = self.missing.keys().map(|p| p.code().to_owned()).collect();
        match self.posture() {
            Ok(posture) => {
                result.reply.isolation.posture = match posture {
                    Posture::Full => "full",
                    Posture::Weaker { .. } => "weaker",
                }
                .to_owned();
                for (primitive, why) in &self.missing {
                    note(
                        &mut result.reply.diagnostics,
                        format!("waived {}: {why}", primitive.code()),
                    );
                }
                Ok(posture)
            }
            Err(refusing) => {
                result.reply.isolation.posture = "refused".to_owned();
                for primitive in refusing {
                    let why = self.missing.get(&primitive).map_or("", String::as_str);
                    note(
                        &mut result.reply.diagnostics,
                        format!("missing {}: {why}", primitive.code()),
                    );
                }
                Err(NotRun::IsolationUnavailable)
            }
        }
    }

    /// Starts stage 1, maps its ids, places it in the cgroups, opens the egress relay in its
    /// network namespace (with `grant`), lets it go and waits for `G`.
    fn start_jail(
        &self,
        plan: &JailPlan,
        run: &mut ActiveRun,
        grant: Option<&str>,
        diagnostics: &mut Vec<String>,
        keep_stdin: bool,
    ) -> Result<(Started, Option<ChildStdin>), NotRun> {
        let failed = |diagnostics: &mut Vec<String>, error: String| {
            note(diagnostics, error);
            NotRun::JailSetupFailed
        };
        let plan_text =
            serde_json::to_string(plan).map_err(|e| failed(diagnostics, format!("plan: {e}")))?;
        let mut child = Command::new(&self.reexec.program)
            .args(&self.reexec.prefix)
            .arg("__stage1")
            .arg(&plan_text)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(diagnostics, format!("start the jail: {e}")))?;
        let pid = child.id();
        let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            run.stage1 = Some(child);
            return Err(failed(
                diagnostics,
                "the jail's pipes are missing".to_owned(),
            ));
        };
        run.stage1 = Some(child);
        capture::prepare(&stdout, &stderr).map_err(|e| failed(diagnostics, e))?;
        // Stage 1 blocks on stdin until the go byte, so it cannot fork before this.
        run.cgroups
            .add(pid)
            .map_err(|(primitive, e)| failed(diagnostics, format!("{}: {e}", primitive.code())))?;
        let deadline = Instant::now() + SETUP_DEADLINE;
        let ready =
            capture::read_line(&mut stdout, deadline).map_err(|e| failed(diagnostics, e))?;
        if ready.as_deref() != Some(LINE_READY) {
            return Err(self.stage_failure(ready.into_iter().collect(), &mut stderr, diagnostics));
        }
        if plan.user_namespace {
            let map = format!(
                "0 {} 1\n{} {} 1\n",
                run.uids[0], plan.inner_uid, run.uids[1]
            );
            for file in ["uid_map", "gid_map"] {
                let path = format!("/proc/{pid}/{file}");
                std::fs::write(&path, &map)
                    .map_err(|e| failed(diagnostics, format!("write {path}: {e}")))?;
            }
        }
        // Before the go byte: the listener exists before any code can try to connect to it.
        let relay =
            Relay::open(pid, self.egress_proxy.clone().ok()).map_err(|e| failed(diagnostics, e))?;
        relay.attach_grant(grant);
        run.relay = Some(relay);
        stdin
            .write_all(&[GO_BYTE])
            .map_err(|e| failed(diagnostics, format!("start the jail: {e}")))?;
        // The interpreter inherits this pipe as its stdin: closed now, a cold run's code reads
        // end of input; kept, a prepared jail's bootstrap reads the code from it.
        let program = if keep_stdin {
            Some(stdin)
        } else {
            drop(stdin);
            None
        };
        let (went, lines) =
            capture::read_until_go(&mut stdout, deadline).map_err(|e| failed(diagnostics, e))?;
        if !went {
            return Err(self.stage_failure(lines, &mut stderr, diagnostics));
        }
        for line in lines {
            if let Some(rest) = line.strip_prefix(LINE_WAIVED) {
                note(diagnostics, format!("waived at run time:{rest}"));
            }
        }
        Ok((
            Started {
                pid,
                stdout,
                stderr,
                go_at: Instant::now(),
            },
            program,
        ))
    }

    /// The refusal for a jail that ended before `G`.
    fn stage_failure(
        &self,
        lines: Vec<String>,
        stderr: &mut std::process::ChildStderr,
        diagnostics: &mut Vec<String>,
    ) -> NotRun {
        let mut reason = NotRun::JailSetupFailed;
        for line in lines {
            let Some(rest) = line.strip_prefix(LINE_ERROR) else {
                continue;
            };
            let step = rest.trim_start().split(' ').next().unwrap_or("");
            // A primitive that passed the probe but failed now is still a missing primitive.
            if ["user_namespaces", "namespaces", "seccomp"].contains(&step) {
                reason = NotRun::IsolationUnavailable;
            }
            note(diagnostics, format!("jail setup failed:{rest}"));
        }
        let said = capture::read_available(stderr, STAGE_STDERR_MAX_BYTES, STAGE_STDERR_WAIT);
        if !said.is_empty() {
            note(diagnostics, format!("jail stderr: {said}"));
        }
        if reason == NotRun::JailSetupFailed && diagnostics.is_empty() {
            note(diagnostics, "the jail ended before it was ready");
        }
        reason
    }

    /// Captures the code's output until it ends or the wall limit; kills whatever is left.
    /// Returns what it observed about the bounds (the filesystems are measured later).
    fn supervise(
        &self,
        started: Started,
        run: &mut ActiveRun,
        result: &mut RunResult,
        wall_seconds: u64,
    ) -> (BoundObservations, bool) {
        let deadline = started.go_at + Duration::from_secs(wall_seconds);
        let pid = i32::try_from(started.pid).unwrap_or(i32::MAX);
        let pidfd: Option<OwnedFd> = rustix::process::Pid::from_raw(pid)
            .and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
        let (mut captured, streams) = capture::capture(
            started.stdout,
            started.stderr,
            pidfd.as_ref(),
            self.settings.bounds.max_output_bytes,
            deadline,
        );
        result.reply.durations.run_ms = millis(started.go_at.elapsed());
        let mut status = None;
        if pidfd.is_none() && !captured.deadline_hit {
            // Without a pidfd the capture loop ends with the pipes, and code that closed its
            // output may still run: wait for stage 1 here, within the same deadline.
            match wait_until(pid, deadline) {
                Some(found) => status = Some(found),
                None => captured.deadline_hit = true,
            }
        }
        if captured.deadline_hit {
            let (_, reaped) = sweep::kill_run(Some(pid), &run.cgroups, &run.uids);
            status = reaped;
            capture::drain_after_kill(streams, &mut captured, DRAIN_GRACE);
        } else if status.is_none()
            && let Ok(found) = waitpid(Pid::from_raw(pid), None)
        {
            status = Some(found);
        }
        // Forget the child: it is reaped (or will be by the sweep), and must not be waited again.
        run.stage1 = None;
        // Nothing of the run may be alive while its files are read.
        let (left, _) = sweep::kill_run(None, &run.cgroups, &run.uids);
        if left != Some(0) {
            note(
                &mut result.reply.diagnostics,
                format!("processes still alive after the kill: {left:?}"),
            );
        }
        result.reply.exit_code = match (captured.deadline_hit, status) {
            (true, _) | (false, None) => None,
            (false, Some(WaitStatus::Exited(_, code))) => Some(code),
            (false, Some(WaitStatus::Signaled(_, signal, _))) => {
                Some(SIGNAL_EXIT_BASE + signal as i32)
            }
            (false, Some(_)) => None,
        };
        result.reply.stdout = OutputStream::from(&captured.stdout);
        result.reply.stderr = OutputStream::from(&captured.stderr);
        let counters = run.cgroups.counters();
        let observed = BoundObservations {
            wall_expired: captured.deadline_hit,
            output_dropped_bytes: captured.stdout.bytes_dropped() + captured.stderr.bytes_dropped(),
            memory_limit_hits: counters.memory_limit_hits,
            oom_kills: counters.oom_kills,
            process_limit_hits: counters.process_limit_hits,
            ..BoundObservations::default()
        };
        (observed, left == Some(0))
    }

    /// Measures the filesystems, chooses and verifies the downloads, copies them back, and
    /// names the bounds hit. With a process of the run still alive (`all_dead` false) nothing is
    /// offered: a live process could swap a verified file for a link between check and copy.
    fn collect(
        &self,
        request: &RunRequest,
        before: &downloads::Snapshot,
        dirs: &RunDirs,
        mut observed: BoundObservations,
        all_dead: bool,
        result: &mut RunResult,
    ) {
        let bounds = &self.settings.bounds;
        observed.scratch = workspace::filesystem_use(&dirs.scratch(), 0);
        let offered = match workspace::snapshot(&dirs.workspace()) {
            Ok(_) if !all_dead => {
                note(
                    &mut result.reply.diagnostics,
                    "no downloads: a process of the run survived the kill",
                );
                Vec::new()
            }
            Ok((after, apparent_bytes, unnamed)) => {
                observed.workspace = workspace::filesystem_use(&dirs.workspace(), apparent_bytes);
                if unnamed > 0 {
                    note(
                        &mut result.reply.diagnostics,
                        format!("{unnamed} files with names that are not UTF-8 were ignored"),
                    );
                }
                let candidates = downloads::candidates(before, &after, &request.declared);
                workspace::offer(
                    &dirs.workspace(),
                    &candidates,
                    bounds.max_artifact_bytes,
                    &mut result.reply.diagnostics,
                )
            }
            Err(error) => {
                note(
                    &mut result.reply.diagnostics,
                    format!("workspace snapshot: {error}"),
                );
                Vec::new()
            }
        };
        let selection = downloads::select(&offered, bounds.max_artifact_bytes);
        observed.artifacts_over = selection.artifact_bound_hit;
        for (path, excluded) in &selection.excluded {
            note(
                &mut result.reply.diagnostics,
                format!("download {path} excluded: {}", excluded.code()),
            );
        }
        for download in &selection.downloads {
            if let Some(destination) = &request.workspace
                && let Err(error) =
                    workspace::copy_out(&dirs.workspace(), &download.path, destination)
            {
                note(
                    &mut result.reply.diagnostics,
                    format!("download {} not copied back: {error}", download.path),
                );
            }
        }
        result.reply.rejected = selection.rejected();
        result.reply.downloads = selection.downloads;
        if request.pack_workspace {
            // Packed only once nothing of the run is alive: a live process could swap a file
            // for a link between the check and the read (the pack follows no link either way).
            result.workspace_archive = Some(if all_dead {
                archive::pack(&dirs.workspace(), bounds.workspace_max_bytes).map(|p| p.archive)
            } else {
                Err(ArchiveError::Io(
                    "not packed: a process of the run survived the kill".to_owned(),
                ))
            });
        }
        let hit = bounds_hit(&observed, bounds.tmp_max_bytes, bounds.workspace_max_bytes);
        result.reply.bounds = hit.iter().copied().collect();
        result.reply.bound = hit.first().copied();
    }

    /// Kills every process of the run, wipes its directories, removes its cgroups, and measures.
    fn reset(
        &self,
        run: &mut ActiveRun,
        token: OpToken,
        diagnostics: &mut Vec<String>,
    ) -> ResetEvidence {
        // The relay first: no connection of the run outlives it.
        if let Some(relay) = run.relay.take() {
            relay.close();
        }
        let stage1 = run
            .stage1
            .take()
            .map(|child| i32::try_from(child.id()).unwrap_or(i32::MAX));
        let (processes_remaining, _) = sweep::kill_run(stage1, &run.cgroups, &run.uids);
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

/// A jail that said `G`.
struct Started {
    pid: u32,
    stdout: std::process::ChildStdout,
    stderr: std::process::ChildStderr,
    go_at: Instant,
}

/// Whether the interpreter of a prepared jail whose stage 1 is `stage1` still runs: stage 1's
/// child (pid 1 of the jail) has a child that is not a zombie. Stage 1 outlives the interpreter
/// by the moments the jail takes to end, and a jail in those moments must not take a run. `None`
/// when /proc does not say (a kernel without `/proc/PID/task/TID/children`).
fn interpreter_alive(stage1: u32) -> Option<bool> {
    let children = |pid: u32| -> Option<Vec<u32>> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        Some(
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect(),
        )
    };
    let Some(&init) = children(stage1)?.first() else {
        return Some(false);
    };
    let live = children(init)?.into_iter().any(|child| {
        std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
            // The state follows the command name, which may hold ')'.
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    });
    Some(live)
}

/// `a + b`, where either unmeasured makes the sum unmeasured.
fn add(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        _ => None,
    }
}

/// Adds what `more` left to what `total` left (the token stays `total`'s).
fn add_evidence(total: &mut ResetEvidence, more: &ResetEvidence) {
    total.processes_remaining = add(total.processes_remaining, more.processes_remaining);
    total.workspace_entries = add(total.workspace_entries, more.workspace_entries);
    total.scratch_entries = add(total.scratch_entries, more.scratch_entries);
    total.mounts_remaining = add(total.mounts_remaining, more.mounts_remaining);
}

/// Waits for process `pid` to exit, polling, until `deadline`; `None` if it has not by then.
fn wait_until(pid: i32, deadline: Instant) -> Option<WaitStatus> {
    let mut pause = Duration::from_millis(1);
    loop {
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(status) => return Some(status),
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Makes the supervisor a child subreaper in a private mount namespace with a tmpfs of run
/// directories at `base`.
fn prepare_supervisor(base: &Path, workspace_max_bytes: u64) -> Result<(), String> {
    prctl::set_child_subreaper(true).map_err(|e| format!("child subreaper: {e}"))?;
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("private mount namespace: {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make / private: {e}"))?;
    std::fs::create_dir_all(base).map_err(|e| format!("create {}: {e}", base.display()))?;
    // Room for the code of one run (bounded like a workspace) and the directories.
    let size = workspace_max_bytes.saturating_add(1 << 20);
    mount(
        Some("corral-runs"),
        base,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={size},mode=0711").as_str()),
    )
    .map_err(|e| format!("mount {}: {e}", base.display()))
}

/// The interpreter's command line for the code at `path` (inside the jail).
fn interpreter(language: Language, path: &str) -> Vec<String> {
    let program = match language {
        Language::Python => "/usr/bin/python3",
        Language::Node => "/usr/bin/node",
    };
    vec![program.to_owned(), path.to_owned()]
}

/// The nice value preparation runs at (and the prepared jail's processes start with).
const PREPARE_NICE: i32 = 10;

/// Gives every process of a prepared jail (its cgroups' members, and the interpreter) the normal
/// priority back. Best effort: a process that is gone needs none.
fn restore_priority(run: &ActiveRun, interpreter: u32) {
    let mut pids = run.cgroups.processes().unwrap_or_default();
    pids.extend(i32::try_from(interpreter));
    if let Some(stage1) = &run.stage1 {
        pids.extend(i32::try_from(stage1.id()));
    }
    for pid in pids {
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::setpriority_process(Some(pid), 0);
        }
    }
}

/// The interpreter's command line in a prepared jail: a bootstrap that blocks reading the code
/// from stdin (the supervisor's pipe) until the supervisor closes it, puts /dev/null in its place
/// so the code reads end of input as a cold run does, and runs the code as the main program
/// under `path`'s name. It is visible to the code (pid 1's children are), and holds nothing secret.
///
/// Python's first imports `preimport` (`CORRAL_WORKER_PYTHON_PREIMPORT`, names corral-core has
/// checked to be dotted identifiers), each in its own `try`: a module that is missing or fails
/// is skipped, and the code meets it as a cold run would. The modules stay in `sys.modules`,
/// which is the point; their names, like the bootstrap's own, are removed from `__main__`.
fn bootstrap(language: Language, path: &str, preimport: &[String]) -> Vec<String> {
    match language {
        Language::Python => {
            // Imported while no tenant's file exists (the workspace is filled when a run takes
            // the jail), so no workspace module can stand in for one of these; the import
            // system's directory caches are dropped once the code has arrived, so that the
            // tenant's modules are found.
            let preimport_source = if preimport.is_empty() {
                String::new()
            } else {
                let names: Vec<String> = preimport.iter().map(|name| format!("{name:?}")).collect();
                format!(
                    "def _corral_preimport(names):\n\
                     \x20   import importlib\n\
                     \x20   for name in names:\n\
                     \x20       try:\n\
                     \x20           importlib.import_module(name)\n\
                     \x20       except Exception:\n\
                     \x20           pass\n\
                     _corral_preimport([{}])\n",
                    names.join(", ")
                )
            };
            let invalidate = if preimport.is_empty() {
                ""
            } else {
                "\x20   __import__('importlib').invalidate_caches()\n"
            };
            // The bootstrap's own names are removed from __main__ before the code runs in it.
            let source = format!(
                "import sys, os, __main__ as m\n\
                 {preimport_source}\
                 def _corral():\n\
                 \x20   sys.stdout.flush()\n\
                 \x20   os.write(1, b'{waiting}\\n')\n\
                 \x20   src = sys.stdin.buffer.read()\n\
                 {invalidate}\
                 \x20   fd = os.open('/dev/null', os.O_RDONLY)\n\
                 \x20   os.dup2(fd, 0)\n\
                 \x20   os.close(fd)\n\
                 \x20   sys.argv = [{path:?}]\n\
                 \x20   sys.path[0] = {dir:?}\n\
                 \x20   g = m.__dict__\n\
                 \x20   for k in [k for k in g if k not in ('__name__', '__doc__', '__builtins__', '__spec__', '__loader__', '__package__')]:\n\
                 \x20       del g[k]\n\
                 \x20   g['__file__'] = {path:?}\n\
                 \x20   return compile(src, {path:?}, 'exec'), g\n\
                 exec(*_corral())\n",
                dir = "/run/corral",
                waiting = LINE_WAITING,
            );
            vec!["/usr/bin/python3".to_owned(), "-c".to_owned(), source]
        }
        Language::Node => {
            let source = format!(
                "(() => {{ const fs = require('fs'), M = require('module'); \
                 fs.writeSync(1, '{LINE_WAITING}\\n'); const src = fs.readFileSync(0, 'utf8'); fs.closeSync(0); fs.openSync('/dev/null', 'r'); \
                 const f = {path:?}; const m = new M('.', null); m.filename = f; \
                 m.paths = M._nodeModulePaths('/run/corral'); process.argv[1] = f; \
                 process.mainModule = m; m._compile(src, f); }})()"
            );
            vec!["/usr/bin/node".to_owned(), "-e".to_owned(), source]
        }
    }
}

/// The code's whole environment: nothing of the supervisor's.
fn environment() -> Vec<(String, String)> {
    [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("TMPDIR", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("USER", "corral"),
        ("TERM", "dumb"),
        // Modules written to the workspace are importable, as they would be beside the script.
        ("PYTHONPATH", "/workspace"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("MPLCONFIGDIR", "/tmp/matplotlib"),
        ("NODE_PATH", "/workspace/node_modules"),
        // The egress relay (EGR-8); no NO_PROXY, so that nothing is meant to go around it.
        ("HTTP_PROXY", relay::PROXY_URL),
        ("HTTPS_PROXY", relay::PROXY_URL),
        ("http_proxy", relay::PROXY_URL),
        ("https_proxy", relay::PROXY_URL),
        ("ALL_PROXY", relay::PROXY_URL),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The JSON of the isolation result for a refusal printed at start (used by the CLI).
pub fn refusal_text(result: &Isolation, diagnostics: &[String]) -> String {
    format!(
        "corral jail: refusing to run code: isolation unavailable ({}): {}. Set CORRAL_JAIL_ALLOW_WEAKER_ISOLATION=1 to accept a weaker jail where that is possible.",
        result.missing.join(", "),
        diagnostics.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a bootstrap outside any jail (it needs none): the code arrives on stdin, and the code
    /// itself then reads end of input and sees itself as the main program at `path`.
    fn bootstrapped(language: Language, code: &str, preimport: &[String]) -> (i32, String, String) {
        let path = format!("/run/corral/main.{}", language.extension());
        let argv = bootstrap(language, &path, preimport);
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(code.as_bytes()).unwrap();
        drop(stdin);
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        // The bootstrap says it waits before it reads the code.
        let Some(stdout) = stdout.strip_prefix(&format!("{LINE_WAITING}\n")) else {
            panic!("no waiting line: {stdout:?}");
        };
        (
            output.status.code().unwrap_or(-1),
            stdout.to_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Whether `interpreter` is installed; without it the test skips through
    /// `corral_testkit::skip` (which fails it under `CORRAL_REQUIRE_TOOLS`) and must return.
    fn interpreter_or_skip(test: &str, interpreter: &str) -> bool {
        if Path::new(interpreter).exists() {
            return true;
        }
        corral_testkit::skip(
            test,
            corral_testkit::Need::Tools,
            &format!("no {interpreter}"),
        );
        false
    }

    #[test]
    fn the_python_bootstrap_runs_the_code_as_main_with_stdin_at_its_end() {
        if !interpreter_or_skip(
            "the_python_bootstrap_runs_the_code_as_main_with_stdin_at_its_end",
            "/usr/bin/python3",
        ) {
            return;
        }
        let (code, stdout, stderr) = bootstrapped(
            Language::Python,
            "import sys\nprint(__name__, __file__, sys.argv, repr(sys.stdin.read()))\nprint(sorted(k for k in globals() if not k.startswith('__')))\nsys.exit(3)\n",
            &[],
        );
        assert_eq!(code, 3, "{stderr}");
        assert_eq!(
            stdout, "__main__ /run/corral/main.py ['/run/corral/main.py'] ''\n['sys']\n",
            "{stderr}"
        );
    }

    #[test]
    fn the_node_bootstrap_runs_the_code_as_main_with_stdin_at_its_end() {
        if !interpreter_or_skip(
            "the_node_bootstrap_runs_the_code_as_main_with_stdin_at_its_end",
            "/usr/bin/node",
        ) {
            return;
        }
        let (code, stdout, stderr) = bootstrapped(
            Language::Node,
            "const fs = require('fs');\nconsole.log(__filename, require.main === module, process.argv[1], JSON.stringify(fs.readFileSync(0, 'utf8')));\nprocess.exit(4);\n",
            &[],
        );
        assert_eq!(code, 4, "{stderr}");
        assert_eq!(
            stdout, "/run/corral/main.js true /run/corral/main.js \"\"\n",
            "{stderr}"
        );
    }

    #[test]
    fn the_python_bootstrap_preimports_and_skips_what_is_missing() {
        if !interpreter_or_skip(
            "the_python_bootstrap_preimports_and_skips_what_is_missing",
            "/usr/bin/python3",
        ) {
            return;
        }
        let preimport = ["json", "no_such_module_xyz", "xml.dom"].map(str::to_owned);
        let code = "import sys\nprint('json' in sys.modules, 'xml.dom' in sys.modules, 'no_such_module_xyz' in sys.modules)\nprint(sorted(k for k in globals() if k not in ('__name__', '__doc__', '__builtins__', '__spec__', '__loader__', '__package__', '__file__')))\n";
        let (exit, stdout, stderr) = bootstrapped(Language::Python, code, &preimport);
        assert_eq!(exit, 0, "{stderr}");
        assert_eq!(stdout, "True True False\n['sys']\n", "{stderr}");
        // Without the list, nothing is imported: the check above can fail.
        let (exit, stdout, stderr) = bootstrapped(Language::Python, code, &[]);
        assert_eq!(exit, 0, "{stderr}");
        assert_eq!(stdout, "False False False\n['sys']\n", "{stderr}");
    }
}
