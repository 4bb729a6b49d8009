//! Workspace archives (issue 4 item 4): unpacking the tar a run is handed, and packing the
//! workspace after it. Every decision about an entry is `corral_core::workspace::ArchiveJudge`'s;
//! this module only reads, writes and moves.
//!
//! Unpacking writes into a fresh staging directory beside the target, judging every entry before
//! writing it, and moves the staging directory into place only when the whole archive passed: a
//! refused or malformed archive leaves the target exactly as it was (WS-5). No link is ever created
//! (the judge refuses them all), so no later entry can be written through one; files are created
//! with `O_EXCL | O_NOFOLLOW` all the same.
//!
//! Packing walks the workspace without following links, takes regular files and directories only
//! (links and special files are skipped and counted), and refuses the whole archive when the files
//! sum over `SANDBOX_WORKSPACE_MAX_BYTES`: no partial archive is ever returned.

use std::fs::{self, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use corral_core::workspace::{
    ARCHIVE_ENTRIES_MAX, Accepted, ArchiveJudge, EntryKind, Refused, WORKSPACE_MAX_SETTING,
};
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use tar::EntryType;

/// Distinguishes staging directories of one process.
static STAGING: AtomicU32 = AtomicU32::new(0);

/// Why an archive was not unpacked or the workspace not packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveError {
    /// The judge refused an entry (the path as given, lossily shown).
    Refused {
        /// The reason.
        reason: Refused,
        /// The entry's path as the archive gave it.
        path: String,
    },
    /// The archive is not a readable tar, or an entry is shorter than it declares.
    Malformed(String),
    /// The workspace's files sum over `SANDBOX_WORKSPACE_MAX_BYTES` (packing).
    TooLarge {
        /// The bound, in bytes.
        max_bytes: u64,
    },
    /// Reading or writing the filesystem failed.
    Io(String),
}

impl ArchiveError {
    /// A stable code for the error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Refused { reason, .. } => reason.code(),
            Self::Malformed(_) => "archive_malformed",
            Self::TooLarge { .. } => "workspace_too_large",
            Self::Io(_) => "archive_io",
        }
    }

    /// The setting the error is about, when a bound was crossed.
    #[must_use]
    pub fn setting(&self) -> Option<&'static str> {
        match self {
            Self::Refused { reason, .. } => reason.setting(),
            Self::TooLarge { .. } => Some(WORKSPACE_MAX_SETTING),
            Self::Malformed(_) | Self::Io(_) => None,
        }
    }
}

impl std::fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused { reason, path } => match reason.setting() {
                Some(setting) => write!(f, "{} at {path:?} ({setting})", reason.code()),
                None => write!(f, "{} at {path:?}", reason.code()),
            },
            Self::Malformed(why) => write!(f, "archive_malformed: {why}"),
            Self::TooLarge { max_bytes } => write!(
                f,
                "the workspace holds more than {max_bytes} bytes ({WORKSPACE_MAX_SETTING})"
            ),
            Self::Io(why) => write!(f, "archive_io: {why}"),
        }
    }
}

fn io_error(what: &str, path: &Path, error: &std::io::Error) -> ArchiveError {
    ArchiveError::Io(format!("{what} {}: {error}", path.display()))
}

/// What an unpack created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unpacked {
    /// Distinct paths created (files and directories).
    pub entries: u32,
    /// File bytes written.
    pub bytes: u64,
}

/// Removes a staging directory unless it was moved into place.
struct StagingGuard {
    path: PathBuf,
    armed: bool,
}

