//! A member's viewer of a session's live view (BROW-8, BROW-12): the ticket that lets a member's
//! browser load the viewport and open its signaling relay, and the rule for whether it may watch.
//!
//! The platform asks for a ticket with its caller credential, naming the actor and conversation
//! whose session it is (authorized as every session call is) and the member who will watch. A
//! ticket is `<session>.<conversation>.<member>.<expiry>.<mac>`, each part base64url, the MAC an
//! HMAC-SHA256 under a key every API replica derives from the same secret: any replica verifies
//! it, and each viewport request and signaling relay checks it again against the session's
//! record (same conversation, not closing) and the private interval. A member's browser never
//! holds the caller credential, and the ticket grants nothing but watching that one session.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hkdf::Hkdf;
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;

use super::{SessionRecord, SessionState};
use crate::time::UnixMillis;

/// How long a ticket lets a viewer load the page and start (or restart) its relay.
pub const TICKET_TTL_SECONDS: u64 = 600;
/// The longest ticket read, in bytes.
pub const TICKET_MAX_BYTES: usize = 1_024;
const KEY_SALT: &[u8] = b"corral viewer ticket v1";

/// The key tickets are signed with, derived from the deployment's `secret`.
#[derive(Clone)]
pub struct TicketKey([u8; 32]);

impl TicketKey {
    /// The key for `secret` (the API's caller credential: every replica has it).
    #[must_use]
    pub fn derive(secret: &[u8]) -> TicketKey {
        let mut key = [0u8; 32];
        // 32 bytes is always a valid HKDF-SHA256 output length.
        let _ = Hkdf::<Sha256>::new(Some(KEY_SALT), secret).expand(b"key", &mut key);
        TicketKey(key)
    }

    fn mac(&self, text: &str) -> Vec<u8> {
        let mut mac = <Hmac<Sha256>>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(text.as_bytes());
        mac.finalize().into_bytes().to_vec()
    }
}

/// What a ticket says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The session it lets the member watch.
    pub session: String,
    /// The conversation the session must belong to.
    pub conversation: String,
    /// The member watching.
    pub member: String,
    /// When it stops letting a viewer in.
    pub expires_at: UnixMillis,
}

/// The code of a refusal because another member's interval is private (BROW-12).
pub const PRIVATE_TEXT: &str = "private_text";
/// How often a viewer whose member is using the pointer or keyboard says so on its signaling
/// relay (which counts it as the session's activity, BROW-6): a quarter of the idle limit, between
/// one second and a minute, so that a member at work keeps the session from being reaped.
#[must_use]
pub fn activity_every_ms(idle_seconds: u64) -> u64 {
    idle_seconds
        .saturating_mul(1_000)
        .div_euclid(4)
        .clamp(1_000, 60_000)
}

/// What a viewer does after its signaling relay closes, or its offer is refused, with a code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterClose {
    /// The reason stands until something outside the page changes (the session ended, another
    /// member's interval is private, the ticket is no good, the live view stopped, the viewers
    /// are full, the page itself speaks wrongly): the page keeps showing it and does not connect
    /// again.
    Stay,
    /// A passing condition (the store or the worker did not answer, the connection dropped): the
    /// page connects again after a delay, a bounded number of times.
    Reconnect,
}

/// What a viewer does after a close or refusal with `code` (one of this module's codes, or any
/// other, which is taken as passing).
#[must_use]
pub fn after_close(code: &str) -> AfterClose {
    const STANDING: [&str; 8] = [
        PRIVATE_TEXT,
        "session_not_found",
        "viewer_ticket_invalid",
        "viewer_ticket_expired",
        "live_view_stopped",
        "viewers_full",
        "sdp_invalid",
        "signal_invalid",
    ];
    if STANDING.contains(&code) {
        AfterClose::Stay
    } else {
        AfterClose::Reconnect
    }
}

/// The largest signaling message (an offer with its candidates), in bytes.
pub const SIGNAL_MAX_BYTES: usize = 64 * 1024;
/// Viewers of one session at once.
pub const VIEWERS_MAX: usize = 8;

/// Why the worker's adapter gives an offer no answer; each has a stable code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OfferRefusal {
    /// Not an SDP offer, too long, or with no relayed candidate (`sdp_invalid`).
    Invalid(String),
    /// Another member's interval is private (`private_text`).
    Private,
    /// [`VIEWERS_MAX`] viewers are watching (`viewers_full`).
    Full,
    /// The live view has stopped (`live_view_stopped`).
    Stopped,
}

impl OfferRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "sdp_invalid",
            Self::Private => PRIVATE_TEXT,
            Self::Full => "viewers_full",
            Self::Stopped => "live_view_stopped",
        }
    }
}

impl fmt::Display for OfferRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid(why) => write!(f, "the offer is not usable: {why}"),
            Self::Private => f.write_str("another member's interval is private"),
            Self::Full => write!(f, "{VIEWERS_MAX} viewers are watching already"),
            Self::Stopped => f.write_str("the live view has stopped"),
        }
    }
}

