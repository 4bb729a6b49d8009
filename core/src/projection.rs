//! Read-only projection of authorized resources (PROJ-1 to PROJ-4, PROJ-7, PROJ-8): which
//! documents a run's turn may see, under which server-assigned names, and when a change since
//! admission stops the run. Pure: the shells ask the platform's resource authority and the
//! object store, and perform what these functions decide.
//!
//! A turn's projection is the room's linked files (for a private chat, the conversation's whole
//! attachment scope, resolved server-side) and the documents re-authorized from retrieval for the
//! turn; then, only while the room's audience is exactly the initiating member, that member's
//! private selection, appended after them. The whole is held to [`FILES_MAX`] files and
//! [`BYTES_MAX`] bytes. A room file that cannot be projected fails the run with its own reason
//! naming the file and the limit; a selection that cannot be projected is withheld (logged, the
//! run proceeds) unless the run asked for files and the selection was its only source (PROJ-4).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::ids::hex;

/// The most files a turn projects (PROJ-1).
pub const FILES_MAX: usize = 20;
/// The most bytes a turn projects, all files together (PROJ-1).
pub const BYTES_MAX: u64 = 8 << 20;
/// The longest server-assigned filename, in bytes.
pub const FILENAME_MAX_BYTES: usize = 128;

/// What a projected document is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A document a member uploaded.
    Document,
    /// An editable member artifact.
    Artifact,
    /// A native file retained from an earlier code run (OUT-1).
    Output,
}

/// Where a document is in the platform's processing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Processing {
    /// Its bytes are final.
    Ready,
    /// Still being processed.
    Processing,
    /// Its processing failed.
    Failed,
}

/// One version of a document, as the resource authority describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    /// Its reference id (one per version).
    pub reference: String,
    /// The id every version of it shares.
    pub root: String,
    /// Its immutable version.
    pub version: u64,
    /// What it is.
    pub kind: Kind,
    /// Its processing state.
    pub processing: Processing,
    /// Whether the member may read it now.
    pub readable: bool,
    /// The SHA-256 of its bytes, 64 hex digits.
    pub digest: String,
    /// Its media type.
    pub media_type: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its display name (never used as a path as given).
    pub name: String,
}

/// The longest display name or media type an authority may give, in bytes.
pub const LABEL_MAX_BYTES: usize = 1024;

impl Document {
    /// Whether the authority's description can be used as given: reference and root valid
    /// identities, a 64-hex-digit SHA-256, a printable media type and a display name, each
    /// bounded. An authority that answers otherwise answers garbage, and nothing is projected.
    #[must_use]
    pub fn is_well_formed(&self) -> bool {
        let label = |text: &str| {
            !text.is_empty() && text.len() <= LABEL_MAX_BYTES && !text.chars().any(char::is_control)
        };
        crate::ids::identity_is_valid(&self.reference)
            && crate::ids::identity_is_valid(&self.root)
            && self.digest.len() == 64
            && self
                .digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && label(&self.media_type)
            && label(&self.name)
    }
}

/// A room's audience: its version and its active roster (members reaching it through a project
/// included), read in one query.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Audience {
    /// Changes whenever the roster does.
    pub version: u64,
    /// The active members.
    pub members: BTreeSet<String>,
}

impl Audience {
    /// Whether `member` is the only one who can see the room.
    #[must_use]
    pub fn is_only(&self, member: &str) -> bool {
        self.members.len() == 1 && self.members.contains(member)
    }
}

/// Where an entry of the projection came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The room's linked files (or a private chat's attachment scope) and the turn's
    /// re-authorized documents.
    Room,
    /// The initiating member's private selection.
    Selection,
}

