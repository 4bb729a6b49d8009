//! The package broker's rules (PKG-3, PKG-5, PKG-7): which registries it fronts, its tokens, its
//! bounds on the installers, and the cooldown of a registry that could not be reached. The API's
//! broker performs them; the worker's installers are configured from them.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::ids::hmac_sha256;

use crate::time::{MonoMillis, UnixMillis};

/// The header of a 503 that says the registry could not be reached (PKG-5). Its name is the
/// specification's.
pub const REGISTRY_HEADER: &str = "X-Kaizen-Package-Registry";
/// Its one value.
pub const REGISTRY_UNREACHABLE: &str = "unreachable";
/// How long the broker's connection attempt to a registry may take.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// How long a host that failed is refused without being dialled.
pub const COOLDOWN_MS: u64 = 15_000;
/// pip's retries and socket timeout (PKG-5).
pub const PIP_RETRIES: u32 = 1;
/// See [`PIP_RETRIES`].
pub const PIP_TIMEOUT_SECONDS: u32 = 60;
/// npm's fetch retries and its longest back-off (PKG-5).
pub const NPM_FETCH_RETRIES: u32 = 1;
/// See [`NPM_FETCH_RETRIES`].
pub const NPM_FETCH_RETRY_MAX_MS: u32 = 2_000;
/// npm's shortest back-off (its default, 10 s, is above the longest).
pub const NPM_FETCH_RETRY_MIN_MS: u32 = 1_000;
/// Where the jail reaches the broker: the worker's relay listens here inside the jail and adds the
/// run's token to each request's path, so that the token never enters the jail.
pub const JAIL_BROKER_PORT: u16 = 8000;

/// The registries the broker fronts, each a base URL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registries {
    /// A PEP 503/691 simple index (`.../simple/`).
    pub pypi: Option<String>,
    /// An npm registry's root.
    pub npm: Option<String>,
}

impl Registries {
    /// Parses `SANDBOX_PACKAGE_REGISTRIES`: a JSON object with the keys `pypi` and `npm`, each an
    /// `http://` or `https://` URL; `{}` is none at all (PKG-7).
    ///
    /// # Errors
    /// Not an object, an unknown key, a value that is not such a URL.
    pub fn parse(text: &str) -> Result<Self, String> {
        let map: BTreeMap<String, String> = serde_json::from_str(text).map_err(|e| {
            format!("SANDBOX_PACKAGE_REGISTRIES: expected a JSON object of URLs ({e})")
        })?;
        let mut registries = Self::default();
        for (key, url) in map {
            let url = url.trim().to_owned();
            let lower = url.to_ascii_lowercase();
            if !(lower.starts_with("http://") || lower.starts_with("https://")) || url.len() < 9 {
                return Err(format!(
                    "SANDBOX_PACKAGE_REGISTRIES: {key} must be an http:// or https:// URL"
                ));
            }
            match key.as_str() {
                "pypi" => registries.pypi = Some(url),
                "npm" => registries.npm = Some(url),
                other => {
                    return Err(format!(
                        "SANDBOX_PACKAGE_REGISTRIES: unknown registry {other:?} (pypi, npm)"
                    ));
                }
            }
        }
        Ok(registries)
    }

    /// Which ecosystems can install.
    #[must_use]
    pub fn available(&self) -> super::resolve::Available {
        super::resolve::Available {
            python: self.pypi.is_some(),
            npm: self.npm.is_some(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens.

const TOKEN_PREFIX: &str = "pk1";
const TOKEN_CONTEXT: &[u8] = b"corral package token v1\0";
/// The longest run id a token carries.
pub const TOKEN_RUN_MAX: usize = 64;

fn mac(key: &[u8], run: &str, expires: u64) -> String {
    URL_SAFE_NO_PAD.encode(hmac_sha256(
        key,
        &[
            TOKEN_CONTEXT,
            run.as_bytes(),
            b"\0",
            expires.to_string().as_bytes(),
        ],
    ))
}

const BROKER_KEY_SALT: &[u8] = b"corral package broker key v1";

/// The key every replica's broker mints and checks tokens under, derived from the deployment's
/// field key (the key every replica shares; egress grants and kernel seals derive from it under
/// other labels): a run's installer reaches whichever replica the broker's URL leads to, not
/// necessarily the one that minted its token (decision 0047). `None` for a key shorter than a
/// grant's signing key accepts.
#[must_use]
pub fn broker_key(field_key: &[u8]) -> Option<[u8; 32]> {
    if field_key.len() < crate::egress::grant::FIELD_KEY_MIN_BYTES {
        return None;
    }
    let mut key = [0u8; 32];
    hkdf::Hkdf::<sha2::Sha256>::new(Some(BROKER_KEY_SALT), field_key)
        .expand(b"token", &mut key)
        .ok()?;
    Some(key)
}

/// A broker token: the run it was minted for and when it expires, on the wall clock (the one
/// clock replicas share to within the skew the design tolerates, far below a token's minutes of
/// life), under the deployment's broker key. It travels only between the API and the worker's
/// relay.
#[must_use]
pub fn mint_token(key: &[u8], run: &str, expires: UnixMillis) -> String {
    format!(
        "{TOKEN_PREFIX}.{run}.{}.{}",
        expires.0,
        mac(key, run, expires.0)
    )
}

/// Why a token is refused. The codes are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not a token, or not one this key made.
    Invalid,
    /// Past its expiry.
    Expired,
}

impl TokenRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Invalid => "package_token_invalid",
            Self::Expired => "package_token_expired",
        }
    }
}

