//! Workspace archives: the one judge of every entry of an archive a worker unpacks, and of every
//! entry it packs (issue 4 item 4, WS-4, WS-5, BOUND-1).
//!
//! The shell (the worker) feeds [`ArchiveJudge::judge`] each entry's raw path bytes, kind and
//! declared size *before* it writes anything, and stops at the first refusal. The judge keeps the
//! running totals, so a bomb (declared sizes summing over `SANDBOX_WORKSPACE_MAX_BYTES`, or more
//! entries than [`ARCHIVE_ENTRIES_MAX`]) is refused at the entry that crosses the bound.
//!
//! Links: every link is refused, symbolic or hard, wherever it points. A symbolic link whose target
//! stays inside the workspace would be safe to create, but the worker would then have to resolve
//! every later entry's path through it, and the one thing an archive never needs to do is make the
//! unpacker follow a link. Refusing them all means no later entry can be written through one.
//! Devices, FIFOs, sockets and any other kind are refused too: the workspace holds regular files and
//! directories only.

use std::collections::BTreeMap;

/// Most distinct paths (files and directories, explicit or implied by a deeper path) one archive
/// may create; the workspace tmpfs has as many inodes.
pub const ARCHIVE_ENTRIES_MAX: u32 = 16_384;
/// Longest path in an archive, in bytes, after normalisation.
pub const ARCHIVE_PATH_BYTES_MAX: usize = 1_024;
/// Longest single path component, in bytes (the Linux file-name limit).
pub const ARCHIVE_COMPONENT_BYTES_MAX: usize = 255;
/// Deepest path: the most components one path may have.
pub const ARCHIVE_DEPTH_MAX: usize = 32;

/// The setting that bounds an archive's content.
pub const WORKSPACE_MAX_SETTING: &str = "SANDBOX_WORKSPACE_MAX_BYTES";

/// The kind of an archive entry, as its header declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A hard link.
    HardLink,
    /// A character or block device.
    Device,
    /// A named pipe.
    Fifo,
    /// A socket.
    Socket,
    /// Anything else (sparse files, vendor extensions).
    Other,
}

/// Why an entry was refused. The codes are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refused {
    /// The path is empty, or names the workspace root as something other than a directory.
    PathEmpty,
    /// The path starts with `/`.
    PathAbsolute,
    /// A component is `..`.
    PathParent,
    /// A component is empty or `.` (beyond a leading `./` and a trailing `/`).
    PathDotOrEmptyComponent,
    /// The path contains a NUL byte.
    PathNul,
    /// The path is not UTF-8.
    PathNotUtf8,
    /// The path is longer than [`ARCHIVE_PATH_BYTES_MAX`] or a component longer than
    /// [`ARCHIVE_COMPONENT_BYTES_MAX`].
    PathTooLong,
    /// The path has more than [`ARCHIVE_DEPTH_MAX`] components.
    PathTooDeep,
    /// A symbolic link.
    Symlink,
    /// A hard link.
    HardLink,
    /// A device file.
    Device,
    /// A named pipe.
    Fifo,
    /// A socket.
    Socket,
    /// A kind the workspace never holds.
    KindUnsupported,
    /// The path was already created by an earlier entry (a directory may be repeated).
    Duplicate,
    /// A parent of the path is a file created by an earlier entry.
    UnderFile,
    /// More than [`ARCHIVE_ENTRIES_MAX`] paths (a bomb of many small entries).
    TooManyEntries,
    /// The declared sizes sum over `SANDBOX_WORKSPACE_MAX_BYTES` (a bomb).
    TooLarge,
}

impl Refused {
    /// The stable reason code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::PathEmpty => "archive_path_empty",
            Self::PathAbsolute => "archive_path_absolute",
            Self::PathParent => "archive_path_parent",
            Self::PathDotOrEmptyComponent => "archive_path_dot_or_empty_component",
            Self::PathNul => "archive_path_nul",
            Self::PathNotUtf8 => "archive_path_not_utf8",
            Self::PathTooLong => "archive_path_too_long",
            Self::PathTooDeep => "archive_path_too_deep",
            Self::Symlink => "archive_symlink",
            Self::HardLink => "archive_hard_link",
            Self::Device => "archive_device",
            Self::Fifo => "archive_fifo",
            Self::Socket => "archive_socket",
            Self::KindUnsupported => "archive_kind_unsupported",
            Self::Duplicate => "archive_duplicate_path",
            Self::UnderFile => "archive_path_under_file",
            Self::TooManyEntries => "archive_too_many_entries",
            Self::TooLarge => "archive_too_large",
        }
    }

    /// The setting a bomb crossed (both bomb refusals name the workspace bound), or `None`.
    #[must_use]
    pub fn setting(self) -> Option<&'static str> {
        match self {
            Self::TooManyEntries | Self::TooLarge => Some(WORKSPACE_MAX_SETTING),
            _ => None,
        }
    }
}

