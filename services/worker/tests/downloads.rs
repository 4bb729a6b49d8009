//! Typed downloads and OUT-4: only regular files the run created or changed, inside the
//! workspace, and a .pdf, .docx, .pptx or .xlsx only when it is structurally what it says.

mod common;

use common::{Jail, TempDir, root_or_skip, serial};

/// Writes a valid and a corrupt file of each verified kind with Python's zipfile, inside the jail.
const WRITE_DOCUMENTS: &str = r#"
import os, zipfile

def ooxml(name, parts):
    with zipfile.ZipFile(name, 'w') as z:
        for part, text in parts.items():
            z.writestr(part, text)

types = '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>'
ooxml('good.docx', {'[Content_Types].xml': types, 'word/document.xml': '<w:document/>'})
ooxml('good.pptx', {'[Content_Types].xml': types, 'ppt/presentation.xml': '<p:presentation/>'})
ooxml('good.xlsx', {'[Content_Types].xml': types, 'xl/workbook.xml': '<workbook/>'})
with open('good.pdf', 'wb') as f:
    f.write(b'%PDF-1.4\n1 0 obj << >> endobj\ntrailer << >>\n%%EOF\n')

# Corrupt: a docx without its main part, a pptx without a content-types manifest, an xlsx cut in
# half, and a pdf without its end marker.
ooxml('bad.docx', {'[Content_Types].xml': types, 'word/other.xml': '<x/>'})
ooxml('bad.pptx', {'ppt/presentation.xml': '<p:presentation/>'})
ooxml('whole.xlsx', {'[Content_Types].xml': types, 'xl/workbook.xml': '<workbook/>' * 100})
data = open('whole.xlsx', 'rb').read()
os.remove('whole.xlsx')
open('bad.xlsx', 'wb').write(data[: len(data) // 2])
open('bad.pdf', 'wb').write(b'%PDF-1.4\n1 0 obj << >> endobj\n')
open('notes.txt', 'w').write('plain text is returned as it is')

# Outside the download rules: links, a directory, a fifo, files outside the workspace, and the
# input file the run did not touch.
os.symlink('good.pdf', 'link.pdf')
os.symlink('/etc/hostname', 'host.txt')
os.mkdir('folder.pdf')
os.mkfifo('pipe.txt')
open('/tmp/scratch.pdf', 'wb').write(b'%PDF-1.4\n%%EOF\n')
open('/dev/shm/shared.txt', 'w').write('not a download')
print(sorted(os.listdir('.')))
"#;

#[test]
fn out_04_valid_documents_are_downloads_and_corrupt_ones_are_excluded() {
    if !root_or_skip("out_04_valid_documents_are_downloads_and_corrupt_ones_are_excluded") {
        return;
    }
    let _serial = serial();
    let dir = TempDir::new("downloads");
    std::fs::write(dir.path().join("input.csv"), "a,b\n1,2\n").unwrap();
    let ran = Jail::python(WRITE_DOCUMENTS).workspace(dir.path()).run();
    ran.assert_ran();
    assert_eq!(ran.json["exit_code"], 0, "{}", ran.json);
    assert_eq!(
        ran.downloads(),
        [
            "good.docx",
            "good.pdf",
            "good.pptx",
            "good.xlsx",
            "notes.txt"
        ],
        "{}",
        ran.json
    );
    let media = |path: &str| {
        ran.json["downloads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["path"] == path)
            .map(|d| d["media_type"].as_str().unwrap().to_owned())
    };
    assert_eq!(media("good.pdf").as_deref(), Some("application/pdf"));
    assert_eq!(
        media("good.docx").as_deref(),
        Some("application/vnd.openxmlformats-officedocument.wordprocessingml.document")
    );
    assert_eq!(
        media("good.xlsx").as_deref(),
        Some("application/vnd.openxmlformats-officedocument.spreadsheetml.sheet")
    );
    let diagnostics = ran.json["diagnostics"].to_string();
    for (name, code) in [
        ("bad.docx", "ooxml_main_part_missing"),
        ("bad.pptx", "ooxml_content_types_missing"),
        ("bad.xlsx", "ooxml_not_zip"),
        ("bad.pdf", "pdf_end_marker_missing"),
    ] {
        assert!(
            diagnostics.contains(&format!("download {name} excluded: {code}")),
            "{name}: {diagnostics}"
        );
    }
    // Only validated downloads come back to the operator's directory, beside the untouched input.
    let mut back: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    back.sort();
    assert_eq!(
        back,
        [
            "good.docx",
            "good.pdf",
            "good.pptx",
            "good.xlsx",
            "input.csv",
            "notes.txt"
        ]
    );
    let pdf = std::fs::read(dir.path().join("good.pdf")).unwrap();
    assert!(pdf.starts_with(b"%PDF-"));
    ran.assert_clean_reset();
}

#[test]
fn ws_06_a_changed_input_is_a_download_and_an_untouched_one_is_not() {
    if !root_or_skip("ws_06_a_changed_input_is_a_download_and_an_untouched_one_is_not") {
        return;
    }
    let _serial = serial();
    let dir = TempDir::new("changed");
    std::fs::write(dir.path().join("kept.txt"), "same").unwrap();
    std::fs::write(dir.path().join("edited.txt"), "before").unwrap();
    std::fs::create_dir(dir.path().join("nested")).unwrap();
    std::fs::write(dir.path().join("nested/data.csv"), "x").unwrap();
    let ran = Jail::python(
        "import os\n\
         assert open('kept.txt').read() == 'same'\n\
         st = os.stat('edited.txt')\n\
         open('edited.txt', 'w').write('after!')\n\
         os.utime('edited.txt', ns=(st.st_atime_ns, st.st_mtime_ns))\n\
         open('nested/new.txt', 'w').write('n')\n",
    )
    .workspace(dir.path())
    .run();
    ran.assert_ran();
    assert_eq!(ran.json["exit_code"], 0, "{}", ran.json);
    assert_eq!(
        ran.downloads(),
        ["edited.txt", "nested/new.txt"],
        "{}",
        ran.json
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("edited.txt")).unwrap(),
        "after!"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("nested/new.txt")).unwrap(),
        "n"
    );
    ran.assert_clean_reset();
}

#[test]
fn artifacts_over_their_bound_are_left_out_and_reported() {
    if !root_or_skip("artifacts_over_their_bound_are_left_out_and_reported") {
        return;
    }
    let _serial = serial();
    let ran = Jail::python(
        "open('a.bin', 'wb').write(b'a' * 3000)\nopen('b.bin', 'wb').write(b'b' * 3000)\n",
    )
    .env("SANDBOX_MAX_ARTIFACT_BYTES", "4000")
    .run();
    ran.assert_ran();
    assert_eq!(ran.downloads(), ["a.bin"], "{}", ran.json);
    assert_eq!(
        ran.json["bound"], "SANDBOX_MAX_ARTIFACT_BYTES",
        "{}",
        ran.json
    );
    ran.assert_clean_reset();
}