/// One file of a turn's projection: what `KAIZEN_SHARED_RESOURCES_MANIFEST` lists (PROJ-5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The document's reference id.
    pub reference: String,
    /// Its root.
    pub root: String,
    /// What it is.
    pub kind: Kind,
    /// Its immutable version.
    pub version: u64,
    /// The SHA-256 of its bytes.
    pub digest: String,
    /// The server-assigned filename, unique within the projection.
    pub filename: String,
    /// Its media type.
    pub media_type: String,
    /// Its size.
    pub size: u64,
    /// Where it came from.
    pub source: Source,
}

/// A turn's projection, in order: the room's files, then the selection's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The files.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// Its digest: SHA-256 over each entry's reference, version, digest, size and filename, in
    /// order; what admission pins and the worker re-verifies (PROJ-6).
    #[must_use]
    pub fn digest(&self) -> String {
        let mut hash = Sha256::new();
        for e in &self.entries {
            hash.update(format!(
                "{}\t{}\t{}\t{}\t{}\n",
                e.reference, e.version, e.digest, e.size, e.filename
            ));
        }
        hex(&hash.finalize())
    }

    /// The bytes of every file.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }
}

/// Why a file could not be projected (PROJ-4, PROJ-7, PROJ-8). The codes are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Someone else can see the room since the turn was admitted.
    AudienceChanged,
    /// A file is still being processed.
    NotReady,
    /// A file's processing failed.
    Failed,
    /// More than [`FILES_MAX`] files.
    OverCount,
    /// More than [`BYTES_MAX`] bytes.
    OverBytes,
    /// The member can no longer read a file.
    Unavailable,
    /// The room's files changed after the turn started: try again.
    Changed,
    /// A file the turn was admitted with has a newer version: try again (both are projected
    /// from the next turn).
    Revised,
}

impl Reason {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::AudienceChanged => "resource_audience_changed",
            Self::NotReady => "resource_not_ready",
            Self::Failed => "resource_failed",
            Self::OverCount => "resource_over_count",
            Self::OverBytes => "resource_over_bytes",
            Self::Unavailable => "resource_unavailable",
            Self::Changed => "resource_changed",
            Self::Revised => "resource_revised",
        }
    }
}

/// A refusal: the reason, the file it is about and the limit that applies, when there are ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: Reason,
    /// The file (its display name), when one is at fault.
    pub file: Option<String>,
    /// The limit, for the bounds: [`FILES_MAX`] or [`BYTES_MAX`].
    pub limit: Option<u64>,
}

impl Refusal {
    /// What the member is told (PROJ-8): the reason, the file and the limit, and whether trying
    /// again may help. Never "unavailable" for what is not a tier problem.
    #[must_use]
    pub fn message(&self) -> String {
        let file = self.file.as_deref().unwrap_or("a file");
        match self.reason {
            Reason::OverCount => format!(
                "this turn has more than {FILES_MAX} files to open ({file} is over the bound)"
            ),
            Reason::OverBytes => {
                format!("this turn's files are over {BYTES_MAX} bytes (8 MiB) together with {file}")
            }
            Reason::NotReady => {
                format!("{file} is still being processed; try again when it is ready")
            }
            Reason::Failed => format!("{file} could not be processed, so it cannot be opened"),
            Reason::Unavailable => format!("{file} can no longer be read by you"),
            Reason::AudienceChanged => "someone else can now see this chat, so your private \
                 selection was not opened; try again"
                .to_owned(),
            Reason::Changed => {
                format!("the chat's files changed after this turn started ({file}); try again")
            }
            Reason::Revised => format!(
                "{file} has a newer version since this turn started; try again, and both versions \
                 are opened"
            ),
        }
    }

    /// Whether the member should simply try again (the room changed under the turn).
    #[must_use]
    pub fn retry(&self) -> bool {
        matches!(
            self.reason,
            Reason::AudienceChanged | Reason::Changed | Reason::Revised
        )
    }

    fn of(reason: Reason, file: Option<&str>, limit: Option<u64>) -> Self {
        Self {
            reason,
            file: file.map(str::to_owned),
            limit,
        }
    }
}

