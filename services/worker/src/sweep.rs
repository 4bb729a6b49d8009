//! Finding and killing a run's processes, and counting what a reset left behind.
//!
//! A run's processes are those in its cgroups and those whose real, effective, saved or
//! filesystem uid is one of the run's two host uids (which no one else uses). Either list alone
//! would do; both are used so that a reset proves itself even where one is unavailable.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::cgroup::RunCgroups;
use corral_stages::mounts::mount_points;

/// How long a reset keeps killing before it reports what survived.
const KILL_DEADLINE: Duration = Duration::from_secs(5);
/// The pause between kill rounds, so that the kernel can finish the killed processes' exits.
const KILL_ROUND_PAUSE: Duration = Duration::from_millis(1);

/// Processes on the host whose uids include any of `uids`; `None` when /proc cannot be read.
///
/// Its cost is one status file per process on the host (a reset between leases makes one scan:
/// on a machine of a hundred workers, six hundred files), most of it the kernel writing each
/// file; each is read with one `read` into one buffer, not grown into a string.
pub fn processes_of_uids(uids: &[u32]) -> Option<BTreeSet<i32>> {
    let mut found = BTreeSet::new();
    if uids.is_empty() {
        return Some(found);
    }
    let mut buffer = vec![0u8; STATUS_READ_BYTES];
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // A process that exits while we look is simply gone.
        let Some(ids) = status_uids(pid, &mut buffer) else {
            continue;
        };
        if ids.iter().any(|id| uids.contains(id)) {
            found.insert(pid);
        }
    }
    Some(found)
}

/// How much of a status file one read takes: the `Uid:` line is its ninth, a few hundred bytes in.
const STATUS_READ_BYTES: usize = 4_096;

/// The real, effective, saved and filesystem uids of process `pid` from its status file, read
/// until its `Uid:` line; `None` if the process is gone or the file says none.
fn status_uids(pid: i32, buffer: &mut [u8]) -> Option<Vec<u32>> {
    use std::io::Read as _;
    let mut file = fs::File::open(format!("/proc/{pid}/status")).ok()?;
    let mut filled = 0;
    loop {
        let text = buffer.get(..filled)?;
        if let Some(ids) = uid_line(text) {
            return Some(ids);
        }
        let read = file.read(buffer.get_mut(filled..)?).ok()?;
        if read == 0 {
            return None;
        }
        filled += read;
    }
}

/// The uids of a complete `Uid:` line in the start of a status file.
fn uid_line(text: &[u8]) -> Option<Vec<u32>> {
    let start = text.windows(5).position(|w| w == b"\nUid:")? + 5;
    let end = start + text.get(start..)?.iter().position(|b| *b == b'\n')?;
    let ids = std::str::from_utf8(text.get(start..end)?).ok()?;
    Some(
        ids.split_whitespace()
            .filter_map(|id| id.parse::<u32>().ok())
            .collect(),
    )
}

/// The run's processes: its cgroups' members and its uids' processes. `None` when neither list
/// could be read.
pub fn run_processes(cgroups: &RunCgroups, uids: &[u32]) -> Option<BTreeSet<i32>> {
    let by_uid = processes_of_uids(uids);
    let by_group = if cgroups.any() {
        cgroups.processes()
    } else {
        None
    };
    match (by_uid, by_group) {
        (None, None) => None,
        (by_uid, by_group) => {
            let mut all = by_uid.unwrap_or_default();
            all.extend(by_group.unwrap_or_default());
            Some(all)
        }
    }
}

/// Reaps every exited child of the supervisor (it is a child subreaper, so the run's orphans
/// come to it). Returns the status of `watched` if it was among them.
pub fn reap_children(watched: Option<i32>) -> Option<WaitStatus> {
    let mut seen = None;
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return seen,
            Ok(status) => {
                if status.pid().map(Pid::as_raw) == watched {
                    seen = Some(status);
                }
            }
        }
    }
}

