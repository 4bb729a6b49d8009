//! Address classes as data: every row of the IANA IPv4 and IPv6 special-purpose address
//! registries, plus the few blocks the decision must also refuse, each with its verdict.
//!
//! # Snapshot
//! Assembled on 2026-12-02 ([`REGISTRY_SNAPSHOT`]) from the IANA IPv4 and IPv6 Special-Purpose
//! Address Registries. The newest copy of the IPv6 registry found says "Last Updated 2025-10-09"
//! ([`REGISTRY_LAST_UPDATED_IPV6`]); the IPv4 rows include the 6a44 relay anycast address
//! 192.88.99.2/32 (RFC 6751). The search tool returned excerpts rather than whole registry pages,
//! so every row was cross-checked against RFC 6890 and the RFCs that added or renamed rows since
//! (6751, 7335, 7450, 7526, 7534, 7535, 7600, 7723, 8155, 8190, 8215, 8880, 9374, 9602, 9637,
//! 9665, 9780). A block IANA adds later outside IPv6 `2000::/3` is already refused (see
//! [`classify`]); one inside `2000::/3` or in ordinary IPv4 space needs a new row here.
//!
//! # Verdicts
//! - [`AddressClass::AlwaysDenied`]: denied in every mode, whatever is configured.
//! - [`AddressClass::EmbedsIpv4`]: an IPv6 form carrying an IPv4 address. Denied outright in every
//!   mode: we never judge the embedded address, so such a form is never more permissive than the
//!   IPv4 address it carries (it is strictly less).
//! - [`AddressClass::SpecialPurpose`]: any other special-purpose block that is neither private nor
//!   always denied (anycast services, AS112, AMT, ORCHID, SRv6, ...). Denied in every mode: even
//!   the registry's "globally reachable" ones are not "public global addresses" for a sandbox.
//! - [`AddressClass::Private`]: RFC 1918, shared address space, unique local. Admitted only inside
//!   a configured private CIDR, in `private_network` and `host_allowlist`.
//! - [`AddressClass::GlobalUnicast`]: everything else in IPv4, and IPv6 inside `2000::/3` that no
//!   row names.
//!
//! When several rows hold an address, the strictest verdict wins (a more specific row never
//! re-opens what an enclosing row closes); among equals, the longest prefix names the row.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// When the special-purpose tables were last compared with the IANA registries.
pub const REGISTRY_SNAPSHOT: &str = "2026-12-02";
/// The "Last Updated" date of the IPv6 registry copy the tables follow.
pub const REGISTRY_LAST_UPDATED_IPV6: &str = "2025-10-09";

/// What the decision does with an address, before any configuration is consulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressClass {
    /// Denied in every mode (loopback, link-local, multicast, unspecified, reserved,
    /// documentation, benchmarking, discard, broadcast).
    AlwaysDenied,
    /// An IPv6 form that embeds an IPv4 address; denied in every mode.
    EmbedsIpv4,
    /// Special-purpose, neither private nor always denied; denied in every mode.
    SpecialPurpose,
    /// Private: admitted only inside a configured private CIDR.
    Private,
    /// Globally routable unicast.
    GlobalUnicast,
}

impl AddressClass {
    /// Strictness, higher is stricter: decides between rows that both hold an address.
    fn strictness(self) -> u8 {
        match self {
            AddressClass::AlwaysDenied => 4,
            AddressClass::EmbedsIpv4 => 3,
            AddressClass::SpecialPurpose => 2,
            AddressClass::Private => 1,
            AddressClass::GlobalUnicast => 0,
        }
    }

    /// A stable snake_case name for logs and the offline decide tool.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            AddressClass::AlwaysDenied => "always_denied",
            AddressClass::EmbedsIpv4 => "embeds_ipv4",
            AddressClass::SpecialPurpose => "special_purpose",
            AddressClass::Private => "private",
            AddressClass::GlobalUnicast => "global_unicast",
        }
    }
}

/// Why a CIDR text or value was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CidrError {
    /// Not `address/prefix-length`.
    Malformed,
    /// The address part is not a canonical IPv4 or an IPv6 address.
    BadAddress,
    /// The prefix length is not plain decimal within the family's width.
    BadPrefixLength,
    /// Bits below the prefix length are set (`10.0.0.1/8`): ambiguous, so refused.
    HostBitsSet,
}

/// An IP prefix with no bits set below its length.
///
/// The prefix and its containment are `ipnet`'s; what this type adds is the invariant (host bits
/// clear) and the strict text form ([`Cidr::parse`]). It orders as `ipnet` does: IPv4 before
/// IPv6, then by address, then by length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    net: IpNet,
}

/// The longest CIDR text we read: an IPv6 address (45) plus `/128`.
const CIDR_TEXT_MAX_BYTES: usize = 49;

