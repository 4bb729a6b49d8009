//! Strict parsing of what a client asks the proxy for: a CONNECT authority (`host:port`), an
//! absolute-form `http://` URL, and the `Host` header that must agree with it.
//!
//! The grammar is RFC 3986's, narrowed to one spelling per destination:
//! - a host is a DNS name of LDH labels (1-63 bytes each, at most 253 in all, no empty label,
//!   one trailing dot allowed and dropped), or a dotted-decimal IPv4 address of exactly four
//!   parts without leading zeros, or a bracketed IPv6 address without a zone;
//! - a name whose last label is numeric (all digits, or `0x` and hex digits) is refused: resolvers
//!   and URL parsers read such names as addresses (`127.1`, `0x7f.1`, `2130706433`);
//! - a port is 1-65535 in decimal, no sign, no leading zero; CONNECT has no default port;
//! - names compare case-insensitively: the canonical form is lower-case without the trailing dot.
//!
//! Everything else is refused with a [`Reason`]: userinfo, percent-encoding, brackets around a
//! name or IPv4 address, zone ids, IPvFuture, a path or query in a CONNECT target, whitespace,
//! control characters and non-ASCII bytes.
//!
//! Absolute-form URLs: only `http` (any letter case) is accepted. An `https://` absolute-form
//! request would have the proxy originate TLS for the client; we do not, so HTTPS goes through
//! CONNECT and `https://` absolute-form is refused with `url_scheme_not_http`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::address::{parse_ipv4_canonical, parse_ipv6_strict};
use super::reason::Reason;

/// The longest authority we read: a 253-byte name, its trailing dot, `:` and five digits, with
/// room to spare. Longer is refused before any other check.
pub const AUTHORITY_MAX_BYTES: usize = 300;
/// The longest absolute-form URL we read.
pub const URL_MAX_BYTES: usize = 8192;
/// The longest DNS name, without the trailing dot.
pub const NAME_MAX_BYTES: usize = 253;
/// The longest DNS label.
pub const LABEL_MAX_BYTES: usize = 63;

/// A DNS name in canonical form: LDH labels, lower-case, no trailing dot, last label not numeric.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DnsName(String);

impl DnsName {
    /// Parses a DNS name: one trailing dot allowed and dropped, letters folded to lower case.
    pub fn parse(text: &str) -> Result<DnsName, Reason> {
        if text.is_empty() {
            return Err(Reason::AuthorityEmptyHost);
        }
        let body = text.strip_suffix('.').unwrap_or(text);
        if body.is_empty() || body.len() > NAME_MAX_BYTES {
            return Err(Reason::AuthorityBadName);
        }
        let mut last_label = "";
        for label in body.split('.') {
            if !is_ldh_label(label) {
                return Err(Reason::AuthorityBadName);
            }
            last_label = label;
        }
        if is_numeric_label(last_label) {
            return Err(Reason::AuthorityNumericSpelling);
        }
        Ok(DnsName(body.to_ascii_lowercase()))
    }

    /// The canonical name: lower-case, no trailing dot.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a fully-qualified query, with its trailing dot, so that a resolver never
    /// applies a search list (BROW-4).
    #[must_use]
    pub fn to_fqdn(&self) -> String {
        let mut fqdn = String::with_capacity(self.0.len() + 1);
        fqdn.push_str(&self.0);
        fqdn.push('.');
        fqdn
    }
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_ldh_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= LABEL_MAX_BYTES
        && *first != b'-'
        && *last != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
}

/// A label that some parser reads as a number: all digits, or `0x`/`0X` followed by hex digits
/// (the WHATWG URL "ends in a number" rule, which also covers inet_aton's forms).
fn is_numeric_label(label: &str) -> bool {
    let all_digits = !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit());
    let hex = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"))
        .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_hexdigit()));
    all_digits || hex
}

/// A destination host: a canonical name, or an address literal.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Host {
    /// A DNS name, to be resolved by the proxy.
    Name(DnsName),
    /// An IPv4 literal (four canonical decimal parts).
    Ipv4(Ipv4Addr),
    /// An IPv6 literal (bracketed in an authority).
    Ipv6(Ipv6Addr),
}

