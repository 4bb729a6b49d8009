//! Differential test (EGR-3): for generated targets, `corral egress decide --offline --answer …`
//! and the real proxy (asking a stub DNS server that gives the same answers) agree on allow or
//! deny, on the reason, and on the pinned address.
//!
//! The proxy runs with a recording dialer: it records the pinned address the core chose and
//! connects to a local sink instead, so that no generated address is ever dialed.

mod support;

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_core::egress::{EgressSettings, Mode, resolve};
use corral_egress_proxy::decide_cli;
use corral_egress_proxy::proxy::Dialer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::dns_stub::{Behaviour, StubDns};
use support::*;

/// Records the pinned address and connects to the local sink instead.
#[derive(Clone)]
struct RecordingDialer {
    sink: SocketAddr,
    pinned: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Dialer for RecordingDialer {
    fn dial(
        &self,
        pinned: SocketAddr,
    ) -> impl std::future::Future<Output = std::io::Result<tokio::net::TcpStream>> + Send {
        self.pinned.lock().unwrap().push(pinned);
        tokio::net::TcpStream::connect(self.sink)
    }
}

/// A sink that answers any request with `299` and closes.
fn start_sink() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(
                    b"HTTP/1.1 299 Sink\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            });
        }
    });
    addr
}

const NAMES: [&str; 6] = [
    "a.example",
    "svc.test",
    "x-y.corp",
    "deep.sub.example",
    "1.example",
    "db",
];
const ADDRESSES: [&str; 16] = [
    "93.184.216.34",
    "8.8.8.8",
    "10.1.2.3",
    "192.168.1.5",
    "127.0.0.1",
    "169.254.169.254",
    "100.64.1.1",
    "0.0.0.0",
    "224.0.0.1",
    "::1",
    "fd00::5",
    "2606:4700::1111",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "2001:db8::1",
    "fe80::1",
];
const PORTS: [&str; 8] = ["80", "443", "8080", "22", "0443", "", "99999", "+80"];

/// One generated case.
#[derive(Clone, Debug)]
struct Case {
    mode: &'static str,
    ports: Vec<&'static str>,
    cidrs: Vec<&'static str>,
    hosts: Vec<String>,
    http: bool,
    target: String,
    host_header: String,
    answers: Vec<(String, Option<Vec<IpAddr>>)>,
}

fn host_piece() -> impl Strategy<Value = String> {
    let name = (0..NAMES.len(), any::<bool>(), any::<bool>()).prop_map(|(i, upper, dot)| {
        let mut name = NAMES[i].to_owned();
        if upper {
            name = name.to_ascii_uppercase();
        }
        if dot {
            name.push('.');
        }
        name
    });
    let literal = (0..ADDRESSES.len()).prop_map(|i| match ADDRESSES[i].parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
        _ => ADDRESSES[i].to_owned(),
    });
    let weird = proptest::sample::select(vec![
        "127.1",
        "0x7f.0.0.1",
        "2130706433",
        "017700000001",
        "[::1%25lo]",
        "[10.1.2.3]",
        "user@a.example",
        "a.example/x",
        "a..example",
        "-a.example",
        "a_b.example",
        "%61.example",
        "[v1.x]",
        "[::1",
        "a.example]",
        "ä.example",
        "a\u{0}b",
        "a\tb",
        "*.example",
        "",
    ])
    .prop_map(str::to_owned);
    prop_oneof![6 => name, 3 => literal, 2 => weird, 1 => "[!-~]{0,12}"]
}

