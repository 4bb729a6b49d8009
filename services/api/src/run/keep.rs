//! Keeping what a run left, as corral-core's plan says (WS-2, WS-5, OUT-1): each validated
//! download retained as an output of its own, then the workspace saved create-only. Outputs go
//! first: a save refused after them leaves outputs nothing refers to, where the other order could
//! leave a saved workspace that the run's answer calls unsaved.

use bytes::Bytes;
use corral_contract::ExecuteReply;
use corral_core::run::outcome::Kept;

use crate::AppState;
use crate::workspaces::{Snapshot, StorageError, files};

/// An output stored under its digest, to be linked into the run's room (OUT-1).
pub struct Published {
    /// Workspace-relative path.
    pub path: String,
    /// SHA-256, 64 hex digits.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// Media type.
    pub media_type: String,
}

/// What keeping did, with what the model is told of the workspace.
pub struct Keeping {
    /// For corral-core's outcome.
    pub kept: Kept,
    /// A new generation was written.
    pub saved: bool,
    /// The workspace was exactly what was restored, so nothing was written.
    pub unchanged: bool,
    /// In affinity mode (KER-4), the workspace retained beside the held lease instead.
    pub retained: Option<Bytes>,
    /// The outputs also stored under their digest, to be linked into the run's room (OUT-1).
    pub published: Vec<Published>,
}

impl Keeping {
    fn kept(kept: Kept) -> Self {
        Self {
            kept,
            saved: false,
            unchanged: false,
            retained: None,
            published: Vec::new(),
        }
    }
}

fn failed(error: &StorageError) -> Kept {
    match error {
        StorageError::Conflict { generation } => Kept::Conflict {
            generation: *generation,
        },
        StorageError::Unavailable(message) => Kept::Unavailable {
            message: message.clone(),
        },
    }
}

/// Where a run's workspace and outputs go besides the object store's workspace series.
#[derive(Clone, Copy)]
pub struct How<'a> {
    /// Retain the workspace beside an affinity-mode kernel's held lease (KER-4).
    pub retain: bool,
    /// The run's declared outputs, when its outputs are to be linked into its room (OUT-1).
    pub publish: Option<&'a [String]>,
}

/// Keeps `archive` (the packed workspace of `reply`) for workspace `key`, restored from
/// `restored`: saved in the object store, or with `retain` (an affinity-mode kernel, KER-4)
/// retained beside its held lease. With `publish` (the run's declared outputs), each output the
/// run returns is also stored under its digest, where the resource authority's link will point
/// (OUT-1): the declared ones when it declared any, otherwise every validated download.
pub async fn keep(
    state: &AppState,
    key: &str,
    run_id: &str,
    restored: Option<&Snapshot>,
    reply: &ExecuteReply,
    archive: Vec<u8>,
    how: How<'_>,
) -> Keeping {
    let How { retain, publish } = how;
    let published = match outputs(state, key, run_id, reply, &archive, publish).await {
        Ok(published) => published,
        Err(kept) => return Keeping::kept(kept),
    };
    if retain {
        return Keeping {
            retained: Some(Bytes::from(archive)),
            published,
            ..Keeping::kept(Kept::Stored { generation: None })
        };
    }
    if !state.settings.workspace_persist {
        return Keeping {
            published,
            ..Keeping::kept(Kept::Stored { generation: None })
        };
    }
    let base = restored.map_or(0, |s| s.generation);
    if unchanged(restored.map(|s| &s.archive), &archive) {
        return Keeping {
            kept: Kept::Stored {
                generation: restored.map(|s| s.generation),
            },
            saved: false,
            unchanged: true,
            retained: None,
            published,
        };
    }
    match state.workspaces.save(key, base, Bytes::from(archive)).await {
        Ok(generation) => Keeping {
            kept: Kept::Stored {
                generation: Some(generation),
            },
            saved: true,
            unchanged: false,
            retained: None,
            published,
        },
        Err(e) => Keeping::kept(failed(&e)),
    }
}

/// Retains every output `reply` returns from `archive` (OUT-1), and with `publish` stores the
/// declared ones (every one when none is declared) under their digest: what was published, or
/// why nothing can be kept.
async fn outputs(
    state: &AppState,
    key: &str,
    run_id: &str,
    reply: &ExecuteReply,
    archive: &[u8],
    publish: Option<&[String]>,
) -> Result<Vec<Published>, Kept> {
    let paths: Vec<&str> = reply.downloads.iter().map(|d| d.path.as_str()).collect();
    let found = match files(archive, &paths, state.settings.bounds.max_artifact_bytes) {
        Ok(found) if found.len() == paths.len() => found,
        Ok(_) => {
            return Err(Kept::Unavailable {
                message: "a download is missing from the workspace the worker returned".into(),
            });
        }
        Err(e) => {
            return Err(Kept::Unavailable {
                message: format!("the workspace the worker returned cannot be read: {e}"),
            });
        }
    };
    let mut published = Vec::new();
    for (path, bytes) in found {
        let bytes = Bytes::from(bytes);
        state
            .workspaces
            .retain_output(key, run_id, &path, bytes.clone())
            .await
            .map_err(|e| failed(&e))?;
        if let Some(declared) = publish
            && (declared.is_empty() || declared.contains(&path))
        {
            let digest = corral_core::ids::sha256_hex(&bytes);
            state
                .workspaces
                .put_resource(&digest, bytes.clone())
                .await
                .map_err(|e| failed(&e))?;
            let media_type = reply
                .downloads
                .iter()
                .find(|d| d.path == path)
                .map_or_else(String::new, |d| d.media_type.clone());
            published.push(Published {
                path,
                digest,
                size: bytes.len() as u64,
                media_type,
            });
        }
    }
    Ok(published)
}

/// Whether `archive` is what was restored: the same bytes, or (with nothing restored) no entry.
/// An unchanged workspace is not written again.
fn unchanged(restored: Option<&Bytes>, archive: &[u8]) -> bool {
    match restored {
        Some(bytes) => bytes.as_ref() == archive,
        None => tar::Archive::new(archive)
            .entries()
            .is_ok_and(|mut entries| entries.next().is_none()),
    }
}
