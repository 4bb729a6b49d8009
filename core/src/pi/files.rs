//! The proposed package's file set as the server holds it (PI-1): bounded in count and bytes,
//! one canonical relative path per file, text where text is expected, nothing installed.
//!
//! A file set is what the worker stages, twice (the test tree and the validation tree), and what
//! the trusted side reads static resources from: never the tree the authored code ran in.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Refusal, RefusalCode};

/// The most files a package may have.
pub const FILES_MAX: usize = 256;
/// The most bytes all of a package's files may have together.
pub const BYTES_MAX: u64 = 4 << 20;
/// The most bytes one file may have.
pub const FILE_MAX_BYTES: u64 = 1 << 20;

/// Extensions of files that must be UTF-8 text with no NUL: what the loader, the tests and the
/// static checks read as text.
pub const TEXT_EXTENSIONS: [&str; 14] = [
    "json", "md", "markdown", "txt", "js", "mjs", "cjs", "ts", "mts", "cts", "yaml", "yml", "toml",
    "jsonc",
];

/// One file of a proposed package: its path and its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageFile {
    /// The path, relative to the package's root.
    pub path: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// A file set that passed [`check_files`]: every path canonical and unique, every text file UTF-8.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSet {
    files: BTreeMap<String, Vec<u8>>,
}

impl FileSet {
    /// The files, in path order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.files.iter().map(|(p, b)| (p.as_str(), b.as_slice()))
    }

    /// The file at `path`.
    #[must_use]
    pub fn get(&self, path: &str) -> Option<&[u8]> {
        self.files.get(path).map(Vec::as_slice)
    }

    /// The text of the file at `path` (text files were checked to be UTF-8).
    #[must_use]
    pub fn text(&self, path: &str) -> Option<&str> {
        self.get(path).and_then(|b| std::str::from_utf8(b).ok())
    }

    /// Whether `path` is a directory of the set: some file lies under it.
    #[must_use]
    pub fn is_dir(&self, path: &str) -> bool {
        let prefix = format!("{path}/");
        self.files
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(p, _)| p.starts_with(&prefix))
    }

    /// The files under the directory `dir` (every depth), in path order.
    pub fn under<'a>(&'a self, dir: &str) -> impl Iterator<Item = &'a str> + 'a {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        self.files
            .keys()
            .filter(move |p| p.starts_with(&prefix))
            .map(String::as_str)
    }

    /// How many files.
    #[must_use]
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Their bytes, together.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.files.values().map(|b| b.len() as u64).sum()
    }
}

/// Whether `path` names a file that must be text.
#[must_use]
pub fn expects_text(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.rsplit_once('.')
        .is_some_and(|(_, ext)| TEXT_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str()))
}

/// Checks a proposed file set: count and bytes first (so that no later rule does unbounded work),
/// then each path (canonical, relative, inside, no control character, not `node_modules`, no file
/// that is also another's directory, no duplicate), then text where text is expected.
///
/// # Errors
/// The first rule broken, naming the file.
pub fn check_files(files: Vec<PackageFile>) -> Result<FileSet, Refusal> {
    if files.is_empty() {
        return Err(Refusal::new(
            RefusalCode::PackageIdentityInvalid,
            "the package has no files",
        ));
    }
    if files.len() > FILES_MAX {
        return Err(Refusal::new(
            RefusalCode::PackageTooLarge,
            format!("{} files; a package has at most {FILES_MAX}", files.len()),
        ));
    }
    let mut total = 0u64;
    for file in &files {
        let size = file.bytes.len() as u64;
        if size > FILE_MAX_BYTES {
            return Err(Refusal::at(
                RefusalCode::PackageTooLarge,
                &file.path,
                format!("{size} bytes; a file has at most {FILE_MAX_BYTES}"),
            ));
        }
        total += size;
    }
    if total > BYTES_MAX {
        return Err(Refusal::new(
            RefusalCode::PackageTooLarge,
            format!("{total} bytes in all; a package has at most {BYTES_MAX}"),
        ));
    }
    let mut set = BTreeMap::new();
    for file in files {
        check_path(&file.path)?;
        if expects_text(&file.path) && !is_text(&file.bytes) {
            return Err(Refusal::at(
                RefusalCode::PackageFileNotText,
                &file.path,
                "expected UTF-8 text with no NUL byte",
            ));
        }
        if set.contains_key(&file.path) {
            return Err(Refusal::at(
                RefusalCode::PackagePathDuplicate,
                &file.path,
                "the path is given twice",
            ));
        }
        set.insert(file.path, file.bytes);
    }
    // A file that is also a directory of another: no tree can hold both.
    let dirs: BTreeSet<&str> = set
        .keys()
        .flat_map(|p| p.match_indices('/').map(move |(i, _)| &p[..i]))
        .collect();
    if let Some(both) = set.keys().find(|p| dirs.contains(p.as_str())) {
        return Err(Refusal::at(
            RefusalCode::PackagePathDuplicate,
            both,
            "the path is both a file and a directory",
        ));
    }
    Ok(FileSet { files: set })
}