/// Kills the run: stage 1 first (pid 1 of the jail dies with it, and the jail with pid 1), then
/// every process of the run, in rounds, until none is left or the deadline passes. Returns the
/// count left (`None` if it could not be counted) and stage 1's status if reaped here.
///
/// The rounds read the run's cgroups (one small file each); the scan of every process's uids,
/// which costs a read of each process's status on the host, is the proof: it runs once the
/// cgroups are empty, and every round after it finds anything (or when there are no cgroups).
/// So a reset still counts what either list holds, and pays for one scan, not one per round.
/// With no `uids` there is no scan: only the cgroups are read (a reset whose proof is made by the
/// reset between leases, which scans every uid of the supervisor's runs).
pub fn kill_run(
    stage1: Option<i32>,
    cgroups: &RunCgroups,
    uids: &[u32],
) -> (Option<u32>, Option<WaitStatus>) {
    let mut stage1_status = None;
    if let Some(pid) = stage1.filter(|pid| *pid > 1) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + KILL_DEADLINE;
    let mut scan = !cgroups.any();
    loop {
        if let Some(status) = reap_children(stage1) {
            stage1_status = Some(status);
        }
        let listed = if scan {
            run_processes(cgroups, uids)
        } else {
            cgroups.processes().map(|pids| pids.into_iter().collect())
        };
        let left = match listed {
            Some(left) if !scan && left.is_empty() => {
                scan = true;
                continue;
            }
            Some(left) => left,
            // Unreadable groups: the scan of the uids proves instead, when there are uids.
            None if !scan && !uids.is_empty() => {
                scan = true;
                continue;
            }
            None => return (None, stage1_status),
        };
        if left.is_empty() || Instant::now() >= deadline {
            return (u32::try_from(left.len()).ok(), stage1_status);
        }
        for pid in left {
            // Never 0 or -1 (the caller's group, or every process), never the host's init.
            if pid > 1 {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        std::thread::sleep(KILL_ROUND_PAUSE);
    }
}

/// Mounts at or below `dir` in the supervisor's mount namespace; `None` if the table is unreadable.
pub fn mounts_under(dir: &Path) -> Option<u32> {
    mounts_under_each(&[dir]).pop().flatten()
}

/// [`mounts_under`] for each of `dirs`, from one reading of the mount table (a reset between
/// leases measures every run directory: one reading each cost a reset more than the rest of it).
pub fn mounts_under_each(dirs: &[&Path]) -> Vec<Option<u32>> {
    let Ok(table) = fs::read_to_string("/proc/self/mountinfo") else {
        return vec![None; dirs.len()];
    };
    let points = mount_points(&table);
    dirs.iter()
        .map(|dir| {
            let count = points.iter().filter(|point| point.starts_with(dir)).count();
            u32::try_from(count).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreadable() -> RunCgroups {
        let gone = Path::new("/nonexistent/corral-sweep-test");
        RunCgroups::at(gone.join("memory"), gone.join("pids"))
    }

    #[test]
    fn the_uid_line_is_read_only_once_it_is_whole() {
        let status = b"Name:\tpython3\nUmask:\t0022\nUid:\t1879048194\t1879048195\t7\t8\nGid:\t0\n";
        assert_eq!(
            uid_line(status),
            Some(vec![1_879_048_194, 1_879_048_195, 7, 8])
        );
        // Cut inside the line: not yet (the next read completes it).
        assert_eq!(uid_line(&status[..30]), None);
        assert_eq!(uid_line(b"Name:\tx\nGid:\t0\n"), None);
    }

    #[test]
    fn this_process_is_found_by_its_own_uid() {
        let me = nix::unistd::getuid().as_raw();
        let pid = i32::try_from(std::process::id()).unwrap();
        let mut buffer = vec![0u8; STATUS_READ_BYTES];
        assert_eq!(status_uids(pid, &mut buffer).unwrap()[0], me);
        assert!(processes_of_uids(&[me]).unwrap().contains(&pid));
        assert!(!processes_of_uids(&[4_000_000_001]).unwrap().contains(&pid));
    }

    #[test]
    fn groups_that_cannot_be_read_and_no_uids_to_scan_leave_the_run_uncounted() {
        // Not "nothing left": nothing could say so (the supervision then packs nothing).
        assert_eq!(kill_run(None, &unreadable(), &[]).0, None);
    }

    #[test]
    fn groups_that_cannot_be_read_are_proved_by_the_uid_scan_instead() {
        // A uid no process has: the scan reads every process and finds none of it.
        assert_eq!(kill_run(None, &unreadable(), &[4_000_000_001]).0, Some(0));
    }
}
