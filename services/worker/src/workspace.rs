//! The run's directories on the supervisor's side: size-bounded tmpfs mounts for the workspace
//! and for /tmp with /dev/shm, the code, copying an operator's directory in and the validated
//! downloads back, snapshots, and the wipe.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt, lchown};
use std::path::{Path, PathBuf};

use corral_core::bounds::FilesystemUse;
use corral_core::downloads::{self, DocumentKind, Entry, FileStamp, Offered, Snapshot};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::statvfs::statvfs;

/// Most entries (files, directories, links) a workspace may hold; also the tmpfs inode bound.
pub const WORKSPACE_ENTRIES_MAX: u32 = 16_384;
/// Most entries the run's /tmp and /dev/shm may hold together.
pub const SCRATCH_ENTRIES_MAX: u32 = 16_384;

/// The directories of one run.
#[derive(Clone, Debug)]
pub struct RunDirs {
    /// The run directory itself.
    pub run_dir: PathBuf,
}

fn io<T>(result: std::io::Result<T>, what: impl FnOnce() -> String) -> Result<T, String> {
    result.map_err(|error| format!("{}: {error}", what()))
}

fn mount_tmpfs(target: &Path, name: &str, options: &str) -> Result<(), String> {
    mount(
        Some(name),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options),
    )
    .map_err(|error| format!("mount {name} at {}: {error}", target.display()))
}

impl RunDirs {
    /// The workspace (a tmpfs).
    pub fn workspace(&self) -> PathBuf {
        self.run_dir.join("workspace")
    }

    /// The tmpfs that holds the run's /tmp and /dev/shm.
    pub fn scratch(&self) -> PathBuf {
        self.run_dir.join("scratch")
    }

    /// The read-only directory with the code.
    pub fn code(&self) -> PathBuf {
        self.run_dir.join("code")
    }

    /// The turn's projection (PROJ-6): read-only, outside the workspace, gone with the run
    /// directory.
    pub fn resources(&self) -> PathBuf {
        self.run_dir.join("resources")
    }

    /// Creates the run directory with its mounts: the workspace, owned by the code's host uid and
    /// bounded by `workspace_max_bytes`, and the scratch space bounded by `tmp_max_bytes`.
    pub fn create(
        run_dir: PathBuf,
        user: (u32, u32),
        workspace_max_bytes: u64,
        tmp_max_bytes: u64,
    ) -> Result<Self, String> {
        let dirs = Self { run_dir };
        for dir in [
            dirs.run_dir.clone(),
            dirs.workspace(),
            dirs.scratch(),
            dirs.code(),
            dirs.run_dir.join("root"),
        ] {
            io(fs::create_dir_all(&dir), || {
                format!("create {}", dir.display())
            })?;
        }
        let (uid, gid) = user;
        mount_tmpfs(
            &dirs.workspace(),
            "corral-workspace",
            &format!(
                "size={workspace_max_bytes},nr_inodes={WORKSPACE_ENTRIES_MAX},mode=0700,uid={uid},gid={gid}"
            ),
        )?;
        mount_tmpfs(
            &dirs.scratch(),
            "corral-scratch",
            &format!("size={tmp_max_bytes},nr_inodes={SCRATCH_ENTRIES_MAX},mode=0755"),
        )?;
        for name in ["tmp", "shm"] {
            let dir = dirs.scratch().join(name);
            io(fs::create_dir(&dir), || format!("create {}", dir.display()))?;
            io(
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)),
                || format!("chmod {}", dir.display()),
            )?;
        }
        Ok(dirs)
    }

    /// Writes the code where the jail will read it (read-only, outside the workspace).
    pub fn write_code(&self, name: &str, code: &[u8]) -> Result<(), String> {
        let path = self.code().join(name);
        io(fs::write(&path, code), || {
            format!("write {}", path.display())
        })?;
        io(
            fs::set_permissions(&path, fs::Permissions::from_mode(0o444)),
            || format!("chmod {}", path.display()),
        )
    }

    /// Unmounts the workspace and scratch space (which discards their contents), measures what
    /// is left where they were, and removes the run directory. A mount that cannot be unmounted
    /// is left in place, so that the evidence counts it rather than hiding it.
    pub fn wipe(&self) -> Wiped {
        let mut failures = Vec::new();
        for target in [self.workspace(), self.scratch()] {
            if let Err(error) = umount2(&target, MntFlags::empty()) {
                failures.push(format!("unmount {}: {error}", target.display()));
            }
        }
        let workspace_entries = entries(&self.workspace());
        let scratch_entries = entries(&self.scratch());
        if let Err(error) = fs::remove_dir_all(&self.run_dir)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            failures.push(format!("remove {}: {error}", self.run_dir.display()));
        }
        Wiped {
            workspace_entries,
            scratch_entries,
            failures,
        }
    }
}

