//! The policy a decision is made under: a mode with exactly the data that mode uses.
//!
//! A [`Policy`] comes either from [`super::mode::resolve`] (the deployment's configuration, for
//! the minter and any worker pre-check) or from a verified grant (for the proxy). Its parts are
//! checked on construction: ports are 1-65535 and bounded in number, private CIDRs lie wholly
//! inside a private block (a configured `8.8.8.0/24` or `0.0.0.0/0` is refused, never widened
//! into admitting public or always-denied addresses), allowlisted hosts are canonical.

use std::collections::BTreeSet;
use std::fmt;

use super::address::{Cidr, CidrError};
use super::reason::Reason;
use super::target::Host;

/// The most ports a policy may allow.
pub const ALLOWED_PORTS_MAX: usize = 64;
/// The most private CIDRs a policy may hold.
pub const PRIVATE_CIDRS_MAX: usize = 64;
/// The most hosts an allowlist may hold: as many as a grant's claims can count (one byte). The
/// list's text is bounded too ([`SETTING_LIST_MAX_BYTES`]), and a policy whose grant would not fit
/// in one header is refused at minting, never truncated.
pub const ALLOWED_HOSTS_MAX: usize = 255;
/// The longest configuration list text we read.
pub const SETTING_LIST_MAX_BYTES: usize = 16 * 1024;

/// Why a part of a policy was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyError {
    /// A port list with no port.
    PortsEmpty,
    /// More ports than [`ALLOWED_PORTS_MAX`].
    TooManyPorts,
    /// A port that is not 1-65535 in plain decimal.
    BadPort,
    /// More private CIDRs than [`PRIVATE_CIDRS_MAX`].
    TooManyCidrs,
    /// A CIDR that does not parse.
    BadCidr(CidrError),
    /// A CIDR that is not wholly inside a private block.
    CidrNotPrivate,
    /// More hosts than [`ALLOWED_HOSTS_MAX`].
    TooManyHosts,
    /// A host that does not parse (the reason says why).
    BadHost(Reason),
    /// A list longer than [`SETTING_LIST_MAX_BYTES`], or with an empty item.
    BadList,
}

/// An egress mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Nothing is reachable.
    Isolated,
    /// Public global addresses on allowed ports.
    PublicInternet,
    /// Only configured private CIDRs.
    PrivateNetwork,
    /// Exact configured hosts, resolved and checked on every connection.
    HostAllowlist,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 4] = [
        Mode::Isolated,
        Mode::PublicInternet,
        Mode::PrivateNetwork,
        Mode::HostAllowlist,
    ];

    /// The mode's exact spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Isolated => "isolated",
            Mode::PublicInternet => "public_internet",
            Mode::PrivateNetwork => "private_network",
            Mode::HostAllowlist => "host_allowlist",
        }
    }

    /// The mode spelled exactly so, or `None`: no case folding, no trimming.
    #[must_use]
    pub fn parse(text: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|mode| mode.as_str() == text)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The ports a policy allows: 1-65535, at least one, at most [`ALLOWED_PORTS_MAX`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllowedPorts(BTreeSet<u16>);

impl AllowedPorts {
    /// The default: 80 and 443 (EGR-1).
    #[must_use]
    pub fn web_default() -> AllowedPorts {
        AllowedPorts(BTreeSet::from([80, 443]))
    }

    /// Ports from values; refuses none, port 0 and too many.
    pub fn new(ports: impl IntoIterator<Item = u16>) -> Result<AllowedPorts, PolicyError> {
        let mut set = BTreeSet::new();
        for port in ports {
            if port == 0 {
                return Err(PolicyError::BadPort);
            }
            set.insert(port);
            if set.len() > ALLOWED_PORTS_MAX {
                return Err(PolicyError::TooManyPorts);
            }
        }
        if set.is_empty() {
            return Err(PolicyError::PortsEmpty);
        }
        Ok(AllowedPorts(set))
    }

    /// Parses a comma-separated list (`80,443`; spaces around items allowed). Any bad item
    /// refuses the whole list.
    pub fn parse_list(text: &str) -> Result<AllowedPorts, PolicyError> {
        let mut ports = Vec::new();
        for item in split_list(text)? {
            let ok = !item.is_empty()
                && item.len() <= 5
                && item.bytes().all(|b| b.is_ascii_digit())
                && !item.starts_with('0');
            if !ok {
                return Err(PolicyError::BadPort);
            }
            let port: u16 = item.parse().map_err(|_| PolicyError::BadPort)?;
            ports.push(port);
            if ports.len() > ALLOWED_PORTS_MAX {
                return Err(PolicyError::TooManyPorts);
            }
        }
        AllowedPorts::new(ports)
    }

    /// Whether `port` is allowed.
    #[must_use]
    pub fn contains(&self, port: u16) -> bool {
        self.0.contains(&port)
    }

    /// The ports in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().copied()
    }
}

