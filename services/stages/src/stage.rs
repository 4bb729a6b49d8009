//! The re-executed stages of a jail, and the start-up probe.
//!
//! Stage 1 creates the namespaces and waits while the supervisor maps its ids and places it in
//! the run's cgroup; it then brings loopback up and starts stage 2, which is pid 1 of the new pid
//! namespace. Stage 2 builds the filesystem, drops every privilege, applies the limits and the
//! seccomp filter, says `G`, starts the interpreter and reaps until the interpreter exits; its
//! exit takes every other process of the jail with it. Each stage reports a failed step as one
//! `E <step> <detail>` line on stdout and exits before any code runs.

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitCode, ExitStatus};

use nix::errno::Errno;
use nix::sched::{CloneFlags, unshare};
use nix::sys::prctl;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{
    Gid, Pid, Uid, chdir, getgid, getppid, getuid, setgroups, sethostname, setresgid, setresuid,
};

use crate::mounts::{self, Layout};
use crate::netlink;
use crate::plan::{
    GO_BYTE, JailPlan, LINE_ERROR, LINE_GO, LINE_READY, LINE_WAIVED, Limits, SIGNAL_EXIT_BASE,
    STAGE_FAILED_EXIT,
};
use crate::seccomp;

/// The namespaces besides the user namespace.
fn namespaces() -> CloneFlags {
    CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWPID
}

/// Writes one protocol line to stdout. A line that cannot be written means the supervisor is
/// gone, and the stage has no one to run for.
fn say(line: &str) {
    let one_line: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{one_line}")
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(i32::from(STAGE_FAILED_EXIT));
    }
}

/// Reports a failed step and exits before any code runs.
fn fail(step: &str, detail: impl std::fmt::Display) -> ExitCode {
    say(&format!("{LINE_ERROR} {step} {detail}"));
    ExitCode::from(STAGE_FAILED_EXIT)
}

fn parse_plan(plan: &str) -> Result<JailPlan, ExitCode> {
    serde_json::from_str(plan).map_err(|error| fail("plan", error))
}

/// An exit status as one number: the code, or 128 plus the signal.
fn status_number(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => SIGNAL_EXIT_BASE + signal,
        (None, None) => SIGNAL_EXIT_BASE,
    }
}

fn exit_with(number: i32) -> ExitCode {
    ExitCode::from(u8::try_from(number.clamp(0, 255)).unwrap_or(u8::MAX))
}

/// Names the process as `ps` shows it: a stage executed through the stage binary's descriptor
/// would otherwise be called by the descriptor's number, and through `/proc/self/exe` `exe`.
fn name_this_process(name: &std::ffi::CStr) {
    let _ = prctl::set_name(name);
}

/// Stage 1: namespaces, then (after the supervisor's go) loopback, hostname and stage 2.
pub fn stage1(plan_text: &str) -> ExitCode {
    name_this_process(c"corral-stage1");
    let plan = match parse_plan(plan_text) {
        Ok(plan) => plan,
        Err(code) => return code,
    };
    let supervisor = getppid();
    if plan.user_namespace
        && let Err(error) = unshare(CloneFlags::CLONE_NEWUSER)
    {
        return fail(
            "user_namespaces",
            format!("unshare(CLONE_NEWUSER): {error}"),
        );
    }
    if let Err(error) = unshare(namespaces()) {
        return fail("namespaces", format!("unshare: {error}"));
    }
    say(LINE_READY);
    let mut go = [0u8; 1];
    if !matches!(std::io::stdin().read(&mut go), Ok(1)) || go[0] != GO_BYTE {
        // The supervisor gave up on this jail.
        return ExitCode::from(STAGE_FAILED_EXIT);
    }
    if plan.user_namespace {
        // Become the namespace's root (the run's root uid on the host), so that stage 2 starts
        // with full capabilities inside the namespace and none outside it.
        let root = (Gid::from_raw(0), Uid::from_raw(0));
        if let Err(error) =
            setresgid(root.0, root.0, root.0).and_then(|()| setresuid(root.1, root.1, root.1))
        {
            return fail(
                "credentials",
                format!("become root of the user namespace: {error}"),
            );
        }
    }
    // If the supervisor dies, so does the jail (stage 2 follows stage 1 the same way). Set after
    // the uid change, which clears it; a supervisor that died before it was set is seen here.
    if let Err(error) = prctl::set_pdeathsig(Signal::SIGKILL) {
        return fail("pdeathsig", error);
    }
    if getppid() != supervisor {
        return ExitCode::from(STAGE_FAILED_EXIT);
    }
    // Now that the supervisor has placed this process in the run's cgroup, a cgroup namespace
    // rooted there hides the host's cgroup paths from /proc/self/cgroup.
    if let Err(error) = unshare(CloneFlags::CLONE_NEWCGROUP) {
        return fail("namespaces", format!("unshare(CLONE_NEWCGROUP): {error}"));
    }
    if let Err(error) = netlink::loopback_up() {
        return fail("loopback", error);
    }
    if let Err(error) = sethostname("corral") {
        return fail("hostname", error);
    }
    let mut command = Command::new("/proc/self/exe");
    command
        .args(&plan.reexec_prefix)
        .arg("__stage2")
        .arg(plan_text)
        .env_clear();
    let mut init = match command.spawn() {
        Ok(child) => child,
        Err(error) => return fail("spawn", format!("start pid 1: {error}")),
    };
    match init.wait() {
        Ok(status) => exit_with(status_number(status)),
        Err(error) => fail("wait", error),
    }
}

