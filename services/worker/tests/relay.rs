//! The jail's egress relay end to end (EGR-8): a real `corral-worker serve` whose
//! `SANDBOX_EGRESS_PROXY_URL` names a fake egress proxy on the host, which records every request
//! head it gets and answers. Code in the jail reaches it only through 127.0.0.1:3128, the relay's
//! listener in the jail's network namespace. Each behaviour is checked in the prepared jail (the
//! first execute after the worker prepared one) and in a cold one (the next execute, without a
//! reset). The runs need root and a full jail; without them the tests skip through
//! `corral_testkit::skip`, which fails them under `CORRAL_REQUIRE_ROOT` and `CORRAL_REQUIRE_JAIL`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};

use common::api::{RESPONSE_TIMEOUT, Server, TOKEN, wait_prepared};
use common::serial;
use serde_json::{Value, json};

/// What the fake proxy answers a plain-HTTP request with.
const FAKE_BODY: &str = "hello from the fake proxy";
/// The request line of the connection that proves every earlier one was counted.
const SENTINEL: &str = "SENTINEL / HTTP/1.1";

/// Whether this test can run: root, and a full jail on this machine. Without them it skips
/// through `corral_testkit::skip` (which fails it under `CORRAL_REQUIRE_ROOT` or
/// `CORRAL_REQUIRE_JAIL`) and must return.
fn can_run(test: &str) -> bool {
    if !common::root_or_skip(test) {
        return false;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_corral-jail"))
        .arg("probe")
        .output()
        .expect("corral-jail probe runs");
    let probe: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    if probe["posture"] == "full" {
        return true;
    }
    corral_testkit::skip(
        test,
        corral_testkit::Need::Jail,
        &format!("no full jail here: {probe}"),
    );
    false
}

/// What the fake proxy has seen: connections accepted, and each request head (lines, without
/// the blank one) in arrival order.
#[derive(Default)]
struct Seen {
    connections: usize,
    heads: Vec<Vec<String>>,
    /// Where each connection came from, for failure messages.
    peers: Vec<SocketAddr>,
    /// Sentinel connections made so far.
    sentinels_sent: usize,
}

/// A fake egress proxy on the host's 127.0.0.1: records each request head, then answers a
/// `CONNECT` with 200 and echoes every byte after it, and anything else with [`FAKE_BODY`].
struct FakeProxy {
    addr: SocketAddr,
    seen: Arc<(Mutex<Seen>, Condvar)>,
}

impl FakeProxy {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new((Mutex::new(Seen::default()), Condvar::new()));
        let for_thread = seen.clone();
        // Accepts in order, counting each connection before it is handled, for as long as the
        // test process lives.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                {
                    let mut seen = for_thread.0.lock().unwrap();
                    seen.connections += 1;
                    seen.peers.extend(stream.peer_addr());
                }
                let seen = for_thread.clone();
                std::thread::spawn(move || handle(stream, &seen));
            }
        });
        Self { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The heads whose request line is `line`.
    fn heads_with(&self, line: &str) -> Vec<Vec<String>> {
        let seen = self.seen.0.lock().unwrap();
        seen.heads
            .iter()
            .filter(|head| head.first().map(String::as_str) == Some(line))
            .cloned()
            .collect()
    }

    /// Every request head the fake has read but the sentinels', and where every connection
    /// came from, for failure messages.
    fn other_heads(&self) -> String {
        let seen = self.seen.0.lock().unwrap();
        let heads: Vec<&Vec<String>> = seen
            .heads
            .iter()
            .filter(|head| head.first().map(String::as_str) != Some(SENTINEL))
            .collect();
        format!("heads {heads:?} from {:?}", seen.peers)
    }

    /// How many connections came before a sentinel connection made now: the fake accepts in
    /// order, so once this sentinel's head is recorded every earlier connection has been counted.
    /// (Waiting for *a* sentinel would be satisfied by an earlier call's, with this one accepted
    /// and counted but its head not yet read.)
    fn connections_so_far(&self) -> usize {
        let (lock, recorded) = &*self.seen;
        let sent = {
            let mut seen = lock.lock().unwrap();
            seen.sentinels_sent += 1;
            seen.sentinels_sent
        };
        let mut sentinel = TcpStream::connect(self.addr).unwrap();
        sentinel
            .write_all(format!("{SENTINEL}\r\n\r\n").as_bytes())
            .unwrap();
        let seen = lock.lock().unwrap();
        let (seen, timeout) = recorded
            .wait_timeout_while(seen, RESPONSE_TIMEOUT, |seen| {
                seen.heads.iter().filter(|h| h[0] == SENTINEL).count() < sent
            })
            .unwrap();
        assert!(
            !timeout.timed_out(),
            "the fake proxy never saw the sentinel"
        );
        let sentinels = seen.heads.iter().filter(|h| h[0] == SENTINEL).count();
        seen.connections - sentinels
    }
}

