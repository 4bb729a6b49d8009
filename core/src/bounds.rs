//! The bounds of one run (BOUND-1): the configured ceilings, the lower ones a caller may ask
//! for, which bounds a finished run hit, and how its output is capped.
//!
//! The worker measures and enforces; every decision about what a measurement means is made here,
//! so the API's admission, the worker's control API and its operator tool agree.

use std::collections::BTreeSet;

/// The bounds of one run (BOUND-1) and of the worker that hosts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutionBounds {
    /// `SANDBOX_MAX_WALL_SECONDS` (default 30): wall-clock limit of one run.
    pub max_wall_seconds: u64,
    /// `SANDBOX_MAX_OUTPUT_BYTES` (default 1 MiB): most stdout and stderr one run returns.
    pub max_output_bytes: u64,
    /// `SANDBOX_MAX_ARTIFACT_BYTES` (default 10 MiB): largest output file one run returns.
    pub max_artifact_bytes: u64,
    /// `SANDBOX_WORKSPACE_MAX_BYTES` (default 8 MiB): largest workspace snapshot.
    pub workspace_max_bytes: u64,
    /// `SANDBOX_HASHLINE_STATE_MAX_BYTES` (default 64 MiB): largest Hashline authority record.
    pub hashline_state_max_bytes: u64,
    /// `SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS` (default 120): longest a dependency install takes.
    pub dependency_install_timeout_seconds: u64,
    /// `SANDBOX_MAX_MEMORY_BYTES` (Corral's default 512 MiB): memory limit of a run's processes.
    pub max_memory_bytes: u64,
    /// `SANDBOX_MAX_PROCESSES` (Corral's default 64): most processes a run has at once.
    pub max_processes: u32,
    /// `SANDBOX_TMP_MAX_BYTES` (Corral's default 64 MiB): size of a run's temporary directory.
    pub tmp_max_bytes: u64,
}

/// Whether code of `code_bytes` may run under `bounds`: it is written into the workspace, so it
/// may be no larger than `SANDBOX_WORKSPACE_MAX_BYTES`. The one rule the API admits by and the
/// worker refuses by (`code_too_large`).
#[must_use]
pub fn code_fits(code_bytes: usize, bounds: &ExecutionBounds) -> bool {
    u64::try_from(code_bytes).is_ok_and(|bytes| bytes <= bounds.workspace_max_bytes)
}

/// The variables through which a run's numerical libraries learn how many threads to start:
/// OpenBLAS's (numpy and scipy each load one), and OpenMP's and MKL's, which packages a run
/// installs may load. Each is set to [`run_cpus`] (decision 0063).
pub const LIBRARY_THREAD_VARIABLES: [&str; 3] =
    ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"];

/// OpenBLAS's idle wait: its threads look for more work for 2^N cycles before they sleep, and 4
/// is the least it accepts. Its default (2^28, about a tenth of a second) spent that tenth of a
/// core per thread after every import of numpy, so in each prepared jail, whether or not a run
/// ever called into it (decision 0063).
pub const OPENBLAS_IDLE_WAIT: (&str, &str) = ("OPENBLAS_THREAD_TIMEOUT", "4");

/// How many CPUs a run is told it has: one per CPU the worker may use (`cpus`, its affinity within
/// its cgroup's CPU quota), but at most a quarter of the run's process bound
/// (`SANDBOX_MAX_PROCESSES`, which counts threads), and at least one. Its numerical libraries start
/// this many threads (decision 0063), and glibc's count of online CPUs (`os.cpu_count()`) says this
/// many (decision 0064). Left to themselves both count the CPUs of the machine, whatever the
/// worker's share of it: on a node of 64 CPUs, `import numpy` alone would meet the default bound
/// of 64 and fail, and so would `multiprocessing.Pool()`.
#[must_use]
pub fn run_cpus(cpus: usize, max_processes: u32) -> u32 {
    u32::try_from(cpus)
        .unwrap_or(u32::MAX)
        .min(max_processes / 4)
        .max(1)
}

