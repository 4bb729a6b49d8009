//! The jail's egress relay (EGR-8): a listener the supervisor holds on 127.0.0.1:3128 inside the
//! jail's network namespace, which carries each connection to the egress proxy with the run's
//! grant added, so that the code never holds the credential.
//!
//! Per connection: one request head is read (at most [`HEAD_MAX_BYTES`], within
//! [`HEAD_TIMEOUT`]); without a grant, or without a usable `SANDBOX_EGRESS_PROXY_URL`, it is
//! answered 407 `grant_missing` and the proxy is never contacted. Otherwise only
//! `CONNECT host:port` or an absolute-form `http://` request is accepted; any
//! `Proxy-Authorization` the code sent is dropped and `Proxy-Authorization: Bearer <grant>` is
//! added; a plain-HTTP request gets `Connection: close` in place of its connection headers, so
//! that the proxy serves one request per connection and no later request rides on it without
//! being rewritten. The head and any bytes read after it go to the proxy, from the supervisor's
//! own network namespace, and bytes are then copied both ways until the connection ends.
//!
//! What it must never do: judge a target (the proxy and `corral_core::egress` do), or let the
//! grant reach anything the code can read. The grant lives only in this process's memory.
//!
//! Threads, not the control API's runtime: `corral jail run` has none, and a relay is small. One
//! thread accepts; each connection has one thread per direction; at most
//! [`CONNECTIONS_MAX`] connections at once. [`Relay::close`] (also on drop) shuts every socket
//! down, so every blocked call returns, and waits for the accepting thread, whose listener is
//! closed when it returns.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use corral_core::egress::grant::grant_is_sendable;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CloneFlags, setns};

use corral_stages::netlink;

/// Where the relay listens inside the jail; the code's proxy variables name it.
pub const LISTEN_PORT: u16 = 3128;
/// The proxy URL the code's environment carries.
pub const PROXY_URL: &str = "http://127.0.0.1:3128";
/// The longest request head read from the code.
pub const HEAD_MAX_BYTES: usize = 16 * 1024;
/// How long the code has to send its whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to the egress proxy may take.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most connections relayed at once per run; more are closed unanswered.
pub const CONNECTIONS_MAX: usize = 64;
/// After answering the code itself, how long the relay waits for the code to close, and how
/// much of what it still sends is read meanwhile.
const ANSWER_LINGER: Duration = Duration::from_secs(1);
/// See [`ANSWER_LINGER`].
const ANSWER_DRAIN_MAX_BYTES: usize = 64 * 1024;
/// Bytes copied per read.
const COPY_CHUNK_BYTES: usize = 16 * 1024;
/// Stack of each relay thread: they hold no large buffers on the stack.
const THREAD_STACK_BYTES: usize = 128 * 1024;

/// The egress proxy's address, from `SANDBOX_EGRESS_PROXY_URL` (`http://host:port`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyAddress {
    /// A name or an address (an IPv6 one without its brackets).
    pub host: String,
    /// The port.
    pub port: u16,
}

impl ProxyAddress {
    /// Parses `http://host:port` (a trailing `/` allowed). Anything else, user information or
    /// a path included, is refused with why.
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        let rest = url
            .get(..7)
            .filter(|scheme| scheme.eq_ignore_ascii_case("http://"))
            .map(|_| &url[7..])
            .ok_or("SANDBOX_EGRESS_PROXY_URL: expected http://host:port")?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '@', '?', '#']) || rest.chars().any(|c| c.is_whitespace()) {
            return Err("SANDBOX_EGRESS_PROXY_URL: expected http://host:port, nothing else".into());
        }
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or("SANDBOX_EGRESS_PROXY_URL: the port is missing")?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or("SANDBOX_EGRESS_PROXY_URL: the port is not a number from 1 to 65535")?;
        let host = match host.strip_prefix('[') {
            Some(inner) => inner
                .strip_suffix(']')
                .ok_or("SANDBOX_EGRESS_PROXY_URL: unclosed [")?,
            None if host.contains(':') => {
                return Err("SANDBOX_EGRESS_PROXY_URL: an IPv6 address needs brackets".into());
            }
            None => host,
        };
        if host.is_empty() {
            return Err("SANDBOX_EGRESS_PROXY_URL: the host is missing".into());
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }
}

/// One run's relay: the listener in the jail's network namespace and every connection it
/// carries. Closed by [`Relay::close`] or on drop.
pub struct Relay {
    shared: Arc<Shared>,
    /// Dropped (closed) to wake the accepting thread.
    stop: Option<UnixStream>,
    accepting: Option<JoinHandle<()>>,
}