/// Writes a verified projection into `dir` under its server-assigned names: each file read-only
/// for everyone, the directory too, nothing executable. The names were checked by
/// `corral_core::projection::verify_files` (no separator, no dot-name), so each stays in `dir`.
///
/// # Errors
/// The step that failed.
pub fn write_resources(
    dir: &Path,
    manifest: &corral_core::projection::Manifest,
    files: &[&[u8]],
) -> Result<(), String> {
    io(fs::create_dir(dir), || format!("create {}", dir.display()))?;
    for (entry, bytes) in manifest.entries.iter().zip(files) {
        let path = dir.join(&entry.filename);
        let mut file = io(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o444)
                .open(&path),
            || format!("create {}", path.display()),
        )?;
        io(file.write_all(bytes), || {
            format!("write {}", path.display())
        })?;
    }
    io(
        fs::set_permissions(dir, fs::Permissions::from_mode(0o555)),
        || format!("chmod {}", dir.display()),
    )
}

/// What a wipe measured.
#[derive(Debug)]
pub struct Wiped {
    /// Entries left in the workspace directory once its tmpfs was gone.
    pub workspace_entries: Option<u32>,
    /// Entries left in the scratch directory once its tmpfs was gone.
    pub scratch_entries: Option<u32>,
    /// Steps that failed, for diagnostics.
    pub failures: Vec<String>,
}

/// Entries in `dir` (not recursive); zero when it does not exist; `None` when it cannot be read.
pub fn entries(dir: &Path) -> Option<u32> {
    match fs::read_dir(dir) {
        Ok(listing) => u32::try_from(listing.count()).ok(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Some(0),
        Err(_) => None,
    }
}

/// Why an operator's directory was not copied in.
#[derive(Debug)]
pub enum CopyInError {
    /// Over `SANDBOX_WORKSPACE_MAX_BYTES` or `WORKSPACE_ENTRIES_MAX`.
    TooLarge(String),
    /// Unreadable or unwritable.
    Io(String),
}

/// Copies the regular files and directories of `source` into `target` for the code's user,
/// within the bounds. Symbolic links and special files are skipped (with a diagnostic), never
/// followed: the jail sees only what is inside `source`.
pub fn copy_in(
    source: &Path,
    target: &Path,
    user: (u32, u32),
    max_bytes: u64,
    diagnostics: &mut Vec<String>,
) -> Result<(), CopyInError> {
    let mut total_bytes: u64 = 0;
    let mut total_entries: u32 = 0;
    let mut pending = vec![(source.to_path_buf(), target.to_path_buf())];
    while let Some((from_dir, to_dir)) = pending.pop() {
        let listing = fs::read_dir(&from_dir)
            .map_err(|e| CopyInError::Io(format!("read {}: {e}", from_dir.display())))?;
        let mut names: Vec<_> = listing.flatten().map(|entry| entry.file_name()).collect();
        names.sort();
        for name in names {
            total_entries += 1;
            if total_entries > WORKSPACE_ENTRIES_MAX {
                return Err(CopyInError::TooLarge(format!(
                    "more than {WORKSPACE_ENTRIES_MAX} entries"
                )));
            }
            let (from, to) = (from_dir.join(&name), to_dir.join(&name));
            let meta = fs::symlink_metadata(&from)
                .map_err(|e| CopyInError::Io(format!("stat {}: {e}", from.display())))?;
            let shown = from
                .strip_prefix(source)
                .unwrap_or(&from)
                .display()
                .to_string();
            if meta.is_dir() {
                fs::create_dir(&to).map_err(|e| CopyInError::Io(format!("create {shown}: {e}")))?;
                pending.push((from, to.clone()));
            } else if meta.is_file() {
                total_bytes = total_bytes.saturating_add(meta.len());
                if total_bytes > max_bytes {
                    return Err(CopyInError::TooLarge(format!(
                        "more than {max_bytes} bytes"
                    )));
                }
                copy_file(&from, &to, meta.len())
                    .map_err(|e| CopyInError::Io(format!("copy {shown}: {e}")))?;
            } else {
                diagnostics.push(format!(
                    "workspace: skipped {shown}: not a regular file or directory"
                ));
                continue;
            }
            // Owner read and write (and search for directories), the rest as given; never a
            // set-id bit.
            let mode = (meta.mode() & 0o777) | if meta.is_dir() { 0o700 } else { 0o600 };
            fs::set_permissions(&to, fs::Permissions::from_mode(mode))
                .and_then(|()| lchown(&to, Some(user.0), Some(user.1)))
                .map_err(|e| CopyInError::Io(format!("own {shown}: {e}")))?;
        }
    }
    Ok(())
}

/// Copies at most `bytes` from `from` (never through a symbolic link) to a new file `to`.
fn copy_file(from: &Path, to: &Path, bytes: u64) -> std::io::Result<()> {
    let source = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)?;
    let mut target = OpenOptions::new().write(true).create_new(true).open(to)?;
    std::io::copy(&mut source.take(bytes), &mut target)?;
    target.flush()
}