impl Host {
    /// Parses a host as it appears in an authority: a name, a canonical IPv4 address, or a
    /// bracketed IPv6 address. Used for configured allowlist entries and provider hints too.
    pub fn parse(text: &str) -> Result<Host, Reason> {
        check_characters(text, AUTHORITY_MAX_BYTES)?;
        check_authority_characters(text)?;
        if text.starts_with('[') {
            let (host, rest) = split_bracketed(text)?;
            if !rest.is_empty() {
                return Err(Reason::AuthorityMalformed);
            }
            return Ok(host);
        }
        if text.contains('[') || text.contains(']') {
            return Err(Reason::AuthorityMalformed);
        }
        if text.contains(':') {
            return Err(Reason::AuthorityUnbracketedIpv6);
        }
        parse_reg_name_or_ipv4(text)
    }

    /// The address, when the host is a literal.
    #[must_use]
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Host::Name(_) => None,
            Host::Ipv4(v4) => Some(IpAddr::V4(*v4)),
            Host::Ipv6(v6) => Some(IpAddr::V6(*v6)),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name.as_str()),
            Host::Ipv4(v4) => write!(f, "{v4}"),
            Host::Ipv6(v6) => write!(f, "[{v6}]"),
        }
    }
}

/// A destination: host and port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    /// Where to connect.
    pub host: Host,
    /// The TCP port, 1-65535.
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A parsed absolute-form request target (`http://host[:port][/path][?query]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRequestTarget {
    /// The destination; the port defaults to 80.
    pub target: Target,
    /// The path and query to send upstream in origin-form; `/` when the URL has none.
    pub origin_form: String,
}

/// Parses a CONNECT request target: exactly `host:port`, nothing before or after.
pub fn parse_connect_authority(text: &str) -> Result<Target, Reason> {
    check_characters(text, AUTHORITY_MAX_BYTES)?;
    parse_authority(text, None)
}

/// Parses an absolute-form URL for plain HTTP proxying: `http://authority[path][?query]`, with
/// no userinfo and no fragment; the port defaults to 80.
pub fn parse_absolute_url(text: &str) -> Result<HttpRequestTarget, Reason> {
    check_characters(text, URL_MAX_BYTES)?;
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(Reason::UrlMalformed);
    };
    let scheme_ok = !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.');
    if !scheme_ok {
        return Err(Reason::UrlMalformed);
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(Reason::UrlSchemeNotHttp);
    }
    if rest.contains('#') {
        return Err(Reason::UrlFragment);
    }
    let split_at = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(split_at);
    let target = parse_authority(authority, Some(80))?;
    if !path_and_query.bytes().all(is_path_or_query_byte)
        || !percent_escapes_are_whole(path_and_query)
    {
        return Err(Reason::UrlBadPath);
    }
    let origin_form = if path_and_query.starts_with('/') {
        path_and_query.to_owned()
    } else {
        format!("/{path_and_query}")
    };
    Ok(HttpRequestTarget {
        target,
        origin_form,
    })
}

/// Judges the `Host` header values of an absolute-form request: exactly one, parsing as an
/// authority (port defaulting to 80), naming the same host and port as the URL.
pub fn check_host_header(request: &HttpRequestTarget, host_values: &[&str]) -> Result<(), Reason> {
    let value = match host_values {
        [] => return Err(Reason::HostHeaderMissing),
        [one] => *one,
        [_, _, ..] => return Err(Reason::HostHeaderRepeated),
    };
    let parsed = check_characters(value, AUTHORITY_MAX_BYTES)
        .and_then(|()| parse_authority(value, Some(80)))
        .map_err(|_| Reason::HostHeaderMalformed)?;
    if parsed != request.target {
        return Err(Reason::HostHeaderMismatch);
    }
    Ok(())
}

/// Bounds, ASCII, no whitespace or control characters.
fn check_characters(text: &str, max_bytes: usize) -> Result<(), Reason> {
    if text.is_empty() {
        return Err(Reason::TargetEmpty);
    }
    if text.len() > max_bytes {
        return Err(Reason::TargetTooLong);
    }
    if !text.is_ascii() {
        return Err(Reason::TargetNonAscii);
    }
    if text.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(Reason::TargetControlOrWhitespace);
    }
    Ok(())
}

