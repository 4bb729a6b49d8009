//! The far side of the egress load: two addresses on a link of the harness's own (one end of a veth
//! pair, which any kernel with network namespaces has; its addresses are local), a target
//! that answers every fetch with the run's secret and the path it was asked, a canary that
//! records every connection it is offered, and the stub DNS server the egress proxy asks.
//!
//! The policy admits the target's address alone (`private_network` with its /32, port 80); the
//! canary's address is as private and as reachable, so a proxy that connected wherever a name
//! pointed would reach it. The DNS faults change what the stub answers for [`NAME`]: SERVFAIL,
//! silence (the proxy's resolver times out), or the target and the canary together, an answer
//! the proxy must reject whole (EGR-2). Healed, it answers the target alone again.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use corral_testkit::dns::{Behaviour, StubDns, ip};

use crate::deploy::Proc;

/// The link the two addresses live on; [`crate::hygiene`] removes it (and its peer with it).
pub const LINK: &str = "corralchaos0";

/// The other end of the veth pair.
pub(crate) const PEER: &str = "corralchaos1";

/// The name a run fetches.
pub const NAME: &str = "target.chaos.corral";

/// The port both servers listen on (the policy's one port).
pub const PORT: u16 = 80;

/// The DNS faults, by their names in the report.
pub const DNS_FAULTS: [&str; 3] = ["dns_servfail", "dns_timeout", "dns_mixed"];

/// The target: every GET is answered `<secret> <path>`.
const TARGET_SERVER: &str = r#"
import http.server, sys
SECRET = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("%s %s" % (SECRET, self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer((sys.argv[1], 80), H).serve_forever()
"#;

/// The canary: every connection is a line in its log, then a 200 it should never have given. It
/// says it listens by creating its third argument, so that nothing need connect to learn it.
const CANARY_SERVER: &str = r#"
import socketserver, sys, time
class H(socketserver.StreamRequestHandler):
    def handle(self):
        with open(sys.argv[2], "a") as log:
            log.write("%.3f from %s\n" % (time.time(), self.client_address[0]))
        self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\ncanary")
socketserver.ThreadingTCPServer.allow_reuse_address = True
server = socketserver.ThreadingTCPServer((sys.argv[1], 80), H)
open(sys.argv[3], "w").close()
server.serve_forever()
"#;

/// The far side, running.
pub struct Far {
    /// The address the policy admits.
    pub target: Ipv4Addr,
    /// The address it does not.
    pub canary: Ipv4Addr,
    /// The stub the proxy asks.
    pub dns: StubDns,
    /// The target's processes.
    pub procs: Vec<Proc>,
    canary_log: PathBuf,
}

/// Removes the link (and its peer), if it is there.
pub fn remove_link() {
    let _ = ip(&["link", "del", LINK]);
}

/// Whether the link is there.
#[must_use]
pub fn link_exists() -> bool {
    Path::new("/sys/class/net").join(LINK).exists()
}

impl Far {
    /// Makes the link and its addresses (a /24 of 10.213.0.0/16 no interface uses), starts the
    /// target and the canary, and the stub answering [`NAME`] with the target.
    ///
    /// # Errors
    /// No `ip`, a link that cannot be made, or a server that does not start.
    pub fn start(
        dir: &Path,
        secret: &str,
        marker: &(String, String),
        logs: &Path,
    ) -> Result<Far, String> {
        let in_use = ip(&["-o", "-4", "addr", "show"])?;
        let octet = (200..=250u8)
            .find(|k| !in_use.contains(&format!("10.213.{k}.")))
            .ok_or("no free 10.213.K.0/24 for the egress target")?;
        let (target, canary) = (
            Ipv4Addr::new(10, 213, octet, 2),
            Ipv4Addr::new(10, 213, octet, 3),
        );
        ip(&["link", "add", LINK, "type", "veth", "peer", "name", PEER])?;
        for address in [target, canary] {
            ip(&["addr", "add", &format!("{address}/32"), "dev", LINK])?;
        }
        for end in [LINK, PEER] {
            ip(&["link", "set", end, "up"])?;
        }
        let canary_log = dir.join("canary.log");
        let canary_ready = dir.join("canary.ready");
        let python = corral_testkit::registries::SYSTEM_PYTHON;
        let mut procs = vec![
            Proc::new(
                "egress-target",
                [python, "-c", TARGET_SERVER, &target.to_string(), secret],
                marker,
                &logs.join("egress-target.log"),
            ),
            Proc::new(
                "egress-canary",
                [
                    python,
                    "-c",
                    CANARY_SERVER,
                    &canary.to_string(),
                    &canary_log.display().to_string(),
                    &canary_ready.display().to_string(),
                ],
                marker,
                &logs.join("egress-canary.log"),
            ),
        ];
        for proc in &mut procs {
            proc.start()?;
        }
        let bound = std::time::Duration::from_secs(20);
        crate::deploy::wait_for("the egress target", bound, || {
            std::net::TcpStream::connect((target, PORT)).is_ok()
        })?;
        // Never a connection to the canary: any would be in its log.
        crate::deploy::wait_for("the egress canary", bound, || canary_ready.exists())?;
        let dns = StubDns::start();
        let far = Far {
            target,
            canary,
            dns,
            procs,
            canary_log,
        };
        far.heal();
        Ok(far)
    }

    /// `SANDBOX_EGRESS_DNS_SERVERS` for the proxy.
    #[must_use]
    pub fn dns_servers(&self) -> String {
        self.dns.addr.to_string()
    }

    /// `SANDBOX_EGRESS_PRIVATE_CIDRS`: the target alone.
    #[must_use]
    pub fn cidrs(&self) -> String {
        format!("{}/32", self.target)
    }

    /// Injects the DNS fault `kind`; a mixed answer lists the canary first when `canary_first`
    /// (a proxy that connected to the first address of an answer it should have rejected would
    /// reach it).
    ///
    /// # Errors
    /// When `kind` is not a DNS fault.
    pub fn inject(&self, kind: &str, canary_first: bool) -> Result<(), String> {
        let mut mixed = vec![IpAddr::V4(self.target), IpAddr::V4(self.canary)];
        if canary_first {
            mixed.reverse();
        }
        let behaviour = match kind {
            "dns_servfail" => Behaviour::ServFail,
            "dns_timeout" => Behaviour::Silent,
            "dns_mixed" => Behaviour::Answer(mixed),
            other => return Err(format!("{other:?} is not a DNS fault")),
        };
        self.dns.set(NAME, behaviour);
        Ok(())
    }

    /// The stub answers [`NAME`] with the target alone again.
    pub fn heal(&self) {
        self.dns
            .set(NAME, Behaviour::Answer(vec![IpAddr::V4(self.target)]));
    }

    /// Every connection the canary was offered.
    #[must_use]
    pub fn canary_hits(&self) -> Vec<String> {
        std::fs::read_to_string(&self.canary_log)
            .map(|log| log.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Stops the servers and removes the link.
    pub fn stop(&mut self) {
        for proc in &mut self.procs {
            proc.kill();
        }
        remove_link();
    }
}
