//! The rules of one run in the worker's jail (ISO-1, BOUND-1, PKG-6): which languages run, why a
//! run is refused before it starts, which isolation posture is acceptable, which bounds a run hit,
//! and how its output is capped.
//!
//! The worker (`corral-worker`) measures and enforces; every decision about what a measurement
//! means is made here, so the control API, the operator tool and the tests agree.

use std::collections::BTreeSet;

use crate::config::ExecutionBounds;

// ---------------------------------------------------------------------------------------------
// Languages and refusals.

/// A language the jail runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Language {
    /// Python 3.
    Python,
    /// Node.js.
    Node,
}

impl Language {
    /// The language named `text` exactly (`python` or `node`); anything else is refused with
    /// [`NotRun::UnsupportedLanguage`] before it runs (PKG-6).
    ///
    /// # Errors
    /// [`NotRun::UnsupportedLanguage`] for any other name.
    pub fn parse(text: &str) -> Result<Self, NotRun> {
        match text {
            "python" => Ok(Self::Python),
            "node" => Ok(Self::Node),
            _ => Err(NotRun::UnsupportedLanguage),
        }
    }

    /// The name as the caller writes it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::Node => "node",
        }
    }

    /// The extension of the file the code is written to.
    #[must_use]
    pub fn extension(self) -> &'static str {
        match self {
            Self::Python => "py",
            Self::Node => "js",
        }
    }
}

/// Why code was not run. Returned before any of the code executes; the codes are stable (PKG-6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NotRun {
    /// The language is not Python or Node.
    UnsupportedLanguage,
    /// An isolation primitive the jail needs is missing and the operator did not accept a weaker
    /// posture ([`Primitive`] says which).
    IsolationUnavailable,
    /// The workspace handed in is larger than `SANDBOX_WORKSPACE_MAX_BYTES` or has more entries
    /// than a workspace may hold.
    WorkspaceTooLarge,
    /// The code itself is larger than `SANDBOX_WORKSPACE_MAX_BYTES`.
    CodeTooLarge,
    /// The jail could not be built for another reason; the diagnostics say which step failed.
    JailSetupFailed,
}

impl NotRun {
    /// The stable reason code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::UnsupportedLanguage => "unsupported_language",
            Self::IsolationUnavailable => "isolation_unavailable",
            Self::WorkspaceTooLarge => "workspace_too_large",
            Self::CodeTooLarge => "code_too_large",
            Self::JailSetupFailed => "jail_setup_failed",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Isolation posture.

/// An isolation primitive the jail is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Primitive {
    /// The supervisor runs as root (it mounts, maps ids and creates cgroups).
    Privileges,
    /// New pid, mount, network, IPC and UTS namespaces.
    Namespaces,
    /// A new user namespace, so that root inside the jail is nobody outside it.
    UserNamespaces,
    /// A seccomp filter.
    Seccomp,
    /// A cgroup v1 `memory` controller the supervisor can create groups in.
    CgroupMemory,
    /// A cgroup v1 `pids` controller the supervisor can create groups in.
    CgroupPids,
}

impl Primitive {
    /// The stable name.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Privileges => "root",
            Self::Namespaces => "namespaces",
            Self::UserNamespaces => "user_namespaces",
            Self::Seccomp => "seccomp",
            Self::CgroupMemory => "cgroup_memory",
            Self::CgroupPids => "cgroup_pids",
        }
    }

    /// Whether the operator may waive it. Without root or the basic namespaces there is no jail
    /// at all (no read-only root, no private network), so those are never waived. Without the
    /// others the jail still stands, with an unprivileged host uid and resource limits instead.
    #[must_use]
    pub fn waivable(self) -> bool {
        match self {
            Self::Privileges | Self::Namespaces => false,
            Self::UserNamespaces | Self::Seccomp | Self::CgroupMemory | Self::CgroupPids => true,
        }
    }
}

