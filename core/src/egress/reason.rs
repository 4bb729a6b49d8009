//! Why a request was refused: one variant per case, each with a stable snake_case code.
//!
//! The codes are an interface: the proxy sends them in `X-Corral-Egress-Reason`, logs and counts
//! them, and `corral egress decide` prints them. Never rename a code; add a new one instead.

use std::fmt;

/// The header a refusal's code travels in, from the proxy (or the worker's relay, refusing for
/// it) to the code that asked.
pub const REASON_HEADER: &str = "X-Corral-Egress-Reason";

/// Who a refusal is about, so that a shell can choose its answer (for example an HTTP status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReasonKind {
    /// The credential: missing, malformed, expired or not ours (a proxy answers 407).
    Credential,
    /// The request itself is malformed or spelled in a way we refuse (a proxy answers 403).
    Request,
    /// The policy refuses a well-formed request (a proxy answers 403).
    Policy,
    /// The name's answer cannot be used at all (a proxy answers 502).
    Dns,
}

/// Why the egress decision refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The policy in force is `isolated`: nothing is reachable.
    ModeIsolated,
    /// The target port is not in the policy's allowed ports.
    PortNotAllowed,
    /// In `host_allowlist`, the target host is not one of the exact configured hosts.
    HostNotAllowlisted,
    /// The address is in a class denied in every mode (loopback, link-local, multicast,
    /// unspecified, reserved, documentation, benchmarking, discard and the like).
    AddressAlwaysDenied,
    /// The address is an IPv6 form that embeds an IPv4 address (mapped, compatible, translated,
    /// NAT64, 6to4, Teredo); such forms are denied in every mode.
    AddressEmbeddedIpv4,
    /// The address is in a special-purpose block that is neither private nor always denied
    /// (anycast services, AS112, AMT, ORCHID, ...); denied in every mode.
    AddressSpecialPurpose,
    /// The address is private (RFC 1918, shared address space, unique local) and not inside a
    /// configured private CIDR of a mode that admits them.
    AddressPrivateNotConfigured,
    /// The address is globally routable but the mode is `private_network`.
    AddressPublicNotAllowed,
    /// The name resolved to no address.
    DnsEmptyAnswer,
    /// The answer holds both addresses the policy admits and addresses it refuses.
    DnsMixedAnswer,
    /// The answer holds more addresses than the decision judges.
    DnsAnswerTooLarge,
    /// The request target is empty.
    TargetEmpty,
    /// The request target is longer than its bound.
    TargetTooLong,
    /// The request target holds a byte outside ASCII.
    TargetNonAscii,
    /// The request target holds whitespace or a control character.
    TargetControlOrWhitespace,
    /// The authority carries userinfo (`user@host`).
    AuthorityUserinfo,
    /// The authority holds percent-encoding.
    AuthorityPercentEncoded,
    /// A CONNECT target holds a path, query or fragment.
    AuthorityPathOrQuery,
    /// A CONNECT target has no port (CONNECT has no default port).
    AuthorityMissingPort,
    /// The port is not 1-65535 in plain decimal without sign or leading zero.
    AuthorityBadPort,
    /// A bracketed IPv6 literal carries a zone id.
    AuthorityZoneId,
    /// Brackets around something that is not an IPv6 address (a name, IPv4, or IPvFuture).
    AuthorityBracketedNonIpv6,
    /// A bracketed IPv6 literal does not parse.
    AuthorityBadIpv6,
    /// An IPv6 address without brackets.
    AuthorityUnbracketedIpv6,
    /// An address spelled other than as four canonical decimal parts (decimal, octal, hex or
    /// short forms), or a name whose last label is numeric.
    AuthorityNumericSpelling,
    /// The host is not a valid DNS name (empty label, bad character, label or name too long).
    AuthorityBadName,
    /// The authority has no host.
    AuthorityEmptyHost,
    /// The authority's structure is broken (stray brackets or characters after the host).
    AuthorityMalformed,
    /// An absolute-form URL whose scheme is not `http` (HTTPS goes through CONNECT).
    UrlSchemeNotHttp,
    /// An absolute-form URL that is not `scheme://authority[path][?query]`.
    UrlMalformed,
    /// An absolute-form URL carrying a fragment.
    UrlFragment,
    /// The path or query holds a character the URI grammar does not allow there.
    UrlBadPath,
    /// An absolute-form request without a `Host` header.
    HostHeaderMissing,
    /// More than one `Host` header.
    HostHeaderRepeated,
    /// The `Host` header does not parse as an authority.
    HostHeaderMalformed,
    /// The `Host` header names another host or port than the absolute-form URL.
    HostHeaderMismatch,
    /// No grant was presented.
    GrantMissing,
    /// `Proxy-Authorization` uses another scheme than `Bearer`.
    GrantWrongScheme,
    /// The grant does not decode.
    GrantMalformed,
    /// The grant is longer than its bound.
    GrantTooLarge,
    /// The grant is of a version this release does not accept.
    GrantUnsupportedVersion,
    /// The grant's signature does not verify under the verifying key.
    GrantBadSignature,
    /// The grant's expiry has passed.
    GrantExpired,
    /// The grant claims to be issued later than now allows.
    GrantNotYetValid,
    /// The grant's lifetime exceeds the ceiling.
    GrantLifetimeTooLong,
}