/// Private CIDRs: each wholly inside a private block, at most [`PRIVATE_CIDRS_MAX`]. May be empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PrivateCidrs(BTreeSet<Cidr>);

impl PrivateCidrs {
    /// No CIDRs.
    #[must_use]
    pub fn empty() -> PrivateCidrs {
        PrivateCidrs(BTreeSet::new())
    }

    /// CIDRs from values; refuses any that is not private, and too many.
    pub fn new(cidrs: impl IntoIterator<Item = Cidr>) -> Result<PrivateCidrs, PolicyError> {
        let mut set = BTreeSet::new();
        for cidr in cidrs {
            if !cidr.is_private() {
                return Err(PolicyError::CidrNotPrivate);
            }
            set.insert(cidr);
            if set.len() > PRIVATE_CIDRS_MAX {
                return Err(PolicyError::TooManyCidrs);
            }
        }
        Ok(PrivateCidrs(set))
    }

    /// Parses a comma-separated list; empty text is an empty list. Any bad item refuses all.
    pub fn parse_list(text: &str) -> Result<PrivateCidrs, PolicyError> {
        let mut cidrs = Vec::new();
        for item in split_list(text)? {
            cidrs.push(Cidr::parse(item).map_err(PolicyError::BadCidr)?);
            if cidrs.len() > PRIVATE_CIDRS_MAX {
                return Err(PolicyError::TooManyCidrs);
            }
        }
        PrivateCidrs::new(cidrs)
    }

    /// Whether any CIDR holds `ip`.
    #[must_use]
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        self.0.iter().any(|cidr| cidr.contains(ip))
    }

    /// Whether there is no CIDR.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The CIDRs in order.
    pub fn iter(&self) -> impl Iterator<Item = &Cidr> + '_ {
        self.0.iter()
    }
}

/// Exact hosts for `host_allowlist`, canonical, at most [`ALLOWED_HOSTS_MAX`]. May be empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllowedHosts(BTreeSet<Host>);

impl AllowedHosts {
    /// Hosts from values; refuses too many.
    pub fn new(hosts: impl IntoIterator<Item = Host>) -> Result<AllowedHosts, PolicyError> {
        let mut set = BTreeSet::new();
        for host in hosts {
            set.insert(host);
            if set.len() > ALLOWED_HOSTS_MAX {
                return Err(PolicyError::TooManyHosts);
            }
        }
        Ok(AllowedHosts(set))
    }

    /// Parses a comma-separated list of exact hosts (names, IPv4, bracketed IPv6; no wildcards,
    /// no ports); empty text is an empty list. Any bad item refuses all.
    pub fn parse_list(text: &str) -> Result<AllowedHosts, PolicyError> {
        let mut hosts = Vec::new();
        for item in split_list(text)? {
            hosts.push(Host::parse(item).map_err(PolicyError::BadHost)?);
            if hosts.len() > ALLOWED_HOSTS_MAX {
                return Err(PolicyError::TooManyHosts);
            }
        }
        AllowedHosts::new(hosts)
    }

    /// Whether `host` is one of the hosts (canonical forms compare exactly).
    #[must_use]
    pub fn contains(&self, host: &Host) -> bool {
        self.0.contains(host)
    }

    /// Whether there is no host.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The hosts in order.
    pub fn iter(&self) -> impl Iterator<Item = &Host> + '_ {
        self.0.iter()
    }

    /// The hosts present in both sets.
    #[must_use]
    pub fn intersection(&self, other: &AllowedHosts) -> AllowedHosts {
        AllowedHosts(self.0.intersection(&other.0).cloned().collect())
    }
}

/// The policy in force for one run: the mode and exactly the data it uses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Nothing is reachable.
    Isolated,
    /// Global unicast addresses on the allowed ports.
    PublicInternet {
        /// The allowed ports.
        ports: AllowedPorts,
    },
    /// Only addresses inside the configured private CIDRs, on the allowed ports.
    PrivateNetwork {
        /// The allowed ports.
        ports: AllowedPorts,
        /// The private ranges that may be reached.
        cidrs: PrivateCidrs,
    },
    /// Only the exact hosts, resolved on every connection; their answers must be global unicast
    /// or inside the configured private CIDRs.
    HostAllowlist {
        /// The allowed ports.
        ports: AllowedPorts,
        /// The exact hosts.
        hosts: AllowedHosts,
        /// Private ranges an allowlisted host's answer may fall in.
        cidrs: PrivateCidrs,
    },
}

