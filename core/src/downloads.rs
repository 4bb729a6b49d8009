//! Which files a run returns, and whether a document is what its name says (WS-4, WS-6, OUT-4).
//!
//! A run's typed download list holds only regular files inside the workspace that the run created
//! or changed, or that it declared; never a symlink, a directory, a device or anything outside the
//! workspace. A `.pdf`, `.docx`, `.pptx` or `.xlsx` is structurally verified first, and an invalid
//! one is left out with a bounded diagnostic. The worker walks the workspace (without following
//! links) and reads the files; this module decides.

use std::collections::BTreeMap;

/// The identity and size of a regular file at one moment: if any of these differ between the
/// snapshot before the run and the one after, the run created or changed the file. The status
/// change time cannot be set by the code, so restoring a modification time does not hide a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    /// Size in bytes.
    pub bytes: u64,
    /// Modification time, nanoseconds since the epoch.
    pub modified_ns: i128,
    /// Status change time, nanoseconds since the epoch.
    pub changed_ns: i128,
    /// Inode number.
    pub inode: u64,
}

/// One entry of a workspace snapshot, as `lstat` saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A regular file.
    File(FileStamp),
    /// A directory.
    Directory,
    /// A symbolic link (never followed, never returned).
    Symlink,
    /// A device, socket or pipe (never returned).
    Other,
}

/// A snapshot of a workspace: relative paths (`/`-separated, as [`relative_path`] accepts them)
/// to what each was.
pub type Snapshot = BTreeMap<String, Entry>;

/// Why a path given by a caller is not a workspace path (WS-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathRefusal {
    /// Empty, or only separators.
    Empty,
    /// Starts with `/`.
    Absolute,
    /// Has a `..` component.
    ParentComponent,
    /// Has a NUL or another control character.
    ControlCharacter,
    /// Longer than [`RELATIVE_PATH_MAX_BYTES`].
    TooLong,
}

impl PathRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Empty => "path_empty",
            Self::Absolute => "path_absolute",
            Self::ParentComponent => "path_parent_component",
            Self::ControlCharacter => "path_control_character",
            Self::TooLong => "path_too_long",
        }
    }
}

/// The longest relative path accepted, in bytes (Linux's `PATH_MAX`).
pub const RELATIVE_PATH_MAX_BYTES: usize = 4_096;

/// `text` as a normalized workspace-relative path: no leading `/`, no `..`, no empty or `.`
/// components, no control characters (WS-4).
///
/// # Errors
/// The first rule `text` breaks.
pub fn relative_path(text: &str) -> Result<String, PathRefusal> {
    if text.len() > RELATIVE_PATH_MAX_BYTES {
        return Err(PathRefusal::TooLong);
    }
    if text.chars().any(char::is_control) {
        return Err(PathRefusal::ControlCharacter);
    }
    if text.starts_with('/') {
        return Err(PathRefusal::Absolute);
    }
    let mut parts = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(PathRefusal::ParentComponent),
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        return Err(PathRefusal::Empty);
    }
    Ok(parts.join("/"))
}

/// The files a run offers for download: regular files in `after` that are new or changed since
/// `before`, plus declared names that are regular files in `after`, in path order, less a
/// persistent kernel's own files. A declaration
/// grants nothing else (WS-7): a declared symlink, directory or missing file is not offered.
#[must_use]
pub fn candidates(before: &Snapshot, after: &Snapshot, declared: &[String]) -> Vec<String> {
    let mut chosen: Vec<String> = Vec::new();
    for (path, entry) in after {
        let Entry::File(stamp) = entry else {
            continue;
        };
        // A persistent kernel's checkpoint is its own, never an output (KER-2).
        if crate::kernel::is_kernel_path(path) {
            continue;
        }
        let unchanged = matches!(before.get(path), Some(Entry::File(old)) if old == stamp);
        let was_declared = declared
            .iter()
            .any(|name| relative_path(name).is_ok_and(|name| &name == path));
        if !unchanged || was_declared {
            chosen.push(path.clone());
        }
    }
    chosen
}

/// The declared outputs that promise a verified document (.pdf, .docx, .pptx, .xlsx) and are not
/// among the `delivered` downloads: a run asked for such a file reports success only with a
/// durable attachment of it (OUT-4). Declared names that are not valid relative paths count as
/// undelivered when they promise a document.
#[must_use]
pub fn undelivered_documents<'a>(declared: &'a [String], delivered: &[&str]) -> Vec<&'a str> {
    declared
        .iter()
        .filter(|name| DocumentKind::of(name).is_some())
        .filter(|name| relative_path(name).map_or(true, |path| !delivered.contains(&path.as_str())))
        .map(String::as_str)
        .collect()
}