impl Reason {
    /// Every reason, for tests and for operators' documentation.
    pub const ALL: [Reason; 45] = [
        Reason::ModeIsolated,
        Reason::PortNotAllowed,
        Reason::HostNotAllowlisted,
        Reason::AddressAlwaysDenied,
        Reason::AddressEmbeddedIpv4,
        Reason::AddressSpecialPurpose,
        Reason::AddressPrivateNotConfigured,
        Reason::AddressPublicNotAllowed,
        Reason::DnsEmptyAnswer,
        Reason::DnsMixedAnswer,
        Reason::DnsAnswerTooLarge,
        Reason::TargetEmpty,
        Reason::TargetTooLong,
        Reason::TargetNonAscii,
        Reason::TargetControlOrWhitespace,
        Reason::AuthorityUserinfo,
        Reason::AuthorityPercentEncoded,
        Reason::AuthorityPathOrQuery,
        Reason::AuthorityMissingPort,
        Reason::AuthorityBadPort,
        Reason::AuthorityZoneId,
        Reason::AuthorityBracketedNonIpv6,
        Reason::AuthorityBadIpv6,
        Reason::AuthorityUnbracketedIpv6,
        Reason::AuthorityNumericSpelling,
        Reason::AuthorityBadName,
        Reason::AuthorityEmptyHost,
        Reason::AuthorityMalformed,
        Reason::UrlSchemeNotHttp,
        Reason::UrlMalformed,
        Reason::UrlFragment,
        Reason::UrlBadPath,
        Reason::HostHeaderMissing,
        Reason::HostHeaderRepeated,
        Reason::HostHeaderMalformed,
        Reason::HostHeaderMismatch,
        Reason::GrantMissing,
        Reason::GrantWrongScheme,
        Reason::GrantMalformed,
        Reason::GrantTooLarge,
        Reason::GrantUnsupportedVersion,
        Reason::GrantBadSignature,
        Reason::GrantExpired,
        Reason::GrantNotYetValid,
        Reason::GrantLifetimeTooLong,
    ];

