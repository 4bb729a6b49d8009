//! Browser sessions (BROW-1, BROW-3, BROW-10, BROW-12, BROW-13): what an agent may ask of the
//! one headed Chromium of a session, each action's bounds, and the stable codes of every way an
//! action fails. Pure: the worker's bridge performs the actions, the API admits them.

pub mod input;
pub mod media;
pub mod turn;
pub mod viewer;
pub mod viewport;

use serde::{Deserialize, Serialize};

use crate::ids::{OpToken, WorkerId};
use crate::time::UnixMillis;

/// The longest one action may take, in milliseconds; an action may ask for less.
pub const STEP_MAX_MS: u64 = 30_000;
/// An action's bound when it names none.
pub const STEP_DEFAULT_MS: u64 = 10_000;
/// The most text, accessibility tree or evaluated JSON one reply carries, in bytes.
pub const REPLY_MAX_BYTES: usize = 256 * 1024;
/// The largest screenshot one reply carries (PNG bytes).
pub const SCREENSHOT_MAX_BYTES: usize = 8 << 20;
/// The longest URL, selector, typed text and expression accepted.
pub const URL_MAX_BYTES: usize = 8 * 1024;
/// See [`URL_MAX_BYTES`].
pub const SELECTOR_MAX_BYTES: usize = 1024;
/// See [`URL_MAX_BYTES`].
pub const TEXT_MAX_BYTES: usize = 64 * 1024;
/// See [`URL_MAX_BYTES`].
pub const EXPRESSION_MAX_BYTES: usize = 64 * 1024;
/// A new session's desktop (BROW-11).
pub const WIDTH: u32 = 1600;
/// See [`WIDTH`].
pub const HEIGHT: u32 = 1000;
/// How long a session may sit idle before it is reaped (BROW-6).
pub const IDLE_SECONDS: u64 = 15 * 60;
/// How long opening a session (display, window manager, sound, Chromium) may take.
pub const OPEN_MAX_SECONDS: u64 = 60;

/// The keys `press` accepts besides single characters.
pub const KEYS: [&str; 13] = [
    "Enter",
    "Tab",
    "Backspace",
    "Escape",
    "ArrowDown",
    "ArrowUp",
    "ArrowLeft",
    "ArrowRight",
    "PageDown",
    "PageUp",
    "Home",
    "End",
    "Delete",
];

/// A page's load state, as `wait` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadState {
    /// The `load` event.
    Load,
    /// `DOMContentLoaded`.
    Domcontentloaded,
}

/// One structured action on a session (BROW-10).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// Go to `url` and wait for its load.
    Navigate {
        /// An `http`, `https` or `about:blank` URL.
        url: String,
        /// The bound, at most [`STEP_MAX_MS`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Click the centre of the first element `selector` matches.
    Click {
        /// A CSS selector.
        selector: String,
    },
    /// Type `text`, into the element `selector` matches (clicked first) or where the focus is.
    Type {
        /// A CSS selector, optional.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        selector: Option<String>,
        /// The text.
        text: String,
    },
    /// Press one key: a single character or one of [`KEYS`].
    Press {
        /// The key.
        key: String,
    },
    /// Scroll by a wheel of `dx`, `dy` pixels.
    Scroll {
        /// Horizontal pixels.
        #[serde(default)]
        dx: i32,
        /// Vertical pixels.
        #[serde(default)]
        dy: i32,
    },
    /// The page's visible text, at most [`REPLY_MAX_BYTES`].
    Text {},
    /// The page's accessibility tree as roles and names, at most [`REPLY_MAX_BYTES`].
    Accessibility {},
    /// Evaluate a JavaScript expression in the page; its JSON value, bounded in time and size.
    Evaluate {
        /// The expression.
        expression: String,
        /// The bound, at most [`STEP_MAX_MS`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// A PNG of the page's viewport.
    Screenshot {},
    /// Wait until the page reaches `state`.
    Wait {
        /// The load state.
        state: LoadState,
        /// The bound, at most [`STEP_MAX_MS`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
}

/// Why an action failed. The codes are stable; the worker's bridge answers with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ActionError {
    /// A malformed action: an unknown key, a field over its bound, a URL that is not
    /// `http`/`https`/`about:blank`.
    Invalid,
    /// The browser policy does not admit the URL (the session's egress mode decides).
    NavigationDenied,
    /// The page could not be loaded (the proxy refused it, the name did not resolve, ...).
    NavigationFailed,
    /// No element matches the selector.
    SelectorNotFound,
    /// The element has no size to click.
    SelectorNotVisible,
    /// The element matched but does not take the keyboard (a `type` into it).
    SelectorNotFocusable,
    /// The action did not finish within its bound.
    TimedOut,
    /// The evaluated expression threw.
    ScriptError,
    /// The reply would be over its bound.
    ReplyTooLarge,
    /// The browser is gone (crashed, or closed itself).
    BrowserGone,
    /// The browser refused the command.
    BrowserError,
    /// The session's runtime did not start.
    RuntimeStartFailed,
    /// A member marked the session private: the assistant's reads and actions are refused
    /// for the interval (BROW-12).
    SessionPrivate,
}

impl ActionError {
    /// Every code.
    pub const ALL: [ActionError; 13] = [
        Self::Invalid,
        Self::NavigationDenied,
        Self::NavigationFailed,
        Self::SelectorNotFound,
        Self::SelectorNotVisible,
        Self::SelectorNotFocusable,
        Self::TimedOut,
        Self::ScriptError,
        Self::ReplyTooLarge,
        Self::BrowserGone,
        Self::BrowserError,
        Self::RuntimeStartFailed,
        Self::SessionPrivate,
    ];

    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Invalid => "action_invalid",
            Self::NavigationDenied => "navigation_denied",
            Self::NavigationFailed => "navigation_failed",
            Self::SelectorNotFound => "selector_not_found",
            Self::SelectorNotVisible => "selector_not_visible",
            Self::SelectorNotFocusable => "selector_not_focusable",
            Self::TimedOut => "action_timed_out",
            Self::ScriptError => "script_error",
            Self::ReplyTooLarge => "reply_too_large",
            Self::BrowserGone => "browser_gone",
            Self::BrowserError => "browser_error",
            Self::RuntimeStartFailed => "runtime_start_failed",
            Self::SessionPrivate => "session_private",
        }
    }

    /// The error a code names; an unknown code is the browser's own error.
    #[must_use]
    pub fn of_code(code: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|e| e.code() == code)
            .unwrap_or(Self::BrowserError)
    }
}