/// The run a token was minted for, if `key` made it and it has not expired at `now`.
///
/// # Errors
/// Why it is refused.
pub fn check_token(key: &[u8], token: &str, now: UnixMillis) -> Result<String, TokenRefusal> {
    let mut parts = token.split('.');
    let (Some(TOKEN_PREFIX), Some(run), Some(expires), Some(given), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(TokenRefusal::Invalid);
    };
    if run.is_empty() || run.len() > TOKEN_RUN_MAX {
        return Err(TokenRefusal::Invalid);
    }
    let expires: u64 = expires.parse().map_err(|_| TokenRefusal::Invalid)?;
    let expected = mac(key, run, expires);
    let same = expected.len() == given.len()
        && expected
            .bytes()
            .zip(given.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !same {
        return Err(TokenRefusal::Invalid);
    }
    if now.0 >= expires {
        return Err(TokenRefusal::Expired);
    }
    Ok(run.to_owned())
}

// ---------------------------------------------------------------------------------------------
// The cooldown of a registry that could not be reached (PKG-5).

/// Hosts that failed, and until when each is refused without a dial.
#[derive(Clone, Debug, Default)]
pub struct Cooldowns {
    until: BTreeMap<String, MonoMillis>,
}

impl Cooldowns {
    /// Whether `host` (lowercase `host:port`) is cooling down at `now`; expired entries go.
    pub fn refuses(&mut self, host: &str, now: MonoMillis) -> bool {
        self.until.retain(|_, until| *until > now);
        self.until.contains_key(host)
    }

    /// `host` could not be reached at `now`: refused for [`COOLDOWN_MS`].
    pub fn failed(&mut self, host: &str, now: MonoMillis) {
        self.until.insert(host.to_owned(), now.plus_ms(COOLDOWN_MS));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_07_registries_parse_and_empty_means_none() {
        let none = Registries::parse("{}").unwrap();
        assert_eq!(none, Registries::default());
        assert!(!none.available().python && !none.available().npm);
        let both = Registries::parse(
            r#"{"pypi": "http://127.0.0.1:1/simple/", "npm": "https://r.invalid/"}"#,
        )
        .unwrap();
        assert!(both.available().python && both.available().npm);
        for bad in [
            "[]",
            r#"{"pip": "http://x/"}"#,
            r#"{"pypi": "ftp://x/"}"#,
            "nope",
            r#"{"npm": 3}"#,
        ] {
            assert!(Registries::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pkg_03_every_replica_of_a_deployment_derives_one_broker_key_and_no_other_deployment_does() {
        let field_key = b"f".repeat(crate::egress::grant::FIELD_KEY_MIN_BYTES);
        let (one, other) = (broker_key(&field_key), broker_key(&field_key));
        assert!(one.is_some());
        assert_eq!(one, other);
        let token = mint_token(&one.unwrap_or_default(), "run-1", UnixMillis(5_000));
        // Another replica of the deployment accepts it; another deployment's broker does not.
        assert_eq!(
            check_token(&other.unwrap_or_default(), &token, UnixMillis(0)),
            Ok("run-1".to_owned())
        );
        let elsewhere = broker_key(&b"g".repeat(crate::egress::grant::FIELD_KEY_MIN_BYTES));
        assert_eq!(
            check_token(&elsewhere.unwrap_or_default(), &token, UnixMillis(0)),
            Err(TokenRefusal::Invalid)
        );
        // Not the field key itself, nor another label's derivation of it.
        assert_ne!(one.map(|k| k.to_vec()), Some(field_key.clone()));
        assert_ne!(one, crate::kernel::seal_root(&field_key));
        assert_eq!(broker_key(b"short"), None);
    }

    #[test]
    fn pkg_03_tokens_are_the_keys_and_expire() {
        let key = b"k".repeat(32);
        let token = mint_token(&key, "run-1", UnixMillis(1_000));
        assert_eq!(
            check_token(&key, &token, UnixMillis(999)),
            Ok("run-1".to_owned())
        );
        assert_eq!(
            check_token(&key, &token, UnixMillis(1_000)),
            Err(TokenRefusal::Expired)
        );
        assert_eq!(
            check_token(b"other", &token, UnixMillis(0)),
            Err(TokenRefusal::Invalid)
        );
        // Another run's name, or a later expiry, under the same signature: refused.
        let forged = token.replace("run-1", "run-2");
        assert_eq!(
            check_token(&key, &forged, UnixMillis(0)),
            Err(TokenRefusal::Invalid)
        );
        let extended = token.replace(".1000.", ".9000.");
        assert_eq!(
            check_token(&key, &extended, UnixMillis(0)),
            Err(TokenRefusal::Invalid)
        );
        assert_eq!(
            check_token(&key, "pk1.a.b", UnixMillis(0)),
            Err(TokenRefusal::Invalid)
        );
    }

    #[test]
    fn pkg_05_a_failed_host_is_refused_for_the_cooldown_only() {
        let mut c = Cooldowns::default();
        assert!(!c.refuses("h:1", MonoMillis(0)));
        c.failed("h:1", MonoMillis(100));
        assert!(c.refuses("h:1", MonoMillis(100 + COOLDOWN_MS - 1)));
        assert!(!c.refuses("other:1", MonoMillis(200)));
        assert!(!c.refuses("h:1", MonoMillis(100 + COOLDOWN_MS)));
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