/// One connection to the fake proxy.
fn handle(mut stream: TcpStream, seen: &(Mutex<Seen>, Condvar)) {
    stream.set_read_timeout(Some(RESPONSE_TIMEOUT)).unwrap();
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    };
    let head: Vec<String> = String::from_utf8_lossy(&buffer[..end])
        .split("\r\n")
        .map(str::to_owned)
        .collect();
    let rest = buffer[end + 4..].to_vec();
    let tunnel = head[0].starts_with("CONNECT ");
    let sentinel = head[0] == SENTINEL;
    {
        let (lock, recorded) = seen;
        lock.lock().unwrap().heads.push(head);
        recorded.notify_all();
    }
    if sentinel {
        return;
    }
    if tunnel {
        stream
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .unwrap();
        stream.write_all(&rest).unwrap();
        loop {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if stream.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                }
            }
        }
    }
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{FAKE_BODY}",
        FAKE_BODY.len()
    );
}

/// The values of header `name` (any letter case) in `head`, as whole lines.
fn header_lines<'a>(head: &'a [String], name: &str) -> Vec<&'a str> {
    head.iter()
        .skip(1)
        .filter(|line| {
            line.split_once(':')
                .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        })
        .map(String::as_str)
        .collect()
}

/// Asserts that the one head with request line `line` carried exactly the run's grant.
fn assert_carried_the_grant(fake: &FakeProxy, line: &str, grant: &str) -> Vec<String> {
    let heads = fake.heads_with(line);
    assert_eq!(heads.len(), 1, "{line}: {heads:?}");
    let head = heads.into_iter().next().unwrap();
    assert_eq!(
        header_lines(&head, "proxy-authorization"),
        vec![format!("Proxy-Authorization: Bearer {grant}").as_str()],
        "{head:?}"
    );
    head
}

fn assert_clean(json: &Value) {
    assert_eq!(json["reset_evidence"]["verdict"], "clean", "{json}");
    for field in [
        "processes_remaining",
        "workspace_entries",
        "scratch_entries",
        "mounts_remaining",
    ] {
        assert_eq!(json["reset_evidence"][field], 0, "{field}: {json}");
    }
}