/// The event a withheld selection is logged under (PROJ-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Withheld {
    /// Before dispatch: the selection on its own could not be projected.
    BeforeDispatch,
    /// The room's files and the selection together exceed the bound.
    CombinedBound,
}

impl Withheld {
    /// The event's name.
    #[must_use]
    pub fn event(self) -> &'static str {
        match self {
            Self::BeforeDispatch => "run_code.private_selection_withheld",
            Self::CombinedBound => "sandbox.private_selection_withheld",
        }
    }
}

/// What a turn projects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Projection {
    /// The files, with their server-assigned names.
    pub manifest: Manifest,
    /// The selection, when it was withheld: the event and the bounded reason.
    pub withheld: Option<(Withheld, Refusal)>,
    /// The run asked for files and none is attached: it runs, and is told so.
    pub no_file_attached: bool,
}

/// What the projector knows of a turn.
#[derive(Clone, Debug)]
pub struct Turn<'a> {
    /// The initiating member.
    pub member: &'a str,
    /// The room's linked files (a private chat's attachment scope) and the documents
    /// re-authorized from retrieval for this turn, as the authority resolved them.
    pub room: &'a [Document],
    /// The member's private selection.
    pub selection: &'a [Document],
    /// The audience the turn was admitted with.
    pub admitted: &'a Audience,
    /// The audience re-read right before the selection loads; `None` when it could not be read
    /// (the selection is then withheld as unavailable).
    pub live: Option<&'a Audience>,
    /// Whether the run names the shared-resource contract (PROJ-4).
    pub asked_for_files: bool,
}

/// The first reason `docs` cannot be projected on their own: a file not ready, failed or
/// unreadable (in order), then the count and byte bounds.
fn judge(docs: &[&Document]) -> Result<(), Refusal> {
    for doc in docs {
        let reason = match (doc.readable, doc.processing) {
            (false, _) => Some(Reason::Unavailable),
            (true, Processing::Processing) => Some(Reason::NotReady),
            (true, Processing::Failed) => Some(Reason::Failed),
            (true, Processing::Ready) => None,
        };
        if let Some(reason) = reason {
            return Err(Refusal::of(reason, Some(&doc.name), None));
        }
    }
    bounds(docs)
}

fn bounds(docs: &[&Document]) -> Result<(), Refusal> {
    if docs.len() > FILES_MAX {
        let first_over = docs.get(FILES_MAX).map(|d| d.name.as_str());
        return Err(Refusal::of(
            Reason::OverCount,
            first_over,
            Some(FILES_MAX as u64),
        ));
    }
    let mut total: u64 = 0;
    for doc in docs {
        total = total.saturating_add(doc.size);
        if total > BYTES_MAX {
            return Err(Refusal::of(
                Reason::OverBytes,
                Some(&doc.name),
                Some(BYTES_MAX),
            ));
        }
    }
    Ok(())
}

