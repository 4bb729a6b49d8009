//! The jail's tool relay (KER-5, decision 0018): a listener the supervisor holds on
//! 127.0.0.1:[`JAIL_TOOLS_PORT`] inside the jail's network namespace while a run that was given
//! tools runs. The code's library (`corral_tools`, written beside the code) speaks a small HTTP
//! to it: `GET /tools` names the callable tools, `POST /call` with `{"tool", "arguments"}` calls
//! one. The relay judges the call (corral-core's rule: advertised, read-only, not `run_code`),
//! adds the capability and the run's token, which only this process holds, forwards it to the
//! API replica that owns the run, and answers with the bounded payload. The code never holds the
//! capability, the token or the API's address.
//!
//! Threads, as the egress relay: one accepts, each call has its own, at most
//! [`CALLS_MAX`] at once; every read and the forward are bounded in time and size.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use corral_contract::messages::{ToolCall, ToolOrder};
use corral_core::tools::{
    CALL_MAX_BYTES, CALL_TIMEOUT_MS, CallRefusal, JAIL_TOOLS_PORT, PAYLOAD_MAX_BYTES,
};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde_json::{Value, json};

use crate::relay::{ProxyAddress, bind_in_namespace};

/// The most calls in flight at once.
pub const CALLS_MAX: usize = 8;
/// How long the code has to send its whole call.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to the API may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request or response head.
const HEAD_MAX_BYTES: usize = 16 * 1024;
/// What the API's answer adds around a result of at most `PAYLOAD_MAX_BYTES`.
const ENVELOPE_BYTES: usize = 1024;

/// The Python library the code imports (`import corral_tools`).
pub const PYTHON_LIBRARY: &str = include_str!("tools/corral_tools.py");
/// The Node library the code requires (`require('./corral_tools')`).
pub const NODE_LIBRARY: &str = include_str!("tools/corral_tools.js");

struct Shared {
    order: ToolOrder,
    api: Option<ProxyAddress>,
    calls: Mutex<Vec<TcpStream>>,
}

/// A running tool relay; closed (every call shut down) on drop.
pub struct ToolRelay {
    shared: Arc<Shared>,
    stop: Option<UnixStream>,
    accepting: Option<JoinHandle<()>>,
}

impl ToolRelay {
    /// Binds the relay in the network namespace of process `jail_pid` for `order`.
    ///
    /// # Errors
    /// The namespace cannot be entered or the port bound.
    pub fn open(jail_pid: u32, order: ToolOrder) -> Result<Self, String> {
        let path = format!("/proc/{jail_pid}/ns/net");
        let namespace = File::open(&path).map_err(|e| format!("tools: open {path}: {e}"))?;
        let listener = bind_in_namespace(&namespace, JAIL_TOOLS_PORT)?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("tools listener: {e}"))?;
        let api = order
            .callback
            .strip_prefix("http://")
            .and_then(|rest| ProxyAddress::parse(&format!("http://{rest}")).ok());
        let shared = Arc::new(Shared {
            order,
            api,
            calls: Mutex::new(Vec::new()),
        });
        let (stop, stopped) = UnixStream::pair().map_err(|e| format!("tools stop pair: {e}"))?;
        let for_thread = shared.clone();
        let accepting = std::thread::Builder::new()
            .name("corral-tools".to_owned())
            .stack_size(256 * 1024)
            .spawn(move || accept_loop(&listener, &stopped, &for_thread))
            .map_err(|e| format!("tools thread: {e}"))?;
        Ok(Self {
            shared,
            stop: Some(stop),
            accepting: Some(accepting),
        })
    }
}

impl Drop for ToolRelay {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
        let calls = self
            .shared
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for call in calls.iter() {
            let _ = call.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: &TcpListener, stopped: &UnixStream, shared: &Arc<Shared>) {
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(stopped.as_fd(), PollFlags::POLLIN),
        ];
        if poll(&mut fds, PollTimeout::NONE).is_err() {
            return;
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return;
        }
        let Ok((client, _)) = listener.accept() else {
            continue;
        };
        let _ = client.set_nonblocking(false);
        {
            let mut calls = shared.calls.lock().unwrap_or_else(PoisonError::into_inner);
            calls.retain(|c| c.peer_addr().is_ok());
            if calls.len() >= CALLS_MAX {
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
            if let Ok(copy) = client.try_clone() {
                calls.push(copy);
            }
        }
        let shared = shared.clone();
        let _ = std::thread::Builder::new()
            .name("corral-tool-call".to_owned())
            .stack_size(256 * 1024)
            .spawn(move || serve(client, &shared));
    }
}

/// Answers one request of the code.
fn serve(mut client: TcpStream, shared: &Shared) {
    let _ = client.set_read_timeout(Some(READ_TIMEOUT));
    let (status, body) = match read_request(&mut client) {
        Ok((method, path, body)) => route(shared, &method, &path, &body),
        Err(()) => refusal(
            CallRefusal::Malformed,
            "the call is not a bounded HTTP request",
        ),
    };
    let text = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        if status == 200 { "OK" } else { "Refused" },
        text.len()
    );
    let _ = client.write_all(head.as_bytes());
    let _ = client.write_all(text.as_bytes());
    let _ = client.shutdown(Shutdown::Both);
}

