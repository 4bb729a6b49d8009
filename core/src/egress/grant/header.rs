//! The grant as it travels: the `Proxy-Authorization` header, and text that can go in one.

use super::GRANT_TOKEN_MAX_BYTES;
use crate::egress::reason::Reason;

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
