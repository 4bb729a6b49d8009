//! Launching a jail: its plan, stage 1, the id maps, the egress relay, the wait for `G`.

use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use corral_core::jail::{Language, NotRun, Posture, Primitive};

use super::command::{bootstrap, code_path, environment, interpreter, results_path};
use super::{ActiveRun, Worker};
use crate::capture;
use crate::relay::Relay;
use crate::result::note;
use corral_stages::plan::{GO_BYTE, JailPlan, LINE_ERROR, LINE_READY, LINE_WAIVED, Limits};

/// The code's uid and gid inside a user namespace.
const INNER_ID: u32 = 1000;
/// How long building a jail may take before the run is refused.
const SETUP_DEADLINE: Duration = Duration::from_secs(10);
/// What of a failed jail's stderr goes into the diagnostics, and how long to wait for it.
const STAGE_STDERR_MAX_BYTES: usize = 2_048;
const STAGE_STDERR_WAIT: Duration = Duration::from_millis(200);
/// `RLIM_INFINITY`.
const RLIMIT_UNLIMITED: u64 = u64::MAX;
/// Descriptors the code may hold open.
const OPEN_FILES_MAX: u64 = 1_024;
/// Tasks beyond `SANDBOX_MAX_PROCESSES` the rlimit allows when the pids controller enforces the
/// bound: the controller is the one that reports it, so the rlimit must not refuse first.
const NPROC_SLACK: u64 = 16;

/// A jail that said `G`.
pub(super) struct Started {
    pub(super) pid: u32,
    pub(super) stdout: std::process::ChildStdout,
    pub(super) stderr: std::process::ChildStderr,
    pub(super) go_at: Instant,
}

impl Worker {
    /// What the stages need to build this run's jail.
    pub(super) fn plan(
        &self,
        language: Language,
        run: &ActiveRun,
        posture: &Posture,
        wall_seconds: u64,
        warm: Option<&[String]>,
    ) -> JailPlan {
        let bounds = &self.settings.bounds;
        let waived = |primitive| matches!(posture, Posture::Weaker { waived } if waived.contains(&primitive));
        let user_namespace = !waived(Primitive::UserNamespaces);
        let (inner_uid, inner_gid) = if user_namespace {
            (INNER_ID, INNER_ID)
        } else {
            (run.uids[1], run.uids[1])
        };
        // What the code is told it has (decisions 0063, 0064): its libraries' threads, its count.
        let cpus = corral_core::bounds::run_cpus(self.cpus, bounds.max_processes);
        let memory_cgroup = !waived(Primitive::CgroupMemory);
        let pids_cgroup = !waived(Primitive::CgroupPids);
        JailPlan {
            reexec_prefix: self.reexec.prefix.clone(),
            run_dir: run.run_dir.to_string_lossy().into_owned(),
            user_namespace,
            inner_uid,
            inner_gid,
            seccomp_waivable: waived(Primitive::Seccomp),
            python_stack: self
                .python_stack()
                .ok()
                .map(|stack| stack.to_string_lossy().into_owned()),
            pi_runtime: None,
            resources: false,
            argv: if let Some(preimport) = warm {
                bootstrap(
                    language,
                    &self.python(),
                    &code_path(language),
                    preimport,
                    Some(&results_path()),
                )
            } else {
                interpreter(
                    language,
                    &self.python(),
                    &code_path(language),
                    Some(&results_path()),
                )
            },
            env: environment(cpus),
            cpus,
            limits: Limits {
                processes: u64::from(bounds.max_processes)
                    + if pids_cgroup { NPROC_SLACK } else { 0 },
                // With the memory controller, the cgroup is the bound: it counts what is used,
                // not what is reserved, and it reports being hit. An address-space rlimit would
                // refuse a large allocation silently before the cgroup could say so. Without the
                // controller, the data rlimit is the only bound there is.
                data_bytes: if memory_cgroup {
                    RLIMIT_UNLIMITED
                } else {
                    bounds.max_memory_bytes
                },
                // A backstop above both tmpfs sizes, so that a full tmpfs says "no space" first.
                file_bytes: bounds
                    .workspace_max_bytes
                    .max(bounds.tmp_max_bytes)
                    .saturating_add(1 << 20),
                open_files: OPEN_FILES_MAX,
                cpu_seconds: wall_seconds.saturating_add(5),
            },
        }
    }

