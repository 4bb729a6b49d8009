//! Fuzz-like property runs of the authority and URL parsers and the address classifier, at the
//! public API the proxy and `corral egress decide` call (cargo-fuzz needs a nightly toolchain;
//! this needs none).
//!
//! - `egress_parser_fuzz_short`: a few thousand cases, always run.
//! - `egress_parser_fuzz`: the long run, `#[ignore]`d; run it with
//!   `cargo test -p corral-egress-proxy --test egress_parser_fuzz -- --ignored`
//!   (cases from `EGRESS_FUZZ_CASES`, default 1000000; a failure prints its minimal input).
//!
//! Properties: no input panics; whatever parses is in its one canonical spelling (ASCII, bounded,
//! no userinfo, percent-encoding, path, zone, or numeric spelling other than the dotted quad) and
//! re-parses to itself; every IPv4-embedding or special-purpose IPv6 form and every address the
//! standard library calls loopback, link-local, multicast, unspecified, documentation or private
//! gets its class; and no policy ever allows an answer holding an address outside global unicast
//! or its configured private CIDRs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use corral_core::egress::target::{AUTHORITY_MAX_BYTES, LABEL_MAX_BYTES, NAME_MAX_BYTES};
use corral_core::egress::{
    AddressClass, Decision, Host, Policy, check_host_header, classify, decide_answer,
    parse_absolute_url, parse_connect_authority,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Pieces an attacker would combine.
const PIECES: [&str; 40] = [
    "example.com",
    "EXAMPLE.COM.",
    "a",
    "xn--bcher-kva.example",
    "127.0.0.1",
    "127.1",
    "0x7f.1",
    "0177.0.0.1",
    "2130706433",
    "0x7f000001",
    "1.2.3.4",
    "256.1.1.1",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[64:ff9b::7f00:1]",
    "[2002:7f00:1::]",
    "[2001:0:4136:e378:8000:63bf:3fff:fdd2]",
    "[fe80::1%25eth0]",
    "[fe80::1%eth0]",
    "[v1.x]",
    "[127.0.0.1]",
    "[example.com]",
    "::1",
    "user@",
    "user:pw@",
    "%2e",
    "%31",
    ":",
    "::",
    ":443",
    ":0443",
    ":+80",
    ":65536",
    ":80",
    "/",
    "?",
    "#",
    ".",
    "..",
];
/// Bytes mutations insert.
const NOISE: [char; 24] = [
    '.', ':', '[', ']', '@', '%', '/', '?', '#', '\\', ' ', '\t', '\0', '\u{7f}', '0', 'x', 'X',
    'f', '-', '_', '~', 'é', '\u{ff0e}', '\u{200b}',
];

/// A host: a generated name, any IPv4 or IPv6 address in its canonical form, or a piece.
fn host() -> impl Strategy<Value = String> {
    let label = "[a-zA-Z0-9]([a-zA-Z0-9-]{0,6}[a-zA-Z0-9])?";
    let name = format!("{label}(\\.{label}){{0,3}}\\.?");
    prop_oneof![
        4 => proptest::string::string_regex(&name).expect("name regex"),
        2 => any::<u32>().prop_map(|b| Ipv4Addr::from_bits(b).to_string()),
        2 => address().prop_map(|ip| match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        }),
        2 => proptest::sample::select(PIECES.to_vec()).prop_map(str::to_owned),
    ]
}

