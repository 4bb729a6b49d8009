//! Minting: what the minter is asked for, what it refuses, and narrowing by a provider hint.

use std::collections::BTreeSet;
use std::fmt;

use super::claims::{ExecutionId, GrantClaims, actor_is_valid, run_is_valid};
use super::keys::GrantSigner;
use super::{GRANT_TOKEN_MAX_BYTES, PROVIDER_HINT_MAX};
use crate::egress::mode::TokenTtl;
use crate::egress::policy::{AllowedHosts, Policy};
use crate::egress::target::Host;
use crate::ids::ActorId;
use crate::time::UnixMillis;

/// Why a grant could not be minted. No credential is issued (EGR-8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MintError {
    /// The policy is `isolated`: a run gets no credential.
    ModeIsolated,
    /// In `host_allowlist`, the provider hint names no configured host.
    HintMatchesNoHost,
    /// The run id is empty, too long, or not printable ASCII.
    RunInvalid,
    /// The actor id is empty, too long, or holds a control character.
    ActorInvalid,
    /// The grant would exceed [`GRANT_TOKEN_MAX_BYTES`].
    TooLarge,
}

impl MintError {
    /// The stable snake_case code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            MintError::ModeIsolated => "mode_isolated",
            MintError::HintMatchesNoHost => "hint_matches_no_host",
            MintError::RunInvalid => "run_invalid",
            MintError::ActorInvalid => "actor_invalid",
            MintError::TooLarge => "grant_too_large",
        }
    }
}

/// What the minter is asked for.
#[derive(Clone, Copy, Debug)]
pub struct GrantRequest<'a> {
    /// The deployment's effective policy for this run (from [`super::mode::resolve`]).
    ///
    /// [`super::mode::resolve`]: crate::egress::mode::resolve
    pub policy: &'a Policy,
    /// The provider hint from `run_code`, if any: narrows `host_allowlist`, ignored elsewhere.
    pub provider_hint: Option<&'a [&'a str]>,
    /// The run.
    pub run: &'a str,
    /// The actor.
    pub actor: &'a ActorId,
    /// A fresh unique id for this grant, from the caller's randomness.
    pub execution_id: ExecutionId,
    /// The deployment policy revision.
    pub policy_revision: u64,
    /// Deployment time now.
    pub now: UnixMillis,
    /// The lifetime.
    pub ttl: TokenTtl,
}

/// A minted grant: the token to hand to the worker, and what it binds.
#[derive(Clone, PartialEq, Eq)]
pub struct MintedGrant {
    /// The bearer token (a credential: never log it).
    pub token: String,
    /// The claims it carries.
    pub claims: GrantClaims,
}

impl fmt::Debug for MintedGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MintedGrant")
            .field("token", &"<redacted>")
            .field("claims", &self.claims)
            .finish()
    }
}

impl GrantSigner {
    /// Mints a grant for one run: narrows by the hint, refuses `isolated`, binds the claims.
    pub fn mint(&self, request: &GrantRequest<'_>) -> Result<MintedGrant, MintError> {
        let policy = narrow_by_hint(request.policy, request.provider_hint);
        match (&policy, request.policy) {
            (Policy::Isolated, Policy::HostAllowlist { .. }) => {
                return Err(MintError::HintMatchesNoHost);
            }
            (
                Policy::Isolated,
                Policy::Isolated | Policy::PublicInternet { .. } | Policy::PrivateNetwork { .. },
            ) => {
                return Err(MintError::ModeIsolated);
            }
            (
                Policy::PublicInternet { .. }
                | Policy::PrivateNetwork { .. }
                | Policy::HostAllowlist { .. },
                _,
            ) => {}
        }
        if !run_is_valid(request.run) {
            return Err(MintError::RunInvalid);
        }
        if !actor_is_valid(&request.actor.0) {
            return Err(MintError::ActorInvalid);
        }
        let claims = GrantClaims {
            policy,
            run: request.run.to_owned(),
            actor: request.actor.clone(),
            execution_id: request.execution_id,
            issued_at: request.now,
            expires_at: request.now.plus_ms(request.ttl.millis()),
            policy_revision: request.policy_revision,
        };
        let token = self.sign_claims(&claims);
        if token.len() > GRANT_TOKEN_MAX_BYTES {
            return Err(MintError::TooLarge);
        }
        Ok(MintedGrant { token, claims })
    }
}

/// Applies a provider hint (EGR-4): in `host_allowlist` the hosts become those both configured
/// and hinted (`isolated` when none is both); in every other mode the hint is ignored. Hint
/// entries that do not parse as hosts match nothing, so they can only narrow further.
#[must_use]
pub fn narrow_by_hint(policy: &Policy, hint: Option<&[&str]>) -> Policy {
    match (policy, hint) {
        (
            Policy::HostAllowlist {
                ports,
                hosts,
                cidrs,
            },
            Some(hint),
        ) => {
            let hinted: BTreeSet<Host> = hint
                .iter()
                .take(PROVIDER_HINT_MAX)
                .filter_map(|entry| Host::parse(entry).ok())
                .collect();
            let kept = hosts.iter().filter(|host| hinted.contains(host)).cloned();
            match AllowedHosts::new(kept) {
                Ok(narrowed) if !narrowed.is_empty() => Policy::HostAllowlist {
                    ports: ports.clone(),
                    hosts: narrowed,
                    cidrs: cidrs.clone(),
                },
                Ok(_) | Err(_) => Policy::Isolated,
            }
        }
        (policy, None)
        | (
            policy @ (Policy::Isolated
            | Policy::PublicInternet { .. }
            | Policy::PrivateNetwork { .. }),
            Some(_),
        ) => policy.clone(),
    }
}
