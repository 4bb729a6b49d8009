//! Egress: the one decision about outbound network access (EGR-3), and the grants that carry it.
//!
//! The grant minter (API), the egress proxy and any worker pre-check all call this module; none
//! keeps its own copy of the rule. It is pure: DNS answers, time and randomness (the execution
//! id) are inputs.
//!
//! - [`mode`]: configuration to effective policy, failing closed (EGR-5).
//! - [`address`]: every IANA special-purpose block as data, with its verdict.
//! - [`target`]: strict parsing of CONNECT authorities, absolute-form URLs and `Host` headers.
//! - [`policy`]: the policy a decision is made under.
//! - [`decide`]: [`decide_target`] then [`decide_answer`]; every denial has a [`Reason`].
//! - [`grant`]: ed25519-signed per-run grants; the proxy holds only a [`GrantVerifier`].
//!
//! Decisions recorded here (each tested):
//! - Embedded IPv4 (mapped, compatible, translated, NAT64, 6to4, Teredo) is denied outright; the
//!   embedded address is never judged, so such a form is never more permissive than it.
//! - Special-purpose blocks the registry marks globally reachable (anycast, AS112, AMT, ...) are
//!   still denied: `public_internet` means ordinary global unicast.
//! - A configured private CIDR must lie wholly inside a private block; one that does not (for
//!   example `8.8.8.0/24` or `0.0.0.0/0`) makes the setting unusable and the mode `isolated`.
//!   And a private CIDR is only ever consulted for an address already classed private, so a
//!   configured range can never re-open an always-denied address.
//! - Mode spelling is exact: no case folding, no trimming; anything else is `isolated`.
//! - A token lifetime above 4 hours is clamped to 4 hours; a non-number is the default 600 s.
//! - `https://` absolute-form requests are refused: HTTPS goes through CONNECT.

pub mod address;
pub mod decide;
pub mod grant;
pub mod mode;
pub mod policy;
pub mod reason;
pub mod target;

#[cfg(test)]
mod props;

pub use address::{AddressClass, Cidr, classify};
pub use decide::{Decision, TargetDecision, decide_answer, decide_target, judge_address};
pub use grant::{
    ExecutionId, GrantClaims, GrantRequest, GrantSigner, GrantVerifier, MintError, MintedGrant,
    narrow_by_hint, parse_proxy_authorization,
};
pub use mode::{ConfiguredMode, EgressSettings, Resolution, ResolutionNote, TokenTtl, resolve};
pub use policy::{AllowedHosts, AllowedPorts, Mode, Policy, PrivateCidrs};
pub use reason::{Reason, ReasonKind};
pub use target::{
    DnsName, Host, HttpRequestTarget, Target, check_host_header, parse_absolute_url,
    parse_connect_authority,
};
