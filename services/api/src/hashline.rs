//! Hashline reads and edits of a workspace (WS-3 to WS-5, decision 0017): corral-core decides
//! (`corral_core::hashline`), this module reads and writes the two records it decides over, the
//! workspace's snapshot and its authority record beside it, both create-only generations.
//!
//! An edit is all or nothing: the anchors are resolved and the new text made before anything is
//! written; the workspace is saved as the next generation of the one read (a run that saved
//! meanwhile wins, and the edit is refused with nothing changed); only then is the authority
//! record advanced. Neither record is written when anything is refused.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use corral_core::hashline::{Authority, Edit, Refusal, View, normalize};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::refusal::error;
use crate::workspaces::{
    FileLookup, ReplaceError, Snapshot, StorageError, find_file, replace_file,
};

/// How many times a record another request advanced first is read again.
const RETRIES: usize = 3;

/// A refusal naming the file: the code, the path, the edit it refused, the setting of a bound.
fn refused(status: StatusCode, refusal: Refusal, path: &str, edit: Option<usize>) -> Response {
    let message = match refusal {
        Refusal::NotText => "the file is not UTF-8 text; Hashline reads and edits text only",
        Refusal::EditInvalid => {
            "an edit is malformed: a tag is four hex digits, a range ends at or after its start, and text or a register is given where one is needed"
        }
        Refusal::UnknownTag => {
            "no version of this file shown to this conversation has that tag; read the file with view=hashline first"
        }
        Refusal::StaleAnchor => {
            "the file changed since that tag was shown (or two versions share it); read it again and anchor to the new tag"
        }
        Refusal::AnchorNotShown => {
            "that line was never shown with that tag; read the lines you edit before editing them"
        }
        Refusal::AnchorOutOfRange => "that line is not in the file",
        Refusal::EditOverlap => "two edits of the request touch the same lines",
        Refusal::RegisterEmpty => "that register holds nothing; yank lines into it first",
        Refusal::StateTooLarge => {
            "the Hashline authority record would exceed SANDBOX_HASHLINE_STATE_MAX_BYTES"
        }
    };
    (
        status,
        Json(json!({ "outcome": "refused", "error": {
            "code": refusal.code(), "path": path, "edit": edit,
            "setting": refusal.setting(), "message": message } })),
    )
        .into_response()
}

fn status_of(refusal: Refusal) -> StatusCode {
    match refusal {
        Refusal::StaleAnchor | Refusal::UnknownTag | Refusal::AnchorNotShown => {
            StatusCode::CONFLICT
        }
        Refusal::StateTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

pub(crate) fn storage(e: &StorageError) -> Response {
    let status = match e {
        StorageError::Conflict { .. } => StatusCode::CONFLICT,
        StorageError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.code(), e.to_string())
}

/// The newest authority record of `key` and its generation (0 and an empty record for none).
async fn load(state: &AppState, key: &str) -> Result<(u64, Authority), Response> {
    match state.workspaces.authority(key).await {
        Ok(None) => Ok((0, Authority::default())),
        Ok(Some(Snapshot {
            generation,
            archive,
        })) => Authority::parse(&archive)
            .map(|a| (generation, a))
            .map_err(|e| {
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "hashline_authority_corrupt",
                    format!(
                        "the Hashline authority record does not parse ({e}); nothing was changed"
                    ),
                )
            }),
        Err(e) => Err(storage(&e)),
    }
}

/// The normalized text of `path` in `snapshot`, and whether the file's lines end in CRLF (an
/// edit writes them back so), or the refusal.
fn text_of(
    state: &AppState,
    snapshot: &Snapshot,
    path: &str,
) -> Result<(String, bool), Box<Response>> {
    match find_file(
        &snapshot.archive,
        path,
        state.settings.bounds.workspace_max_bytes,
    ) {
        FileLookup::Found(bytes) => {
            let crlf = bytes.windows(2).any(|w| w == b"\r\n");
            normalize(&bytes)
                .map(|text| (text, crlf))
                .map_err(|r| Box::new(refused(status_of(r), r, path, None)))
        }
        FileLookup::NotFound => Err(Box::new(
            (
                StatusCode::NOT_FOUND,
                Json(json!({ "outcome": "refused", "error": {
                    "code": "workspace_path_not_found", "path": path,
                    "message": "no regular file at this path in the workspace" } })),
            )
                .into_response(),
        )),
        FileLookup::Corrupt(e) => Err(Box::new(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "workspace_snapshot_corrupt",
            e,
        ))),
    }
}

