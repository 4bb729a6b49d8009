//! What a chaos run must never leave behind: a process, a mount, a cgroup, a tmpfs, a network
//! link. Checked
//! before a run starts (a run refuses to start over what an earlier one left) and after it ends,
//! interrupted or not.
//!
//! Processes are found by [`MARKER`] in their environment, and, for jailed processes (whose
//! environment the jail replaces), as descendants of the harness, which is a child subreaper so
//! that whatever a killed parent orphans stays its descendant. Mounts are those under the run's
//! directory; cgroups are the jail's per-run groups (`run-<supervisor pid>-…`) under the
//! harness's own group, which the workers inherit: one in use (a process in it, or its
//! supervisor alive) is another deployment's running jail or what this run left, and one unused
//! is stale (an earlier deployment's supervisor killed before it could remove it) and is removed.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::deploy::MARKER;

/// The cgroup v1 controllers the jail makes per-run groups in.
const CONTROLLERS: [&str; 2] = ["memory", "pids"];
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Makes this process a child subreaper.
///
/// # Errors
/// When the kernel refuses.
pub fn become_subreaper() -> Result<(), String> {
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("PR_SET_CHILD_SUBREAPER: {e}"))
}

/// Mounts a tmpfs of `bytes` at `path`.
///
/// # Errors
/// When the mount fails.
pub fn mount_tmpfs(path: &Path, bytes: u64) -> Result<(), String> {
    nix::mount::mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={bytes},mode=0755").as_str()),
    )
    .map_err(|e| format!("mount a tmpfs at {}: {e}", path.display()))
}

/// Remounts the tmpfs at `path` read-only or read-write.
///
/// # Errors
/// When the remount fails.
pub fn remount(path: &Path, read_only: bool) -> Result<(), String> {
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    nix::mount::mount(None::<&str>, path, None::<&str>, flags, None::<&str>)
        .map_err(|e| format!("remount {}: {e}", path.display()))
}

/// Processes carrying `dir` as their [`MARKER`].
fn marked(dir: &Path) -> BTreeSet<i32> {
    marked_where(&format!("{MARKER}={}", dir.display()))
}

/// Processes of any chaos run, whatever its directory.
fn any_marked() -> BTreeSet<i32> {
    marked_where(&format!("{MARKER}="))
}

/// Processes with an environment variable that starts with `wanted` (`NAME=VALUE` matches
/// exactly; `NAME=` matches every value).
fn marked_where(wanted: &str) -> BTreeSet<i32> {
    let exact = !wanted.ends_with('=');
    let mut found = BTreeSet::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(environ) = fs::read(entry.path().join("environ"))
            && environ.split(|b| *b == 0).any(|var| {
                if exact {
                    var == wanted.as_bytes()
                } else {
                    var.starts_with(wanted.as_bytes())
                }
            })
        {
            found.insert(pid);
        }
    }
    found
}

/// Every descendant of this process.
fn descendants() -> BTreeSet<i32> {
    let me = std::process::id() as i32;
    let mut parents: Vec<(i32, i32)> = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // The parent is the second field after the command's closing parenthesis.
            let Some(ppid) = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok())
            else {
                continue;
            };
            parents.push((pid, ppid));
        }
    }
    let mut found = BTreeSet::new();
    let mut frontier = vec![me];
    while let Some(parent) = frontier.pop() {
        for (pid, ppid) in &parents {
            if *ppid == parent && found.insert(*pid) {
                frontier.push(*pid);
            }
        }
    }
    found
}

/// Mount points at or under `dir`.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(table) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    table
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(PathBuf::from)
        .filter(|point| point.starts_with(dir))
        .collect()
}

/// The jail's per-run groups in `controller`'s hierarchy, under this process's group, which the
/// workers inherit (corral-worker's one definition of where they are).
fn jail_groups(controller: &str) -> Vec<PathBuf> {
    corral_worker::run_groups(Path::new(CGROUP_ROOT), controller)
}

/// Removes the jail's groups nobody uses: empty, their supervisor gone (corral-worker's rule).
pub fn remove_stale_groups() {
    for controller in CONTROLLERS {
        corral_worker::remove_stale_run_groups(Path::new(CGROUP_ROOT), controller);
    }
}

