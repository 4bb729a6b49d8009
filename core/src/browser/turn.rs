//! The live view's one TURN authority and the credential minted for it (BROW-9, ISO-5).
//!
//! A browser session's media leaves the worker only as relayed traffic: the worker and every
//! member's viewer allocate on the operator's TURN server, the one configured by
//! `CORRAL_TURN_URL`, with the same short-lived credential of the TURN REST scheme (coturn's
//! `use-auth-secret`): the username is `<unix expiry>:<user>` and the password is the base64 of
//! HMAC-SHA1 over that username, keyed with the shared secret. The server recomputes it, so
//! nothing but the secret has to be shared, and an expired or forged credential is refused there.
//!
//! The authority is configuration only: a request names no TURN server, and the only address the
//! ICE servers handed to a worker or a viewer ever carry is this one, for both UDP and plain TCP
//! (the worker's network admits exactly that address and port, ISO-5). Missing or malformed
//! configuration refuses the open with its own code ([`TurnRefusal`]).

use std::fmt;
use std::net::IpAddr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha1::Sha1;

use crate::time::UnixMillis;

/// The TURN port when `CORRAL_TURN_URL` names none (RFC 7065).
pub const DEFAULT_PORT: u16 = 3478;
/// The shortest shared secret accepted, in bytes.
pub const SECRET_MIN_BYTES: usize = 16;
/// A credential's lifetime when `CORRAL_TURN_CREDENTIAL_TTL_SECONDS` is unset.
pub const CREDENTIAL_TTL_SECONDS: u64 = 3_600;

/// Why an open is refused for its TURN configuration. Each has a stable code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TurnRefusal {
    /// `CORRAL_TURN_URL` or its secret is not configured.
    NotConfigured(&'static str),
    /// `CORRAL_TURN_URL` or the secret is not usable; the text says how.
    Invalid(String),
    /// The worker could not reach the configured authority.
    Unreachable(String),
}

impl TurnRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotConfigured(_) => "turn_not_configured",
            Self::Invalid(_) => "turn_config_invalid",
            Self::Unreachable(_) => "turn_unreachable",
        }
    }
}

impl fmt::Display for TurnRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotConfigured(what) => write!(f, "{what} is not configured"),
            Self::Invalid(why) | Self::Unreachable(why) => f.write_str(why),
        }
    }
}

/// The host part of the authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TurnHost {
    /// An address literal.
    Ip(IpAddr),
    /// A DNS name, lower-cased, without a trailing dot.
    Name(String),
}

impl fmt::Display for TurnHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Self::Ip(ip) => write!(f, "{ip}"),
            Self::Name(name) => f.write_str(name),
        }
    }
}

/// The one TURN authority: a host and a port, reached over UDP and plain TCP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnAuthority {
    /// The host.
    pub host: TurnHost,
    /// The port.
    pub port: u16,
}

