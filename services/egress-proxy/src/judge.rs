//! The shell's half of a decision: parse what the client sent, ask the core, resolve when the
//! core asks for it, and ask the core again with the answer. Shared by the proxy and by
//! `corral egress decide`, so the two cannot drift; every predicate is the core's.

use std::net::{IpAddr, SocketAddr};

use corral_core::egress::{
    Decision, HttpRequestTarget, Policy, Reason, Target, TargetDecision, check_host_header,
    decide_answer, decide_target, parse_absolute_url, parse_connect_authority,
};

use crate::dns::{DnsOutcome, Resolve};
use crate::refusal::Refusal;

/// How the client asks: a CONNECT authority or an absolute-form `http://` URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `CONNECT host:port`.
    Connect,
    /// A plain-HTTP request with an absolute-form URL.
    Http,
}

impl Via {
    /// The flag spelling: `connect` or `http`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Connect => "connect",
            Via::Http => "http",
        }
    }
}

/// A request target the core accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedTarget {
    /// A CONNECT authority.
    Connect(Target),
    /// An absolute-form URL (with the origin-form to send upstream).
    Http(HttpRequestTarget),
}

impl ParsedTarget {
    /// The destination.
    #[must_use]
    pub fn target(&self) -> &Target {
        match self {
            ParsedTarget::Connect(target) => target,
            ParsedTarget::Http(request) => &request.target,
        }
    }
}

/// Parses the request target as the client sent it. For `Via::Http`, `host_values` are the
/// request's `Host` header values, checked against the URL; `None` skips that check (the decide
/// tool without `--host-header`). A `Host` header on CONNECT is not judged.
pub fn parse_request_target(
    via: Via,
    text: &str,
    host_values: Option<&[&str]>,
) -> Result<ParsedTarget, Reason> {
    match via {
        Via::Connect => parse_connect_authority(text).map(ParsedTarget::Connect),
        Via::Http => {
            let request = parse_absolute_url(text)?;
            if let Some(values) = host_values {
                check_host_header(&request, values)?;
            }
            Ok(ParsedTarget::Http(request))
        }
    }
}

/// How the target's addresses were found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The decision needed no DNS (an address literal, or refused before resolution).
    NotNeeded,
    /// The name was resolved; the outcome.
    Resolved(DnsOutcome),
}

/// The full outcome of judging one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgment {
    /// Allowed (with the pinned address to dial) or refused.
    pub verdict: Verdict,
    /// What DNS said, if asked.
    pub lookup: Lookup,
}

/// Allow or deny.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Dial exactly this address.
    Allow {
        /// The pinned address and port.
        pinned: SocketAddr,
    },
    /// Refused.
    Deny {
        /// Why.
        refusal: Refusal,
        /// The first refused address, when an address was judged.
        address: Option<IpAddr>,
    },
}

impl Verdict {
    fn from_decision(decision: Decision) -> Verdict {
        match decision {
            Decision::Allow { pinned } => Verdict::Allow { pinned },
            Decision::Deny { reason, address } => Verdict::Deny {
                refusal: Refusal::Decision(reason),
                address,
            },
        }
    }
}

/// Judges a parsed target under `policy`: the core decides before DNS; for a name, `resolver`
/// is asked once, fresh, and the core decides over the complete answer. NXDOMAIN is an empty
/// answer to the core (`dns_empty_answer`); a failed lookup is the shell's refusal.
pub async fn judge<R: Resolve>(policy: &Policy, target: &Target, resolver: &R) -> Judgment {
    let name = match decide_target(policy, target) {
        TargetDecision::Decided(decision) => {
            return Judgment {
                verdict: Verdict::from_decision(decision),
                lookup: Lookup::NotNeeded,
            };
        }
        TargetDecision::NeedsResolution { name } => name,
    };
    let outcome = resolver.resolve(&name).await;
    let verdict = match &outcome {
        DnsOutcome::Answer(addresses) => {
            Verdict::from_decision(decide_answer(policy, target, addresses))
        }
        DnsOutcome::NxDomain => Verdict::from_decision(decide_answer(policy, target, &[])),
        DnsOutcome::Failed(reason) => Verdict::Deny {
            refusal: Refusal::Shell(*reason),
            address: None,
        },
    };
    Judgment {
        verdict,
        lookup: Lookup::Resolved(outcome),
    }
}