/// Characters no authority may hold, in the order a reader would name them.
fn check_authority_characters(text: &str) -> Result<(), Reason> {
    if text.contains('@') {
        return Err(Reason::AuthorityUserinfo);
    }
    if text.contains('%') {
        let in_brackets = text.starts_with('[') && text.find('%') < text.find(']');
        return Err(if in_brackets {
            Reason::AuthorityZoneId
        } else {
            Reason::AuthorityPercentEncoded
        });
    }
    if text.contains(['/', '?', '#']) {
        return Err(Reason::AuthorityPathOrQuery);
    }
    Ok(())
}

/// Parses `host[:port]`; `default_port` of `None` means the port is required.
fn parse_authority(text: &str, default_port: Option<u16>) -> Result<Target, Reason> {
    if text.is_empty() {
        return Err(Reason::AuthorityEmptyHost);
    }
    check_authority_characters(text)?;
    let (host, port_part) = if text.starts_with('[') {
        split_bracketed(text)?
    } else {
        if text.contains('[') || text.contains(']') {
            return Err(Reason::AuthorityMalformed);
        }
        let (host_text, port_part) = match text.split_once(':') {
            Some((host_text, port_text)) => (host_text, Some(port_text)),
            None => (text, None),
        };
        if port_part.is_some_and(|p| p.contains(':')) {
            return Err(Reason::AuthorityUnbracketedIpv6);
        }
        let host = parse_reg_name_or_ipv4(host_text)?;
        (host, port_part.map_or("", |_| &text[host_text.len()..]))
    };
    let port = match (
        port_part.strip_prefix(':'),
        port_part.is_empty(),
        default_port,
    ) {
        (Some(digits), _, _) => parse_port(digits)?,
        (None, true, Some(default)) => default,
        (None, true, None) => return Err(Reason::AuthorityMissingPort),
        (None, false, _) => return Err(Reason::AuthorityMalformed),
    };
    Ok(Target { host, port })
}

/// Splits `[v6]rest`: parses the bracketed IPv6 literal and returns what follows `]`.
fn split_bracketed(text: &str) -> Result<(Host, &str), Reason> {
    let inner_and_rest = text.strip_prefix('[').ok_or(Reason::AuthorityMalformed)?;
    let Some((inner, rest)) = inner_and_rest.split_once(']') else {
        return Err(Reason::AuthorityMalformed);
    };
    if inner.contains('[') || rest.contains('[') || rest.contains(']') {
        return Err(Reason::AuthorityMalformed);
    }
    if inner.contains('%') {
        return Err(Reason::AuthorityZoneId);
    }
    if !inner.contains(':') || inner.starts_with(['v', 'V']) {
        return Err(Reason::AuthorityBracketedNonIpv6);
    }
    let v6 = parse_ipv6_strict(inner).ok_or(Reason::AuthorityBadIpv6)?;
    Ok((Host::Ipv6(v6), rest))
}

/// A host outside brackets: a canonical IPv4 address, or else a DNS name that is not numeric.
fn parse_reg_name_or_ipv4(text: &str) -> Result<Host, Reason> {
    if text.is_empty() {
        return Err(Reason::AuthorityEmptyHost);
    }
    if let Some(v4) = parse_ipv4_canonical(text) {
        return Ok(Host::Ipv4(v4));
    }
    DnsName::parse(text).map(Host::Name)
}

/// 1-65535 in decimal: digits only, no sign, no leading zero.
fn parse_port(digits: &str) -> Result<u16, Reason> {
    let well_formed = !digits.is_empty()
        && digits.len() <= 5
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0');
    if !well_formed {
        return Err(Reason::AuthorityBadPort);
    }
    let value: u32 = digits.parse().map_err(|_| Reason::AuthorityBadPort)?;
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(Reason::AuthorityBadPort)
}

/// RFC 3986 `pchar`, `/` and `?`: unreserved, sub-delims, `:`, `@`, and `%` (checked apart).
fn is_path_or_query_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
                | b'?'
                | b'%'
        )
}