impl Policy {
    /// The mode of this policy.
    #[must_use]
    pub fn mode(&self) -> Mode {
        match self {
            Policy::Isolated => Mode::Isolated,
            Policy::PublicInternet { .. } => Mode::PublicInternet,
            Policy::PrivateNetwork { .. } => Mode::PrivateNetwork,
            Policy::HostAllowlist { .. } => Mode::HostAllowlist,
        }
    }

    /// The allowed ports, or `None` in `isolated`.
    #[must_use]
    pub fn ports(&self) -> Option<&AllowedPorts> {
        match self {
            Policy::Isolated => None,
            Policy::PublicInternet { ports }
            | Policy::PrivateNetwork { ports, .. }
            | Policy::HostAllowlist { ports, .. } => Some(ports),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mode().as_str())
    }
}

/// Splits a comma-separated setting: empty (or blank) text is no item; items are trimmed of
/// spaces and tabs; an empty item (`80,,443`, a trailing comma) refuses the list.
fn split_list(text: &str) -> Result<Vec<&str>, PolicyError> {
    if text.len() > SETTING_LIST_MAX_BYTES {
        return Err(PolicyError::BadList);
    }
    if text.trim_matches([' ', '\t']).is_empty() {
        return Ok(Vec::new());
    }
    let items: Vec<&str> = text
        .split(',')
        .map(|item| item.trim_matches([' ', '\t']))
        .collect();
    if items.iter().any(|item| item.is_empty()) {
        return Err(PolicyError::BadList);
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egr_01_default_ports_are_80_and_443() {
        let ports = AllowedPorts::web_default();
        assert_eq!(ports.iter().collect::<Vec<_>>(), vec![80, 443]);
    }

    #[test]
    fn port_lists_are_strict() {
        assert_eq!(
            AllowedPorts::parse_list("80, 443 ,8080")
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
            vec![80, 443, 8080]
        );
        assert_eq!(
            AllowedPorts::parse_list("443,443").unwrap().iter().count(),
            1
        );
        for bad in [
            "", " ", "0", "080", "+80", "-1", "65536", "80,,443", "80,", "http", "80;443", "1e3",
        ] {
            assert!(AllowedPorts::parse_list(bad).is_err(), "{bad:?}");
        }
        let many: Vec<String> = (1..=65).map(|p| p.to_string()).collect();
        assert_eq!(
            AllowedPorts::parse_list(&many.join(",")),
            Err(PolicyError::TooManyPorts)
        );
    }

    #[test]
    fn configured_cidrs_that_are_not_private_are_refused() {
        for bad in [
            "8.8.8.0/24",
            "0.0.0.0/0",
            "::/0",
            "127.0.0.0/8",
            "169.254.169.254/32",
            "10.0.0.0/7",
            "fe80::/64",
        ] {
            assert_eq!(
                PrivateCidrs::parse_list(bad),
                Err(PolicyError::CidrNotPrivate),
                "{bad}"
            );
        }
        assert_eq!(
            PrivateCidrs::parse_list("10.1.0.0/16, 8.8.8.0/24"),
            Err(PolicyError::CidrNotPrivate)
        );
        assert!(PrivateCidrs::parse_list("10.1.0.0/16,fd00::/8").is_ok());
        assert!(PrivateCidrs::parse_list("").unwrap().is_empty());
        assert!(matches!(
            PrivateCidrs::parse_list("10.1.0.1/16"),
            Err(PolicyError::BadCidr(_))
        ));
    }

    #[test]
    fn allowlist_entries_are_canonical_and_exact() {
        let hosts = AllowedHosts::parse_list("PyPI.org., files.pythonhosted.org").unwrap();
        assert!(hosts.contains(&Host::parse("pypi.org").unwrap()));
        assert!(!hosts.contains(&Host::parse("evil.pypi.org").unwrap()));
        assert!(matches!(
            AllowedHosts::parse_list("*.pypi.org"),
            Err(PolicyError::BadHost(_))
        ));
        assert!(matches!(
            AllowedHosts::parse_list("pypi.org:443"),
            Err(PolicyError::BadHost(_))
        ));
    }
}