/// Inputs: arbitrary text, the authority alphabet, and `host:port` shapes with a few mutations.
fn input() -> impl Strategy<Value = String> {
    let port = prop_oneof![
        3 => any::<u16>().prop_map(|p| format!(":{p}")),
        1 => proptest::sample::select(PIECES.to_vec()).prop_map(str::to_owned),
    ];
    let mutations = prop_oneof![
        2 => Just(Vec::new()),
        3 => proptest::collection::vec((0u8..3, any::<prop::sample::Index>(), 0..NOISE.len()), 1..4),
    ];
    let mutated = (host(), port, mutations).prop_map(|(host, port, mutations)| {
        let mut chars: Vec<char> = format!("{host}{port}").chars().collect();
        for (op, at, noise) in mutations {
            let i = at.index(chars.len() + 1);
            match op {
                0 => chars.insert(i, NOISE[noise]),
                1 if i < chars.len() => {
                    chars.remove(i);
                }
                _ if i < chars.len() => chars[i] = NOISE[noise],
                _ => {}
            }
        }
        chars.into_iter().collect::<String>()
    });
    prop_oneof![
        1 => any::<String>(),
        2 => "[a-zA-Z0-9.:\\[\\]@%/?#_~+ -]{0,48}",
        8 => mutated,
    ]
}

fn is_numeric_label(label: &str) -> bool {
    (!label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()))
        || label
            .strip_prefix("0x")
            .or_else(|| label.strip_prefix("0X"))
            .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What an accepted host must look like, given the text it came from.
fn check_host(host: &Host, text: &str) -> Result<(), TestCaseError> {
    match host {
        Host::Name(name) => {
            let canonical = name.as_str();
            prop_assert!(!canonical.is_empty() && canonical.len() <= NAME_MAX_BYTES);
            prop_assert_eq!(canonical, canonical.to_ascii_lowercase());
            for label in canonical.split('.') {
                prop_assert!(
                    !label.is_empty() && label.len() <= LABEL_MAX_BYTES,
                    "{canonical}"
                );
                prop_assert!(
                    label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                );
                prop_assert!(!label.starts_with('-') && !label.ends_with('-'));
            }
            let last = canonical.rsplit('.').next().unwrap_or_default();
            prop_assert!(!is_numeric_label(last), "numeric last label in {text:?}");
            let given = text.strip_suffix('.').unwrap_or(text);
            prop_assert!(
                given.eq_ignore_ascii_case(canonical),
                "{text:?} -> {canonical}"
            );
        }
        Host::Ipv4(v4) => prop_assert_eq!(text, v4.to_string(), "only the dotted quad"),
        Host::Ipv6(v6) => {
            let inner = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
            prop_assert!(inner.is_some(), "IPv6 must be bracketed: {text:?}");
            prop_assert_eq!(inner.and_then(|i| i.parse::<Ipv6Addr>().ok()), Some(*v6));
        }
    }
    Ok(())
}

fn check_authority(text: &str) -> Result<(), TestCaseError> {
    let Ok(target) = parse_connect_authority(text) else {
        return Ok(());
    };
    prop_assert!(text.len() <= AUTHORITY_MAX_BYTES && text.is_ascii());
    prop_assert!(!text.bytes().any(|b| b <= b' ' || b == 0x7f));
    prop_assert!(!text.contains(['@', '%', '/', '?', '#']), "{text:?}");
    let (host_text, port_text) = text.rsplit_once(':').expect("CONNECT has a port");
    prop_assert_eq!(port_text, target.port.to_string());
    prop_assert!(target.port != 0);
    check_host(&target.host, host_text)?;
    let again = parse_connect_authority(&target.to_string());
    prop_assert_eq!(again.as_ref(), Ok(&target), "canonical form re-parses");
    Ok(())
}

/// Checks every URL spelling of `text` that parses; returns how many did.
fn check_url(text: &str) -> Result<u32, TestCaseError> {
    let mut parsed = 0;
    let candidates = [
        text.to_owned(),
        format!("http://{text}"),
        format!("http://{text}/p?q"),
    ];
    for url in candidates {
        let Ok(request) = parse_absolute_url(&url) else {
            continue;
        };
        prop_assert!(url.is_ascii() && !url.contains('#'));
        prop_assert!(
            url.get(..7)
                .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
        );
        prop_assert!(request.origin_form.starts_with('/'));
        let authority = request.target.to_string();
        let again = parse_absolute_url(&format!("http://{authority}{}", request.origin_form));
        prop_assert_eq!(again.map(|r| r.target), Ok(request.target.clone()));
        let header = check_host_header(&request, &[&authority]);
        prop_assert_eq!(header, Ok(()));
        // Any answer will do for arbitrary text; it must only not panic.
        let _ = check_host_header(&request, &[text]);
        parsed += 1;
    }
    if let Ok(host) = Host::parse(text) {
        check_host(&host, text)?;
        prop_assert_eq!(Host::parse(&host.to_string()), Ok(host));
    }
    Ok(parsed)
}

