//! Warm jails: preparing one before any lease, and handing it to the run that can take it.

use std::process::ChildStdin;
use std::time::{Duration, Instant};

use corral_core::ids::OpToken;
use corral_core::jail::{Language, NotRun};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::launch::Started;
use super::{ActiveRun, Prepared, RunRequest, Worker};
use crate::capture;
use crate::result::{RunResult, note};
use corral_stages::plan::{LINE_WAITING, LINES_MAX};

/// How long a prepared jail's bootstrap may take to say it waits (its pre-imports included)
/// before the preparation fails.
const BOOTSTRAP_DEADLINE: Duration = Duration::from_secs(30);
/// The nice value preparation runs at (and the prepared jail's processes start with).
const PREPARE_NICE: i32 = 10;
/// The nice value of an idle worker's re-preparation with the stack: the lowest, since every
/// worker of a pool left idle may be doing it at once and nobody waits for any of them.
const IDLE_PREPARE_NICE: i32 = 19;

impl Worker {
    /// Builds a jail for the next run of `language` now, with its interpreter started in it and
    /// waiting for the code (a Python one after importing `CORRAL_WORKER_PYTHON_PREIMPORT`), so
    /// that a run costs less than starting the interpreter. A jail still prepared for `language`
    /// (one the last reset kept: no run took it, decision 0060) stays and nothing is built. On
    /// failure nothing is left and the next run of `language` goes the cold way, saying why in
    /// its diagnostics. The jail dies with the thread that calls this (the parent-death signal
    /// follows the thread): call it from the thread that will call [`Worker::run`].
    ///
    /// After a Python run that used the stack (`CORRAL_WORKER_PYTHON_PREIMPORT`), the jail that
    /// pre-imports it waits beside one prepared without it (decision 0056): the next run takes
    /// the stack's when it uses the stack and the plain one otherwise, which spares it the
    /// stack's teardown (the interpreter's exit frees its address space before the answer).
    pub fn prepare(&mut self, language: Language) -> Result<(), String> {
        let stack = language == Language::Python && !self.preimport().is_empty();
        if !self.prepared.contains_key(&language) {
            match self.build(language, PREPARE_NICE, false) {
                Ok(prepared) => {
                    self.prepared.insert(language, prepared);
                    self.prepare_failures.remove(&language);
                }
                Err(why) => {
                    self.prepare_failures.insert(language, why.clone());
                    return Err(why);
                }
            }
        }
        if stack && self.upgrade.is_none() {
            match self.build(language, PREPARE_NICE, true) {
                Ok(with_stack) => self.upgrade = Some(with_stack),
                // The plain jail serves every run; the stack's is not tried again before the
                // next reset, as after an idle re-preparation that failed.
                Err(why) => {
                    self.upgrade_failed = true;
                    tracing::warn!(why = %why, "the preparation with the stack failed");
                }
            }
        }
        Ok(())
    }

    /// Prepares a Python jail that pre-imports `CORRAL_WORKER_PYTHON_PREIMPORT` whatever the
    /// last run imported, beside the one prepared without it, which still waits and serves any
    /// run that comes meanwhile: the worker has waited idle (decision 0037), so the core-second
    /// it costs is one nobody waits for. Once its bootstrap waits it takes the other's place
    /// ([`Worker::poll_prepared`]); a failure leaves the other, and is not tried again before the
    /// next reset.
    pub fn prepare_with_preimport(&mut self) {
        // One of the machine's slots, or none free: every other worker's is importing, and this
        // one tries again after its next idle wait.
        let Ok(slot) = upgrade_slot(self.cpus) else {
            return;
        };
        self.preimport_history |= 1;
        match self.build(Language::Python, IDLE_PREPARE_NICE, true) {
            Ok(prepared) => {
                self.upgrade = Some(prepared);
                self.upgrade_slot = slot;
            }
            Err(why) => {
                self.upgrade_failed = true;
                tracing::warn!(why = %why, "the idle re-preparation with the stack failed");
            }
        }
    }