impl Cidr {
    /// An IPv4 prefix, checked at compile time when used in a constant.
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix_len: u8) -> Cidr {
        let addr = Ipv4Addr::new(a, b, c, d);
        let net = Ipv4Net::new_assert(addr, prefix_len);
        // The bits below the prefix, shifted to the top, are zero (`None`: the prefix is /32).
        assert!(matches!(
            addr.to_bits().checked_shl(prefix_len as u32),
            None | Some(0)
        ));
        Cidr {
            net: IpNet::V4(net),
        }
    }

    /// An IPv6 prefix, checked at compile time when used in a constant.
    const fn v6(segments: [u16; 8], prefix_len: u8) -> Cidr {
        let [a, b, c, d, e, f, g, h] = segments;
        let addr = Ipv6Addr::new(a, b, c, d, e, f, g, h);
        let net = Ipv6Net::new_assert(addr, prefix_len);
        assert!(matches!(
            addr.to_bits().checked_shl(prefix_len as u32),
            None | Some(0)
        ));
        Cidr {
            net: IpNet::V6(net),
        }
    }

    /// A prefix from an address and a length; refuses set host bits and over-long lengths.
    pub fn new(addr: IpAddr, prefix_len: u8) -> Result<Cidr, CidrError> {
        let net = IpNet::new(addr, prefix_len).map_err(|_| CidrError::BadPrefixLength)?;
        if net.network() != addr {
            return Err(CidrError::HostBitsSet);
        }
        Ok(Cidr { net })
    }

    /// Parses `address/length`: a canonical dotted-quad IPv4 or an IPv6 address (no brackets, no
    /// zone), then a decimal length without sign or leading zero. The length is required.
    pub fn parse(text: &str) -> Result<Cidr, CidrError> {
        if text.len() > CIDR_TEXT_MAX_BYTES {
            return Err(CidrError::Malformed);
        }
        let Some((addr_text, len_text)) = text.split_once('/') else {
            return Err(CidrError::Malformed);
        };
        let addr = if addr_text.contains(':') {
            IpAddr::V6(parse_ipv6_strict(addr_text).ok_or(CidrError::BadAddress)?)
        } else {
            IpAddr::V4(parse_ipv4_canonical(addr_text).ok_or(CidrError::BadAddress)?)
        };
        let len_ok = !len_text.is_empty()
            && len_text.len() <= 3
            && len_text.bytes().all(|b| b.is_ascii_digit())
            && !(len_text.len() > 1 && len_text.starts_with('0'));
        if !len_ok {
            return Err(CidrError::BadPrefixLength);
        }
        let prefix_len: u8 = len_text.parse().map_err(|_| CidrError::BadPrefixLength)?;
        Cidr::new(addr, prefix_len)
    }

    /// The network address.
    #[must_use]
    pub fn addr(&self) -> IpAddr {
        self.net.addr()
    }

    /// The prefix length in bits.
    #[must_use]
    pub fn prefix_len(&self) -> u8 {
        self.net.prefix_len()
    }

    /// Whether `ip` is inside this prefix. Families never mix: an IPv4 prefix holds no IPv6
    /// address, not even an IPv4-mapped one.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.net.contains(&ip)
    }

    /// Whether every address of `other` is inside this prefix.
    #[must_use]
    pub fn contains_cidr(&self, other: &Cidr) -> bool {
        self.net.contains(&other.net)
    }

    /// Whether the two prefixes share any address.
    #[must_use]
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.contains_cidr(other) || other.contains_cidr(self)
    }

    /// Whether the whole prefix lies inside one private block (RFC 1918, shared address space,
    /// unique local): the only prefixes a deployment may configure as private CIDRs.
    #[must_use]
    pub fn is_private(&self) -> bool {
        IPV4_ROWS
            .iter()
            .chain(IPV6_ROWS.iter())
            .filter(|row| row.class == AddressClass::Private)
            .any(|row| row.block.contains_cidr(self))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `address/length`, as `ipnet` writes it.
        fmt::Display::fmt(&self.net, f)
    }
}

/// Parses exactly four dot-separated decimal parts, each 0-255 without a leading zero. This is
/// the only IPv4 spelling the decision accepts anywhere.
#[must_use]
pub fn parse_ipv4_canonical(text: &str) -> Option<Ipv4Addr> {
    if text.len() > 15 {
        return None;
    }
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        let canonical = !part.is_empty()
            && part.len() <= 3
            && part.bytes().all(|b| b.is_ascii_digit())
            && !(part.len() > 1 && part.starts_with('0'));
        if !canonical {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Ipv4Addr::from(octets))
}