impl TurnAuthority {
    /// Parses `CORRAL_TURN_URL`: `turn:HOST[:PORT]`, HOST an IPv4 literal, a bracketed IPv6
    /// literal or a DNS name. No `turns:` (the relay is plain UDP and TCP), no user, no query
    /// (both transports are always offered), nothing else.
    ///
    /// # Errors
    /// [`TurnRefusal::NotConfigured`] for `None` or blank text, [`TurnRefusal::Invalid`] naming
    /// what is wrong otherwise.
    pub fn parse(url: Option<&str>) -> Result<Self, TurnRefusal> {
        let text = url.map(str::trim).unwrap_or_default();
        if text.is_empty() {
            return Err(TurnRefusal::NotConfigured("CORRAL_TURN_URL"));
        }
        let invalid = |why: &str| {
            TurnRefusal::Invalid(format!(
                "CORRAL_TURN_URL {:?} {why}",
                text.chars().take(200).collect::<String>()
            ))
        };
        let Some(rest) = text
            .get(..5)
            .filter(|scheme| scheme.eq_ignore_ascii_case("turn:"))
            .map(|_| &text[5..])
        else {
            return Err(invalid("is not a turn: URL (turn:HOST:PORT)"));
        };
        if rest.contains(['?', '#', '/', '@']) || rest.chars().any(char::is_whitespace) {
            return Err(invalid(
                "has more than a host and a port (no user, path or query)",
            ));
        }
        let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
            let (inside, after) = bracketed
                .split_once(']')
                .ok_or_else(|| invalid("has an unclosed IPv6 literal"))?;
            let ip: std::net::Ipv6Addr = inside
                .parse()
                .map_err(|_| invalid("has an IPv6 literal that does not parse"))?;
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| invalid("has text after its IPv6 literal"))?,
                ),
            };
            (TurnHost::Ip(IpAddr::V6(ip)), port)
        } else {
            let (host, port) = match rest.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            };
            let host = if let Ok(ip) = host.parse::<std::net::Ipv4Addr>() {
                TurnHost::Ip(IpAddr::V4(ip))
            } else if is_dns_name(host) {
                TurnHost::Name(host.trim_end_matches('.').to_ascii_lowercase())
            } else {
                return Err(invalid("has no usable host"));
            };
            (host, port)
        };
        let port = match port {
            None => DEFAULT_PORT,
            Some(port) => port
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0 && port.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| invalid("has a port that is not 1 to 65535"))?,
        };
        if let TurnHost::Ip(ip) = &host
            && (ip.is_unspecified() || ip.is_multicast())
        {
            return Err(invalid("names an address nothing can allocate on"));
        }
        Ok(Self { host, port })
    }

    /// The ICE server URLs of this authority: the same host and port over UDP and plain TCP.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        ["udp", "tcp"]
            .iter()
            .map(|transport| format!("turn:{}:{}?transport={transport}", self.host, self.port))
            .collect()
    }
}

