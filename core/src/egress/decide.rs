//! The decision (EGR-3): one pure function pair that the grant minter, the proxy and any worker
//! pre-check all call.
//!
//! Calling contract:
//! 1. [`decide_target`] judges what needs no DNS: the mode, the port, the allowlist, and an
//!    address literal. For a name it answers [`TargetDecision::NeedsResolution`] with the
//!    fully-qualified query (trailing dot, so no search list applies, BROW-4).
//! 2. The caller resolves that name itself, fresh for every new connection, and passes the
//!    complete answer set (A and AAAA together) to [`decide_answer`], which refuses the whole
//!    answer if any address is refused (EGR-2) and otherwise pins the first address.
//! 3. The caller connects to exactly the pinned [`SocketAddr`], never to the name.

use std::net::{IpAddr, SocketAddr};

use super::address::{AddressClass, classify};
use super::policy::Policy;
use super::reason::Reason;
use super::target::{DnsName, Host, Target};

/// The most addresses one answer may hold; a larger answer is refused, never truncated.
pub const DNS_ANSWERS_MAX: usize = 64;

/// The outcome for one connection.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Connect to exactly this address.
    Allow {
        /// The address and port to dial: the first address of the answer, or the literal.
        pinned: SocketAddr,
    },
    /// Refuse, with a stable reason.
    Deny {
        /// Why.
        reason: Reason,
        /// The first refused address, when an address was judged.
        address: Option<IpAddr>,
    },
}

impl Decision {
    fn deny(reason: Reason) -> Decision {
        Decision::Deny {
            reason,
            address: None,
        }
    }

    /// Whether the decision allows the connection.
    #[must_use]
    pub fn is_allow(&self) -> bool {
        match self {
            Decision::Allow { .. } => true,
            Decision::Deny { .. } => false,
        }
    }

    /// The refusal reason, if refused.
    #[must_use]
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Decision::Allow { .. } => None,
            Decision::Deny { reason, .. } => Some(*reason),
        }
    }
}

/// The outcome of judging a target before DNS.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TargetDecision {
    /// Resolve this name (as [`DnsName::to_fqdn`]) and call [`decide_answer`] with the answer.
    NeedsResolution {
        /// The name to resolve.
        name: DnsName,
    },
    /// Decided without DNS.
    Decided(Decision),
}

/// Judges a target under a policy as far as possible without DNS.
pub fn decide_target(policy: &Policy, target: &Target) -> TargetDecision {
    let ports = match policy {
        Policy::Isolated => return TargetDecision::Decided(Decision::deny(Reason::ModeIsolated)),
        Policy::PublicInternet { ports }
        | Policy::PrivateNetwork { ports, .. }
        | Policy::HostAllowlist { ports, .. } => ports,
    };
    if !ports.contains(target.port) {
        return TargetDecision::Decided(Decision::deny(Reason::PortNotAllowed));
    }
    match policy {
        Policy::HostAllowlist { hosts, .. } if !hosts.contains(&target.host) => {
            return TargetDecision::Decided(Decision::deny(Reason::HostNotAllowlisted));
        }
        Policy::Isolated
        | Policy::PublicInternet { .. }
        | Policy::PrivateNetwork { .. }
        | Policy::HostAllowlist { .. } => {}
    }
    let literal = match &target.host {
        Host::Name(name) => return TargetDecision::NeedsResolution { name: name.clone() },
        Host::Ipv4(v4) => IpAddr::V4(*v4),
        Host::Ipv6(v6) => IpAddr::V6(*v6),
    };
    TargetDecision::Decided(judge_answer(policy, &[literal], target.port))
}

/// Judges a target with the complete DNS answer for its name. For an address literal the answer
/// is ignored and the literal is judged. Refuses an empty answer, an answer larger than
/// [`DNS_ANSWERS_MAX`], and any answer holding a refused address (EGR-2).
pub fn decide_answer(policy: &Policy, target: &Target, answers: &[IpAddr]) -> Decision {
    match decide_target(policy, target) {
        TargetDecision::Decided(decision) => decision,
        TargetDecision::NeedsResolution { .. } => judge_answer(policy, answers, target.port),
    }
}