/// The text of a jail's `/sys/devices/system/cpu/online` for a run told of `count` CPUs: the first
/// `count` of `allowed` (the CPUs the worker may be scheduled on, in order; `0..count` when it
/// cannot say, or says fewer), in the kernel's list format (`0-1`, `2,5-7`). glibc reads this file
/// first when a program asks how many CPUs are online (decision 0064), so the list names CPUs the
/// code can run on, and as many as it is told of.
#[must_use]
pub fn online_cpus_text(count: u32, allowed: &[usize]) -> String {
    let count = usize::try_from(count.max(1)).unwrap_or(usize::MAX);
    let mut cpus: Vec<usize> = allowed.iter().copied().take(count).collect();
    if cpus.len() < count {
        cpus = (0..count).collect();
    }
    let mut ranges: Vec<String> = Vec::new();
    let mut start = 0;
    while start < cpus.len() {
        let mut end = start;
        while end + 1 < cpus.len() && cpus[end + 1] == cpus[end] + 1 {
            end += 1;
        }
        ranges.push(if end == start {
            cpus[start].to_string()
        } else {
            format!("{}-{}", cpus[start], cpus[end])
        });
        start = end + 1;
    }
    format!("{}\n", ranges.join(","))
}

/// The environment that holds a run's numerical libraries to `threads` (its [`run_cpus`]) and lets
/// OpenBLAS's idle threads sleep ([`OPENBLAS_IDLE_WAIT`]).
#[must_use]
pub fn library_environment(threads: u32) -> Vec<(String, String)> {
    let threads = threads.to_string();
    LIBRARY_THREAD_VARIABLES
        .iter()
        .map(|name| ((*name).to_owned(), threads.clone()))
        .chain([(
            OPENBLAS_IDLE_WAIT.0.to_owned(),
            OPENBLAS_IDLE_WAIT.1.to_owned(),
        )])
        .collect()
}

/// A bound a run can hit (BOUND-1), each reported as its own error naming its setting. The
/// declaration order is the order of precedence: when a run hits several, the first is the one
/// the result names, because a resource exhausted explains a timeout better than the reverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bound {
    /// `SANDBOX_MAX_MEMORY_BYTES`.
    Memory,
    /// `SANDBOX_MAX_PROCESSES`.
    Processes,
    /// `SANDBOX_TMP_MAX_BYTES` (the run's /tmp and /dev/shm).
    Tmp,
    /// `SANDBOX_WORKSPACE_MAX_BYTES`.
    Workspace,
    /// `SANDBOX_MAX_ARTIFACT_BYTES`.
    Artifacts,
    /// `SANDBOX_MAX_OUTPUT_BYTES`.
    Output,
    /// `SANDBOX_MAX_WALL_SECONDS`.
    Wall,
}

impl Bound {
    /// Every bound, in order of precedence.
    pub const ALL: [Bound; 7] = [
        Self::Memory,
        Self::Processes,
        Self::Tmp,
        Self::Workspace,
        Self::Artifacts,
        Self::Output,
        Self::Wall,
    ];

    /// The setting's name, verbatim.
    #[must_use]
    pub fn setting(self) -> &'static str {
        match self {
            Self::Memory => "SANDBOX_MAX_MEMORY_BYTES",
            Self::Processes => "SANDBOX_MAX_PROCESSES",
            Self::Tmp => "SANDBOX_TMP_MAX_BYTES",
            Self::Workspace => "SANDBOX_WORKSPACE_MAX_BYTES",
            Self::Artifacts => "SANDBOX_MAX_ARTIFACT_BYTES",
            Self::Output => "SANDBOX_MAX_OUTPUT_BYTES",
            Self::Wall => "SANDBOX_MAX_WALL_SECONDS",
        }
    }
}

// On the wire a bound is its setting's name (`SANDBOX_MAX_WALL_SECONDS`, ...).
wire_code!(Bound, setting, "a bound's setting");

/// Free space below which a size-bounded filesystem counts as full: tmpfs allocates whole pages,
/// so a writer that stopped on "no space" can leave up to a page or so unused, and a little more
/// when several files were open at once.
pub const FILESYSTEM_FULL_SLACK_BYTES: u64 = 64 * 1024;