/// Runs `code("warm")` in the prepared jail, then `code("cold")` in a jail built for it, both
/// with `grant`, then resets; returns both results, each checked to have run, and the reset
/// checked clean.
fn warm_then_cold(
    server: &Server,
    grant: Option<&str>,
    code: impl Fn(&str) -> String,
) -> [Value; 2] {
    let mut results = Vec::new();
    wait_prepared(server);
    for (which, warm) in [("warm", true), ("cold", false)] {
        let mut body = json!({ "language": "python", "code": code(which), "token": 7 });
        if let Some(grant) = grant {
            body["grant"] = json!(grant);
        }
        let (status, json) = server.execute(&body);
        assert_eq!(status, 200, "{json}");
        assert_eq!(json["warm"], warm, "{which}: {json}");
        assert_eq!(json["exit_code"], 0, "{which}: {json}");
        // Answered before the run's own reset, which the reset below counts (decision 0036).
        assert_eq!(json["reset_evidence"], Value::Null, "{which}: {json}");
        results.push(json);
    }
    let (status, reset) = server.request("POST", "/v1/reset", Some(TOKEN), br#"{"token": 8}"#);
    assert_eq!(status, 200, "{reset}");
    assert_clean(&reset);
    [results.remove(0), results.remove(0)]
}

fn stdout(json: &Value) -> &str {
    json["stdout"]["text"].as_str().unwrap_or("")
}

#[test]
fn egr_08_plain_http_through_the_proxy_variables_carries_the_grant() {
    if !can_run("egr_08_plain_http_through_the_proxy_variables_carries_the_grant") {
        return;
    }
    let _serial = serial();
    let fake = FakeProxy::start();
    let server = Server::start(&[("SANDBOX_EGRESS_PROXY_URL", &fake.url())]);
    let grant = "relay-test-grant.AbC_123";
    // urllib's default opener takes the proxy from HTTP_PROXY.
    let runs = warm_then_cold(&server, Some(grant), |which| {
        format!(
            "import os, urllib.request\n\
             assert os.environ['HTTP_PROXY'] == 'http://127.0.0.1:3128' and 'NO_PROXY' not in os.environ\n\
             print(urllib.request.urlopen('http://example.test/plain-{which}', timeout=30).read().decode())\n"
        )
    });
    for (json, which) in runs.iter().zip(["warm", "cold"]) {
        assert_eq!(stdout(json), format!("{FAKE_BODY}\n"), "{json}");
        let head = assert_carried_the_grant(
            &fake,
            &format!("GET http://example.test/plain-{which} HTTP/1.1"),
            grant,
        );
        assert_eq!(
            header_lines(&head, "connection"),
            vec!["Connection: close"],
            "{head:?}"
        );
        assert!(!json.to_string().contains(grant), "{json}");
    }
}

#[test]
fn egr_08_a_grant_the_code_forges_is_replaced_by_the_runs() {
    if !can_run("egr_08_a_grant_the_code_forges_is_replaced_by_the_runs") {
        return;
    }
    let _serial = serial();
    let fake = FakeProxy::start();
    let server = Server::start(&[("SANDBOX_EGRESS_PROXY_URL", &fake.url())]);
    let grant = "relay-real-grant.xyz";
    let runs = warm_then_cold(&server, Some(grant), |which| {
        format!(
            "import socket\n\
             s = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n\
             s.sendall(b'GET http://example.test/forged-{which} HTTP/1.1\\r\\nHost: example.test\\r\\n'\n\
             \x20         b'Proxy-Authorization: Bearer forged\\r\\nproxy-authorization: Basic Zm9yZ2Vk\\r\\n'\n\
             \x20         b'Connection: keep-alive\\r\\nProxy-Connection: keep-alive\\r\\n\\r\\n')\n\
             data = b''\n\
             while True:\n\
             \x20   chunk = s.recv(4096)\n\
             \x20   if not chunk:\n\
             \x20       break\n\
             \x20   data += chunk\n\
             print(data.split(b'\\r\\n\\r\\n', 1)[1].decode())\n"
        )
    });
    for (json, which) in runs.iter().zip(["warm", "cold"]) {
        assert_eq!(stdout(json), format!("{FAKE_BODY}\n"), "{json}");
        let head = assert_carried_the_grant(
            &fake,
            &format!("GET http://example.test/forged-{which} HTTP/1.1"),
            grant,
        );
        // The request line names the path; no header field may hold the forgery.
        assert!(
            !head.iter().skip(1).any(|line| line.contains("orged")),
            "{head:?}"
        );
        assert_eq!(
            header_lines(&head, "connection"),
            vec!["Connection: close"],
            "{head:?}"
        );
        assert!(
            header_lines(&head, "proxy-connection").is_empty(),
            "{head:?}"
        );
    }
}

#[test]
fn egr_08_connect_tunnels_bytes_both_ways() {
    if !can_run("egr_08_connect_tunnels_bytes_both_ways") {
        return;
    }
    let _serial = serial();
    let fake = FakeProxy::start();
    let server = Server::start(&[("SANDBOX_EGRESS_PROXY_URL", &fake.url())]);
    let grant = "relay-connect-grant";
    // Bytes sent with the head go through too; then small and large writes come back echoed.
    let runs = warm_then_cold(&server, Some(grant), |which| {
        format!(
            "import socket\n\
             s = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n\
             s.sendall(b'CONNECT {which}.example.test:443 HTTP/1.1\\r\\nHost: {which}.example.test:443\\r\\n'\n\
             \x20         b'Proxy-Authorization: Bearer forged\\r\\n\\r\\nearly')\n\
             def exactly(n):\n\
             \x20   data = b''\n\
             \x20   while len(data) < n:\n\
             \x20       chunk = s.recv(n - len(data))\n\
             \x20       if not chunk:\n\
             \x20           break\n\
             \x20       data += chunk\n\
             \x20   return data\n\
             head = b''\n\
             while not head.endswith(b'\\r\\n\\r\\n'):\n\
             \x20   head += exactly(1)\n\
             print(head.split(b'\\r\\n')[0].decode())\n\
             print(exactly(5).decode())\n\
             s.sendall(b'ping')\n\
             print(exactly(4).decode())\n\
             big = bytes(range(256)) * 256\n\
             s.sendall(big)\n\
             print(exactly(len(big)) == big)\n"
        )
    });
    for (json, which) in runs.iter().zip(["warm", "cold"]) {
        assert_eq!(
            stdout(json),
            "HTTP/1.1 200 Connection established\nearly\nping\nTrue\n",
            "{json}"
        );
        let head = assert_carried_the_grant(
            &fake,
            &format!("CONNECT {which}.example.test:443 HTTP/1.1"),
            grant,
        );
        assert!(!head.iter().any(|line| line.contains("forged")), "{head:?}");
    }
}

/// Code that asks through the relay both ways (plain HTTP without and with a body, and CONNECT)
/// and prints what it was told.
const ASKS_BOTH_WAYS: &str = "import socket, urllib.request, urllib.error\n\
for body in (None, b'x' * 10000):\n\
\x20   try:\n\
\x20       urllib.request.urlopen('http://example.test/no-grant', data=body, timeout=30)\n\
\x20       print('answered')\n\
\x20   except urllib.error.HTTPError as e:\n\
\x20       print(e.code, e.headers['X-Corral-Egress-Reason'], e.headers['Connection'])\n\
s = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n\
s.sendall(b'CONNECT example.test:443 HTTP/1.1\\r\\nHost: example.test:443\\r\\n\\r\\n')\n\
data = b''\n\
while True:\n\
\x20   chunk = s.recv(4096)\n\
\x20   if not chunk:\n\
\x20       break\n\
\x20   data += chunk\n\
lines = data.split(b'\\r\\n')\n\
print(lines[0].decode(), [l.decode() for l in lines if l.lower().startswith(b'x-corral-egress-reason:')])\n";

#[test]
fn egr_08_without_a_grant_the_relay_refuses_and_never_calls_the_proxy() {
    if !can_run("egr_08_without_a_grant_the_relay_refuses_and_never_calls_the_proxy") {
        return;
    }
    let _serial = serial();
    let fake = FakeProxy::start();
    let server = Server::start(&[("SANDBOX_EGRESS_PROXY_URL", &fake.url())]);
    let expected = "407 grant_missing close\n407 grant_missing close\nHTTP/1.1 407 Proxy Authentication Required ['X-Corral-Egress-Reason: grant_missing']\n";
    let runs = warm_then_cold(&server, None, |_| ASKS_BOTH_WAYS.to_owned());
    for json in &runs {
        assert_eq!(stdout(json), expected, "{json}");
    }
    assert_eq!(
        fake.connections_so_far(),
        0,
        "the relay called the proxy: {}",
        fake.other_heads()
    );
    drop(server);
    // A grant, but no proxy configured: the same refusal, and the run says why.
    let server = Server::start(&[("SANDBOX_EGRESS_PROXY_URL", "")]);
    let runs = warm_then_cold(&server, Some("a-grant-with-nowhere-to-go"), |_| {
        ASKS_BOTH_WAYS.to_owned()
    });
    for json in &runs {
        assert_eq!(stdout(json), expected, "{json}");
        assert!(
            json["diagnostics"]
                .to_string()
                .contains("SANDBOX_EGRESS_PROXY_URL is unset"),
            "{json}"
        );
    }
    assert_eq!(
        fake.connections_so_far(),
        0,
        "the relay called the proxy: {}",
        fake.other_heads()
    );
}

#[test]
fn egr_08_the_grant_is_nowhere_the_code_can_read() {
    if !can_run("egr_08_the_grant_is_nowhere_the_code_can_read") {
        return;
    }
    let _serial = serial();
    let fake = FakeProxy::start();
    let server = Server::start(&[("SANDBOX_EGRESS_PROXY_URL", &fake.url())]);
    let grant = format!("secret-grant-{}", std::process::id());
    // The code holds the grant only in hex, so that its own text is no place to find it. It uses
    // the relay first (the grant is attached and in use), then looks everywhere it can read; it
    // also reports that it could read its own environment and other processes' command lines,
    // so that finding nothing means something.
    let hex: String = grant.bytes().map(|b| format!("{b:02x}")).collect();
    let runs = warm_then_cold(&server, Some(&grant), |which| {
        format!(
            "import glob, os, urllib.request\n\
             needle = bytes.fromhex('{hex}')\n\
             print(urllib.request.urlopen('http://example.test/secret-{which}', timeout=30).read().decode())\n\
             found, read = [], set()\n\
             if needle in repr(dict(os.environ)).encode():\n\
             \x20   found.append('os.environ')\n\
             for path in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/task/*/environ'):\n\
             \x20   try:\n\
             \x20       data = open(path, 'rb').read()\n\
             \x20   except OSError:\n\
             \x20       continue\n\
             \x20   read.add(path.rsplit('/', 1)[1])\n\
             \x20   if needle in data:\n\
             \x20       found.append(path)\n\
             for top in ['/workspace', '/tmp', '/run', '/etc', '/dev/shm', '/home', '/root']:\n\
             \x20   for folder, _, files in os.walk(top):\n\
             \x20       for name in files:\n\
             \x20           try:\n\
             \x20               data = open(os.path.join(folder, name), 'rb').read(1 << 20)\n\
             \x20           except OSError:\n\
             \x20               continue\n\
             \x20           if needle in data:\n\
             \x20               found.append(os.path.join(folder, name))\n\
             own = open('/proc/self/environ', 'rb').read()\n\
             print(found, sorted(read), b'HTTP_PROXY=http://127.0.0.1:3128' in own)\n"
        )
    });
    for (json, which) in runs.iter().zip(["warm", "cold"]) {
        assert_eq!(
            stdout(json),
            format!("{FAKE_BODY}\n[] ['cmdline', 'environ'] True\n"),
            "{json}"
        );
        assert_carried_the_grant(
            &fake,
            &format!("GET http://example.test/secret-{which} HTTP/1.1"),
            &grant,
        );
        assert!(!json.to_string().contains(&grant), "{json}");
    }
}

#[test]
fn egr_08_a_grant_that_could_break_a_header_is_refused() {
    if !can_run("egr_08_a_grant_that_could_break_a_header_is_refused") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[("SANDBOX_EGRESS_PROXY_URL", "http://127.0.0.1:9")]);
    for grant in ["two words", "x\r\nX-Injected: 1", ""] {
        let (status, json) = server.execute(&json!({
            "language": "python",
            "code": "print(1)",
            "grant": grant,
        }));
        assert_eq!(status, 400, "{grant:?}: {json}");
        assert_eq!(json["error"], "grant_malformed", "{json}");
    }
}