/// A kind of document this module verifies (OUT-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocumentKind {
    /// `.pdf`
    Pdf,
    /// `.docx`
    Docx,
    /// `.pptx`
    Pptx,
    /// `.xlsx`
    Xlsx,
}

impl DocumentKind {
    /// The kind a path's extension (in any case) promises, if any.
    #[must_use]
    pub fn of(path: &str) -> Option<Self> {
        match extension(path)?.as_str() {
            "pdf" => Some(Self::Pdf),
            "docx" => Some(Self::Docx),
            "pptx" => Some(Self::Pptx),
            "xlsx" => Some(Self::Xlsx),
            _ => None,
        }
    }

    /// The OOXML main part the package must hold, for the three OOXML kinds.
    #[must_use]
    pub fn main_part(self) -> Option<&'static str> {
        match self {
            Self::Pdf => None,
            Self::Docx => Some("word/document.xml"),
            Self::Pptx => Some("ppt/presentation.xml"),
            Self::Xlsx => Some("xl/workbook.xml"),
        }
    }
}

/// The lower-cased extension of the last component of `path`.
fn extension(path: &str) -> Option<String> {
    let name = path.rsplit('/').next()?;
    let (stem, extension) = name.rsplit_once('.')?;
    if stem.is_empty() {
        return None;
    }
    Some(extension.to_ascii_lowercase())
}

/// The media type a download is labelled with, from its extension.
#[must_use]
pub fn media_type(path: &str) -> &'static str {
    let Some(extension) = extension(path) else {
        return "application/octet-stream";
    };
    match extension.as_str() {
        "pdf" => "application/pdf",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "json" => "application/json",
        "html" | "htm" => "text/html",
        "xml" => "application/xml",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "zip" => "application/zip",
        "py" => "text/x-python",
        "js" => "text/javascript",
        _ => "application/octet-stream",
    }
}

/// Why a document failed verification. The codes are stable and the text is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidDocument {
    /// A `.pdf` that does not start with `%PDF-`.
    PdfHeaderMissing,
    /// A `.pdf` without `%%EOF` in its last [`PDF_EOF_WINDOW_BYTES`].
    PdfEndMarkerMissing,
    /// An OOXML file that is not a readable ZIP archive.
    NotZip,
    /// A ZIP archive that needs ZIP64, which no document within the artifact bound does.
    Zip64,
    /// An OOXML package without `[Content_Types].xml`.
    ContentTypesMissing,
    /// An OOXML package without its main part (`word/document.xml` and so on).
    MainPartMissing,
}

impl InvalidDocument {
    /// Every fault.
    pub const ALL: [InvalidDocument; 6] = [
        Self::PdfHeaderMissing,
        Self::PdfEndMarkerMissing,
        Self::NotZip,
        Self::Zip64,
        Self::ContentTypesMissing,
        Self::MainPartMissing,
    ];

    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::PdfHeaderMissing => "pdf_header_missing",
            Self::PdfEndMarkerMissing => "pdf_end_marker_missing",
            Self::NotZip => "ooxml_not_zip",
            Self::Zip64 => "ooxml_zip64_unsupported",
            Self::ContentTypesMissing => "ooxml_content_types_missing",
            Self::MainPartMissing => "ooxml_main_part_missing",
        }
    }
}

// On the wire a fault is its code (`pdf_header_missing`, ...).
wire_code!(InvalidDocument, code, "a document check");

/// How far from the end of a PDF its `%%EOF` marker may be (trailing whitespace and the odd
/// appended byte are common; a marker buried mid-file is not an end marker).
pub const PDF_EOF_WINDOW_BYTES: usize = 1_024;

/// Verifies `bytes` as a document of `kind` (OUT-4): a PDF's header and end marker; an OOXML
/// package's ZIP central directory, its `[Content_Types].xml` and its main part, each with a local
/// header where the directory says.
///
/// # Errors
/// The first structural fault found.
pub fn verify_document(kind: DocumentKind, bytes: &[u8]) -> Result<(), InvalidDocument> {
    match kind.main_part() {
        None => verify_pdf(bytes),
        Some(main_part) => {
            let names = zip_entry_names(bytes)?;
            if !names.iter().any(|name| name == "[Content_Types].xml") {
                return Err(InvalidDocument::ContentTypesMissing);
            }
            if !names.iter().any(|name| name == main_part) {
                return Err(InvalidDocument::MainPartMissing);
            }
            Ok(())
        }
    }
}

