//! A stub DNS server on loopback UDP, answering from a table the test controls: the egress
//! proxy's tests, and the chaos harness's DNS faults (SERVFAIL, silence, mixed answers).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the stub answers one name.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// NOERROR with these addresses (A for A queries, AAAA for AAAA queries).
    Answer(Vec<IpAddr>),
    /// NXDOMAIN.
    NxDomain,
    /// SERVFAIL.
    ServFail,
    /// No answer at all (the client times out).
    Silent,
    /// The n-th query of each type gets the n-th list (the last list repeats).
    Changing(Vec<Vec<IpAddr>>),
}

#[derive(Default)]
struct State {
    table: BTreeMap<String, Behaviour>,
    asked: Vec<(String, u16)>,
    served: BTreeMap<(String, u16), usize>,
}

/// The running stub; stops when dropped.
pub struct StubDns {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl StubDns {
    /// Starts a stub on 127.0.0.1 with an empty table (every name NXDOMAIN).
    pub fn start() -> StubDns {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind stub dns");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let addr = socket.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_state, thread_stop) = (Arc::clone(&state), Arc::clone(&stop));
        std::thread::spawn(move || serve(&socket, &thread_state, &thread_stop));
        StubDns { addr, state, stop }
    }

    /// Sets how `name` (lower case, no trailing dot) is answered.
    pub fn set(&self, name: &str, behaviour: Behaviour) {
        self.state
            .lock()
            .unwrap()
            .table
            .insert(name.to_owned(), behaviour);
    }

    /// Forgets every name and what was asked.
    pub fn clear(&self) {
        let mut state = self.state.lock().unwrap();
        state.table.clear();
        state.asked.clear();
        state.served.clear();
    }

    /// Every (name, type) asked so far, names as they arrived (with their letter case).
    pub fn asked(&self) -> Vec<(String, u16)> {
        self.state.lock().unwrap().asked.clone()
    }
}

impl Drop for StubDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(socket: &UdpSocket, state: &Mutex<State>, stop: &AtomicBool) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        if let Some(reply) = answer(&buf[..n], state) {
            let _ = socket.send_to(&reply, from);
        }
    }
}

/// Parses one query and builds the reply (or `None` to stay silent or for garbage).
fn answer(query: &[u8], state: &Mutex<State>) -> Option<Vec<u8>> {
    if query.len() < 12 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).into_owned());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question_end = at + 4;
    let name = labels.join(".");
    let key = name.to_ascii_lowercase();
    let mut guard = state.lock().ok()?;
    guard.asked.push((name, qtype));
    let behaviour = guard
        .table
        .get(&key)
        .cloned()
        .unwrap_or(Behaviour::NxDomain);
    let (rcode, addresses) = match behaviour {
        Behaviour::Answer(addresses) => (0u8, addresses),
        Behaviour::NxDomain => (3, Vec::new()),
        Behaviour::ServFail => (2, Vec::new()),
        Behaviour::Silent => return None,
        Behaviour::Changing(lists) => {
            let served = guard.served.entry((key, qtype)).or_insert(0);
            let list = lists
                .get(*served)
                .or(lists.last())
                .cloned()
                .unwrap_or_default();
            *served += 1;
            (0, list)
        }
    };
    drop(guard);
    let records: Vec<IpAddr> = addresses
        .into_iter()
        .filter(|ip| matches!((ip, qtype), (IpAddr::V4(_), 1) | (IpAddr::V6(_), 28)))
        .collect();
    let mut reply = Vec::with_capacity(512);
    reply.extend_from_slice(&query[0..2]);
    let rd = query[2] & 0x01;
    reply.push(0x80 | rd);
    reply.push(0x80 | rcode);
    reply.extend_from_slice(&1u16.to_be_bytes());
    reply.extend_from_slice(&u16::try_from(records.len()).ok()?.to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]);
    reply.extend_from_slice(&query[12..question_end]);
    for ip in records {
        reply.extend_from_slice(&[0xc0, 0x0c]);
        match ip {
            IpAddr::V4(v4) => {
                reply.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
                reply.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                reply.extend_from_slice(&[0, 28, 0, 1, 0, 0, 0, 0, 0, 16]);
                reply.extend_from_slice(&v6.octets());
            }
        }
    }
    Some(reply)
}

/// Runs `ip args…` (iproute2): its standard output, or what it said on failure. For the links and
/// addresses a test (or the chaos harness, for its egress target) makes beside the stub.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
