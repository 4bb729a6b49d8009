//! The refusals the API's routes share: one JSON shape with a stable code, the identity check of
//! a workspace's actor and conversation, and the read of its stored snapshot.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::AppState;

/// A JSON refusal with a stable code.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(
            json!({ "outcome": "refused", "error": { "code": code, "message": message.into() } }),
        ),
    )
        .into_response()
}

/// The refusal of a workspace's identity that is not one (WS-1), or `None`.
pub(crate) fn workspace_identity_refused(actor: &str, conversation: &str) -> Option<Response> {
    [actor, conversation]
        .into_iter()
        .any(|value| !corral_core::ids::identity_is_valid(value))
        .then(|| {
            error(
                StatusCode::BAD_REQUEST,
                "invalid_identity",
                "actor and conversation must be 1 to 256 bytes with no control character",
            )
        })
}

/// The authoritative snapshot of workspace `key`, or the refusal: none stored (404), or the
/// store unavailable (503).
pub(crate) async fn stored_workspace(
    state: &AppState,
    key: &str,
) -> Result<crate::workspaces::Snapshot, Box<Response>> {
    match state.workspaces.latest(key).await {
        Ok(Some(snapshot)) => Ok(snapshot),
        Ok(None) => Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "workspace_not_found",
            "this actor has no workspace in this conversation",
        ))),
        Err(e) => Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            e.code(),
            e.to_string(),
        ))),
    }
}
