//! Clock steps on one API replica (issue 27): a small preloaded library (`clock_shim.c`, built
//! with the machine's C compiler when a run starts) shifts the replica's wall clock by what its
//! clock file says, and nothing else's. A step stays within what the design tolerates: the grant's
//! clock skew bound, since Corral's deployment time is Valkey's and a replica's own wall clock
//! reaches only what it signs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use corral_core::egress::grant::GRANT_CLOCK_SKEW_MAX_MS;

/// The environment variable naming a process's clock file.
pub const CLOCK_FILE: &str = "CORRAL_CHAOS_CLOCK_FILE";

/// The largest step: two thirds of the grant's clock skew bound, either way.
pub const STEP_MAX_MS: u64 = GRANT_CLOCK_SKEW_MAX_MS * 2 / 3;

/// The smallest step worth making: longer than a lease's heartbeat, so a clock a replica trusted
/// where it must not would show.
pub const STEP_MIN_MS: u64 = 5_000;

const SHIM: &str = include_str!("clock_shim.c");

/// Builds the shim into `dir`; the reason when it cannot (no C compiler).
///
/// # Errors
/// When `cc` is missing or fails.
pub fn build_shim(dir: &Path) -> Result<PathBuf, String> {
    let source = dir.join("clock-shim.c");
    let library = dir.join("clock-shim.so");
    fs::write(&source, SHIM).map_err(|e| format!("{}: {e}", source.display()))?;
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "cc failed: {}",
            String::from_utf8_lossy(&built.stderr).trim()
        ));
    }
    Ok(library)
}

/// Steps the clock of whoever reads `file` to `offset_ms` from the true time (0: back to it).
///
/// # Errors
/// When the file cannot be written.
pub fn step(file: &Path, offset_ms: i64) -> Result<(), String> {
    fs::write(file, offset_ms.to_string()).map_err(|e| format!("{}: {e}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seconds(output: &std::process::Output) -> i64 {
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("date +%s prints seconds")
    }

    /// The shim moves the wall clock of the process it is preloaded into by the file's offset,
    /// follows a step at once, and leaves every other process's clock alone.
    #[test]
    fn a_step_moves_only_the_preloaded_process_wall_clock() {
        let dir = std::env::temp_dir().join(format!("corral-chaos-clock-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("a directory");
        let library = match build_shim(&dir) {
            Ok(library) => library,
            Err(why) => {
                corral_testkit::skip(
                    "a_step_moves_only_the_preloaded_process_wall_clock",
                    corral_testkit::Need::Tools,
                    &why,
                );
                return;
            }
        };
        let file = dir.join("clock");
        let date = |preloaded: bool| {
            let mut command = Command::new("date");
            command.arg("+%s").env(CLOCK_FILE, &file);
            if preloaded {
                command.env("LD_PRELOAD", &library);
            }
            command.output().expect("date runs")
        };
        step(&file, 100_000).expect("steps");
        let (plain, stepped) = (seconds(&date(false)), seconds(&date(true)));
        assert!(
            (95..=105).contains(&(stepped - plain)),
            "{plain} then {stepped}"
        );
        step(&file, -100_000).expect("steps back past the true time");
        let (plain, stepped) = (seconds(&date(false)), seconds(&date(true)));
        assert!(
            (95..=105).contains(&(plain - stepped)),
            "{plain} then {stepped}"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