fn over(what: &str, text: &str, max: usize) -> Result<(), String> {
    if text.len() > max {
        return Err(format!("{what} is over {max} bytes"));
    }
    Ok(())
}

fn bound(timeout_ms: Option<u64>) -> Result<(), String> {
    match timeout_ms {
        Some(0) => Err("timeout_ms must be at least 1".to_owned()),
        Some(ms) if ms > STEP_MAX_MS => Err(format!("timeout_ms is over {STEP_MAX_MS}")),
        _ => Ok(()),
    }
}

/// Whether a session may be asked to open `url`: `http`, `https`, or `about:blank`. The egress
/// policy judges the host after this, and the egress proxy is the final boundary.
#[must_use]
pub fn url_is_navigable(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    url == "about:blank"
        || ((lower.starts_with("http://") || lower.starts_with("https://"))
            && !url.chars().any(|c| c.is_control() || c == ' '))
}

impl Action {
    /// Checks the action's fields against their bounds.
    ///
    /// # Errors
    /// What is wrong ([`ActionError::Invalid`]).
    pub fn check(&self) -> Result<(), String> {
        match self {
            Self::Navigate { url, timeout_ms } => {
                over("url", url, URL_MAX_BYTES)?;
                if !url_is_navigable(url) {
                    return Err("a session navigates to http, https or about:blank only".into());
                }
                bound(*timeout_ms)
            }
            Self::Click { selector } => {
                if selector.trim().is_empty() {
                    return Err("an empty selector".into());
                }
                over("selector", selector, SELECTOR_MAX_BYTES)
            }
            Self::Type { selector, text } => {
                if let Some(selector) = selector {
                    over("selector", selector, SELECTOR_MAX_BYTES)?;
                }
                over("text", text, TEXT_MAX_BYTES)
            }
            Self::Press { key } => {
                if key.chars().count() == 1 || KEYS.contains(&key.as_str()) {
                    Ok(())
                } else {
                    Err(format!(
                        "a key is one character or one of {}",
                        KEYS.join(", ")
                    ))
                }
            }
            Self::Scroll { .. } | Self::Text {} | Self::Accessibility {} | Self::Screenshot {} => {
                Ok(())
            }
            Self::Evaluate {
                expression,
                timeout_ms,
            } => {
                over("expression", expression, EXPRESSION_MAX_BYTES)?;
                bound(*timeout_ms)
            }
            Self::Wait { timeout_ms, .. } => bound(*timeout_ms),
        }
    }
}

/// A session as the deployment's store keeps it (BROW-14): what any API replica needs to serve
/// its calls. It never changes while the session lives; [`SessionState`] does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The actor whose session it is.
    pub actor: String,
    /// The conversation it belongs to; every call is authorized by both.
    pub conversation: String,
    /// The leased worker it runs on.
    pub worker: WorkerId,
    /// The lease's operation token, which the worker's close checks.
    pub token: OpToken,
    /// Whether its egress policy gave it a grant: without one it navigates nowhere but
    /// `about:blank`.
    pub networked: bool,
    /// The API replica that holds (renews) the lease.
    pub owner: String,
    /// The live view's TURN credential, minted at open and shared by the worker and every
    /// viewer (BROW-9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_view: Option<turn::TurnCredential>,
}