/// Decides a turn's projection (PROJ-1 to PROJ-4).
///
/// # Errors
/// The refusal that fails the run: a room file that cannot be projected, or a selection that
/// cannot be when the run asked for files and the selection was its only source.
pub fn project(turn: &Turn<'_>) -> Result<Projection, Refusal> {
    let room: Vec<&Document> = turn.room.iter().collect();
    judge(&room)?;
    let mut withheld = None;
    let mut chosen = room.clone();
    // A room whose admission snapshot lists anyone else never considers the selection.
    if turn.admitted.is_only(turn.member) && !turn.selection.is_empty() {
        let fresh: Vec<&Document> = turn
            .selection
            .iter()
            .filter(|s| {
                !room.iter().any(|r| {
                    r.reference == s.reference || (r.root == s.root && r.version == s.version)
                })
            })
            .collect();
        let alone = match turn.live {
            None => Err(Refusal::of(Reason::Unavailable, None, None)),
            Some(live) if live.version != turn.admitted.version || !live.is_only(turn.member) => {
                Err(Refusal::of(Reason::AudienceChanged, None, None))
            }
            Some(_) => judge(&fresh),
        };
        let outcome = match alone {
            Err(refusal) => Err((Withheld::BeforeDispatch, refusal)),
            Ok(()) => {
                let mut merged = room.clone();
                merged.extend(fresh.iter().copied());
                match bounds(&merged) {
                    Ok(()) => Ok(merged),
                    Err(refusal) => Err((Withheld::CombinedBound, refusal)),
                }
            }
        };
        match outcome {
            Ok(merged) => chosen = merged,
            // PROJ-4: fatal only when the run asked for files and the selection was its sole
            // source; otherwise withheld, and the run proceeds on the room's files.
            Err((_, refusal)) if turn.asked_for_files && room.is_empty() => return Err(refusal),
            Err(withholding) => withheld = Some(withholding),
        }
    }
    let names = filenames(&chosen);
    let manifest = Manifest {
        entries: chosen
            .iter()
            .zip(names)
            .enumerate()
            .map(|(i, (doc, filename))| Entry {
                reference: doc.reference.clone(),
                root: doc.root.clone(),
                kind: doc.kind,
                version: doc.version,
                digest: doc.digest.clone(),
                filename,
                media_type: doc.media_type.clone(),
                size: doc.size,
                source: if i < room.len() {
                    Source::Room
                } else {
                    Source::Selection
                },
            })
            .collect(),
    };
    Ok(Projection {
        no_file_attached: turn.asked_for_files && manifest.entries.is_empty(),
        manifest,
        withheld,
    })
}

/// A display name made safe to be a file's name: its last path component, without control
/// characters or anything but letters, digits and `._-+ ()`, no leading dot, at most
/// [`FILENAME_MAX_BYTES`] (the extension kept); `file` when nothing is left.
#[must_use]
pub fn safe_name(name: &str) -> String {
    let last = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let mut safe: String = last
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || "._-+ ()".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    safe = safe.trim().trim_start_matches('.').to_owned();
    if safe.is_empty() || safe.chars().all(|c| c == '_' || c == '.') {
        safe = String::from("file");
    }
    if safe.len() > FILENAME_MAX_BYTES {
        let (mut stem, extension) = match safe.rfind('.') {
            Some(at) if at > 0 && safe.len() - at <= 16 => {
                (safe[..at].to_owned(), safe[at..].to_owned())
            }
            _ => (safe.clone(), String::new()),
        };
        while stem.len() + extension.len() > FILENAME_MAX_BYTES {
            stem.pop();
        }
        safe = stem + &extension;
    }
    safe
}

/// Server-assigned, unique filenames for `docs`, in order (PROJ-1, PROJ-7): each document's safe
/// name; a name already taken gets a unique prefix (`v<version>-` for another version of the same
/// document, `<n>-` otherwise), so that code tells them apart by the manifest.
#[must_use]
pub fn filenames(docs: &[&Document]) -> Vec<String> {
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut names = Vec::with_capacity(docs.len());
    for (i, doc) in docs.iter().enumerate() {
        let base = safe_name(&doc.name);
        let lower = |n: &str| n.to_lowercase();
        let mut name = base.clone();
        if taken.contains(&lower(&name)) {
            let same_root = docs[..i].iter().any(|d| d.root == doc.root);
            name = if same_root {
                format!("v{}-{base}", doc.version)
            } else {
                format!("{}-{base}", i + 1)
            };
            let mut n = 2;
            while taken.contains(&lower(&name)) {
                name = format!("{n}-{base}");
                n += 1;
            }
        }
        taken.insert(lower(&name));
        names.push(name);
    }
    names
}