/// IPv6 forms that carry an IPv4 address.
fn embeds_ipv4(v6: Ipv6Addr) -> bool {
    let s = v6.segments();
    let bits = v6.to_bits();
    let compatible = bits >> 32 == 0 && bits > 1;
    let mapped = s[..5] == [0; 5] && s[5] == 0xffff;
    let translated = s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0;
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    let nat64_local = s[..3] == [0x64, 0xff9b, 1];
    let six_to_four = s[0] == 0x2002;
    let teredo = s[0] == 0x2001 && s[1] == 0;
    compatible || mapped || translated || nat64 || nat64_local || six_to_four || teredo
}

fn check_class(ip: IpAddr) -> Result<(), TestCaseError> {
    let class = classify(ip).class;
    let denied = matches!(class, AddressClass::AlwaysDenied);
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_unspecified()
                || v4.is_documentation()
                || v4.is_broadcast()
                || v4.octets()[0] == 0
                || v4.octets()[0] >= 240
            {
                prop_assert!(denied, "{ip} is {class:?}");
            }
            if v4.is_private() || (v4.octets()[0] == 100 && v4.octets()[1] & 0xc0 == 64) {
                prop_assert_eq!(class, AddressClass::Private, "{}", ip);
            }
            if v4.octets()[0] == 198 && v4.octets()[1] & 0xfe == 18 {
                prop_assert!(denied, "benchmarking {ip}");
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || first & 0xffc0 == 0xfe80
            {
                prop_assert!(denied, "{ip} is {class:?}");
            } else if embeds_ipv4(v6) {
                prop_assert_eq!(class, AddressClass::EmbedsIpv4, "{}", ip);
            } else if first & 0xfe00 == 0xfc00 {
                prop_assert_eq!(class, AddressClass::Private, "{}", ip);
            } else if first & 0xe000 != 0x2000 {
                // Reserved by the IETF, or a special-purpose row (SRv6 SIDs, 5f00::/16): never
                // an address any mode admits.
                prop_assert!(
                    denied || class == AddressClass::SpecialPurpose,
                    "outside 2000::/3: {ip} is {class:?}"
                );
            }
            if first == 0x2001 && v6.segments()[1] == 0xdb8 {
                prop_assert!(denied, "documentation {ip}");
            }
        }
    }
    Ok(())
}

/// Policies as permissive as configuration allows, each mode.
fn policies() -> Vec<Policy> {
    let settings = |mode: &'static str| corral_core::egress::EgressSettings {
        enabled: None,
        mode: Some(mode),
        allowed_ports: Some("1,80,443,65535"),
        private_cidrs: Some("10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,fc00::/7"),
        allowed_hosts: Some("a.example,10.1.2.3,[fd00::1],1.2.3.4"),
        token_ttl_seconds: None,
        proxy_address_present: true,
        field_key_present: true,
    };
    ["public_internet", "private_network", "host_allowlist"]
        .into_iter()
        .map(|mode| corral_core::egress::resolve(&settings(mode)).policy)
        .collect()
}