/// What a size-bounded filesystem (the workspace, or /tmp with /dev/shm) looked like at the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilesystemUse {
    /// Bytes still free.
    pub free_bytes: u64,
    /// Inodes still free.
    pub free_inodes: u64,
    /// The sum of the apparent sizes of the regular files in it (a sparse file counts whole).
    pub apparent_bytes: u64,
}

impl FilesystemUse {
    /// Whether this filesystem reached the bound `max_bytes`: no room left, no inode left, or more
    /// apparent content than the bound (a sparse file, which would not fit once archived).
    #[must_use]
    pub fn at_bound(&self, max_bytes: u64) -> bool {
        self.free_bytes < FILESYSTEM_FULL_SLACK_BYTES
            || self.free_inodes == 0
            || self.apparent_bytes > max_bytes
    }
}

/// What the worker measured about a finished run, for [`bounds_hit`]. A measurement the worker
/// could not take is `None` and hits nothing: the posture, not this, records what was unmeasured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoundObservations {
    /// The wall-clock limit expired and the run was killed.
    pub wall_expired: bool,
    /// Bytes of stdout and stderr dropped past the cap.
    pub output_dropped_bytes: u64,
    /// Times the memory controller found the run at its limit (`memory.failcnt`).
    pub memory_limit_hits: Option<u64>,
    /// Processes the kernel's OOM killer killed in the run's cgroup.
    pub oom_kills: Option<u64>,
    /// Forks the pids controller refused (`pids.events` `max`).
    pub process_limit_hits: Option<u64>,
    /// The run's /tmp and /dev/shm at the end.
    pub scratch: Option<FilesystemUse>,
    /// The run's workspace at the end.
    pub workspace: Option<FilesystemUse>,
    /// The files offered as downloads exceeded `SANDBOX_MAX_ARTIFACT_BYTES`.
    pub artifacts_over: bool,
    /// A write the run had to make found the workspace full, though what is left fits: a
    /// persistent kernel's checkpoint that did not fit, removed before the workspace was
    /// measured (KER-3).
    pub workspace_filled: bool,
}

/// Every bound `observed` shows hit, in order of precedence (the first is the one to report).
#[must_use]
pub fn bounds_hit(
    observed: &BoundObservations,
    tmp_max_bytes: u64,
    workspace_max_bytes: u64,
) -> BTreeSet<Bound> {
    let mut hit = BTreeSet::new();
    let positive = |value: Option<u64>| value.is_some_and(|count| count > 0);
    if positive(observed.memory_limit_hits) || positive(observed.oom_kills) {
        hit.insert(Bound::Memory);
    }
    if positive(observed.process_limit_hits) {
        hit.insert(Bound::Processes);
    }
    if observed
        .scratch
        .is_some_and(|fs| fs.at_bound(tmp_max_bytes))
    {
        hit.insert(Bound::Tmp);
    }
    if observed.workspace_filled
        || observed
            .workspace
            .is_some_and(|fs| fs.at_bound(workspace_max_bytes))
    {
        hit.insert(Bound::Workspace);
    }
    if observed.artifacts_over {
        hit.insert(Bound::Artifacts);
    }
    if observed.output_dropped_bytes > 0 {
        hit.insert(Bound::Output);
    }
    if observed.wall_expired {
        hit.insert(Bound::Wall);
    }
    hit
}

// ---------------------------------------------------------------------------------------------
// Output.

/// One output stream of a run, kept up to a cap and counted past it.
///
/// The shell keeps reading past the cap and feeds every chunk here, so the code never blocks on a
/// full pipe; only the first `cap_bytes` are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CappedOutput {
    kept: Vec<u8>,
    cap_bytes: usize,
    bytes_total: u64,
}

impl CappedOutput {
    /// An empty stream that keeps at most `cap_bytes` (`SANDBOX_MAX_OUTPUT_BYTES`).
    #[must_use]
    pub fn new(cap_bytes: u64) -> Self {
        Self {
            kept: Vec::new(),
            cap_bytes: usize::try_from(cap_bytes).unwrap_or(usize::MAX),
            bytes_total: 0,
        }
    }

