//! Why the proxy (or `corral egress decide`) refused, and the HTTP status each refusal gets.
//!
//! The decision's own reasons are [`corral_core::egress::Reason`]; this module only adds what a
//! shell observes and the core cannot: DNS lookups that fail, upstream connections that fail,
//! HTTP framing the proxy will not read, and a verifying key it cannot load. Every code is
//! stable snake_case and travels in `X-Corral-Egress-Reason`; never rename one.
//!
//! Status mapping: credential refusals 407, request and policy refusals 403 (as the core's
//! [`ReasonKind`] says), DNS failures and failed upstream connections 502, timeouts 504.

use std::fmt;

use corral_core::egress::{Reason, ReasonKind};

/// What a shell observed that ends a request, beyond the decision's reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ShellReason {
    /// The name server answered with an error (SERVFAIL, REFUSED, ...) or could not be reached.
    DnsLookupFailed,
    /// The name server did not answer in time.
    DnsTimeout,
    /// The pinned upstream refused the connection.
    UpstreamConnectRefused,
    /// Connecting to the pinned upstream failed otherwise (unreachable, reset, ...).
    UpstreamConnectFailed,
    /// Connecting to the pinned upstream took longer than the connect timeout.
    UpstreamConnectTimeout,
    /// The request head is not HTTP/1.x the proxy reads (bad request line, header syntax).
    RequestMalformed,
    /// The request head is longer than the header bound.
    RequestHeaderTooLarge,
    /// The request head did not arrive within the header read time.
    RequestHeaderTimeout,
    /// A request body framing the proxy refuses (conflicting or unknown transfer codings).
    RequestBodyFraming,
    /// The proxy holds no usable verifying key, so it can trust no grant (EGR-8).
    VerifyingKeyUnavailable,
}

impl ShellReason {
    /// Every shell reason.
    pub const ALL: [ShellReason; 10] = [
        ShellReason::DnsLookupFailed,
        ShellReason::DnsTimeout,
        ShellReason::UpstreamConnectRefused,
        ShellReason::UpstreamConnectFailed,
        ShellReason::UpstreamConnectTimeout,
        ShellReason::RequestMalformed,
        ShellReason::RequestHeaderTooLarge,
        ShellReason::RequestHeaderTimeout,
        ShellReason::RequestBodyFraming,
        ShellReason::VerifyingKeyUnavailable,
    ];

    /// The stable snake_case code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            ShellReason::DnsLookupFailed => "dns_lookup_failed",
            ShellReason::DnsTimeout => "dns_timeout",
            ShellReason::UpstreamConnectRefused => "upstream_connect_refused",
            ShellReason::UpstreamConnectFailed => "upstream_connect_failed",
            ShellReason::UpstreamConnectTimeout => "upstream_connect_timeout",
            ShellReason::RequestMalformed => "request_malformed",
            ShellReason::RequestHeaderTooLarge => "request_header_too_large",
            ShellReason::RequestHeaderTimeout => "request_header_timeout",
            ShellReason::RequestBodyFraming => "request_body_framing",
            ShellReason::VerifyingKeyUnavailable => "verifying_key_unavailable",
        }
    }

    /// The HTTP status the proxy answers with.
    #[must_use]
    pub fn status(self) -> u16 {
        match self {
            ShellReason::DnsLookupFailed
            | ShellReason::UpstreamConnectRefused
            | ShellReason::UpstreamConnectFailed => 502,
            ShellReason::DnsTimeout | ShellReason::UpstreamConnectTimeout => 504,
            ShellReason::RequestMalformed | ShellReason::RequestBodyFraming => 400,
            ShellReason::RequestHeaderTooLarge => 431,
            ShellReason::RequestHeaderTimeout => 408,
            ShellReason::VerifyingKeyUnavailable => 407,
        }
    }
}

/// Any refusal: the decision's reason, or what the shell observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// The core decision refused (credential, request, policy or answer).
    Decision(Reason),
    /// The shell observed a failure the core does not judge.
    Shell(ShellReason),
}

impl Refusal {
    /// The stable snake_case code sent in `X-Corral-Egress-Reason`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Decision(reason) => reason.code(),
            Refusal::Shell(reason) => reason.code(),
        }
    }

    /// The HTTP status for this refusal.
    #[must_use]
    pub fn status(self) -> u16 {
        match self {
            Refusal::Decision(reason) => match reason.kind() {
                ReasonKind::Credential => 407,
                ReasonKind::Request | ReasonKind::Policy => 403,
                ReasonKind::Dns => 502,
            },
            Refusal::Shell(reason) => reason.status(),
        }
    }
}

impl From<Reason> for Refusal {
    fn from(reason: Reason) -> Self {
        Refusal::Decision(reason)
    }
}

impl From<ShellReason> for Refusal {
    fn from(reason: ShellReason) -> Self {
        Refusal::Shell(reason)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// The reason phrase for a status this proxy sends.
#[must_use]
pub fn status_text(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn codes_are_unique_across_core_and_shell() {
        let mut codes = BTreeSet::new();
        for reason in Reason::ALL {
            assert!(codes.insert(Refusal::from(reason).code()));
        }
        for reason in ShellReason::ALL {
            assert!(codes.insert(Refusal::from(reason).code()), "{reason:?}");
        }
    }

    #[test]
    fn statuses_follow_the_issue() {
        assert_eq!(Refusal::from(Reason::GrantMissing).status(), 407);
        assert_eq!(Refusal::from(Reason::GrantExpired).status(), 407);
        assert_eq!(Refusal::from(Reason::GrantBadSignature).status(), 407);
        assert_eq!(Refusal::from(Reason::AddressAlwaysDenied).status(), 403);
        assert_eq!(Refusal::from(Reason::AuthorityUserinfo).status(), 403);
        assert_eq!(Refusal::from(Reason::DnsEmptyAnswer).status(), 502);
        assert_eq!(Refusal::from(ShellReason::DnsLookupFailed).status(), 502);
        assert_eq!(
            Refusal::from(ShellReason::UpstreamConnectRefused).status(),
            502
        );
        assert_eq!(
            Refusal::from(ShellReason::UpstreamConnectTimeout).status(),
            504
        );
        assert_eq!(Refusal::from(ShellReason::DnsTimeout).status(), 504);
        assert_eq!(
            Refusal::from(ShellReason::VerifyingKeyUnavailable).status(),
            407
        );
    }
}