fn case() -> impl Strategy<Value = Case> {
    let mode = proptest::sample::select(vec![
        "public_internet",
        "public_internet",
        "private_network",
        "private_network",
        "host_allowlist",
        "host_allowlist",
        "Public_Internet",
        "isolated",
    ]);
    let ports = proptest::sample::subsequence(vec!["80", "443", "8080", "22"], 1..=4);
    let cidrs = proptest::sample::subsequence(
        vec!["10.0.0.0/8", "192.168.1.0/24", "fd00::/8", "100.64.0.0/10"],
        1..=4,
    );
    let hosts = proptest::collection::vec(
        proptest::sample::select(vec![
            "a.example",
            "svc.test",
            "db",
            "10.1.2.3",
            "[fd00::5]",
            "93.184.216.34",
        ]),
        1..=3,
    )
    .prop_map(|hosts| hosts.into_iter().map(str::to_owned).collect::<Vec<_>>());
    let answers = proptest::collection::vec(
        (0u8..6, proptest::collection::vec(0..ADDRESSES.len(), 0..=3)),
        NAMES.len(),
    );
    // Three times in four a well-formed port, so that the policy, not the parser, decides.
    let port = (
        prop_oneof![3 => 0..4usize, 1 => 4..PORTS.len()],
        any::<bool>(),
    );
    let path = proptest::sample::select(vec!["", "/", "/a?b=c", "/%zz", "#frag", "/x\ty"]);
    (
        mode,
        ports,
        cidrs,
        hosts,
        any::<bool>(),
        host_piece(),
        port,
        path,
        answers,
        any::<bool>(),
    )
        .prop_map(
            |(
                mode,
                ports,
                cidrs,
                hosts,
                http,
                host,
                (port_i, with_port),
                path,
                answers,
                same_host,
            )| {
                let port = PORTS[port_i];
                let authority = if with_port || !http {
                    format!("{host}:{port}")
                } else {
                    host.clone()
                };
                let target = if http {
                    format!("http://{authority}{path}")
                } else {
                    authority.clone()
                };
                // A header value cannot carry control bytes, and HTTP trims its spaces.
                let sendable = !authority
                    .chars()
                    .any(|c| c.is_control() || c.is_whitespace());
                let host_header = if same_host && sendable {
                    authority
                } else {
                    "a.example".to_owned()
                };
                let answers = NAMES
                    .iter()
                    .zip(answers)
                    .map(|(name, (kind, picks))| {
                        let mut list: Vec<IpAddr> = picks
                            .iter()
                            .map(|i| ADDRESSES[*i].parse().unwrap())
                            .collect();
                        // A DNS answer has no order across A and AAAA: the proxy puts A first.
                        list.sort_by_key(|ip| ip.is_ipv6());
                        // Kinds 4 and 5: one address some policy admits, so allows are common.
                        let admissible = [
                            "93.184.216.34",
                            "10.1.2.3",
                            "2606:4700::1111",
                            "192.168.1.5",
                        ];
                        let behaviour = match kind {
                            0 => None,
                            1 => Some(Vec::new()),
                            2 | 3 => Some(list),
                            _ => Some(vec![admissible[picks.len()].parse().unwrap()]),
                        };
                        ((*name).to_owned(), behaviour)
                    })
                    .collect();
                Case {
                    mode,
                    ports,
                    cidrs,
                    hosts,
                    http,
                    target,
                    host_header,
                    answers,
                }
            },
        )
}

/// The JSON string or literal value of `key` in decide's one-line output.
fn field(json: &str, key: &str) -> Option<String> {
    let needle = format!("\"{key}\":");
    let rest = &json[json.find(&needle)? + needle.len()..];
    if let Some(rest) = rest.strip_prefix('"') {
        return rest.split('"').next().map(str::to_owned);
    }
    rest.split([',', '}']).next().map(str::to_owned)
}