/// What an accepted entry asks the shell to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// The workspace root itself (`.` or `./`): nothing to create.
    Root,
    /// A directory at this normalised relative path (parents created as needed).
    Directory(String),
    /// A regular file at this normalised relative path, of exactly this many bytes.
    File {
        /// Normalised relative path, `/`-separated, with no leading `./` or trailing `/`.
        path: String,
        /// The declared size, already counted against the bound.
        bytes: u64,
    },
}

/// What a path already names in the archive so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    File,
    Directory,
}

/// Judges the entries of one archive, in order, against one workspace bound.
///
/// Calling contract: one judge per archive; call [`judge`](Self::judge) for every entry before
/// writing it, and stop at the first refusal (the judge does not promise anything about entries
/// after one). The state is bounded: at most [`ARCHIVE_ENTRIES_MAX`] paths are remembered.
#[derive(Clone, Debug)]
pub struct ArchiveJudge {
    max_bytes: u64,
    bytes_total: u64,
    seen: BTreeMap<String, Seen>,
}

impl ArchiveJudge {
    /// A judge for an archive whose files may hold at most `max_bytes` together
    /// (`SANDBOX_WORKSPACE_MAX_BYTES`).
    #[must_use]
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            bytes_total: 0,
            seen: BTreeMap::new(),
        }
    }

    /// The declared file bytes accepted so far.
    #[must_use]
    pub fn bytes_total(&self) -> u64 {
        self.bytes_total
    }

    /// The distinct paths accepted so far (explicit and implied directories included).
    #[must_use]
    pub fn entries(&self) -> u32 {
        u32::try_from(self.seen.len()).unwrap_or(u32::MAX)
    }

    /// Judges one entry: its raw path bytes, its kind and its declared size in bytes.
    pub fn judge(
        &mut self,
        path: &[u8],
        kind: EntryKind,
        size_bytes: u64,
    ) -> Result<Accepted, Refused> {
        let normalised = normalise(path)?;
        match kind {
            EntryKind::File | EntryKind::Directory => {}
            EntryKind::Symlink => return Err(Refused::Symlink),
            EntryKind::HardLink => return Err(Refused::HardLink),
            EntryKind::Device => return Err(Refused::Device),
            EntryKind::Fifo => return Err(Refused::Fifo),
            EntryKind::Socket => return Err(Refused::Socket),
            EntryKind::Other => return Err(Refused::KindUnsupported),
        }
        if normalised.is_empty() {
            return if kind == EntryKind::Directory {
                Ok(Accepted::Root)
            } else {
                Err(Refused::PathEmpty)
            };
        }
        let accepted = self.place(normalised, kind, size_bytes)?;
        self.invariants();
        Ok(accepted)
    }

    /// Records `path` (and its implied parents) within the bounds.
    fn place(&mut self, path: &str, kind: EntryKind, size_bytes: u64) -> Result<Accepted, Refused> {
        // Check everything before recording anything, so that a refusal changes no state.
        let mut new_paths: u32 = 0;
        let mut end = 0;
        for component in path.split('/') {
            end += component.len();
            let prefix = &path[..end];
            end += 1;
            let is_last = prefix.len() == path.len();
            match (self.seen.get(prefix), is_last) {
                (Some(Seen::File), false) => return Err(Refused::UnderFile),
                (Some(Seen::File), true) => return Err(Refused::Duplicate),
                (Some(Seen::Directory), true) if kind == EntryKind::File => {
                    return Err(Refused::Duplicate);
                }
                (Some(Seen::Directory), _) => {}
                (None, _) => new_paths += 1,
            }
        }
        if self.entries().saturating_add(new_paths) > ARCHIVE_ENTRIES_MAX {
            return Err(Refused::TooManyEntries);
        }
        let bytes = if kind == EntryKind::File {
            size_bytes
        } else {
            0
        };
        let total = self.bytes_total.saturating_add(bytes);
        if total > self.max_bytes {
            return Err(Refused::TooLarge);
        }
        self.bytes_total = total;
        let mut end = 0;
        for component in path.split('/') {
            end += component.len();
            let prefix = &path[..end];
            end += 1;
            let seen = if prefix.len() == path.len() && kind == EntryKind::File {
                Seen::File
            } else {
                Seen::Directory
            };
            self.seen.entry(prefix.to_string()).or_insert(seen);
        }
        Ok(if kind == EntryKind::File {
            Accepted::File {
                path: path.to_string(),
                bytes,
            }
        } else {
            Accepted::Directory(path.to_string())
        })
    }

    /// The judge's bounds hold on both sides.
    fn invariants(&self) {
        assert!(
            self.bytes_total <= self.max_bytes,
            "archive bytes {} over the bound {}",
            self.bytes_total,
            self.max_bytes
        );
        assert!(
            self.seen.len() <= ARCHIVE_ENTRIES_MAX as usize,
            "archive paths over the bound"
        );
    }
}