/// What changes while a session lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionState {
    /// A member marked the session private (BROW-12).
    pub private: bool,
    /// The last call that reached the worker, on the deployment's clock.
    pub last_activity: UnixMillis,
    /// When a replica claimed its close: no further call reaches it.
    pub closing: Option<UnixMillis>,
}

/// A call on a session, as far as authorizing it goes.
#[derive(Clone, Copy, Debug)]
pub enum Call<'a> {
    /// An action of the agent's.
    Act(&'a Action),
    /// Marking the session private or ending the interval.
    Private,
    /// Asking for a member's viewer ticket (BROW-8); whether the member may watch is
    /// `viewer::judge_view`'s, on every viewport request and signaling relay.
    Watch,
    /// Closing it.
    Close,
}

/// Why a call on a session is refused before it reaches the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallRefusal {
    /// No such session for this actor and conversation (or it is closing): another's session is
    /// indistinguishable from none.
    NotFound,
    /// A member marked it private: the agent's reads and actions wait (BROW-12).
    Private,
    /// A navigation off `about:blank` when the egress policy gave the session no network.
    NoNetwork,
}

/// The one rule for a call on a session, on whichever replica it arrives (BROW-12, BROW-14).
///
/// # Errors
/// The refusal, checked in this order: ownership and closing, privacy, network.
pub fn judge_call(
    stored: Option<(&SessionRecord, &SessionState)>,
    actor: &str,
    conversation: &str,
    call: Call<'_>,
) -> Result<(), CallRefusal> {
    let Some((record, state)) = stored else {
        return Err(CallRefusal::NotFound);
    };
    let closing = state.closing.is_some()
        && !crate::pool::broken_on_this_thread(crate::pool::Mutation::ClosingCallable);
    if record.actor != actor || record.conversation != conversation || closing {
        return Err(CallRefusal::NotFound);
    }
    let Call::Act(action) = call else {
        return Ok(());
    };
    if state.private {
        return Err(CallRefusal::Private);
    }
    match action {
        Action::Navigate { url, .. } if !record.networked && url != "about:blank" => {
            Err(CallRefusal::NoNetwork)
        }
        _ => Ok(()),
    }
}

/// Whether a session last active at `state.last_activity` is idle at `now` under a limit of
/// `idle_seconds` (BROW-6); a session already closing is not reaped twice.
#[must_use]
pub fn is_idle(state: &SessionState, now: UnixMillis, idle_seconds: u64) -> bool {
    let per_second = if crate::pool::broken_on_this_thread(crate::pool::Mutation::IdleEarly) {
        100
    } else {
        1_000
    };
    state.closing.is_none()
        && now.0.saturating_sub(state.last_activity.0) >= idle_seconds.saturating_mul(per_second)
}

/// How long a claimed close may take before the claim is abandoned: the worker's close and reset,
/// with room to spare.
pub const CLOSE_ABANDONED_MS: u64 = 5 * 60 * 1_000;