    /// Starts stage 1, maps its ids, places it in the cgroups, opens the egress relay in its
    /// network namespace (with `grant`), lets it go and waits for `G`.
    pub(super) fn start_jail(
        &self,
        plan: &JailPlan,
        run: &mut ActiveRun,
        grant: Option<&str>,
        broker: Option<crate::relay::ProxyAddress>,
        diagnostics: &mut Vec<String>,
        keep_stdin: bool,
    ) -> Result<(Started, Option<ChildStdin>), NotRun> {
        let failed = |diagnostics: &mut Vec<String>, error: String| {
            note(diagnostics, error);
            NotRun::JailSetupFailed
        };
        let plan_text =
            serde_json::to_string(plan).map_err(|e| failed(diagnostics, format!("plan: {e}")))?;
        let mut child = self
            .spawn_stage1(&plan_text)
            .map_err(|e| failed(diagnostics, format!("start the jail: {e}")))?;
        let pid = child.id();
        let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            run.stage1 = Some(child);
            return Err(failed(
                diagnostics,
                "the jail's pipes are missing".to_owned(),
            ));
        };
        run.stage1 = Some(child);
        capture::prepare(&stdout, &stderr).map_err(|e| failed(diagnostics, e))?;
        // Stage 1 blocks on stdin until the go byte, so it cannot fork before this.
        run.cgroups
            .add(pid)
            .map_err(|(primitive, e)| failed(diagnostics, format!("{}: {e}", primitive.code())))?;
        let deadline = Instant::now() + SETUP_DEADLINE;
        let ready =
            capture::read_line(&mut stdout, deadline).map_err(|e| failed(diagnostics, e))?;
        if ready.as_deref() != Some(LINE_READY) {
            return Err(self.stage_failure(ready.into_iter().collect(), &mut stderr, diagnostics));
        }
        if plan.user_namespace {
            write_id_maps(pid, plan, run).map_err(|e| failed(diagnostics, e))?;
        }
        // Before the go byte: the listener exists before any code can try to connect to it.
        self.open_relays(pid, run, grant, broker)
            .map_err(|e| failed(diagnostics, e))?;
        stdin
            .write_all(&[GO_BYTE])
            .map_err(|e| failed(diagnostics, format!("start the jail: {e}")))?;
        // The interpreter inherits this pipe as its stdin: closed now, a cold run's code reads
        // end of input; kept, a prepared jail's bootstrap reads the code from it.
        let program = if keep_stdin {
            Some(stdin)
        } else {
            drop(stdin);
            None
        };
        let (went, lines) =
            capture::read_until_go(&mut stdout, deadline).map_err(|e| failed(diagnostics, e))?;
        if !went {
            return Err(self.stage_failure(lines, &mut stderr, diagnostics));
        }
        for line in lines {
            if let Some(rest) = line.strip_prefix(LINE_WAIVED) {
                note(diagnostics, format!("waived at run time:{rest}"));
            }
        }
        Ok((
            Started {
                pid,
                stdout,
                stderr,
                go_at: Instant::now(),
            },
            program,
        ))
    }

    /// Starts stage 1 with the plan as its argument, a clear environment and piped streams.
    fn spawn_stage1(&self, plan_text: &str) -> std::io::Result<std::process::Child> {
        Command::new(&self.reexec.program)
            .args(&self.reexec.prefix)
            .arg("__stage1")
            .arg(plan_text)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    }

    /// Opens the relays in the jail's network namespace: egress (with `grant`), the tools when
    /// the run ordered them, and the package broker's when one is given.
    fn open_relays(
        &self,
        pid: u32,
        run: &mut ActiveRun,
        grant: Option<&str>,
        broker: Option<crate::relay::ProxyAddress>,
    ) -> Result<(), String> {
        let relay = Relay::open(pid, self.egress_proxy.clone().ok())?;
        relay.attach_grant(grant);
        run.relay = Some(relay);
        if let Some(order) = run.tools_pending.take() {
            run.tool_relay = Some(crate::tools::ToolRelay::open(pid, order)?);
        }
        if let Some(broker) = broker {
            let plain = Relay::open_plain(
                pid,
                broker,
                corral_core::packages::registries::JAIL_BROKER_PORT,
            )?;
            run.broker_relay = Some(plain);
        }
        Ok(())
    }

    /// The refusal for a jail that ended before `G`.
    fn stage_failure(
        &self,
        lines: Vec<String>,
        stderr: &mut std::process::ChildStderr,
        diagnostics: &mut Vec<String>,
    ) -> NotRun {
        let mut reason = NotRun::JailSetupFailed;
        for line in lines {
            let Some(rest) = line.strip_prefix(LINE_ERROR) else {
                continue;
            };
            let step = rest.trim_start().split(' ').next().unwrap_or("");
            // A primitive that passed the probe but failed now is still a missing primitive.
            if ["user_namespaces", "namespaces", "seccomp"].contains(&step) {
                reason = NotRun::IsolationUnavailable;
            }
            note(diagnostics, format!("jail setup failed:{rest}"));
        }
        let said = capture::read_available(stderr, STAGE_STDERR_MAX_BYTES, STAGE_STDERR_WAIT);
        if !said.is_empty() {
            note(diagnostics, format!("jail stderr: {said}"));
        }
        if reason == NotRun::JailSetupFailed && diagnostics.is_empty() {
            note(diagnostics, "the jail ended before it was ready");
        }
        reason
    }
}

/// Maps the jail's root and inner user onto the run's two ids, in stage 1's user namespace.
fn write_id_maps(pid: u32, plan: &JailPlan, run: &ActiveRun) -> Result<(), String> {
    let map = format!(
        "0 {} 1\n{} {} 1\n",
        run.uids[0], plan.inner_uid, run.uids[1]
    );
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, &map).map_err(|e| format!("write {path}: {e}"))?;
    }
    Ok(())
}
