//! The turn's projection and its outputs' links, on the run path (PROJ-1 to PROJ-8, OUT-1 to
//! OUT-3). A shell: `corral_core::projection` decides; this asks the resource authority and the
//! object store, and performs.
//!
//! 1. At admission, before any lease: the turn's scope (the room's audience, the journal's
//!    position, the room's files and the re-authorized documents, judged under the member) and,
//!    only when the audience is exactly the member, the member's private selection.
//! 2. Right before dispatch: the room's live audience in one query (when the selection is
//!    considered), the projection decided, the room re-checked against the admitted manifest
//!    less the turn's own links since admission, and the bytes read by digest. The worker
//!    verifies them again before the code starts (PROJ-6).
//! 3. After a run: each validated output, already retained under the member, is stored under its
//!    digest and linked into the room by a metadata-only reference (OUT-1).
//!
//! Every failure fails closed with its own reason; none falls back to another source.

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use corral_contract::messages::ResourceOrder;
use corral_core::projection::{self, Audience, Document, Kind, Processing, Reason, Refusal, Turn};
use corral_core::run::admission::Admitted;
use serde_json::{Value, json};

use super::answer::{self, Reply};
use super::keep::Published;
use crate::AppState;
use crate::resources::{AuthorityError, JournalQuery, LinkRequest, Scope, ScopeQuery, references};

/// What a turn was admitted with.
#[derive(Clone, Debug)]
pub struct TurnScope {
    /// The room's audience, files and journal position at admission.
    pub scope: Scope,
    /// The member's private selection, read only when the audience was exactly the member.
    pub selection: Vec<Document>,
    /// The turn: the request's, or the run's own id.
    pub turn: String,
}

/// What the dispatch carries, and what the model is told of it.
pub struct Dispatch {
    /// The order for the worker; `None` when nothing is projected.
    pub order: Option<ResourceOrder>,
    /// For the model's projection: the files, and a withheld selection's event and reason.
    pub report: Value,
}

fn authority_failed(run_id: &str, error: &AuthorityError) -> Reply {
    let status = match error {
        AuthorityError::Unreachable(_) => StatusCode::SERVICE_UNAVAILABLE,
        AuthorityError::Invalid(_) => StatusCode::BAD_GATEWAY,
    };
    answer::refusal(
        status,
        error.code(),
        error.to_string(),
        json!({ "run_id": run_id }),
    )
}

