//! `corral up`'s TURN server (BROW-9): Debian's coturn on loopback, with a shared secret
//! generated into the state directory, so that the live view works on one machine. Started only
//! when the operator names no `CORRAL_TURN_URL`.
//!
//! Its configuration file (mode 0600, beside the secret) admits only the TURN REST credential
//! (`use-auth-secret`), no TLS, DTLS or CLI, and relays on loopback between loopback peers (the
//! worker's and the viewers' allocations are both on this machine). It is ready once it answers a
//! STUN Binding request, and it is stopped with everything else `corral up` started.

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_core::browser::turn::{binding_request, is_binding_success, loopback_config};

use crate::stack::secret_file;

/// Where coturn's server is looked for, after `PATH`.
const TURNSERVER: &str = "/usr/bin/turnserver";
/// How long coturn may take to answer its first Binding request.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running coturn.
pub struct TurnServer {
    child: Child,
    /// `turn:127.0.0.1:PORT`.
    pub url: String,
    /// The file holding the shared secret.
    pub secret_file: PathBuf,
}

impl TurnServer {
    /// The coturn binary, when this machine has one.
    #[must_use]
    pub fn program() -> Option<PathBuf> {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
            .map(|dir| dir.join("turnserver"))
            .chain([PathBuf::from(TURNSERVER)])
            .find(|candidate| candidate.is_file())
    }

    /// Starts coturn with its files in `state_dir` and waits until it answers.
    ///
    /// # Errors
    /// No coturn, no free port, a file that cannot be written, or a server that does not answer.
    pub fn start(state_dir: &Path) -> Result<TurnServer, String> {
        let program = Self::program()
            .ok_or("coturn's turnserver is not installed (scripts/setup-services installs it)")?;
        let secret_path = state_dir.join("turn-secret");
        let secret = secret_file(&secret_path)?;
        let port = free_udp_and_tcp_port()?;
        let config_path = state_dir.join("turnserver.conf");
        let config = loopback_config(
            port,
            &secret,
            &state_dir.join("turnserver.pid").display().to_string(),
        );
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&config_path)
            .map_err(|e| format!("{}: {e}", config_path.display()))?;
        std::io::Write::write_all(&mut file, config.as_bytes())
            .map_err(|e| format!("{}: {e}", config_path.display()))?;
        let log = std::fs::File::create(state_dir.join("turnserver.log"))
            .map_err(|e| format!("turnserver.log: {e}"))?;
        let child = Command::new(&program)
            .arg("-c")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start {}: {e}", program.display()))?;
        let mut server = TurnServer {
            child,
            url: format!("turn:127.0.0.1:{port}"),
            secret_file: secret_path,
        };
        server.wait_ready(SocketAddr::from(([127, 0, 0, 1], port)))?;
        Ok(server)
    }

    fn wait_ready(&mut self, addr: SocketAddr) -> Result<(), String> {
        let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        let transaction = *b"corral-ready";
        let request = binding_request(transaction);
        let began = Instant::now();
        let mut reply = [0u8; 576];
        while began.elapsed() < READY_TIMEOUT {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "coturn exited at start ({status}); see turnserver.log"
                ));
            }
            let _ = socket.send_to(&request, addr);
            if let Ok((n, from)) = socket.recv_from(&mut reply)
                && from == addr
                && is_binding_success(&reply[..n], &transaction)
            {
                return Ok(());
            }
        }
        Err(format!(
            "coturn did not answer on {addr} within {} s; see turnserver.log",
            READY_TIMEOUT.as_secs()
        ))
    }
}

impl Drop for TurnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port free for both UDP and TCP (TURN listens on both).
fn free_udp_and_tcp_port() -> Result<u16, String> {
    for _ in 0..32 {
        let udp = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
        let port = udp.local_addr().map_err(|e| e.to_string())?.port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no loopback port free for both UDP and TCP".to_owned())
}