fn verify_pdf(bytes: &[u8]) -> Result<(), InvalidDocument> {
    if !bytes.starts_with(b"%PDF-") {
        return Err(InvalidDocument::PdfHeaderMissing);
    }
    let tail = &bytes[bytes.len().saturating_sub(PDF_EOF_WINDOW_BYTES)..];
    if !tail.windows(5).any(|window| window == b"%%EOF") {
        return Err(InvalidDocument::PdfEndMarkerMissing);
    }
    Ok(())
}

const ZIP_END_SIGNATURE: u32 = 0x0605_4b50;
const ZIP_CENTRAL_SIGNATURE: u32 = 0x0201_4b50;
const ZIP_LOCAL_SIGNATURE: u32 = 0x0403_4b50;
const ZIP_END_BYTES: usize = 22;
const ZIP_CENTRAL_BYTES: usize = 46;
const ZIP_LOCAL_BYTES: usize = 30;
/// The end record's comment is at most this long, which bounds the backward search for it.
const ZIP_COMMENT_MAX_BYTES: usize = 0xffff;

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    let slice = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes([slice[0], slice[1]]))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let slice = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([slice[0], slice[1], slice[2], slice[3]]))
}

/// The names in a ZIP archive's central directory whose local headers are present and agree.
/// Reads only the directory and headers: nothing is decompressed, so a compression bomb costs
/// nothing here.
fn zip_entry_names(bytes: &[u8]) -> Result<Vec<String>, InvalidDocument> {
    use InvalidDocument::{NotZip, Zip64};
    let last_start = bytes.len().checked_sub(ZIP_END_BYTES).ok_or(NotZip)?;
    let first_start = last_start.saturating_sub(ZIP_COMMENT_MAX_BYTES);
    let end = (first_start..=last_start)
        .rev()
        .find(|&at| u32_at(bytes, at) == Some(ZIP_END_SIGNATURE))
        .ok_or(NotZip)?;
    let entries = u16_at(bytes, end + 10).ok_or(NotZip)?;
    let directory_bytes = u32_at(bytes, end + 12).ok_or(NotZip)?;
    let directory_start = u32_at(bytes, end + 16).ok_or(NotZip)?;
    if entries == 0xffff || directory_bytes == u32::MAX || directory_start == u32::MAX {
        return Err(Zip64);
    }
    let directory_start = directory_start as usize;
    let directory_end = directory_start
        .checked_add(directory_bytes as usize)
        .filter(|&directory_end| directory_end <= end)
        .ok_or(NotZip)?;
    let mut names = Vec::with_capacity(usize::from(entries));
    let mut at = directory_start;
    for _ in 0..entries {
        if at + ZIP_CENTRAL_BYTES > directory_end
            || u32_at(bytes, at) != Some(ZIP_CENTRAL_SIGNATURE)
        {
            return Err(NotZip);
        }
        let name_bytes = usize::from(u16_at(bytes, at + 28).ok_or(NotZip)?);
        let extra_bytes = usize::from(u16_at(bytes, at + 30).ok_or(NotZip)?);
        let comment_bytes = usize::from(u16_at(bytes, at + 32).ok_or(NotZip)?);
        let local_start = u32_at(bytes, at + 42).ok_or(NotZip)?;
        if local_start == u32::MAX {
            return Err(Zip64);
        }
        let name = bytes
            .get(at + ZIP_CENTRAL_BYTES..at + ZIP_CENTRAL_BYTES + name_bytes)
            .ok_or(NotZip)?;
        verify_local_header(bytes, local_start as usize, name, directory_start)?;
        names.push(String::from_utf8_lossy(name).into_owned());
        at += ZIP_CENTRAL_BYTES + name_bytes + extra_bytes + comment_bytes;
    }
    if at > directory_end {
        return Err(NotZip);
    }
    Ok(names)
}

