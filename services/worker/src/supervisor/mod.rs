//! The supervisor: one [`Worker`] per worker process, one [`Worker::run`] per piece of code.
//!
//! A run goes: refuse early (language, posture, code size) → create the run's directories and
//! cgroups → start the jail, with its egress relay (`crate::relay`) → capture its output until
//! it ends or the wall limit → kill what is left → measure the bounds → choose and verify the
//! downloads → reset (close the relay, kill again, wipe, measure) → the result, with the reset
//! evidence and the core's verdict on it. Every path that created anything goes through the
//! reset.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin};

use corral_contract::messages::Isolation;
use corral_core::bounds::ExecutionBounds;
use corral_core::config::Settings;
use corral_core::ids::OpToken;
use corral_core::jail::{self, Language, Posture, Primitive};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::prctl;

use crate::cgroup::{self, RunCgroups};
use crate::probe::{self, Missing};
use crate::relay::{ProxyAddress, Relay};
use crate::workspace::RunDirs;

mod browser;
pub use browser::{RUNTIME_PROGRAMS, SessionError};
mod command;
mod install;
mod kernel;
mod launch;
mod prepare;
pub use prepare::hasten;
mod reset;
mod run;
pub use run::Unreset;
mod setup;
mod stack;
mod supervise;
mod validate;
pub use validate::Validation;

use launch::Started;

/// Where the supervisor mounts its private tmpfs of run directories (in its own mount namespace,
/// so the host sees an empty directory and nothing outlives the supervisor).
const BASE_DIR: &str = "/run/corral-jail";
/// Host uids of runs start here: far above any distribution's or subordinate-id range. A run
/// takes two (its root and its user), derived from the supervisor's pid and the run's number, so
/// no two live runs share one and nothing else on the host has them.
const HOST_UID_BASE: u32 = 0x7000_0000;
/// Runs of one supervisor cycle through this many uid pairs.
const RUNS_PER_SUPERVISOR: u32 = 64;

/// The file name of the small binary that runs only the jail's stages (decision 0057), looked for
/// beside the running one.
pub const STAGE_BINARY: &str = "corral-stage";
/// This build's identity, which a stage binary must print for `__build` to be used: a digest of
/// the sources the stages are built from (`corral-stages`' `build.rs`).
pub const STAGE_BUILD: &str = corral_stages::BUILD;

/// How to execute a jail's stage: the program (normally `/proc/self/exe`) and the arguments before
/// the stage's name (`["jail"]` for `corral`, nothing for `corral-jail` and `corral-stage`).
#[derive(Clone, Debug)]
pub struct Reexec {
    /// The program.
    pub program: PathBuf,
    /// The arguments before the stage's name.
    pub prefix: Vec<String>,
    /// The stage binary's file, open for as long as any copy of this lives: the program is its
    /// descriptor's path, so what was checked is what every jail executes.
    _opened: Option<std::sync::Arc<std::fs::File>>,
}

impl Reexec {
    /// This binary, with `prefix`.
    #[must_use]
    pub fn this_binary(prefix: &[&str]) -> Self {
        Self {
            program: PathBuf::from("/proc/self/exe"),
            prefix: prefix.iter().map(|s| (*s).to_owned()).collect(),
            _opened: None,
        }
    }

    /// The stage binary beside this one when it is of this build, else this binary with `prefix`.
    /// Executing `corral` (all of Corral) for each of a jail's two stages cost a `print(1)` run
    /// about a quarter of its CPU: loading and relocating it, and its pages' faults and teardown.
    #[must_use]
    pub fn for_stages(prefix: &[&str]) -> Self {
        let exe = std::env::current_exe().unwrap_or_default();
        Self::beside(exe.parent().unwrap_or(Path::new("/")), prefix)
    }

    /// [`Reexec::for_stages`] for a binary in `dir`; says which it chose, and why not the stage
    /// binary when one is there.
    #[must_use]
    pub fn beside(dir: &Path, prefix: &[&str]) -> Self {
        let path = dir.join(STAGE_BINARY);
        if !path.exists() {
            return Self::this_binary(prefix);
        }
        match Self::stage_binary(&path) {
            Ok(chosen) => {
                tracing::info!(stages = %path.display(), "jails' stages run from the stage binary");
                chosen
            }
            Err(why) => {
                tracing::warn!(why = %why, "jails' stages run from this binary, not the stage binary beside it");
                Self::this_binary(prefix)
            }
        }
    }

