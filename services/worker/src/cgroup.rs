//! The run's cgroups (v1 `memory` and `pids`), below the supervisor's own group in each hierarchy,
//! in a `corral` directory the worker owns.
//!
//! The cgroup is the authoritative list of the run's processes (code cannot leave it: the
//! hierarchy is not mounted in the jail), the memory and process limits, and the counters that
//! show a limit was hit.

use std::fs;
use std::path::{Path, PathBuf};

use corral_core::jail::Primitive;
use nix::sys::statfs::{CGROUP_SUPER_MAGIC, statfs};

/// One controller's group for one run.
#[derive(Clone, Debug)]
struct Group {
    path: PathBuf,
}

/// The counters read after a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// `memory.failcnt`: times usage reached the limit.
    pub memory_limit_hits: Option<u64>,
    /// `oom_kill` in `memory.oom_control`.
    pub oom_kills: Option<u64>,
    /// `max` in `pids.events`: forks refused at `pids.max`.
    pub process_limit_hits: Option<u64>,
}

/// The run's groups; either may be absent in a weaker posture the operator accepted.
#[derive(Debug, Default)]
pub struct RunCgroups {
    memory: Option<Group>,
    pids: Option<Group>,
}

/// The group the runs' groups are made under in `controller`'s hierarchy at `root`: the
/// supervisor's own group (so the limits of whatever runs the supervisor still apply), or the
/// hierarchy's root when that group is not visible at this path.
fn base(root: &Path, controller: &str) -> PathBuf {
    let hierarchy = root.join(controller);
    let own = fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|table| {
            table.lines().find_map(|line| {
                let mut fields = line.splitn(3, ':');
                let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
                controllers
                    .split(',')
                    .any(|name| name == controller)
                    .then(|| path.trim_start_matches('/').to_owned())
            })
        });
    match own {
        Some(own) if !own.is_empty() && hierarchy.join(&own).is_dir() => hierarchy.join(own),
        _ => hierarchy,
    }
}

/// The worker's `corral` group under [`base`], created if missing. Nothing is created unless the
/// base is a mounted cgroup v1 hierarchy: a wrong root must not litter the filesystem.
fn corral_group(root: &Path, controller: &str) -> Result<PathBuf, String> {
    let base = base(root, controller);
    let is_cgroup = statfs(&base).is_ok_and(|fs| fs.filesystem_type() == CGROUP_SUPER_MAGIC);
    if !is_cgroup {
        return Err(format!(
            "{} is not a cgroup v1 {controller} hierarchy",
            base.display()
        ));
    }
    let group = base.join("corral");
    match fs::create_dir(&group) {
        Ok(()) => Ok(group),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(group),
        Err(error) => Err(format!("create {}: {error}", group.display())),
    }
}

/// Whether a group can be created under `controller` at `root`: creates and removes a probe group.
pub fn probe(root: &Path, controller: &str, name: &str) -> Result<(), String> {
    let path = corral_group(root, controller)?.join(name);
    fs::create_dir(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
    fs::remove_dir(&path).map_err(|e| format!("remove {}: {e}", path.display()))
}

/// The runs' groups (`run-<supervisor pid>-…`) in `controller`'s hierarchy at `root`, as a
/// supervisor of this process's group would make them: what a harness checks for leftovers.
pub fn run_groups(root: &Path, controller: &str) -> Vec<PathBuf> {
    let Ok(listing) = fs::read_dir(base(root, controller).join("corral")) else {
        return Vec::new();
    };
    listing
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("run-"))
        .map(|entry| entry.path())
        .collect()
}

/// Removes the empty groups that supervisors which are no longer running left behind (a
/// supervisor that crashed cannot remove its own). A group's name carries its supervisor's pid.
pub fn remove_stale(root: &Path, controller: &str) {
    let Ok(listing) = fs::read_dir(base(root, controller).join("corral")) else {
        return;
    };
    for entry in listing.flatten() {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|n| n.strip_prefix("run-"))
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        let owner_alive = Path::new("/proc").join(owner).exists();
        let empty = fs::read_to_string(entry.path().join("cgroup.procs"))
            .is_ok_and(|procs| procs.trim().is_empty());
        if !owner_alive && empty {
            // Best effort: a group that is not empty after all refuses removal, which is right.
            let _ = fs::remove_dir(entry.path());
        }
    }
}

/// Creates the group at `path`. One left by an earlier supervisor that had this pid is removed
/// first (it must be empty), so that no counter of an old run is read as this run's.
fn fresh_group(path: &Path) -> Result<(), String> {
    if path.exists() {
        fs::remove_dir(path).map_err(|e| format!("remove the stale {}: {e}", path.display()))?;
    }
    fs::create_dir(path).map_err(|e| format!("create {}: {e}", path.display()))
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    fs::write(path, value).map_err(|e| format!("write {}: {e}", path.display()))
}