/// A snapshot of `root` (never following links), the sum of its files' apparent sizes, and the
/// names it could not represent (not UTF-8), which are never offered as downloads.
pub fn snapshot(root: &Path) -> Result<(Snapshot, u64, u32), String> {
    let mut snapshot = Snapshot::new();
    let mut apparent_bytes: u64 = 0;
    let mut unnamed: u32 = 0;
    let mut visited: u32 = 0;
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let listing = io(fs::read_dir(&dir), || format!("read {}", dir.display()))?;
        for entry in listing.flatten() {
            // The tmpfs inode bound keeps this finite; the check keeps it finite anywhere.
            visited += 1;
            if visited > WORKSPACE_ENTRIES_MAX.saturating_mul(2) {
                return Err(format!("more than {} entries", WORKSPACE_ENTRIES_MAX * 2));
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_file() {
                apparent_bytes = apparent_bytes.saturating_add(meta.len());
            }
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                unnamed += 1;
                continue;
            };
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let kind = meta.file_type();
            let found = if kind.is_symlink() {
                Entry::Symlink
            } else if kind.is_dir() {
                pending.push((entry.path(), path.clone()));
                Entry::Directory
            } else if kind.is_file() {
                Entry::File(FileStamp {
                    bytes: meta.len(),
                    modified_ns: i128::from(meta.mtime()) * 1_000_000_000
                        + i128::from(meta.mtime_nsec()),
                    changed_ns: i128::from(meta.ctime()) * 1_000_000_000
                        + i128::from(meta.ctime_nsec()),
                    inode: meta.ino(),
                })
            } else {
                Entry::Other
            };
            snapshot.insert(path, found);
        }
    }
    Ok((snapshot, apparent_bytes, unnamed))
}

/// How full a size-bounded filesystem is.
pub fn filesystem_use(path: &Path, apparent_bytes: u64) -> Option<FilesystemUse> {
    let stat = statvfs(path).ok()?;
    Some(FilesystemUse {
        free_bytes: stat.blocks_available().saturating_mul(stat.fragment_size()),
        free_inodes: stat.files_available(),
        apparent_bytes,
    })
}

/// Opens a workspace file for reading without following a link at its last component, and
/// checks that it is still a regular file.
fn open_regular(root: &Path, relative: &str) -> std::io::Result<(File, u64)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(root.join(relative))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok((file, meta.len()))
}

/// Reads and verifies each candidate (documents within the artifact bound are read whole; other
/// files only measured). A candidate that vanished or changed kind is skipped with a diagnostic.
pub fn offer(
    root: &Path,
    candidates: &[String],
    max_artifact_bytes: u64,
    diagnostics: &mut Vec<String>,
) -> Vec<Offered> {
    let mut offered = Vec::new();
    for path in candidates {
        let (file, bytes) = match open_regular(root, path) {
            Ok(found) => found,
            Err(error) => {
                diagnostics.push(format!("download {path}: skipped: {error}"));
                continue;
            }
        };
        let verified = match DocumentKind::of(path) {
            Some(kind) if bytes <= max_artifact_bytes => {
                let mut content = Vec::new();
                match file.take(max_artifact_bytes).read_to_end(&mut content) {
                    Ok(_) => downloads::verify_document(kind, &content),
                    Err(error) => {
                        diagnostics.push(format!("download {path}: skipped: {error}"));
                        continue;
                    }
                }
            }
            // Too large to return anyway; `select` leaves it out under the artifact bound.
            Some(_) | None => Ok(()),
        };
        offered.push(Offered {
            path: path.clone(),
            bytes,
            verified,
        });
    }
    offered
}

/// Copies a validated download from the run's workspace into the operator's directory, through
/// real directories only: a component of the destination that is a link or a file is refused,
/// and the file lands by rename, which replaces a link rather than following it.
pub fn copy_out(root: &Path, relative: &str, destination_root: &Path) -> Result<(), String> {
    let parts: Vec<&str> = relative.split('/').collect();
    let Some((file_name, parents)) = parts.split_last() else {
        return Err("empty path".to_owned());
    };
    let mut dir = destination_root.to_path_buf();
    for part in parents {
        dir.push(part);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(format!("{} is not a directory", dir.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                io(fs::create_dir(&dir), || format!("create {}", dir.display()))?;
            }
            Err(error) => return Err(format!("stat {}: {error}", dir.display())),
        }
    }
    let destination = dir.join(file_name);
    if fs::symlink_metadata(&destination).is_ok_and(|meta| meta.is_dir()) {
        return Err(format!("{} is a directory", destination.display()));
    }
    let (mut source, bytes) = io(open_regular(root, relative), || format!("open {relative}"))?;
    let staging = dir.join(format!(".{file_name}.corral-partial"));
    let _ = fs::remove_file(&staging);
    let mut target = io(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&staging),
        || format!("create {}", staging.display()),
    )?;
    let copied =
        std::io::copy(&mut (&mut source).take(bytes), &mut target).and_then(|_| target.flush());
    if let Err(error) = copied {
        let _ = fs::remove_file(&staging);
        return Err(format!("copy {relative}: {error}"));
    }
    io(fs::rename(&staging, &destination), || {
        format!("rename into {}", destination.display())
    })
}
