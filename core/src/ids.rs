//! Identities shared across modules. Ids chosen by callers (tickets) must be unique per deployment;
//! ids minted by the pool (workers, operation tokens) are unique within one pool document's epoch,
//! and worker ids carry the epoch so that a pool rebuilt after data loss never reuses one.

use std::fmt;

/// A worker, named by the pool that created it: the pool document's epoch and a sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerId {
    /// The epoch of the pool document that minted this id.
    pub epoch: u64,
    /// The sequence number within that epoch.
    pub seq: u64,
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w-{:x}-{}", self.epoch, self.seq)
    }
}

impl WorkerId {
    /// Parses the form produced by `Display` (`w-<epoch hex>-<seq>`), as found in an inventory.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.strip_prefix("w-")?;
        let (epoch, seq) = rest.split_once('-')?;
        let valid_hex = !epoch.is_empty()
            && epoch.len() <= 16
            && epoch
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        let valid_dec =
            !seq.is_empty() && seq.len() <= 20 && seq.bytes().all(|b| b.is_ascii_digit());
        if !valid_hex || !valid_dec {
            return None;
        }
        Some(Self {
            epoch: u64::from_str_radix(epoch, 16).ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl serde::Serialize for WorkerId {
    /// Serialized as its `Display` form, so that it can key a map in any format.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for WorkerId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("not a worker id: {text:?}")))
    }
}

/// An operation token: minted by the pool on every state transition of a worker. A report about a
/// worker is accepted only with the token of the worker's current state.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct OpToken(pub u64);

impl fmt::Display for OpToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

/// An acquire ticket, chosen by the caller (unique per deployment). A granted ticket's id is also
/// the id of the lease it received.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct TicketId(pub u64);

impl fmt::Display for TicketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "k{:x}", self.0)
    }
}

/// The id of a lease: the id of the ticket that obtained it.
pub type LeaseId = TicketId;

/// A worker image: the digest that names one release of the worker and its runtime.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ImageId(pub String);

impl fmt::Display for ImageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lower-case hexadecimal of `bytes`: the one text form of random ids, digests and keys.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

/// The SHA-256 of `bytes` as 64 lowercase hex digits: the one content digest of projected
/// documents and linked outputs (PROJ-1, OUT-1).
#[must_use]
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex(&sha2::Sha256::digest(bytes))
}

/// HMAC-SHA256 (RFC 2104) of the concatenation of `message`'s parts under `key`: the one MAC of
/// package tokens and kernel seals.
#[must_use]
pub fn hmac_sha256(key: &[u8], message: &[&[u8]]) -> [u8; 32] {
    use sha2::{Digest as _, Sha256};
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for part in message {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Longest actor, member or conversation id, in bytes.
pub const IDENTITY_MAX_BYTES: usize = 256;

/// Whether `text` may name an actor, member or conversation: 1 to [`IDENTITY_MAX_BYTES`] bytes, no
/// control character. The one rule the API admits requests by and the grant minter checks.
#[must_use]
pub fn identity_is_valid(text: &str) -> bool {
    !text.is_empty() && text.len() <= IDENTITY_MAX_BYTES && !text.chars().any(char::is_control)
}

/// The first of `fields` (name, value) that [`identity_is_valid`] refuses, with the message that
/// says why; `None` when all are valid.
#[must_use]
pub fn first_invalid_identity<'a>(fields: &[(&'a str, &str)]) -> Option<(&'a str, String)> {
    fields
        .iter()
        .find(|(_, value)| !identity_is_valid(value))
        .map(|(field, _)| {
            (
                *field,
                format!(
                    "{field} must be 1 to {IDENTITY_MAX_BYTES} bytes with no control character"
                ),
            )
        })
}

/// The member (a person) on whose behalf a lease is held; fairness is counted per member.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct MemberId(pub String);

/// The actor (the member or an agent acting for them) whose workspace a run uses.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ActorId(pub String);

/// A conversation; with the actor it keys a workspace (WS-1).
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ConversationId(pub String);

/// Which kind of lease: code runs and browser sessions share one pool but hold leases in separate
/// namespaces, so a browser session never evicts the same member's code workspace (BROW-6).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum LeaseNamespace {
    /// A `run_code` execution.
    Code,
    /// A live browser session.
    Browser,
}

/// What a lease is for: its namespace and the actor-and-conversation workspace it serves.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct LeaseScope {
    /// Code or browser.
    pub namespace: LeaseNamespace,
    /// The actor whose workspace it is.
    pub actor: ActorId,
    /// The conversation whose workspace it is.
    pub conversation: ConversationId,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lower_case_and_two_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn worker_id_round_trips_and_rejects_other_spellings() {
        let id = WorkerId {
            epoch: 0x1f,
            seq: 42,
        };
        assert_eq!(id.to_string(), "w-1f-42");
        assert_eq!(WorkerId::parse("w-1f-42"), Some(id));
        for bad in [
            "w-1F-42",
            "w--42",
            "w-1f-",
            "x-1f-42",
            "w-1f-4x2",
            "w-1f-+42",
            "w-11111111111111111-1",
        ] {
            assert_eq!(WorkerId::parse(bad), None, "{bad}");
        }
    }
}