/// Judges one address under a policy, ignoring ports and hosts: the address rule alone.
pub fn judge_address(policy: &Policy, ip: IpAddr) -> Result<(), Reason> {
    let class = classify(ip).class;
    match (class, policy) {
        (_, Policy::Isolated) => Err(Reason::ModeIsolated),
        (AddressClass::AlwaysDenied, _) => Err(Reason::AddressAlwaysDenied),
        (AddressClass::EmbedsIpv4, _) => Err(Reason::AddressEmbeddedIpv4),
        (AddressClass::SpecialPurpose, _) => Err(Reason::AddressSpecialPurpose),
        (AddressClass::Private, Policy::PublicInternet { .. }) => {
            Err(Reason::AddressPrivateNotConfigured)
        }
        (
            AddressClass::Private,
            Policy::PrivateNetwork { cidrs, .. } | Policy::HostAllowlist { cidrs, .. },
        ) => {
            if cidrs.contains(ip) {
                Ok(())
            } else {
                Err(Reason::AddressPrivateNotConfigured)
            }
        }
        (
            AddressClass::GlobalUnicast,
            Policy::PublicInternet { .. } | Policy::HostAllowlist { .. },
        ) => Ok(()),
        (AddressClass::GlobalUnicast, Policy::PrivateNetwork { .. }) => {
            Err(Reason::AddressPublicNotAllowed)
        }
    }
}

