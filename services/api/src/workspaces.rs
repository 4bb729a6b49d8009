//! Workspace snapshots in an object store (WS-1, WS-2, WS-5), through `object_store`: the local
//! filesystem by default, S3-compatible by configuration, one code path for both.
//!
//! A workspace is keyed by actor and conversation (`corral_core::workspace::storage_key`, 64 hex
//! digits, so no id can reach another's key). Its snapshots are numbered generations,
//! `<root>/ws/<key>/g<20 digits>.tar`, each written once and create-only: a save names the
//! generation it started from and writes the next one only if nobody has (`PutMode::Create`: an
//! atomic no-replace link on the filesystem, `If-None-Match: *` on S3). Of two concurrent runs of
//! one workspace, the second save finds its generation taken and is refused, never silently
//! overwriting the first. The newest generation is authoritative; a failed run or a failed save
//! writes nothing, so the earlier snapshot stays authoritative. Generations older than the one a
//! save started from are pruned after it commits (best effort; a leftover is never read). A save
//! from a base so stale that its next number was written and pruned long ago is found by the
//! listing that follows it (a generation two or more above its own exists), removed and refused:
//! a run's changes are saved or refused, never kept where nobody reads them.
//!
//! Workers never see this store or its credentials: the API hands a worker the archive bytes and
//! takes the packed workspace back.

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};

/// A snapshot as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Its generation (the first save writes generation 1).
    pub generation: u64,
    /// The tar.
    pub archive: Bytes,
}

/// Why storage failed. Codes are stable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageError {
    /// Another save of the same workspace committed `generation` first: this save is refused.
    Conflict {
        /// The generation that was taken.
        generation: u64,
    },
    /// The store could not be read or written.
    Unavailable(String),
}

impl StorageError {
    /// The stable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Conflict { .. } => "workspace_conflict",
            Self::Unavailable(_) => "workspace_storage_unavailable",
        }
    }
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Conflict { generation } => write!(
                f,
                "another run saved generation {generation} of this workspace first; this run's \
                 changes were not saved and the other run's snapshot is authoritative"
            ),
            Self::Unavailable(message) => write!(f, "workspace storage: {message}"),
        }
    }
}

fn unavailable(error: &object_store::Error) -> StorageError {
    StorageError::Unavailable(error.to_string())
}

/// The workspace store.
#[derive(Clone, Debug)]
pub struct Workspaces {
    store: Arc<dyn ObjectStore>,
    root: Path,
}

impl Workspaces {
    /// Workspaces in `store` under `root`.
    pub fn new(store: Arc<dyn ObjectStore>, root: &str) -> Self {
        Self {
            store,
            root: Path::from(root),
        }
    }