/// The local header at `start` exists before the central directory and names `name`.
fn verify_local_header(
    bytes: &[u8],
    start: usize,
    name: &[u8],
    directory_start: usize,
) -> Result<(), InvalidDocument> {
    let fits = start
        .checked_add(ZIP_LOCAL_BYTES + name.len())
        .is_some_and(|end| end <= directory_start);
    if !fits || u32_at(bytes, start) != Some(ZIP_LOCAL_SIGNATURE) {
        return Err(InvalidDocument::NotZip);
    }
    let local_name_bytes = usize::from(u16_at(bytes, start + 26).ok_or(InvalidDocument::NotZip)?);
    let local_name = bytes.get(start + ZIP_LOCAL_BYTES..start + ZIP_LOCAL_BYTES + local_name_bytes);
    if local_name != Some(name) {
        return Err(InvalidDocument::NotZip);
    }
    Ok(())
}

/// One file offered for download, as the worker found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offered {
    /// Workspace-relative path.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// The verification result for a document kind; `Ok` for any other file.
    pub verified: Result<(), InvalidDocument>,
}

/// A file in the typed download list.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Download {
    /// Workspace-relative path.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Media type, from the extension ([`media_type`]).
    pub media_type: String,
}

/// A document left out of the download list because it is not what its name says (OUT-4): the
/// run errors naming it and the check it failed, and no reference to it is ever kept.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rejected {
    /// Workspace-relative path.
    pub path: String,
    /// The check it failed.
    pub check: InvalidDocument,
}

/// Why an offered file is not in the download list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Excluded {
    /// It failed verification as a document of the kind its name says.
    Invalid(InvalidDocument),
    /// Including it would take the downloads past `SANDBOX_MAX_ARTIFACT_BYTES`.
    OverArtifactBound,
}

impl Excluded {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Invalid(invalid) => invalid.code(),
            Self::OverArtifactBound => "over_artifact_bound",
        }
    }
}

/// The outcome of choosing downloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// The typed download list, in path order.
    pub downloads: Vec<Download>,
    /// Files left out, with why.
    pub excluded: Vec<(String, Excluded)>,
    /// Whether the artifact bound was hit.
    pub artifact_bound_hit: bool,
}

impl Selection {
    /// The documents left out because they failed verification (OUT-4).
    #[must_use]
    pub fn rejected(&self) -> Vec<Rejected> {
        self.excluded
            .iter()
            .filter_map(|(path, excluded)| match excluded {
                Excluded::Invalid(check) => Some(Rejected {
                    path: path.clone(),
                    check: *check,
                }),
                Excluded::OverArtifactBound => None,
            })
            .collect()
    }
}

