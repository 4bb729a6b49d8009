//! A workspace as clients expect it (issue 31): its files listed with their sizes and kinds and
//! the generation, and a new text or binary file created in it by the rules a run's save follows.
//!
//! A created file is create-only and all or nothing: the stored snapshot's every entry and then
//! the new one go through corral-core's one archive judge (`workspace::ArchiveJudge`, the judge
//! the worker unpacks by), so a path that exists, sits under a file, escapes, or would take the
//! workspace past `SANDBOX_WORKSPACE_MAX_BYTES` or its entry bound is refused with the judge's
//! code before anything is written; the snapshot is then saved as the next generation of the one
//! read (a run that saved meanwhile wins, and the create is refused with `workspace_conflict`).
//! A text file is shown to the Hashline authority at once, so that the answer's anchors edit it.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use corral_core::workspace::{ArchiveJudge, EntryKind, Refused};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::refusal::{error, workspace_identity_refused};
use crate::workspaces::{Listed, Snapshot, StorageError, append_file, entries};

/// The query of `GET /v1/list_workspace`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    actor: String,
    conversation: String,
}

fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::Directory => "directory",
        _ => "file",
    }
}

fn corrupt(e: String) -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "workspace_snapshot_corrupt",
        e,
    )
}

/// The newest snapshot of `key` (generation 0 with nothing in it when none is stored) and its
/// entries.
async fn stored(
    state: &AppState,
    key: &str,
) -> Result<(Snapshot, Vec<(Vec<u8>, Listed)>), Response> {
    let snapshot = match state.workspaces.latest(key).await {
        Ok(Some(snapshot)) => snapshot,
        Ok(None) => Snapshot {
            generation: 0,
            archive: Bytes::new(),
        },
        Err(e) => return Err(crate::hashline::storage(&e)),
    };
    let listed = entries(&snapshot.archive).map_err(corrupt)?;
    Ok((snapshot, listed))
}

/// `GET /v1/list_workspace?actor&conversation`: the stored workspace's files and directories,
/// each with its kind and size, and the generation they are of (0 and none for a workspace no
/// run has saved).
pub async fn list(State(state): State<Arc<AppState>>, Query(query): Query<ListQuery>) -> Response {
    if let Some(refused) = workspace_identity_refused(&query.actor, &query.conversation) {
        return refused;
    }
    let key = corral_core::workspace::storage_key(&query.actor, &query.conversation);
    let (snapshot, listed) = match stored(&state, &key).await {
        Ok(stored) => stored,
        Err(response) => return response,
    };
    // Sorted by path, each once (the later entry stands, as tar has it), with every directory a
    // file implies: a listing does not depend on whether a run or a client made the file.
    let mut by_path = std::collections::BTreeMap::new();
    for (_, entry) in &listed {
        let mut end = 0;
        for component in entry.path.split('/') {
            end += component.len();
            if end < entry.path.len() {
                by_path
                    .entry(&entry.path[..end])
                    .or_insert((EntryKind::Directory, 0));
            }
            end += 1;
        }
        if !entry.path.is_empty() {
            by_path.insert(&entry.path, (entry.kind, entry.bytes));
        }
    }
    let files: Vec<Value> = by_path
        .iter()
        .map(|(path, (kind, bytes))| {
            json!({ "path": path, "kind": kind_name(*kind), "bytes": bytes })
        })
        .collect();
    let bytes_total: u64 = by_path.values().map(|(_, bytes)| bytes).sum();
    Json(json!({
        "generation": snapshot.generation,
        "files": files,
        "bytes_total": bytes_total,
        "bytes_max": state.settings.bounds.workspace_max_bytes,
    }))
    .into_response()
}

/// The body of `POST /v1/write_workspace`: exactly one of `text` and `base64`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteRequest {
    actor: String,
    conversation: String,
    path: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    base64: Option<String>,
}

/// The refusal of a path or an entry the archive judge refused, naming the path.
fn judged(refused: Refused, path: &str) -> Response {
    let (status, code, message) = match refused {
        Refused::Duplicate => (
            StatusCode::CONFLICT,
            "workspace_path_exists",
            "a file or directory is at this path already; creating never replaces (edit it with \
             edit_workspace)",
        ),
        Refused::TooLarge | Refused::TooManyEntries => (
            StatusCode::PAYLOAD_TOO_LARGE,
            refused.code(),
            "the workspace with this file would exceed its bound; nothing was changed",
        ),
        _ => (
            StatusCode::BAD_REQUEST,
            refused.code(),
            "a relative path inside the workspace, not under a file",
        ),
    };
    (
        status,
        Json(json!({ "outcome": "refused", "error": {
            "code": code, "path": path, "setting": refused.setting(), "message": message } })),
    )
        .into_response()
}