    /// A jail for `language`, started at the low priority `nice`, its bootstrap importing; or
    /// why not, with nothing of it left.
    fn build(&mut self, language: Language, nice: i32, stack: bool) -> Result<Prepared, String> {
        let mut run = self.new_run();
        let mut scratch = RunResult::default();
        // Preparation is background work: it runs (and its processes start) at a lower priority,
        // so that it never slows a run in flight; the run that takes the jail restores it.
        // The jail's setup, which this thread waits for, runs at no lower a priority than the
        // preparation after a reset, which a request waiting for the thread raises ([`hasten`]);
        // only the bootstrap's imports, which nobody waits for, go lower once the jail waits
        // for them. Set up at nice 19, a re-preparation that a lease met in the middle held that
        // lease's run behind every run on the machine (1 to 2 s of a burst's slowest runs).
        let setup_nice = nice.min(PREPARE_NICE);
        let _ = rustix::process::setpriority_process(None, setup_nice);
        // Whether its bootstrap imports anything: only Python's does, and only with modules named.
        let stack = stack
            && language == Language::Python
            && !self.settings.prepare.python_preimport.is_empty();
        let prepared = self.build_prepared(language, stack, &mut run, &mut scratch);
        let _ = rustix::process::setpriority_process(None, 0);
        if nice > setup_nice
            && let Ok((started, _)) = &prepared
        {
            set_priority(&run, started.pid, nice);
        }
        match prepared {
            Ok((started, program)) => Ok(Prepared {
                run,
                language,
                memory_bytes: self.settings.bounds.max_memory_bytes,
                processes: self.settings.bounds.max_processes,
                started,
                program,
                ready: false,
                ready_by: Instant::now() + BOOTSTRAP_DEADLINE,
                importing: stack,
                lines: 0,
            }),
            Err(reason) => {
                let mut why = format!(
                    "{}: {}",
                    reason.code(),
                    scratch.reply.diagnostics.join("; ")
                );
                let mut notes = Vec::new();
                let evidence = self.reset(&mut run, OpToken(0), &mut notes);
                if !matches!(
                    corral_core::reset::judge(&evidence, evidence.token),
                    corral_core::reset::Verdict::Clean
                ) {
                    why.push_str(&format!("; its teardown left {evidence:?}"));
                }
                Err(why)
            }
        }
    }

    /// The directories, cgroups and jail of a prepared run, up to the interpreter waiting.
    fn build_prepared(
        &self,
        language: Language,
        stack: bool,
        run: &mut ActiveRun,
        result: &mut RunResult,
    ) -> Result<(Started, ChildStdin), NotRun> {
        let posture = self.decide_posture(result)?;
        self.create_dirs(run, result)?;
        self.create_cgroups(run, &posture, result)?;
        let preimport: &[String] = if stack {
            &self.settings.prepare.python_preimport
        } else {
            &[]
        };
        let plan = self.plan(
            language,
            run,
            &posture,
            self.settings.bounds.max_wall_seconds,
            Some(preimport),
        );
        // The grant is not known yet: it is attached when a run takes the jail.
        let (started, program) =
            self.start_jail(&plan, run, None, None, &mut result.reply.diagnostics, true)?;
        let Some(program) = program else {
            note(
                &mut result.reply.diagnostics,
                "the jail's program pipe is missing",
            );
            return Err(NotRun::JailSetupFailed);
        };
        // Its bootstrap imports now, while the thread takes other jobs: it counts as prepared
        // once it says it waits (`poll_prepared`).
        Ok((started, program))
    }