    /// The stable snake_case code of this reason.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Reason::ModeIsolated => "mode_isolated",
            Reason::PortNotAllowed => "port_not_allowed",
            Reason::HostNotAllowlisted => "host_not_allowlisted",
            Reason::AddressAlwaysDenied => "address_always_denied",
            Reason::AddressEmbeddedIpv4 => "address_embedded_ipv4",
            Reason::AddressSpecialPurpose => "address_special_purpose",
            Reason::AddressPrivateNotConfigured => "address_private_not_configured",
            Reason::AddressPublicNotAllowed => "address_public_not_allowed",
            Reason::DnsEmptyAnswer => "dns_empty_answer",
            Reason::DnsMixedAnswer => "dns_mixed_answer",
            Reason::DnsAnswerTooLarge => "dns_answer_too_large",
            Reason::TargetEmpty => "target_empty",
            Reason::TargetTooLong => "target_too_long",
            Reason::TargetNonAscii => "target_non_ascii",
            Reason::TargetControlOrWhitespace => "target_control_or_whitespace",
            Reason::AuthorityUserinfo => "authority_userinfo",
            Reason::AuthorityPercentEncoded => "authority_percent_encoded",
            Reason::AuthorityPathOrQuery => "authority_path_or_query",
            Reason::AuthorityMissingPort => "authority_missing_port",
            Reason::AuthorityBadPort => "authority_bad_port",
            Reason::AuthorityZoneId => "authority_zone_id",
            Reason::AuthorityBracketedNonIpv6 => "authority_bracketed_non_ipv6",
            Reason::AuthorityBadIpv6 => "authority_bad_ipv6",
            Reason::AuthorityUnbracketedIpv6 => "authority_unbracketed_ipv6",
            Reason::AuthorityNumericSpelling => "authority_numeric_spelling",
            Reason::AuthorityBadName => "authority_bad_name",
            Reason::AuthorityEmptyHost => "authority_empty_host",
            Reason::AuthorityMalformed => "authority_malformed",
            Reason::UrlSchemeNotHttp => "url_scheme_not_http",
            Reason::UrlMalformed => "url_malformed",
            Reason::UrlFragment => "url_fragment",
            Reason::UrlBadPath => "url_bad_path",
            Reason::HostHeaderMissing => "host_header_missing",
            Reason::HostHeaderRepeated => "host_header_repeated",
            Reason::HostHeaderMalformed => "host_header_malformed",
            Reason::HostHeaderMismatch => "host_header_mismatch",
            Reason::GrantMissing => "grant_missing",
            Reason::GrantWrongScheme => "grant_wrong_scheme",
            Reason::GrantMalformed => "grant_malformed",
            Reason::GrantTooLarge => "grant_too_large",
            Reason::GrantUnsupportedVersion => "grant_unsupported_version",
            Reason::GrantBadSignature => "grant_bad_signature",
            Reason::GrantExpired => "grant_expired",
            Reason::GrantNotYetValid => "grant_not_yet_valid",
            Reason::GrantLifetimeTooLong => "grant_lifetime_too_long",
        }
    }

    /// Who the refusal is about.
    #[must_use]
    pub fn kind(self) -> ReasonKind {
        match self {
            Reason::ModeIsolated
            | Reason::PortNotAllowed
            | Reason::HostNotAllowlisted
            | Reason::AddressAlwaysDenied
            | Reason::AddressEmbeddedIpv4
            | Reason::AddressSpecialPurpose
            | Reason::AddressPrivateNotConfigured
            | Reason::AddressPublicNotAllowed
            | Reason::DnsMixedAnswer => ReasonKind::Policy,
            Reason::DnsEmptyAnswer | Reason::DnsAnswerTooLarge => ReasonKind::Dns,
            Reason::TargetEmpty
            | Reason::TargetTooLong
            | Reason::TargetNonAscii
            | Reason::TargetControlOrWhitespace
            | Reason::AuthorityUserinfo
            | Reason::AuthorityPercentEncoded
            | Reason::AuthorityPathOrQuery
            | Reason::AuthorityMissingPort
            | Reason::AuthorityBadPort
            | Reason::AuthorityZoneId
            | Reason::AuthorityBracketedNonIpv6
            | Reason::AuthorityBadIpv6
            | Reason::AuthorityUnbracketedIpv6
            | Reason::AuthorityNumericSpelling
            | Reason::AuthorityBadName
            | Reason::AuthorityEmptyHost
            | Reason::AuthorityMalformed
            | Reason::UrlSchemeNotHttp
            | Reason::UrlMalformed
            | Reason::UrlFragment
            | Reason::UrlBadPath
            | Reason::HostHeaderMissing
            | Reason::HostHeaderRepeated
            | Reason::HostHeaderMalformed
            | Reason::HostHeaderMismatch => ReasonKind::Request,
            Reason::GrantMissing
            | Reason::GrantWrongScheme
            | Reason::GrantMalformed
            | Reason::GrantTooLarge
            | Reason::GrantUnsupportedVersion
            | Reason::GrantBadSignature
            | Reason::GrantExpired
            | Reason::GrantNotYetValid
            | Reason::GrantLifetimeTooLong => ReasonKind::Credential,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// True when `code` is non-empty lower-case snake_case (letters, digits, single underscores).
#[cfg(test)]
pub(crate) fn is_snake_case(code: &str) -> bool {
    !code.is_empty()
        && !code.starts_with('_')
        && !code.ends_with('_')
        && !code.contains("__")
        && code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn codes_are_unique_and_snake_case() {
        let codes: BTreeSet<&str> = Reason::ALL.iter().map(|r| r.code()).collect();
        assert_eq!(codes.len(), Reason::ALL.len());
        for code in codes {
            assert!(is_snake_case(code), "{code}");
        }
    }

    #[test]
    fn every_reason_has_a_kind_and_displays_its_code() {
        for reason in Reason::ALL {
            let _ = reason.kind();
            assert_eq!(reason.to_string(), reason.code());
        }
    }
}
