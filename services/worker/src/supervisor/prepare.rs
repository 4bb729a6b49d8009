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
use crate::plan::{LINE_WAITING, LINES_MAX};
use crate::result::{RunResult, note};

/// How long a prepared jail's bootstrap may take to say it waits (its pre-imports included)
/// before the preparation fails.
const BOOTSTRAP_DEADLINE: Duration = Duration::from_secs(30);
/// The nice value preparation runs at (and the prepared jail's processes start with).
const PREPARE_NICE: i32 = 10;

impl Worker {
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
                        ready: false,
                        ready_by: Instant::now() + BOOTSTRAP_DEADLINE,
                        importing: language == Language::Python && !self.preimport().is_empty(),
                        lines: 0,
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
    /// deadline is torn down and its language's next run goes cold, saying why.
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
            let failure = loop {
                if prepared.lines >= LINES_MAX {
                    break Some(
                        "the bootstrap printed too much before it waited for the code".to_owned(),
                    );
                }
                let deadline = until.min(prepared.ready_by);
                match capture::read_line(&mut prepared.started.stdout, deadline) {
                    Ok(Some(line)) if line == LINE_WAITING => {
                        prepared.ready = true;
                        break None;
                    }
                    // A module that printed as it was imported: dropped.
                    Ok(Some(_)) => prepared.lines += 1,
                    Ok(None) => {
                        break Some("the bootstrap ended before it waited for the code".to_owned());
                    }
                    Err(_) if Instant::now() < prepared.ready_by => break None,
                    Err(error) => break Some(format!("the bootstrap: {error}")),
                }
            };
            if let Some(why) = failure {
                if let Some(old) = self.prepared.remove(&language) {
                    let mut notes = Vec::new();
                    let _ = self.teardown_prepared(old, &mut notes);
                }
                eprintln!(
                    "corral worker: no prepared {} jail, its runs go cold: {why}",
                    language.as_str()
                );
                self.prepare_failures.insert(language, why);
            }
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
        let language = request.language;
        // Not ready yet: a run waits for a bootstrap that only starts (milliseconds), or for
        // one whose imports it uses; any other goes cold at once rather than wait a
        // core-second for imports it never uses.
        if let Some(prepared) = self.prepared.get(&language).filter(|p| !p.ready) {
            let wait = !prepared.importing
                || crate::supervisor::command::uses_preimport(
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
                return None;
            }
        }
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

/// Gives every process of a prepared jail (its cgroups' members, and the interpreter) the normal
/// priority back. Best effort: a process that is gone needs none.
pub(super) fn restore_priority(run: &ActiveRun, interpreter: u32) {
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

/// Gives the thread `tid` of this process (the worker's jail thread) and every process it
/// started, with their descendants, the normal priority back, because a request waits for the
/// thread: a preparation at its low priority would otherwise make that request wait behind every
/// run on the machine (decision 0036). Best effort, like [`restore_priority`]: what has exited
/// needs none, and a prepared jail that waits idle costs nothing at any priority.
pub fn hasten(tid: i32) {
    let children = |pid: i32, task: i32| -> Vec<i32> {
        std::fs::read_to_string(format!("/proc/{pid}/task/{task}/children"))
            .map(|text| {
                text.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let process = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    let mut pending = children(process, tid);
    let mut seen = 0usize;
    // Bounded: a jail's processes are few until its code runs, and a run's are the run's.
    while let Some(pid) = pending.pop()
        && seen < HASTEN_PROCESSES_MAX
    {
        seen += 1;
        if let Some(id) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::setpriority_process(Some(id), 0);
        }
        pending.extend(children(pid, pid));
    }
    if let Some(id) = rustix::process::Pid::from_raw(tid) {
        let _ = rustix::process::setpriority_process(Some(id), 0);
    }
}

/// The most processes [`hasten`] renices.
const HASTEN_PROCESSES_MAX: usize = 64;