/// Whether a close claimed at `state.closing` was abandoned by `now` (its replica died or lost
/// the store mid-close): the lease's holder then ends the session as a discard, since nothing
/// vouches for the worker.
#[must_use]
pub fn close_abandoned(state: &SessionState, now: UnixMillis) -> bool {
    state
        .closing
        .is_some_and(|since| now.0.saturating_sub(since.0) >= CLOSE_ABANDONED_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brow_10_actions_are_bounded_and_urls_are_http_or_blank() {
        let ok = [
            r#"{"action":"navigate","url":"https://example.test/a?b=c"}"#,
            r##"{"action":"click","selector":"#go"}"##,
            r#"{"action":"type","text":"hello"}"#,
            r#"{"action":"press","key":"Enter"}"#,
            r#"{"action":"press","key":"a"}"#,
            r#"{"action":"scroll","dy":400}"#,
            r#"{"action":"text"}"#,
            r#"{"action":"evaluate","expression":"1+1","timeout_ms":30000}"#,
            r#"{"action":"wait","state":"domcontentloaded"}"#,
        ];
        for text in ok {
            let action: Action = serde_json::from_str(text).unwrap();
            action.check().unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        let refused = [
            r#"{"action":"navigate","url":"file:///etc/passwd"}"#,
            r#"{"action":"navigate","url":"javascript:alert(1)"}"#,
            r#"{"action":"navigate","url":"chrome://settings"}"#,
            r#"{"action":"navigate","url":"http://a b"}"#,
            r#"{"action":"click","selector":"  "}"#,
            r#"{"action":"press","key":"F13"}"#,
            r#"{"action":"evaluate","expression":"1","timeout_ms":30001}"#,
            r#"{"action":"wait","state":"load","timeout_ms":0}"#,
        ];
        for text in refused {
            let action: Action = serde_json::from_str(text).unwrap();
            assert!(action.check().is_err(), "{text}");
        }
        let long = Action::Type {
            selector: None,
            text: "x".repeat(TEXT_MAX_BYTES + 1),
        };
        assert!(long.check().is_err());
        // An unknown action or field is not an action at all.
        assert!(serde_json::from_str::<Action>(r#"{"action":"download"}"#).is_err());
        assert!(serde_json::from_str::<Action>(r#"{"action":"text","x":1}"#).is_err());
    }

    #[test]
    fn every_action_error_code_names_itself_and_an_unknown_one_is_the_browsers() {
        for error in ActionError::ALL {
            assert_eq!(ActionError::of_code(error.code()), error);
        }
        assert_eq!(ActionError::of_code("surprise"), ActionError::BrowserError);
    }

    fn stored(private: bool, closing: bool, networked: bool) -> (SessionRecord, SessionState) {
        let closing = closing.then_some(UnixMillis(20_000));
        (
            SessionRecord {
                actor: "ann".into(),
                conversation: "research".into(),
                worker: WorkerId { epoch: 1, seq: 2 },
                token: OpToken(3),
                live_view: None,
                networked,
                owner: "replica-a".into(),
            },
            SessionState {
                private,
                last_activity: UnixMillis(10_000),
                closing,
            },
        )
    }

    #[test]
    fn brow_14_a_call_is_judged_from_the_stored_session_alone() {
        let text = Action::Text {};
        let away = Action::Navigate {
            url: "http://example.test/".into(),
            timeout_ms: None,
        };
        let blank = Action::Navigate {
            url: "about:blank".into(),
            timeout_ms: None,
        };
        let judge = |s: &(SessionRecord, SessionState), who: (&str, &str), call| {
            judge_call(Some((&s.0, &s.1)), who.0, who.1, call)
        };
        let open = stored(false, false, true);
        let ann = ("ann", "research");
        assert_eq!(judge(&open, ann, Call::Act(&text)), Ok(()));
        assert_eq!(judge(&open, ann, Call::Act(&away)), Ok(()));
        assert_eq!(
            judge_call(None, "ann", "research", Call::Close),
            Err(CallRefusal::NotFound)
        );
        // Another actor, another conversation: not found, whatever the call.
        for call in [Call::Act(&text), Call::Private, Call::Watch, Call::Close] {
            assert_eq!(
                judge(&open, ("bob", "research"), call),
                Err(CallRefusal::NotFound)
            );
            assert_eq!(
                judge(&open, ("ann", "other"), call),
                Err(CallRefusal::NotFound)
            );
        }
        // Closing: no call reaches it.
        let closing = stored(false, true, true);
        assert_eq!(
            judge(&closing, ann, Call::Close),
            Err(CallRefusal::NotFound)
        );
        // Private: the agent's actions are refused, the member's marking and the close are not.
        let private = stored(true, false, true);
        assert_eq!(
            judge(&private, ann, Call::Act(&text)),
            Err(CallRefusal::Private)
        );
        assert_eq!(judge(&private, ann, Call::Private), Ok(()));
        assert_eq!(judge(&private, ann, Call::Close), Ok(()));
        // No network: only about:blank.
        let offline = stored(false, false, false);
        assert_eq!(
            judge(&offline, ann, Call::Act(&away)),
            Err(CallRefusal::NoNetwork)
        );
        assert_eq!(judge(&offline, ann, Call::Act(&blank)), Ok(()));
    }

    #[test]
    fn brow_06_idle_is_measured_on_the_deployment_clock_and_never_twice() {
        let (_, state) = stored(false, false, true);
        assert!(!is_idle(&state, UnixMillis(10_000 + 899_999), 900));
        assert!(is_idle(&state, UnixMillis(10_000 + 900_000), 900));
        // A clock behind the last activity is not idle.
        assert!(!is_idle(&state, UnixMillis(5_000), 900));
        let (_, closing) = stored(false, true, true);
        assert!(!is_idle(&closing, UnixMillis(u64::MAX), 900));
    }

    #[test]
    fn brow_14_a_close_claimed_and_never_finished_is_abandoned_after_its_bound() {
        let (_, open) = stored(false, false, true);
        assert!(!close_abandoned(&open, UnixMillis(u64::MAX)));
        let (_, closing) = stored(false, true, true);
        assert!(!close_abandoned(
            &closing,
            UnixMillis(20_000 + CLOSE_ABANDONED_MS - 1)
        ));
        assert!(close_abandoned(
            &closing,
            UnixMillis(20_000 + CLOSE_ABANDONED_MS)
        ));
    }
}