/// What the accepting thread and the connections share with the owner.
struct Shared {
    upstream: Option<ProxyAddress>,
    /// A plain relay (the package broker's): bytes both ways, no head read, no grant.
    passthrough: bool,
    state: Mutex<State>,
}

struct State {
    /// `Bearer`'s token for this run; `None` until attached, or for a run without one.
    grant: Option<String>,
    stopped: bool,
    next_id: u64,
    /// Every open socket of every live connection (clones), so that closing reaches them all.
    connections: BTreeMap<u64, Vec<TcpStream>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A relay thread that panicked leaves consistent data: every update is one statement.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `socket` to connection `id`; `false` (and the socket dropped) once the relay is
    /// closing, so that nothing is registered after [`Relay::close`] has shut everything down.
    fn register(&self, id: u64, socket: &TcpStream) -> bool {
        let mut state = self.state();
        if state.stopped {
            return false;
        }
        let Ok(clone) = socket.try_clone() else {
            return false;
        };
        state.connections.entry(id).or_default().push(clone);
        true
    }

    fn forget(&self, id: u64) {
        self.state().connections.remove(&id);
    }
}

impl Relay {
    /// Binds 127.0.0.1:[`LISTEN_PORT`] in the network namespace of process `jail_pid` (bringing
    /// its loopback up first) and starts accepting. `upstream` is the egress proxy, `None` when
    /// none is configured (every connection is then refused).
    pub fn open(jail_pid: u32, upstream: Option<ProxyAddress>) -> Result<Self, String> {
        let path = format!("/proc/{jail_pid}/ns/net");
        let namespace = File::open(&path).map_err(|e| format!("relay: open {path}: {e}"))?;
        Self::open_in(&namespace, upstream, LISTEN_PORT, false)
    }

    /// A plain relay on 127.0.0.1:`port` in the network namespace of process `jail_pid` to
    /// `upstream`: the package broker's route (PKG-3), which never goes through the egress
    /// proxy, so that the proxy's loopback and private-address denials stay absolute. It is open
    /// only while a run's install runs; the broker checks the token in each request's path.
    pub fn open_plain(jail_pid: u32, upstream: ProxyAddress, port: u16) -> Result<Self, String> {
        let path = format!("/proc/{jail_pid}/ns/net");
        let namespace = File::open(&path).map_err(|e| format!("relay: open {path}: {e}"))?;
        Self::open_in(&namespace, Some(upstream), port, true)
    }

    /// [`Relay::open`] in the network namespace `namespace` (an open `ns/net` file).
    fn open_in(
        namespace: &File,
        upstream: Option<ProxyAddress>,
        port: u16,
        passthrough: bool,
    ) -> Result<Self, String> {
        let listener = bind_in_namespace(namespace, port)?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("relay listener: {e}"))?;
        let (stop, stopped) = UnixStream::pair().map_err(|e| format!("relay stop pair: {e}"))?;
        let shared = Arc::new(Shared {
            upstream,
            passthrough,
            state: Mutex::new(State {
                grant: None,
                stopped: false,
                next_id: 0,
                connections: BTreeMap::new(),
            }),
        });
        let for_thread = shared.clone();
        let accepting = std::thread::Builder::new()
            .name("corral-relay".to_owned())
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || accept_loop(&listener, &stopped, &for_thread))
            .map_err(|e| format!("relay thread: {e}"))?;
        Ok(Self {
            shared,
            stop: Some(stop),
            accepting: Some(accepting),
        })
    }

    /// Sets the run's grant (`None`: the run has none). Connections whose head is read from
    /// now on carry it. A grant that cannot travel in a header counts as none.
    pub fn attach_grant(&self, grant: Option<&str>) {
        let grant = grant.filter(|g| grant_is_sendable(g)).map(str::to_owned);
        self.shared.state().grant = grant;
    }

    /// Ends the relay: the listener closes and every connection is shut down, both ways.
    pub fn close(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        {
            let mut state = self.shared.state();
            state.stopped = true;
            state.grant = None;
            for socket in state.connections.values().flatten() {
                let _ = socket.shutdown(Shutdown::Both);
            }
            state.connections.clear();
        }
        drop(self.stop.take());
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shut();
    }
}