/// Parses an IPv6 address by RFC 3986's `IPv6address`: hex groups, `::`, and a trailing
/// dotted-quad only in its canonical spelling. No zone, no brackets.
#[must_use]
pub fn parse_ipv6_strict(text: &str) -> Option<Ipv6Addr> {
    if text.is_empty() || text.len() > 45 {
        return None;
    }
    let allowed = text
        .bytes()
        .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
    if !allowed {
        return None;
    }
    if text.contains('.') {
        let (_, last) = text.rsplit_once(':')?;
        parse_ipv4_canonical(last)?;
    }
    text.parse::<Ipv6Addr>().ok()
}

/// Where a row comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RowSource {
    /// A row of the IANA IPv4 or IPv6 Special-Purpose Address Registry.
    IanaSpecialPurpose,
    /// A block outside that registry that the decision must also classify (multicast,
    /// IPv4-compatible and IPv4-translated IPv6).
    Added,
}

/// One row of the address tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialRow {
    /// The address block.
    pub block: Cidr,
    /// The registry's name for the block.
    pub name: &'static str,
    /// The defining document.
    pub reference: &'static str,
    /// The verdict for addresses in the block.
    pub class: AddressClass,
    /// Whether the row is the registry's or ours.
    pub source: RowSource,
}

const fn row(
    block: Cidr,
    name: &'static str,
    reference: &'static str,
    class: AddressClass,
) -> SpecialRow {
    SpecialRow {
        block,
        name,
        reference,
        class,
        source: RowSource::IanaSpecialPurpose,
    }
}

const fn added(
    block: Cidr,
    name: &'static str,
    reference: &'static str,
    class: AddressClass,
) -> SpecialRow {
    SpecialRow {
        block,
        name,
        reference,
        class,
        source: RowSource::Added,
    }
}

use AddressClass::{AlwaysDenied, EmbedsIpv4, Private, SpecialPurpose};

/// IPv4 rows: the IANA IPv4 Special-Purpose Address Registry (snapshot [`REGISTRY_SNAPSHOT`])
/// and multicast.
#[rustfmt::skip]
pub static IPV4_ROWS: &[SpecialRow] = &[
    row(Cidr::v4(0, 0, 0, 0, 8), "\"This network\"", "RFC 791 s3.2", AlwaysDenied),
    row(Cidr::v4(0, 0, 0, 0, 32), "\"This host on this network\"", "RFC 1122 s3.2.1.3", AlwaysDenied),
    row(Cidr::v4(10, 0, 0, 0, 8), "Private-Use", "RFC 1918", Private),
    row(Cidr::v4(100, 64, 0, 0, 10), "Shared Address Space", "RFC 6598", Private),
    row(Cidr::v4(127, 0, 0, 0, 8), "Loopback", "RFC 1122 s3.2.1.3", AlwaysDenied),
    row(Cidr::v4(169, 254, 0, 0, 16), "Link Local", "RFC 3927", AlwaysDenied),
    row(Cidr::v4(172, 16, 0, 0, 12), "Private-Use", "RFC 1918", Private),
    row(Cidr::v4(192, 0, 0, 0, 24), "IETF Protocol Assignments", "RFC 6890 s2.1", SpecialPurpose),
    row(Cidr::v4(192, 0, 0, 0, 29), "IPv4 Service Continuity Prefix", "RFC 7335", SpecialPurpose),
    row(Cidr::v4(192, 0, 0, 8, 32), "IPv4 dummy address", "RFC 7600", AlwaysDenied),
    row(Cidr::v4(192, 0, 0, 9, 32), "Port Control Protocol Anycast", "RFC 7723", SpecialPurpose),
    row(Cidr::v4(192, 0, 0, 10, 32), "Traversal Using Relays around NAT Anycast", "RFC 8155", SpecialPurpose),
    row(Cidr::v4(192, 0, 0, 170, 32), "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 s2.2", SpecialPurpose),
    row(Cidr::v4(192, 0, 0, 171, 32), "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 s2.2", SpecialPurpose),
    row(Cidr::v4(192, 0, 2, 0, 24), "Documentation (TEST-NET-1)", "RFC 5737", AlwaysDenied),
    row(Cidr::v4(192, 31, 196, 0, 24), "AS112-v4", "RFC 7535", SpecialPurpose),
    row(Cidr::v4(192, 52, 193, 0, 24), "AMT", "RFC 7450", SpecialPurpose),
    row(Cidr::v4(192, 88, 99, 0, 24), "Deprecated (6to4 Relay Anycast)", "RFC 7526", SpecialPurpose),
    row(Cidr::v4(192, 88, 99, 2, 32), "6a44-relay anycast address", "RFC 6751", SpecialPurpose),
    row(Cidr::v4(192, 168, 0, 0, 16), "Private-Use", "RFC 1918", Private),
    row(Cidr::v4(192, 175, 48, 0, 24), "Direct Delegation AS112 Service", "RFC 7534", SpecialPurpose),
    row(Cidr::v4(198, 18, 0, 0, 15), "Benchmarking", "RFC 2544", AlwaysDenied),
    row(Cidr::v4(198, 51, 100, 0, 24), "Documentation (TEST-NET-2)", "RFC 5737", AlwaysDenied),
    row(Cidr::v4(203, 0, 113, 0, 24), "Documentation (TEST-NET-3)", "RFC 5737", AlwaysDenied),
    row(Cidr::v4(240, 0, 0, 0, 4), "Reserved", "RFC 1112 s4", AlwaysDenied),
    row(Cidr::v4(255, 255, 255, 255, 32), "Limited Broadcast", "RFC 8190, RFC 919 s7", AlwaysDenied),
    added(Cidr::v4(224, 0, 0, 0, 4), "Multicast", "RFC 5771", AlwaysDenied),
];

