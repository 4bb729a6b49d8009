//! The turn's projection at the worker (PROJ-5, PROJ-6): a real `corral-worker serve` given the
//! resource order the API builds. The worker verifies names, the admitted manifest's digest,
//! sizes and content digests before any code starts, mounts the files read-only outside the
//! workspace, and names them to the code through the two contract variables.

mod common;

use std::io::Read as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::api::{Server, TOKEN};
use common::{root_or_skip, serial};
use corral_contract::messages::ResourceOrder;
use corral_core::projection::{
    Audience, Document, ENV_DIR, ENV_MANIFEST, Kind, Processing, Turn, project,
};
use serde_json::{Value, json};

/// The order the API would dispatch for `files` (name, bytes) in a private room of `ann`.
fn order(files: &[(&str, &[u8])]) -> ResourceOrder {
    let docs: Vec<Document> = files
        .iter()
        .enumerate()
        .map(|(i, (name, bytes))| Document {
            reference: format!("doc-{i}"),
            root: format!("root-{i}"),
            version: 1,
            kind: Kind::Document,
            processing: Processing::Ready,
            readable: true,
            digest: corral_core::ids::sha256_hex(bytes),
            media_type: "application/octet-stream".into(),
            size: bytes.len() as u64,
            name: (*name).to_owned(),
        })
        .collect();
    let audience = Audience {
        version: 4,
        members: ["ann".to_owned()].into(),
    };
    let projection = project(&Turn {
        member: "ann",
        room: &docs,
        selection: &[],
        admitted: &audience,
        live: Some(&audience),
        asked_for_files: true,
    })
    .unwrap();
    ResourceOrder {
        audience_version: 4,
        manifest_digest: projection.manifest.digest(),
        manifest: projection.manifest,
        files: files
            .iter()
            .map(|(_, bytes)| BASE64.encode(bytes))
            .collect(),
    }
}

fn run(server: &Server, code: &str, resources: Option<&ResourceOrder>) -> Value {
    let mut body = json!({ "language": "python", "code": code });
    if let Some(resources) = resources {
        body["resources"] = serde_json::to_value(resources).unwrap();
    }
    let (status, reply) = server.execute(&body);
    assert_eq!(status, 200, "{reply}");
    reply
}

fn stdout(reply: &Value) -> &str {
    reply["stdout"]["text"].as_str().unwrap_or_default()
}

/// The paths in a base64 workspace tar.
fn paths(archive: &str) -> Vec<String> {
    let bytes = BASE64.decode(archive).unwrap();
    let mut tar = tar::Archive::new(&bytes[..]);
    let mut out = Vec::new();
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        out.push(entry.path().unwrap().to_string_lossy().into_owned());
        let mut sink = Vec::new();
        entry.read_to_end(&mut sink).unwrap();
    }
    out
}

const READER: &str = r#"
import json, os
listed = json.loads(os.environ["KAIZEN_SHARED_RESOURCES_MANIFEST"])
print(os.environ["KAIZEN_SHARED_RESOURCES_DIR"])
for entry in listed:
    with open(entry["path"], "rb") as f:
        data = f.read()
    print(entry["filename"], entry["size"], len(data), entry["digest"][:7], entry["version"], entry["kind"])
try:
    open(listed[0]["path"], "ab").write(b"x")
    print("wrote")
except OSError as e:
    print("write refused", e.errno in (13, 30))
try:
    open(os.path.join(os.environ["KAIZEN_SHARED_RESOURCES_DIR"], "new.txt"), "w").write("x")
    print("created")
except OSError as e:
    print("create refused", e.errno)
print(sorted(os.listdir("/workspace")))
open("/workspace/result.txt", "w").write("done")
"#;