fn view_json(path: &str, generation: u64, view: &View) -> Value {
    json!({
        "path": path,
        "generation": generation,
        "tag": view.tag,
        "total_lines": view.total_lines,
        "first_line": view.first,
        "lines": view.text,
    })
}

/// `GET /v1/read_workspace?view=hashline`: lines `start..start+count` of `path`, each as
/// `LINE:TAG|text`, recorded as shown in the authority.
pub async fn read(
    state: &AppState,
    key: &str,
    path: &str,
    snapshot: &Snapshot,
    start: u32,
    count: u32,
) -> Response {
    let text = match text_of(state, snapshot, path) {
        Ok((text, _)) => text,
        Err(response) => return *response,
    };
    match show(state, key, path, snapshot.generation, &text, start, count).await {
        Ok(view) => Json(view).into_response(),
        Err(response) => response,
    }
}

/// Lines `start..start+count` of `text`, the file `path` of generation `generation`, recorded as
/// shown in the authority: the view's JSON, or the refusal.
pub async fn show(
    state: &AppState,
    key: &str,
    path: &str,
    generation: u64,
    text: &str,
    start: u32,
    count: u32,
) -> Result<Value, Response> {
    let max = state.settings.bounds.hashline_state_max_bytes;
    for _ in 0..RETRIES {
        let (base, mut authority) = load(state, key).await?;
        let view = authority
            .show(path, text, start, count, max)
            .map_err(|refusal| refused(status_of(refusal), refusal, path, None))?;
        match state
            .workspaces
            .save_authority(key, base, Bytes::from(authority.to_bytes()))
            .await
        {
            Ok(_) => return Ok(view_json(path, generation, &view)),
            Err(StorageError::Conflict { .. }) => {}
            Err(e) => return Err(storage(&e)),
        }
    }
    Err(error(
        StatusCode::CONFLICT,
        "hashline_authority_busy",
        "the authority record kept changing while this read was recorded; read again",
    ))
}

/// The body of `POST /v1/edit_workspace`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditRequest {
    /// Whose workspace.
    pub actor: String,
    /// The conversation.
    pub conversation: String,
    /// The file, relative to the workspace.
    pub path: String,
    /// The edits, by anchors; applied all or none.
    pub edits: Vec<Edit>,
}

/// `POST /v1/edit_workspace`: changes one file by anchors (WS-3 to WS-5).
pub async fn edit(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let (request, path) = match parse_edit(&state, &body) {
        Ok(parsed) => parsed,
        Err(response) => return *response,
    };
    let key = corral_core::workspace::storage_key(&request.actor, &request.conversation);
    let snapshot = match crate::refusal::stored_workspace(&state, &key).await {
        Ok(snapshot) => snapshot,
        Err(refused) => return *refused,
    };
    let (text, crlf) = match text_of(&state, &snapshot, &path) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let max = state.settings.bounds.hashline_state_max_bytes;
    let (authority_base, mut authority) = match load(&state, &key).await {
        Ok(loaded) => loaded,
        Err(response) => return response,
    };
    let applied = match authority.apply(&path, &text, &request.edits, max) {
        Ok(applied) => applied,
        Err((refusal, index)) => return refused(status_of(refusal), refusal, &path, Some(index)),
    };
    // The workspace first: an edit is applied once its snapshot is saved, and only then does
    // the authority learn the new version.
    let generation = if applied.text == text {
        snapshot.generation
    } else {
        // Written back with the line endings the file had.
        let content = if crlf {
            applied.text.replace('\n', "\r\n")
        } else {
            applied.text.clone()
        };
        match save_edited(&state, &key, &snapshot, &path, &content).await {
            Ok(generation) => generation,
            Err(response) => return *response,
        }
    };
    let tag = corral_core::hashline::tag(&applied.text);
    let lines = shown_lines(&applied.text, &tag, &applied.changed);
    let recorded = record_edit(
        &state,
        &key,
        authority_base,
        &authority,
        &path,
        &text,
        &request.edits,
    )
    .await;
    Json(json!({
        "outcome": "applied",
        "path": path,
        "generation": generation,
        "tag": if recorded { Some(&tag) } else { None },
        "lines": if recorded { Some(lines) } else { None },
        "message": if recorded { Value::Null } else {
            json!("the edit was saved; its new tags could not be recorded, so read the file again before the next edit")
        },
    }))
    .into_response()
}

