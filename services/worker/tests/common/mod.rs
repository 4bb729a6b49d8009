//! Shared helpers for the end-to-end tests: run `corral-jail run` (the same entry point as
//! `corral jail run`) on a piece of code and read its one JSON object.
#![allow(dead_code)]

pub mod api;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Host uids of jails start here (`HOST_UID_BASE` in the supervisor).
pub const JAIL_UID_BASE: u32 = 0x7000_0000;

static SERIAL: Mutex<()> = Mutex::new(());
static NEXT_DIR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The tests run one jail at a time: they measure the whole host (no jail process left), and the
/// machine has two cores.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether this test can run: root. Without it the test skips through `corral_testkit::skip`
/// (which fails it under `CORRAL_REQUIRE_ROOT`) and must return.
pub fn root_or_skip(test: &str) -> bool {
    if corral_testkit::is_root() {
        return true;
    }
    corral_testkit::skip(
        test,
        corral_testkit::Need::Root,
        "the jail's supervisor needs root (mounts, id maps, cgroups)",
    );
    false
}

/// The CPUs this machine has, where it has two or more: with one, a run told of one CPU cannot be
/// told apart from a run told of the machine's. Otherwise the test skips through
/// `corral_testkit::skip` (which fails it under `CORRAL_REQUIRE_TOOLS`) and must return.
pub fn two_cpus_or_skip(test: &str) -> Option<usize> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 {
        corral_testkit::skip(
            test,
            corral_testkit::Need::Tools,
            "one CPU: nothing to tell apart",
        );
        return None;
    }
    Some(cpus)
}

/// The CPUs numpy's BLAS starts threads for, where a test of those threads can run: two or more
/// ([`two_cpus_or_skip`]) and the baked stack (`scripts/build-python-stack`).
pub fn blas_cpus_or_skip(test: &str) -> Option<usize> {
    let cpus = two_cpus_or_skip(test)?;
    if !Path::new("/opt/corral/python/bin/python3").exists() {
        corral_testkit::skip(
            test,
            corral_testkit::Need::Tools,
            "no baked Python stack: run scripts/build-python-stack",
        );
        return None;
    }
    Some(cpus)
}

/// A fresh directory for one test, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let unique = NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "corral-worker-test-{name}-{}-{unique}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One invocation.
pub struct Jail {
    pub language: &'static str,
    pub code: String,
    pub workspace: Option<PathBuf>,
    pub wall_seconds: Option<u64>,
    pub env: Vec<(String, String)>,
    /// A program to run the binary under (`[program, args...]`), e.g. a seccomp wrapper.
    pub wrapper: Vec<String>,
}

/// What came back.
pub struct Ran {
    pub json: Value,
    pub status: i32,
    pub stderr: String,
    pub elapsed: Duration,
    /// Processes in the jails' uid range found on the host right after this run.
    pub leftovers: Vec<i32>,
}

impl Jail {
    pub fn python(code: &str) -> Self {
        Self {
            language: "python",
            code: code.to_owned(),
            workspace: None,
            wall_seconds: None,
            env: Vec::new(),
            wrapper: Vec::new(),
        }
    }

    pub fn node(code: &str) -> Self {
        Self {
            language: "node",
            ..Self::python(code)
        }
    }

    pub fn workspace(mut self, dir: &Path) -> Self {
        self.workspace = Some(dir.to_path_buf());
        self
    }

    pub fn wall(mut self, seconds: u64) -> Self {
        self.wall_seconds = Some(seconds);
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn under(mut self, wrapper: Vec<String>) -> Self {
        self.wrapper = wrapper;
        self
    }

    /// Runs it and parses the one JSON object it prints. Runs are serialised, and the host is
    /// searched for jail processes right after each one, while no other jail of this test binary
    /// can be running: the search then sees this run's leftovers and nobody else's.
    pub fn run(&self) -> Ran {
        static ONE_JAIL_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _alone = ONE_JAIL_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let scratch = TempDir::new("code");
        let file = scratch.path().join(if self.language == "node" {
            "main.js"
        } else {
            "main.py"
        });
        std::fs::write(&file, &self.code).unwrap();
        let binary = env!("CARGO_BIN_EXE_corral-jail");
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command.arg("run").arg("--language").arg(self.language);
        if let Some(dir) = &self.workspace {
            command.arg("--workspace").arg(dir);
        }
        if let Some(seconds) = self.wall_seconds {
            command.arg("--wall-seconds").arg(seconds.to_string());
        }
        command.arg(&file);
        for (name, value) in &self.env {
            command.env(name, value);
        }
        let started = Instant::now();
        let output: Output = command.output().unwrap();
        let elapsed = started.elapsed();
        let stdout = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "exactly one JSON line expected; stdout: {stdout:.2000} stderr: {stderr:.2000}"
        );
        let json: Value = serde_json::from_str(lines[0]).unwrap();
        Ran {
            json,
            status: output.status.code().unwrap_or(-1),
            stderr,
            elapsed,
            leftovers: jail_processes_on_host(),
        }
    }
}

