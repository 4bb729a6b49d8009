//! The `local` backend, the embedded default: workers are processes on this machine.
//!
//! Each worker is one process started from a command template (`{port}` and `{id}` are filled in;
//! the id must appear in the command line so that a reused pid is never mistaken for a worker).
//! A record per worker in the state directory (`<id>.worker`: pid and port) lets a restarted
//! controller rediscover what it started. A create is done when the worker accepts connections on
//! its port; a delete is done only when the process is confirmed gone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use corral_contract::locate::LocalRecord;
use corral_core::ids::{ImageId, WorkerId};
use corral_core::pool::Outcome;
use corral_core::store::Unavailable;
use corral_core::time::UnixMillis;
use sha2::{Digest, Sha256};

use crate::Backend;

/// Workers as local processes.
pub struct LocalBackend {
    state_dir: PathBuf,
    program: PathBuf,
    args: Vec<String>,
    image: ImageId,
    ready_timeout: Duration,
    env: Vec<(String, String)>,
}

impl LocalBackend {
    /// A backend that starts `program args…` per worker and keeps its records in `state_dir`. The
    /// image is the digest of `program` and every file in `runtime` (interpreters, package lock):
    /// a changed build is a new image.
    pub fn new(
        state_dir: &Path,
        program: &Path,
        args: &[&str],
        runtime: &[&Path],
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(state_dir)?;
        let mut digest = Sha256::new();
        for file in std::iter::once(program).chain(runtime.iter().copied()) {
            digest.update(std::fs::read(file)?);
            digest.update(b"\0");
        }
        for arg in args {
            digest.update(arg.as_bytes());
            digest.update(b"\0");
        }
        let hex = corral_core::ids::hex(&digest.finalize()[..12]);
        Ok(Self {
            state_dir: state_dir.to_path_buf(),
            program: program.to_path_buf(),
            args: args.iter().map(|a| (*a).to_string()).collect(),
            image: ImageId(format!("local-sha256:{hex}")),
            ready_timeout: Duration::from_secs(20),
            env: Vec::new(),
        })
    }

    /// Sets an environment variable for every worker process (for example its credential).
    #[must_use]
    pub fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// The directory holding the records.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The record of `worker`, if this backend (or an earlier run of it) started one.
    pub fn record(&self, worker: WorkerId) -> Option<LocalRecord> {
        LocalRecord::read(&self.state_dir, worker)
    }

    fn write_record(&self, worker: WorkerId, record: LocalRecord) -> std::io::Result<()> {
        let path = LocalRecord::path(&self.state_dir, worker);
        let staging = path.with_extension("staging");
        std::fs::write(&staging, record.render())?;
        std::fs::rename(staging, path)
    }
}

/// True when `pid` is a live (not zombie) process that names `worker` in its command line or in
/// its `CORRAL_WORKER_ID` environment variable (so a reused pid is never taken for a worker).
fn is_worker_process(pid: i32, worker: WorkerId) -> bool {
    let id = worker.to_string();
    let in_cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == id.as_bytes()));
    let marker = format!("CORRAL_WORKER_ID={id}");
    let in_environ = std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|e| e.split(|b| *b == 0).any(|v| v == marker.as_bytes()));
    let named = in_cmdline || in_environ;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself contain spaces.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    named && !matches!(state, Some("Z" | "X"))
}

/// The state and start time (in clock ticks since boot) of process `pid`, from /proc; `None`
/// once it is gone.
fn state_and_start(pid: i32) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields follow the parenthesised command name, which may itself contain spaces.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.to_owned();
    // `starttime` is field 22; `state` was field 3.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether the process that was `pid`, started at `start`, has ended: gone, a zombie, or the pid
/// taken by another process. A process that is exiting loses its command line and environment
/// before it stops running, so their absence is not yet proof.
fn ended(pid: i32, start: u64) -> bool {
    match state_and_start(pid) {
        None => true,
        Some((state, started)) => started != start || matches!(state.as_str(), "Z" | "X"),
    }
}

fn free_port() -> Option<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()
        .map(|a| a.port())
}

impl Backend for LocalBackend {
    fn image(&self) -> ImageId {
        self.image.clone()
    }

    async fn create(
        &self,
        worker: WorkerId,
        _image: &ImageId,
        _claim_deadline: Option<UnixMillis>,
    ) -> Outcome {
        let Some(port) = free_port() else {
            return Outcome::Failed;
        };
        let id = worker.to_string();
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| a.replace("{port}", &port.to_string()).replace("{id}", &id))
            .collect();
        let spawned = tokio::process::Command::new(&self.program)
            .args(&args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("CORRAL_WORKER_ID", &id)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let Ok(mut child) = spawned else {
            return Outcome::Failed;
        };
        let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
            return Outcome::Unknown;
        };
        if self
            .write_record(worker, LocalRecord { pid, port })
            .is_err()
        {
            // Without a record a restarted controller could not find it: take it down again.
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Outcome::Failed;
        }
        let deadline = Instant::now() + self.ready_timeout;
        while Instant::now() < deadline {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Outcome::Done;
            }
            if let Ok(Some(_)) = child.try_wait() {
                let _ = std::fs::remove_file(LocalRecord::path(&self.state_dir, worker));
                return Outcome::Failed;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // It exists but never became ready: nobody can say it is usable; the pool deletes it.
        Outcome::Unknown
    }

    async fn delete(&self, worker: WorkerId) -> Outcome {
        let Some(record) = self.record(worker) else {
            return Outcome::Done;
        };
        let start = state_and_start(record.pid).map(|(_, start)| start);
        if let (true, Some(start)) = (is_worker_process(record.pid, worker), start) {
            let pid = nix::unistd::Pid::from_raw(record.pid);
            if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).is_err()
                && is_worker_process(record.pid, worker)
            {
                return Outcome::Failed;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while !ended(record.pid, start) {
                if Instant::now() > deadline {
                    return Outcome::Unknown;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        // Confirmed absent: only now does the record go.
        match std::fs::remove_file(LocalRecord::path(&self.state_dir, worker)) {
            Ok(()) => Outcome::Done,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Outcome::Done,
            Err(_) => Outcome::Unknown,
        }
    }

    async fn list(&self) -> Result<BTreeSet<WorkerId>, Unavailable> {
        let entries = std::fs::read_dir(&self.state_dir).map_err(|_| Unavailable)?;
        let mut present = BTreeSet::new();
        for entry in entries {
            let entry = entry.map_err(|_| Unavailable)?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".worker"))
                .and_then(WorkerId::parse)
            else {
                continue;
            };
            if self
                .record(id)
                .is_some_and(|r| is_worker_process(r.pid, id))
            {
                present.insert(id);
            } else {
                // Its process is gone (it crashed, or was killed): the record proves nothing more.
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(present)
    }
}
