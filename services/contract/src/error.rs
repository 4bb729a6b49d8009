//! The worker's refusals: one stable code each, with its HTTP status, and a typed body.
//!
//! Every refusal is `{"error": <code>, "detail": {...}}`. A malformed message never leaves the
//! worker needing a restart: it is refused before any of it is acted on.

use serde::{Deserialize, Serialize};

/// Why the worker refused a request. The codes are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorCode {
    /// No credential, or the wrong one (401).
    Unauthorized,
    /// The body is larger than the route accepts (413).
    BodyTooLarge,
    /// The request names another worker (421): it reached an address this worker took over.
    WrongWorker,
    /// No such route (404).
    NotFound,
    /// Another operation is in progress (409).
    Busy,
    /// The body ended before the JSON did (400).
    BodyTruncated,
    /// The body is not JSON (400).
    BodyMalformed,
    /// The JSON is not this route's message: an unknown field, a missing one, a wrong type, an
    /// unknown language (400).
    BodyInvalid,
    /// The grant is longer than `GRANT_MAX_BYTES` (400).
    GrantTooLong,
    /// The grant is not a header-safe token (400).
    GrantMalformed,
    /// Too many declared outputs, or one that is not a relative path (400).
    DeclaredOutputInvalid,
    /// The code is larger than `SANDBOX_WORKSPACE_MAX_BYTES` (413).
    CodeTooLarge,
    /// A bound override is zero or above the worker's bound (422).
    BoundOverrideRefused,
    /// The workspace is not base64 (400).
    WorkspaceNotBase64,
    /// The workspace archive was refused (422; `detail.reason` says why).
    WorkspaceArchiveRefused,
    /// The request's workspace could not be staged (500).
    StagingFailed,
    /// The run could not be carried out (500).
    RunFailed,
    /// The reset could not be carried out (500).
    ResetFailed,
    /// The reply could not be encoded (500).
    EncodeFailed,
    /// A browser session holds the worker: no run and no second session until it closes (409).
    BrowserSessionOpen,
    /// No browser session is open on this worker (409).
    BrowserSessionAbsent,
    /// A browser action failed (422; `detail.reason` is its `corral_core::browser::ActionError`
    /// code).
    BrowserActionFailed,
    /// The session's runtime did not start (500); the worker reset what it had started.
    BrowserOpenFailed,
    /// The live view refused a viewer's signaling (422; `detail.reason` is the adapter's code:
    /// `sdp_invalid`, `private_text`, `viewers_full`, `live_view_stopped`).
    LiveViewRefused,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 24] = [
        Self::Unauthorized,
        Self::BodyTooLarge,
        Self::WrongWorker,
        Self::NotFound,
        Self::Busy,
        Self::BodyTruncated,
        Self::BodyMalformed,
        Self::BodyInvalid,
        Self::GrantTooLong,
        Self::GrantMalformed,
        Self::DeclaredOutputInvalid,
        Self::CodeTooLarge,
        Self::BoundOverrideRefused,
        Self::WorkspaceNotBase64,
        Self::WorkspaceArchiveRefused,
        Self::StagingFailed,
        Self::RunFailed,
        Self::ResetFailed,
        Self::EncodeFailed,
        Self::BrowserSessionOpen,
        Self::BrowserSessionAbsent,
        Self::BrowserActionFailed,
        Self::BrowserOpenFailed,
        Self::LiveViewRefused,
    ];

    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::BodyTooLarge => "body_too_large",
            Self::WrongWorker => "wrong_worker",
            Self::NotFound => "not_found",
            Self::Busy => "busy",
            Self::BodyTruncated => "body_truncated",
            Self::BodyMalformed => "body_malformed",
            Self::BodyInvalid => "body_invalid",
            Self::GrantTooLong => "grant_too_long",
            Self::GrantMalformed => "grant_malformed",
            Self::DeclaredOutputInvalid => "declared_output_invalid",
            Self::CodeTooLarge => "code_too_large",
            Self::BoundOverrideRefused => "bound_override_refused",
            Self::WorkspaceNotBase64 => "workspace_not_base64",
            Self::WorkspaceArchiveRefused => "workspace_archive_refused",
            Self::StagingFailed => "staging_failed",
            Self::RunFailed => "run_failed",
            Self::ResetFailed => "reset_failed",
            Self::EncodeFailed => "encode_failed",
            Self::BrowserSessionOpen => "browser_session_open",
            Self::BrowserSessionAbsent => "browser_session_absent",
            Self::BrowserActionFailed => "browser_action_failed",
            Self::BrowserOpenFailed => "browser_open_failed",
            Self::LiveViewRefused => "live_view_refused",
        }
    }

    /// The HTTP status it is answered with.
    #[must_use]
    pub fn status(self) -> u16 {
        match self {
            Self::Unauthorized => 401,
            Self::NotFound => 404,
            Self::Busy | Self::BrowserSessionOpen | Self::BrowserSessionAbsent => 409,
            Self::BodyTooLarge | Self::CodeTooLarge => 413,
            Self::WrongWorker => 421,
            Self::BoundOverrideRefused
            | Self::WorkspaceArchiveRefused
            | Self::BrowserActionFailed
            | Self::LiveViewRefused => 422,
            Self::BodyTruncated
            | Self::BodyMalformed
            | Self::BodyInvalid
            | Self::GrantTooLong
            | Self::GrantMalformed
            | Self::DeclaredOutputInvalid
            | Self::WorkspaceNotBase64 => 400,
            Self::StagingFailed
            | Self::RunFailed
            | Self::ResetFailed
            | Self::EncodeFailed
            | Self::BrowserOpenFailed => 500,
        }
    }

    /// Whether the request was refused before it reached the worker's operation: the code did
    /// not run and the worker is as it was.
    #[must_use]
    pub fn before_anything_ran(self) -> bool {
        !matches!(
            self,
            Self::StagingFailed
                | Self::RunFailed
                | Self::ResetFailed
                | Self::EncodeFailed
                | Self::BrowserOpenFailed
                | Self::BrowserActionFailed
        )
    }
}