/// Stage 2, pid 1 of the jail: filesystem, credentials, limits, filter, then the code.
pub fn stage2(plan_text: &str) -> ExitCode {
    name_this_process(c"corral-stage2");
    let plan = match parse_plan(plan_text) {
        Ok(plan) => plan,
        Err(code) => return code,
    };
    let run_dir = std::path::PathBuf::from(&plan.run_dir);
    let python_stack = plan.python_stack.as_ref().map(std::path::PathBuf::from);
    let pi_runtime = plan.pi_runtime.as_ref().map(std::path::PathBuf::from);
    let layout = Layout {
        run_dir: &run_dir,
        uid: plan.inner_uid,
        gid: plan.inner_gid,
        python_stack: python_stack.as_deref(),
        pi_runtime: pi_runtime.as_deref(),
        resources: plan.resources,
        cpus: plan.cpus,
    };
    if let Err(error) = mounts::build_and_enter(&layout) {
        return fail("filesystem", error);
    }
    if let Err(error) = drop_privileges(plan.inner_uid, plan.inner_gid) {
        return fail("credentials", error);
    }
    // After the uid change, which clears it: if stage 1 dies, so does the jail.
    if let Err(error) = prctl::set_pdeathsig(Signal::SIGKILL) {
        return fail("pdeathsig", error);
    }
    if let Err(error) = apply_limits(&plan.limits) {
        return fail("rlimits", error);
    }
    if let Err(error) = chdir("/workspace") {
        return fail("workspace", error);
    }
    if let Err(error) = seccomp::install() {
        if !plan.seccomp_waivable {
            return fail("seccomp", error);
        }
        say(&format!("{LINE_WAIVED} seccomp {error}"));
        if let Err(error) = prctl::set_no_new_privs() {
            return fail("no_new_privs", error);
        }
    }
    // The code shares this uid; a non-dumpable pid 1 keeps its memory and /proc entries closed.
    if let Err(error) = prctl::set_dumpable(false) {
        return fail("dumpable", error);
    }
    let Some((program, args)) = plan.argv.split_first() else {
        return fail("plan", "empty argv");
    };
    say(LINE_GO);
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)));
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            eprintln!("corral: cannot start {program}: {error}");
            return ExitCode::from(127);
        }
    };
    exit_with(reap_until(Pid::from_raw(
        i32::try_from(child.id()).unwrap_or(i32::MAX),
    )))
}

/// As pid 1: reaps every orphan until `child` exits, and returns its status as one number.
fn reap_until(child: Pid) -> i32 {
    loop {
        match waitpid(None::<Pid>, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == child => return code,
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == child => {
                return SIGNAL_EXIT_BASE + signal as i32;
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return i32::from(STAGE_FAILED_EXIT),
        }
    }
}

/// Leaves root for the unprivileged user: no supplementary groups (root's would still open
/// group-readable host files), then gid, then uid, then a check that no capability is left.
fn drop_privileges(uid: u32, gid: u32) -> Result<(), String> {
    setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    let (gid, uid) = (Gid::from_raw(gid), Uid::from_raw(uid));
    setresgid(gid, gid, gid).map_err(|e| format!("setresgid: {e}"))?;
    setresuid(uid, uid, uid).map_err(|e| format!("setresuid: {e}"))?;
    if getuid() != uid || getgid() != gid {
        return Err("ids did not change".to_owned());
    }
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(|e| format!("read status: {e}"))?;
    let all_clear = ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"]
        .iter()
        .all(|field| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(field))
                .is_some_and(|value| value.trim().chars().all(|c| c == '0'))
        });
    if !all_clear {
        return Err("capabilities remain after the uid change".to_owned());
    }
    Ok(())
}

fn apply_limits(limits: &Limits) -> Result<(), String> {
    for (resource, value) in [
        (Resource::RLIMIT_NPROC, limits.processes),
        (Resource::RLIMIT_DATA, limits.data_bytes),
        (Resource::RLIMIT_FSIZE, limits.file_bytes),
        (Resource::RLIMIT_NOFILE, limits.open_files),
        (Resource::RLIMIT_CPU, limits.cpu_seconds),
        (Resource::RLIMIT_CORE, 0),
    ] {
        setrlimit(resource, value, value).map_err(|e| format!("{resource:?}: {e}"))?;
    }
    Ok(())
}

/// The start-up probe: tries each isolation primitive in this throwaway process and prints one
/// `<primitive> ok` or `<primitive> missing <detail>` line per primitive.
pub fn probe() -> ExitCode {
    let user =
        unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| format!("unshare(CLONE_NEWUSER): {e}"));
    let others = unshare(namespaces()).map_err(|e| format!("unshare: {e}"));
    let filter = seccomp::install_probe();
    for (name, result) in [
        ("user_namespaces", user),
        ("namespaces", others),
        ("seccomp", filter),
    ] {
        match result {
            Ok(()) => say(&format!("{name} ok")),
            Err(detail) => say(&format!("{name} missing {detail}")),
        }
    }
    ExitCode::SUCCESS
}
