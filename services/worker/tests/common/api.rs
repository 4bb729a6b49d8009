//! The control API's server for the end-to-end tests: a real `corral-worker serve` on
//! 127.0.0.1 and a small HTTP/1.1 client over `TcpStream`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

pub const TOKEN: &str = "test-credential-0123456789abcdef";
/// How long a client waits for a response before the test fails (a hung server, not a timing).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// A running server, killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Server {
    pub fn start(env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_corral-worker"));
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("CORRAL_WORKER_TOKEN_FILE")
            .env("CORRAL_WORKER_TOKEN", TOKEN)
            // A prepared jail stays as its reset left it unless a test asks for the idle
            // re-preparation with the stack (decision 0037).
            .env("CORRAL_WORKER_PREIMPORT_IDLE_SECONDS", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        // The server prints one line once it listens: no guessing when it is ready.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Self { child, addr }
    }

    /// One request on a fresh connection; the status and the JSON body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &[u8],
    ) -> (u16, Value) {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: worker\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(token) = token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = TcpStream::connect(self.addr).unwrap();
        stream.set_read_timeout(Some(RESPONSE_TIMEOUT)).unwrap();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        read_response(&mut stream)
    }

    /// Executes `body`, with an operation token when it names none (the contract requires one).
    pub fn execute(&self, body: &Value) -> (u16, Value) {
        let mut body = body.clone();
        if body.get("token").is_none() {
            body["token"] = Value::from(1);
        }
        self.request(
            "POST",
            "/v1/execute",
            Some(TOKEN),
            body.to_string().as_bytes(),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its prepared jails die with it (the parent-death signal), but they are reparented to
        // the host's init, which reaps them when it gets to it: wait until none of this server's
        // jail processes is left, zombies included, so that the next test's search of the host
        // does not find them. Checked until a deadline only a hung kernel reaches.
        let deadline = std::time::Instant::now() + RESPONSE_TIMEOUT;
        while !self.jail_processes().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Server {
    /// The processes of this server's jails: those whose uids are in its range (the supervisor
    /// derives 64 uid pairs from its pid).
    pub fn jail_processes(&self) -> Vec<i32> {
        let first = super::JAIL_UID_BASE.saturating_add(self.child.id().saturating_mul(128));
        let range = first..first.saturating_add(128);
        super::processes_with_uid(|id| range.contains(&id))
    }
}

/// Reads a whole `Connection: close` response: the status and the body as JSON.
pub fn read_response(stream: &mut TcpStream) -> (u16, Value) {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete response");
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let json = serde_json::from_str(body).unwrap_or(Value::String(body.to_owned()));
    (status, json)
}

/// Waits until the worker has prepared its next jail: `/health` says so. A check of its state,
/// repeated until a deadline that only a hung server reaches.
pub fn wait_prepared(server: &Server) {
    let deadline = std::time::Instant::now() + RESPONSE_TIMEOUT;
    while std::time::Instant::now() < deadline {
        let (_, health) = server.request("GET", "/health", Some(TOKEN), b"");
        if health["prepared"] == true {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the worker never prepared a jail");
}

/// Waits until `/health` says prepared jails wait for exactly `languages`, in that order. A check
/// of its state, repeated until a deadline that only a hung server reaches.
pub fn wait_prepared_languages(server: &Server, languages: &[&str]) -> Value {
    let deadline = std::time::Instant::now() + RESPONSE_TIMEOUT;
    let mut health = Value::Null;
    while std::time::Instant::now() < deadline {
        health = server.request("GET", "/health", Some(TOKEN), b"").1;
        if health["prepared_languages"] == serde_json::json!(languages) {
            return health;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the worker never prepared jails for {languages:?}: {health}");
}