impl Drop for StagingGuard {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the directory is ours, beside the target, and never read again.
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// The judge's kind for a tar entry type. `None` for header kinds the tar reader uses internally.
fn kind_of(entry_type: EntryType) -> Option<EntryKind> {
    Some(match entry_type {
        EntryType::Regular | EntryType::Continuous => EntryKind::File,
        EntryType::Directory => EntryKind::Directory,
        EntryType::Symlink => EntryKind::Symlink,
        EntryType::Link => EntryKind::HardLink,
        EntryType::Char | EntryType::Block => EntryKind::Device,
        EntryType::Fifo => EntryKind::Fifo,
        // PAX global headers carry metadata only; the reader applies none of it and neither do we.
        EntryType::XGlobalHeader => return None,
        _ => EntryKind::Other,
    })
}

/// Unpacks the tar `archive` so that `target` holds exactly its files and directories, within
/// `max_bytes` (`SANDBOX_WORKSPACE_MAX_BYTES`). `target`'s parent must exist; `target` itself may
/// exist (it is replaced only on success) or not.
pub fn unpack(archive: &[u8], target: &Path, max_bytes: u64) -> Result<Unpacked, ArchiveError> {
    let parent = target
        .parent()
        .ok_or_else(|| ArchiveError::Io(format!("{} has no parent", target.display())))?;
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let number = STAGING.fetch_add(1, Ordering::Relaxed);
    let staging = StagingGuard {
        path: parent.join(format!(".{name}.unpacking-{}-{number}", std::process::id())),
        armed: true,
    };
    fs::create_dir(&staging.path).map_err(|e| io_error("create", &staging.path, &e))?;
    fs::set_permissions(&staging.path, fs::Permissions::from_mode(0o700))
        .map_err(|e| io_error("chmod", &staging.path, &e))?;
    let unpacked = unpack_into(archive, &staging.path, max_bytes)?;
    move_into_place(staging, target)?;
    Ok(unpacked)
}

/// Writes every entry of `archive` under `root`, judging each first.
fn unpack_into(archive: &[u8], root: &Path, max_bytes: u64) -> Result<Unpacked, ArchiveError> {
    let mut judge = ArchiveJudge::new(max_bytes);
    let mut reader = tar::Archive::new(archive);
    let entries = reader
        .entries()
        .map_err(|e| ArchiveError::Malformed(e.to_string()))?;
    // Each header takes at least 512 bytes of a bounded input, so this loop is bounded; the count
    // bounds it again for headers the judge never sees.
    let mut headers: u32 = 0;
    for entry in entries {
        headers += 1;
        if headers > ARCHIVE_ENTRIES_MAX.saturating_mul(2) {
            return Err(ArchiveError::Refused {
                reason: Refused::TooManyEntries,
                path: String::new(),
            });
        }
        let mut entry = entry.map_err(|e| ArchiveError::Malformed(e.to_string()))?;
        let Some(kind) = kind_of(entry.header().entry_type()) else {
            continue;
        };
        let raw_path = entry.path_bytes().into_owned();
        let declared = entry.size();
        let accepted =
            judge
                .judge(&raw_path, kind, declared)
                .map_err(|reason| ArchiveError::Refused {
                    reason,
                    path: String::from_utf8_lossy(&raw_path)
                        .chars()
                        .take(256)
                        .collect(),
                })?;
        match accepted {
            Accepted::Root => {}
            Accepted::Directory(path) => {
                let dir = root.join(&path);
                fs::create_dir_all(&dir).map_err(|e| io_error("create", &dir, &e))?;
            }
            Accepted::File { path, bytes } => {
                let mode = entry.header().mode().unwrap_or(0o644);
                write_file(root, &path, &mut entry, bytes, mode)?;
            }
        }
    }
    Ok(Unpacked {
        entries: judge.entries(),
        bytes: judge.bytes_total(),
    })
}

/// Creates the file `relative` under `root` with exactly `bytes` bytes from `data`.
fn write_file(
    root: &Path,
    relative: &str,
    data: &mut impl Read,
    bytes: u64,
    mode: u32,
) -> Result<(), ArchiveError> {
    let path = root.join(relative);
    if let Some(dir) = path.parent() {
        // Every directory under `root` was made by this unpack (no link ever is), so creating
        // the parents follows nothing the archive could have planted.
        fs::create_dir_all(dir).map_err(|e| io_error("create", dir, &e))?;
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        // Owner read and write; never a set-id, sticky or world-writable bit.
        .mode((mode & 0o755) | 0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| io_error("create", &path, &e))?;
    let copied = std::io::copy(&mut data.take(bytes), &mut file)
        .map_err(|e| ArchiveError::Malformed(format!("{relative}: {e}")))?;
    if copied != bytes {
        return Err(ArchiveError::Malformed(format!(
            "{relative}: {copied} of the {bytes} bytes it declares"
        )));
    }
    Ok(())
}

/// Moves the staging directory to `target`: a rename when `target` does not exist, otherwise an
/// atomic exchange followed by removing the old contents.
fn move_into_place(mut staging: StagingGuard, target: &Path) -> Result<(), ArchiveError> {
    match fs::symlink_metadata(target) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            fs::rename(&staging.path, target).map_err(|e| io_error("rename to", target, &e))?;
            staging.armed = false;
        }
        Ok(meta) if meta.is_dir() => {
            renameat2(
                AT_FDCWD,
                &staging.path,
                AT_FDCWD,
                target,
                RenameFlags::RENAME_EXCHANGE,
            )
            .map_err(|e| ArchiveError::Io(format!("exchange {}: {e}", target.display())))?;
            // The guard now removes the old contents, which sit where the staging directory was.
        }
        Ok(_) => {
            return Err(ArchiveError::Io(format!(
                "{} is not a directory",
                target.display()
            )));
        }
        Err(error) => return Err(io_error("stat", target, &error)),
    }
    Ok(())
}