impl Ran {
    pub fn stdout(&self) -> &str {
        self.json["stdout"]["text"].as_str().unwrap_or("")
    }

    pub fn stderr_text(&self) -> &str {
        self.json["stderr"]["text"].as_str().unwrap_or("")
    }

    pub fn bounds(&self) -> Vec<String> {
        self.json["bounds"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn downloads(&self) -> Vec<String> {
        let mut paths: Vec<String> = self.json["downloads"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d["path"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        paths.sort();
        paths
    }

    /// The code ran (exit status 0, `not_run` null).
    pub fn assert_ran(&self) {
        assert_eq!(self.status, 0, "{}\n{}", self.json, self.stderr);
        assert!(self.json["not_run"].is_null(), "{}", self.json);
    }

    /// The reset proved the worker clean: every measurement present and zero, verdict `clean`,
    /// and no process of any jail left on the host.
    pub fn assert_clean_reset(&self) {
        let evidence = &self.json["reset_evidence"];
        for field in [
            "processes_remaining",
            "workspace_entries",
            "scratch_entries",
            "mounts_remaining",
        ] {
            assert_eq!(evidence[field], 0, "{field} in {evidence}");
        }
        assert_eq!(evidence["verdict"], "clean", "{evidence}");
        assert_eq!(
            self.leftovers,
            Vec::<i32>::new(),
            "jail processes left on the host"
        );
    }
}

/// Processes on the host whose uids lie in the jails' range.
pub fn jail_processes_on_host() -> Vec<i32> {
    processes_with_uid(|id| id >= JAIL_UID_BASE)
}

/// Processes on the host with any uid (real, effective, saved or filesystem) that `wanted` accepts.
pub fn processes_with_uid(wanted: impl Fn(u32) -> bool) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(listing) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in listing.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let matches = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .is_some_and(|ids| {
                ids.split_whitespace()
                    .filter_map(|id| id.parse::<u32>().ok())
                    .any(&wanted)
            });
        if matches {
            found.push(pid);
        }
    }
    found
}

/// A wrapper that runs a program under a seccomp filter refusing `seccomp` itself and, with
/// `deny_user_namespaces`, `unshare` and `clone` with `CLONE_NEWUSER` (and `clone3`, whose flags a
/// filter cannot read). Written in Python with ctypes, so the test needs no unsafe code.
pub fn seccomp_wrapper(dir: &Path, deny_user_namespaces: bool, deny_seccomp: bool) -> Vec<String> {
    let script = dir.join("deny.py");
    let source = format!(
        r#"
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
SYS_UNSHARE, SYS_CLONE, SYS_CLONE3, SYS_SECCOMP = {unshare}, {clone}, {clone3}, {seccomp}
NEWUSER = 0x10000000
ALLOW, EPERM, ENOSYS = 0x7fff0000, 0x50000 | 1, 0x50000 | 38
def stmt(k, code=0x06): return struct.pack("=HBBI", code, 0, 0, k)
def load(offset): return struct.pack("=HBBI", 0x20, 0, 0, offset)
def jeq(k, jt, jf): return struct.pack("=HBBI", 0x15, jt, jf, k)
def jset(k, jt, jf): return struct.pack("=HBBI", 0x45, jt, jf, k)
prog = [load(0)]
if {deny_userns}:
    prog += [jeq(SYS_CLONE3, 0, 1), stmt(ENOSYS)]
    for nr in (SYS_UNSHARE, SYS_CLONE):
        prog += [jeq(nr, 0, 4), load(16), jset(NEWUSER, 0, 1), stmt(EPERM), stmt(ALLOW)]
if {deny_seccomp}:
    prog += [jeq(SYS_SECCOMP, 0, 1), stmt(EPERM)]
prog += [stmt(ALLOW)]
code = b"".join(prog)
buf = ctypes.create_string_buffer(code, len(code))
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
p = Prog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
assert libc.prctl(38, 1, 0, 0, 0) == 0
assert libc.prctl(22, 2, ctypes.byref(p), 0, 0) == 0, ctypes.get_errno()
os.execv(sys.argv[1], sys.argv[1:])
"#,
        unshare = libc::SYS_unshare,
        clone = libc::SYS_clone,
        clone3 = libc::SYS_clone3,
        seccomp = libc::SYS_seccomp,
        deny_userns = if deny_user_namespaces {
            "True"
        } else {
            "False"
        },
        deny_seccomp = if deny_seccomp { "True" } else { "False" },
    );
    std::fs::write(&script, source).unwrap();
    vec![
        "/usr/bin/python3".to_owned(),
        script.to_string_lossy().into_owned(),
    ]
}