    /// `path` as the stage binary, or why not: it must open, and answer `__build` with
    /// [`STAGE_BUILD`] (one from another build is never used: it would build jails from other
    /// sources than this one's).
    pub fn stage_binary(path: &Path) -> Result<Self, String> {
        use std::os::fd::AsRawFd as _;
        let file =
            std::fs::File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
        let program = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let answer = std::process::Command::new(&program)
            .arg("__build")
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("run {}: {e}", path.display()))?;
        let build = String::from_utf8_lossy(&answer.stdout);
        if !answer.status.success() || build.trim_end() != STAGE_BUILD {
            return Err(format!(
                "{} is of build {:?}, not this one's {STAGE_BUILD}",
                path.display(),
                build.trim_end()
            ));
        }
        Ok(Self {
            program,
            prefix: Vec::new(),
            _opened: Some(std::sync::Arc::new(file)),
        })
    }
}

/// One piece of code to run.
#[derive(Clone, Debug)]
pub struct RunRequest {
    /// The language.
    pub language: Language,
    /// The code.
    pub code: Vec<u8>,
    /// An operator's directory whose files the code sees and to which validated downloads are
    /// copied back; `None` for a fresh, empty workspace.
    pub workspace: Option<PathBuf>,
    /// A wall limit in place of `SANDBOX_MAX_WALL_SECONDS` (the operator's choice).
    pub wall_seconds: Option<u64>,
    /// Names the run declared as outputs (WS-7): offered even if unchanged, and still verified.
    pub declared: Vec<String>,
    /// The operation token the reset evidence carries.
    pub token: OpToken,
    /// Bounds in place of the configured ones for this run only; the caller has checked that none
    /// is higher than configured (`corral_core::bounds::lowered_bounds`).
    pub bounds: Option<ExecutionBounds>,
    /// Whether to pack the workspace into a tar after the run (the control API returns it).
    pub pack_workspace: bool,
    /// The run's egress grant, which the relay adds to each connection it carries to the egress
    /// proxy (EGR-8); `None`: the relay refuses every connection.
    pub grant: Option<String>,
    /// What to install through the broker before the code (PKG-2, PKG-3); such a run goes cold.
    pub install: Option<corral_contract::messages::InstallOrder>,
    /// A persistent kernel's cell (KER-1): the code is the cell, which a driver restores
    /// around, runs and checkpoints after.
    pub kernel: Option<corral_contract::messages::KernelOrder>,
    /// The tools the code may call through the supervisor (KER-5).
    pub tools: Option<corral_contract::messages::ToolOrder>,
    /// The turn's projection, verified before the code starts (PROJ-6); such a run goes cold,
    /// since a prepared jail's mounts and environment were fixed before the turn was known.
    pub resources: Option<std::sync::Arc<corral_contract::messages::Projected>>,
    /// Where the code's output goes as it is read, for a streamed run (WS-7); its installer's
    /// never does.
    pub tap: Option<crate::capture::Tap>,
}

/// What one run has created, for the reset.
struct ActiveRun {
    number: u32,
    dirs: Option<RunDirs>,
    run_dir: PathBuf,
    cgroups: RunCgroups,
    uids: [u32; 2],
    stage1: Option<Child>,
    /// The egress relay listening in the jail's network namespace; closed by the reset.
    relay: Option<Relay>,
    /// The package broker's relay, open only while the run's install runs.
    broker_relay: Option<Relay>,
    /// A persistent cell's kernel, held by the supervisor (its seal key never enters the jail).
    kernel: Option<kernel::KernelCell>,
    /// The run's tools, until its jail starts (a cold run opens the relay before the go byte).
    tools_pending: Option<corral_contract::messages::ToolOrder>,
    /// The tool relay in the jail's network namespace, while the run has tools.
    tool_relay: Option<crate::tools::ToolRelay>,
}