/// Clears what a run that is no longer alive left (its machine's network link, the mounts under
/// `dir`) when no process of any chaos run is alive, and says what it cleared, each as a line.
/// A run killed whole (its processes, say, by a timeout that stopped a test binary) leaves
/// those, which nothing else removes; while any run is alive they may be its, and stay for
/// [`leftovers`] to refuse.
#[must_use]
pub fn clear_stale(dir: &Path) -> Vec<String> {
    if !any_marked().is_empty() {
        return Vec::new();
    }
    let mut cleared = Vec::new();
    if crate::egress::link_exists() {
        crate::egress::remove_link();
        cleared.push(format!("network link {}", crate::egress::LINK));
    }
    for point in unmount_under(dir) {
        cleared.push(format!("mount {}", point.display()));
    }
    cleared
}

/// Unmounts (lazily) every mount at or under `dir`, deepest first; returns those it unmounted.
fn unmount_under(dir: &Path) -> Vec<PathBuf> {
    let mut points = mounts_under(dir);
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.retain(|point| nix::mount::umount2(point, MntFlags::MNT_DETACH).is_ok());
    points
}

/// What is left of a run in `dir`, each as a line; empty when nothing is. Before a run, only
/// what carries the run's marker counts as its process (`descendants` false: a test process may
/// have other children); after one, every descendant of the harness is its too.
#[must_use]
pub fn leftovers(dir: &Path, descendants_too: bool) -> Vec<String> {
    let mut found = Vec::new();
    let mut pids = marked(dir);
    if descendants_too {
        pids.extend(descendants());
    }
    for pid in &pids {
        let command = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .unwrap_or_default();
        found.push(format!("process {pid}: {}", command.trim()));
    }
    for point in mounts_under(dir) {
        found.push(format!("mount {}", point.display()));
    }
    if crate::egress::link_exists() {
        found.push(format!("network link {}", crate::egress::LINK));
    }
    remove_stale_groups();
    for controller in CONTROLLERS {
        for group in jail_groups(controller) {
            found.push(format!("cgroup {} (in use)", group.display()));
        }
    }
    found
}

/// Kills every process of the run, unmounts what it mounted and removes its groups, then says
/// what could not be removed.
pub fn clean(dir: &Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids: BTreeSet<i32> = marked(dir).union(&descendants()).copied().collect();
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        // Reap what was ours (children, and orphans reparented to this subreaper).
        while let Ok(status) = nix::sys::wait::waitpid(
            Pid::from_raw(-1),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        ) {
            if status == nix::sys::wait::WaitStatus::StillAlive {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    crate::egress::remove_link();
    unmount_under(dir);
    // The run's jail groups, once the processes in them have finished exiting (a killed process
    // at a low priority on a busy machine takes a while to free its memory and leave its group).
    // Every process of the run is gone now, so each group that is empty is removed whatever its
    // name's supervisor pid says: that pid may already be another process's.
    loop {
        remove_stale_groups();
        let mut remaining = 0;
        for controller in CONTROLLERS {
            for group in jail_groups(controller) {
                if fs::remove_dir(&group).is_err() {
                    remaining += 1;
                }
            }
        }
        if remaining == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    leftovers(dir, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run killed whole leaves its link and its directory's mounts; with no chaos run alive the
    /// next run clears both, and then finds nothing left.
    #[test]
    fn what_a_run_no_longer_alive_left_is_cleared_before_the_next() {
        let test = "what_a_run_no_longer_alive_left_is_cleared_before_the_next";
        if !corral_testkit::is_root() {
            corral_testkit::skip(test, corral_testkit::Need::Root, "makes a link and a mount");
            return;
        }
        assert!(
            any_marked().is_empty(),
            "a chaos run is alive on this machine; this test clears only a dead run's leftovers"
        );
        let dir = PathBuf::from(format!(
            "/var/tmp/corral-chaos-hygiene-{}",
            std::process::id()
        ));
        let store = dir.join("store");
        fs::create_dir_all(&store).expect("a directory");
        mount_tmpfs(&store, 1 << 20).expect("a tmpfs");
        corral_testkit::dns::ip(&[
            "link",
            "add",
            crate::egress::LINK,
            "type",
            "veth",
            "peer",
            "name",
            crate::egress::PEER,
        ])
        .expect("a veth pair");
        let before = leftovers(&dir, false);
        assert!(
            before.iter().any(|l| l.starts_with("mount ")),
            "the mount counts as left behind: {before:?}"
        );
        let cleared = clear_stale(&dir);
        let after = leftovers(&dir, false);
        let _ = fs::remove_dir_all(&dir);
        assert!(
            cleared.contains(&format!("network link {}", crate::egress::LINK)),
            "{cleared:?}"
        );
        assert!(
            cleared.contains(&format!("mount {}", store.display())),
            "{cleared:?}"
        );
        assert!(
            after.is_empty(),
            "nothing is left after clearing: {after:?}"
        );
        assert!(!crate::egress::link_exists());
    }
}