    /// Reads what the prepared jails still importing have said, waiting at most until `until`
    /// for each: one that says `B` is ready; one that ends, prints too much, or passes its
    /// deadline is torn down and its language's next run goes cold, saying why. A re-preparation
    /// with the stack that is ready takes the place of the Python jail prepared without it.
    pub fn poll_prepared(&mut self, until: Instant) {
        let languages: Vec<Language> = self
            .prepared
            .iter()
            .filter(|(_, p)| !p.ready)
            .map(|(language, _)| *language)
            .collect();
        for language in languages {
            let Some(prepared) = self.prepared.get_mut(&language) else {
                continue;
            };
            if let Err(why) = poll_one(prepared, until) {
                if let Some(old) = self.prepared.remove(&language) {
                    let mut notes = Vec::new();
                    let _ = self.teardown_prepared(old, &mut notes, true);
                }
                tracing::warn!(
                    language = language.as_str(),
                    why = %why,
                    "no prepared jail: its runs go cold"
                );
                self.prepare_failures.insert(language, why);
            }
        }
        // A ready one has said all it says: it is not read again.
        let Some(upgrade) = self.upgrade.as_mut().filter(|u| !u.ready) else {
            return;
        };
        let polled = poll_one(upgrade, until);
        if polled.is_err() || upgrade.ready {
            self.upgrade_slot = None;
        }
        // Ready, it waits beside the jail prepared without the stack, for the runs that use the
        // stack; the others keep the plain one, whose exit frees a tenth of the memory
        // (decision 0046).
        let mut notes = Vec::new();
        match polled {
            Ok(()) => {}
            Err(why) => {
                if let Some(upgrade) = self.upgrade.take() {
                    let _ = self.teardown_prepared(upgrade, &mut notes, true);
                }
                self.upgrade_failed = true;
                tracing::warn!(why = %why, "the idle re-preparation with the stack failed");
            }
        }
    }

    /// Puts the ready re-preparation with the stack where the next Python run takes its jail, and
    /// the jail prepared without it in the re-preparation's place (the reset between leases puts
    /// back the one no run took, decision 0060).
    fn stack_in_place(&mut self) {
        if !self.upgrade.as_ref().is_some_and(|u| u.ready) {
            return;
        }
        if let Some(stack) = self.upgrade.take() {
            self.upgrade = self.prepared.insert(Language::Python, stack);
        }
    }

    /// The prepared jail of the request's language, if there is one that can take `request`
    /// (built for the same memory and process bounds) and it is still alive. A jail that cannot
    /// take it stays prepared, untouched by anyone, as do those of other languages; a dead one is
    /// torn down. Says in `diagnostics` why a run goes cold.
    pub(super) fn take_prepared(
        &mut self,
        request: &RunRequest,
        diagnostics: &mut Vec<String>,
    ) -> Option<Prepared> {
        if !self.wait_for_ready(request, diagnostics) {
            return None;
        }
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
        self.alive_or_reset(prepared, diagnostics)
    }

    /// Waits, when the run should, for its language's prepared jail (or the re-preparation with
    /// the stack) to be ready: `false` when the run goes cold instead, said in `diagnostics`.
    fn wait_for_ready(&mut self, request: &RunRequest, diagnostics: &mut Vec<String>) -> bool {
        let language = request.language;
        // A run that uses the stack waits for the re-preparation with it, if one is under way
        // (at the run's priority), and takes it; any other takes the jail prepared without it.
        if let Some(upgrade) = self
            .upgrade
            .as_ref()
            .filter(|_| language == Language::Python)
            && corral_core::packages::imports::uses_any(
                &request.code,
                &self.settings.prepare.python_preimport,
            )
        {
            restore_priority(&upgrade.run, upgrade.started.pid);
            let until = Instant::now() + BOOTSTRAP_DEADLINE;
            while self.upgrade.as_ref().is_some_and(|u| !u.ready) && Instant::now() < until {
                self.poll_prepared(until);
            }
            self.stack_in_place();
        }
        // No jail prepared without the stack (its preparation failed): the stack's serves any run.
        if language == Language::Python && !self.prepared.contains_key(&language) {
            self.stack_in_place();
        }
        // Not ready yet: a run waits for a bootstrap that only starts (milliseconds), or for
        // one whose imports it uses; any other goes cold at once rather than wait a
        // core-second for imports it never uses.
        if let Some(prepared) = self.prepared.get(&language).filter(|p| !p.ready) {
            let wait = !prepared.importing
                || corral_core::packages::imports::uses_any(
                    &request.code,
                    &self.settings.prepare.python_preimport,
                );
            if wait {
                // Waited for at the run's priority, not preparation's.
                restore_priority(&prepared.run, prepared.started.pid);
                self.poll_prepared(Instant::now() + BOOTSTRAP_DEADLINE);
            }
            if self.prepared.get(&language).is_some_and(|p| !p.ready) {
                note(
                    diagnostics,
                    "the prepared jail was still importing; ran cold",
                );
                return false;
            }
        }
        true
    }