    /// Takes the next chunk of the stream.
    pub fn accept(&mut self, chunk: &[u8]) {
        let room = self.cap_bytes.saturating_sub(self.kept.len());
        let keep = room.min(chunk.len());
        self.kept.extend_from_slice(&chunk[..keep]);
        self.bytes_total = self
            .bytes_total
            .saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
        assert!(self.kept.len() <= self.cap_bytes);
    }

    /// The bytes kept.
    #[must_use]
    pub fn kept(&self) -> &[u8] {
        &self.kept
    }

    /// Every byte the stream carried, kept or not.
    #[must_use]
    pub fn bytes_total(&self) -> u64 {
        self.bytes_total
    }

    /// Bytes past the cap, counted and discarded.
    #[must_use]
    pub fn bytes_dropped(&self) -> u64 {
        self.bytes_total - self.kept.len() as u64
    }

    /// Whether anything was dropped.
    #[must_use]
    pub fn truncated(&self) -> bool {
        self.bytes_dropped() > 0
    }

    /// Whether the cap is reached, so that further bytes will only be counted.
    #[must_use]
    pub fn full(&self) -> bool {
        self.kept.len() >= self.cap_bytes
    }
}

// ---------------------------------------------------------------------------------------------
// Per-run bounds.

/// Bounds a caller asks for one run, each in place of its configured setting. Each may only lower
/// the configured bound: the operator's settings are the ceiling (BOUND-1). On the wire (the
/// `bounds` of a `run_code` request and of the worker's execute) the fields are named without the
/// `max_` prefix: `wall_seconds`, `output_bytes`, `artifact_bytes`, `memory_bytes`, `processes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundOverrides {
    /// In place of `SANDBOX_MAX_WALL_SECONDS`.
    #[serde(
        rename = "wall_seconds",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_wall_seconds: Option<u64>,
    /// In place of `SANDBOX_MAX_OUTPUT_BYTES`.
    #[serde(
        rename = "output_bytes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_output_bytes: Option<u64>,
    /// In place of `SANDBOX_MAX_ARTIFACT_BYTES`.
    #[serde(
        rename = "artifact_bytes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_artifact_bytes: Option<u64>,
    /// In place of `SANDBOX_MAX_MEMORY_BYTES`.
    #[serde(
        rename = "memory_bytes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_memory_bytes: Option<u64>,
    /// In place of `SANDBOX_MAX_PROCESSES`.
    #[serde(rename = "processes", default, skip_serializing_if = "Option::is_none")]
    pub max_processes: Option<u32>,
}

/// An override that is zero or above its configured bound, with the setting it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverrideRefused {
    /// The setting the override would have raised (or zeroed).
    pub setting: &'static str,
}

impl OverrideRefused {
    /// The stable reason code.
    #[must_use]
    pub fn code(self) -> &'static str {
        "bound_override_refused"
    }
}

/// The bounds of one run: `configured` with each override applied, or the first override that is
/// zero or higher than its configured bound.
pub fn lowered_bounds(
    configured: &ExecutionBounds,
    overrides: &BoundOverrides,
) -> Result<ExecutionBounds, OverrideRefused> {
    fn lower(
        configured: u64,
        asked: Option<u64>,
        setting: &'static str,
    ) -> Result<u64, OverrideRefused> {
        match asked {
            None => Ok(configured),
            Some(value) if (1..=configured).contains(&value) => Ok(value),
            Some(_) => Err(OverrideRefused { setting }),
        }
    }
    let mut bounds = configured.clone();
    bounds.max_wall_seconds = lower(
        configured.max_wall_seconds,
        overrides.max_wall_seconds,
        "SANDBOX_MAX_WALL_SECONDS",
    )?;
    bounds.max_output_bytes = lower(
        configured.max_output_bytes,
        overrides.max_output_bytes,
        "SANDBOX_MAX_OUTPUT_BYTES",
    )?;
    bounds.max_artifact_bytes = lower(
        configured.max_artifact_bytes,
        overrides.max_artifact_bytes,
        "SANDBOX_MAX_ARTIFACT_BYTES",
    )?;
    bounds.max_memory_bytes = lower(
        configured.max_memory_bytes,
        overrides.max_memory_bytes,
        "SANDBOX_MAX_MEMORY_BYTES",
    )?;
    let processes = lower(
        u64::from(configured.max_processes),
        overrides.max_processes.map(u64::from),
        "SANDBOX_MAX_PROCESSES",
    )?;
    bounds.max_processes = u32::try_from(processes).unwrap_or(configured.max_processes);
    assert!(bounds.max_wall_seconds <= configured.max_wall_seconds);
    assert!(bounds.max_memory_bytes <= configured.max_memory_bytes);
    Ok(bounds)
}