/// A DNS name of letters, digits and hyphens in dot-separated labels of 1 to 63 bytes, at most
/// 253 bytes, with at least one letter (so that no address-like spelling passes as a name).
fn is_dns_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && host.bytes().any(|b| b.is_ascii_alphabetic())
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// The shared secret, checked.
///
/// # Errors
/// [`TurnRefusal::NotConfigured`] when absent, [`TurnRefusal::Invalid`] when shorter than
/// [`SECRET_MIN_BYTES`] after trimming a trailing line end.
pub fn secret(bytes: Option<&[u8]>) -> Result<&[u8], TurnRefusal> {
    let bytes = bytes.ok_or(TurnRefusal::NotConfigured("CORRAL_TURN_SECRET_FILE"))?;
    let bytes = bytes.trim_ascii_end();
    if bytes.len() < SECRET_MIN_BYTES {
        return Err(TurnRefusal::Invalid(format!(
            "the TURN shared secret has {} bytes; at least {SECRET_MIN_BYTES} are needed",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// One credential of the TURN REST scheme, with the ICE servers it is good for.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TurnCredential {
    /// `<unix expiry seconds>:<user>`.
    pub username: String,
    /// base64(HMAC-SHA1(secret, username)).
    pub password: String,
    /// When the server stops accepting it.
    pub expires_at: UnixMillis,
    /// The authority's URLs ([`TurnAuthority::urls`]).
    pub urls: Vec<String>,
}

/// Mints the credential for `user` (the session id: one credential per session, shared by its
/// worker and its viewers) valid for `ttl_seconds` from `now`.
#[must_use]
pub fn mint(
    authority: &TurnAuthority,
    secret: &[u8],
    user: &str,
    now: UnixMillis,
    ttl_seconds: u64,
) -> TurnCredential {
    let expiry = (now.0 / 1_000).saturating_add(ttl_seconds);
    // A user never carries the separator or anything a TURN username cannot.
    let user: String = user
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(64)
        .collect();
    let username = format!("{expiry}:{user}");
    TurnCredential {
        password: password(secret, &username),
        username,
        expires_at: UnixMillis(expiry.saturating_mul(1_000)),
        urls: authority.urls(),
    }
}

/// Whether a session's `credential` is replaced at `now` (BROW-9): once a quarter of its
/// lifetime (`ttl_seconds`) or less is left. The TURN server refuses an expired credential's
/// refreshes, so the worker allocates a new relay with the new credential and the viewers
/// reconnect through it before the old one lapses.
#[must_use]
pub fn needs_renewal(credential: &TurnCredential, now: UnixMillis, ttl_seconds: u64) -> bool {
    credential.expires_at.0.saturating_sub(now.0) <= ttl_seconds.saturating_mul(1_000) / 4
}

/// base64(HMAC-SHA1(secret, username)): what the server recomputes.
#[must_use]
pub fn password(secret: &[u8], username: &str) -> String {
    let mut mac = <Hmac<Sha1>>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(username.as_bytes());
    STANDARD.encode(mac.finalize().into_bytes())
}

impl TurnCredential {
    /// The credential as a WebRTC `RTCIceServer` (`urls`, `username`, `credential`).
    #[must_use]
    pub fn ice_server(&self) -> serde_json::Value {
        serde_json::json!({
            "urls": self.urls,
            "username": self.username,
            "credential": self.password,
        })
    }
}

impl fmt::Display for TurnAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// STUN's magic cookie (RFC 5389).
pub const STUN_MAGIC_COOKIE: u32 = 0x2112_A442;
const BINDING_REQUEST: u16 = 0x0001;
const BINDING_SUCCESS: u16 = 0x0101;

/// A STUN Binding request with `transaction`: what the API sends the authority to learn that it
/// answers before an open is allowed (an unauthenticated request every TURN server answers).
#[must_use]
pub fn binding_request(transaction: [u8; 12]) -> [u8; 20] {
    let mut message = [0u8; 20];
    message[..2].copy_from_slice(&BINDING_REQUEST.to_be_bytes());
    message[4..8].copy_from_slice(&STUN_MAGIC_COOKIE.to_be_bytes());
    message[8..].copy_from_slice(&transaction);
    message
}

/// Whether `reply` is the Binding success answer to the request with `transaction`.
#[must_use]
pub fn is_binding_success(reply: &[u8], transaction: &[u8; 12]) -> bool {
    reply.len() >= 20
        && reply[..2] == BINDING_SUCCESS.to_be_bytes()
        && reply[4..8] == STUN_MAGIC_COOKIE.to_be_bytes()
        && reply[8..20] == transaction[..]
        && usize::from(u16::from_be_bytes([reply[2], reply[3]])) == reply.len() - 20
}

/// coturn's configuration for a TURN server on loopback (`corral up`'s, the chaos harness's):
/// only the TURN REST credential under `secret` (`use-auth-secret`), no TLS, DTLS or CLI, relays
/// on loopback between loopback peers (the worker's and the viewers' allocations are both on the
/// one machine), its pid in `pidfile`, its log on stdout.
#[must_use]
pub fn loopback_config(port: u16, secret: &str, pidfile: &str) -> String {
    format!(
        "listening-ip=127.0.0.1\nlistening-port={port}\nrelay-ip=127.0.0.1\nrealm=corral\n\
         use-auth-secret\nstatic-auth-secret={secret}\nno-tls\nno-dtls\nno-cli\n\
         no-multicast-peers\nallow-loopback-peers\nfingerprint\nno-software-attribute\n\
         pidfile={pidfile}\nlog-file=stdout\nsimple-log\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a shared secret of some length";

    #[test]
    fn brow_09_a_credential_is_renewed_in_the_last_quarter_of_its_life() {
        let authority = TurnAuthority::parse(Some("turn:127.0.0.1:3478")).unwrap();
        let minted = mint(&authority, SECRET, "s1", UnixMillis(1_000_000), 3_600);
        assert_eq!(minted.expires_at, UnixMillis(1_000_000 + 3_600_000));
        assert!(!needs_renewal(&minted, UnixMillis(1_000_000), 3_600));
        assert!(!needs_renewal(
            &minted,
            UnixMillis(1_000_000 + 2_699_999),
            3_600
        ));
        assert!(needs_renewal(
            &minted,
            UnixMillis(1_000_000 + 2_700_000),
            3_600
        ));
        assert!(needs_renewal(&minted, UnixMillis(u64::MAX), 3_600));
    }

    #[test]
    fn brow_09_the_one_authority_is_parsed_strictly() {
        let parsed = |url: &str| TurnAuthority::parse(Some(url));
        assert_eq!(
            parsed("turn:10.0.0.5:3479"),
            Ok(TurnAuthority {
                host: TurnHost::Ip("10.0.0.5".parse().unwrap()),
                port: 3479
            })
        );
        assert_eq!(
            parsed("TURN:turn.Example.org").unwrap().to_string(),
            "turn.example.org:3478"
        );
        assert_eq!(parsed("turn:[::1]:5349").unwrap().to_string(), "[::1]:5349");
        assert_eq!(
            parsed("turn:127.0.0.1:3478").unwrap().urls(),
            [
                "turn:127.0.0.1:3478?transport=udp",
                "turn:127.0.0.1:3478?transport=tcp"
            ]
        );
        for missing in [None, Some(""), Some("  ")] {
            assert_eq!(
                TurnAuthority::parse(missing).map_err(|e| e.code()),
                Err("turn_not_configured")
            );
        }
        for bad in [
            "10.0.0.5:3478",
            "turns:10.0.0.5:5349",
            "stun:10.0.0.5",
            "turn:",
            "turn:10.0.0.5:0",
            "turn:10.0.0.5:70000",
            "turn:10.0.0.5:+80",
            "turn:10.0.0.5:3478?transport=udp",
            "turn:user:pass@10.0.0.5",
            "turn:10.0.0.5:3478/x",
            "turn:0.0.0.0:3478",
            "turn:224.0.0.1:3478",
            "turn:[::1",
            "turn:[::1]x",
            "turn:[nope]:3478",
            "turn:-bad-.example",
            "turn:a..b",
            "turn:10.0.0.256",
            "turn:exa mple.org",
        ] {
            assert_eq!(
                parsed(bad).map_err(|e| e.code()),
                Err("turn_config_invalid"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn brow_09_the_credential_is_the_turn_rest_scheme() {
        let authority = TurnAuthority::parse(Some("turn:127.0.0.1:3478")).unwrap();
        let now = UnixMillis(1_800_000_000_500);
        let credential = mint(&authority, SECRET, "ab12", now, 600);
        assert_eq!(credential.username, "1800000600:ab12");
        assert_eq!(credential.expires_at, UnixMillis(1_800_000_600_000));
        // The server's check, computed independently: HMAC-SHA1 from its definition (RFC 2104).
        let mut key = [0u8; 64];
        key[..SECRET.len()].copy_from_slice(SECRET);
        let inner: Vec<u8> = key
            .iter()
            .map(|b| b ^ 0x36)
            .chain(credential.username.bytes())
            .collect();
        let inner = <Sha1 as sha1::Digest>::digest(&inner);
        let outer: Vec<u8> = key.iter().map(|b| b ^ 0x5c).chain(inner).collect();
        let expected = STANDARD.encode(<Sha1 as sha1::Digest>::digest(&outer));
        assert_eq!(credential.password, expected);
        // A different secret, user or expiry gives a different password.
        assert_ne!(
            mint(&authority, b"another shared secret!!", "ab12", now, 600).password,
            expected
        );
        assert_ne!(
            mint(&authority, SECRET, "ab13", now, 600).password,
            expected
        );
        assert_ne!(
            mint(&authority, SECRET, "ab12", now, 601).password,
            expected
        );
        // A user cannot smuggle a separator into the username.
        assert_eq!(
            mint(&authority, SECRET, "a:b c", now, 600).username,
            "1800000600:abc"
        );
        assert_eq!(
            credential.ice_server()["urls"][1],
            "turn:127.0.0.1:3478?transport=tcp"
        );
    }

    #[test]
    fn brow_09_the_reachability_probe_is_a_binding_request() {
        let transaction = *b"0123456789ab";
        let request = binding_request(transaction);
        assert_eq!(&request[..8], &[0, 1, 0, 0, 0x21, 0x12, 0xa4, 0x42]);
        let mut reply = request.to_vec();
        reply[..2].copy_from_slice(&[1, 1]);
        assert!(is_binding_success(&reply, &transaction));
        assert!(!is_binding_success(&reply, b"0123456789ac"));
        assert!(!is_binding_success(&request, &transaction));
        assert!(!is_binding_success(&reply[..19], &transaction));
        reply.extend([0, 32, 0, 0]);
        assert!(
            !is_binding_success(&reply, &transaction),
            "a length that disagrees"
        );
    }

    #[test]
    fn brow_09_a_missing_or_short_secret_refuses() {
        assert_eq!(
            secret(None).map_err(|e| e.code()),
            Err("turn_not_configured")
        );
        assert_eq!(
            secret(Some(b"short\n")).map_err(|e| e.code()),
            Err("turn_config_invalid")
        );
        assert_eq!(
            secret(Some(b"0123456789abcdef\n")),
            Ok(&b"0123456789abcdef"[..])
        );
    }
}