/// Why the signaling relay answers a message with an error; each has a stable code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalRefusal {
    /// Not a signaling message the relay knows (`signal_invalid`).
    Invalid,
    /// The worker's live view did not answer (`live_view_unreachable`).
    Unreachable,
}

impl SignalRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Invalid => "signal_invalid",
            Self::Unreachable => "live_view_unreachable",
        }
    }
}

/// Why a viewer is turned away; each has a stable code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViewRefusal {
    /// No ticket, a forged or garbled one, or one for another session (`viewer_ticket_invalid`).
    TicketInvalid,
    /// The ticket's time is over (`viewer_ticket_expired`).
    TicketExpired,
    /// No such session in the ticket's conversation, or it is closing (`session_not_found`).
    NotFound,
    /// Another member's interval is private (`private_text`).
    Private,
}

impl ViewRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::TicketInvalid => "viewer_ticket_invalid",
            Self::TicketExpired => "viewer_ticket_expired",
            Self::NotFound => "session_not_found",
            Self::Private => PRIVATE_TEXT,
        }
    }

    /// The HTTP status it is answered with.
    #[must_use]
    pub fn status(&self) -> u16 {
        match self {
            Self::TicketInvalid | Self::TicketExpired => 401,
            Self::NotFound => 404,
            Self::Private => 403,
        }
    }
}

impl fmt::Display for ViewRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TicketInvalid => "the viewer's ticket is missing or not valid for this session",
            Self::TicketExpired => "the viewer's ticket has expired: ask for a new one",
            Self::NotFound => "no such session in this conversation",
            Self::Private => "another member is viewing private text: the live view is paused",
        })
    }
}

/// A ticket for `member` to watch `session` of `conversation`, from `now`.
#[must_use]
pub fn mint(
    key: &TicketKey,
    session: &str,
    conversation: &str,
    member: &str,
    now: UnixMillis,
) -> (String, UnixMillis) {
    let expires_at = UnixMillis(now.0.saturating_add(TICKET_TTL_SECONDS * 1_000));
    let text = [session, conversation, member, &expires_at.0.to_string()]
        .map(|part| URL_SAFE_NO_PAD.encode(part))
        .join(".");
    let mac = URL_SAFE_NO_PAD.encode(key.mac(&text));
    (format!("{text}.{mac}"), expires_at)
}

/// Reads `ticket` for `session` at `now`.
///
/// # Errors
/// [`ViewRefusal::TicketInvalid`] or [`ViewRefusal::TicketExpired`].
pub fn verify(
    key: &TicketKey,
    ticket: &str,
    session: &str,
    now: UnixMillis,
) -> Result<Ticket, ViewRefusal> {
    if ticket.len() > TICKET_MAX_BYTES {
        return Err(ViewRefusal::TicketInvalid);
    }
    let (text, mac) = ticket.rsplit_once('.').ok_or(ViewRefusal::TicketInvalid)?;
    let mac = URL_SAFE_NO_PAD
        .decode(mac)
        .map_err(|_| ViewRefusal::TicketInvalid)?;
    let mut check = <Hmac<Sha256>>::new_from_slice(&key.0).expect("HMAC takes any key length");
    check.update(text.as_bytes());
    check
        .verify_slice(&mac)
        .map_err(|_| ViewRefusal::TicketInvalid)?;
    let parts: Vec<String> = text
        .split('.')
        .map(|part| {
            URL_SAFE_NO_PAD
                .decode(part)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
        })
        .collect::<Option<_>>()
        .ok_or(ViewRefusal::TicketInvalid)?;
    let [for_session, conversation, member, expiry] =
        <[String; 4]>::try_from(parts).map_err(|_| ViewRefusal::TicketInvalid)?;
    let expires_at = UnixMillis(expiry.parse().map_err(|_| ViewRefusal::TicketInvalid)?);
    if for_session != session {
        return Err(ViewRefusal::TicketInvalid);
    }
    if now.0 >= expires_at.0 {
        return Err(ViewRefusal::TicketExpired);
    }
    Ok(Ticket {
        session: for_session,
        conversation,
        member,
        expires_at,
    })
}

