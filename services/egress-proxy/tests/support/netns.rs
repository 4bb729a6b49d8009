//! A network namespace joined to the root namespace by a veth pair, for upstream servers the
//! proxy may reach: addresses in 10.213.K.0/24, the host side .1, the namespace side .2.
//! Needs root, `ip` and python3; [`netns_or_skip`] skips the test through `corral_testkit::skip`
//! when one is missing.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use corral_testkit::dns::ip as run;

/// The interpreter for upstream servers (an explicit path: a shim on PATH is slow).
pub const PYTHON: &str = "/usr/bin/python3";

/// An HTTP/1.0 server that echoes the method, path, `Host`, `Proxy-Authorization`,
/// `Connection` and the body (Content-Length or chunked) it received.
pub const ECHO_SERVER: &str = r#"
import sys, http.server, socketserver
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def any(self):
        body = b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        out = ("method=%s path=%s host=%s auth=%s conn=%s body=" % (self.command, self.path,
               self.headers.get("Host"), self.headers.get("Proxy-Authorization"),
               self.headers.get("Connection"))).encode() + body
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = any
    def log_message(self, *args):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
S((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"#;

/// A quiet, threaded static file server: `python3 -c STATIC_SERVER <ip> <port> <directory>`.
pub const STATIC_SERVER: &str = r#"
import functools, http.server, sys
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])),
                                functools.partial(H, directory=sys.argv[3])).serve_forever()
"#;

/// A namespace with a veth pair; removed (with its processes) when dropped.
pub struct Netns {
    /// The namespace name.
    pub name: String,
    /// The root namespace's end of the pair.
    pub host_ip: Ipv4Addr,
    /// The namespace's end.
    pub ns_ip: Ipv4Addr,
    /// The /24 both ends are in.
    pub cidr: String,
    children: Vec<Child>,
}

impl Netns {
    /// Creates a namespace, or says why it cannot (no `ip`, or `ip` fails).
    pub fn create() -> Result<Netns, String> {
        run(&["-V"])?;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let in_use = run(&["-o", "-4", "addr", "show"])?;
        let octet = (0..250u32)
            .map(|i| (pid.wrapping_mul(7).wrapping_add(n * 37).wrapping_add(i)) % 250 + 1)
            .find(|k| !in_use.contains(&format!("10.213.{k}.")))
            .ok_or("no free 10.213.K.0/24")?;
        let tag = format!("{}{}", pid % 100_000, n);
        let name = format!("corral-egr-{tag}");
        let host_if = format!("ceh{tag}");
        let ns_if = format!("cen{tag}");
        let octet = u8::try_from(octet).map_err(|e| e.to_string())?;
        let netns = Netns {
            name: name.clone(),
            host_ip: Ipv4Addr::new(10, 213, octet, 1),
            ns_ip: Ipv4Addr::new(10, 213, octet, 2),
            cidr: format!("10.213.{octet}.0/24"),
            children: Vec::new(),
        };
        run(&["netns", "add", &name])?;
        // From here on, dropping `netns` removes the namespace (and the veth with it).
        let host_cidr = format!("{}/24", netns.host_ip);
        let ns_cidr = format!("{}/24", netns.ns_ip);
        let steps: [&[&str]; 7] = [
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
            ],
            &["link", "set", &ns_if, "netns", &name],
            &["addr", "add", &host_cidr, "dev", &host_if],
            &["link", "set", &host_if, "up"],
            &["-n", &name, "addr", "add", &ns_cidr, "dev", &ns_if],
            &["-n", &name, "link", "set", &ns_if, "up"],
            &["-n", &name, "link", "set", "lo", "up"],
        ];
        for step in steps {
            run(step)?;
        }
        Ok(netns)
    }

    /// Runs `program args…` inside the namespace; it is killed when the namespace is dropped.
    pub fn spawn(&mut self, program: &str, args: &[&str]) -> Result<(), String> {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn {program}: {e}"))?;
        self.children.push(child);
        Ok(())
    }

    /// Starts the echo server on the namespace address and waits until it accepts.
    pub fn start_echo_server(&mut self, port: u16) -> Result<SocketAddr, String> {
        let ip = self.ns_ip.to_string();
        let port_text = port.to_string();
        self.spawn(PYTHON, &["-c", ECHO_SERVER, &ip, &port_text])?;
        let addr = SocketAddr::from((self.ns_ip, port));
        wait_for_listener(addr)?;
        Ok(addr)
    }
}

impl Netns {
    /// Serves the files of `directory` on the namespace address's port 80 and waits until it
    /// accepts.
    pub fn serve_directory(&mut self, directory: &std::path::Path) -> Result<SocketAddr, String> {
        let ip = self.ns_ip.to_string();
        let directory = directory.to_string_lossy().into_owned();
        self.spawn(PYTHON, &["-c", STATIC_SERVER, &ip, "80", &directory])?;
        let addr = SocketAddr::from((self.ns_ip, 80));
        wait_for_listener(addr)?;
        Ok(addr)
    }
}

/// A namespace for the test `test`, or `None` after skipping it through `corral_testkit::skip`
/// for want of root, python3 or a namespace (CI sets the `CORRAL_REQUIRE_*` of each, and the test
/// fails instead).
pub fn netns_or_skip(test: &str) -> Option<Netns> {
    use corral_testkit::{Need, skip};
    if !corral_testkit::is_root() {
        skip(
            test,
            Need::Root,
            "not running as root: network namespaces need CAP_NET_ADMIN",
        );
        return None;
    }
    if !std::path::Path::new(PYTHON).exists() {
        skip(
            test,
            Need::Tools,
            &format!("{PYTHON} is missing: it runs the upstream servers"),
        );
        return None;
    }
    match Netns::create() {
        Ok(ns) => Some(ns),
        Err(why) => {
            skip(test, Need::Netns, &why);
            None
        }
    }
}

/// Waits up to 10 s until `addr` accepts a connection.
pub fn wait_for_listener(addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("nothing listens on {addr}"))
}

impl Drop for Netns {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = run(&["netns", "del", &self.name]);
    }
}
