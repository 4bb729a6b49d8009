//! The baked Python stack (PKG-1) as the worker finds it: an environment built by
//! `scripts/build-python-stack`, whose table is the one this release was built with.

use std::path::{Path, PathBuf};

use corral_core::packages::stack::TABLE;

/// The interpreter a jail runs Python with when there is no stack.
pub(super) const SYSTEM_PYTHON: &str = "/usr/bin/python3";
/// The stack's copy of its table, written by its build.
const TABLE_FILE: &str = "corral-stack.tsv";

/// The stack's interpreter.
pub(super) fn interpreter(stack: &Path) -> String {
    stack.join("bin/python3").to_string_lossy().into_owned()
}

/// The stack at `dir`, if it is one this release can use: its interpreter exists and its table is
/// this release's ([`TABLE`]), so that what resolution promised is what the jail imports.
pub(super) fn find(dir: &Path) -> Result<PathBuf, String> {
    // These are the jail's own: a stack there would be hidden by the run's mounts.
    for owned in ["/tmp", "/workspace", "/run", "/proc", "/dev", "/etc"] {
        if dir.starts_with(owned) {
            return Err(format!(
                "{} is under {owned}, which the jail mounts its own: put the stack elsewhere",
                dir.display()
            ));
        }
    }
    let python = dir.join("bin/python3");
    if !python.exists() {
        return Err(format!(
            "{} has no bin/python3 (build it with scripts/build-python-stack; \
             CORRAL_JAIL_PYTHON_STACK names it)",
            dir.display()
        ));
    }
    let table = std::fs::read_to_string(dir.join(TABLE_FILE))
        .map_err(|e| format!("{}/{TABLE_FILE}: {e}", dir.display()))?;
    if table != TABLE {
        return Err(format!(
            "{}/{TABLE_FILE} is not this release's stack/python/table.tsv: rebuild it with \
             scripts/build-python-stack",
            dir.display()
        ));
    }
    Ok(dir.to_path_buf())
}