/// One output stream of a run as returned: what was kept, as UTF-8 (invalid sequences
/// replaced), and how much was dropped past `SANDBOX_MAX_OUTPUT_BYTES`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutputStream {
    /// The bytes kept, as UTF-8.
    pub text: String,
    /// Whether bytes past the cap were dropped.
    pub truncated: bool,
    /// Every byte the stream carried.
    pub bytes_total: u64,
    /// Bytes dropped past the cap.
    pub bytes_dropped: u64,
}

impl From<&CappedOutput> for OutputStream {
    fn from(output: &CappedOutput) -> Self {
        Self {
            text: String::from_utf8_lossy(output.kept()).into_owned(),
            truncated: output.truncated(),
            bytes_total: output.bytes_total(),
            bytes_dropped: output.bytes_dropped(),
        }
    }
}

#[cfg(test)]
mod library_tests {
    use super::*;

    #[test]
    fn a_run_is_told_of_a_cpu_per_cpu_of_its_worker_within_a_quarter_of_its_process_bound() {
        // One per CPU the worker may use.
        assert_eq!(run_cpus(2, 64), 2);
        // Never more than a quarter of the process bound: a node of 64 CPUs under the default.
        assert_eq!(run_cpus(64, 64), 16);
        assert_eq!(run_cpus(usize::MAX, 1_000_000), 250_000);
        // At least one, however small the bound.
        assert_eq!(run_cpus(8, 3), 1);
        assert_eq!(run_cpus(0, 64), 1);
        // The first CPUs the worker may run on, in the kernel's list format.
        assert_eq!(online_cpus_text(1, &[0, 1]), "0\n");
        assert_eq!(online_cpus_text(2, &[0, 1, 2, 3]), "0-1\n");
        assert_eq!(online_cpus_text(2, &[10, 11]), "10-11\n");
        assert_eq!(online_cpus_text(4, &[2, 5, 6, 7, 9]), "2,5-7\n");
        // The worker could not say, or said fewer: the first CPUs, as many as told.
        assert_eq!(online_cpus_text(3, &[]), "0-2\n");
        assert_eq!(online_cpus_text(3, &[4]), "0-2\n");
        assert_eq!(online_cpus_text(0, &[7]), "7\n");
        let environment = library_environment(run_cpus(64, 64));
        for name in LIBRARY_THREAD_VARIABLES {
            assert!(
                environment.contains(&(name.to_owned(), "16".to_owned())),
                "{environment:?}"
            );
        }
        assert!(environment.contains(&("OPENBLAS_THREAD_TIMEOUT".to_owned(), "4".to_owned())));
        assert_eq!(environment.len(), LIBRARY_THREAD_VARIABLES.len() + 1);
    }
}

#[cfg(test)]
mod override_tests {
    use super::*;

    /// The specification's defaults (BOUND-1) and Corral's own.
    fn configured() -> ExecutionBounds {
        ExecutionBounds {
            max_wall_seconds: 30,
            max_output_bytes: 1 << 20,
            max_artifact_bytes: 10 << 20,
            workspace_max_bytes: 8 << 20,
            hashline_state_max_bytes: 64 << 20,
            dependency_install_timeout_seconds: 120,
            max_memory_bytes: 512 << 20,
            max_processes: 64,
            tmp_max_bytes: 64 << 20,
        }
    }

