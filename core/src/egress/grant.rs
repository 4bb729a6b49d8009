//! Per-run egress grants (EGR-2, EGR-4, EGR-6, EGR-7): ed25519-signed claims that carry the
//! policy a run may use, so that the proxy judges by the grant and not by its own configuration.
//!
//! - The signing key is derived from the deployment's field key with HKDF-SHA256 (salt
//!   [`GRANT_KEY_SALT`], info [`GRANT_KEY_INFO`]): nothing extra to configure or keep in step.
//! - [`GrantSigner`] (the API) mints; [`GrantVerifier`] (the proxy) is built from the 32-byte
//!   public key alone and has no way to mint.
//! - A grant binds mode, hosts, CIDRs, ports, run, actor, a unique execution id (the caller's
//!   randomness), issue time, expiry and policy revision.
//! - Lifetime: [`TokenTtl`], 600 s by default, at most 4 hours.
//! - A provider hint can only narrow, and only in `host_allowlist` ([`narrow_by_hint`]).
//!
//! Token text: `cg1.<base64url(claims)>.<base64url(signature)>` (no padding), where `claims` is
//! the canonical binary encoding below and the signature covers [`GRANT_SIGNATURE_CONTEXT`], a
//! zero byte, then `claims`. It travels as `Proxy-Authorization: Bearer <token>`.
//!
//! Claims encoding, version 1, big-endian: `u8 version=1`, `u8 mode` (1 public_internet,
//! 2 private_network, 3 host_allowlist), `u8 n` + `n × u16` ports ascending, `u8 n` + CIDRs
//! ascending (`u8 family 4|6`, address bytes, `u8 prefix length`), `u8 n` + hosts ascending
//! (`u8 kind`: 1 name as `u8 len` + bytes, 4 IPv4 bytes, 6 IPv6 bytes), `u8 len` + run id,
//! `u16 len` + actor, 16-byte execution id, `u64` issued-at ms, `u64` expires-at ms, `u64` policy
//! revision. Decoding accepts only the canonical encoding (it re-encodes and compares).

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroize as _;

use super::address::Cidr;
use super::mode::TokenTtl;
use super::policy::{ALLOWED_HOSTS_MAX, AllowedHosts, AllowedPorts, Policy, PrivateCidrs};
use super::reason::Reason;
use super::target::{DnsName, Host};
use crate::ids::ActorId;
use crate::time::UnixMillis;

/// HKDF salt for the grant signing key.
pub const GRANT_KEY_SALT: &[u8] = b"corral/egress-grant/v1/salt";
/// HKDF info (domain separation) for the grant signing key.
pub const GRANT_KEY_INFO: &[u8] = b"corral/egress-grant/v1/ed25519-signing-key";
/// Prefix of every signed message, so a grant signature can never be taken for another use.
pub const GRANT_SIGNATURE_CONTEXT: &[u8] = b"corral/egress-grant/v1";
/// The shortest field key a signing key is derived from.
pub const FIELD_KEY_MIN_BYTES: usize = 16;
/// The longest grant token accepted or minted (a proxy's header bound must allow it).
pub const GRANT_TOKEN_MAX_BYTES: usize = 16 * 1024;
/// How far a grant's issue time may be ahead of the verifier's `now` (clock skew).
pub const GRANT_CLOCK_SKEW_MAX_MS: u64 = 30_000;
/// The longest run id.
pub const RUN_ID_MAX_BYTES: usize = 128;
/// The longest actor id.
pub const ACTOR_MAX_BYTES: usize = crate::ids::IDENTITY_MAX_BYTES;
/// The most provider-hint entries read; later ones are ignored (which can only narrow).
pub const PROVIDER_HINT_MAX: usize = 256;

const TOKEN_VERSION_PREFIX: &str = "cg1";
const CLAIMS_VERSION: u8 = 1;

/// A unique id for one issued grant, drawn by the caller from its randomness (16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExecutionId(pub [u8; 16]);

impl fmt::Display for ExecutionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
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

/// Why a key could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyError {
    /// The field key is shorter than [`FIELD_KEY_MIN_BYTES`].
    FieldKeyTooShort,
    /// The public key is not 32 bytes (or its text not 43 base64url characters), or not a point.
    PublicKeyMalformed,
    /// The public key is of small order: it would accept forged signatures.
    PublicKeyWeak,
}

impl KeyError {
    /// The stable snake_case code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            KeyError::FieldKeyTooShort => "field_key_too_short",
            KeyError::PublicKeyMalformed => "public_key_malformed",
            KeyError::PublicKeyWeak => "public_key_weak",
        }
    }
}

/// What the minter is asked for.
#[derive(Clone, Copy, Debug)]
pub struct GrantRequest<'a> {
    /// The deployment's effective policy for this run (from [`super::mode::resolve`]).
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