/// A jail built before any lease (ARCHITECTURE.md, "Running code"): the same jail a cold run
/// gets, with its interpreter already started and blocked reading the program from stdin. It
/// serves exactly one run and is torn down by that run's reset; one no run took waits on through
/// the resets between leases, for the next tenant, while its interpreter waits and its workspace
/// is empty (decision 0060). A worker holds at most one per language, and the stack's beside
/// Python's.
struct Prepared {
    run: ActiveRun,
    language: Language,
    /// The bounds it was built for: the cgroup's and the rlimits' values depend on them.
    memory_bytes: u64,
    processes: u32,
    started: Started,
    /// The write end the code is delivered through; closing it is the code's end of input.
    program: ChildStdin,
    /// Whether its bootstrap has said it waits (`B`: its pre-imports done). Until then it is
    /// still importing, at preparation's priority, and a run that needs none of its imports goes
    /// cold rather than wait for them (decision 0015).
    ready: bool,
    /// When it must have said so, or its preparation fails.
    ready_by: std::time::Instant,
    /// Whether its bootstrap pre-imports modules (a core-second), or only starts (milliseconds).
    importing: bool,
    /// Lines it printed before `B` (dropped), within the protocol's bound.
    lines: usize,
}

/// The worker's supervisor.
pub struct Worker {
    settings: Settings,
    reexec: Reexec,
    base: PathBuf,
    missing: Missing,
    runs: u32,
    /// The prepared jails, at most one per language (`CORRAL_WORKER_PREPARE_LANGUAGES`).
    prepared: BTreeMap<Language, Prepared>,
    /// Why the last preparation of a language failed, reported by the next run of it (which
    /// runs cold).
    prepare_failures: BTreeMap<Language, String>,
    /// The egress proxy the relays carry granted connections to (`SANDBOX_EGRESS_PROXY_URL`),
    /// or why there is none (every relay then refuses everything).
    egress_proxy: Result<ProxyAddress, String>,
    /// The baked Python stack (PKG-1) the jails run Python from, or why there is none.
    python_stack: Result<PathBuf, String>,
    /// The CPUs this worker may use (its affinity within its cgroup's quota), read at start: what
    /// a run's numerical libraries start threads for (decision 0063).
    cpus: usize,
    /// Whether each of the last Python runs imported a pre-imported module, newest in the lowest
    /// bit; none at start. A prepared Python jail pre-imports only while one of the last
    /// [`PREIMPORT_MEMORY`] did (decision 0015): importing the stack costs a core-second per
    /// preparation, which back-to-back runs that never use it would pay for. A worker left idle
    /// prepares the stack regardless (decision 0037).
    preimport_history: u8,
    /// Whether the worker has run anything yet: a new one waits idle [`FIRST_IDLE_BEFORE_PREIMPORT`]
    /// before it prepares the stack.
    ran_any: bool,
    /// Each interpreter's runtime tag (`corral_core::kernel::runtime_tag`), asked once.
    runtimes: BTreeMap<Language, String>,
    /// The open browser session, which holds the worker until it closes (BROW-13).
    session: Option<browser::Session>,
    /// What the resets of runs answered before their reset left, and their notes, for the next
    /// reset between leases to count ([`Worker::reset_later`]).
    reset_after_answer: Option<(corral_core::reset::ResetEvidence, Vec<String>)>,
    /// A Python jail prepared again with the stack beside the one prepared without it (decision
    /// 0037), which still waits and serves every run that does not use the stack; a run that
    /// does takes this one (decision 0046).
    upgrade: Option<Prepared>,
    /// Whether that re-preparation failed since the last reset (not tried again before it).
    upgrade_failed: bool,
    /// The machine-wide slot the re-preparation holds while it imports (see
    /// `prepare::upgrade_slot`), released with it.
    upgrade_slot: Option<std::fs::File>,
}

/// How many recent Python runs decide whether the next prepared jail pre-imports.
const PREIMPORT_MEMORY: u32 = 1;
/// How long a new worker, which has run nothing yet, waits idle before it prepares the stack
/// (at most `CORRAL_WORKER_PREIMPORT_IDLE_SECONDS`): its first jail is prepared without the stack,
/// so that a worker created for a burst serves it at once instead of spending a core-second on
/// imports first (decision 0037); one created for the warm minimum has the stack a moment later.
const FIRST_IDLE_BEFORE_PREIMPORT: std::time::Duration =
    std::time::Duration::from_millis(corral_core::pool::FIRST_IDLE_BEFORE_PREIMPORT_MS);