    /// `prepared` if its interpreter is still alive; else it is torn down, said in `diagnostics`.
    fn alive_or_reset(
        &mut self,
        prepared: Prepared,
        diagnostics: &mut Vec<String>,
    ) -> Option<Prepared> {
        let mut prepared = prepared;
        let status = match still_waits(&mut prepared) {
            Ok(()) => return Some(prepared),
            Err(status) => status,
        };
        note(
            diagnostics,
            format!("the prepared jail had ended ({status:?}); ran cold"),
        );
        drop(prepared.program);
        let _ = self.reset(&mut prepared.run, OpToken(0), diagnostics);
        None
    }
}

/// `Ok` while a prepared jail's interpreter still runs; else how its stage 1 was found. A stage 1
/// reaped here is forgotten (its pid must not be signalled again), and the jail's teardown kills
/// whatever is left of it.
pub(super) fn still_waits(prepared: &mut Prepared) -> Result<(), nix::Result<WaitStatus>> {
    let pid = i32::try_from(prepared.started.pid).unwrap_or(i32::MAX);
    let status = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
    match status {
        // /proc that cannot tell is taken for a live interpreter: if it is not, the run reports
        // how it ended, as any run does.
        Ok(WaitStatus::StillAlive) if interpreter_alive(prepared.started.pid) != Some(false) => {
            return Ok(());
        }
        // The interpreter is gone and the jail is ending: the teardown kills what is left.
        Ok(WaitStatus::StillAlive) => {}
        _ => {
            // Reaped (or not ours): its pid must not be signalled again.
            if let Some(child) = prepared.run.stage1.take() {
                drop(child);
            }
        }
    }
    Err(status)
}

/// Where the machine's re-preparation slots are (one lock file each), and how many CPUs make a
/// slot: the workers of one machine (`corral up`'s, all on its cores) re-prepare one per two
/// CPUs at a time, so that a pool left idle after a burst imports the stack worker by worker,
/// never in a storm that outweighs the runs that arrive meanwhile (decision 0037). A pod's
/// worker has its own filesystem and its own slots.
const UPGRADE_SLOT_DIR: &str = "/run/lock";
const CPUS_PER_UPGRADE_SLOT: usize = 2;

/// A free slot for a re-preparation, held while the returned file is open: `Ok(None)` where
/// there is no slot directory (nothing to share it with), `Err` when every slot is taken; one
/// slot per two of the worker's `cpus` (read once, at its start).
fn upgrade_slot(cpus: usize) -> Result<Option<std::fs::File>, ()> {
    let dir = std::path::Path::new(UPGRADE_SLOT_DIR);
    if !dir.is_dir() {
        return Ok(None);
    }
    let slots = (cpus / CPUS_PER_UPGRADE_SLOT).max(1);
    let mut opened_any = false;
    for slot in 0..slots {
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("corral-preimport-{slot}.lock")))
        else {
            continue;
        };
        opened_any = true;
        if file.try_lock().is_ok() {
            return Ok(Some(file));
        }
    }
    if opened_any { Err(()) } else { Ok(None) }
}