fn decide(case: &Case) -> (bool, Option<String>, Option<String>) {
    let mut args: Vec<String> = vec!["--offline".into(), "--mode".into(), case.mode.into()];
    for port in &case.ports {
        args.extend(["--allowed-port".into(), (*port).into()]);
    }
    for cidr in &case.cidrs {
        args.extend(["--private-cidr".into(), (*cidr).into()]);
    }
    for host in &case.hosts {
        args.extend(["--allowed-host".into(), host.clone()]);
    }
    for (name, answer) in &case.answers {
        if let Some(list) = answer {
            let ips: Vec<String> = list.iter().map(ToString::to_string).collect();
            args.extend(["--answer".into(), format!("{name}={}", ips.join(","))]);
        }
    }
    if case.http {
        args.extend([
            "--via".into(),
            "http".into(),
            "--host-header".into(),
            case.host_header.clone(),
        ]);
    }
    args.extend(["--".into(), case.target.clone()]);
    let out = decide_cli::run(&args);
    assert!(
        out.exit_code < 2,
        "usage error for {args:?}: {}",
        out.stderr
    );
    (
        out.exit_code == 0,
        field(&out.stdout, "reason"),
        field(&out.stdout, "pinned"),
    )
}

#[test]
fn egr_03_decide_and_the_proxy_agree_on_generated_targets() {
    let rt = runtime();
    let dns = StubDns::start();
    let pinned = Arc::new(Mutex::new(Vec::new()));
    let dialer = RecordingDialer {
        sink: start_sink(),
        pinned: Arc::clone(&pinned),
    };
    let proxy = start_proxy_with(&rt, dns.addr, test_limits(), dialer);
    let cases: u32 = std::env::var("EGRESS_DIFFERENTIAL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_global_rejects: cases,
        ..Config::default()
    });
    let compared = std::sync::atomic::AtomicU32::new(0);
    let allowed = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&case(), |case| {
            // Bytes that cannot travel in a request line or a header value.
            prop_assume!(!case.target.contains([' ', '\r', '\n']));
            let (decide_allows, decide_reason, decide_pinned) = decide(&case);
            let ports = case.ports.join(",");
            let cidrs = case.cidrs.join(",");
            let hosts = case.hosts.join(",");
            let policy = resolve(&EgressSettings {
                enabled: None,
                mode: Some(case.mode),
                allowed_ports: Some(&ports),
                private_cidrs: Some(&cidrs),
                allowed_hosts: Some(&hosts),
                token_ttl_seconds: None,
                proxy_address_present: true,
                field_key_present: true,
            })
            .policy;
            if policy.mode() == Mode::Isolated {
                // No grant exists for `isolated` (EGR-8): nothing reaches the proxy.
                prop_assert!(!decide_allows);
                return Ok(());
            }
            dns.clear();
            for (name, answer) in &case.answers {
                if let Some(list) = answer {
                    dns.set(name, Behaviour::Answer(list.clone()));
                }
            }
            pinned.lock().unwrap().clear();
            let grant = mint(&policy);
            let (request, allowed_status) = if case.http {
                (get_request(&case.target, &case.host_header, &grant), 299)
            } else {
                let head = format!(
                    "CONNECT {} HTTP/1.1\r\nHost: proxy\r\nProxy-Authorization: Bearer {grant}\r\n\r\n",
                    case.target
                );
                (head.into_bytes(), 200)
            };
            let response = if case.http {
                exchange(proxy.addr, &request)
            } else {
                let mut stream = TcpStream::connect(proxy.addr).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                stream.write_all(&request).unwrap();
                read_head_only(&mut stream)
            };
            let proxy_allows = response.status == allowed_status;
            prop_assert_eq!(
                decide_allows,
                proxy_allows,
                "{:?}\nproxy: {}",
                case,
                response.head
            );
            if decide_allows {
                let recorded = pinned.lock().unwrap().first().map(ToString::to_string);
                prop_assert_eq!(decide_pinned, recorded, "{:?}", case);
            } else {
                prop_assert_eq!(
                    decide_reason,
                    response.reason,
                    "{:?}\nproxy: {}",
                    case,
                    response.head
                );
            }
            compared.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if decide_allows {
                allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        })
        .unwrap();
    let compared = compared.into_inner();
    let allowed = allowed.into_inner();
    eprintln!("compared {compared} cases through the proxy, {allowed} allowed");
    assert!(allowed > 0, "no generated case was allowed");
    assert!(
        compared > cases / 2,
        "only {compared} cases reached the proxy"
    );
}