impl Worker {
    /// Probes the isolation primitives and prepares the supervisor: a child subreaper (so a run's
    /// orphans come here to be reaped and counted) in a private mount namespace with a tmpfs for
    /// run directories. Call it before starting any thread: a mount namespace is per thread.
    #[must_use]
    pub fn start(settings: Settings, reexec: Reexec) -> Self {
        let cgroup_root = PathBuf::from(&settings.jail.cgroup_root);
        let mut missing = probe::probe(&reexec.program, &reexec.prefix, &cgroup_root);
        for (controller, primitive) in [
            ("memory", Primitive::CgroupMemory),
            ("pids", Primitive::CgroupPids),
        ] {
            if !missing.contains_key(&primitive) {
                cgroup::remove_stale(&cgroup_root, controller);
            }
        }
        let base = PathBuf::from(BASE_DIR);
        if !missing.contains_key(&Primitive::Privileges)
            && let Err(error) = prepare_supervisor(&base, settings.bounds.workspace_max_bytes)
        {
            missing.insert(Primitive::Namespaces, error);
        }
        // Read once, at start; a value that is not `http://host:port` fails nothing (EGR-5): the
        // relays refuse every connection, and a run with a grant says why.
        let egress_proxy = match settings.egress.proxy_url.as_deref() {
            None => Err("SANDBOX_EGRESS_PROXY_URL is unset".to_owned()),
            Some(url) => ProxyAddress::parse(url),
        };
        let python_stack = stack::find(Path::new(&settings.jail.python_stack));
        if let Err(why) = &python_stack {
            tracing::warn!(why = %why, "Python runs without the baked stack");
        }
        Self {
            settings,
            reexec,
            base,
            missing,
            python_stack,
            cpus: std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            preimport_history: 0,
            ran_any: false,
            runtimes: BTreeMap::new(),
            session: None,
            reset_after_answer: None,
            upgrade: None,
            upgrade_failed: false,
            upgrade_slot: None,
            runs: 0,
            prepared: BTreeMap::new(),
            prepare_failures: BTreeMap::new(),
            egress_proxy,
        }
    }

    /// The baked Python stack in use, or why there is none.
    pub fn python_stack(&self) -> Result<&Path, &str> {
        self.python_stack.as_deref().map_err(String::as_str)
    }

    /// The Python interpreter the jails run: the stack's, or the system's without one.
    fn python(&self) -> String {
        match &self.python_stack {
            Ok(stack) => stack::interpreter(stack),
            Err(_) => stack::SYSTEM_PYTHON.to_owned(),
        }
    }

    /// Whether a prepared jail is waiting for a run.
    #[must_use]
    pub fn is_prepared(&self) -> bool {
        self.prepared.values().any(|p| p.ready)
    }

    /// The languages a prepared jail is waiting for (its imports done), in order.
    #[must_use]
    pub fn prepared_languages(&self) -> Vec<Language> {
        self.prepared
            .iter()
            .filter(|(_, p)| p.ready)
            .map(|(language, _)| *language)
            .collect()
    }

    /// The modules the next prepared Python jail imports: `CORRAL_WORKER_PYTHON_PREIMPORT`, while
    /// one of the last runs used them.
    fn preimport(&self) -> &[String] {
        let recent = self.preimport_history & ((1 << PREIMPORT_MEMORY) - 1);
        if recent == 0 {
            &[]
        } else {
            &self.settings.prepare.python_preimport
        }
    }

    /// Records whether a Python run's `code` imported a pre-imported module.
    fn remember_imports(&mut self, code: &[u8]) {
        let used =
            corral_core::packages::imports::uses_any(code, &self.settings.prepare.python_preimport);
        self.preimport_history = (self.preimport_history << 1) | u8::from(used);
    }

    /// How long a worker waits idle before [`Worker::prepare_with_preimport`]:
    /// `CORRAL_WORKER_PREIMPORT_IDLE_SECONDS`, and up to as long again at random, so that a pool
    /// left idle after a burst does not start every re-preparation in the same moment.
    #[must_use]
    pub fn preimport_idle(&self) -> std::time::Duration {
        let configured =
            std::time::Duration::from_secs(self.settings.prepare.preimport_idle_seconds);
        let idle = if self.ran_any {
            configured
        } else {
            configured.min(FIRST_IDLE_BEFORE_PREIMPORT)
        };
        let spread = f64::from(corral_contract::credential::random_bytes()[0]) / 256.0;
        idle.mul_f64(1.0 + spread)
    }

