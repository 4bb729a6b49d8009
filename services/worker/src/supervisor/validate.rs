//! Package validation (PI-1), in one run's jail as untrusted code, under one deadline:
//! 1. An extension package: its test tree (the server's files, its dependencies and
//!    devDependencies installed through the broker), then its `node:test` tests.
//! 2. A validation tree built afresh from the server's files once everything of the tests is
//!    dead and the workspace and scratch space are emptied, so that no test-time edit reaches the
//!    loader; its dependencies reinstalled through the broker within what is left.
//! 3. Pi's real loader in a disposable child (`observe.mjs` of the baked runtime) with no egress.
//!    This supervisor is the trusted parent: it imports no authored code (it is not even Node),
//!    takes the child's one bounded observation line, believes it only as far as the server's
//!    file set proves it (`corral_core::pi::surface::believe`), and writes the answer through its
//!    own connection. The child cannot reach the parent's memory, environment or descriptors:
//!    they are outside its pid, mount and user namespaces.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use corral_contract::messages::ValidateReply;
use corral_core::ids::OpToken;
use corral_core::jail::{Language, NotRun, Posture};
use corral_core::pi::files::FileSet;
use corral_core::pi::package::{Checked, RUNTIME_PROVIDED};
use corral_core::pi::surface::{parse_observation, stderr_tail};
use corral_core::pi::{
    LOADER_MIN_SECONDS, Profile, REINSTALL_MIN_SECONDS, Refusal, RefusalCode, Step,
};

use super::install::{give, install_environment, npm_install, registry_was_unreachable};
use super::run::Unreset;
use super::supervise::millis;
use super::{ActiveRun, Worker};
use crate::result::{RunResult, note};
use crate::workspace::RunDirs;

/// One validation, as the control API decoded and checked it.
#[derive(Clone, Debug)]
pub struct Validation {
    /// The server's files.
    pub files: FileSet,
    /// What the static checks established (profile, dependencies, tests).
    pub checked: Checked,
    /// The whole validation's time.
    pub deadline: Duration,
    /// The broker token the dependencies install with.
    pub install_token: Option<String>,
    /// The operation token.
    pub token: OpToken,
}

/// A step's end: the refusal and the output tail that goes with it.
type Failed = (Refusal, Step, Option<String>);

impl Worker {
    /// Validates a package up to its reset, which the caller performs.
    pub fn validate_package(&mut self, order: &Validation) -> (ValidateReply, Option<Unreset>) {
        let started = Instant::now();
        let deadline = started + order.deadline;
        let mut result = RunResult::default();
        let mut reply = ValidateReply::default();
        self.ran_any = true;
        let mut run = self.new_run();
        match self.validate_in(order, deadline, &mut run, &mut result, &mut reply) {
            Ok(Ok(())) => {}
            Ok(Err((refusal, step, tail))) => {
                reply.failure = Some(refusal);
                reply.step = Some(step);
                reply.tail = tail;
                reply.surface = None;
            }
            Err(not_run) => reply.not_run = Some(not_run),
        }
        reply.isolation = result.reply.isolation;
        reply.diagnostics = result.reply.diagnostics;
        reply.durations.total_ms = millis(started.elapsed());
        (reply, Some(Unreset::new(run, order.token, started)))
    }