#[test]
fn proj_05_proj_06_the_projection_is_verified_read_only_and_absent_from_the_snapshot() {
    if !root_or_skip(
        "proj_05_proj_06_the_projection_is_verified_read_only_and_absent_from_the_snapshot",
    ) {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let report = b"%PDF-1.4 quarterly\n%%EOF\n".to_vec();
    let table = vec![b'7'; 300_000];
    let resources = order(&[("Q3 report.pdf", &report), ("../../etc/table.csv", &table)]);
    let reply = run(&server, READER, Some(&resources));
    assert_eq!(reply["exit_code"], 0, "{reply}");
    let out = stdout(&reply);
    assert_eq!(
        out,
        "/mnt/resources\n\
         Q3 report.pdf 25 25 sha256: 1 document\n\
         table.csv 300000 300000 sha256: 1 document\n\
         write refused True\n\
         create refused 30\n\
         []\n",
        "{reply}"
    );
    // The workspace the run leaves holds what the code wrote, never the projection.
    let archive = reply["workspace"]["archive"].as_str().unwrap();
    let saved = paths(archive);
    assert!(saved.iter().any(|p| p.ends_with("result.txt")), "{saved:?}");
    assert!(
        !saved
            .iter()
            .any(|p| p.contains("report") || p.contains("table")),
        "{saved:?}"
    );
}

#[test]
fn proj_05_both_variables_are_absent_when_nothing_is_authorized() {
    if !root_or_skip("proj_05_both_variables_are_absent_when_nothing_is_authorized") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let code = format!(
        "import os\nprint({ENV_DIR:?} in os.environ, {ENV_MANIFEST:?} in os.environ, os.path.exists('/mnt/resources'))\n"
    );
    let reply = run(&server, &code, None);
    assert_eq!(stdout(&reply), "False False False\n", "{reply}");
    // An empty projection is nothing authorized, too.
    let reply = run(&server, &code, Some(&order(&[])));
    assert_eq!(stdout(&reply), "False False False\n", "{reply}");
}

#[test]
fn proj_06_a_tampered_byte_a_foreign_manifest_and_an_unsafe_name_stop_the_run_before_code() {
    if !root_or_skip(
        "proj_06_a_tampered_byte_a_foreign_manifest_and_an_unsafe_name_stop_the_run_before_code",
    ) {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    // The code would leave a file; a refused run leaves none and runs nothing.
    let code = "open('/workspace/ran.txt', 'w').write('ran')\nprint('ran')\n";
    let good = order(&[("a.csv", b"1,2\n"), ("b.csv", b"3,4\n")]);
    let mut tampered = good.clone();
    tampered.files[1] = BASE64.encode(b"3,5\n");
    let mut foreign = good.clone();
    foreign.manifest_digest = order(&[("a.csv", b"1,2\n")]).manifest_digest;
    let mut unsafe_name = good.clone();
    unsafe_name.manifest.entries[0].filename = "../a.csv".to_owned();
    unsafe_name.manifest_digest = unsafe_name.manifest.digest();
    let mut missing = good.clone();
    missing.files.pop();
    for (order, reason, named) in [
        (&tampered, "resource_digest_mismatch", "b.csv"),
        (&foreign, "resource_manifest_mismatch", "admitted"),
        (&unsafe_name, "resource_path_invalid", "../a.csv"),
        (
            &missing,
            "resource_manifest_mismatch",
            "1 files for 2 entries",
        ),
    ] {
        let reply = run(&server, code, Some(order));
        assert_eq!(reply["not_run"], reason, "{reply}");
        assert_ne!(reply["exit_code"], 0, "{reply}");
        assert_eq!(stdout(&reply), "", "{reply}");
        assert!(reply["diagnostics"].to_string().contains(named), "{reply}");
        // The worker is clean again (the reset between leases counts what the run's own reset
        // left) and serves the next run.
        let (status, reset) = server.request("POST", "/v1/reset", Some(TOKEN), br#"{"token": 3}"#);
        assert_eq!(status, 200, "{reset}");
        assert_eq!(reset["reset_evidence"]["verdict"], "clean", "{reset}");
    }
    let reply = run(&server, code, Some(&good));
    assert_eq!(stdout(&reply), "ran\n", "{reply}");
}