/// The edit request and its file's relative path, or the refusal of a bad body, identity or path,
/// or of a deployment that does not keep workspaces.
fn parse_edit(state: &AppState, body: &[u8]) -> Result<(EditRequest, String), Box<Response>> {
    let request: EditRequest = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(e) => {
            let code = corral_contract::ErrorBody::of_json(&e).error.code();
            return Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                code,
                e.to_string(),
            )));
        }
    };
    if let Some(refused) =
        crate::refusal::workspace_identity_refused(&request.actor, &request.conversation)
    {
        return Err(Box::new(refused));
    }
    let path = match corral_core::workspace::read_path(&request.path) {
        Ok(path) => path.to_owned(),
        Err(refusal) => {
            return Err(Box::new(
                (
                    StatusCode::BAD_REQUEST,
                    Json(json!({ "outcome": "refused", "error": {
                        "code": refusal.code(), "path": request.path,
                        "message": "edit_workspace takes a relative path inside the workspace" } })),
                )
                    .into_response(),
            ));
        }
    };
    if !state.settings.workspace_persist {
        return Err(Box::new(error(
            StatusCode::CONFLICT,
            "workspace_not_persisted",
            "edits change the stored workspace, and SANDBOX_WORKSPACE_PERSIST is off",
        )));
    }
    Ok((request, path))
}

/// Saves `snapshot` with `path` replaced by `content` as the next generation: that generation, or
/// the refusal.
async fn save_edited(
    state: &AppState,
    key: &str,
    snapshot: &Snapshot,
    path: &str,
    content: &str,
) -> Result<u64, Box<Response>> {
    let archive = match replace_file(
        &snapshot.archive,
        path,
        content.as_bytes(),
        state.settings.bounds.workspace_max_bytes,
    ) {
        Ok(archive) => archive,
        Err(ReplaceError::TooLarge) => {
            return Err(Box::new(
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    Json(json!({ "outcome": "refused", "error": {
                        "code": "workspace_too_large", "path": path,
                        "setting": "SANDBOX_WORKSPACE_MAX_BYTES",
                        "message": "the edited workspace would exceed SANDBOX_WORKSPACE_MAX_BYTES; nothing was changed" } })),
                )
                    .into_response(),
            ));
        }
        Err(ReplaceError::NotFound) => {
            return Err(Box::new(error(
                StatusCode::NOT_FOUND,
                "workspace_path_not_found",
                "no regular file at this path",
            )));
        }
        Err(ReplaceError::Corrupt(e)) => {
            return Err(Box::new(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "workspace_snapshot_corrupt",
                e,
            )));
        }
    };
    state
        .workspaces
        .save(key, snapshot.generation, Bytes::from(archive))
        .await
        .map_err(|e| Box::new(storage(&e)))
}

/// Records the edited version in the authority, reading it again when another request advanced
/// it first: whether it was recorded.
async fn record_edit(
    state: &AppState,
    key: &str,
    authority_base: u64,
    authority: &Authority,
    path: &str,
    text: &str,
    edits: &[Edit],
) -> bool {
    let max = state.settings.bounds.hashline_state_max_bytes;
    let mut recorded = match state
        .workspaces
        .save_authority(key, authority_base, Bytes::from(authority.to_bytes()))
        .await
    {
        Ok(_) => true,
        Err(StorageError::Conflict { .. }) => false,
        Err(_) => false,
    };
    // Another read recorded lines meanwhile: the edit's version is recorded on its record.
    for _ in 0..RETRIES {
        if recorded {
            break;
        }
        let Ok((base, mut fresh)) = load(state, key).await else {
            break;
        };
        if fresh.apply(path, text, edits, max).is_err() {
            break;
        }
        recorded = state
            .workspaces
            .save_authority(key, base, Bytes::from(fresh.to_bytes()))
            .await
            .is_ok();
    }
    recorded
}

/// The lines `ranges` of `text`, as `LINE:TAG|text`.
fn shown_lines(text: &str, tag: &str, ranges: &[(u32, u32)]) -> String {
    let lines: Vec<&str> = text
        .strip_suffix('\n')
        .unwrap_or(text)
        .split('\n')
        .collect();
    let mut out = String::new();
    for (a, b) in ranges {
        for n in *a..=*b {
            if let Some(line) = lines.get((n - 1) as usize) {
                out.push_str(&format!("{n}:{tag}|{line}\n"));
            }
        }
    }
    out
}
