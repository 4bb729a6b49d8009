//! Finding and killing a run's processes, and counting what a reset left behind.
//!
//! A run's processes are those in its cgroups and those whose uid is one of the run's two host
//! uids (which no one else uses; see [`processes_of_uids`] for why the effective uid is every
//! uid such a process holds). Either list alone would do; both are used so that a reset proves
//! itself even where one is unavailable.

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
/// Each process's effective uid is read as the owner of its /proc directory, which /proc gives
/// the effective uid whatever the process's dumpable flag (only the files inside change owner):
/// one `statx` a process, where a status file costs the kernel five times as much to write, and
/// a reset between leases makes one scan of every process on the host (six hundred on a machine
/// of a hundred workers). For the uids of runs the effective uid is every uid: a run's process
/// holds no uid outside its run's two (its user namespace maps only those; without one, stage 2
/// sets all of them at once), and it cannot gain one by executing (`no_new_privs`, and every
/// mount of the jail `nosuid`). So a process with a run's uid in any of its real, effective,
/// saved or filesystem uids has it as its effective uid, and is found.
pub fn processes_of_uids(uids: &[u32]) -> Option<BTreeSet<i32>> {
    use std::os::unix::fs::MetadataExt as _;
    let mut found = BTreeSet::new();
    if uids.is_empty() {
        return Some(found);
    }
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // A process that exits while we look is simply gone.
        // Read beside the listing (the entry's name under /proc's descriptor), not by path.
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if uids.contains(&meta.uid()) {
            found.insert(pid);
        }
    }
    Some(found)
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
    fn a_process_is_found_by_its_effective_uid() {
        let pid = i32::try_from(std::process::id()).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        assert!(processes_of_uids(&[me]).unwrap().contains(&pid));
        assert!(!processes_of_uids(&[4_000_000_001]).unwrap().contains(&pid));
    }

    #[test]
    fn a_process_that_made_itself_undumpable_is_still_found_by_its_uid() {
        use std::io::{BufRead as _, Write as _};
        use std::os::unix::fs::MetadataExt as _;
        if !corral_testkit::is_root() {
            corral_testkit::skip(
                "a_process_that_made_itself_undumpable_is_still_found_by_its_uid",
                corral_testkit::Need::Root,
                "a process of another uid is started with setpriv",
            );
            return;
        }
        let uid = 4_000_000_002u32;
        // PR_SET_DUMPABLE is 4: the process's /proc files then belong to root, not to its uid.
        let mut child = std::process::Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                "import ctypes, sys\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\nprint('ready', flush=True)\nsys.stdin.read()\n",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        let pid = i32::try_from(child.id()).unwrap();
        let status = fs::metadata(format!("/proc/{pid}/status")).unwrap();
        assert_eq!(status.uid(), 0, "the process is not undumpable");
        let found = processes_of_uids(&[uid]).unwrap();
        let _ = child.stdin.take().unwrap().write_all(b"");
        drop(child.stdin.take());
        let _ = child.wait();
        assert!(found.contains(&pid), "{found:?}");
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