/// A projection refused (PROJ-8): its reason's code, the file and the limit.
fn refused(run_id: &str, refusal: &Refusal) -> Reply {
    let status = if refusal.retry() {
        StatusCode::CONFLICT
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    answer::refusal(
        status,
        refusal.reason.code(),
        refusal.message(),
        json!({
            "run_id": run_id,
            "resource": { "file": refusal.file, "limit": refusal.limit, "retry": refusal.retry() },
        }),
    )
}

/// A document the authority did not describe: one the member cannot read, named by its
/// reference.
fn unknown(reference: &str) -> Document {
    Document {
        reference: reference.to_owned(),
        root: reference.to_owned(),
        version: 0,
        kind: Kind::Document,
        processing: Processing::Ready,
        readable: false,
        digest: "0".repeat(64),
        media_type: "application/octet-stream".to_owned(),
        size: 0,
        name: reference.to_owned(),
    }
}

/// Step 1, at admission. `None`: nothing can be projected (no authority, a persistent cell, or a
/// room the authority does not know and nothing re-authorized).
///
/// # Errors
/// The answer that ends the run: the authority down or answering garbage, or a re-authorized
/// document in a room the authority does not know.
pub async fn admit(
    state: &AppState,
    admitted: &Admitted,
    run_id: &str,
) -> Result<Option<TurnScope>, Reply> {
    let Some(authority) = &state.resources else {
        return Ok(None);
    };
    // A persistent kernel mounts no resources (KER-5).
    if admitted.kernel == corral_core::kernel::Kernel::Persistent {
        return Ok(None);
    }
    let query = ScopeQuery {
        room: admitted.conversation.0.clone(),
        member: admitted.member.0.clone(),
        retrieved: admitted.retrieved.clone(),
    };
    let scope = match authority.scope(&query).await {
        Ok(Some(scope)) => scope,
        Ok(None) => {
            return match admitted.retrieved.first() {
                None => Ok(None),
                Some(first) => Err(refused(
                    run_id,
                    &Refusal {
                        reason: Reason::Unavailable,
                        file: Some(first.clone()),
                        limit: None,
                    },
                )),
            };
        }
        Err(error) => return Err(authority_failed(run_id, &error)),
    };
    let mut scope = scope;
    // A re-authorized document the authority left out is one the member cannot read.
    let known: Vec<String> = references(&scope.documents)
        .into_iter()
        .map(str::to_owned)
        .collect();
    for reference in &admitted.retrieved {
        if !known.contains(reference) {
            scope.documents.push(unknown(reference));
        }
    }
    // A room whose admission snapshot lists anyone else never considers the selection.
    let selection = if scope.audience.is_only(&admitted.member.0) {
        authority
            .selection(&admitted.conversation.0, &admitted.member.0)
            .await
            .map_err(|error| authority_failed(run_id, &error))?
    } else {
        Vec::new()
    };
    Ok(Some(TurnScope {
        scope,
        selection,
        turn: admitted.turn.clone().unwrap_or_else(|| run_id.to_owned()),
    }))
}

/// Step 2, right before dispatch.
///
/// # Errors
/// The answer that ends the run: a refusal with its own reason, the authority or the object
/// store down, or the authority answering garbage.
pub async fn dispatch(
    state: &AppState,
    admitted: &Admitted,
    turn: &TurnScope,
    run_id: &str,
) -> Result<Dispatch, Reply> {
    let Some(authority) = &state.resources else {
        return Ok(Dispatch {
            order: None,
            report: Value::Null,
        });
    };
    let member = admitted.member.0.as_str();
    let room = admitted.conversation.0.as_str();
    // Immediately before the selection loads: the live audience, in one query.
    let considered = turn.scope.audience.is_only(member) && !turn.selection.is_empty();
    let live: Option<Audience> = if considered {
        Some(
            authority
                .audience(room)
                .await
                .map_err(|error| authority_failed(run_id, &error))?,
        )
    } else {
        None
    };
    let decided = projection::project(&Turn {
        member,
        room: &turn.scope.documents,
        selection: &turn.selection,
        admitted: &turn.scope.audience,
        live: live.as_ref(),
        asked_for_files: admitted.asks_for_files,
    })
    .map_err(|refusal| {
        state.metrics.refusal(refusal.reason.code());
        refused(run_id, &refusal)
    })?;
    let report = report(state, run_id, &decided);
    let manifest = decided.manifest;
    if manifest.entries.is_empty() {
        return Ok(Dispatch {
            order: None,
            report,
        });
    }
    verify_room(state, authority, admitted, turn, run_id, &manifest).await?;
    let files = file_bytes(state, run_id, &manifest).await?;
    Ok(Dispatch {
        order: Some(ResourceOrder {
            audience_version: turn.scope.audience.version,
            manifest_digest: manifest.digest(),
            manifest,
            files,
        }),
        report,
    })
}

/// What the answer reports of a projection: its files, a withheld selection and whether the run
/// asked for files none of which is attached. A withheld selection is logged under its event with
/// the bounded reason (PROJ-4): a log line (JSON with CORRAL_LOG_FORMAT=json), and a counter.
fn report(state: &AppState, run_id: &str, decided: &projection::Projection) -> Value {
    if let Some((event, refusal)) = &decided.withheld {
        state.metrics.event(event.event(), refusal.reason.code());
        tracing::info!(
            event = event.event(),
            run_id = %run_id,
            reason = refusal.reason.code(),
            file = ?refusal.file,
            limit = ?refusal.limit,
            "selection withheld"
        );
    }
    let withheld = decided.withheld.as_ref().map(|(event, refusal)| {
        json!({
            "event": event.event(),
            "reason": refusal.reason.code(),
            "file": refusal.file,
            "limit": refusal.limit,
        })
    });
    json!({
        "files": decided.manifest.entries.iter().map(|e| json!({
            "filename": e.filename, "reference": e.reference, "kind": e.kind,
            "version": e.version, "media_type": e.media_type, "size": e.size,
        })).collect::<Vec<_>>(),
        "withheld": withheld,
        "no_file_attached": decided.no_file_attached,
    })
}

/// The room now, less the turn's own links since admission, against the admitted manifest.
async fn verify_room(
    state: &AppState,
    authority: &crate::resources::Authority,
    admitted: &Admitted,
    turn: &TurnScope,
    run_id: &str,
    manifest: &projection::Manifest,
) -> Result<(), Reply> {
    let member = admitted.member.0.as_str();
    let journal = authority
        .journal(&JournalQuery {
            room: admitted.conversation.0.clone(),
            member: member.to_owned(),
            since: turn.scope.position,
            retrieved: admitted.retrieved.clone(),
        })
        .await
        .map_err(|error| authority_failed(run_id, &error))?;
    let own: Vec<String> = journal
        .links
        .iter()
        .filter(|l| {
            l.turn.as_deref() == Some(turn.turn.as_str()) && l.member.as_deref() == Some(member)
        })
        .map(|l| l.reference.clone())
        .collect();
    projection::verify_room(manifest, &journal.documents, &own).map_err(|refusal| {
        state.metrics.refusal(refusal.reason.code());
        refused(run_id, &refusal)
    })
}

/// Each file's bytes, by digest, as stored (base64): the worker checks them before the code
/// starts.
async fn file_bytes(
    state: &AppState,
    run_id: &str,
    manifest: &projection::Manifest,
) -> Result<Vec<String>, Reply> {
    let mut files = Vec::with_capacity(manifest.entries.len());
    for entry in &manifest.entries {
        match state.workspaces.resource(&entry.digest).await {
            Ok(Some(bytes)) => files.push(BASE64.encode(&bytes)),
            Ok(None) => {
                return Err(refused(
                    run_id,
                    &Refusal {
                        reason: Reason::Unavailable,
                        file: Some(entry.filename.clone()),
                        limit: None,
                    },
                ));
            }
            Err(e) => {
                return Err(answer::refusal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    e.code(),
                    e.to_string(),
                    json!({ "run_id": run_id }),
                ));
            }
        }
    }
    Ok(files)
}

/// Step 3: links each retained output into the room (OUT-1); what was linked, for the answer.
/// A link that fails is reported, not retried: the output stays retained under the member.
pub async fn link(
    state: &AppState,
    admitted: &Admitted,
    turn: &TurnScope,
    outputs: &[Published],
) -> Value {
    let Some(authority) = &state.resources else {
        return json!([]);
    };
    let mut linked = Vec::with_capacity(outputs.len());
    for output in outputs {
        let name = output.path.rsplit('/').next().unwrap_or(&output.path);
        let request = LinkRequest {
            room: admitted.conversation.0.clone(),
            member: admitted.member.0.clone(),
            turn: turn.turn.clone(),
            name: name.to_owned(),
            digest: output.digest.clone(),
            media_type: output.media_type.clone(),
            size: output.size,
            kind: Kind::Output,
        };
        linked.push(match authority.link(&request).await {
            Ok(done) => json!({
                "path": output.path, "reference": done.reference, "version": done.version,
                "media_type": output.media_type, "size": output.size,
            }),
            Err(error) => json!({ "path": output.path, "error": error.code() }),
        });
    }
    Value::Array(linked)
}