/// Mints grants. Held by the API only; derived from the field key.
pub struct GrantSigner {
    key: SigningKey,
}

impl fmt::Debug for GrantSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrantSigner")
            .field("public_key", &self.verifier().public_key_text())
            .finish()
    }
}

impl GrantSigner {
    /// Derives the signing key from the deployment's field key (EGR-7).
    pub fn from_field_key(field_key: &[u8]) -> Result<GrantSigner, KeyError> {
        if field_key.len() < FIELD_KEY_MIN_BYTES {
            return Err(KeyError::FieldKeyTooShort);
        }
        let mut seed = [0u8; 32];
        // Expanding 32 bytes from SHA-256 cannot exceed HKDF's output limit.
        let expanded =
            Hkdf::<Sha256>::new(Some(GRANT_KEY_SALT), field_key).expand(GRANT_KEY_INFO, &mut seed);
        if expanded.is_err() {
            seed.zeroize();
            return Err(KeyError::FieldKeyTooShort);
        }
        let key = SigningKey::from_bytes(&seed);
        seed.zeroize();
        Ok(GrantSigner { key })
    }

    /// The verifying half, to publish for the proxy.
    #[must_use]
    pub fn verifier(&self) -> GrantVerifier {
        GrantVerifier {
            key: self.key.verifying_key(),
        }
    }

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

    fn sign_claims(&self, claims: &GrantClaims) -> String {
        let bytes = encode_claims(claims);
        let signature = self.key.sign(&signed_message(&bytes));
        format!(
            "{TOKEN_VERSION_PREFIX}.{}.{}",
            URL_SAFE_NO_PAD.encode(&bytes),
            URL_SAFE_NO_PAD.encode(signature.to_bytes())
        )
    }
}

/// Verifies grants. Built from the public key alone: it cannot mint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantVerifier {
    key: VerifyingKey,
}

impl GrantVerifier {
    /// A verifier from the 32 public key bytes; refuses a non-point or a small-order key.
    pub fn from_public_key_bytes(bytes: &[u8]) -> Result<GrantVerifier, KeyError> {
        let bytes: &[u8; 32] = bytes.try_into().map_err(|_| KeyError::PublicKeyMalformed)?;
        let key = VerifyingKey::from_bytes(bytes).map_err(|_| KeyError::PublicKeyMalformed)?;
        if key.is_weak() {
            return Err(KeyError::PublicKeyWeak);
        }
        Ok(GrantVerifier { key })
    }

    /// A verifier from the public key's text form (base64url, no padding, 43 characters).
    pub fn from_public_key_text(text: &str) -> Result<GrantVerifier, KeyError> {
        if text.len() != 43 {
            return Err(KeyError::PublicKeyMalformed);
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| KeyError::PublicKeyMalformed)?;
        GrantVerifier::from_public_key_bytes(&bytes)
    }

    /// The public key bytes.
    #[must_use]
    pub fn public_key_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// The public key's text form, as the API publishes it.
    #[must_use]
    pub fn public_key_text(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.key.to_bytes())
    }

    /// Verifies a token at `now`: signature first, then the claims' structure, then time. The
    /// claims' policy is what the proxy judges requests by.
    pub fn verify(&self, token: &str, now: UnixMillis) -> Result<GrantClaims, Reason> {
        if token.is_empty() {
            return Err(Reason::GrantMissing);
        }
        if token.len() > GRANT_TOKEN_MAX_BYTES {
            return Err(Reason::GrantTooLarge);
        }
        let mut parts = token.split('.');
        let (Some(prefix), Some(claims_text), Some(signature_text), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Reason::GrantMalformed);
        };
        if prefix != TOKEN_VERSION_PREFIX {
            let versioned = prefix.strip_prefix("cg").is_some_and(|v| {
                !v.is_empty() && v.len() <= 3 && v.bytes().all(|b| b.is_ascii_digit())
            });
            return Err(if versioned {
                Reason::GrantUnsupportedVersion
            } else {
                Reason::GrantMalformed
            });
        }
        let claims_bytes = URL_SAFE_NO_PAD
            .decode(claims_text)
            .map_err(|_| Reason::GrantMalformed)?;
        let signature_bytes = URL_SAFE_NO_PAD
            .decode(signature_text)
            .map_err(|_| Reason::GrantMalformed)?;
        let signature =
            Signature::from_slice(&signature_bytes).map_err(|_| Reason::GrantMalformed)?;
        self.key
            .verify_strict(&signed_message(&claims_bytes), &signature)
            .map_err(|_| Reason::GrantBadSignature)?;
        let claims = decode_claims(&claims_bytes).ok_or(Reason::GrantMalformed)?;
        check_times(&claims, now)?;
        Ok(claims)
    }
}