/// IPv6 rows: the IANA IPv6 Special-Purpose Address Registry (snapshot [`REGISTRY_SNAPSHOT`]),
/// multicast, and the IPv4-compatible and IPv4-translated forms.
#[rustfmt::skip]
pub static IPV6_ROWS: &[SpecialRow] = &[
    row(Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "Loopback Address", "RFC 4291", AlwaysDenied),
    row(Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "Unspecified Address", "RFC 4291", AlwaysDenied),
    row(Cidr::v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96), "IPv4-mapped Address", "RFC 4291", EmbedsIpv4),
    row(Cidr::v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96), "IPv4-IPv6 Translat.", "RFC 6052", EmbedsIpv4),
    row(Cidr::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), "IPv4-IPv6 Translat.", "RFC 8215", EmbedsIpv4),
    row(Cidr::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), "Discard-Only Address Block", "RFC 6666", AlwaysDenied),
    row(Cidr::v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64), "Dummy IPv6 Prefix", "RFC 9780", AlwaysDenied),
    row(Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), "IETF Protocol Assignments", "RFC 2928", SpecialPurpose),
    row(Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32), "TEREDO", "RFC 4380, RFC 8190", EmbedsIpv4),
    row(Cidr::v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128), "Port Control Protocol Anycast", "RFC 7723", SpecialPurpose),
    row(Cidr::v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128), "Traversal Using Relays around NAT Anycast", "RFC 8155", SpecialPurpose),
    row(Cidr::v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128), "DNS-SD Service Registration Protocol Anycast", "RFC 9665", SpecialPurpose),
    row(Cidr::v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48), "Benchmarking", "RFC 5180, RFC Errata 1752", AlwaysDenied),
    row(Cidr::v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32), "AMT", "RFC 7450", SpecialPurpose),
    row(Cidr::v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48), "AS112-v6", "RFC 7535", SpecialPurpose),
    row(Cidr::v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28), "Deprecated (previously ORCHID)", "RFC 4843", SpecialPurpose),
    row(Cidr::v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28), "ORCHIDv2", "RFC 7343", SpecialPurpose),
    row(Cidr::v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28), "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", SpecialPurpose),
    row(Cidr::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), "Documentation", "RFC 3849", AlwaysDenied),
    row(Cidr::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), "6to4", "RFC 3056", EmbedsIpv4),
    row(Cidr::v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48), "Direct Delegation AS112 Service", "RFC 7534", SpecialPurpose),
    row(Cidr::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), "Documentation", "RFC 9637", AlwaysDenied),
    row(Cidr::v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16), "Segment Routing (SRv6) SIDs", "RFC 9602", SpecialPurpose),
    row(Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "Unique-Local", "RFC 4193, RFC 8190", Private),
    row(Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "Link-Local Unicast", "RFC 4291", AlwaysDenied),
    added(Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 96), "IPv4-compatible Address (deprecated)", "RFC 4291 s2.5.5.1", EmbedsIpv4),
    added(Cidr::v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96), "IPv4-translated Address", "RFC 2765, RFC 6145", EmbedsIpv4),
    added(Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "Multicast", "RFC 4291", AlwaysDenied),
];

/// IPv6 global unicast: the only IPv6 space IANA allocates for ordinary use. IPv6 outside it
/// that no row names is reserved by the IETF and always denied.
pub const IPV6_GLOBAL_UNICAST: Cidr = Cidr::v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// What decided an address's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// A row of [`IPV4_ROWS`] or [`IPV6_ROWS`].
    Row(&'static SpecialRow),
    /// IPv6 outside [`IPV6_GLOBAL_UNICAST`] that no row names: reserved, always denied.
    OutsideIpv6GlobalUnicast,
    /// No special-purpose row holds the address: global unicast.
    NotSpecial,
}

/// An address's class and what decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classification {
    /// The verdict before configuration.
    pub class: AddressClass,
    /// The row (or rule) that gave it.
    pub basis: Basis,
}

