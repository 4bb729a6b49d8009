//! The signing key, derived from the field key; the verifying key; the token text both use.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroize as _;

use super::claims::{GrantClaims, check_times};
use super::encoding::{decode_claims, encode_claims};
use super::{
    FIELD_KEY_MIN_BYTES, GRANT_KEY_INFO, GRANT_KEY_SALT, GRANT_SIGNATURE_CONTEXT,
    GRANT_TOKEN_MAX_BYTES,
};
use crate::egress::reason::Reason;
use crate::time::UnixMillis;

const TOKEN_VERSION_PREFIX: &str = "cg1";

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

    pub(super) fn sign_claims(&self, claims: &GrantClaims) -> String {
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

fn signed_message(claims: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(GRANT_SIGNATURE_CONTEXT.len() + 1 + claims.len());
    message.extend_from_slice(GRANT_SIGNATURE_CONTEXT);
    message.push(0);
    message.extend_from_slice(claims);
    message
}