fn judge_answer(policy: &Policy, answers: &[IpAddr], port: u16) -> Decision {
    let Some(first) = answers.first() else {
        return Decision::deny(Reason::DnsEmptyAnswer);
    };
    if answers.len() > DNS_ANSWERS_MAX {
        return Decision::deny(Reason::DnsAnswerTooLarge);
    }
    let mut any_allowed = false;
    let mut first_refusal: Option<(Reason, IpAddr)> = None;
    for ip in answers {
        match judge_address(policy, *ip) {
            Ok(()) => any_allowed = true,
            Err(reason) => {
                first_refusal.get_or_insert((reason, *ip));
            }
        }
    }
    match (first_refusal, any_allowed) {
        (None, _) => Decision::Allow {
            pinned: SocketAddr::new(*first, port),
        },
        (Some((_, address)), true) => Decision::Deny {
            reason: Reason::DnsMixedAnswer,
            address: Some(address),
        },
        (Some((reason, address)), false) => Decision::Deny {
            reason,
            address: Some(address),
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::egress::address::{Cidr, IPV4_ROWS, IPV6_ROWS, private_blocks};
    use crate::egress::policy::{AllowedHosts, AllowedPorts, PrivateCidrs};
    use crate::egress::target::parse_connect_authority;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// Every private block configured: the most permissive configuration there is.
    pub(crate) fn all_private() -> PrivateCidrs {
        PrivateCidrs::new(private_blocks()).unwrap()
    }

    /// One policy per mode, each as permissive as configuration allows.
    pub(crate) fn permissive_policies(hosts: &[&str]) -> Vec<Policy> {
        let ports = AllowedPorts::web_default();
        let hosts = AllowedHosts::parse_list(&hosts.join(",")).unwrap();
        vec![
            Policy::Isolated,
            Policy::PublicInternet {
                ports: ports.clone(),
            },
            Policy::PrivateNetwork {
                ports: ports.clone(),
                cidrs: all_private(),
            },
            Policy::HostAllowlist {
                ports,
                hosts,
                cidrs: all_private(),
            },
        ]
    }

    /// The verdict for one address class, checked in every mode under the most permissive
    /// configuration, both as a literal target and as a one-address DNS answer.
    pub(crate) fn assert_class_verdict_in_every_mode(probe: IpAddr, class: AddressClass) {
        let literal = match probe {
            IpAddr::V4(v4) => Host::Ipv4(v4),
            IpAddr::V6(v6) => Host::Ipv6(v6),
        };
        let literal_target = Target {
            host: literal.clone(),
            port: 443,
        };
        let name_target = parse_connect_authority("service.example:443").unwrap();
        let hosts = [literal.to_string(), "service.example".to_owned()];
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        for policy in permissive_policies(&hosts) {
            for target in [&literal_target, &name_target] {
                let decision = decide_answer(&policy, target, &[probe]);
                let expected = match (class, policy.mode()) {
                    (_, crate::egress::policy::Mode::Isolated) => Err(Reason::ModeIsolated),
                    (AddressClass::AlwaysDenied, _) => Err(Reason::AddressAlwaysDenied),
                    (AddressClass::EmbedsIpv4, _) => Err(Reason::AddressEmbeddedIpv4),
                    (AddressClass::SpecialPurpose, _) => Err(Reason::AddressSpecialPurpose),
                    (AddressClass::Private, crate::egress::policy::Mode::PublicInternet) => {
                        Err(Reason::AddressPrivateNotConfigured)
                    }
                    (AddressClass::Private, _) => Ok(()),
                    (AddressClass::GlobalUnicast, crate::egress::policy::Mode::PrivateNetwork) => {
                        Err(Reason::AddressPublicNotAllowed)
                    }
                    (AddressClass::GlobalUnicast, _) => Ok(()),
                };
                match expected {
                    Ok(()) => assert_eq!(
                        decision,
                        Decision::Allow {
                            pinned: SocketAddr::new(probe, 443)
                        },
                        "{probe} in {policy} via {target}"
                    ),
                    Err(reason) => assert_eq!(
                        decision.reason(),
                        Some(reason),
                        "{probe} in {policy} via {target}"
                    ),
                }
            }
        }
    }

    fn public() -> Policy {
        Policy::PublicInternet {
            ports: AllowedPorts::web_default(),
        }
    }

    fn target(text: &str) -> Target {
        parse_connect_authority(text).unwrap()
    }

    #[test]
    fn egr_01_isolated_denies_everything() {
        for t in ["example.com:443", "8.8.8.8:443", "[2606:4700::1111]:443"] {
            assert_eq!(
                decide_target(&Policy::Isolated, &target(t)),
                TargetDecision::Decided(Decision::deny(Reason::ModeIsolated))
            );
            assert_eq!(
                decide_answer(&Policy::Isolated, &target(t), &[ip("8.8.8.8")]).reason(),
                Some(Reason::ModeIsolated)
            );
        }
    }

    #[test]
    fn egr_01_only_allowed_ports() {
        assert_eq!(
            decide_answer(&public(), &target("8.8.8.8:22"), &[]).reason(),
            Some(Reason::PortNotAllowed)
        );
        assert_eq!(
            decide_answer(&public(), &target("example.com:8443"), &[ip("8.8.8.8")]).reason(),
            Some(Reason::PortNotAllowed)
        );
        assert!(decide_answer(&public(), &target("8.8.8.8:80"), &[]).is_allow());
    }

    #[test]
    fn brow_04_names_resolve_fully_qualified() {
        let TargetDecision::NeedsResolution { name } =
            decide_target(&public(), &target("Example.COM.:443"))
        else {
            panic!("needs resolution");
        };
        assert_eq!(name.to_fqdn(), "example.com.");
    }

    #[test]
    fn egr_02_pins_the_first_address() {
        let answers = [ip("93.184.216.34"), ip("2606:2800:220:1::1")];
        assert_eq!(
            decide_answer(&public(), &target("example.com:443"), &answers),
            Decision::Allow {
                pinned: SocketAddr::new(answers[0], 443)
            }
        );
    }

    #[test]
    fn egr_02_mixed_answer_is_refused() {
        for bad in [
            "127.0.0.1",
            "10.0.0.1",
            "169.254.169.254",
            "::1",
            "::ffff:127.0.0.1",
            "fd00::1",
        ] {
            let answers = [ip("93.184.216.34"), ip(bad)];
            assert_eq!(
                decide_answer(&public(), &target("example.com:443"), &answers),
                Decision::Deny {
                    reason: Reason::DnsMixedAnswer,
                    address: Some(ip(bad))
                },
                "{bad}"
            );
            let reversed = [ip(bad), ip("93.184.216.34")];
            assert_eq!(
                decide_answer(&public(), &target("example.com:443"), &reversed).reason(),
                Some(Reason::DnsMixedAnswer)
            );
        }
    }

    #[test]
    fn egr_02_wholly_refused_answer_reports_the_first_address_reason() {
        let answers = [ip("127.0.0.1"), ip("10.0.0.1")];
        assert_eq!(
            decide_answer(&public(), &target("example.com:443"), &answers),
            Decision::Deny {
                reason: Reason::AddressAlwaysDenied,
                address: Some(ip("127.0.0.1"))
            }
        );
    }

    #[test]
    fn egr_02_empty_and_oversized_answers_are_refused() {
        assert_eq!(
            decide_answer(&public(), &target("example.com:443"), &[]).reason(),
            Some(Reason::DnsEmptyAnswer)
        );
        let many = vec![ip("8.8.8.8"); DNS_ANSWERS_MAX + 1];
        assert_eq!(
            decide_answer(&public(), &target("example.com:443"), &many).reason(),
            Some(Reason::DnsAnswerTooLarge)
        );
        let enough = vec![ip("8.8.8.8"); DNS_ANSWERS_MAX];
        assert!(decide_answer(&public(), &target("example.com:443"), &enough).is_allow());
    }

    #[test]
    fn an_address_literal_ignores_any_answer() {
        let d = decide_answer(&public(), &target("127.0.0.1:443"), &[ip("8.8.8.8")]);
        assert_eq!(d.reason(), Some(Reason::AddressAlwaysDenied));
        let d = decide_answer(&public(), &target("8.8.8.8:443"), &[ip("127.0.0.1")]);
        assert_eq!(
            d,
            Decision::Allow {
                pinned: SocketAddr::new(ip("8.8.8.8"), 443)
            }
        );
    }

    #[test]
    fn egr_02_embedded_ipv4_is_refused_even_when_the_ipv4_is_public() {
        let forms = [
            "::ffff:8.8.8.8",
            "::ffff:127.0.0.1",
            "::8.8.8.8",
            "::127.0.0.1",
            "::ffff:0:808:808",
            "64:ff9b::808:808",
            "64:ff9b::7f00:1",
            "64:ff9b:1::808:808",
            "2002:808:808::1",
            "2002:7f00:1::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ];
        for text in forms {
            for policy in permissive_policies(&["service.example"]) {
                let d = decide_answer(&policy, &target("service.example:443"), &[ip(text)]);
                assert!(!d.is_allow(), "{text} in {policy}");
            }
            assert_eq!(
                judge_address(&public(), ip(text)),
                Err(Reason::AddressEmbeddedIpv4),
                "{text}"
            );
        }
    }

    #[test]
    fn egr_01_private_network_admits_only_configured_private_cidrs() {
        let policy = Policy::PrivateNetwork {
            ports: AllowedPorts::web_default(),
            cidrs: PrivateCidrs::parse_list("10.1.0.0/16,fd00:1::/32").unwrap(),
        };
        assert!(decide_answer(&policy, &target("10.1.2.3:443"), &[]).is_allow());
        assert!(decide_answer(&policy, &target("[fd00:1::5]:443"), &[]).is_allow());
        assert_eq!(
            decide_answer(&policy, &target("10.2.0.1:443"), &[]).reason(),
            Some(Reason::AddressPrivateNotConfigured)
        );
        assert_eq!(
            decide_answer(&policy, &target("192.168.0.1:443"), &[]).reason(),
            Some(Reason::AddressPrivateNotConfigured)
        );
        assert_eq!(
            decide_answer(&policy, &target("8.8.8.8:443"), &[]).reason(),
            Some(Reason::AddressPublicNotAllowed)
        );
        assert_eq!(
            decide_answer(&policy, &target("127.0.0.1:443"), &[]).reason(),
            Some(Reason::AddressAlwaysDenied)
        );
        assert_eq!(
            decide_answer(&policy, &target("db.internal:443"), &[ip("10.1.0.9")]),
            Decision::Allow {
                pinned: SocketAddr::new(ip("10.1.0.9"), 443)
            }
        );
    }

    #[test]
    fn egr_01_host_allowlist_is_exact_and_checks_the_answer() {
        let policy = Policy::HostAllowlist {
            ports: AllowedPorts::web_default(),
            hosts: AllowedHosts::parse_list("pypi.org,files.pythonhosted.org").unwrap(),
            cidrs: PrivateCidrs::parse_list("10.9.0.0/16").unwrap(),
        };
        assert!(matches!(
            decide_target(&policy, &target("PyPI.org.:443")),
            TargetDecision::NeedsResolution { .. }
        ));
        for other in [
            "evil.pypi.org:443",
            "pypi.org.evil.com:443",
            "pypi.or:443",
            "151.101.0.223:443",
        ] {
            assert_eq!(
                decide_answer(&policy, &target(other), &[ip("151.101.0.223")]).reason(),
                Some(Reason::HostNotAllowlisted),
                "{other}"
            );
        }
        assert!(decide_answer(&policy, &target("pypi.org:443"), &[ip("151.101.0.223")]).is_allow());
        assert!(decide_answer(&policy, &target("pypi.org:443"), &[ip("10.9.1.1")]).is_allow());
        assert_eq!(
            decide_answer(&policy, &target("pypi.org:443"), &[ip("10.8.1.1")]).reason(),
            Some(Reason::AddressPrivateNotConfigured)
        );
        assert_eq!(
            decide_answer(&policy, &target("pypi.org:443"), &[ip("127.0.0.1")]).reason(),
            Some(Reason::AddressAlwaysDenied)
        );
        assert_eq!(
            decide_answer(&policy, &target("pypi.org:443"), &[ip("169.254.169.254")]).reason(),
            Some(Reason::AddressAlwaysDenied)
        );
    }

    #[test]
    fn configured_ranges_never_reopen_always_denied_addresses() {
        // Even a hand-built policy cannot hold a non-private CIDR: the constructor refuses it.
        assert!(PrivateCidrs::new([Cidr::parse("127.0.0.0/8").unwrap()]).is_err());
        assert!(PrivateCidrs::new([Cidr::parse("0.0.0.0/0").unwrap()]).is_err());
        for row in IPV4_ROWS.iter().chain(IPV6_ROWS.iter()) {
            if row.class == AddressClass::Private {
                continue;
            }
            for policy in permissive_policies(&["service.example"]) {
                assert!(
                    judge_address(&policy, row.block.addr()).is_err(),
                    "{} in {policy}",
                    row.block
                );
            }
        }
    }
}