/// The digest check before code starts (PROJ-7): the room now, less the files this run itself
/// linked since admission, against the room files the turn was admitted with.
///
/// # Errors
/// [`Reason::Revised`] when a file of the admitted set has a newer version; [`Reason::Changed`]
/// for anything else that differs (a file added, removed or changed).
pub fn verify_room(
    admitted: &Manifest,
    live_room: &[Document],
    own_links: &[String],
) -> Result<(), Refusal> {
    let live: Vec<&Document> = live_room
        .iter()
        .filter(|d| !own_links.contains(&d.reference))
        .collect();
    let admitted_room: Vec<&Entry> = admitted
        .entries
        .iter()
        .filter(|e| e.source == Source::Room)
        .collect();
    // A newer version of an admitted file: the admitted one stays active beside it.
    for doc in &live {
        let known = admitted_room.iter().any(|e| e.reference == doc.reference);
        if let Some(entry) = admitted_room
            .iter()
            .find(|e| !known && e.root == doc.root && doc.version > e.version)
        {
            return Err(Refusal::of(Reason::Revised, Some(&entry.filename), None));
        }
    }
    for entry in &admitted_room {
        let same = live.iter().any(|d| {
            d.reference == entry.reference
                && d.version == entry.version
                && d.digest == entry.digest
                && d.size == entry.size
        });
        if !same {
            return Err(Refusal::of(Reason::Changed, Some(&entry.filename), None));
        }
    }
    if let Some(extra) = live
        .iter()
        .find(|d| !admitted_room.iter().any(|e| e.reference == d.reference))
    {
        return Err(Refusal::of(Reason::Changed, Some(&extra.name), None));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// What code sees, and what the worker verifies before code starts (PROJ-5, PROJ-6).

/// The environment variable naming the read-only directory of the projection (PROJ-5).
pub const ENV_DIR: &str = "KAIZEN_SHARED_RESOURCES_DIR";
/// The environment variable holding the projection's manifest, a JSON array (PROJ-5).
pub const ENV_MANIFEST: &str = "KAIZEN_SHARED_RESOURCES_MANIFEST";
/// Where, inside the jail, the projection is mounted read-only: outside the writable workspace,
/// so never in its snapshot (PROJ-6).
pub const MOUNT_DIR: &str = "/mnt/resources";

/// One entry of `KAIZEN_SHARED_RESOURCES_MANIFEST`: the resolved path beside the reference id,
/// kind, immutable version, content digest, server-assigned filename, media type and size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    /// The file's path inside the jail: opening it is the documented contract.
    pub path: String,
    /// The document's reference id.
    pub reference: String,
    /// What it is.
    pub kind: Kind,
    /// Its immutable version.
    pub version: u64,
    /// `sha256:` and 64 hex digits.
    pub digest: String,
    /// The server-assigned filename.
    pub filename: String,
    /// Its media type.
    pub media_type: String,
    /// Its size in bytes.
    pub size: u64,
}

impl Manifest {
    /// What the code is told: each entry with its path under [`MOUNT_DIR`].
    #[must_use]
    pub fn listed(&self) -> Vec<Listed> {
        self.entries
            .iter()
            .map(|e| Listed {
                path: format!("{MOUNT_DIR}/{}", e.filename),
                reference: e.reference.clone(),
                kind: e.kind,
                version: e.version,
                digest: format!("sha256:{}", e.digest),
                filename: e.filename.clone(),
                media_type: e.media_type.clone(),
                size: e.size,
            })
            .collect()
    }

    /// The code's environment for this projection: both variables, or neither when nothing is
    /// authorized (PROJ-5).
    #[must_use]
    pub fn environment(&self) -> Vec<(String, String)> {
        if self.entries.is_empty() {
            return Vec::new();
        }
        let listed = serde_json::to_string(&self.listed()).unwrap_or_else(|_| "[]".to_owned());
        vec![
            (ENV_DIR.to_owned(), MOUNT_DIR.to_owned()),
            (ENV_MANIFEST.to_owned(), listed),
        ]
    }
}

/// Why the worker would not start code on a projection (PROJ-6). The codes are the `not_run`
/// reasons the worker answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// An entry's filename is not a safe, server-assigned name (a path outside the projection,
    /// a separator, a leading dot, too long) or repeats another's.
    Path,
    /// The entries are not the manifest the turn was admitted with (its digest differs), do not
    /// pair with the files sent, or exceed the bound.
    Manifest,
    /// A file's bytes are not the size or digest its entry pins.
    Digest,
}