/// One path's rules: the workspace archive's (relative, no `..`, no empty or dot component,
/// bounded length and depth), given in canonical form, with no control character, and nothing
/// under `node_modules` (dependencies are installed through the broker, never shipped).
fn check_path(path: &str) -> Result<(), Refusal> {
    let refuse = |why: &str| Err(Refusal::at(RefusalCode::PackagePathInvalid, path, why));
    if path.chars().any(char::is_control) {
        return refuse("a control character");
    }
    match crate::workspace::read_path(path) {
        Ok(canonical) if canonical == path => {}
        Ok(_) => return refuse("not in canonical form (no `./` prefix, no trailing `/`)"),
        Err(refused) => return refuse(refused.code()),
    }
    if path.contains('\\') {
        return refuse("a backslash");
    }
    if path.split('/').any(|part| part == "node_modules") {
        return refuse("dependencies are installed through the broker, never shipped");
    }
    Ok(())
}

/// Whether `bytes` are UTF-8 with no NUL.
fn is_text(bytes: &[u8]) -> bool {
    !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> PackageFile {
        PackageFile {
            path: path.to_owned(),
            bytes: text.as_bytes().to_vec(),
        }
    }

    fn code(files: Vec<PackageFile>) -> RefusalCode {
        check_files(files).expect_err("refused").code
    }

    #[test]
    fn paths_must_be_canonical_relative_and_inside() {
        for path in [
            "/etc/passwd",
            "../x",
            "a/../b",
            "./a",
            "a//b",
            "a/",
            "a\\b",
            "a\nb",
            "node_modules/x/index.js",
            "",
        ] {
            assert_eq!(
                code(vec![file(path, "x")]),
                RefusalCode::PackagePathInvalid,
                "{path:?}"
            );
        }
    }

    #[test]
    fn duplicates_and_file_directory_clashes_are_refused() {
        assert_eq!(
            code(vec![file("a.md", "x"), file("a.md", "y")]),
            RefusalCode::PackagePathDuplicate
        );
        assert_eq!(
            code(vec![file("a", "x"), file("a/b.md", "y")]),
            RefusalCode::PackagePathDuplicate
        );
    }

    #[test]
    fn text_is_required_where_text_is_expected_and_binary_allowed_elsewhere() {
        let binary = PackageFile {
            path: "index.js".to_owned(),
            bytes: vec![0x7f, b'E', b'L', b'F', 0, 0xff],
        };
        assert_eq!(code(vec![binary.clone()]), RefusalCode::PackageFileNotText);
        let image = PackageFile {
            path: "assets/logo.png".to_owned(),
            ..binary
        };
        assert!(check_files(vec![image]).is_ok());
    }

    #[test]
    fn counts_and_bytes_are_bounded() {
        let many = (0..=FILES_MAX)
            .map(|i| file(&format!("f{i}.txt"), "x"))
            .collect();
        assert_eq!(code(many), RefusalCode::PackageTooLarge);
        let big = PackageFile {
            path: "big.txt".to_owned(),
            bytes: vec![b'x'; usize::try_from(FILE_MAX_BYTES).unwrap() + 1],
        };
        assert_eq!(code(vec![big]), RefusalCode::PackageTooLarge);
        let half = usize::try_from(FILE_MAX_BYTES).unwrap();
        let five = (0..5)
            .map(|i| PackageFile {
                path: format!("part{i}.txt"),
                bytes: vec![b'x'; half],
            })
            .collect();
        assert_eq!(code(five), RefusalCode::PackageTooLarge);
    }

    #[test]
    fn a_set_answers_for_its_directories() {
        let set = check_files(vec![
            file("skills/a/SKILL.md", "x"),
            file("package.json", "{}"),
        ])
        .expect("accepted");
        assert!(set.is_dir("skills"));
        assert!(set.is_dir("skills/a"));
        assert!(!set.is_dir("skill"));
        assert_eq!(
            set.under("skills").collect::<Vec<_>>(),
            ["skills/a/SKILL.md"]
        );
    }
}
