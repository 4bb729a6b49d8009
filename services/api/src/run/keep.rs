//! Keeping what a run left, as corral-core's plan says (WS-2, WS-5, OUT-1): each validated
//! download retained as an output of its own, then the workspace saved create-only. Outputs go
//! first: a save refused after them leaves outputs nothing refers to, where the other order could
//! leave a saved workspace that the run's answer calls unsaved.

use bytes::Bytes;
use corral_contract::ExecuteReply;
use corral_core::run::outcome::{Decided, Kept, Packed, Plan, Reported, decide, plan};

use crate::AppState;
use crate::workspaces::{Snapshot, StorageError, Workspaces, files};

/// Where keeping writes, and the settings it obeys: the API's own, or a simulated world's.
#[derive(Clone, Copy)]
pub struct Storage<'a> {
    /// The workspace store.
    pub workspaces: &'a Workspaces,
    /// Whether workspaces persist across runs (`CORRAL_WORKSPACE_PERSIST`).
    pub persist: bool,
    /// The largest output kept (`CORRAL_MAX_ARTIFACT_BYTES`).
    pub max_artifact_bytes: u64,
}

impl<'a> Storage<'a> {
    /// The API's storage and settings.
    #[must_use]
    pub fn of(state: &'a AppState) -> Self {
        Self {
            workspaces: &state.workspaces,
            persist: state.settings.workspace_persist,
            max_artifact_bytes: state.settings.bounds.max_artifact_bytes,
        }
    }
}

/// The run a reply is kept for: its workspace, its id and the snapshot it was restored from.
#[derive(Clone, Copy)]
pub struct Run<'a> {
    /// The workspace's storage key.
    pub key: &'a str,
    /// The run's id.
    pub run_id: &'a str,
    /// The snapshot the run started from.
    pub restored: Option<&'a Snapshot>,
    /// The run's declared outputs (OUT-1).
    pub declared: &'a [String],
}

/// Keeps what `reply` says the run left, as corral-core's plan says, and decides the run's one
/// outcome from the reply and what was kept (corral-core's `decide`).
pub async fn kept(
    storage: Storage<'_>,
    run: Run<'_>,
    reply: &ExecuteReply,
    how: How<'_>,
) -> (Keeping, Decided) {
    let archive = reply.workspace.archive();
    let packed = match (reply.workspace.packed(), &archive) {
        // A packed workspace that does not decode was not returned.
        (Packed::Archive, None) => Packed::Missing,
        (packed, _) => packed,
    };
    let reported = Reported {
        exit_code: reply.exit_code,
        not_run: reply.not_run,
        bound: reply.bound,
        downloads: &reply.downloads,
        rejected: &reply.rejected,
        packed: &packed,
    };
    let keeping = match (plan(&reported), archive) {
        (Plan::Keep, Some(archive)) => {
            keep(
                storage,
                run.key,
                run.run_id,
                run.restored,
                reply,
                archive,
                how,
            )
            .await
        }
        (Plan::Keep, None) | (Plan::KeepNothing, _) => Keeping::kept(Kept::Nothing),
    };
    let decided = decide(&reported, &keeping.kept, run.declared, run.run_id);
    (keeping, decided)
}

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
    storage: Storage<'_>,
    key: &str,
    run_id: &str,
    restored: Option<&Snapshot>,
    reply: &ExecuteReply,
    archive: Vec<u8>,
    how: How<'_>,
) -> Keeping {
    let How { retain, publish } = how;
    let published = match outputs(storage, key, run_id, reply, &archive, publish).await {
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
    if !storage.persist {
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
    #[cfg(feature = "sim-mutations")]
    if mutation::answers_before_save() {
        // The defect: the save is started and its acknowledgement not awaited.
        let (workspaces, key, archive) = (storage.workspaces.clone(), key.to_owned(), archive);
        tokio::spawn(async move { workspaces.save(&key, base, Bytes::from(archive)).await });
        return Keeping {
            kept: Kept::Stored {
                generation: Some(base + 1),
            },
            saved: true,
            unchanged: false,
            retained: None,
            published,
        };
    }
    match storage
        .workspaces
        .save(key, base, Bytes::from(archive))
        .await
    {
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
    storage: Storage<'_>,
    key: &str,
    run_id: &str,
    reply: &ExecuteReply,
    archive: &[u8],
    publish: Option<&[String]>,
) -> Result<Vec<Published>, Kept> {
    let paths: Vec<&str> = reply.downloads.iter().map(|d| d.path.as_str()).collect();
    let found = match files(archive, &paths, storage.max_artifact_bytes) {
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
        storage
            .workspaces
            .retain_output(key, run_id, &path, bytes.clone())
            .await
            .map_err(|e| failed(&e))?;
        if let Some(declared) = publish
            && (declared.is_empty() || declared.contains(&path))
        {
            let digest = corral_core::ids::sha256_hex(&bytes);
            storage
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

/// Keeping's deliberate defect, for the shell simulation to prove it catches it (issue 28).
/// Compiled only with the `sim-mutations` feature, which no shipped build enables.
#[cfg(feature = "sim-mutations")]
pub mod mutation {
    use std::sync::atomic::{AtomicBool, Ordering};

    static ANSWER_BEFORE_SAVE: AtomicBool = AtomicBool::new(false);

    /// Turns on (or off) the defect: a workspace save is started and the run counts it stored
    /// (and answers `succeeded`) without waiting for the store's acknowledgement.
    pub fn answer_before_save(on: bool) {
        ANSWER_BEFORE_SAVE.store(on, Ordering::SeqCst);
    }

    pub(crate) fn answers_before_save() -> bool {
        ANSWER_BEFORE_SAVE.load(Ordering::SeqCst)
    }
}