impl RunCgroups {
    /// Creates the groups the posture calls for and sets their limits. A controller that fails
    /// here was available at start; the failure is reported with the primitive it concerns.
    pub fn create(
        root: &Path,
        name: &str,
        memory_bytes: Option<u64>,
        processes: Option<u32>,
    ) -> Result<Self, (Primitive, String)> {
        let mut groups = Self::default();
        if let Some(bytes) = memory_bytes {
            let fail = |e| (Primitive::CgroupMemory, e);
            let path = corral_group(root, "memory").map_err(fail)?.join(name);
            fresh_group(&path).map_err(fail)?;
            groups.memory = Some(Group { path: path.clone() });
            write(&path.join("memory.limit_in_bytes"), &bytes.to_string()).map_err(fail)?;
            // With swap accounting, memory plus swap gets the same limit, so the run cannot
            // swap its way past it. Without it the file is absent and there is nothing to do.
            let memsw = path.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(&memsw, &bytes.to_string()).map_err(fail)?;
            }
        }
        if let Some(count) = processes {
            let fail = |e| (Primitive::CgroupPids, e);
            let path = corral_group(root, "pids").map_err(fail)?.join(name);
            fresh_group(&path).map_err(fail)?;
            groups.pids = Some(Group { path: path.clone() });
            write(&path.join("pids.max"), &count.to_string()).map_err(fail)?;
        }
        Ok(groups)
    }

    /// Moves process `pid` into every group.
    pub fn add(&self, pid: u32) -> Result<(), (Primitive, String)> {
        for (group, primitive) in [
            (&self.memory, Primitive::CgroupMemory),
            (&self.pids, Primitive::CgroupPids),
        ] {
            if let Some(group) = group {
                write(&group.path.join("cgroup.procs"), &pid.to_string())
                    .map_err(|e| (primitive, e))?;
            }
        }
        Ok(())
    }

    /// Groups at `memory` and `pids` that nothing created (for tests of what reads them).
    #[cfg(test)]
    pub(crate) fn at(memory: PathBuf, pids: PathBuf) -> Self {
        Self {
            memory: Some(Group { path: memory }),
            pids: Some(Group { path: pids }),
        }
    }

    /// Whether any group exists.
    pub fn any(&self) -> bool {
        self.memory.is_some() || self.pids.is_some()
    }

    /// The processes in any group; `None` when a group exists but cannot be read.
    pub fn processes(&self) -> Option<Vec<i32>> {
        let mut all = Vec::new();
        for group in [&self.memory, &self.pids].into_iter().flatten() {
            let text = fs::read_to_string(group.path.join("cgroup.procs")).ok()?;
            all.extend(
                text.lines()
                    .filter_map(|line| line.trim().parse::<i32>().ok()),
            );
        }
        all.sort_unstable();
        all.dedup();
        Some(all)
    }

    /// The limit counters.
    pub fn counters(&self) -> Counters {
        let read = |group: &Option<Group>, file: &str| {
            group
                .as_ref()
                .and_then(|group| fs::read_to_string(group.path.join(file)).ok())
        };
        let field = |text: Option<String>, name: &str| {
            text.and_then(|text| {
                text.lines().find_map(|line| {
                    let (key, value) = line.split_once(' ')?;
                    (key == name)
                        .then(|| value.trim().parse::<u64>().ok())
                        .flatten()
                })
            })
        };
        Counters {
            memory_limit_hits: read(&self.memory, "memory.failcnt")
                .and_then(|text| text.trim().parse().ok()),
            oom_kills: field(read(&self.memory, "memory.oom_control"), "oom_kill"),
            process_limit_hits: field(read(&self.pids, "pids.events"), "max"),
        }
    }

    /// Removes the groups (they must be empty of processes). Returns what could not be removed.
    pub fn remove(&mut self) -> Vec<String> {
        let mut failures = Vec::new();
        for group in [&mut self.memory, &mut self.pids] {
            if let Some(existing) = group.take() {
                // An empty group's removal can race the last task's exit accounting; retry briefly.
                let mut result = fs::remove_dir(&existing.path);
                for _ in 0..50 {
                    if result.is_ok() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    result = fs::remove_dir(&existing.path);
                }
                if let Err(error) = result {
                    failures.push(format!(
                        "remove cgroup {}: {error}",
                        existing.path.display()
                    ));
                }
            }
        }
        failures
    }
}