impl GrantClaims {
    /// Whether claims that already passed [`GrantVerifier::verify`] are still valid at `now`:
    /// the same time rules `verify` applies. For a verifier that keeps verified claims (keyed by
    /// the exact token and verifying key) and must not trust them past their lifetime.
    pub fn check_time(&self, now: UnixMillis) -> Result<(), Reason> {
        check_times(self, now)
    }
}

fn check_times(claims: &GrantClaims, now: UnixMillis) -> Result<(), Reason> {
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

/// Extracts the grant from a `Proxy-Authorization` header value: `Bearer <token>` (scheme in any
/// letter case, one or more spaces), the token of base64url characters and dots. `None` (no
/// header) or an empty value is [`Reason::GrantMissing`]. A proxy refuses a repeated header itself.
pub fn parse_proxy_authorization(value: Option<&str>) -> Result<&str, Reason> {
    let Some(value) = value else {
        return Err(Reason::GrantMissing);
    };
    if value.is_empty() {
        return Err(Reason::GrantMissing);
    }
    if value.len() > GRANT_TOKEN_MAX_BYTES + 16 {
        return Err(Reason::GrantTooLarge);
    }
    let Some((scheme, rest)) = value.split_once(' ') else {
        return Err(if value.eq_ignore_ascii_case("bearer") {
            Reason::GrantMissing
        } else {
            Reason::GrantWrongScheme
        });
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Reason::GrantWrongScheme);
    }
    let token = rest.trim_start_matches(' ');
    if token.is_empty() {
        return Err(Reason::GrantMissing);
    }
    if !token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(Reason::GrantMalformed);
    }
    Ok(token)
}