    #[test]
    fn bound_1_overrides_only_lower_the_configured_bounds() {
        let configured = configured();
        let lowered = lowered_bounds(
            &configured,
            &BoundOverrides {
                max_wall_seconds: Some(5),
                max_processes: Some(8),
                ..BoundOverrides::default()
            },
        )
        .unwrap();
        assert_eq!((lowered.max_wall_seconds, lowered.max_processes), (5, 8));
        assert_eq!(lowered.max_output_bytes, configured.max_output_bytes);
        for (overrides, setting) in [
            (
                BoundOverrides {
                    max_wall_seconds: Some(configured.max_wall_seconds + 1),
                    ..BoundOverrides::default()
                },
                "SANDBOX_MAX_WALL_SECONDS",
            ),
            (
                BoundOverrides {
                    max_memory_bytes: Some(0),
                    ..BoundOverrides::default()
                },
                "SANDBOX_MAX_MEMORY_BYTES",
            ),
            (
                BoundOverrides {
                    max_output_bytes: Some(u64::MAX),
                    ..BoundOverrides::default()
                },
                "SANDBOX_MAX_OUTPUT_BYTES",
            ),
        ] {
            assert_eq!(
                lowered_bounds(&configured, &overrides),
                Err(OverrideRefused { setting })
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_01_each_bound_names_its_setting_and_resources_explain_timeouts() {
        let observed = BoundObservations {
            wall_expired: true,
            process_limit_hits: Some(3),
            ..BoundObservations::default()
        };
        let hit = bounds_hit(&observed, 1 << 20, 1 << 20);
        assert_eq!(
            hit.iter().copied().collect::<Vec<_>>(),
            [Bound::Processes, Bound::Wall]
        );
        assert_eq!(
            hit.first().map(|b| b.setting()),
            Some("SANDBOX_MAX_PROCESSES")
        );
        let settings: BTreeSet<&str> = Bound::ALL.iter().map(|b| b.setting()).collect();
        assert_eq!(
            settings.len(),
            Bound::ALL.len(),
            "each bound names its own setting"
        );
    }

    #[test]
    fn unmeasured_or_zero_counters_hit_nothing() {
        let observed = BoundObservations {
            memory_limit_hits: Some(0),
            oom_kills: None,
            process_limit_hits: Some(0),
            scratch: Some(FilesystemUse {
                free_bytes: 1 << 20,
                free_inodes: 10,
                apparent_bytes: 0,
            }),
            ..BoundObservations::default()
        };
        assert!(bounds_hit(&observed, 1 << 21, 1 << 21).is_empty());
        // A checkpoint that did not fit hits the workspace bound, whatever is left.
        let filled = BoundObservations {
            workspace_filled: true,
            ..observed
        };
        assert_eq!(
            bounds_hit(&filled, 1 << 21, 1 << 21).first(),
            Some(&Bound::Workspace)
        );
    }

    #[test]
    fn a_full_or_sparse_filesystem_is_at_its_bound() {
        let roomy = FilesystemUse {
            free_bytes: 1 << 20,
            free_inodes: 100,
            apparent_bytes: 1000,
        };
        assert!(!roomy.at_bound(1 << 21));
        assert!(
            FilesystemUse {
                free_bytes: 4096,
                ..roomy
            }
            .at_bound(1 << 21)
        );
        assert!(
            FilesystemUse {
                free_inodes: 0,
                ..roomy
            }
            .at_bound(1 << 21)
        );
        assert!(
            FilesystemUse {
                apparent_bytes: 1 << 30,
                ..roomy
            }
            .at_bound(1 << 21)
        );
    }

    #[test]
    fn output_keeps_the_cap_and_counts_the_rest() {
        let mut out = CappedOutput::new(10);
        out.accept(b"hello");
        assert!(!out.truncated() && !out.full());
        out.accept(b" world, and more");
        assert_eq!(out.kept(), b"hello worl");
        assert_eq!(out.bytes_total(), 21);
        assert_eq!(out.bytes_dropped(), 11);
        assert!(out.truncated() && out.full());
        out.accept(&[0; 1000]);
        assert_eq!(
            (out.kept().len(), out.bytes_total(), out.bytes_dropped()),
            (10, 1021, 1011)
        );
    }
}