    /// Whether the prepared Python jail waits without the modules of
    /// `CORRAL_WORKER_PYTHON_PREIMPORT` (the last Python run used none of them), so that a
    /// worker left idle should prepare it again with them ([`Worker::prepare_with_preimport`]).
    #[must_use]
    pub fn could_preimport(&self) -> bool {
        self.settings.prepare.preimport_idle_seconds > 0
            && !self.settings.prepare.python_preimport.is_empty()
            && self.session.is_none()
            && self.upgrade.is_none()
            && !self.upgrade_failed
            && !self.prepare_failures.contains_key(&Language::Python)
            && self
                .prepared
                .get(&Language::Python)
                .is_some_and(|p| p.ready && !p.importing)
    }

    /// Whether a prepared jail is still importing (see [`Worker::poll_prepared`]).
    #[must_use]
    pub fn is_preparing(&self) -> bool {
        self.upgrade.as_ref().is_some_and(|u| !u.ready) || self.prepared.values().any(|p| !p.ready)
    }

    /// The languages to keep a jail prepared for (`CORRAL_WORKER_PREPARE_LANGUAGES`).
    #[must_use]
    pub fn languages_to_prepare(&self) -> Vec<Language> {
        self.settings.prepare.languages.clone()
    }

    /// The primitives found missing at start, with why.
    #[must_use]
    pub fn missing(&self) -> Vec<(&'static str, String)> {
        self.missing
            .iter()
            .map(|(p, why)| (p.code(), why.clone()))
            .collect()
    }

    /// The posture runs get, or the primitives that refuse them.
    pub fn posture(&self) -> Result<Posture, BTreeSet<Primitive>> {
        let missing: BTreeSet<Primitive> = self.missing.keys().copied().collect();
        jail::posture(&missing, self.settings.jail.allow_weaker_isolation)
    }

    /// A new run's number, directory and uids. Numbers the prepared jails hold are skipped.
    fn new_run(&mut self) -> ActiveRun {
        let held: BTreeSet<u32> = self
            .prepared
            .values()
            .chain(&self.upgrade)
            .map(|p| p.run.number)
            .collect();
        // At most one prepared jail per language: far fewer than the numbers, so the loop ends.
        assert!(
            held.len() < RUNS_PER_SUPERVISOR as usize,
            "{} prepared jails hold every run number",
            held.len()
        );
        let mut number = self.runs % RUNS_PER_SUPERVISOR;
        self.runs = self.runs.wrapping_add(1);
        while held.contains(&number) {
            number = self.runs % RUNS_PER_SUPERVISOR;
            self.runs = self.runs.wrapping_add(1);
        }
        let pair = std::process::id()
            .saturating_mul(RUNS_PER_SUPERVISOR)
            .saturating_add(number)
            .saturating_mul(2);
        let root_uid = HOST_UID_BASE.saturating_add(pair);
        // Both uids of the run lie in the jails' range and are ordinary ids (u32::MAX is "none").
        assert!(
            (HOST_UID_BASE..u32::MAX - 2).contains(&root_uid),
            "run uid {root_uid} out of range"
        );
        ActiveRun {
            number,
            dirs: None,
            run_dir: self.base.join(format!("run-{number}")),
            cgroups: RunCgroups::default(),
            uids: [root_uid, root_uid.saturating_add(1)],
            stage1: None,
            relay: None,
            broker_relay: None,
            kernel: None,
            tools_pending: None,
            tool_relay: None,
        }
    }
}

/// Makes the supervisor a child subreaper in a private mount namespace with a tmpfs of run
/// directories at `base`.
fn prepare_supervisor(base: &Path, workspace_max_bytes: u64) -> Result<(), String> {
    prctl::set_child_subreaper(true).map_err(|e| format!("child subreaper: {e}"))?;
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("private mount namespace: {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make / private: {e}"))?;
    std::fs::create_dir_all(base).map_err(|e| format!("create {}: {e}", base.display()))?;
    // Room for the code of one run (bounded like a workspace) and the directories.
    let size = workspace_max_bytes.saturating_add(1 << 20);
    mount(
        Some("corral-runs"),
        base,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={size},mode=0711").as_str()),
    )
    .map_err(|e| format!("mount {}: {e}", base.display()))
}

/// The JSON of the isolation result for a refusal printed at start (used by the CLI).
pub fn refusal_text(result: &Isolation, diagnostics: &[String]) -> String {
    format!(
        "corral jail: refusing to run code: isolation unavailable ({}): {}. Set CORRAL_JAIL_ALLOW_WEAKER_ISOLATION=1 to accept a weaker jail where that is possible.",
        result.missing.join(", "),
        diagnostics.join("; ")
    )
}
