//! Property tests of the decision, the parsers and the grants.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::address::{AddressClass, Cidr, IPV4_ROWS, IPV6_GLOBAL_UNICAST, IPV6_ROWS, classify};
use super::decide::{Decision, decide_answer, judge_address};
use super::grant::tests::{FIELD_KEY, request, signer};
use super::policy::{AllowedHosts, AllowedPorts, Policy, PrivateCidrs};
use super::reason::Reason;
use super::target::{Host, Target, parse_absolute_url, parse_connect_authority};
use crate::ids::ActorId;
use crate::time::UnixMillis;

/// Rows whose addresses no configuration may admit.
fn denied_rows() -> Vec<Cidr> {
    IPV4_ROWS
        .iter()
        .chain(IPV6_ROWS.iter())
        .filter(|row| {
            matches!(
                row.class,
                AddressClass::AlwaysDenied
                    | AddressClass::EmbedsIpv4
                    | AddressClass::SpecialPurpose
            )
        })
        .map(|row| row.block)
        .collect()
}

/// An address inside `block`, the low bits taken from `bits`.
fn inside(block: Cidr, bits: u128) -> IpAddr {
    match block.addr() {
        IpAddr::V4(net) => {
            let host_mask = u32::MAX
                .checked_shr(u32::from(block.prefix_len()))
                .unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from_bits(
                net.to_bits() | (bits as u32 & host_mask),
            ))
        }
        IpAddr::V6(net) => {
            let host_mask = u128::MAX
                .checked_shr(u32::from(block.prefix_len()))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from_bits(net.to_bits() | (bits & host_mask)))
        }
    }
}

/// An address no policy may admit: inside a denied row, or IPv6 outside 2000::/3 and every row.
/// (Combinators rather than `prop_oneof!`, which holds an `Arc` this crate's lints refuse.)
fn denied_address() -> impl Strategy<Value = IpAddr> {
    let rows = denied_rows();
    (any::<bool>(), 0..rows.len(), any::<u128>()).prop_filter_map(
        "a denied address",
        move |(in_row, i, bits)| {
            if in_row {
                return Some(inside(rows[i], bits));
            }
            let ip = IpAddr::V6(Ipv6Addr::from_bits(bits));
            let reserved =
                !IPV6_GLOBAL_UNICAST.contains(ip) && classify(ip).class != AddressClass::Private;
            reserved.then_some(ip)
        },
    )
}

fn any_address() -> impl Strategy<Value = IpAddr> {
    (0u8..3, any::<u32>(), any::<u128>(), denied_address()).prop_map(|(kind, v4, v6, denied)| {
        match kind {
            0 => IpAddr::V4(Ipv4Addr::from_bits(v4)),
            1 => IpAddr::V6(Ipv6Addr::from_bits(v6)),
            _ => denied,
        }
    })
}

/// Any CIDR a configuration could try; the constructor keeps only private ones.
fn configured_cidrs() -> impl Strategy<Value = PrivateCidrs> {
    let candidate = (any_address(), 0u8..=128).prop_filter_map("valid cidr", |(ip, len)| {
        let len = match ip {
            IpAddr::V4(_) => len % 33,
            IpAddr::V6(_) => len,
        };
        let mask_to = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from_bits(
                v4.to_bits() & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0),
            )),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(
                v6.to_bits() & u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0),
            )),
        };
        Cidr::new(mask_to(ip), len).ok()
    });
    (proptest::collection::vec(candidate, 0..8), any::<bool>()).prop_map(|(cidrs, all_private)| {
        let mut kept: Vec<Cidr> = cidrs.into_iter().filter(Cidr::is_private).collect();
        if all_private {
            kept.extend(super::address::private_blocks());
        }
        PrivateCidrs::new(kept).unwrap_or_default()
    })
}

fn any_policy(target: Target) -> impl Strategy<Value = Policy> {
    let host = target.host.to_string();
    let port = target.port;
    let ports = proptest::collection::vec(1u16..=u16::MAX, 0..4).prop_map(move |mut ports| {
        ports.push(port);
        AllowedPorts::new(ports).unwrap()
    });
    (0u8..4, ports, configured_cidrs()).prop_map(move |(mode, ports, cidrs)| match mode {
        0 => Policy::Isolated,
        1 => Policy::PublicInternet { ports },
        2 => Policy::PrivateNetwork { ports, cidrs },
        _ => Policy::HostAllowlist {
            ports,
            hosts: AllowedHosts::parse_list(&host).unwrap(),
            cidrs,
        },
    })
}

