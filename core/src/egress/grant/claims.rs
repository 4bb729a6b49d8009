//! What a grant binds, and the rules every set of claims must keep: ids and times.

use std::fmt;

use super::{GRANT_CLOCK_SKEW_MAX_MS, RUN_ID_MAX_BYTES};
use crate::egress::mode::TokenTtl;
use crate::egress::policy::Policy;
use crate::egress::reason::Reason;
use crate::ids::ActorId;
use crate::time::UnixMillis;

/// A unique id for one issued grant, drawn by the caller from its randomness (16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExecutionId(pub [u8; 16]);

impl fmt::Display for ExecutionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::ids::hex(&self.0))
    }
}

/// What a grant binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantClaims {
    /// The policy the run may use: mode, ports, hosts, CIDRs.
    pub policy: Policy,
    /// The run.
    pub run: String,
    /// The actor the run acts for.
    pub actor: ActorId,
    /// This grant's unique id.
    pub execution_id: ExecutionId,
    /// When the grant was issued.
    pub issued_at: UnixMillis,
    /// When it stops being valid (valid while `now < expires_at`).
    pub expires_at: UnixMillis,
    /// The revision of the deployment policy it was minted under.
    pub policy_revision: u64,
}

impl GrantClaims {
    /// Whether claims that already passed [`GrantVerifier::verify`] are still valid at `now`:
    /// the same time rules `verify` applies. For a verifier that keeps verified claims (keyed by
    /// the exact token and verifying key) and must not trust them past their lifetime.
    ///
    /// [`GrantVerifier::verify`]: super::GrantVerifier::verify
    pub fn check_time(&self, now: UnixMillis) -> Result<(), Reason> {
        check_times(self, now)
    }
}

pub(super) fn check_times(claims: &GrantClaims, now: UnixMillis) -> Result<(), Reason> {
    if claims.expires_at <= claims.issued_at {
        return Err(Reason::GrantMalformed);
    }
    if claims.expires_at.ms_since(claims.issued_at) > TokenTtl::CEILING_SECONDS * 1000 {
        return Err(Reason::GrantLifetimeTooLong);
    }
    if claims.issued_at.ms_since(now) > GRANT_CLOCK_SKEW_MAX_MS {
        return Err(Reason::GrantNotYetValid);
    }
    if now >= claims.expires_at {
        return Err(Reason::GrantExpired);
    }
    Ok(())
}

pub(super) fn run_is_valid(run: &str) -> bool {
    !run.is_empty() && run.len() <= RUN_ID_MAX_BYTES && run.bytes().all(|b| b.is_ascii_graphic())
}

pub(super) fn actor_is_valid(actor: &str) -> bool {
    crate::ids::identity_is_valid(actor)
}