    fn validate_in(
        &self,
        order: &Validation,
        deadline: Instant,
        run: &mut ActiveRun,
        result: &mut RunResult,
        reply: &mut ValidateReply,
    ) -> Result<Result<(), Failed>, NotRun> {
        let runtime = Path::new(&self.settings.jail.pi_runtime);
        if !runtime.join("observe.mjs").is_file() {
            return Ok(Err(pi_runtime_unavailable(runtime)));
        }
        let posture = self.decide_posture(result)?;
        let dirs = self.create_dirs(run, result)?;
        self.create_cgroups(run, &posture, result)?;
        let checked = &order.checked;
        let owner = run.uids[1];
        if checked.profile == Profile::Extension {
            let tests_started = Instant::now();
            let tested = self.tests(order, deadline, run, &dirs, &posture, result);
            reply.durations.tests_ms = millis(tests_started.elapsed());
            if let Err(failed) = tested? {
                return Ok(Err(failed));
            }
            // Nothing of the tests is alive (supervise proved it); what they wrote goes.
            for dir in [
                dirs.workspace(),
                dirs.scratch().join("tmp"),
                dirs.scratch().join("shm"),
            ] {
                empty(&dir).map_err(|e| {
                    note(&mut result.reply.diagnostics, e);
                    NotRun::JailSetupFailed
                })?;
            }
        }
        let reinstall_started = Instant::now();
        stage(&order.files, &dirs.workspace(), owner).map_err(|e| {
            note(&mut result.reply.diagnostics, e);
            NotRun::JailSetupFailed
        })?;
        if !checked.dependencies.is_empty() {
            let left = left(deadline).saturating_sub(Duration::from_secs(LOADER_MIN_SECONDS));
            if left < Duration::from_secs(REINSTALL_MIN_SECONDS) {
                return Ok(Err(deadline_exceeded(Step::Reinstall, left)));
            }
            let installed = self.npm(
                order,
                false,
                left,
                run,
                &dirs,
                &posture,
                result,
                Step::Reinstall,
            )?;
            if let Err(failed) = installed {
                return Ok(Err(failed));
            }
        }
        link_runtime(&dirs.workspace(), runtime, owner).map_err(|e| {
            note(&mut result.reply.diagnostics, e);
            NotRun::JailSetupFailed
        })?;
        reply.durations.reinstall_ms = millis(reinstall_started.elapsed());
        let loader_started = Instant::now();
        let loaded = self.load(order, deadline, run, &posture, result, reply);
        reply.durations.loader_ms = millis(loader_started.elapsed());
        loaded
    }

    /// The test tree and its tests.
    fn tests(
        &self,
        order: &Validation,
        deadline: Instant,
        run: &mut ActiveRun,
        dirs: &RunDirs,
        posture: &Posture,
        result: &mut RunResult,
    ) -> Result<Result<(), Failed>, NotRun> {
        let checked = &order.checked;
        let runtime = Path::new(&self.settings.jail.pi_runtime);
        stage(&order.files, &dirs.workspace(), run.uids[1]).map_err(|e| {
            note(&mut result.reply.diagnostics, e);
            NotRun::JailSetupFailed
        })?;
        if !checked.dependencies.is_empty() || !checked.dev_dependencies.is_empty() {
            let installed = self.npm(
                order,
                true,
                left(deadline),
                run,
                dirs,
                posture,
                result,
                Step::Tests,
            )?;
            if let Err(failed) = installed {
                return Ok(Err(failed));
            }
        }
        // After the install, which would prune links it did not make.
        link_runtime(&dirs.workspace(), runtime, run.uids[1]).map_err(|e| {
            note(&mut result.reply.diagnostics, e);
            NotRun::JailSetupFailed
        })?;
        let wall = left(deadline);
        if wall < Duration::from_secs(1) {
            return Ok(Err(deadline_exceeded(Step::Tests, wall)));
        }
        let mut plan = self.plan(Language::Node, run, posture, wall.as_secs(), None);
        plan.pi_runtime = Some(self.settings.jail.pi_runtime.clone());
        plan.argv = vec!["/usr/bin/node".to_owned(), "--test".to_owned()];
        plan.argv
            .extend(checked.tests.iter().map(|t| format!("/workspace/{t}")));
        plan.env = node_environment();
        let (jail, _) =
            self.start_jail(&plan, run, None, None, &mut result.reply.diagnostics, false)?;
        let mut tests = RunResult::default();
        let (observed, all_dead) = self.supervise(jail, run, &mut tests, wall.as_secs(), None);
        Ok(judge_tests(observed.wall_expired, all_dead, &tests))
    }

