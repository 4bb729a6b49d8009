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
//!
//! [`TokenTtl`]: super::mode::TokenTtl

mod claims;
mod encoding;
mod header;
mod keys;
mod mint;

pub use claims::{ExecutionId, GrantClaims};
pub use header::{grant_is_sendable, parse_proxy_authorization};
pub use keys::{GrantSigner, GrantVerifier, KeyError};
pub use mint::{GrantRequest, MintError, MintedGrant, narrow_by_hint};

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

#[cfg(test)]
pub(crate) mod tests;