    /// Opens the store a URL names: `file:///abs/dir` (created if missing) or `s3://bucket[/prefix]`
    /// with the standard `AWS_*` environment (`AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, credentials, ...).
    ///
    /// # Errors
    /// An unsupported scheme or a store that cannot be configured.
    pub fn open(url: &str) -> Result<Self, String> {
        if let Some(dir) = url.strip_prefix("file://") {
            if !dir.starts_with('/') {
                return Err(format!("{url:?}: a file:// URL needs an absolute path"));
            }
            std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
                .map_err(|e| format!("{url:?}: {e}"))?;
            return Ok(Self::new(Arc::new(store), ""));
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(format!("{url:?}: no bucket"));
            }
            crate::ensure_crypto_provider();
            let store = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| format!("{url:?}: {e}"))?;
            return Ok(Self::new(Arc::new(store), prefix.trim_matches('/')));
        }
        Err(format!(
            "{url:?}: workspace storage must be file:///dir or s3://bucket[/prefix]"
        ))
    }

    /// The workspace's snapshots, and its Hashline authority records beside them (WS-3): two
    /// numbered series of create-only objects under the same identity, the tar never holding
    /// the record.
    fn path(&self, series: Series, key: &str, generation: u64) -> Path {
        self.root
            .clone()
            .join(series.dir)
            .join(key)
            .join(format!("g{generation:020}.{}", series.extension))
    }

    /// The generations stored for `key` in `series`, ascending.
    async fn generations(&self, series: Series, key: &str) -> Result<Vec<u64>, StorageError> {
        let dir = self.root.clone().join(series.dir).join(key);
        let listed: Vec<_> = self
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| unavailable(&e))?;
        let mut generations: Vec<u64> = listed
            .iter()
            .filter_map(|meta| parse_generation(meta.location.filename()?, series.extension))
            .collect();
        generations.sort_unstable();
        Ok(generations)
    }

    /// The authoritative (newest) snapshot of `key`, if any.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] when it cannot be read.
    pub async fn latest(&self, key: &str) -> Result<Option<Snapshot>, StorageError> {
        self.newest(SNAPSHOTS, key).await
    }

    /// Generation `generation` of `key`, if it is stored (it may have been pruned since a newer
    /// one was saved on top of it).
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] when it cannot be read.
    pub async fn generation(
        &self,
        key: &str,
        generation: u64,
    ) -> Result<Option<Snapshot>, StorageError> {
        match self.store.get(&self.path(SNAPSHOTS, key, generation)).await {
            Ok(found) => Ok(Some(Snapshot {
                generation,
                archive: found.bytes().await.map_err(|e| unavailable(&e))?,
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// Saves `archive` as the generation after `base` (0 when the run started from no snapshot),
    /// only if nobody has; returns the new generation.
    ///
    /// # Errors
    /// [`StorageError::Conflict`] when that generation is taken (nothing is written),
    /// [`StorageError::Unavailable`] when the store failed (the earlier snapshot stays newest).
    pub async fn save(&self, key: &str, base: u64, archive: Bytes) -> Result<u64, StorageError> {
        self.create_next(SNAPSHOTS, key, base, archive).await
    }

    /// The newest Hashline authority record of `key` (WS-3), if any.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] when it cannot be read.
    pub async fn authority(&self, key: &str) -> Result<Option<Snapshot>, StorageError> {
        self.newest(AUTHORITY, key).await
    }

    /// Saves `record` as the authority generation after `base`, only if nobody has.
    ///
    /// # Errors
    /// As [`Workspaces::save`].
    pub async fn save_authority(
        &self,
        key: &str,
        base: u64,
        record: Bytes,
    ) -> Result<u64, StorageError> {
        self.create_next(AUTHORITY, key, base, record).await
    }

    async fn newest(&self, series: Series, key: &str) -> Result<Option<Snapshot>, StorageError> {
        // A concurrent save may prune the generation just listed: list again, once.
        for _ in 0..2 {
            let Some(&generation) = self.generations(series, key).await?.last() else {
                return Ok(None);
            };
            match self.store.get(&self.path(series, key, generation)).await {
                Ok(found) => {
                    let archive = found.bytes().await.map_err(|e| unavailable(&e))?;
                    return Ok(Some(Snapshot {
                        generation,
                        archive,
                    }));
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(unavailable(&e)),
            }
        }
        Err(StorageError::Unavailable(String::from(
            "the newest generation vanished twice while being read",
        )))
    }

    async fn create_next(
        &self,
        series: Series,
        key: &str,
        base: u64,
        bytes: Bytes,
    ) -> Result<u64, StorageError> {
        let generation = base + 1;
        match self
            .put_new(&self.path(series, key, generation), bytes)
            .await
        {
            Ok(()) => {}
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {
                return Err(StorageError::Conflict { generation });
            }
            Err(e) => return Err(unavailable(&e)),
        }
        let generations = self.generations(series, key).await?;
        // A save from a base so old that its next generation was already written and pruned
        // re-creates that number below the newest: it would never be read. Nobody can have built
        // on it (a newer generation existed before it), so it is removed and refused.
        if let Some(&newest) = generations.last()
            && newest > generation + 1
        {
            let _ = self.store.delete(&self.path(series, key, generation)).await;
            return Err(StorageError::Conflict { generation: newest });
        }
        // Keep the generation this save started from (a reader may be on it); older ones go.
        for old in generations.into_iter().filter(|g| *g < base) {
            let _ = self.store.delete(&self.path(series, key, old)).await;
        }
        Ok(generation)
    }
}

/// A numbered series of objects under one workspace identity.
#[derive(Clone, Copy)]
struct Series {
    dir: &'static str,
    extension: &'static str,
}

/// The workspace's snapshots: `ws/<key>/g<20 digits>.tar`.
const SNAPSHOTS: Series = Series {
    dir: "ws",
    extension: "tar",
};
/// Its Hashline authority records: `hashline/<key>/g<20 digits>.json`.
const AUTHORITY: Series = Series {
    dir: "hashline",
    extension: "json",
};

impl Workspaces {
    /// Where a retained output of `key`'s workspace is kept: `out/<key>/<run id>/<digest>`.
    fn output_path(&self, key: &str, run_id: &str, path: &str) -> Path {
        let name = corral_core::workspace::output_object(run_id, path);
        name.split('/')
            .fold(self.root.clone().join("out").join(key), |dir, part| {
                dir.join(part)
            })
    }

    /// Retains one validated output of run `run_id` (OUT-1), create-only: no later save of the
    /// workspace changes or prunes it.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] when it could not be written (or, impossibly for a fresh
    /// run id, already exists).
    pub async fn retain_output(
        &self,
        key: &str,
        run_id: &str,
        path: &str,
        bytes: Bytes,
    ) -> Result<(), StorageError> {
        self.put_new(&self.output_path(key, run_id, path), bytes)
            .await
            .map_err(|e| unavailable(&e))
    }

    /// Writes `bytes` at `path` only if nothing is there (`PutMode::Create`: an atomic no-replace
    /// link on the filesystem, `If-None-Match: *` on S3).
    async fn put_new(&self, path: &Path, bytes: Bytes) -> object_store::Result<()> {
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        self.store
            .put_opts(path, PutPayload::from_bytes(bytes), options)
            .await
            .map(drop)
    }

    /// A retained output, if there is one.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] when it cannot be read.
    pub async fn read_output(
        &self,
        key: &str,
        run_id: &str,
        path: &str,
    ) -> Result<Option<Bytes>, StorageError> {
        match self.store.get(&self.output_path(key, run_id, path)).await {
            Ok(found) => found.bytes().await.map(Some).map_err(|e| unavailable(&e)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// Where a document's bytes are, by their SHA-256 (`res/<64 hex digits>`): the resource
    /// authority describes documents, and their bytes are here (PROJ-1).
    fn resource_path(&self, digest: &str) -> Path {
        self.root.clone().join("res").join(digest)
    }

    /// Stores a document's bytes under `digest`, create-only: bytes already there are kept (the
    /// same digest names the same bytes; the worker checks them against it before code starts).
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] when they could not be written.
    pub async fn put_resource(&self, digest: &str, bytes: Bytes) -> Result<(), StorageError> {
        match self.put_new(&self.resource_path(digest), bytes).await {
            Ok(()) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(unavailable(&e)),
        }
    }

    /// A document's bytes by digest, as stored (unverified), if there are any.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] when they cannot be read.
    pub async fn resource(&self, digest: &str) -> Result<Option<Bytes>, StorageError> {
        match self.store.get(&self.resource_path(digest)).await {
            Ok(found) => found.bytes().await.map(Some).map_err(|e| unavailable(&e)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(unavailable(&e)),
        }
    }
}

/// `g<20 digits>.<extension>` to its generation.
fn parse_generation(name: &str, extension: &str) -> Option<u64> {
    let digits = name
        .strip_prefix('g')?
        .strip_suffix(extension)?
        .strip_suffix('.')?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One regular file from a snapshot's tar, by its normalised relative path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileLookup {
    /// The file's bytes.
    Found(Vec<u8>),
    /// No regular file at that path (absent, a directory, or anything else).
    NotFound,
    /// The tar could not be read.
    Corrupt(String),
}

/// Finds the regular file `path` in `archive` (the worker packs regular files and directories
/// only; links never enter a snapshot, so nothing here can be followed). Of two entries with one
/// path, the later stands, as tar has it.
#[must_use]
pub fn find_file(archive: &[u8], path: &str, max_bytes: u64) -> FileLookup {
    match files(archive, &[path], max_bytes) {
        Ok(mut found) => found
            .pop()
            .map_or(FileLookup::NotFound, |(_, bytes)| FileLookup::Found(bytes)),
        Err(e) => FileLookup::Corrupt(e),
    }
}

/// Why one file of a snapshot could not be replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplaceError {
    /// No regular file at that path.
    NotFound,
    /// The files would exceed `SANDBOX_WORKSPACE_MAX_BYTES`.
    TooLarge,
    /// The tar could not be read.
    Corrupt(String),
}

/// `archive` with the regular file at `path` holding `content` instead, every other entry as it
/// was (its header, name and bytes), within `max_bytes` of file content in all.
///
/// # Errors
/// [`ReplaceError`].
pub fn replace_file(
    archive: &[u8],
    path: &str,
    content: &[u8],
    max_bytes: u64,
) -> Result<Vec<u8>, ReplaceError> {
    let corrupt = |e: std::io::Error| ReplaceError::Corrupt(e.to_string());
    let mut reader = tar::Archive::new(archive);
    let mut builder = tar::Builder::new(Vec::with_capacity(archive.len() + content.len()));
    let mut replaced = false;
    let mut total: u64 = 0;
    for entry in reader.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let raw = entry.path_bytes().into_owned();
        let mut header = entry.header().clone();
        let is_target = corral_core::workspace::normalise(&raw).is_ok_and(|name| name == path)
            && header.entry_type() == tar::EntryType::Regular;
        let mut data = Vec::new();
        if is_target {
            data.extend_from_slice(content);
            header.set_size(content.len() as u64);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            header.set_mtime(now);
            replaced = true;
        } else {
            std::io::Read::read_to_end(&mut entry, &mut data).map_err(corrupt)?;
        }
        total = total.saturating_add(data.len() as u64);
        if total > max_bytes {
            return Err(ReplaceError::TooLarge);
        }
        let name = String::from_utf8_lossy(&raw).into_owned();
        builder
            .append_data(&mut header, name, &data[..])
            .map_err(corrupt)?;
    }
    if !replaced {
        return Err(ReplaceError::NotFound);
    }
    builder.into_inner().map_err(corrupt)
}

/// One entry of a snapshot as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The normalised relative path.
    pub path: String,
    /// `file` or `directory`.
    pub kind: corral_core::workspace::EntryKind,
    /// A file's size in bytes (0 for a directory).
    pub bytes: u64,
}

/// Every entry of `archive`, in archive order, as the worker's unpacker would take them: raw
/// path bytes and headers, read without their content.
///
/// # Errors
/// The tar could not be read.
pub fn entries(archive: &[u8]) -> Result<Vec<(Vec<u8>, Listed)>, String> {
    use corral_core::workspace::EntryKind;
    let mut listed = Vec::new();
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries().map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        let raw = entry.path_bytes().into_owned();
        let header = entry.header();
        let kind = match header.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => EntryKind::File,
            tar::EntryType::Directory => EntryKind::Directory,
            tar::EntryType::Symlink => EntryKind::Symlink,
            tar::EntryType::Link => EntryKind::HardLink,
            tar::EntryType::Char | tar::EntryType::Block => EntryKind::Device,
            tar::EntryType::Fifo => EntryKind::Fifo,
            _ => EntryKind::Other,
        };
        let bytes = if kind == EntryKind::File {
            header.size().map_err(|e| e.to_string())?
        } else {
            0
        };
        let path = corral_core::workspace::normalise(&raw)
            .unwrap_or_default()
            .to_owned();
        listed.push((raw, Listed { path, kind, bytes }));
    }
    Ok(listed)
}

/// `archive` with a new regular file at `path` holding `content` appended (mode 0644), every
/// other entry as it was. The caller has judged the whole result (create-only, within bounds).
///
/// # Errors
/// The tar could not be read or written.
pub fn append_file(archive: &[u8], path: &str, content: &[u8]) -> Result<Vec<u8>, String> {
    let io = |e: std::io::Error| e.to_string();
    let mut reader = tar::Archive::new(archive);
    let mut builder = tar::Builder::new(Vec::with_capacity(archive.len() + content.len() + 1024));
    for entry in reader.entries().map_err(io)? {
        let mut entry = entry.map_err(io)?;
        let raw = entry.path_bytes().into_owned();
        let mut header = entry.header().clone();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).map_err(io)?;
        let name = String::from_utf8_lossy(&raw).into_owned();
        builder
            .append_data(&mut header, name, &data[..])
            .map_err(io)?;
    }
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    );
    builder
        .append_data(&mut header, path, content)
        .map_err(io)?;
    builder.into_inner().map_err(io)
}

/// The regular files at `paths` in `archive`, each read up to `max_bytes`, in archive order.
///
/// # Errors
/// The tar could not be read.
pub fn files(
    archive: &[u8],
    paths: &[&str],
    max_bytes: u64,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut found = Vec::with_capacity(paths.len());
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let raw = entry.path_bytes().into_owned();
        let Ok(name) = corral_core::workspace::normalise(&raw) else {
            continue;
        };
        if !paths.contains(&name) || entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = name.to_owned();
        let mut content = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(&mut entry, max_bytes),
            &mut content,
        )
        .map_err(|e| e.to_string())?;
        found.push((name, content));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_names_round_trip_and_nothing_else_parses() {
        assert_eq!(
            parse_generation("g00000000000000000007.tar", "tar"),
            Some(7)
        );
        assert_eq!(parse_generation("g7.tar", "tar"), None);
        assert_eq!(parse_generation("g0000000000000000000x.tar", "tar"), None);
        assert_eq!(parse_generation("x00000000000000000007.tar", "tar"), None);
        assert_eq!(
            parse_generation("g00000000000000000007.json", "json"),
            Some(7)
        );
        assert_eq!(parse_generation("g00000000000000000007.json", "tar"), None);
    }
}