/// The isolation a run gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Posture {
    /// Every primitive is present.
    Full,
    /// The operator accepted running without these (`CORRAL_JAIL_ALLOW_WEAKER_ISOLATION`).
    Weaker {
        /// The primitives missing, every one waivable.
        waived: BTreeSet<Primitive>,
    },
}

/// The decision on the primitives found missing at start: the posture to run with, or the
/// primitives that refuse the run.
///
/// # Errors
/// The missing primitives when any is missing and either the operator did not accept a weaker
/// posture or one of them cannot be waived.
pub fn posture(
    missing: &BTreeSet<Primitive>,
    allow_weaker_isolation: bool,
) -> Result<Posture, BTreeSet<Primitive>> {
    if missing.is_empty() {
        return Ok(Posture::Full);
    }
    if allow_weaker_isolation && missing.iter().all(|primitive| primitive.waivable()) {
        return Ok(Posture::Weaker {
            waived: missing.clone(),
        });
    }
    Err(missing.clone())
}

// ---------------------------------------------------------------------------------------------
// Bounds.

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
    if observed
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
/// the configured bound: the operator's settings are the ceiling (BOUND-1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BoundOverrides {
    /// In place of `SANDBOX_MAX_WALL_SECONDS`.
    pub max_wall_seconds: Option<u64>,
    /// In place of `SANDBOX_MAX_OUTPUT_BYTES`.
    pub max_output_bytes: Option<u64>,
    /// In place of `SANDBOX_MAX_ARTIFACT_BYTES`.
    pub max_artifact_bytes: Option<u64>,
    /// In place of `SANDBOX_MAX_MEMORY_BYTES`.
    pub max_memory_bytes: Option<u64>,
    /// In place of `SANDBOX_MAX_PROCESSES`.
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

#[cfg(test)]
mod override_tests {
    use super::*;
    use crate::config::Settings;

    #[test]
    fn bound_1_overrides_only_lower_the_configured_bounds() {
        let configured = Settings::from_pairs(&[]).unwrap().bounds;
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
    fn pkg_06_only_python_and_node_run() {
        assert_eq!(Language::parse("python"), Ok(Language::Python));
        assert_eq!(Language::parse("node"), Ok(Language::Node));
        for other in ["ruby", "Python", "python2", "", "bash", "node "] {
            assert_eq!(
                Language::parse(other),
                Err(NotRun::UnsupportedLanguage),
                "{other:?}"
            );
        }
        assert_eq!(NotRun::UnsupportedLanguage.code(), "unsupported_language");
    }

    #[test]
    fn a_missing_primitive_refuses_unless_waived_and_waivable() {
        let none = BTreeSet::new();
        assert_eq!(posture(&none, false), Ok(Posture::Full));
        assert_eq!(posture(&none, true), Ok(Posture::Full));
        let seccomp: BTreeSet<_> = [Primitive::Seccomp].into();
        assert_eq!(posture(&seccomp, false), Err(seccomp.clone()));
        assert_eq!(
            posture(&seccomp, true),
            Ok(Posture::Weaker {
                waived: seccomp.clone()
            })
        );
        let fatal: BTreeSet<_> = [Primitive::Seccomp, Primitive::Namespaces].into();
        assert_eq!(posture(&fatal, true), Err(fatal.clone()));
        let root: BTreeSet<_> = [Primitive::Privileges].into();
        assert_eq!(posture(&root, true), Err(root.clone()));
    }

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
        let settings: BTreeSet<&str> = [
            Bound::Memory,
            Bound::Processes,
            Bound::Tmp,
            Bound::Workspace,
            Bound::Artifacts,
            Bound::Output,
            Bound::Wall,
        ]
        .iter()
        .map(|b| b.setting())
        .collect();
        assert_eq!(settings.len(), 7);
        for name in settings {
            assert!(crate::config::setting_doc(name).is_some(), "{name}");
        }
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