/// The object-store key of the workspace of `actor` in `conversation` (WS-1): a SHA-256 over both
/// ids, each length-prefixed, under a context label, in hex. Two actors in one conversation, or one
/// actor in two, never share a key, and no id (whatever it holds: `/`, `..`, a separator) can
/// reach outside its own key: the key is 64 hex digits.
#[must_use]
pub fn storage_key(actor: &str, conversation: &str) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(b"corral-workspace-v1\0");
    for part in [actor, conversation] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    crate::ids::hex(&hash.finalize())
}

/// The prefix of a retained output's reference.
const OUTPUT_REFERENCE_PREFIX: &str = "output:";
/// The length of a run id: 16 random bytes in hex.
pub const RUN_ID_HEX_LEN: usize = 32;

/// The reference a run's validated output is known by once retained (OUT-1):
/// `output:<run id>/<path>`. It names the retained copy, which no later save of the workspace
/// changes or prunes, and it is metadata only: reading it needs the caller's credential and the
/// same actor and conversation.
#[must_use]
pub fn output_reference(run_id: &str, path: &str) -> String {
    format!("{OUTPUT_REFERENCE_PREFIX}{run_id}/{path}")
}

/// The run id and path of an output reference, when `text` is one: a run id of
/// [`RUN_ID_HEX_LEN`] lower-case hex digits and a path [`read_path`] accepts.
#[must_use]
pub fn parse_output_reference(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix(OUTPUT_REFERENCE_PREFIX)?;
    let (run_id, path) = rest.split_once('/')?;
    let run_id_ok = run_id.len() == RUN_ID_HEX_LEN
        && run_id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (run_id_ok && read_path(path).ok() == Some(path)).then_some((run_id, path))
}

/// The object name, under its workspace's [`storage_key`], of a retained output:
/// `<run id>/<sha256 of the path>`, so that no path can shape the name.
#[must_use]
pub fn output_object(run_id: &str, path: &str) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(b"corral-output-v1\0");
    hash.update(path.as_bytes());
    format!("{run_id}/{}", crate::ids::hex(&hash.finalize()))
}

/// Judges a path `read_workspace` (or an edit) is asked for (WS-4): the archive's own path rule,
/// so a path is readable exactly when an archive could hold it, and never the workspace root.
///
/// # Errors
/// The archive path refusal: absolute, `..`, empty or dot components, NUL, too long or deep.
pub fn read_path(path: &str) -> Result<&str, Refused> {
    match normalise(path.as_bytes())? {
        "" => Err(Refused::PathEmpty),
        normalised => Ok(normalised),
    }
}