/// Binds the listener from a short-lived thread that joins the jail's network namespace (a
/// namespace is per thread, and the socket keeps the one it was made in).
pub(crate) fn bind_in_namespace(namespace: &File, port: u16) -> Result<TcpListener, String> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("corral-relay-bind".to_owned())
            .spawn_scoped(scope, || {
                setns(namespace.as_fd(), CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("relay: enter the jail's network namespace: {e}"))?;
                // The jail's stage 1 brings it up too, later; the listener needs it now.
                netlink::loopback_up().map_err(|e| format!("relay: {e}"))?;
                TcpListener::bind(("127.0.0.1", port))
                    .map_err(|e| format!("relay: bind 127.0.0.1:{port}: {e}"))
            })
            .map_err(|e| format!("relay: bind thread: {e}"))?
            .join()
            .map_err(|_| "relay: the bind thread panicked".to_owned())?
    })
}

/// Accepts until the stop side closes; each connection gets its thread, within the bound.
fn accept_loop(listener: &TcpListener, stopped: &UnixStream, shared: &Arc<Shared>) {
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(stopped.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
        if fds[1].any().unwrap_or(true) {
            return;
        }
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Out of descriptors, or the connection was reset before it was taken: the next one.
            Err(_) => continue,
        };
        let id = {
            let mut state = shared.state();
            if state.stopped {
                return;
            }
            if state.connections.len() >= CONNECTIONS_MAX {
                // Over the bound: closed unanswered (the code may retry once one ends).
                continue;
            }
            let id = state.next_id;
            state.next_id = state.next_id.wrapping_add(1);
            let Ok(clone) = client.try_clone() else {
                continue;
            };
            state.connections.insert(id, vec![clone]);
            id
        };
        let for_connection = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("corral-relay-conn".to_owned())
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || {
                relay_connection(id, client, &for_connection);
                for_connection.forget(id);
            });
        if spawned.is_err() {
            shared.forget(id);
        }
    }
}

/// Why a connection is answered by the relay itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// No grant, or no proxy address: 407 `grant_missing`.
    GrantMissing,
    /// Not a request the relay carries (or not HTTP/1.x): 400.
    Malformed,
    /// The head is longer than [`HEAD_MAX_BYTES`]: 431.
    TooLarge,
    /// The head did not arrive in time: 408.
    Timeout,
    /// The egress proxy could not be reached: 502.
    ProxyUnreachable,
}

