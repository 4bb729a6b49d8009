//! What the supervisor tells the jail's stages, and the line protocol they answer on stdout.
//!
//! The plan travels as one JSON argument of the re-executed binary. It holds paths and limits,
//! never a credential: pid 1 of the jail is visible to the code, and so is its command line.

use serde::{Deserialize, Serialize};

/// Everything the stages need to build one jail.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JailPlan {
    /// The arguments that re-execute this binary into a stage (`["jail"]` for `corral`).
    pub reexec_prefix: Vec<String>,
    /// The run directory on the supervisor's side (holds `workspace`, `scratch`, `code`, `root`).
    pub run_dir: String,
    /// Whether to create a user namespace (off only in a weaker posture the operator accepted).
    pub user_namespace: bool,
    /// The uid and gid the code runs as, as seen inside the jail.
    pub inner_uid: u32,
    /// See `inner_uid`.
    pub inner_gid: u32,
    /// Whether a seccomp filter that cannot be installed is waived instead of refusing the run.
    pub seccomp_waivable: bool,
    /// The baked Python stack's directory (PKG-1), bound read-only at the same path; `None` when
    /// the worker found none to use.
    #[serde(default)]
    pub python_stack: Option<String>,
    /// The baked Pi runtime's directory (PI-1), bound read-only at the same path for a package
    /// validation's loader; `None` for every other jail.
    #[serde(default)]
    pub pi_runtime: Option<String>,
    /// Whether the run directory's `resources` holds a verified projection, mounted read-only at
    /// `corral_core::projection::MOUNT_DIR` (PROJ-5, PROJ-6).
    #[serde(default)]
    pub resources: bool,
    /// The interpreter and its arguments, as paths inside the jail.
    pub argv: Vec<String>,
    /// The code's whole environment.
    pub env: Vec<(String, String)>,
    /// The CPUs the code is told it has (`corral_core::bounds::run_cpus`): the jail's
    /// `/sys/devices/system/cpu/online` lists this many (decision 0064).
    pub cpus: u32,
    /// Resource limits for every process of the run.
    pub limits: Limits,
}

/// The rlimits the jail applies to itself before starting the code.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Limits {
    /// `RLIMIT_NPROC`.
    pub processes: u64,
    /// `RLIMIT_DATA`, in bytes.
    pub data_bytes: u64,
    /// `RLIMIT_FSIZE`, in bytes.
    pub file_bytes: u64,
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
    /// `RLIMIT_CPU`, in seconds.
    pub cpu_seconds: u64,
}

/// Stage 1 has created its namespaces and waits for the id maps and its cgroup.
pub const LINE_READY: &str = "R";
/// Stage 2 has finished building the jail; every later byte on stdout is the code's.
pub const LINE_GO: &str = "G";
/// A prepared jail's bootstrap has finished its imports and waits for the code on stdin; the
/// supervisor reads it before any run can take the jail, so it is never the code's.
pub const LINE_WAITING: &str = "B";
/// Prefix of a line that reports a waived primitive: `W <primitive> <detail>`.
pub const LINE_WAIVED: &str = "W";
/// Prefix of a line that reports a failed step: `E <step> <detail>`.
pub const LINE_ERROR: &str = "E";
/// The byte the supervisor writes to stage 1's stdin once the maps and cgroup are in place.
pub const GO_BYTE: u8 = b'g';
/// The longest protocol line the supervisor reads, in bytes.
pub const LINE_MAX_BYTES: usize = 4_096;
/// The most protocol lines the supervisor reads before `G`.
pub const LINES_MAX: usize = 16;

/// Exit status of a stage that failed before the code ran (after an `E` line).
pub const STAGE_FAILED_EXIT: u8 = 125;
/// Exit status for a child that died of signal `n`: `128 + n`, as shells report it.
pub const SIGNAL_EXIT_BASE: i32 = 128;