/// Normalises an entry's path: one or more leading `./` and one trailing `/` are dropped; anything
/// else that is not a plain relative component is refused. Returns `""` for the root.
pub fn normalise(path: &[u8]) -> Result<&str, Refused> {
    // Length first, so that no later step does unbounded work.
    if path.len() > ARCHIVE_PATH_BYTES_MAX + 2 {
        return Err(Refused::PathTooLong);
    }
    if path.contains(&0) {
        return Err(Refused::PathNul);
    }
    let text = std::str::from_utf8(path).map_err(|_| Refused::PathNotUtf8)?;
    if text.starts_with('/') {
        return Err(Refused::PathAbsolute);
    }
    if text.is_empty() {
        return Err(Refused::PathEmpty);
    }
    let mut rest = text;
    while let Some(stripped) = rest.strip_prefix("./") {
        rest = stripped;
    }
    if rest == "." {
        rest = "";
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Ok("");
    }
    if rest.len() > ARCHIVE_PATH_BYTES_MAX {
        return Err(Refused::PathTooLong);
    }
    let mut depth = 0;
    for component in rest.split('/') {
        depth += 1;
        match component {
            ".." => return Err(Refused::PathParent),
            "" | "." => return Err(Refused::PathDotOrEmptyComponent),
            _ if component.len() > ARCHIVE_COMPONENT_BYTES_MAX => {
                return Err(Refused::PathTooLong);
            }
            _ => {}
        }
    }
    if depth > ARCHIVE_DEPTH_MAX {
        return Err(Refused::PathTooDeep);
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn file(judge: &mut ArchiveJudge, path: &str, bytes: u64) -> Result<Accepted, Refused> {
        judge.judge(path.as_bytes(), EntryKind::File, bytes)
    }

    #[test]
    fn ws_04_only_plain_relative_paths_are_accepted() {
        let mut judge = ArchiveJudge::new(8 * MIB);
        for (path, refused) in [
            ("/etc/passwd", Refused::PathAbsolute),
            ("../x", Refused::PathParent),
            ("a/../../x", Refused::PathParent),
            ("a/..", Refused::PathParent),
            ("a//b", Refused::PathDotOrEmptyComponent),
            ("a/./b", Refused::PathDotOrEmptyComponent),
            ("", Refused::PathEmpty),
            ("./", Refused::PathEmpty),
            ("a\0b", Refused::PathNul),
        ] {
            assert_eq!(file(&mut judge, path, 1), Err(refused), "{path:?}");
        }
        assert_eq!(
            judge.judge(b"a\xffb", EntryKind::File, 1),
            Err(Refused::PathNotUtf8)
        );
        let long = "a".repeat(ARCHIVE_COMPONENT_BYTES_MAX + 1);
        assert_eq!(file(&mut judge, &long, 1), Err(Refused::PathTooLong));
        let longer = ["abcdefgh"; 200].join("/");
        assert_eq!(file(&mut judge, &longer, 1), Err(Refused::PathTooLong));
        let deep = ["d"; ARCHIVE_DEPTH_MAX + 1].join("/");
        assert_eq!(file(&mut judge, &deep, 1), Err(Refused::PathTooDeep));
        // Nothing refused was recorded.
        assert_eq!((judge.entries(), judge.bytes_total()), (0, 0));
        assert_eq!(
            file(&mut judge, "./src/main.py", 10),
            Ok(Accepted::File {
                path: "src/main.py".into(),
                bytes: 10
            })
        );
        assert_eq!(
            judge.judge(b"./", EntryKind::Directory, 0),
            Ok(Accepted::Root)
        );
        assert_eq!(
            judge.judge(b"src/", EntryKind::Directory, 0),
            Ok(Accepted::Directory("src".into()))
        );
        assert_eq!((judge.entries(), judge.bytes_total()), (2, 10));
    }

    #[test]
    fn ws_04_links_devices_and_special_files_are_refused() {
        let mut judge = ArchiveJudge::new(8 * MIB);
        for (kind, refused) in [
            (EntryKind::Symlink, Refused::Symlink),
            (EntryKind::HardLink, Refused::HardLink),
            (EntryKind::Device, Refused::Device),
            (EntryKind::Fifo, Refused::Fifo),
            (EntryKind::Socket, Refused::Socket),
            (EntryKind::Other, Refused::KindUnsupported),
        ] {
            assert_eq!(judge.judge(b"inside", kind, 0), Err(refused));
        }
    }

    #[test]
    fn duplicates_and_paths_under_files_are_refused() {
        let mut judge = ArchiveJudge::new(8 * MIB);
        assert!(file(&mut judge, "a", 1).is_ok());
        assert_eq!(file(&mut judge, "a", 1), Err(Refused::Duplicate));
        assert_eq!(file(&mut judge, "a/b", 1), Err(Refused::UnderFile));
        assert_eq!(
            judge.judge(b"a/", EntryKind::Directory, 0),
            Err(Refused::Duplicate)
        );
        assert!(file(&mut judge, "d/x", 1).is_ok());
        // A directory may be listed after its contents, and twice.
        assert!(judge.judge(b"d", EntryKind::Directory, 0).is_ok());
        assert!(judge.judge(b"d/", EntryKind::Directory, 0).is_ok());
        assert_eq!(file(&mut judge, "d", 1), Err(Refused::Duplicate));
    }

    #[test]
    fn bound_1_a_bomb_is_refused_at_the_entry_that_crosses_the_bound() {
        let mut judge = ArchiveJudge::new(MIB);
        assert!(file(&mut judge, "a", MIB - 1).is_ok());
        assert!(file(&mut judge, "b", 1).is_ok());
        assert_eq!(file(&mut judge, "c", 1), Err(Refused::TooLarge));
        assert_eq!(file(&mut judge, "huge", u64::MAX), Err(Refused::TooLarge));
        assert_eq!(Refused::TooLarge.setting(), Some(WORKSPACE_MAX_SETTING));
        // Empty files still count as entries.
        let mut judge = ArchiveJudge::new(MIB);
        for index in 0..ARCHIVE_ENTRIES_MAX {
            assert!(file(&mut judge, &format!("f{index}"), 0).is_ok());
        }
        assert_eq!(
            file(&mut judge, "one-more", 0),
            Err(Refused::TooManyEntries)
        );
        assert_eq!(
            Refused::TooManyEntries.setting(),
            Some(WORKSPACE_MAX_SETTING)
        );
    }

    #[test]
    fn implied_directories_count_as_entries() {
        let mut judge = ArchiveJudge::new(MIB);
        for index in 0..ARCHIVE_ENTRIES_MAX / 2 {
            assert!(file(&mut judge, &format!("d{index}/f"), 0).is_ok());
        }
        assert_eq!(judge.entries(), ARCHIVE_ENTRIES_MAX);
        assert_eq!(file(&mut judge, "x", 0), Err(Refused::TooManyEntries));
    }

    #[test]
    fn codes_are_distinct() {
        let all = [
            Refused::PathEmpty,
            Refused::PathAbsolute,
            Refused::PathParent,
            Refused::PathDotOrEmptyComponent,
            Refused::PathNul,
            Refused::PathNotUtf8,
            Refused::PathTooLong,
            Refused::PathTooDeep,
            Refused::Symlink,
            Refused::HardLink,
            Refused::Device,
            Refused::Fifo,
            Refused::Socket,
            Refused::KindUnsupported,
            Refused::Duplicate,
            Refused::UnderFile,
            Refused::TooManyEntries,
            Refused::TooLarge,
        ];
        let codes: std::collections::BTreeSet<_> = all.iter().map(|r| r.code()).collect();
        assert_eq!(codes.len(), all.len());
    }
}

#[cfg(test)]
mod storage_tests {
    use super::*;

    #[test]
    fn ws_01_every_actor_and_conversation_pair_has_its_own_key() {
        let pairs = [
            ("alice", "c1"),
            ("bob", "c1"),
            ("alice", "c2"),
            ("alic", "ec1"),
            ("alice\u{0}c", "1"),
            ("a/../b", "c"),
            ("", "alicec1"),
        ];
        let keys: std::collections::BTreeSet<String> =
            pairs.iter().map(|(a, c)| storage_key(a, c)).collect();
        assert_eq!(keys.len(), pairs.len(), "two pairs share a key");
        for key in &keys {
            assert_eq!(key.len(), 64);
            assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_eq!(storage_key("alice", "c1"), storage_key("alice", "c1"));
    }

    #[test]
    fn ws_04_read_paths_are_relative_and_inside() {
        assert_eq!(read_path("out/report.pdf"), Ok("out/report.pdf"));
        assert_eq!(read_path("./a.txt"), Ok("a.txt"));
        assert_eq!(read_path("/etc/passwd"), Err(Refused::PathAbsolute));
        assert_eq!(read_path("../x"), Err(Refused::PathParent));
        assert_eq!(read_path("a/../../x"), Err(Refused::PathParent));
        assert_eq!(read_path(""), Err(Refused::PathEmpty));
        assert_eq!(read_path("."), Err(Refused::PathEmpty));
        assert_eq!(read_path("a//b"), Err(Refused::PathDotOrEmptyComponent));
    }
}
