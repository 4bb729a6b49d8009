//! Workspace archives, one test per attack (issue 4 item 4): each asserts the refusal's stable code
//! and that nothing was written, in the target or beside it. These need no root: they drive
//! `corral_worker::archive` directly on temporary directories.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use common::TempDir;
use corral_worker::archive::{self, ArchiveError};

const MIB: u64 = 1024 * 1024;

/// How an entry is written into a test archive. Raw headers, so that the archive can say what a
/// well-behaved writer (the tar crate refuses `..` and absolute paths) never would.
enum Item<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    CharDevice(&'a str),
    /// A file header declaring `size` bytes, followed by whatever data there is.
    Declared(&'a str, u64),
}

fn header(path: &str, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    let name = &mut header.as_gnu_mut().unwrap().name;
    assert!(path.len() < name.len());
    name[..path.len()].copy_from_slice(path.as_bytes());
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(0o644);
    header
}

fn set_link(header: &mut tar::Header, target: &str) {
    let link = &mut header.as_gnu_mut().unwrap().linkname;
    link[..target.len()].copy_from_slice(target.as_bytes());
}

fn archive(items: &[Item<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for item in items {
        let (mut header, data): (tar::Header, &[u8]) = match item {
            Item::File(path, data) => (
                header(path, tar::EntryType::Regular, data.len() as u64),
                data,
            ),
            Item::Dir(path) => (header(path, tar::EntryType::Directory, 0), b""),
            Item::Symlink(path, target) => {
                let mut h = header(path, tar::EntryType::Symlink, 0);
                set_link(&mut h, target);
                (h, b"")
            }
            Item::HardLink(path, target) => {
                let mut h = header(path, tar::EntryType::Link, 0);
                set_link(&mut h, target);
                (h, b"")
            }
            Item::CharDevice(path) => {
                let mut h = header(path, tar::EntryType::Char, 0);
                h.set_device_major(1).unwrap();
                h.set_device_minor(3).unwrap();
                (h, b"")
            }
            Item::Declared(path, size) => (header(path, tar::EntryType::Regular, *size), b""),
        };
        header.set_cksum();
        // `append` writes the header as given; a declared size longer than the data is written
        // as a truncated archive below.
        if let Item::Declared(..) = item {
            builder.get_mut().extend_from_slice(header.as_bytes());
        } else {
            builder.append(&header, data).unwrap();
        }
    }
    builder.into_inner().unwrap()
}

/// Every path under `dir`, sorted, with the content of each file.
fn listing(dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in fs::read_dir(&current).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                pending.push(path);
                found.push((name, None));
            } else {
                found.push((name, Some(fs::read(&path).unwrap_or_default())));
            }
        }
    }
    found.sort();
    found
}

/// A parent with a workspace holding one file, for refusals to leave untouched.
struct Fixture {
    parent: TempDir,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let parent = TempDir::new(name);
        let workspace = parent.path().join("workspace");
        fs::create_dir(&workspace).unwrap();
        fs::write(workspace.join("before.txt"), b"as it was").unwrap();
        Self { parent }
    }

    fn workspace(&self) -> std::path::PathBuf {
        self.parent.path().join("workspace")
    }

    /// Unpacks and expects a refusal with `code`; then checks that the workspace is exactly as
    /// before and that nothing else is beside it (no staging directory left).
    fn refused(&self, bytes: &[u8], code: &str) -> ArchiveError {
        let before = listing(self.parent.path());
        let error = archive::unpack(bytes, &self.workspace(), 8 * MIB).unwrap_err();
        assert_eq!(error.code(), code, "{error}");
        assert_eq!(listing(self.parent.path()), before, "something was written");
        error
    }
}

#[test]
fn ws_04_absolute_path_is_refused() {
    let fixture = Fixture::new("absolute");
    let marker = format!("/tmp/corral-archive-absolute-{}", std::process::id());
    fixture.refused(
        &archive(&[Item::File(&marker, b"escaped")]),
        "archive_path_absolute",
    );
    assert!(!Path::new(&marker).exists());
}

#[test]
fn ws_04_parent_traversal_is_refused() {
    let fixture = Fixture::new("traversal");
    fixture.refused(
        &archive(&[
            Item::File("ok.txt", b"x"),
            Item::File("../escaped.txt", b"x"),
        ]),
        "archive_path_parent",
    );
    fixture.refused(
        &archive(&[Item::File("a/../../escaped.txt", b"x")]),
        "archive_path_parent",
    );
}

#[test]
fn ws_04_symlink_pointing_out_is_refused() {
    let fixture = Fixture::new("symlink");
    fixture.refused(
        &archive(&[Item::Symlink("passwd", "/etc/passwd")]),
        "archive_symlink",
    );
    // Even one that stays inside: every link is refused (see corral_core::workspace).
    fixture.refused(
        &archive(&[Item::File("a", b"x"), Item::Symlink("b", "a")]),
        "archive_symlink",
    );
}

#[test]
fn ws_04_file_written_through_a_symlinked_directory_is_refused() {
    let fixture = Fixture::new("symlinked-dir");
    let outside = TempDir::new("outside");
    let target = outside.path().display().to_string();
    fixture.refused(
        &archive(&[
            Item::Symlink("d", &target),
            Item::File("d/planted.txt", b"escaped"),
        ]),
        "archive_symlink",
    );
    assert!(fs::read_dir(outside.path()).unwrap().next().is_none());
}

#[test]
fn ws_04_hard_link_is_refused() {
    let fixture = Fixture::new("hardlink");
    fixture.refused(
        &archive(&[Item::HardLink("shadow", "/etc/shadow")]),
        "archive_hard_link",
    );
}