/// Whether the ticket's member may watch the stored session now (BROW-8, BROW-12): the session
/// exists in the ticket's conversation and is not closing, and no other member's interval is
/// private (`private_member`: whose it is, when one is).
///
/// # Errors
/// [`ViewRefusal::NotFound`] or [`ViewRefusal::Private`].
pub fn judge_view(
    stored: Option<(&SessionRecord, &SessionState)>,
    ticket: &Ticket,
    private_member: Option<&str>,
) -> Result<(), ViewRefusal> {
    let Some((record, state)) = stored else {
        return Err(ViewRefusal::NotFound);
    };
    if record.conversation != ticket.conversation || state.closing.is_some() {
        return Err(ViewRefusal::NotFound);
    }
    if state.private && private_member != Some(ticket.member.as_str()) {
        return Err(ViewRefusal::Private);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{OpToken, WorkerId};

    const NOW: UnixMillis = UnixMillis(1_800_000_000_000);

    fn key() -> TicketKey {
        TicketKey::derive(b"the caller credential")
    }

    #[test]
    fn brow_08_a_ticket_reads_back_only_for_its_session_until_it_expires() {
        let (ticket, expires_at) = mint(&key(), "s1", "research", "bob", NOW);
        assert_eq!(expires_at.0, NOW.0 + TICKET_TTL_SECONDS * 1_000);
        let read = verify(&key(), &ticket, "s1", NOW).unwrap();
        assert_eq!(
            (read.conversation.as_str(), read.member.as_str()),
            ("research", "bob")
        );
        assert_eq!(
            verify(&key(), &ticket, "s2", NOW),
            Err(ViewRefusal::TicketInvalid)
        );
        assert_eq!(
            verify(&key(), &ticket, "s1", expires_at),
            Err(ViewRefusal::TicketExpired)
        );
        // Another deployment's key, and every single-character change, is refused.
        assert_eq!(
            verify(&TicketKey::derive(b"other"), &ticket, "s1", NOW),
            Err(ViewRefusal::TicketInvalid)
        );
        for at in 0..ticket.len() {
            let mut bytes = ticket.clone().into_bytes();
            bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
            let changed = String::from_utf8(bytes).unwrap();
            if changed != ticket {
                assert!(verify(&key(), &changed, "s1", NOW).is_err(), "{changed}");
            }
        }
        assert_eq!(
            verify(&key(), "", "s1", NOW),
            Err(ViewRefusal::TicketInvalid)
        );
        assert_eq!(
            verify(&key(), &"a".repeat(5000), "s1", NOW),
            Err(ViewRefusal::TicketInvalid)
        );
    }

    #[test]
    fn brow_12_a_standing_reason_ends_the_viewer_and_a_passing_one_reconnects_it() {
        for refusal in [
            ViewRefusal::TicketInvalid,
            ViewRefusal::TicketExpired,
            ViewRefusal::NotFound,
            ViewRefusal::Private,
        ] {
            assert_eq!(after_close(refusal.code()), AfterClose::Stay, "{refusal}");
        }
        for refusal in [
            OfferRefusal::Private,
            OfferRefusal::Full,
            OfferRefusal::Stopped,
            OfferRefusal::Invalid(String::new()),
        ] {
            assert_eq!(after_close(refusal.code()), AfterClose::Stay, "{refusal}");
        }
        // A page that speaks wrongly would only say it again.
        assert_eq!(after_close(SignalRefusal::Invalid.code()), AfterClose::Stay);
        // A worker or store that did not answer, or a code this module does not know, passes.
        for code in [
            SignalRefusal::Unreachable.code(),
            "coordination_unavailable",
            "",
        ] {
            assert_eq!(after_close(code), AfterClose::Reconnect, "{code}");
        }
    }

    #[test]
    fn brow_06_a_member_at_work_says_so_well_within_the_idle_limit() {
        assert_eq!(activity_every_ms(900), 60_000);
        assert_eq!(activity_every_ms(60), 15_000);
        assert_eq!(activity_every_ms(4), 1_000);
        assert_eq!(activity_every_ms(1), 1_000);
        for idle in [1, 4, 60, 900, 86_400] {
            assert!(activity_every_ms(idle) <= (idle * 1_000).max(1_000));
        }
    }

    #[test]
    fn brow_12_only_the_private_member_watches_during_the_interval() {
        let record = SessionRecord {
            actor: "agent".into(),
            conversation: "research".into(),
            worker: WorkerId { epoch: 1, seq: 2 },
            token: OpToken(3),
            networked: true,
            owner: "a".into(),
            live_view: None,
        };
        let mut state = SessionState {
            private: false,
            last_activity: NOW,
            closing: None,
        };
        let ticket = |member: &str, conversation: &str| Ticket {
            session: "s1".into(),
            conversation: conversation.into(),
            member: member.into(),
            expires_at: NOW,
        };
        assert_eq!(
            judge_view(Some((&record, &state)), &ticket("bob", "research"), None),
            Ok(())
        );
        assert_eq!(
            judge_view(Some((&record, &state)), &ticket("bob", "other"), None),
            Err(ViewRefusal::NotFound)
        );
        assert_eq!(
            judge_view(None, &ticket("bob", "research"), None),
            Err(ViewRefusal::NotFound)
        );
        state.private = true;
        assert_eq!(
            judge_view(
                Some((&record, &state)),
                &ticket("bob", "research"),
                Some("ann")
            ),
            Err(ViewRefusal::Private)
        );
        assert_eq!(
            judge_view(
                Some((&record, &state)),
                &ticket("ann", "research"),
                Some("ann")
            ),
            Ok(())
        );
        // Private with nobody named: nobody watches.
        assert_eq!(
            judge_view(Some((&record, &state)), &ticket("ann", "research"), None),
            Err(ViewRefusal::Private)
        );
        state.private = false;
        state.closing = Some(NOW);
        assert_eq!(
            judge_view(Some((&record, &state)), &ticket("ann", "research"), None),
            Err(ViewRefusal::NotFound)
        );
    }
}