    /// `npm install` of the package's dependencies (with its devDependencies for the tests)
    /// through the broker, within `wall`.
    #[allow(clippy::too_many_arguments)]
    fn npm(
        &self,
        order: &Validation,
        dev: bool,
        wall: Duration,
        run: &mut ActiveRun,
        dirs: &RunDirs,
        posture: &Posture,
        result: &mut RunResult,
        step: Step,
    ) -> Result<Result<(), Failed>, NotRun> {
        let failed = |message: String, tail: Option<String>| {
            Ok(Err((
                Refusal::new(RefusalCode::PackageInstallFailed, message),
                step,
                tail,
            )))
        };
        let Some(token) = order.install_token.as_deref() else {
            return failed(
                "the package has dependencies and the validation was given no broker token"
                    .to_owned(),
                None,
            );
        };
        let broker = match self.broker() {
            Ok(broker) => broker,
            Err(why) => return failed(why, None),
        };
        if wall < Duration::from_secs(1) {
            return Ok(Err(deadline_exceeded(step, wall)));
        }
        let scratch = dirs.scratch().join("tmp").join(".corral");
        std::fs::create_dir_all(&scratch)
            .and_then(|()| give(&scratch, run.uids[1]).map_err(std::io::Error::other))
            .map_err(|e| {
                note(&mut result.reply.diagnostics, format!("install: {e}"));
                NotRun::JailSetupFailed
            })?;
        let mut plan = self.plan(Language::Node, run, posture, wall.as_secs(), None);
        plan.argv = npm_install(token);
        plan.argv.extend([
            "--no-package-lock".to_owned(),
            // Peers are what Pi provides (the static checks allow no other): never fetched.
            "--legacy-peer-deps".to_owned(),
            if dev { "--include=dev" } else { "--omit=dev" }.to_owned(),
        ]);
        plan.env = install_environment(Language::Node);
        let (jail, _) = self.start_jail(
            &plan,
            run,
            None,
            Some(broker.clone()),
            &mut result.reply.diagnostics,
            false,
        )?;
        let mut installer = RunResult::default();
        let (observed, all_dead) = self.supervise(jail, run, &mut installer, wall.as_secs(), None);
        drop(run.broker_relay.take());
        let judged = judge_install(observed.wall_expired, all_dead, &installer, &broker, token);
        Ok(judged.map_err(|(refusal, tail)| (refusal, step, tail)))
    }

