//! Verified grants, kept so that a run's next connection does not pay for the signature again.
//!
//! A run makes many connections with one grant, and an ed25519 verification costs about 50 µs,
//! most of what the proxy adds to a connection. A grant is kept only after the core verified
//! it, keyed by its exact token text and the verifying key that verified it; every later use
//! re-checks its time with the core's rule ([`GrantClaims::check_time`]), and a different
//! verifying key (a rotation, EGR-9) empties the store. Refused tokens are never kept. The store
//! is bounded in entries and token length; when full it is emptied, never grown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use corral_core::egress::{GrantClaims, GrantVerifier, Reason};
use corral_core::time::UnixMillis;

/// The most grants kept.
pub const GRANT_CACHE_ENTRIES_MAX: usize = 1024;
/// Tokens longer than this are verified every time instead of kept.
pub const GRANT_CACHE_TOKEN_MAX_BYTES: usize = 2048;

#[derive(Debug, Default)]
struct Inner {
    key: Option<[u8; 32]>,
    entries: HashMap<String, Arc<GrantClaims>>,
}

/// Grants the core verified, by exact token, for one verifying key at a time.
#[derive(Debug, Default)]
pub struct GrantCache {
    inner: Mutex<Inner>,
}

impl GrantCache {
    /// An empty store.
    #[must_use]
    pub fn new() -> GrantCache {
        GrantCache::default()
    }

    /// Verifies `token` with `verifier` at `now`: from the store when this exact token was
    /// verified under this key (its time checked again), otherwise by the core.
    pub fn verify(
        &self,
        verifier: &GrantVerifier,
        token: &str,
        now: UnixMillis,
    ) -> Result<Arc<GrantClaims>, Reason> {
        let key = verifier.public_key_bytes();
        if let Some(claims) = self.lookup(key, token) {
            return match claims.check_time(now) {
                Ok(()) => Ok(claims),
                Err(reason) => {
                    self.forget(token);
                    Err(reason)
                }
            };
        }
        let claims = Arc::new(verifier.verify(token, now)?);
        self.keep(key, token, &claims);
        Ok(claims)
    }

    fn lookup(&self, key: [u8; 32], token: &str) -> Option<Arc<GrantClaims>> {
        let inner = self.inner.lock().ok()?;
        if inner.key != Some(key) {
            return None;
        }
        inner.entries.get(token).cloned()
    }

    fn keep(&self, key: [u8; 32], token: &str, claims: &Arc<GrantClaims>) {
        if token.len() > GRANT_CACHE_TOKEN_MAX_BYTES {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if inner.key != Some(key) || inner.entries.len() >= GRANT_CACHE_ENTRIES_MAX {
            inner.entries.clear();
            inner.key = Some(key);
        }
        inner.entries.insert(token.to_owned(), Arc::clone(claims));
    }

    fn forget(&self, token: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.entries.remove(token);
        }
    }

    /// How many grants are kept.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |inner| inner.entries.len())
    }

    /// Whether none is kept.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::egress::{
        AllowedPorts, ExecutionId, GrantRequest, GrantSigner, Policy, TokenTtl,
    };
    use corral_core::ids::ActorId;

    fn mint(signer: &GrantSigner, now: u64, run: &str) -> String {
        let policy = Policy::PublicInternet {
            ports: AllowedPorts::web_default(),
        };
        let actor = ActorId("a".into());
        signer
            .mint(&GrantRequest {
                policy: &policy,
                provider_hint: None,
                run,
                actor: &actor,
                execution_id: ExecutionId([1; 16]),
                policy_revision: 1,
                now: UnixMillis(now),
                ttl: TokenTtl::DEFAULT,
            })
            .unwrap()
            .token
    }

    #[test]
    fn egr_07_kept_grants_still_expire_and_never_outlive_their_key() {
        let one = GrantSigner::from_field_key(&[1; 32]).unwrap();
        let two = GrantSigner::from_field_key(&[2; 32]).unwrap();
        let cache = GrantCache::new();
        let token = mint(&one, 1_000_000, "r");
        assert!(
            cache
                .verify(&one.verifier(), &token, UnixMillis(1_000_001))
                .is_ok()
        );
        assert_eq!(cache.len(), 1);
        assert!(
            cache
                .verify(&one.verifier(), &token, UnixMillis(1_000_002))
                .is_ok()
        );
        // Another key: the kept grant is not trusted.
        assert_eq!(
            cache
                .verify(&two.verifier(), &token, UnixMillis(1_000_003))
                .err(),
            Some(Reason::GrantBadSignature)
        );
        // Expiry is checked on every use.
        assert_eq!(
            cache
                .verify(&one.verifier(), &token, UnixMillis(1_600_000))
                .err(),
            Some(Reason::GrantExpired)
        );
        assert!(cache.is_empty());
        // A tampered token is never taken for a kept one.
        let tampered = format!("{token}A");
        assert!(
            cache
                .verify(&one.verifier(), &tampered, UnixMillis(1_000_004))
                .is_err()
        );
    }

    #[test]
    fn the_store_is_bounded() {
        let one = GrantSigner::from_field_key(&[1; 32]).unwrap();
        let cache = GrantCache::new();
        for i in 0..=GRANT_CACHE_ENTRIES_MAX {
            let token = mint(&one, 1_000_000, &format!("run-{i}"));
            assert!(
                cache
                    .verify(&one.verifier(), &token, UnixMillis(1_000_001))
                    .is_ok()
            );
            assert!(cache.len() <= GRANT_CACHE_ENTRIES_MAX);
        }
    }
}