/// Reads what one prepared jail's bootstrap has said, until it says `B` (then it is ready) or
/// `until`; an error says why it failed (it ended, printed too much, or passed its deadline).
fn poll_one(prepared: &mut Prepared, until: Instant) -> Result<(), String> {
    loop {
        if prepared.lines >= LINES_MAX {
            return Err("the bootstrap printed too much before it waited for the code".to_owned());
        }
        let deadline = until.min(prepared.ready_by);
        match capture::read_line(&mut prepared.started.stdout, deadline) {
            Ok(Some(line)) if line == LINE_WAITING => {
                prepared.ready = true;
                return Ok(());
            }
            // A module that printed as it was imported: dropped.
            Ok(Some(_)) => prepared.lines += 1,
            Ok(None) => {
                return Err("the bootstrap ended before it waited for the code".to_owned());
            }
            Err(_) if Instant::now() < prepared.ready_by => return Ok(()),
            Err(error) => return Err(format!("the bootstrap: {error}")),
        }
    }
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

/// Gives every thread of a prepared jail (its cgroups' members, the interpreter, stage 1, and
/// their descendants) the normal priority back. Every thread: Linux keeps a nice value per
/// thread, and the threads a pre-imported module started (a BLAS pool) were started at the
/// preparation's. The last thread of a process to exit frees its address space, and a run's
/// answer waits for that: at nice 19 behind any other work, a pre-imported stack's teardown took
/// 7 ms of a 10 ms run. Best effort: what has exited needs none.
pub(super) fn restore_priority(run: &ActiveRun, interpreter: u32) {
    set_priority(run, interpreter, 0);
}

/// Gives every thread of a prepared jail (as [`restore_priority`] finds them) the nice value
/// `nice`.
fn set_priority(run: &ActiveRun, interpreter: u32, nice: i32) {
    let mut roots = run.cgroups.processes().unwrap_or_default();
    roots.extend(i32::try_from(interpreter));
    if let Some(stage1) = &run.stage1 {
        roots.extend(i32::try_from(stage1.id()));
    }
    renice_tree(roots, |_| false, nice);
}

/// Gives the thread `tid` of this process (the worker's jail thread) and every process it
/// started, with their descendants and all their threads, the normal priority back, because a
/// request waits for the thread: a preparation at its low priority would otherwise make that
/// request wait behind every run on the machine (decision 0036). Best effort, like
/// [`restore_priority`]: what has exited needs none, and a prepared jail that waits idle costs
/// nothing at any priority.
pub fn hasten(tid: i32) {
    let process = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    // An idle worker's re-preparation is nobody's wait: it stays at its priority (a run that
    // needs it restores it itself), and so do its descendants.
    let idle = |pid: rustix::process::Pid| {
        rustix::process::getpriority_process(Some(pid)).ok() == Some(IDLE_PREPARE_NICE)
    };
    renice_tree(thread_children(process, tid), idle, 0);
    if let Some(id) = rustix::process::Pid::from_raw(tid) {
        let _ = rustix::process::setpriority_process(Some(id), 0);
    }
}

/// The children the thread `task` of process `pid` started (`/proc/PID/task/TID/children`).
fn thread_children(pid: i32, task: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{task}/children"))
        .map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Gives every thread of the processes `roots` and of their descendants (the children of each
/// of their threads) the nice value `nice`, at most [`HASTEN_PROCESSES_MAX`] processes; a process
/// `skip` names is left out with its descendants.
fn renice_tree(mut pending: Vec<i32>, skip: impl Fn(rustix::process::Pid) -> bool, nice: i32) {
    let mut seen = std::collections::BTreeSet::new();
    // Bounded: a jail's processes are few until its code runs, and a run's are the run's.
    while let Some(pid) = pending.pop()
        && seen.len() < HASTEN_PROCESSES_MAX
    {
        if !seen.insert(pid) {
            continue;
        }
        let Some(id) = rustix::process::Pid::from_raw(pid) else {
            continue;
        };
        if skip(id) {
            continue;
        }
        let tasks: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|dir| {
                dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_else(|_| vec![pid]);
        for task in tasks {
            if let Some(thread) = rustix::process::Pid::from_raw(task) {
                let _ = rustix::process::setpriority_process(Some(thread), nice);
            }
            pending.extend(thread_children(pid, task));
        }
    }
}

/// The most processes [`hasten`] renices.
const HASTEN_PROCESSES_MAX: usize = 64;