corral_core::wire_code!(ErrorCode, code, "a worker error code");

/// What a refusal is about. Every field is optional; each code fills those that apply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A sentence for a person (never a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The reason code beneath the refusal (an archive's, a bound's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The setting whose bound refused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
    /// The limit that was exceeded, in bytes or items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// The worker that answered, on a `wrong_worker` refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub this_worker: Option<String>,
}

impl ErrorDetail {
    /// A detail with just a message.
    #[must_use]
    pub fn message(message: impl Into<String>) -> Self {
        Self {
            message: Some(message.into()),
            ..Self::default()
        }
    }
}

/// The body of every refusal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The stable code.
    pub error: ErrorCode,
    /// What it is about.
    #[serde(default)]
    pub detail: ErrorDetail,
}

impl ErrorBody {
    /// A refusal with `code` and `detail`.
    #[must_use]
    pub fn new(code: ErrorCode, detail: ErrorDetail) -> Self {
        Self {
            error: code,
            detail,
        }
    }

    /// The refusal of a body `serde_json` could not read as the route's message: truncated,
    /// not JSON, or not the message (unknown or missing field, wrong type).
    #[must_use]
    pub fn of_json(error: &serde_json::Error) -> Self {
        let code = match error.classify() {
            serde_json::error::Category::Eof => ErrorCode::BodyTruncated,
            serde_json::error::Category::Syntax | serde_json::error::Category::Io => {
                ErrorCode::BodyMalformed
            }
            serde_json::error::Category::Data => ErrorCode::BodyInvalid,
        };
        Self::new(code, ErrorDetail::message(error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_round_trip() {
        let codes: std::collections::BTreeSet<&str> =
            ErrorCode::ALL.iter().map(|c| c.code()).collect();
        assert_eq!(codes.len(), ErrorCode::ALL.len());
        for code in ErrorCode::ALL {
            let text = serde_json::to_string(&code).unwrap();
            assert_eq!(serde_json::from_str::<ErrorCode>(&text).unwrap(), code);
        }
        assert!(serde_json::from_str::<ErrorCode>("\"teapot\"").is_err());
    }

    #[test]
    fn a_body_that_is_not_the_message_gets_its_own_code() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Message {
            token: u64,
        }
        let read = |text: &str| {
            ErrorBody::of_json(&serde_json::from_str::<Message>(text).unwrap_err()).error
        };
        assert_eq!(read(r#"{"token": 1"#), ErrorCode::BodyTruncated);
        assert_eq!(read(r#"{"token": 1}}"#), ErrorCode::BodyMalformed);
        assert_eq!(read(r#"{"token": 1, "extra": 2}"#), ErrorCode::BodyInvalid);
        assert_eq!(read(r#"{"token": "one"}"#), ErrorCode::BodyInvalid);
        assert_eq!(read("{}"), ErrorCode::BodyInvalid);
    }
}