fn name_target() -> Target {
    parse_connect_authority("service.example:443").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// EGR-2: no mode, port list, configured CIDRs or allowlist ever admits an address of an
    /// always-denied, embedded-IPv4 or special-purpose class, alone or among good addresses.
    #[test]
    fn egr_02_no_input_allows_a_denied_address(
        policy in any_policy(name_target()),
        bad in denied_address(),
        good in proptest::collection::vec(any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from_bits(b))), 0..4),
        position in any::<usize>(),
    ) {
        prop_assert!(judge_address(&policy, bad).is_err());
        let mut answers = good;
        let at = position % (answers.len() + 1);
        answers.insert(at, bad);
        let decision = decide_answer(&policy, &name_target(), &answers);
        prop_assert!(!decision.is_allow(), "{:?} admitted {}", policy, bad);
        let literal = Target {
            host: match bad { IpAddr::V4(v4) => Host::Ipv4(v4), IpAddr::V6(v6) => Host::Ipv6(v6) },
            port: 443,
        };
        let literal_policy = match policy {
            Policy::HostAllowlist { ports, cidrs, .. } => Policy::HostAllowlist {
                ports,
                cidrs,
                hosts: AllowedHosts::new([literal.host.clone()]).unwrap(),
            },
            other => other,
        };
        prop_assert!(!decide_answer(&literal_policy, &literal, &[]).is_allow());
    }

    /// An allow pins the first answer, and every answer is admissible by class and configuration.
    #[test]
    fn allow_means_every_answer_is_admissible(
        policy in any_policy(name_target()),
        answers in proptest::collection::vec(any_address(), 0..6),
    ) {
        let decision = decide_answer(&policy, &name_target(), &answers);
        if let Decision::Allow { pinned } = decision {
            prop_assert_eq!(pinned.ip(), answers[0]);
            prop_assert_eq!(pinned.port(), 443);
            for ip in &answers {
                let class = classify(*ip).class;
                let admissible = match (&policy, class) {
                    (Policy::PublicInternet { .. } | Policy::HostAllowlist { .. }, AddressClass::GlobalUnicast) => true,
                    (Policy::PrivateNetwork { cidrs, .. } | Policy::HostAllowlist { cidrs, .. }, AddressClass::Private) => cidrs.contains(*ip),
                    _ => false,
                };
                prop_assert!(admissible, "{:?} admitted {} of class {:?}", policy, ip, class);
            }
        }
    }

    /// Parsers never panic, and what they accept prints back to a spelling they accept as the same.
    #[test]
    fn parsers_are_total_and_canonical(text in "\\PC{0,40}|[a-zA-Z0-9.:\\[\\]@%_-]{0,40}") {
        if let Ok(target) = parse_connect_authority(&text) {
            prop_assert_eq!(parse_connect_authority(&target.to_string()), Ok(target));
        }
        let url = format!("http://{text}");
        if let Ok(parsed) = parse_absolute_url(&url) {
            let again = parse_absolute_url(&format!("http://{}{}", parsed.target, parsed.origin_form));
            prop_assert_eq!(again.map(|r| r.target), Ok(parsed.target));
        }
    }

    /// Every other numeric spelling of an IPv4 address is refused as a target.
    #[test]
    fn numeric_spellings_are_refused(bits in any::<u32>()) {
        let [a, b, c, d] = bits.to_be_bytes();
        let spellings = [
            format!("{bits}"),
            format!("0x{bits:x}"),
            format!("0{a:o}.{b}.{c}.{d}"),
            format!("0x{a:x}.{b}.{c}.{d}"),
            format!("{a}.{}", u32::from_be_bytes([0, b, c, d])),
            format!("{a}.{b}.{}", u16::from_be_bytes([c, d])),
            format!("{a}.{b}.{c}.{d}."),
            format!("{a}.{b}.{c}.0{d}"),
        ];
        for spelling in spellings {
            prop_assert_eq!(parse_connect_authority(&format!("{spelling}:443")), Err(Reason::AuthorityNumericSpelling), "{}", spelling);
        }
        let canonical = format!("{a}.{b}.{c}.{d}:443");
        prop_assert!(parse_connect_authority(&canonical).is_ok());
    }

    /// Changing any character of a grant never yields a grant that verifies.
    #[test]
    fn egr_02_any_change_to_a_grant_is_refused(index in any::<usize>(), replacement in "[A-Za-z0-9_.-]") {
        let actor = ActorId("member:bob".to_owned());
        let policy = Policy::PublicInternet { ports: AllowedPorts::web_default() };
        let token = signer().mint(&request(&policy, &actor)).unwrap().token;
        let at = index % token.len();
        let mut changed = token.clone().into_bytes();
        changed[at] = replacement.as_bytes()[0];
        let changed = String::from_utf8(changed).unwrap();
        prop_assume!(changed != token);
        let verifier = super::grant::GrantSigner::from_field_key(FIELD_KEY).unwrap().verifier();
        prop_assert!(verifier.verify(&changed, UnixMillis(1_000_001)).is_err());
    }
}