    /// Pi's loader in the disposable child, and the parent's reading of its observation.
    fn load(
        &self,
        order: &Validation,
        deadline: Instant,
        run: &mut ActiveRun,
        posture: &Posture,
        result: &mut RunResult,
        reply: &mut ValidateReply,
    ) -> Result<Result<(), Failed>, NotRun> {
        let wall = left(deadline);
        if wall < Duration::from_secs(LOADER_MIN_SECONDS) {
            return Ok(Err(deadline_exceeded(Step::Loader, wall)));
        }
        let runtime = &self.settings.jail.pi_runtime;
        let mode = match order.checked.profile {
            Profile::SkillOnly => "skills",
            Profile::Extension => "extension",
        };
        let mut plan = self.plan(Language::Node, run, posture, wall.as_secs(), None);
        plan.pi_runtime = Some(runtime.clone());
        plan.argv = vec![
            "/usr/bin/node".to_owned(),
            format!("{runtime}/observe.mjs"),
            mode.to_owned(),
            "/workspace".to_owned(),
        ];
        plan.env = node_environment();
        plan.env.extend(
            [
                ("HOME", "/tmp/pi-home"),
                ("PI_CODING_AGENT_DIR", "/tmp/pi-home/agent"),
                ("PI_OFFLINE", "1"),
                ("JITI_FS_CACHE", "false"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        // No grant and no broker: the child reaches nothing.
        let (jail, _) =
            self.start_jail(&plan, run, None, None, &mut result.reply.diagnostics, false)?;
        let mut child = RunResult::default();
        let (observed, _) = self.supervise(jail, run, &mut child, wall.as_secs(), None);
        let stderr = Some(stderr_tail(&child.reply.stderr.text));
        if observed.wall_expired {
            return Ok(Err((
                Refusal::new(
                    RefusalCode::PackageDeadlineExceeded,
                    "the validation's deadline was spent in Pi's loader",
                ),
                Step::Loader,
                stderr,
            )));
        }
        let stdout = &child.reply.stdout;
        let observation = match parse_observation(stdout.text.as_bytes(), stdout.truncated) {
            Ok(observation) => observation,
            Err(refusal) => return Ok(Err((refusal, Step::Loader, stderr))),
        };
        reply
            .runtime_version
            .clone_from(&observation.runtime.version);
        match corral_core::pi::surface::believe(&observation, order.checked.profile, &order.files) {
            Ok(surface) => {
                reply.surface = Some(surface);
                Ok(Ok(()))
            }
            Err(refusal) => Ok(Err((refusal, Step::Loader, stderr))),
        }
    }
}

/// The refusal of a validation on a worker without the Pi runtime.
fn pi_runtime_unavailable(runtime: &Path) -> Failed {
    (
        Refusal::new(
            RefusalCode::PiRuntimeUnavailable,
            format!(
                "this worker has no Pi runtime at {} (CORRAL_JAIL_PI_RUNTIME; \
                 scripts/build-pi-runtime builds it)",
                runtime.display()
            ),
        ),
        Step::Loader,
        None,
    )
}

/// The tests' run judged: out of time, a process left alive, or a nonzero exit fails them.
fn judge_tests(wall_expired: bool, all_dead: bool, tests: &RunResult) -> Result<(), Failed> {
    let tail = Some(output_tail(tests));
    if wall_expired {
        return Err((
            Refusal::new(
                RefusalCode::PackageDeadlineExceeded,
                "the validation's deadline was spent in the package's tests",
            ),
            Step::Tests,
            tail,
        ));
    }
    if !all_dead {
        return Err((
            Refusal::new(
                RefusalCode::PackageTestsFailed,
                "a process of the tests survived the kill: the tree cannot be rebuilt safely",
            ),
            Step::Tests,
            tail,
        ));
    }
    if tests.reply.exit_code != Some(0) {
        return Err((
            Refusal::new(
                RefusalCode::PackageTestsFailed,
                format!("the package's tests exited {:?}", tests.reply.exit_code),
            ),
            Step::Tests,
            tail,
        ));
    }
    Ok(())
}

/// The `npm install` judged: out of time, a nonzero exit or a process left alive fails it, with
/// the output's tail (the broker token hidden).
fn judge_install(
    wall_expired: bool,
    all_dead: bool,
    installer: &RunResult,
    broker: &crate::relay::ProxyAddress,
    token: &str,
) -> Result<(), (Refusal, Option<String>)> {
    let tail = Some(output_tail(installer).replace(token, "<token>"));
    if wall_expired {
        return Err((
            Refusal::new(
                RefusalCode::PackageDeadlineExceeded,
                "the validation's deadline was spent installing the dependencies",
            ),
            tail,
        ));
    }
    if installer.reply.exit_code != Some(0) || !all_dead {
        let unreachable = registry_was_unreachable(broker, token);
        return Err((
            Refusal::new(
                RefusalCode::PackageInstallFailed,
                format!(
                    "npm install exited {:?}{}",
                    installer.reply.exit_code,
                    if unreachable {
                        ": the registry is unreachable"
                    } else {
                        ""
                    }
                ),
            ),
            tail,
        ));
    }
    Ok(())
}

/// What is left of the deadline.
fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn deadline_exceeded(step: Step, left: Duration) -> Failed {
    (
        Refusal::new(
            RefusalCode::PackageDeadlineExceeded,
            format!(
                "{} ms of the validation's deadline were left, too little for the {} step",
                left.as_millis(),
                match step {
                    Step::Static => "static",
                    Step::Tests => "tests",
                    Step::Reinstall => "reinstall",
                    Step::Loader => "loader",
                }
            ),
        ),
        step,
        None,
    )
}

/// The environment of Node in the jail: nothing of the supervisor's.
fn node_environment() -> Vec<(String, String)> {
    [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("TMPDIR", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("NODE_OPTIONS", ""),
        ("NO_COLOR", "1"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .to_vec()
}

/// The bounded tail of a step's stdout and stderr.
fn output_tail(step: &RunResult) -> String {
    stderr_tail(&format!(
        "{}\n{}",
        step.reply.stdout.text, step.reply.stderr.text
    ))
}

/// Writes the server's files into `root` (regular files and directories only, never following
/// a link: `root` was emptied or is new), owned by `owner`.
fn stage(files: &FileSet, root: &Path, owner: u32) -> Result<(), String> {
    for (path, bytes) in files.iter() {
        let target = root.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("stage {path}: {e}"))?;
        }
        std::fs::write(&target, bytes).map_err(|e| format!("stage {path}: {e}"))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| format!("stage {path}: {e}"))?;
    }
    give(root, owner)
}

/// Links the packages Pi provides into `root/node_modules`, read-only from the baked runtime, so
/// that tests and extensions import the one runtime the lock pins.
fn link_runtime(root: &Path, runtime: &Path, owner: u32) -> Result<(), String> {
    for name in RUNTIME_PROVIDED {
        let link = root.join("node_modules").join(name);
        if link.symlink_metadata().is_ok() {
            continue;
        }
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("link {name}: {e}"))?;
        }
        std::os::unix::fs::symlink(runtime.join("node_modules").join(name), &link)
            .map_err(|e| format!("link {name}: {e}"))?;
    }
    give(&root.join("node_modules"), owner)
}

/// Removes everything in `dir` (the directory, a mount point, stays), never following a link.
fn empty(dir: &Path) -> Result<(), String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("empty {}: {e}", dir.display())),
    };
    for entry in entries {
        let entry = entry.map_err(|e| format!("empty {}: {e}", dir.display()))?;
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let removed = if is_dir {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| format!("empty {}: {e}", path.display()))?;
    }
    Ok(())
}
