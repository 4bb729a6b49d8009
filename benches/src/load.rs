//! What the load benchmarks through the API share: the machine's CPU counters, the wait for it
//! to be quiet, and the bwrap baseline's command.

use std::time::Duration;

/// Busy and total jiffies of all cores, from /proc/stat.
#[must_use]
pub fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait are the 4th and 5th fields.
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// A process's own CPU ticks so far (user and system, all its threads; hundredths of a second on
/// Linux), from `/proc/<pid>/stat`; 0 once it is gone.
#[must_use]
pub fn process_jiffies(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis (which may hold spaces): utime and
    // stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum()
}

/// The bwrap baseline's command up to the interpreter: every namespace unshared, the read-only
/// host root, a fresh /dev, /proc and /tmp (what a sandbox that does no more than unshare costs).
#[must_use]
pub fn bwrap_prefix(bwrap: &str) -> Vec<String> {
    [
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect()
}

/// Waits, at most `limit`, until the machine is quiet (under [`QUIET_BUSY`] of its CPU busy over
/// a second): a stack just started, or a pool just grown, is still preparing its workers, and a
/// burst measured meanwhile measures that too. Returns how long it waited and whether it was.
pub async fn wait_quiet(limit: Duration) -> (Duration, bool) {
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        let before = cpu_jiffies();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = cpu_jiffies();
        let busy = after.0.saturating_sub(before.0) as f64
            / after.1.saturating_sub(before.1).max(1) as f64;
        if busy < QUIET_BUSY {
            return (started.elapsed(), true);
        }
    }
    (started.elapsed(), false)
}

/// The share of the machine's CPU under which it counts as quiet.
pub const QUIET_BUSY: f64 = 0.10;
