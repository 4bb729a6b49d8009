//! The start-up probe: which isolation primitives this worker has.
//!
//! Namespaces and seccomp are tried in a throwaway re-executed process (trying them here would
//! change the supervisor itself); the cgroup controllers by creating and removing a group.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use corral_core::jail::Primitive;
use nix::unistd::geteuid;

use crate::cgroup;

/// What the probe found: each missing primitive with why.
pub type Missing = BTreeMap<Primitive, String>;

/// Probes every primitive. `reexec` re-executes this binary (`program`, `prefix` arguments).
pub fn probe(program: &Path, prefix: &[String], cgroup_root: &Path) -> Missing {
    let mut missing = Missing::new();
    if !geteuid().is_root() {
        missing.insert(
            Primitive::Privileges,
            "the supervisor must run as root (it mounts, maps ids and creates cgroups)".to_owned(),
        );
        return missing;
    }
    match Command::new(program)
        .args(prefix)
        .arg("__probe")
        .env_clear()
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        Ok(output) => {
            let text = String::from_utf8_lossy(&output.stdout);
            for (name, primitive) in [
                ("user_namespaces", Primitive::UserNamespaces),
                ("namespaces", Primitive::Namespaces),
                ("seccomp", Primitive::Seccomp),
            ] {
                let line = text
                    .lines()
                    .find(|line| line.split(' ').next() == Some(name));
                match line.map(|line| line.splitn(3, ' ').collect::<Vec<_>>()) {
                    Some(fields) if fields.get(1) == Some(&"ok") => {}
                    Some(fields) => {
                        missing.insert(
                            primitive,
                            fields.get(2).unwrap_or(&"unavailable").to_string(),
                        );
                    }
                    None => {
                        missing.insert(primitive, "the probe did not report it".to_owned());
                    }
                }
            }
        }
        Err(error) => {
            missing.insert(
                Primitive::Namespaces,
                format!("cannot start the probe: {error}"),
            );
        }
    }
    let probe_name = format!("probe-{}", std::process::id());
    for (controller, primitive) in [
        ("memory", Primitive::CgroupMemory),
        ("pids", Primitive::CgroupPids),
    ] {
        if let Err(error) = cgroup::probe(cgroup_root, controller, &probe_name) {
            missing.insert(primitive, error);
        }
    }
    missing
}
