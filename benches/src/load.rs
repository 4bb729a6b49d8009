//! What the load benchmarks through the API share: the machine's CPU counters and the bwrap
//! baseline's command.

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