fn refusal(refusal: CallRefusal, message: &str) -> (u16, Value) {
    let status = match refusal {
        CallRefusal::NotGranted | CallRefusal::Write | CallRefusal::Recursive => 403,
        CallRefusal::Malformed => 400,
        CallRefusal::PayloadTooLarge | CallRefusal::Unavailable => 502,
    };
    (
        status,
        json!({ "error": { "code": refusal.code(), "message": message } }),
    )
}

fn route(shared: &Shared, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let grant = &shared.order.grant;
    match (method, path) {
        ("GET", "/tools") => (200, json!({ "tools": grant.callable() })),
        ("POST", "/call") => {
            let Ok(call) = serde_json::from_slice::<Value>(body) else {
                return refusal(CallRefusal::Malformed, "the call is not JSON");
            };
            let Some(tool) = call["tool"].as_str() else {
                return refusal(CallRefusal::Malformed, "the call names no tool");
            };
            if let Err(refused) = grant.judge(tool) {
                let message = match refused {
                    CallRefusal::Write => "that tool writes; code may call read-only tools only",
                    CallRefusal::Recursive => "code may not run code through a tool",
                    _ => "this run was given no such tool",
                };
                return refusal(refused, message);
            }
            forward(
                shared,
                tool,
                call.get("arguments").cloned().unwrap_or(Value::Null),
            )
        }
        _ => refusal(CallRefusal::Malformed, "GET /tools or POST /call"),
    }
}

/// Forwards one judged call to the API replica that owns the run.
fn forward(shared: &Shared, tool: &str, arguments: Value) -> (u16, Value) {
    let Some(api) = &shared.api else {
        return refusal(
            CallRefusal::Unavailable,
            "the run's API replica is not reachable",
        );
    };
    let call = ToolCall {
        tool: tool.to_owned(),
        arguments,
        capability: shared.order.grant.capability.clone(),
    };
    let body = serde_json::to_vec(&call).unwrap_or_default();
    let answer = (|| -> Result<(u16, Vec<u8>), String> {
        let address = (api.host.as_str(), api.port)
            .to_socket_addrs()
            .map_err(|e| e.to_string())?
            .next()
            .ok_or("no address")?;
        let mut stream =
            TcpStream::connect_timeout(&address, CONNECT_TIMEOUT).map_err(|e| e.to_string())?;
        let timeout = Duration::from_millis(CALL_TIMEOUT_MS);
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            corral_contract::routes::TOOL_CALL,
            api.host,
            api.port,
            shared.order.token,
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(&body))
            .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        stream
            .take((PAYLOAD_MAX_BYTES + ENVELOPE_BYTES + HEAD_MAX_BYTES + 1) as u64)
            .read_to_end(&mut raw)
            .map_err(|e| e.to_string())?;
        parse_response(&raw)
    })();
    match answer {
        // The API bounds the tool's result; the envelope around it adds the tool's name.
        Ok((status, payload)) if payload.len() > PAYLOAD_MAX_BYTES + ENVELOPE_BYTES => (
            status.max(502),
            refusal(CallRefusal::PayloadTooLarge, "the tool's answer is over the payload bound").1,
        ),
        Ok((status, payload)) => (
            status,
            serde_json::from_slice(&payload).unwrap_or_else(|_| {
                json!({ "error": { "code": CallRefusal::Unavailable.code(), "message": "the API's answer is not JSON" } })
            }),
        ),
        Err(_) => refusal(
            CallRefusal::Unavailable,
            "the run's API replica did not answer the call",
        ),
    }
}

/// The status and body of a `Connection: close` response (chunked or not).
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = find(raw, b"\r\n\r\n").ok_or("no response head")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    let body = &raw[end + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, body.to_vec()));
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let line_end = find(rest, b"\r\n").ok_or("a truncated chunk")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| e.to_string())?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok((status, out));
        }
        if rest.len() < size {
            return Err("a truncated chunk".into());
        }
        out.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
}

/// Reads one request of the code: its method, path and body, each bounded.
fn read_request(client: &mut TcpStream) -> Result<(String, String, Vec<u8>), ()> {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(end) = find(&raw, b"\r\n\r\n") {
            break end;
        }
        if raw.len() > HEAD_MAX_BYTES {
            return Err(());
        }
        let n = client.read(&mut chunk).map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        raw.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut words = head.split_whitespace();
    let (method, path) = (
        words.next().unwrap_or_default().to_owned(),
        words.next().unwrap_or_default().to_owned(),
    );
    let header = |wanted: &str| {
        head.lines().skip(1).find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case(wanted)
                .then(|| value.trim().to_owned())
        })
    };
    // A body is sent with its length; a chunked one, or a length that is not a number, is
    // refused rather than read as empty.
    if header("transfer-encoding").is_some() {
        return Err(());
    }
    let length: usize = match header("content-length") {
        None => 0,
        Some(text) => text.parse().map_err(|_| ())?,
    };
    if length > CALL_MAX_BYTES {
        return Err(());
    }
    let mut body = raw[end + 4..].to_vec();
    while body.len() < length {
        let n = client.read(&mut chunk).map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok((method, path, body))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_read_plain_or_chunked() {
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap(),
            (200, b"{}".to_vec())
        );
        assert_eq!(
            parse_response(
                b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            )
            .unwrap(),
            (403, b"abcde".to_vec())
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