/// Chooses the downloads from `offered` (in path order): invalid documents are left out, and
/// files are taken in order while their total stays within `max_artifact_bytes`.
#[must_use]
pub fn select(offered: &[Offered], max_artifact_bytes: u64) -> Selection {
    let mut selection = Selection::default();
    let mut total_bytes: u64 = 0;
    for file in offered {
        if let Err(invalid) = file.verified {
            selection
                .excluded
                .push((file.path.clone(), Excluded::Invalid(invalid)));
            continue;
        }
        let next_total = total_bytes.saturating_add(file.bytes);
        if next_total > max_artifact_bytes {
            selection.artifact_bound_hit = true;
            selection
                .excluded
                .push((file.path.clone(), Excluded::OverArtifactBound));
            continue;
        }
        total_bytes = next_total;
        selection.downloads.push(Download {
            path: file.path.clone(),
            bytes: file.bytes,
            media_type: media_type(&file.path).to_owned(),
        });
    }
    assert!(total_bytes <= max_artifact_bytes);
    selection
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(bytes: u64, inode: u64) -> Entry {
        Entry::File(FileStamp {
            bytes,
            modified_ns: 1,
            changed_ns: 1,
            inode,
        })
    }

    #[test]
    fn ws_04_relative_paths_only() {
        assert_eq!(
            relative_path("out/report.pdf"),
            Ok("out/report.pdf".to_owned())
        );
        assert_eq!(relative_path("./a//b/"), Ok("a/b".to_owned()));
        assert_eq!(relative_path("/etc/passwd"), Err(PathRefusal::Absolute));
        assert_eq!(
            relative_path("a/../../x"),
            Err(PathRefusal::ParentComponent)
        );
        assert_eq!(relative_path(""), Err(PathRefusal::Empty));
        assert_eq!(relative_path("./"), Err(PathRefusal::Empty));
        assert_eq!(relative_path("a\0b"), Err(PathRefusal::ControlCharacter));
        assert_eq!(relative_path(&"a".repeat(5000)), Err(PathRefusal::TooLong));
    }

    #[test]
    fn ws_06_only_new_or_changed_regular_files_or_declared_ones() {
        let before: Snapshot = [
            ("kept.txt".to_owned(), stamp(3, 1)),
            ("edited.txt".to_owned(), stamp(3, 2)),
            ("input.csv".to_owned(), stamp(9, 3)),
        ]
        .into();
        let after: Snapshot = [
            ("kept.txt".to_owned(), stamp(3, 1)),
            ("edited.txt".to_owned(), stamp(4, 2)),
            ("input.csv".to_owned(), stamp(9, 3)),
            ("new.pdf".to_owned(), stamp(100, 4)),
            ("link.pdf".to_owned(), Entry::Symlink),
            ("dir".to_owned(), Entry::Directory),
            ("fifo".to_owned(), Entry::Other),
        ]
        .into();
        let declared = [
            "input.csv".to_owned(),
            "link.pdf".to_owned(),
            "../escape".to_owned(),
            "missing.txt".to_owned(),
        ];
        assert_eq!(
            candidates(&before, &after, &declared),
            ["edited.txt", "input.csv", "new.pdf"]
        );
    }

    #[test]
    fn media_types_follow_the_extension() {
        assert_eq!(media_type("a/b.PDF"), "application/pdf");
        assert_eq!(
            media_type("x.xlsx"),
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
        );
        assert_eq!(media_type(".bashrc"), "application/octet-stream");
        assert_eq!(media_type("noext"), "application/octet-stream");
        assert_eq!(DocumentKind::of("Deck.PPTX"), Some(DocumentKind::Pptx));
        assert_eq!(DocumentKind::of("notes.txt"), None);
    }

    #[test]
    fn out_04_pdf_needs_header_and_end_marker() {
        assert_eq!(
            verify_document(DocumentKind::Pdf, b"%PDF-1.4\n...\n%%EOF\n"),
            Ok(())
        );
        assert_eq!(
            verify_document(DocumentKind::Pdf, b"hello %PDF-1.4 %%EOF"),
            Err(InvalidDocument::PdfHeaderMissing)
        );
        assert_eq!(
            verify_document(DocumentKind::Pdf, b"%PDF-1.4\ntruncated"),
            Err(InvalidDocument::PdfEndMarkerMissing)
        );
        let mut buried = b"%PDF-1.4\n%%EOF\n".to_vec();
        buried.extend(std::iter::repeat_n(b' ', 2 * PDF_EOF_WINDOW_BYTES));
        assert_eq!(
            verify_document(DocumentKind::Pdf, &buried),
            Err(InvalidDocument::PdfEndMarkerMissing)
        );
    }

    /// A stored (uncompressed) ZIP archive of `files`, written the way any ZIP writer does.
    fn zip(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut directory = Vec::new();
        for (name, data) in files {
            let offset = out.len() as u32;
            let size = data.len() as u32;
            out.extend_from_slice(&ZIP_LOCAL_SIGNATURE.to_le_bytes());
            out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&0u32.to_le_bytes()); // crc, unchecked here
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(data);
            directory.extend_from_slice(&ZIP_CENTRAL_SIGNATURE.to_le_bytes());
            directory.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            directory.extend_from_slice(&0u32.to_le_bytes());
            directory.extend_from_slice(&size.to_le_bytes());
            directory.extend_from_slice(&size.to_le_bytes());
            directory.extend_from_slice(&(name.len() as u16).to_le_bytes());
            directory.extend_from_slice(&[0; 12]);
            directory.extend_from_slice(&offset.to_le_bytes());
            directory.extend_from_slice(name.as_bytes());
        }
        let directory_start = out.len() as u32;
        out.extend_from_slice(&directory);
        out.extend_from_slice(&ZIP_END_SIGNATURE.to_le_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(&(files.len() as u16).to_le_bytes());
        out.extend_from_slice(&(files.len() as u16).to_le_bytes());
        out.extend_from_slice(&(directory.len() as u32).to_le_bytes());
        out.extend_from_slice(&directory_start.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }

    #[test]
    fn out_04_ooxml_needs_content_types_and_main_part() {
        let types: (&str, &[u8]) = ("[Content_Types].xml", b"<Types/>");
        for (kind, main) in [
            (DocumentKind::Docx, "word/document.xml"),
            (DocumentKind::Pptx, "ppt/presentation.xml"),
            (DocumentKind::Xlsx, "xl/workbook.xml"),
        ] {
            let good = zip(&[types, (main, b"<x/>")]);
            assert_eq!(verify_document(kind, &good), Ok(()), "{kind:?}");
            assert_eq!(
                verify_document(kind, &zip(&[(main, b"<x/>")])),
                Err(InvalidDocument::ContentTypesMissing)
            );
            assert_eq!(
                verify_document(kind, &zip(&[types, ("other.xml", b"<x/>")])),
                Err(InvalidDocument::MainPartMissing)
            );
            assert_eq!(
                verify_document(kind, b"PK\x03\x04 not really"),
                Err(InvalidDocument::NotZip)
            );
            // Truncated archives lose their directory.
            assert_eq!(
                verify_document(kind, &good[..good.len() / 2]),
                Err(InvalidDocument::NotZip)
            );
        }
    }

    #[test]
    fn out_04_a_directory_that_points_nowhere_is_not_a_zip() {
        let mut bad = zip(&[
            ("[Content_Types].xml", b"<Types/>"),
            ("word/document.xml", b"<x/>"),
        ]);
        // Point the second directory entry's local header offset into the middle of the data.
        let signature = ZIP_CENTRAL_SIGNATURE.to_le_bytes();
        let entries: Vec<usize> = (0..bad.len() - 4)
            .filter(|&at| bad[at..at + 4] == signature)
            .collect();
        assert_eq!(entries.len(), 2);
        let second = entries[1];
        bad[second + 42..second + 46].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(
            verify_document(DocumentKind::Docx, &bad),
            Err(InvalidDocument::NotZip)
        );
    }

    #[test]
    fn verification_never_panics_on_arbitrary_bytes() {
        let mut seed: u32 = 12345;
        for length in 0..400 {
            let bytes: Vec<u8> = (0..length)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (seed >> 16) as u8
                })
                .collect();
            for kind in [DocumentKind::Pdf, DocumentKind::Docx] {
                let _ = verify_document(kind, &bytes);
            }
            let mut zipped = zip(&[("[Content_Types].xml", &bytes)]);
            let cut = zipped.len() * length / 400;
            zipped.truncate(cut.max(1));
            let _ = verify_document(DocumentKind::Xlsx, &zipped);
        }
    }

    #[test]
    fn out_04_invalid_documents_are_left_out_and_artifacts_are_bounded() {
        let offered = [
            Offered {
                path: "a.pdf".into(),
                bytes: 60,
                verified: Ok(()),
            },
            Offered {
                path: "b.docx".into(),
                bytes: 10,
                verified: Err(InvalidDocument::NotZip),
            },
            Offered {
                path: "c.txt".into(),
                bytes: 50,
                verified: Ok(()),
            },
            Offered {
                path: "d.txt".into(),
                bytes: 40,
                verified: Ok(()),
            },
        ];
        let selection = select(&offered, 100);
        let paths: Vec<&str> = selection
            .downloads
            .iter()
            .map(|d| d.path.as_str())
            .collect();
        assert_eq!(paths, ["a.pdf", "d.txt"]);
        assert_eq!(
            selection.excluded,
            [
                (
                    "b.docx".to_owned(),
                    Excluded::Invalid(InvalidDocument::NotZip)
                ),
                ("c.txt".to_owned(), Excluded::OverArtifactBound),
            ]
        );
        assert!(selection.artifact_bound_hit);
        assert_eq!(selection.downloads[0].media_type, "application/pdf");
    }
}

#[cfg(test)]
mod undelivered_tests {
    use super::*;

    #[test]
    fn out_04_a_declared_document_counts_only_when_delivered() {
        let declared: Vec<String> = ["report.pdf", "./out/deck.pptx", "notes.txt", "sheet.XLSX"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(
            undelivered_documents(&declared, &["report.pdf", "out/deck.pptx"]),
            ["sheet.XLSX"]
        );
        assert_eq!(
            undelivered_documents(&declared, &[]),
            ["report.pdf", "./out/deck.pptx", "sheet.XLSX"]
        );
        let escaping = vec![String::from("../x.pdf")];
        assert_eq!(undelivered_documents(&escaping, &["x.pdf"]), ["../x.pdf"]);
    }
}