impl Mismatch {
    /// The `not_run` reason the worker answers with.
    #[must_use]
    pub fn not_run(self) -> crate::jail::NotRun {
        match self {
            Self::Path => crate::jail::NotRun::ResourcePathInvalid,
            Self::Manifest => crate::jail::NotRun::ResourceManifestMismatch,
            Self::Digest => crate::jail::NotRun::ResourceDigestMismatch,
        }
    }
}

/// A verification that failed: which check, and the file it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unverified {
    /// Which check.
    pub mismatch: Mismatch,
    /// The entry's filename, when one is at fault.
    pub file: Option<String>,
    /// What differed, for the diagnostics.
    pub detail: String,
}

fn unverified(mismatch: Mismatch, file: Option<&str>, detail: impl Into<String>) -> Unverified {
    Unverified {
        mismatch,
        file: file.map(str::to_owned),
        detail: detail.into(),
    }
}

/// Whether `filename` is one the server could have assigned: what [`safe_name`] leaves of it is
/// itself, optionally behind a `<digits>-` or `v<digits>-` uniqueness prefix.
#[must_use]
pub fn is_assigned_name(filename: &str) -> bool {
    !filename.is_empty()
        && filename.len() <= FILENAME_MAX_BYTES + 24
        && !filename.contains(['/', '\\', '\0'])
        && filename != "."
        && filename != ".."
        && !filename.starts_with('.')
        && safe_name(filename) == filename
}

/// The worker's check before code starts (PROJ-6): the entries hash to the admitted manifest
/// digest, each filename is a safe server-assigned name unique in the projection, the files pair
/// with the entries within [`FILES_MAX`] and [`BYTES_MAX`], and each file's bytes have the size and
/// SHA-256 its entry pins. Checked in that order; the first failure answers.
///
/// # Errors
/// The first check that fails, naming the file.
pub fn verify_files(
    manifest: &Manifest,
    admitted_digest: &str,
    files: &[&[u8]],
) -> Result<(), Unverified> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for entry in &manifest.entries {
        if !is_assigned_name(&entry.filename) {
            return Err(unverified(
                Mismatch::Path,
                Some(&entry.filename),
                "not a server-assigned filename inside the projection",
            ));
        }
        if !seen.insert(entry.filename.to_lowercase()) {
            return Err(unverified(
                Mismatch::Path,
                Some(&entry.filename),
                "a filename the projection already has",
            ));
        }
    }
    if manifest.digest() != admitted_digest {
        return Err(unverified(
            Mismatch::Manifest,
            None,
            "the entries are not the manifest the turn was admitted with",
        ));
    }
    if files.len() != manifest.entries.len()
        || manifest.entries.len() > FILES_MAX
        || manifest.bytes() > BYTES_MAX
    {
        return Err(unverified(
            Mismatch::Manifest,
            None,
            format!(
                "{} files for {} entries, {} bytes (at most {FILES_MAX} files and {BYTES_MAX} bytes)",
                files.len(),
                manifest.entries.len(),
                manifest.bytes()
            ),
        ));
    }
    for (entry, bytes) in manifest.entries.iter().zip(files) {
        if bytes.len() as u64 != entry.size {
            return Err(unverified(
                Mismatch::Digest,
                Some(&entry.filename),
                format!(
                    "{} bytes where the manifest pins {}",
                    bytes.len(),
                    entry.size
                ),
            ));
        }
        if crate::ids::sha256_hex(bytes) != entry.digest {
            return Err(unverified(
                Mismatch::Digest,
                Some(&entry.filename),
                "the bytes do not have the digest the manifest pins",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
