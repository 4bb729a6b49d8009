//! Supervising a run: its output until it ends or the wall limit, then what it left behind.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use corral_core::bounds::{BoundObservations, OutputStream, bounds_hit};
use corral_core::downloads;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use rustix::process::{PidfdFlags, pidfd_open};

use super::launch::Started;
use super::{ActiveRun, RunRequest, Worker};
use crate::archive::{self, ArchiveError};
use crate::capture;
use crate::result::{RunResult, note};
use crate::sweep;
use crate::workspace::{self, RunDirs};
use corral_stages::plan::SIGNAL_EXIT_BASE;

/// How long the pipes are read after a kill.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

impl Worker {
    /// Captures the code's output until it ends or the wall limit; kills whatever is left.
    /// Returns what it observed about the bounds (the filesystems are measured later).
    pub(super) fn supervise(
        &self,
        started: Started,
        run: &mut ActiveRun,
        result: &mut RunResult,
        wall_seconds: u64,
        tap: Option<&capture::Tap>,
    ) -> (BoundObservations, bool) {
        let mut tapper = tap.cloned().map(capture::Tapper::new);
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
            tapper.as_mut(),
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
            capture::drain_after_kill(streams, &mut captured, DRAIN_GRACE, tapper.as_mut());
        } else if status.is_none()
            && let Ok(found) = waitpid(Pid::from_raw(pid), None)
        {
            status = Some(found);
        }
        // Forget the child: it is reaped (or will be by the sweep), and must not be waited again.
        run.stage1 = None;
        // Nothing of the run may be alive while its files are read. With its cgroups, the run's
        // processes are theirs: stage 1 entered them before it started anything, and nothing in
        // the jail may leave them. The scan of every process on the host by uid (1.6 ms a run on
        // a quiet machine) is for a run without them; the reset between leases makes it for
        // every run before the worker is handed on.
        let uids: &[u32] = if run.cgroups.any() { &[] } else { &run.uids };
        let (left, _) = sweep::kill_run(None, &run.cgroups, uids);
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
        if let Some(tapper) = tapper.as_mut() {
            tapper.finish();
        }
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
    pub(super) fn collect(
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
        copy_back(
            request,
            dirs,
            &selection.downloads,
            &mut result.reply.diagnostics,
        );
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
        if all_dead {
            read_results(dirs, result);
        }
    }
}

/// Copies each download back into the request's workspace, when it names one; notes any that
/// could not be.
fn copy_back(
    request: &RunRequest,
    dirs: &RunDirs,
    downloads: &[downloads::Download],
    diagnostics: &mut Vec<String>,
) {
    for download in downloads {
        if let Some(destination) = &request.workspace
            && let Err(error) = workspace::copy_out(&dirs.workspace(), &download.path, destination)
        {
            note(
                diagnostics,
                format!("download {} not copied back: {error}", download.path),
            );
        }
    }
}

/// The run's rich results (`corral_core::run::results`), from the file its interpreter wrote in
/// its `/tmp`: read without following a link, at most `FILE_MAX_BYTES`, and kept as the core
/// accepts them; what is left out is noted. Read only once nothing of the run is alive.
fn read_results(dirs: &RunDirs, result: &mut RunResult) {
    use corral_core::run::results::{FILE, FILE_MAX_BYTES, accept};
    use std::io::Read as _;
    let file = match super::kernel::open_checked(&dirs.scratch().join("tmp"), FILE) {
        Ok(Some(file)) => file,
        Ok(None) => return,
        Err(why) => {
            note(&mut result.reply.diagnostics, format!("results: {why}"));
            return;
        }
    };
    let mut text = String::new();
    if let Err(error) = file.take(FILE_MAX_BYTES).read_to_string(&mut text) {
        note(
            &mut result.reply.diagnostics,
            format!("results: not read ({error})"),
        );
        return;
    }
    let (results, notes) = accept(&text);
    for why in notes {
        note(&mut result.reply.diagnostics, why);
    }
    result.reply.results = results;
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

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