/// Every `%` starts a two-hex-digit escape.
fn percent_escapes_are_whole(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let whole = bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
            if !whole {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(text: &str) -> Result<Target, Reason> {
        parse_connect_authority(text)
    }

    fn name(text: &str) -> Host {
        Host::Name(DnsName::parse(text).unwrap())
    }

    #[test]
    fn connect_accepts_the_three_host_forms() {
        assert_eq!(
            connect("example.com:443"),
            Ok(Target {
                host: name("example.com"),
                port: 443
            })
        );
        assert_eq!(
            connect("93.184.216.34:80"),
            Ok(Target {
                host: Host::Ipv4(Ipv4Addr::new(93, 184, 216, 34)),
                port: 80
            })
        );
        assert_eq!(
            connect("[2606:4700::1111]:443"),
            Ok(Target {
                host: Host::Ipv6("2606:4700::1111".parse().unwrap()),
                port: 443
            })
        );
        assert_eq!(connect("a:1").unwrap().port, 1);
        assert_eq!(connect("a:65535").unwrap().port, 65535);
        assert_eq!(
            connect("0.0.0.0:1").unwrap().host,
            Host::Ipv4(Ipv4Addr::UNSPECIFIED)
        );
        assert_eq!(
            connect("[::ffff:1.2.3.4]:1").unwrap().host,
            Host::Ipv6("::ffff:1.2.3.4".parse().unwrap())
        );
    }

    #[test]
    fn names_are_canonical_lower_case_without_trailing_dot() {
        let a = connect("ExAmPlE.CoM.:443").unwrap();
        let b = connect("example.com:443").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "example.com:443");
        let Host::Name(n) = a.host else {
            panic!("a name")
        };
        assert_eq!(n.to_fqdn(), "example.com.");
    }

    #[test]
    fn connect_has_no_default_port() {
        assert_eq!(connect("example.com"), Err(Reason::AuthorityMissingPort));
        assert_eq!(connect("[::1]"), Err(Reason::AuthorityMissingPort));
    }

    #[test]
    fn refused_spellings_each_with_their_reason() {
        let cases: &[(&str, Reason)] = &[
            ("", Reason::TargetEmpty),
            ("user@example.com:443", Reason::AuthorityUserinfo),
            ("user:pass@example.com:443", Reason::AuthorityUserinfo),
            ("@example.com:443", Reason::AuthorityUserinfo),
            ("exa%6dple.com:443", Reason::AuthorityPercentEncoded),
            ("example.com:%34%34%33", Reason::AuthorityPercentEncoded),
            ("[fe80::1%25eth0]:443", Reason::AuthorityZoneId),
            ("[fe80::1%eth0]:443", Reason::AuthorityZoneId),
            ("[example.com]:443", Reason::AuthorityBracketedNonIpv6),
            ("[127.0.0.1]:443", Reason::AuthorityBracketedNonIpv6),
            ("[v1.fe]:443", Reason::AuthorityBracketedNonIpv6),
            ("[::1:443", Reason::AuthorityMalformed),
            ("[::1]]:443", Reason::AuthorityMalformed),
            ("[::1]x:443", Reason::AuthorityMalformed),
            ("ex[am]ple.com:443", Reason::AuthorityMalformed),
            ("[::g]:443", Reason::AuthorityBadIpv6),
            ("[:::1]:443", Reason::AuthorityBadIpv6),
            ("[::ffff:01.2.3.4]:443", Reason::AuthorityBadIpv6),
            ("::1:443", Reason::AuthorityUnbracketedIpv6),
            ("2001:db8::1:443", Reason::AuthorityUnbracketedIpv6),
            ("2130706433:443", Reason::AuthorityNumericSpelling),
            ("0177.0.0.1:443", Reason::AuthorityNumericSpelling),
            ("0x7f.1:443", Reason::AuthorityNumericSpelling),
            ("0x7f.0x0.0x0.0x1:443", Reason::AuthorityNumericSpelling),
            ("0x7f000001:443", Reason::AuthorityNumericSpelling),
            ("127.1:443", Reason::AuthorityNumericSpelling),
            ("127.0.1:443", Reason::AuthorityNumericSpelling),
            ("1.2.3:443", Reason::AuthorityNumericSpelling),
            ("127.0.0.1.:443", Reason::AuthorityNumericSpelling),
            ("127.000.000.001:443", Reason::AuthorityNumericSpelling),
            ("256.1.1.1:443", Reason::AuthorityNumericSpelling),
            ("1.2.3.4.5:443", Reason::AuthorityNumericSpelling),
            ("example.0x:443", Reason::AuthorityNumericSpelling),
            ("example.123:443", Reason::AuthorityNumericSpelling),
            ("example.com/:443", Reason::AuthorityPathOrQuery),
            ("example.com:443/", Reason::AuthorityPathOrQuery),
            ("example.com:443?x", Reason::AuthorityPathOrQuery),
            ("example.com:443#x", Reason::AuthorityPathOrQuery),
            ("example.com:443 ", Reason::TargetControlOrWhitespace),
            (" example.com:443", Reason::TargetControlOrWhitespace),
            ("exa\tmple.com:443", Reason::TargetControlOrWhitespace),
            ("example.com\0:443", Reason::TargetControlOrWhitespace),
            ("example.com\x7f:443", Reason::TargetControlOrWhitespace),
            ("exämple.com:443", Reason::TargetNonAscii),
            ("xn--exmple-cua.com:443\u{200b}", Reason::TargetNonAscii),
            ("example.com:", Reason::AuthorityBadPort),
            ("example.com:0", Reason::AuthorityBadPort),
            ("example.com:0443", Reason::AuthorityBadPort),
            ("example.com:+443", Reason::AuthorityBadPort),
            ("example.com:-1", Reason::AuthorityBadPort),
            ("example.com:65536", Reason::AuthorityBadPort),
            ("example.com:99999", Reason::AuthorityBadPort),
            ("example.com:443443", Reason::AuthorityBadPort),
            ("example.com:0x1bb", Reason::AuthorityBadPort),
            ("example.com:443:443", Reason::AuthorityUnbracketedIpv6),
            (":443", Reason::AuthorityEmptyHost),
            ("example..com:443", Reason::AuthorityBadName),
            (".example.com:443", Reason::AuthorityBadName),
            ("example.com..:443", Reason::AuthorityBadName),
            (".:443", Reason::AuthorityBadName),
            ("-example.com:443", Reason::AuthorityBadName),
            ("example-.com:443", Reason::AuthorityBadName),
            ("exa_mple.com:443", Reason::AuthorityBadName),
            ("exa\\mple.com:443", Reason::AuthorityBadName),
            ("*.example.com:443", Reason::AuthorityBadName),
        ];
        for (text, reason) in cases {
            assert_eq!(connect(text), Err(*reason), "{text:?}");
        }
    }

    #[test]
    fn label_and_name_lengths_are_bounded() {
        let label63 = "a".repeat(63);
        assert!(connect(&format!("{label63}.com:443")).is_ok());
        assert_eq!(
            connect(&format!("{}.com:443", "a".repeat(64))),
            Err(Reason::AuthorityBadName)
        );
        // 4 labels of 63 + 3 dots = 255 bytes: too long; 253 is the most.
        let long = [label63.as_str(); 4].join(".");
        assert_eq!(
            connect(&format!("{long}:443")),
            Err(Reason::AuthorityBadName)
        );
        let max = format!("{}.{}.{}.{}", label63, label63, label63, "a".repeat(61));
        assert_eq!(max.len(), 253);
        assert!(connect(&format!("{max}:443")).is_ok());
        assert!(connect(&format!("{max}.:443")).is_ok());
        assert_eq!(connect(&"a".repeat(400)), Err(Reason::TargetTooLong));
    }

    #[test]
    fn names_with_numeric_inner_labels_are_names() {
        assert!(connect("1password.com:443").is_ok());
        assert!(connect("123.example.com:443").is_ok());
        assert!(connect("0x7f.example.com:443").is_ok());
        assert!(connect("1.2.3.4x:443").is_ok());
    }

    #[test]
    fn absolute_url_parses_http_only() {
        let r = parse_absolute_url("http://Example.COM/a/b?c=d").unwrap();
        assert_eq!(
            r.target,
            Target {
                host: name("example.com"),
                port: 80
            }
        );
        assert_eq!(r.origin_form, "/a/b?c=d");
        let r = parse_absolute_url("HTTP://example.com:8080").unwrap();
        assert_eq!(r.target.port, 8080);
        assert_eq!(r.origin_form, "/");
        let r = parse_absolute_url("http://[2606:4700::1]?q").unwrap();
        assert_eq!(r.origin_form, "/?q");
        assert_eq!(
            parse_absolute_url("http://example.com/%7Euser")
                .unwrap()
                .origin_form,
            "/%7Euser"
        );
        assert!(parse_absolute_url("http://example.com/user@host").is_ok());
    }

    #[test]
    fn absolute_url_refusals() {
        let cases: &[(&str, Reason)] = &[
            ("https://example.com/", Reason::UrlSchemeNotHttp),
            ("ftp://example.com/", Reason::UrlSchemeNotHttp),
            ("example.com/", Reason::UrlMalformed),
            ("http:/example.com/", Reason::UrlMalformed),
            ("://example.com/", Reason::UrlMalformed),
            ("http://example.com/#frag", Reason::UrlFragment),
            ("http://user@example.com/", Reason::AuthorityUserinfo),
            ("http://user:pw@example.com/", Reason::AuthorityUserinfo),
            ("http://exa%6dple.com/", Reason::AuthorityPercentEncoded),
            ("http://2130706433/", Reason::AuthorityNumericSpelling),
            ("http://0x7f.1/", Reason::AuthorityNumericSpelling),
            ("http://127.1/", Reason::AuthorityNumericSpelling),
            ("http://[::1%25lo]/", Reason::AuthorityZoneId),
            ("http://[127.0.0.1]/", Reason::AuthorityBracketedNonIpv6),
            ("http:///path", Reason::AuthorityEmptyHost),
            ("http://example.com:/", Reason::AuthorityBadPort),
            ("http://example.com:080/", Reason::AuthorityBadPort),
            ("http://example.com/a b", Reason::TargetControlOrWhitespace),
            ("http://example.com/a<b", Reason::UrlBadPath),
            ("http://example.com/a%zz", Reason::UrlBadPath),
            ("http://example.com/a%2", Reason::UrlBadPath),
            ("http://example.com/a\\b", Reason::UrlBadPath),
            ("http://example.com/ä", Reason::TargetNonAscii),
        ];
        for (text, reason) in cases {
            assert_eq!(parse_absolute_url(text), Err(*reason), "{text:?}");
        }
        let long = format!("http://example.com/{}", "a".repeat(URL_MAX_BYTES));
        assert_eq!(parse_absolute_url(&long), Err(Reason::TargetTooLong));
    }

    #[test]
    fn host_header_must_agree_with_the_url() {
        let r = parse_absolute_url("http://example.com/x").unwrap();
        assert_eq!(check_host_header(&r, &["example.com"]), Ok(()));
        assert_eq!(check_host_header(&r, &["EXAMPLE.com.:80"]), Ok(()));
        assert_eq!(check_host_header(&r, &[]), Err(Reason::HostHeaderMissing));
        assert_eq!(
            check_host_header(&r, &["example.com", "example.com"]),
            Err(Reason::HostHeaderRepeated)
        );
        assert_eq!(
            check_host_header(&r, &["example.org"]),
            Err(Reason::HostHeaderMismatch)
        );
        assert_eq!(
            check_host_header(&r, &["example.com:8080"]),
            Err(Reason::HostHeaderMismatch)
        );
        assert_eq!(
            check_host_header(&r, &["127.0.0.1"]),
            Err(Reason::HostHeaderMismatch)
        );
        assert_eq!(
            check_host_header(&r, &["user@example.com"]),
            Err(Reason::HostHeaderMalformed)
        );
        assert_eq!(
            check_host_header(&r, &["example.com/x"]),
            Err(Reason::HostHeaderMalformed)
        );
        assert_eq!(
            check_host_header(&r, &[""]),
            Err(Reason::HostHeaderMalformed)
        );
        let r6 = parse_absolute_url("http://[2606:4700::1]:8080/").unwrap();
        assert_eq!(check_host_header(&r6, &["[2606:4700:0::1]:8080"]), Ok(()));
    }

    #[test]
    fn host_parse_for_configuration_entries() {
        assert_eq!(
            Host::parse("Registry.NPMJS.org."),
            Ok(name("registry.npmjs.org"))
        );
        assert_eq!(
            Host::parse("10.0.0.1"),
            Ok(Host::Ipv4(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(
            Host::parse("[fd00::1]"),
            Ok(Host::Ipv6("fd00::1".parse().unwrap()))
        );
        assert_eq!(
            Host::parse("fd00::1"),
            Err(Reason::AuthorityUnbracketedIpv6)
        );
        assert_eq!(
            Host::parse("example.com:443"),
            Err(Reason::AuthorityUnbracketedIpv6)
        );
        assert_eq!(Host::parse("*.example.com"), Err(Reason::AuthorityBadName));
        assert_eq!(Host::parse("127.1"), Err(Reason::AuthorityNumericSpelling));
    }
}
