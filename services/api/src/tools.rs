//! Read-only tool callbacks, the API's half (KER-5, decision 0018): the replica that owns a run
//! takes its supervisor's calls on [`corral_contract::routes::TOOL_CALL`], checks them against
//! the run's own tools and capability once more, and forwards each to the platform's tool endpoint
//! (`CORRAL_TOOL_ENDPOINT_URL`) with the capability as its bearer; the answer goes back bounded by
//! `corral_core::tools::PAYLOAD_MAX_BYTES`. A run's calls are taken only while it runs: its token
//! is registered when it starts and forgotten when it ends.
//!
//! `corral up` points the endpoint at [`sample`], a built-in sample platform with three read-only
//! tools, so that the path runs end to end with no platform.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use corral_contract::messages::ToolCall;
use corral_core::tools::{CALL_TIMEOUT_MS, CallRefusal, PAYLOAD_MAX_BYTES, Tools};
use serde_json::{Value, json};

use crate::AppState;

/// The runs of this replica that were given tools, by their callback token.
#[derive(Default)]
pub struct ToolRuns {
    runs: Mutex<HashMap<String, Tools>>,
}

impl ToolRuns {
    /// Registers a run's tools; the token its supervisor will present.
    pub fn start(&self, tools: Tools) -> String {
        let token = corral_core::ids::hex(&corral_contract::credential::random_bytes());
        self.runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token.clone(), tools);
        token
    }

    /// The run has ended: its token is refused from now on.
    pub fn end(&self, token: &str) {
        self.runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(token);
    }

    fn get(&self, token: &str) -> Option<Tools> {
        self.runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(token)
            .cloned()
    }
}

fn refused(status: StatusCode, refusal: CallRefusal, message: &str) -> Response {
    (
        status,
        Json(json!({ "error": { "code": refusal.code(), "message": message } })),
    )
        .into_response()
}

/// `POST /v1/tools/call`, from a worker's supervisor: one call of a running run.
pub async fn call(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| corral_contract::credential::bearer(v.as_bytes()))
        .and_then(|t| std::str::from_utf8(t).ok());
    let Some(tools) = token.and_then(|t| state.tool_runs.get(t)) else {
        return crate::refusal::error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "no running run holds this token",
        );
    };
    let Ok(call) = serde_json::from_slice::<ToolCall>(&body) else {
        return refused(
            StatusCode::BAD_REQUEST,
            CallRefusal::Malformed,
            "not a tool call",
        );
    };
    // The supervisor judged it; so does the replica, against the run's own grant.
    if call.capability != tools.capability {
        return crate::refusal::error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the capability is not the run's",
        );
    }
    if let Err(refusal) = tools.judge(&call.tool) {
        return refused(
            StatusCode::FORBIDDEN,
            refusal,
            "not a read-only tool of this run",
        );
    }
    let Some(endpoint) = state.settings.tool_endpoint_url.clone() else {
        return refused(
            StatusCode::BAD_GATEWAY,
            CallRefusal::Unavailable,
            "no tool endpoint is configured (CORRAL_TOOL_ENDPOINT_URL)",
        );
    };
    match forward(&endpoint, &call).await {
        Ok(result) => Json(json!({ "tool": call.tool, "result": result })).into_response(),
        Err((refusal, message)) => refused(StatusCode::BAD_GATEWAY, refusal, &message),
    }
}

/// Posts `{tool, arguments}` to the platform's endpoint with the capability; its JSON answer,
/// within [`PAYLOAD_MAX_BYTES`].
async fn forward(endpoint: &str, call: &ToolCall) -> Result<Value, (CallRefusal, String)> {
    let unavailable = |e: String| (CallRefusal::Unavailable, e);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(CALL_TIMEOUT_MS))
        .no_proxy()
        .build()
        .map_err(|e| unavailable(e.to_string()))?;
    let mut response = client
        .post(endpoint)
        .bearer_auth(&call.capability)
        .json(&json!({ "tool": call.tool, "arguments": call.arguments }))
        .send()
        .await
        .map_err(|e| unavailable(format!("the tool endpoint did not answer: {e}")))?;
    let status = response.status();
    let mut payload = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| unavailable(e.to_string()))?
    {
        payload.extend_from_slice(&chunk);
        if payload.len() > PAYLOAD_MAX_BYTES {
            return Err((
                CallRefusal::PayloadTooLarge,
                format!("the tool's answer is over {PAYLOAD_MAX_BYTES} bytes"),
            ));
        }
    }
    // Its body is not passed on: an endpoint that echoes its request would hand the code the
    // capability.
    if !status.is_success() {
        return Err(unavailable(format!("the tool endpoint answered {status}")));
    }
    serde_json::from_slice(&payload)
        .map_err(|_| unavailable("the tool's answer is not JSON".into()))
}

/// `POST /v1/sample_tools`: the built-in sample platform `corral up` uses (KER-5). Its tools are
/// read-only: `sample.echo` (the arguments back), `sample.word_count` (`{text}` → `{words}`) and
/// `sample.large` (an answer over the payload bound, to show the bound). It requires a capability
/// and says which one it was given by its digest, never the capability itself.
pub async fn sample(headers: HeaderMap, body: Bytes) -> Response {
    let Some(capability) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| corral_contract::credential::bearer(v.as_bytes()))
    else {
        return crate::refusal::error(StatusCode::UNAUTHORIZED, "unauthorized", "no capability");
    };
    let digest = corral_core::ids::hex(&sha256(capability))[..16].to_owned();
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return crate::refusal::error(StatusCode::BAD_REQUEST, "body_invalid", "{tool, arguments}");
    };
    let arguments = &request["arguments"];
    let result = match request["tool"].as_str() {
        Some("sample.echo") => json!({ "echo": arguments, "capability_sha256": digest }),
        Some("sample.word_count") => json!({
            "words": arguments["text"].as_str().map_or(0, |t| t.split_whitespace().count()),
        }),
        Some("sample.large") => json!({ "data": "x".repeat(PAYLOAD_MAX_BYTES + 1) }),
        _ => {
            return crate::refusal::error(
                StatusCode::NOT_FOUND,
                "tool_unknown",
                "no such sample tool",
            );
        }
    };
    Json(result).into_response()
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}