/// What a pack produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// The tar.
    pub archive: Vec<u8>,
    /// File bytes in it.
    pub bytes: u64,
    /// Entries left out: links, special files and names that are not UTF-8.
    pub skipped: u32,
}

/// Packs the regular files and directories under `root` (never following a link) into a tar,
/// refusing the whole archive when the files sum over `max_bytes`.
pub fn pack(root: &Path, max_bytes: u64) -> Result<Packed, ArchiveError> {
    let mut judge = ArchiveJudge::new(max_bytes);
    let mut builder = tar::Builder::new(Vec::new());
    let mut skipped: u32 = 0;
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let listing = fs::read_dir(&dir).map_err(|e| io_error("read", &dir, &e))?;
        let mut names: Vec<_> = listing.flatten().map(|entry| entry.file_name()).collect();
        if names.len() > ARCHIVE_ENTRIES_MAX as usize {
            return Err(ArchiveError::Refused {
                reason: Refused::TooManyEntries,
                path: prefix,
            });
        }
        names.sort();
        // Reversed onto the stack so that directories are packed in name order.
        let mut subdirectories = Vec::new();
        for name in names {
            let path = dir.join(&name);
            let Some(name) = name.to_str() else {
                skipped += 1;
                continue;
            };
            let relative = if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}/{name}")
            };
            let meta = fs::symlink_metadata(&path).map_err(|e| io_error("stat", &path, &e))?;
            let kind = if meta.is_dir() {
                EntryKind::Directory
            } else if meta.is_file() {
                EntryKind::File
            } else {
                skipped += 1;
                continue;
            };
            judge
                .judge(relative.as_bytes(), kind, meta.len())
                .map_err(|reason| match reason {
                    Refused::TooLarge => ArchiveError::TooLarge { max_bytes },
                    reason => ArchiveError::Refused {
                        reason,
                        path: relative.clone(),
                    },
                })?;
            let mut header = tar::Header::new_gnu();
            header.set_mode(meta.mode() & 0o755);
            header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
            if kind == EntryKind::Directory {
                header.set_entry_type(EntryType::Directory);
                header.set_size(0);
                builder
                    .append_data(&mut header, format!("{relative}/"), std::io::empty())
                    .map_err(|e| ArchiveError::Io(format!("pack {relative}: {e}")))?;
                subdirectories.push((path, relative));
            } else {
                let content = read_regular(&path, meta.len())?;
                header.set_entry_type(EntryType::Regular);
                header.set_size(content.len() as u64);
                builder
                    .append_data(&mut header, &relative, content.as_slice())
                    .map_err(|e| ArchiveError::Io(format!("pack {relative}: {e}")))?;
            }
        }
        pending.extend(subdirectories.into_iter().rev());
    }
    let archive = builder
        .into_inner()
        .map_err(|e| ArchiveError::Io(format!("finish the archive: {e}")))?;
    Ok(Packed {
        archive,
        bytes: judge.bytes_total(),
        skipped,
    })
}

/// Reads at most `bytes` of a regular file, refusing to follow a link at its last component.
fn read_regular(path: &Path, bytes: u64) -> Result<Vec<u8>, ArchiveError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| io_error("open", path, &e))?;
    let meta = file.metadata().map_err(|e| io_error("stat", path, &e))?;
    if !meta.is_file() {
        return Err(ArchiveError::Io(format!(
            "{} is no longer a regular file",
            path.display()
        )));
    }
    let mut content = Vec::new();
    file.take(bytes)
        .read_to_end(&mut content)
        .map_err(|e| io_error("read", path, &e))?;
    Ok(content)
}