#[test]
fn ws_04_device_file_is_refused() {
    let fixture = Fixture::new("device");
    fixture.refused(&archive(&[Item::CharDevice("null")]), "archive_device");
}

#[test]
fn bound_1_bomb_of_many_small_entries_is_refused_naming_the_bound() {
    let fixture = Fixture::new("many");
    let names: Vec<String> = (0..=corral_core::workspace::ARCHIVE_ENTRIES_MAX)
        .map(|i| format!("f{i}"))
        .collect();
    let items: Vec<Item<'_>> = names.iter().map(|n| Item::File(n, b"")).collect();
    let error = fixture.refused(&archive(&items), "archive_too_many_entries");
    assert_eq!(error.setting(), Some("SANDBOX_WORKSPACE_MAX_BYTES"));
}

#[test]
fn bound_1_bomb_of_one_huge_declared_size_is_refused_naming_the_bound() {
    let fixture = Fixture::new("huge");
    let error = fixture.refused(
        &archive(&[Item::File("ok", b"x"), Item::Declared("huge", 1 << 40)]),
        "archive_too_large",
    );
    assert_eq!(error.setting(), Some("SANDBOX_WORKSPACE_MAX_BYTES"));
    assert!(error.to_string().contains("SANDBOX_WORKSPACE_MAX_BYTES"));
    // Sizes that each fit but sum over the bound.
    let chunk = vec![7u8; 3 * MIB as usize];
    fixture.refused(
        &archive(&[
            Item::File("a", &chunk),
            Item::File("b", &chunk),
            Item::File("c", &chunk),
        ]),
        "archive_too_large",
    );
}

#[test]
fn ws_05_refused_archive_leaves_nothing() {
    let fixture = Fixture::new("nothing");
    // Good entries first, so that the refusal comes after files were staged.
    fixture.refused(
        &archive(&[
            Item::Dir("src"),
            Item::File("src/main.py", b"print(1)"),
            Item::File("before.txt", b"replaced"),
            Item::CharDevice("src/null"),
        ]),
        "archive_device",
    );
    // A truncated archive is refused the same way.
    fixture.refused(
        &archive(&[Item::File("ok", b"x"), Item::Declared("short", 4096)]),
        "archive_malformed",
    );
    assert_eq!(
        fs::read(fixture.workspace().join("before.txt")).unwrap(),
        b"as it was"
    );
}

#[test]
fn ws_04_valid_archive_round_trip() {
    let fixture = Fixture::new("round-trip");
    let packed_in = archive(&[
        Item::Dir("./"),
        Item::Dir("data"),
        Item::File("data/input.txt", b"hello"),
        Item::File("./main.py", b"print(open('data/input.txt').read())"),
        Item::File("deep/er/file.bin", &[0, 1, 2, 255]),
    ]);
    let unpacked = archive::unpack(&packed_in, &fixture.workspace(), 8 * MIB).unwrap();
    assert_eq!(unpacked.bytes, 5 + 36 + 4);
    // The old contents were replaced, not merged.
    assert!(!fixture.workspace().join("before.txt").exists());
    assert_eq!(
        fs::read(fixture.workspace().join("data/input.txt")).unwrap(),
        b"hello"
    );
    // What a run would do: read one file, write another, leave a link that must not travel.
    let input = fs::read(fixture.workspace().join("data/input.txt")).unwrap();
    fs::write(
        fixture.workspace().join("data/output.txt"),
        [input.as_slice(), b" world"].concat(),
    )
    .unwrap();
    symlink("/etc/passwd", fixture.workspace().join("passwd")).unwrap();
    let packed = archive::pack(&fixture.workspace(), 8 * MIB).unwrap();
    assert_eq!(packed.skipped, 1, "the link is left out");
    let again = TempDir::new("round-trip-again");
    let target = again.path().join("workspace");
    archive::unpack(&packed.archive, &target, 8 * MIB).unwrap();
    let mut expected = listing(&fixture.workspace());
    expected.retain(|(name, _)| name != "passwd");
    assert_eq!(listing(&target), expected);
    assert_eq!(
        fs::read(target.join("data/output.txt")).unwrap(),
        b"hello world"
    );
}

#[test]
fn bound_1_packing_over_the_bound_is_an_error_naming_it() {
    let dir = TempDir::new("pack-over");
    fs::write(dir.path().join("a"), vec![1u8; 600 * 1024]).unwrap();
    fs::write(dir.path().join("b"), vec![2u8; 600 * 1024]).unwrap();
    let error = archive::pack(dir.path(), MIB).unwrap_err();
    assert_eq!(error, ArchiveError::TooLarge { max_bytes: MIB });
    assert!(error.to_string().contains("SANDBOX_WORKSPACE_MAX_BYTES"));
    // A sparse file's apparent size counts: it would unpack at that size.
    let sparse = TempDir::new("pack-sparse");
    let file = fs::File::create(sparse.path().join("sparse")).unwrap();
    file.set_len(1 << 40).unwrap();
    assert_eq!(
        archive::pack(sparse.path(), MIB).unwrap_err(),
        ArchiveError::TooLarge { max_bytes: MIB }
    );
}

#[test]
fn ws_04_long_names_round_trip() {
    // Past the 100 bytes of a plain tar header: the pack writes GNU long-name entries, and the
    // unpack reads them and judges the full path.
    let dir = TempDir::new("long-names");
    let source = dir.path().join("source");
    let long_dir = source.join("d".repeat(120));
    fs::create_dir_all(&long_dir).unwrap();
    fs::write(long_dir.join("f".repeat(140)), b"long").unwrap();
    let packed = archive::pack(&source, MIB).unwrap();
    let target = dir.path().join("target");
    archive::unpack(&packed.archive, &target, MIB).unwrap();
    assert_eq!(listing(&target), listing(&source));
}