/// Classifies an address: the strictest verdict of all rows that hold it (longest prefix among
/// equals); IPv6 outside `2000::/3` with no row is always denied; anything else is global.
#[must_use]
pub fn classify(ip: IpAddr) -> Classification {
    let rows = match ip {
        IpAddr::V4(_) => IPV4_ROWS,
        IpAddr::V6(_) => IPV6_ROWS,
    };
    let mut best: Option<&'static SpecialRow> = None;
    for candidate in rows.iter().filter(|row| row.block.contains(ip)) {
        let better = match best {
            None => true,
            Some(current) => {
                let key = |r: &SpecialRow| (r.class.strictness(), r.block.prefix_len());
                key(candidate) > key(current)
            }
        };
        if better {
            best = Some(candidate);
        }
    }
    if let Some(row) = best {
        return Classification {
            class: row.class,
            basis: Basis::Row(row),
        };
    }
    match ip {
        IpAddr::V6(_) if !IPV6_GLOBAL_UNICAST.contains(ip) => Classification {
            class: AddressClass::AlwaysDenied,
            basis: Basis::OutsideIpv6GlobalUnicast,
        },
        IpAddr::V4(_) | IpAddr::V6(_) => Classification {
            class: AddressClass::GlobalUnicast,
            basis: Basis::NotSpecial,
        },
    }
}