/// Whether grant text can travel in a header as it is: non-empty, visible ASCII, no spaces. The
/// worker refuses a request carrying one that cannot, and its relay never sends one.
#[must_use]
pub fn grant_is_sendable(grant: &str) -> bool {
    !grant.is_empty() && grant.bytes().all(|b| b.is_ascii_graphic())
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

fn run_is_valid(run: &str) -> bool {
    !run.is_empty() && run.len() <= RUN_ID_MAX_BYTES && run.bytes().all(|b| b.is_ascii_graphic())
}

fn actor_is_valid(actor: &str) -> bool {
    crate::ids::identity_is_valid(actor)
}

fn signed_message(claims: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(GRANT_SIGNATURE_CONTEXT.len() + 1 + claims.len());
    message.extend_from_slice(GRANT_SIGNATURE_CONTEXT);
    message.push(0);
    message.extend_from_slice(claims);
    message
}

fn encode_claims(claims: &GrantClaims) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.push(CLAIMS_VERSION);
    let empty_cidrs = PrivateCidrs::empty();
    let empty_hosts = AllowedHosts::default();
    let (mode, ports, cidrs, hosts) = match &claims.policy {
        Policy::Isolated => (0u8, None, &empty_cidrs, &empty_hosts),
        Policy::PublicInternet { ports } => (1, Some(ports), &empty_cidrs, &empty_hosts),
        Policy::PrivateNetwork { ports, cidrs } => (2, Some(ports), cidrs, &empty_hosts),
        Policy::HostAllowlist {
            ports,
            hosts,
            cidrs,
        } => (3, Some(ports), cidrs, hosts),
    };
    out.push(mode);
    let ports: Vec<u16> = ports.map(|p| p.iter().collect()).unwrap_or_default();
    push_count(&mut out, ports.len());
    for port in ports {
        out.extend_from_slice(&port.to_be_bytes());
    }
    push_count(&mut out, cidrs.iter().count());
    for cidr in cidrs.iter() {
        match cidr.addr() {
            IpAddr::V4(v4) => {
                out.push(4);
                out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out.push(6);
                out.extend_from_slice(&v6.octets());
            }
        }
        out.push(cidr.prefix_len());
    }
    push_count(&mut out, hosts.iter().count());
    for host in hosts.iter() {
        match host {
            Host::Name(name) => {
                out.push(1);
                push_count(&mut out, name.as_str().len());
                out.extend_from_slice(name.as_str().as_bytes());
            }
            Host::Ipv4(v4) => {
                out.push(4);
                out.extend_from_slice(&v4.octets());
            }
            Host::Ipv6(v6) => {
                out.push(6);
                out.extend_from_slice(&v6.octets());
            }
        }
    }
    push_count(&mut out, claims.run.len());
    out.extend_from_slice(claims.run.as_bytes());
    let actor = claims.actor.0.as_bytes();
    out.extend_from_slice(&u16::try_from(actor.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(actor);
    out.extend_from_slice(&claims.execution_id.0);
    out.extend_from_slice(&claims.issued_at.0.to_be_bytes());
    out.extend_from_slice(&claims.expires_at.0.to_be_bytes());
    out.extend_from_slice(&claims.policy_revision.to_be_bytes());
    out
}

/// Writes a one-byte count. Every counted part is bounded far below 256 by its constructor; a
/// count that does not fit is written as 255, and such claims then fail to decode.
fn push_count(out: &mut Vec<u8>, count: usize) {
    out.push(u8::try_from(count).unwrap_or(u8::MAX));
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }

    fn addr(&mut self, family: u8) -> Option<IpAddr> {
        match family {
            4 => self.array::<4>().map(|b| IpAddr::V4(Ipv4Addr::from(b))),
            6 => self.array::<16>().map(|b| IpAddr::V6(Ipv6Addr::from(b))),
            _ => None,
        }
    }
}

fn decode_claims(bytes: &[u8]) -> Option<GrantClaims> {
    let mut r = Reader { bytes };
    if r.u8()? != CLAIMS_VERSION {
        return None;
    }
    let mode = r.u8()?;
    let port_count = usize::from(r.u8()?);
    let mut ports = Vec::with_capacity(port_count);
    for _ in 0..port_count {
        ports.push(r.u16()?);
    }
    let cidr_count = usize::from(r.u8()?);
    let mut cidrs = Vec::with_capacity(cidr_count);
    for _ in 0..cidr_count {
        let family = r.u8()?;
        let addr = r.addr(family)?;
        cidrs.push(Cidr::new(addr, r.u8()?).ok()?);
    }
    let host_count = usize::from(r.u8()?);
    if host_count > ALLOWED_HOSTS_MAX {
        return None;
    }
    let mut hosts = Vec::with_capacity(host_count);
    for _ in 0..host_count {
        hosts.push(match r.u8()? {
            1 => {
                let len = usize::from(r.u8()?);
                let text = std::str::from_utf8(r.take(len)?).ok()?;
                Host::Name(DnsName::parse(text).ok()?)
            }
            4 => match r.addr(4)? {
                IpAddr::V4(v4) => Host::Ipv4(v4),
                IpAddr::V6(_) => return None,
            },
            6 => match r.addr(6)? {
                IpAddr::V6(v6) => Host::Ipv6(v6),
                IpAddr::V4(_) => return None,
            },
            _ => return None,
        });
    }
    let run_len = usize::from(r.u8()?);
    let run = std::str::from_utf8(r.take(run_len)?).ok()?.to_owned();
    let actor_len = usize::from(r.u16()?);
    let actor = ActorId(std::str::from_utf8(r.take(actor_len)?).ok()?.to_owned());
    let execution_id = ExecutionId(r.array()?);
    let issued_at = UnixMillis(r.u64()?);
    let expires_at = UnixMillis(r.u64()?);
    let policy_revision = r.u64()?;
    if !r.bytes.is_empty() || !run_is_valid(&run) || !actor_is_valid(&actor.0) {
        return None;
    }
    let policy = decode_policy(mode, ports, cidrs, hosts)?;
    let claims = GrantClaims {
        policy,
        run,
        actor,
        execution_id,
        issued_at,
        expires_at,
        policy_revision,
    };
    // Only the canonical encoding is accepted: sets ascending without duplicates, names canonical.
    (encode_claims(&claims) == bytes).then_some(claims)
}

fn decode_policy(mode: u8, ports: Vec<u16>, cidrs: Vec<Cidr>, hosts: Vec<Host>) -> Option<Policy> {
    let ports = AllowedPorts::new(ports).ok()?;
    let cidrs = PrivateCidrs::new(cidrs).ok()?;
    let hosts = AllowedHosts::new(hosts).ok()?;
    match mode {
        1 if cidrs.is_empty() && hosts.is_empty() => Some(Policy::PublicInternet { ports }),
        2 if hosts.is_empty() => Some(Policy::PrivateNetwork { ports, cidrs }),
        3 => Some(Policy::HostAllowlist {
            ports,
            hosts,
            cidrs,
        }),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::egress::decide::{Decision, decide_answer};
    use crate::egress::policy::Mode;
    use crate::egress::policy::SETTING_LIST_MAX_BYTES;
    use crate::egress::target::parse_connect_authority;

    pub(crate) const FIELD_KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    pub(crate) fn signer() -> GrantSigner {
        GrantSigner::from_field_key(FIELD_KEY).unwrap()
    }

    fn allowlist() -> Policy {
        Policy::HostAllowlist {
            ports: AllowedPorts::web_default(),
            hosts: AllowedHosts::parse_list("pypi.org,files.pythonhosted.org,registry.npmjs.org")
                .unwrap(),
            cidrs: PrivateCidrs::parse_list("10.9.0.0/16").unwrap(),
        }
    }

    fn public() -> Policy {
        Policy::PublicInternet {
            ports: AllowedPorts::web_default(),
        }
    }

    pub(crate) fn request<'a>(policy: &'a Policy, actor: &'a ActorId) -> GrantRequest<'a> {
        GrantRequest {
            policy,
            provider_hint: None,
            run: "run-42",
            actor,
            execution_id: ExecutionId([7; 16]),
            policy_revision: 9,
            now: UnixMillis(1_000_000),
            ttl: TokenTtl::DEFAULT,
        }
    }

    fn actor() -> ActorId {
        ActorId("member:alice".to_owned())
    }

    /// Rewrites the claims part of a token with `edit`, keeping the original signature.
    fn tamper(token: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
        let parts: Vec<&str> = token.split('.').collect();
        let mut claims = URL_SAFE_NO_PAD.decode(parts[1]).unwrap();
        edit(&mut claims);
        format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(&claims),
            parts[2]
        )
    }

    #[test]
    fn egr_02_grant_round_trip_binds_every_claim() {
        let actor = actor();
        for policy in [
            public(),
            allowlist(),
            Policy::PrivateNetwork {
                ports: AllowedPorts::new([5432]).unwrap(),
                cidrs: PrivateCidrs::parse_list("10.0.0.0/8,fd00::/8").unwrap(),
            },
        ] {
            let minted = signer().mint(&request(&policy, &actor)).unwrap();
            assert!(minted.token.starts_with("cg1."));
            let claims = signer()
                .verifier()
                .verify(&minted.token, UnixMillis(1_000_001))
                .unwrap();
            assert_eq!(claims, minted.claims);
            assert_eq!(claims.policy, policy);
            assert_eq!(claims.run, "run-42");
            assert_eq!(claims.actor, actor);
            assert_eq!(claims.execution_id, ExecutionId([7; 16]));
            assert_eq!(claims.policy_revision, 9);
            assert_eq!(claims.issued_at, UnixMillis(1_000_000));
            assert_eq!(claims.expires_at, UnixMillis(1_000_000 + 600_000));
        }
    }

    #[test]
    fn the_proxy_judges_by_the_grant_policy() {
        let actor = actor();
        let policy = allowlist();
        let minted = signer().mint(&request(&policy, &actor)).unwrap();
        let claims = signer()
            .verifier()
            .verify(&minted.token, UnixMillis(1_000_001))
            .unwrap();
        let target = parse_connect_authority("pypi.org:443").unwrap();
        let answer = ["151.101.0.223".parse().unwrap()];
        assert!(matches!(
            decide_answer(&claims.policy, &target, &answer),
            Decision::Allow { .. }
        ));
        let other = parse_connect_authority("example.com:443").unwrap();
        assert_eq!(
            decide_answer(&claims.policy, &other, &answer).reason(),
            Some(Reason::HostNotAllowlisted)
        );
    }

    #[test]
    fn egr_06_verified_claims_expire_by_the_same_rule() {
        let actor = actor();
        let policy = public();
        let minted = signer().mint(&request(&policy, &actor)).unwrap();
        let claims = signer()
            .verifier()
            .verify(&minted.token, UnixMillis(1_000_000))
            .unwrap();
        for now in [
            0,
            1_000_000,
            1_000_000 + 600_000 - 1,
            1_000_000 + 600_000,
            u64::MAX,
        ] {
            assert_eq!(
                claims.check_time(UnixMillis(now)),
                signer()
                    .verifier()
                    .verify(&minted.token, UnixMillis(now))
                    .map(|_| ()),
                "{now}"
            );
        }
        assert_eq!(
            claims.check_time(UnixMillis(1_000_000 + 600_000)),
            Err(Reason::GrantExpired)
        );
    }

    #[test]
    fn egr_06_grant_expires_after_its_lifetime() {
        let actor = actor();
        let policy = public();
        let minted = signer().mint(&request(&policy, &actor)).unwrap();
        let verifier = signer().verifier();
        assert!(
            verifier
                .verify(&minted.token, UnixMillis(1_000_000 + 600_000 - 1))
                .is_ok()
        );
        assert_eq!(
            verifier.verify(&minted.token, UnixMillis(1_000_000 + 600_000)),
            Err(Reason::GrantExpired)
        );
        assert_eq!(
            verifier.verify(&minted.token, UnixMillis(u64::MAX)),
            Err(Reason::GrantExpired)
        );
    }

    #[test]
    fn grant_from_the_future_is_not_yet_valid() {
        let actor = actor();
        let policy = public();
        let minted = signer().mint(&request(&policy, &actor)).unwrap();
        let verifier = signer().verifier();
        assert!(
            verifier
                .verify(
                    &minted.token,
                    UnixMillis(1_000_000 - GRANT_CLOCK_SKEW_MAX_MS)
                )
                .is_ok()
        );
        assert_eq!(
            verifier.verify(
                &minted.token,
                UnixMillis(1_000_000 - GRANT_CLOCK_SKEW_MAX_MS - 1)
            ),
            Err(Reason::GrantNotYetValid)
        );
    }

    #[test]
    fn egr_06_lifetime_above_the_ceiling_is_refused_even_if_signed() {
        let actor = actor();
        let policy = public();
        let mut claims = signer().mint(&request(&policy, &actor)).unwrap().claims;
        claims.expires_at = claims
            .issued_at
            .plus_ms(TokenTtl::CEILING_SECONDS * 1000 + 1);
        let token = signer().sign_claims(&claims);
        assert_eq!(
            signer().verifier().verify(&token, claims.issued_at),
            Err(Reason::GrantLifetimeTooLong)
        );
        claims.expires_at = claims.issued_at.plus_ms(TokenTtl::CEILING_SECONDS * 1000);
        let token = signer().sign_claims(&claims);
        assert!(signer().verifier().verify(&token, claims.issued_at).is_ok());
    }

    #[test]
    fn egr_02_tampered_claims_fail_the_signature() {
        let actor = actor();
        let policy = public();
        let token = signer().mint(&request(&policy, &actor)).unwrap().token;
        let verifier = signer().verifier();
        // Flip a bit in the expiry.
        let longer = tamper(&token, |c| {
            let n = c.len();
            c[n - 9] ^= 0x01;
        });
        assert_eq!(
            verifier.verify(&longer, UnixMillis(1_000_001)),
            Err(Reason::GrantBadSignature)
        );
        // Add a port.
        let more_ports = tamper(&token, |c| {
            c[2] = 3;
            c.splice(3..3, [0u8, 22]);
        });
        assert_eq!(
            verifier.verify(&more_ports, UnixMillis(1_000_001)),
            Err(Reason::GrantBadSignature)
        );
    }

    #[test]
    fn egr_02_mode_rewritten_fails_the_signature() {
        let actor = actor();
        let policy = Policy::PrivateNetwork {
            ports: AllowedPorts::web_default(),
            cidrs: PrivateCidrs::parse_list("10.0.0.0/8").unwrap(),
        };
        let token = signer().mint(&request(&policy, &actor)).unwrap().token;
        // private_network (2) rewritten to host_allowlist (3): still a well-formed encoding.
        let rewritten = tamper(&token, |c| c[1] = 3);
        assert_eq!(
            signer()
                .verifier()
                .verify(&rewritten, UnixMillis(1_000_001)),
            Err(Reason::GrantBadSignature)
        );
    }

    #[test]
    fn egr_07_another_key_fails_the_signature() {
        let actor = actor();
        let policy = public();
        let token = signer().mint(&request(&policy, &actor)).unwrap().token;
        let other = GrantSigner::from_field_key(b"another field key, 32 bytes long").unwrap();
        assert_eq!(
            other.verifier().verify(&token, UnixMillis(1_000_001)),
            Err(Reason::GrantBadSignature)
        );
    }

    #[test]
    fn egr_07_signing_key_derives_from_the_field_key_and_the_verifier_from_its_public_half() {
        let a = GrantSigner::from_field_key(FIELD_KEY).unwrap().verifier();
        let b = GrantSigner::from_field_key(FIELD_KEY).unwrap().verifier();
        assert_eq!(a, b, "deterministic: the proxy follows the field key");
        let c = GrantSigner::from_field_key(b"0123456789abcdef0123456789abcdeF")
            .unwrap()
            .verifier();
        assert_ne!(a, c);
        let published = a.public_key_text();
        assert_eq!(published.len(), 43);
        let proxy = GrantVerifier::from_public_key_text(&published).unwrap();
        assert_eq!(proxy, a);
        assert_eq!(
            GrantVerifier::from_public_key_bytes(&a.public_key_bytes()).unwrap(),
            a
        );
        // The public key is not the field key or the seed spelled otherwise.
        assert_ne!(&a.public_key_bytes()[..], &FIELD_KEY[..32]);
        assert_eq!(
            GrantSigner::from_field_key(b"short").unwrap_err(),
            KeyError::FieldKeyTooShort
        );
        assert_eq!(
            GrantSigner::from_field_key(b"").unwrap_err(),
            KeyError::FieldKeyTooShort
        );
    }

    #[test]
    fn weak_or_malformed_public_keys_are_refused() {
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_eq!(
            GrantVerifier::from_public_key_bytes(&identity),
            Err(KeyError::PublicKeyWeak)
        );
        assert_eq!(
            GrantVerifier::from_public_key_bytes(&[1u8; 31]),
            Err(KeyError::PublicKeyMalformed)
        );
        assert_eq!(
            GrantVerifier::from_public_key_text("not-a-key"),
            Err(KeyError::PublicKeyMalformed)
        );
        assert_eq!(
            GrantVerifier::from_public_key_text(&"A".repeat(44)),
            Err(KeyError::PublicKeyMalformed)
        );
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let actor = actor();
        let policy = public();
        let token = signer().mint(&request(&policy, &actor)).unwrap().token;
        let v = signer().verifier();
        let now = UnixMillis(1_000_001);
        assert_eq!(v.verify("", now), Err(Reason::GrantMissing));
        assert_eq!(v.verify("garbage", now), Err(Reason::GrantMalformed));
        assert_eq!(
            v.verify(&format!("{token}.x"), now),
            Err(Reason::GrantMalformed)
        );
        assert_eq!(
            v.verify(&token.replacen("cg1", "cg2", 1), now),
            Err(Reason::GrantUnsupportedVersion)
        );
        assert_eq!(
            v.verify(&token.replacen("cg1", "xx1", 1), now),
            Err(Reason::GrantMalformed)
        );
        let truncated = &token[..token.len() - 2];
        assert!(matches!(
            v.verify(truncated, now),
            Err(Reason::GrantMalformed | Reason::GrantBadSignature)
        ));
        assert_eq!(
            v.verify(&"a".repeat(GRANT_TOKEN_MAX_BYTES + 1), now),
            Err(Reason::GrantTooLarge)
        );
        let padded = token.replacen('.', "=.", 2);
        assert_eq!(v.verify(&padded, now), Err(Reason::GrantMalformed));
    }

    #[test]
    fn egr_06_each_grant_binds_its_execution_id() {
        let actor = actor();
        let policy = public();
        let mut first = request(&policy, &actor);
        first.execution_id = ExecutionId([1; 16]);
        let mut second = first;
        second.execution_id = ExecutionId([2; 16]);
        let a = signer().mint(&first).unwrap();
        let b = signer().mint(&second).unwrap();
        assert_ne!(a.token, b.token);
        assert_eq!(
            signer()
                .verifier()
                .verify(&b.token, UnixMillis(1_000_001))
                .unwrap()
                .execution_id,
            ExecutionId([2; 16])
        );
        assert_eq!(ExecutionId([0xab; 16]).to_string(), "ab".repeat(16));
    }

    #[test]
    fn egr_08_isolated_gets_no_credential() {
        let actor = actor();
        assert_eq!(
            signer()
                .mint(&request(&Policy::Isolated, &actor))
                .unwrap_err(),
            MintError::ModeIsolated
        );
    }

    #[test]
    fn egr_04_hint_narrows_host_allowlist_to_the_intersection() {
        let actor = actor();
        let policy = allowlist();
        let hint = [
            "PyPI.org.",
            "evil.example",
            "files.pythonhosted.org",
            "*bad*",
        ];
        let mut req = request(&policy, &actor);
        req.provider_hint = Some(&hint);
        let claims = signer().mint(&req).unwrap().claims;
        let Policy::HostAllowlist { hosts, .. } = &claims.policy else {
            panic!("host_allowlist")
        };
        let names: Vec<String> = hosts.iter().map(ToString::to_string).collect();
        assert_eq!(names, vec!["files.pythonhosted.org", "pypi.org"]);
    }

    #[test]
    fn egr_04_hint_cannot_broaden() {
        let actor = actor();
        let policy = allowlist();
        let hint = ["evil.example"];
        let mut req = request(&policy, &actor);
        req.provider_hint = Some(&hint);
        assert_eq!(
            signer().mint(&req).unwrap_err(),
            MintError::HintMatchesNoHost
        );
        let empty: [&str; 0] = [];
        req.provider_hint = Some(&empty);
        assert_eq!(
            signer().mint(&req).unwrap_err(),
            MintError::HintMatchesNoHost
        );
    }

    #[test]
    fn egr_04_hint_is_ignored_outside_host_allowlist() {
        let hint = ["pypi.org"];
        for policy in [
            public(),
            Policy::PrivateNetwork {
                ports: AllowedPorts::web_default(),
                cidrs: PrivateCidrs::parse_list("10.0.0.0/8").unwrap(),
            },
            Policy::Isolated,
        ] {
            assert_eq!(narrow_by_hint(&policy, Some(&hint)), policy);
        }
        assert_eq!(narrow_by_hint(&allowlist(), None), allowlist());
        assert_eq!(
            narrow_by_hint(&allowlist(), Some(&hint)).mode(),
            Mode::HostAllowlist
        );
    }

    #[test]
    fn mint_refuses_bad_run_and_actor_ids() {
        let actor = actor();
        let policy = public();
        let mut req = request(&policy, &actor);
        let too_long = "r".repeat(RUN_ID_MAX_BYTES + 1);
        for run in ["", "has space", too_long.as_str()] {
            req.run = run;
            assert_eq!(
                signer().mint(&req).unwrap_err(),
                MintError::RunInvalid,
                "{run:?}"
            );
        }
        req.run = "run-1";
        let bad_actor = ActorId("a\nb".to_owned());
        req.actor = &bad_actor;
        assert_eq!(signer().mint(&req).unwrap_err(), MintError::ActorInvalid);
    }

    #[test]
    fn proxy_authorization_header_parsing() {
        assert_eq!(
            parse_proxy_authorization(Some("Bearer cg1.abc.def")),
            Ok("cg1.abc.def")
        );
        assert_eq!(
            parse_proxy_authorization(Some("bearer   cg1.a-b_c.d")),
            Ok("cg1.a-b_c.d")
        );
        assert_eq!(parse_proxy_authorization(None), Err(Reason::GrantMissing));
        assert_eq!(
            parse_proxy_authorization(Some("")),
            Err(Reason::GrantMissing)
        );
        assert_eq!(
            parse_proxy_authorization(Some("Bearer")),
            Err(Reason::GrantMissing)
        );
        assert_eq!(
            parse_proxy_authorization(Some("Bearer ")),
            Err(Reason::GrantMissing)
        );
        assert_eq!(
            parse_proxy_authorization(Some("Basic dXNlcjpwYXNz")),
            Err(Reason::GrantWrongScheme)
        );
        assert_eq!(
            parse_proxy_authorization(Some("Token abc")),
            Err(Reason::GrantWrongScheme)
        );
        assert_eq!(
            parse_proxy_authorization(Some("Bearer a b")),
            Err(Reason::GrantMalformed)
        );
        assert_eq!(
            parse_proxy_authorization(Some("Bearer abc=")),
            Err(Reason::GrantMalformed)
        );
        assert_eq!(
            parse_proxy_authorization(Some("Bearer abc\t")),
            Err(Reason::GrantMalformed)
        );
        let huge = format!("Bearer {}", "a".repeat(GRANT_TOKEN_MAX_BYTES + 100));
        assert_eq!(
            parse_proxy_authorization(Some(&huge)),
            Err(Reason::GrantTooLarge)
        );
    }

    #[test]
    fn debug_output_never_shows_the_token_or_the_key() {
        let actor = actor();
        let policy = public();
        let minted = signer().mint(&request(&policy, &actor)).unwrap();
        let shown = format!("{minted:?} {:?}", signer());
        assert!(!shown.contains(&minted.token));
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn the_largest_allowlist_grant_is_refused_not_truncated() {
        let actor = ActorId("a".repeat(ACTOR_MAX_BYTES));
        // As many names as an allowlist holds, as long as its text allows.
        let label = "h".repeat(SETTING_LIST_MAX_BYTES / ALLOWED_HOSTS_MAX - 8);
        let hosts: Vec<String> = (0..ALLOWED_HOSTS_MAX)
            .map(|i| format!("{label}.h{i:03}"))
            .collect();
        let policy = Policy::HostAllowlist {
            ports: AllowedPorts::new(1..=64).unwrap(),
            hosts: AllowedHosts::parse_list(&hosts.join(",")).unwrap(),
            cidrs: PrivateCidrs::new(
                (0..64u8).map(|i| Cidr::parse(&format!("10.{i}.0.0/16")).unwrap()),
            )
            .unwrap(),
        };
        let mut req = request(&policy, &actor);
        let run = "r".repeat(RUN_ID_MAX_BYTES);
        req.run = &run;
        let minted = signer().mint(&req);
        // 16 KiB of names do not fit in one header-sized grant: refused, not truncated.
        assert_eq!(minted.unwrap_err(), MintError::TooLarge);
    }

    #[test]
    fn egr_01_an_allowlist_of_200_hosts_mints_a_grant_within_the_bound() {
        let actor = actor();
        let hosts: Vec<String> = (0..200)
            .map(|i| format!("api-{i:03}.example-provider.com"))
            .collect();
        let policy = Policy::HostAllowlist {
            ports: AllowedPorts::parse_list("80,443").unwrap(),
            hosts: AllowedHosts::parse_list(&hosts.join(",")).unwrap(),
            cidrs: PrivateCidrs::default(),
        };
        let minted = signer().mint(&request(&policy, &actor)).expect("a grant");
        assert!(
            minted.token.len() > 4_096,
            "longer than the old worker limit"
        );
        assert!(minted.token.len() <= GRANT_TOKEN_MAX_BYTES);
        let verified = signer()
            .verifier()
            .verify(&minted.token, UnixMillis(1_000_000))
            .expect("verifies");
        let Policy::HostAllowlist { hosts: granted, .. } = &verified.policy else {
            panic!("an allowlist grant");
        };
        assert_eq!(granted.iter().count(), 200);
    }

    #[test]
    fn a_grant_that_cannot_travel_in_a_header_is_not_sendable() {
        assert!(grant_is_sendable("cg1.bG9n-_x.c2ln"));
        for bad in ["", "a b", "a\r\nX-Evil: 1", "caf\u{e9}"] {
            assert!(!grant_is_sendable(bad), "{bad:?}");
        }
    }
}