/// Checks every policy's decision on `target` with `answers`; returns how many allowed it.
fn check_decision(
    policies: &[Policy],
    target: &str,
    answers: &[IpAddr],
) -> Result<u32, TestCaseError> {
    let Ok(target) = parse_connect_authority(target) else {
        return Ok(0);
    };
    let mut allowed = 0;
    for policy in policies {
        let Decision::Allow { pinned } = decide_answer(policy, &target, answers) else {
            continue;
        };
        prop_assert!(policy.ports().is_some_and(|p| p.contains(pinned.port())));
        let judged: Vec<IpAddr> = target
            .host
            .ip()
            .map_or_else(|| answers.to_vec(), |ip| vec![ip]);
        prop_assert_eq!(Some(&pinned.ip()), judged.first());
        for ip in judged {
            let class = classify(ip).class;
            prop_assert!(
                matches!(class, AddressClass::GlobalUnicast | AddressClass::Private),
                "{policy} allowed {target} with {ip} ({class:?})"
            );
        }
        allowed += 1;
    }
    Ok(allowed)
}

fn address() -> impl Strategy<Value = IpAddr> {
    let special_v6 = (
        proptest::sample::select(vec![
            0u128,
            0xffff << 32,
            0xffff << 48,
            0x64_ff9b << 96,
            0x64_ff9b_0001 << 80,
            0x2002 << 112,
            0x2001 << 112,
            0xfe80 << 112,
            0xfc00 << 112,
            0xff02 << 112,
        ]),
        any::<u32>(),
    )
        .prop_map(|(prefix, low)| IpAddr::V6(Ipv6Addr::from_bits(prefix | u128::from(low))));
    prop_oneof![
        any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from_bits(b))),
        any::<u128>().prop_map(|b| IpAddr::V6(Ipv6Addr::from_bits(b))),
        special_v6,
    ]
}

fn run(cases: u32) {
    let policies = policies();
    assert!(
        policies
            .iter()
            .all(|p| p.mode() != corral_core::egress::Mode::Isolated)
    );
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        input(),
        proptest::collection::vec(address(), 0..4),
        address(),
    );
    let accepted = std::sync::atomic::AtomicU32::new(0);
    let urls = std::sync::atomic::AtomicU32::new(0);
    let allowed = std::sync::atomic::AtomicU32::new(0);
    let count = |counter: &std::sync::atomic::AtomicU32, n: u32| {
        counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    };
    runner
        .run(&strategy, |(text, answers, ip)| {
            if parse_connect_authority(&text).is_ok() {
                count(&accepted, 1);
            }
            check_authority(&text)?;
            count(&urls, check_url(&text)?);
            check_class(ip)?;
            count(&allowed, check_decision(&policies, &text, &answers)?);
            let literal_target = match ip {
                IpAddr::V4(v4) => format!("{v4}:443"),
                IpAddr::V6(v6) => format!("[{v6}]:443"),
            };
            count(&allowed, check_decision(&policies, &literal_target, &[])?);
            count(
                &allowed,
                check_decision(&policies, "a.example:443", &answers)?,
            );
            Ok(())
        })
        .unwrap();
    // The generator must reach the accepting paths, not only the refusals: otherwise the checks
    // of what parses and of what a policy allows never run.
    let (accepted, urls, allowed) = (
        accepted.into_inner(),
        urls.into_inner(),
        allowed.into_inner(),
    );
    eprintln!(
        "{accepted} of {cases} inputs parsed as CONNECT authorities; {urls} URLs parsed; {allowed} decisions allowed"
    );
    assert!(
        accepted > cases / 10,
        "only {accepted} of {cases} inputs parsed"
    );
    assert!(
        urls > cases / 10,
        "only {urls} URLs of {cases} inputs parsed"
    );
    assert!(allowed > 0, "no policy allowed any generated target");
}

#[test]
fn egress_parser_fuzz_short() {
    run(20_000);
}

#[test]
#[ignore = "long run: cargo test -p corral-egress-proxy --test egress_parser_fuzz -- --ignored"]
fn egress_parser_fuzz() {
    let cases = std::env::var("EGRESS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    run(cases);
}