/// The new file's bytes: its text, or its base64 decoded; refused unless exactly one is given.
fn content_of(text: Option<String>, base64: Option<String>) -> Result<Vec<u8>, Box<Response>> {
    match (text, base64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(encoded)) => match base64::engine::general_purpose::STANDARD.decode(encoded) {
            Ok(bytes) => Ok(bytes),
            Err(e) => Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                "content_not_base64",
                format!("base64 does not decode: {e}"),
            ))),
        },
        _ => Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "content_invalid",
            "give exactly one of text (UTF-8) and base64 (bytes)",
        ))),
    }
}

/// The new file's path as the workspace's judge accepts it after the stored entries (within
/// `workspace_max_bytes`), or its refusal.
fn judge_new_file(
    listed: &[(Vec<u8>, Listed)],
    path: &str,
    bytes: u64,
    workspace_max_bytes: u64,
) -> Result<String, Box<Response>> {
    // The stored entries, then the new one, by the one judge: its refusal is the answer.
    let mut judge = ArchiveJudge::new(workspace_max_bytes);
    for (raw, entry) in listed {
        if let Err(refused) = judge.judge(raw, entry.kind, entry.bytes) {
            return Err(Box::new(corrupt(format!(
                "the stored snapshot holds an entry its judge refuses: {}",
                refused.code()
            ))));
        }
    }
    match judge.judge(path.as_bytes(), EntryKind::File, bytes) {
        Ok(corral_core::workspace::Accepted::File { path, .. }) => Ok(path),
        Ok(_) => Err(Box::new(judged(Refused::PathEmpty, path))),
        Err(refused) => Err(Box::new(judged(refused, path))),
    }
}

/// `POST /v1/write_workspace`: creates one file, text or base64 bytes, as the next generation
/// of the stored workspace; refused with nothing changed as a run's save would be.
pub async fn write(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let request: WriteRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            let code = corral_contract::ErrorBody::of_json(&e).error.code();
            return error(StatusCode::BAD_REQUEST, code, e.to_string());
        }
    };
    drop(body);
    if let Some(refused) = workspace_identity_refused(&request.actor, &request.conversation) {
        return refused;
    }
    let content = match content_of(request.text, request.base64) {
        Ok(content) => content,
        Err(response) => return *response,
    };
    if !state.settings.workspace_persist {
        return error(
            StatusCode::CONFLICT,
            "workspace_not_persisted",
            "a created file changes the stored workspace, and SANDBOX_WORKSPACE_PERSIST is off",
        );
    }
    let key = corral_core::workspace::storage_key(&request.actor, &request.conversation);
    let (snapshot, listed) = match stored(&state, &key).await {
        Ok(stored) => stored,
        Err(response) => return response,
    };
    let bound = state.settings.bounds.workspace_max_bytes;
    let path = match judge_new_file(&listed, &request.path, content.len() as u64, bound) {
        Ok(path) => path,
        Err(response) => return *response,
    };
    let archive = match append_file(&snapshot.archive, &path, &content) {
        Ok(archive) => archive,
        Err(e) => return corrupt(e),
    };
    let generation = match state
        .workspaces
        .save(&key, snapshot.generation, Bytes::from(archive))
        .await
    {
        Ok(generation) => generation,
        Err(e @ StorageError::Conflict { .. }) => {
            return error(
                StatusCode::CONFLICT,
                e.code(),
                format!("{e}; nothing was changed"),
            );
        }
        Err(e) => return crate::hashline::storage(&e),
    };
    let mut answer = json!({
        "outcome": "created", "path": path, "generation": generation, "bytes": content.len(),
    });
    // Text: shown to the authority, so the answer's anchors edit it at once.
    if let Ok(text) = corral_core::hashline::normalize(&content) {
        let count = corral_core::hashline::VIEW_LINES_MAX;
        match crate::hashline::show(&state, &key, &path, generation, &text, 1, count).await {
            Ok(view) => answer["hashline"] = view,
            Err(_) => {
                answer["message"] = json!(
                    "the file was created; its Hashline view could not be recorded, so read it \
                     with view=hashline before editing"
                );
            }
        }
    }
    (StatusCode::CREATED, Json(answer)).into_response()
}