/// The blocks a configured private CIDR must lie within.
pub fn private_blocks() -> impl Iterator<Item = Cidr> {
    IPV4_ROWS
        .iter()
        .chain(IPV6_ROWS.iter())
        .filter(|row| row.class == AddressClass::Private)
        .map(|row| row.block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// One `#[test]` per table row: the row is present exactly once with its verdict, and an
    /// address inside it (chosen to avoid any more specific row) classifies as that verdict.
    macro_rules! rows {
        ($($test:ident: $block:literal at $probe:literal => $class:ident;)*) => {
            $(
                #[test]
                fn $test() {
                    let block = Cidr::parse($block).unwrap();
                    let rows: Vec<&SpecialRow> =
                        IPV4_ROWS.iter().chain(IPV6_ROWS.iter()).filter(|r| r.block == block).collect();
                    assert_eq!(rows.len(), 1, "{} must be one row", $block);
                    assert_eq!(rows[0].class, AddressClass::$class, "{}", $block);
                    let probe = ip($probe);
                    assert!(block.contains(probe), "{} holds {}", $block, $probe);
                    assert_eq!(classify(probe).class, AddressClass::$class, "{}", $probe);
                    crate::egress::decide::tests::assert_class_verdict_in_every_mode(probe, AddressClass::$class);
                }
            )*

            /// Every row of the tables has its own test above, and no test names a missing row.
            #[test]
            fn every_row_has_a_test() {
                let tested: Vec<Cidr> = vec![$(Cidr::parse($block).unwrap()),*];
                let mut table: Vec<Cidr> = IPV4_ROWS.iter().chain(IPV6_ROWS.iter()).map(|r| r.block).collect();
                let mut tested_sorted = tested.clone();
                table.sort();
                tested_sorted.sort();
                assert_eq!(table, tested_sorted);
            }
        };
    }

    rows! {
        row_v4_this_network_0_0_0_0_8: "0.0.0.0/8" at "0.1.2.3" => AlwaysDenied;
        row_v4_this_host_0_0_0_0_32: "0.0.0.0/32" at "0.0.0.0" => AlwaysDenied;
        row_v4_private_10_0_0_0_8: "10.0.0.0/8" at "10.20.30.40" => Private;
        row_v4_shared_100_64_0_0_10: "100.64.0.0/10" at "100.127.255.254" => Private;
        row_v4_loopback_127_0_0_0_8: "127.0.0.0/8" at "127.0.0.1" => AlwaysDenied;
        row_v4_link_local_169_254_0_0_16: "169.254.0.0/16" at "169.254.169.254" => AlwaysDenied;
        row_v4_private_172_16_0_0_12: "172.16.0.0/12" at "172.31.255.1" => Private;
        row_v4_ietf_protocol_192_0_0_0_24: "192.0.0.0/24" at "192.0.0.100" => SpecialPurpose;
        row_v4_service_continuity_192_0_0_0_29: "192.0.0.0/29" at "192.0.0.1" => SpecialPurpose;
        row_v4_dummy_192_0_0_8_32: "192.0.0.8/32" at "192.0.0.8" => AlwaysDenied;
        row_v4_pcp_anycast_192_0_0_9_32: "192.0.0.9/32" at "192.0.0.9" => SpecialPurpose;
        row_v4_turn_anycast_192_0_0_10_32: "192.0.0.10/32" at "192.0.0.10" => SpecialPurpose;
        row_v4_nat64_discovery_192_0_0_170_32: "192.0.0.170/32" at "192.0.0.170" => SpecialPurpose;
        row_v4_nat64_discovery_192_0_0_171_32: "192.0.0.171/32" at "192.0.0.171" => SpecialPurpose;
        row_v4_test_net_1_192_0_2_0_24: "192.0.2.0/24" at "192.0.2.1" => AlwaysDenied;
        row_v4_as112_192_31_196_0_24: "192.31.196.0/24" at "192.31.196.1" => SpecialPurpose;
        row_v4_amt_192_52_193_0_24: "192.52.193.0/24" at "192.52.193.1" => SpecialPurpose;
        row_v4_6to4_relay_192_88_99_0_24: "192.88.99.0/24" at "192.88.99.1" => SpecialPurpose;
        row_v4_6a44_relay_192_88_99_2_32: "192.88.99.2/32" at "192.88.99.2" => SpecialPurpose;
        row_v4_private_192_168_0_0_16: "192.168.0.0/16" at "192.168.1.1" => Private;
        row_v4_as112_direct_192_175_48_0_24: "192.175.48.0/24" at "192.175.48.6" => SpecialPurpose;
        row_v4_benchmarking_198_18_0_0_15: "198.18.0.0/15" at "198.19.255.255" => AlwaysDenied;
        row_v4_test_net_2_198_51_100_0_24: "198.51.100.0/24" at "198.51.100.7" => AlwaysDenied;
        row_v4_test_net_3_203_0_113_0_24: "203.0.113.0/24" at "203.0.113.9" => AlwaysDenied;
        row_v4_reserved_240_0_0_0_4: "240.0.0.0/4" at "250.1.2.3" => AlwaysDenied;
        row_v4_broadcast_255_255_255_255_32: "255.255.255.255/32" at "255.255.255.255" => AlwaysDenied;
        row_v4_multicast_224_0_0_0_4: "224.0.0.0/4" at "239.255.255.250" => AlwaysDenied;
        row_v6_loopback: "::1/128" at "::1" => AlwaysDenied;
        row_v6_unspecified: "::/128" at "::" => AlwaysDenied;
        row_v6_ipv4_mapped: "::ffff:0:0/96" at "::ffff:8.8.8.8" => EmbedsIpv4;
        row_v6_nat64_well_known: "64:ff9b::/96" at "64:ff9b::808:808" => EmbedsIpv4;
        row_v6_nat64_local_use: "64:ff9b:1::/48" at "64:ff9b:1::808:808" => EmbedsIpv4;
        row_v6_discard_only: "100::/64" at "100::1" => AlwaysDenied;
        row_v6_dummy_prefix: "100:0:0:1::/64" at "100:0:0:1::1" => AlwaysDenied;
        row_v6_ietf_protocol: "2001::/23" at "2001:100::1" => SpecialPurpose;
        row_v6_teredo: "2001::/32" at "2001:0:4136:e378:8000:63bf:3fff:fdd2" => EmbedsIpv4;
        row_v6_pcp_anycast: "2001:1::1/128" at "2001:1::1" => SpecialPurpose;
        row_v6_turn_anycast: "2001:1::2/128" at "2001:1::2" => SpecialPurpose;
        row_v6_dnssd_srp_anycast: "2001:1::3/128" at "2001:1::3" => SpecialPurpose;
        row_v6_benchmarking: "2001:2::/48" at "2001:2::1" => AlwaysDenied;
        row_v6_amt: "2001:3::/32" at "2001:3::1" => SpecialPurpose;
        row_v6_as112: "2001:4:112::/48" at "2001:4:112::1" => SpecialPurpose;
        row_v6_orchid_deprecated: "2001:10::/28" at "2001:10::1" => SpecialPurpose;
        row_v6_orchid_v2: "2001:20::/28" at "2001:20::1" => SpecialPurpose;
        row_v6_drip_dets: "2001:30::/28" at "2001:30::1" => SpecialPurpose;
        row_v6_documentation_2001_db8: "2001:db8::/32" at "2001:db8::1" => AlwaysDenied;
        row_v6_6to4: "2002::/16" at "2002:808:808::1" => EmbedsIpv4;
        row_v6_as112_direct: "2620:4f:8000::/48" at "2620:4f:8000::1" => SpecialPurpose;
        row_v6_documentation_3fff: "3fff::/20" at "3fff:fff::1" => AlwaysDenied;
        row_v6_srv6_sids: "5f00::/16" at "5f00::1" => SpecialPurpose;
        row_v6_unique_local: "fc00::/7" at "fd12:3456::1" => Private;
        row_v6_link_local: "fe80::/10" at "fe80::1" => AlwaysDenied;
        row_v6_ipv4_compatible: "::/96" at "::8.8.8.8" => EmbedsIpv4;
        row_v6_ipv4_translated: "::ffff:0:0:0/96" at "::ffff:0:808:808" => EmbedsIpv4;
        row_v6_multicast: "ff00::/8" at "ff02::1" => AlwaysDenied;
    }

    #[test]
    fn global_unicast_outside_every_row() {
        for text in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700:4700::1111",
            "2a00:1450::1",
        ] {
            assert_eq!(
                classify(ip(text)).class,
                AddressClass::GlobalUnicast,
                "{text}"
            );
        }
    }

    #[test]
    fn ipv6_outside_2000_3_without_a_row_is_always_denied() {
        for text in [
            "fec0::1",
            "4000::1",
            "8000::1",
            "1::1",
            "200::1",
            "::1:0:0:1",
        ] {
            let c = classify(ip(text));
            assert_eq!(c.class, AddressClass::AlwaysDenied, "{text}");
        }
        assert_eq!(
            classify(ip("fec0::1")).basis,
            Basis::OutsideIpv6GlobalUnicast
        );
    }

    #[test]
    fn strictest_row_wins_over_a_more_specific_weaker_one() {
        // ::1 is inside ::/96 (embeds IPv4) but is loopback.
        assert_eq!(classify(ip("::1")).class, AddressClass::AlwaysDenied);
        // 2001:2::/48 (benchmarking) is inside 2001::/23 (special purpose).
        assert_eq!(classify(ip("2001:2::5")).class, AddressClass::AlwaysDenied);
        // Teredo inside the IETF block is reported as embedding IPv4.
        assert_eq!(classify(ip("2001::1")).class, AddressClass::EmbedsIpv4);
    }

    #[test]
    fn no_row_nests_inside_or_around_a_private_block() {
        for private in IPV4_ROWS
            .iter()
            .chain(IPV6_ROWS.iter())
            .filter(|r| r.class == AddressClass::Private)
        {
            for other in IPV4_ROWS
                .iter()
                .chain(IPV6_ROWS.iter())
                .filter(|r| r.block != private.block)
            {
                assert!(
                    !private.block.overlaps(&other.block),
                    "{} overlaps {}",
                    private.block,
                    other.block
                );
            }
        }
    }

    #[test]
    fn cidr_parse_is_strict() {
        assert_eq!(Cidr::parse("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(Cidr::parse("fd00::/8").unwrap().to_string(), "fd00::/8");
        assert_eq!(Cidr::parse("10.0.0.1/8"), Err(CidrError::HostBitsSet));
        assert_eq!(Cidr::parse("10.0.0.0"), Err(CidrError::Malformed));
        assert_eq!(Cidr::parse("10.0.0.0/08"), Err(CidrError::BadPrefixLength));
        assert_eq!(Cidr::parse("10.0.0.0/+8"), Err(CidrError::BadPrefixLength));
        assert_eq!(Cidr::parse("10.0.0.0/33"), Err(CidrError::BadPrefixLength));
        assert_eq!(Cidr::parse("10.0.0.0/"), Err(CidrError::BadPrefixLength));
        assert_eq!(Cidr::parse("010.0.0.0/8"), Err(CidrError::BadAddress));
        assert_eq!(Cidr::parse("10.0/8"), Err(CidrError::BadAddress));
        assert_eq!(Cidr::parse("[fd00::]/8"), Err(CidrError::BadAddress));
        assert_eq!(Cidr::parse("fd00::%eth0/8"), Err(CidrError::BadAddress));
        assert_eq!(Cidr::parse("fd00::/129"), Err(CidrError::BadPrefixLength));
        assert_eq!(Cidr::parse(" 10.0.0.0/8"), Err(CidrError::BadAddress));
    }

    #[test]
    fn private_cidrs_are_only_inside_private_blocks() {
        for text in [
            "10.0.0.0/8",
            "10.1.0.0/16",
            "172.16.0.0/12",
            "192.168.5.0/24",
            "100.64.0.0/10",
            "fd00::/8",
            "fc00::/7",
        ] {
            assert!(Cidr::parse(text).unwrap().is_private(), "{text}");
        }
        for text in [
            "8.8.8.0/24",
            "0.0.0.0/0",
            "::/0",
            "10.0.0.0/7",
            "127.0.0.0/8",
            "169.254.0.0/16",
            "::ffff:10.0.0.0/104",
            "fe80::/10",
            "172.0.0.0/8",
        ] {
            assert!(!Cidr::parse(text).unwrap().is_private(), "{text}");
        }
    }

    #[test]
    fn containment_at_the_edges() {
        let cidr = |text: &str| Cidr::parse(text).unwrap();
        let all_v4 = cidr("0.0.0.0/0");
        assert!(all_v4.contains(ip("0.0.0.0")) && all_v4.contains(ip("255.255.255.255")));
        assert!(all_v4.contains_cidr(&cidr("10.0.0.0/8")));
        assert!(!all_v4.contains_cidr(&cidr("::/0")));
        let host = cidr("192.0.2.7/32");
        assert!(host.contains(ip("192.0.2.7")) && !host.contains(ip("192.0.2.6")));
        assert!(host.contains_cidr(&host));
        let host_v6 = cidr("2001:db8::1/128");
        assert!(host_v6.contains(ip("2001:db8::1")) && !host_v6.contains(ip("2001:db8::")));
        assert!(!cidr("10.0.0.0/9").contains_cidr(&cidr("10.0.0.0/8")));
        assert!(cidr("10.0.0.0/8").contains_cidr(&cidr("10.128.0.0/9")));
        assert!(cidr("10.0.0.0/8").overlaps(&cidr("10.128.0.0/9")));
        assert!(!cidr("10.0.0.0/9").overlaps(&cidr("10.128.0.0/9")));
        assert_eq!(
            Cidr::new(ip("10.0.0.0"), 33),
            Err(CidrError::BadPrefixLength)
        );
        assert_eq!(Cidr::new(ip("::"), 129), Err(CidrError::BadPrefixLength));
        assert_eq!(Cidr::new(ip("::1"), 127), Err(CidrError::HostBitsSet));
        assert_eq!(Cidr::new(ip("::1"), 128).unwrap().to_string(), "::1/128");
    }

    /// The private CIDRs are a `BTreeSet<Cidr>` whose order reaches a grant's encoding: IPv4
    /// first, then by address, then by length.
    #[test]
    fn cidrs_order_by_family_address_then_length() {
        let mut cidrs: Vec<Cidr> = [
            "fd00::/8",
            "10.0.0.0/16",
            "fc00::/7",
            "10.0.0.0/8",
            "9.0.0.0/8",
        ]
        .iter()
        .map(|text| Cidr::parse(text).unwrap())
        .collect();
        cidrs.sort();
        let sorted: Vec<String> = cidrs.iter().map(Cidr::to_string).collect();
        assert_eq!(
            sorted,
            [
                "9.0.0.0/8",
                "10.0.0.0/8",
                "10.0.0.0/16",
                "fc00::/7",
                "fd00::/8"
            ]
        );
    }

    proptest::proptest! {
        /// Containment is the mask comparison: an address is inside when its top `prefix_len`
        /// bits are the network's, for every length including 0 and the full width.
        #[test]
        fn contains_is_the_mask_comparison(
            net_bits in proptest::prelude::any::<u128>(),
            probe_bits in proptest::prelude::any::<u128>(),
            len in 0u8..=128,
            share in 0u8..=128,
        ) {
            let mask_v6 = |len: u8| u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            let mask_v4 = |len: u8| u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            // A probe that shares the first `share` bits with the network, so both sides of
            // the boundary are exercised.
            let probe_v6 = (net_bits & mask_v6(share)) | (probe_bits & !mask_v6(share));
            let net_v6 = Ipv6Addr::from_bits(net_bits & mask_v6(len));
            let cidr = Cidr::new(IpAddr::V6(net_v6), len).unwrap();
            let probe = IpAddr::V6(Ipv6Addr::from_bits(probe_v6));
            proptest::prop_assert_eq!(
                cidr.contains(probe),
                probe_v6 & mask_v6(len) == net_v6.to_bits()
            );
            let (len, share) = (len % 33, share % 33);
            let (net_bits, probe_bits) = (net_bits as u32, probe_bits as u32);
            let probe_v4 = (net_bits & mask_v4(share)) | (probe_bits & !mask_v4(share));
            let net_v4 = Ipv4Addr::from_bits(net_bits & mask_v4(len));
            let cidr = Cidr::new(IpAddr::V4(net_v4), len).unwrap();
            let probe = IpAddr::V4(Ipv4Addr::from_bits(probe_v4));
            proptest::prop_assert_eq!(
                cidr.contains(probe),
                probe_v4 & mask_v4(len) == net_v4.to_bits()
            );
            let wider_net = Ipv4Addr::from_bits(net_bits & mask_v4(share));
            let wider = Cidr::new(IpAddr::V4(wider_net), share).unwrap();
            proptest::prop_assert_eq!(
                wider.contains_cidr(&cidr),
                share <= len && wider.contains(IpAddr::V4(net_v4))
            );
        }
    }

    #[test]
    fn families_never_mix() {
        let v4 = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(!v4.contains(ip("::ffff:10.0.0.1")));
        let all_v6 = Cidr::parse("::/0").unwrap();
        assert!(!all_v6.contains(ip("10.0.0.1")));
    }
}