impl Answer {
    /// The whole response. The reason codes are the egress proxy's where it has one for the
    /// same condition, so that code sees one vocabulary.
    fn response(self) -> String {
        let (status, reason, body) = match self {
            Answer::GrantMissing => (
                "407 Proxy Authentication Required",
                Some(corral_core::egress::Reason::GrantMissing.code()),
                "this run has no egress grant\n",
            ),
            Answer::Malformed => (
                "400 Bad Request",
                Some("request_malformed"),
                "the egress relay carries CONNECT host:port or an absolute http:// request\n",
            ),
            Answer::TooLarge => (
                "431 Request Header Fields Too Large",
                Some("request_header_too_large"),
                "the request head is too large\n",
            ),
            Answer::Timeout => (
                "408 Request Timeout",
                Some("request_header_timeout"),
                "the request head did not arrive in time\n",
            ),
            Answer::ProxyUnreachable => (
                "502 Bad Gateway",
                Some("proxy_unreachable"),
                "the egress proxy could not be reached\n",
            ),
        };
        let reason = reason
            .map(|code| format!("{}: {code}\r\n", corral_core::egress::reason::REASON_HEADER))
            .unwrap_or_default();
        format!(
            "HTTP/1.1 {status}\r\n{reason}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }
}

/// One connection, from its head to its end.
fn relay_connection(id: u64, mut client: TcpStream, shared: &Shared) {
    let _ = client.set_nonblocking(false);
    if shared.passthrough {
        let Some(upstream) = shared.upstream.clone() else {
            return;
        };
        let Some(server) = connect(&upstream) else {
            return answer_and_close(&mut client, Answer::ProxyUnreachable);
        };
        if !shared.register(id, &server) {
            return;
        }
        return splice(client, server);
    }
    let (head, rest) = match read_head(&mut client) {
        Ok(read) => read,
        Err(answer) => return answer_and_close(&mut client, answer),
    };
    let (grant, upstream) = {
        let state = shared.state();
        (state.grant.clone(), shared.upstream.clone())
    };
    let (Some(grant), Some(upstream)) = (grant, upstream) else {
        return answer_and_close(&mut client, Answer::GrantMissing);
    };
    let Some(rewritten) = rewrite_head(&head, &grant) else {
        return answer_and_close(&mut client, Answer::Malformed);
    };
    drop(grant);
    let Some(mut proxy) = connect(&upstream) else {
        return answer_and_close(&mut client, Answer::ProxyUnreachable);
    };
    if !shared.register(id, &proxy) {
        return;
    }
    if proxy
        .write_all(&rewritten)
        .and_then(|()| proxy.write_all(&rest))
        .is_err()
    {
        return;
    }
    drop(rewritten);
    splice(client, proxy);
}

/// Copies both ways until both directions end.
fn splice(client: TcpStream, proxy: TcpStream) {
    let (Ok(client_back), Ok(proxy_back)) = (client.try_clone(), proxy.try_clone()) else {
        return;
    };
    let back = std::thread::Builder::new()
        .name("corral-relay-back".to_owned())
        .stack_size(THREAD_STACK_BYTES)
        .spawn(move || copy(proxy_back, client_back));
    copy(client, proxy);
    if let Ok(back) = back {
        let _ = back.join();
    }
}

/// Copies `from` to `to` until `from` ends, then passes the end on (a half close); an error
/// either way ends the connection both ways.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buffer = vec![0u8; COPY_CHUNK_BYTES];
    loop {
        match from.read(&mut buffer) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Answers the code and closes. What the code sent after its head (a body) is read and dropped,
/// within bounds, first: closing with it unread would reset the connection, and the code could
/// lose the answer.
fn answer_and_close(client: &mut TcpStream, answer: Answer) {
    let _ = client.set_write_timeout(Some(HEAD_TIMEOUT));
    let _ = client.write_all(answer.response().as_bytes());
    let _ = client.shutdown(Shutdown::Write);
    let deadline = Instant::now() + ANSWER_LINGER;
    let mut sink = [0u8; 4096];
    let mut left = ANSWER_DRAIN_MAX_BYTES;
    while left > 0 {
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() || client.set_read_timeout(Some(wait)).is_err() {
            break;
        }
        match client.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// Reads one request head (through its blank line) within the time and size bounds; returns it
/// and whatever was read after it.
fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), Answer> {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Answer::Timeout);
        }
        client
            .set_read_timeout(Some(left))
            .map_err(|_| Answer::Malformed)?;
        let n = match client.read(&mut chunk) {
            Ok(0) => return Err(Answer::Malformed),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Answer::Timeout);
            }
            Err(_) => return Err(Answer::Malformed),
        };
        // Only the new bytes and the three before them can complete the blank line.
        let from = buffer.len().saturating_sub(3);
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(at) = find(&buffer[from..], b"\r\n\r\n") {
            let end = from + at + 4;
            if end > HEAD_MAX_BYTES {
                return Err(Answer::TooLarge);
            }
            let rest = buffer.split_off(end);
            let _ = client.set_read_timeout(None);
            return Ok((buffer, rest));
        }
        if buffer.len() >= HEAD_MAX_BYTES {
            return Err(Answer::TooLarge);
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The head the proxy gets: the request line as sent, the code's header fields without any
/// `Proxy-Authorization` (and, for plain HTTP, without its connection headers), then the
/// grant (and `Connection: close`). `None` for a head the relay does not carry.
fn rewrite_head(head: &[u8], grant: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let text = text.strip_suffix("\r\n\r\n")?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next()?;
    let mut parts = request_line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        return None;
    }
    let tunnel = method == "CONNECT";
    let accepted = if tunnel {
        // authority-form: host:port, nothing the proxy could read as a path or a scheme.
        !target.is_empty() && target.contains(':') && !target.contains(['/', '@'])
    } else {
        method.bytes().all(|b| b.is_ascii_uppercase())
            && !method.is_empty()
            && target
                .get(..7)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
    };
    if !accepted {
        return None;
    }
    let mut out = String::with_capacity(head.len() + grant.len() + 64);
    out.push_str(request_line);
    out.push_str("\r\n");
    for line in lines {
        // No obsolete folding and no bare CR: a line the proxy might read differently.
        if line.starts_with([' ', '\t']) || line.contains('\r') || line.contains('\n') {
            return None;
        }
        // A name with space before its colon is refused, not trimmed: readers disagree on it.
        let (name, _) = line.split_once(':')?;
        if name.is_empty() || name.contains([' ', '\t']) {
            return None;
        }
        let dropped = name.eq_ignore_ascii_case("proxy-authorization")
            || (!tunnel
                && ["connection", "proxy-connection", "keep-alive"]
                    .iter()
                    .any(|hop| name.eq_ignore_ascii_case(hop)));
        if !dropped {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    if !tunnel {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("Proxy-Authorization: Bearer ");
    out.push_str(grant);
    out.push_str("\r\n\r\n");
    Some(out.into_bytes())
}

/// Connects to the egress proxy from this (the supervisor's) network namespace.
fn connect(upstream: &ProxyAddress) -> Option<TcpStream> {
    let addresses = (upstream.host.as_str(), upstream.port)
        .to_socket_addrs()
        .ok()?;
    // A name with many addresses is tried in order, each within the timeout; bounded.
    addresses
        .take(8)
        .find_map(|address| TcpStream::connect_timeout(&address, UPSTREAM_CONNECT_TIMEOUT).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new network namespace (its `ns/net` file), made by a thread that ends at once; `None`,
    /// after skipping the test through `corral_testkit::skip`, where this process may not make
    /// one (not root).
    fn new_namespace(test: &str) -> Option<File> {
        let made = std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string())?;
            File::open("/proc/thread-self/ns/net").map_err(|e| e.to_string())
        })
        .join()
        .unwrap();
        match made {
            Ok(namespace) => Some(namespace),
            Err(why) => {
                corral_testkit::skip(
                    test,
                    corral_testkit::Need::Netns,
                    &format!("unshare(CLONE_NEWNET): {why}"),
                );
                None
            }
        }
    }

    /// A connection to the relay, made from inside `namespace` (as the code's would be).
    fn connect_inside(namespace: &File) -> io::Result<TcpStream> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    setns(namespace.as_fd(), CloneFlags::CLONE_NEWNET)?;
                    TcpStream::connect(("127.0.0.1", LISTEN_PORT))
                })
                .join()
                .unwrap()
        })
    }

    /// A stand-in for the egress proxy on the host's loopback: answers one `CONNECT` with 200,
    /// then echoes until its peer ends, then reports the end on the returned channel.
    fn echoing_proxy() -> (ProxyAddress, std::sync::mpsc::Receiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (ended, ends) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap() == 1 {
                head.push(byte[0]);
            }
            stream
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .unwrap();
            let mut chunk = [0u8; 1024];
            while let Ok(n @ 1..) = stream.read(&mut chunk) {
                if stream.write_all(&chunk[..n]).is_err() {
                    break;
                }
            }
            let _ = ended.send(head);
        });
        let address = ProxyAddress {
            host: "127.0.0.1".to_owned(),
            port,
        };
        (address, ends)
    }

    /// Whether the relay ended `stream`: its next read is the end, or a reset (the relay closed
    /// with bytes of it unread); not a timeout.
    fn ended(stream: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
        }
    }

    /// Reads until `n` bytes or the end.
    fn read_exactly(stream: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut data = vec![0u8; n];
        let mut at = 0;
        while at < n {
            match stream.read(&mut data[at..]) {
                Ok(0) | Err(_) => break,
                Ok(read) => at += read,
            }
        }
        data.truncate(at);
        data
    }

    #[test]
    fn egr_08_closing_the_relay_ends_its_connections_and_its_listener() {
        let Some(namespace) =
            new_namespace("egr_08_closing_the_relay_ends_its_connections_and_its_listener")
        else {
            return;
        };
        let (proxy, ends) = echoing_proxy();
        let relay = Relay::open_in(&namespace, Some(proxy), LISTEN_PORT, false).unwrap();
        relay.attach_grant(Some("unit-grant"));
        let mut client = connect_inside(&namespace).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        client
            .write_all(b"CONNECT example.test:443 HTTP/1.1\r\n\r\nping")
            .unwrap();
        let answer = b"HTTP/1.1 200 Connection established\r\n\r\nping";
        assert_eq!(read_exactly(&mut client, answer.len()), answer);
        relay.close();
        // The code's end is closed, the proxy's end too, and nothing listens any more.
        assert!(ended(&mut client));
        let head = ends.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(
            head,
            b"CONNECT example.test:443 HTTP/1.1\r\nProxy-Authorization: Bearer unit-grant\r\n\r\n"
        );
        let refused = connect_inside(&namespace).unwrap_err();
        assert_eq!(
            refused.kind(),
            io::ErrorKind::ConnectionRefused,
            "{refused}"
        );
    }

    #[test]
    fn egr_08_connections_over_the_bound_are_closed_unanswered() {
        let Some(namespace) =
            new_namespace("egr_08_connections_over_the_bound_are_closed_unanswered")
        else {
            return;
        };
        // No grant: a connection that sent its head would be answered 407.
        let relay = Relay::open_in(&namespace, None, LISTEN_PORT, false).unwrap();
        let idle: Vec<TcpStream> = (0..CONNECTIONS_MAX)
            .map(|_| connect_inside(&namespace).unwrap())
            .collect();
        let mut over = connect_inside(&namespace).unwrap();
        over.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        over.write_all(b"CONNECT example.test:443 HTTP/1.1\r\n\r\n")
            .unwrap();
        // Accepted in order, after the first CONNECTIONS_MAX: closed without an answer.
        assert!(ended(&mut over));
        // One of the first is still served.
        let mut first = idle.into_iter().next().unwrap();
        first
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        first
            .write_all(b"CONNECT example.test:443 HTTP/1.1\r\n\r\n")
            .unwrap();
        let answer = read_exactly(&mut first, 12);
        assert_eq!(answer, b"HTTP/1.1 407");
        relay.close();
    }

    fn rewritten(head: &str) -> Option<String> {
        rewrite_head(head.as_bytes(), "GRANT").map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn egr_08_plain_http_gets_the_grant_and_one_request_per_connection() {
        let out = rewritten(
            "GET http://example.test/a HTTP/1.1\r\nHost: example.test\r\nProxy-Authorization: Bearer forged\r\nconnection: keep-alive\r\nProxy-Connection: keep-alive\r\nKeep-Alive: 5\r\nproxy-authorization: Basic x\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            out,
            "GET http://example.test/a HTTP/1.1\r\nHost: example.test\r\nAccept: */*\r\nConnection: close\r\nProxy-Authorization: Bearer GRANT\r\n\r\n"
        );
    }

    #[test]
    fn egr_08_connect_keeps_its_headers_but_not_a_forged_grant() {
        let out = rewritten(
            "CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\nPROXY-AUTHORIZATION: Bearer forged\r\nConnection: keep-alive\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            out,
            "CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\nConnection: keep-alive\r\nProxy-Authorization: Bearer GRANT\r\n\r\n"
        );
    }

    #[test]
    fn egr_08_anything_else_is_not_carried() {
        for head in [
            "GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET https://example.test/ HTTP/1.1\r\n\r\n",
            "CONNECT example.test HTTP/1.1\r\n\r\n",
            "CONNECT http://example.test:443 HTTP/1.1\r\n\r\n",
            "GET http://example.test/ HTTP/2\r\n\r\n",
            "GET http://example.test/  HTTP/1.1\r\n\r\n",
            "GET http://example.test/ HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            "GET http://example.test/ HTTP/1.1\r\nno colon\r\n\r\n",
            "GET http://example.test/ HTTP/1.1\r\nName : x\r\n\r\n",
            "get http://example.test/ HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(rewritten(head), None, "{head:?}");
        }
    }

    #[test]
    fn egr_08_the_refusal_without_a_grant_names_the_core_reason() {
        let response = Answer::GrantMissing.response();
        assert!(response.starts_with("HTTP/1.1 407 Proxy Authentication Required\r\n"));
        assert!(response.contains("\r\nX-Corral-Egress-Reason: grant_missing\r\n"));
        assert!(response.contains("\r\nConnection: close\r\n"));
    }

    #[test]
    fn egr_08_an_unreachable_proxy_is_refused_with_a_stable_reason() {
        // Without a reason, code told 502 could not tell it from an upstream's own 502 (the
        // chaos run's checker holds every refusal to a stable code).
        let response = Answer::ProxyUnreachable.response();
        assert!(response.starts_with("HTTP/1.1 502 Bad Gateway\r\n"));
        assert!(response.contains("\r\nX-Corral-Egress-Reason: proxy_unreachable\r\n"));
    }

    #[test]
    fn egr_05_the_proxy_address_is_http_host_port() {
        assert_eq!(
            ProxyAddress::parse("http://egress:3128/"),
            Ok(ProxyAddress {
                host: "egress".to_owned(),
                port: 3128
            })
        );
        assert_eq!(
            ProxyAddress::parse("HTTP://[::1]:8080"),
            Ok(ProxyAddress {
                host: "::1".to_owned(),
                port: 8080
            })
        );
        for bad in [
            "",
            "egress:3128",
            "https://egress:3128",
            "http://egress",
            "http://egress:0",
            "http://user:pw@egress:3128",
            "http://egress:3128/path",
            "http://::1:3128",
            "http://:3128",
        ] {
            assert!(ProxyAddress::parse(bad).is_err(), "{bad:?}");
        }
    }
}
