//! Read-only projection of authorized resources and shared-turn outputs through the whole stack
//! (PROJ-1 to PROJ-8, OUT-1 to OUT-3, decision 0020): `corral up` with its embedded resource
//! authority, administered with `corral resources` as a platform would keep it, and runs sent to
//! `POST /v1/run_code` on real workers. Needs root and Valkey; without them each test skips
//! through `corral_testkit::skip`, which CI forbids.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::stack::{Stack, stdout};
use serde_json::{Value, json};

/// `corral resources` against the stack's database and object store; its JSON answer.
fn admin(stack: &Stack, args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("resources")
        .arg("--db")
        .arg(stack.state.join("resources.db"))
        .arg("--store")
        .arg(format!(
            "file://{}",
            stack.state.join("workspaces").display()
        ))
        .args(args)
        .output()
        .expect("corral resources runs");
    assert!(
        output.status.success(),
        "corral resources {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON line")
}

/// A file with `bytes` to add as a document; its path.
fn file(stack: &Stack, name: &str, bytes: &[u8]) -> String {
    let dir = stack.state.join("uploads");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_string_lossy().into_owned()
}

/// Adds a document owned by `owner`; its reference and root.
fn document(
    stack: &Stack,
    owner: &str,
    name: &str,
    bytes: &[u8],
    extra: &[&str],
) -> (String, String) {
    let path = file(stack, &format!("{}-{name}", bytes.len()), bytes);
    let mut args = vec![
        "document", "add", "--owner", owner, "--file", &path, "--name", name,
    ];
    args.extend_from_slice(extra);
    let added = admin(stack, &args);
    (
        added["reference"].as_str().unwrap().to_owned(),
        added["root"].as_str().unwrap().to_owned(),
    )
}

fn run(member: &str, room: &str, code: &str) -> Value {
    json!({ "actor": member, "conversation": room, "member": member, "language": "python", "code": code })
}

/// Code that asks for files: lists what the manifest names and reads each file by its path.
const READ_ALL: &str = r#"
import hashlib, json, os
for e in json.loads(os.environ["KAIZEN_SHARED_RESOURCES_MANIFEST"]):
    data = open(e["path"], "rb").read()
    ok = "sha256:" + hashlib.sha256(data).hexdigest() == e["digest"]
    print(e["filename"], e["version"], e["kind"], len(data), ok)
"#;

/// Code that does not ask for files, but reports whether it was given any.
const LOOK_AROUND: &str = "import os\nd = '/mnt/resources'\nprint(sorted(os.listdir(d)) if os.path.isdir(d) else 'none')\n";

fn code_of(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proj_01_proj_02_proj_05_proj_06_proj_08_a_private_chat_projects_its_attachments_and_each_failure_names_itself()
 {
    let test = "proj_01_proj_02_proj_05_proj_06_proj_08_a_private_chat_projects_its_attachments_and_each_failure_names_itself";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    // PROJ-2: a file attached three messages ago, and a follow-up turn with no ids at all.
    admin(&stack, &["room", "create", "chat-a", "--member", "ann"]);
    let (report, _) = document(
        &stack,
        "ann",
        "Q3 report.csv",
        b"region,total\nnorth,10\n",
        &[],
    );
    admin(&stack, &["link", "chat-a", &report]);
    let (status, body) = stack.run(run("ann", "chat-a", READ_ALL)).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("succeeded")),
        "{body}"
    );
    assert_eq!(
        stdout(&body),
        "Q3 report.csv 1 document 22 True\n",
        "{body}"
    );
    assert_eq!(
        body["model"]["resources"]["files"][0]["reference"], report,
        "{body}"
    );
    // PROJ-6: the projection is not in the saved workspace.
    let (status, _) = stack.read("ann", "chat-a", "Q3 report.csv").await;
    assert_eq!(status, 404);

    // PROJ-1, PROJ-8: 21 files, and 8 MiB + 1 byte, each refused naming a file and the limit.
    admin(&stack, &["room", "create", "many", "--member", "ann"]);
    for i in 0..21 {
        let (doc, _) = document(
            &stack,
            "ann",
            &format!("f{i:02}.txt"),
            format!("{i}").as_bytes(),
            &[],
        );
        admin(&stack, &["link", "many", &doc]);
    }
    let (status, body) = stack.run(run("ann", "many", READ_ALL)).await;
    assert_eq!(
        (status, code_of(&body)),
        (422, "resource_over_count"),
        "{body}"
    );
    assert_eq!(body["error"]["resource"]["limit"], 20, "{body}");
    assert_eq!(body["error"]["resource"]["file"], "f20.txt", "{body}");
    admin(&stack, &["room", "create", "heavy", "--member", "ann"]);
    let big = vec![b'x'; (8 << 20) - 10];
    let (a, _) = document(&stack, "ann", "big.bin", &big, &[]);
    let (b, _) = document(&stack, "ann", "tail.bin", &[b'y'; 11], &[]);
    admin(&stack, &["link", "heavy", &a]);
    admin(&stack, &["link", "heavy", &b]);
    let (status, body) = stack.run(run("ann", "heavy", READ_ALL)).await;
    assert_eq!(
        (status, code_of(&body)),
        (422, "resource_over_bytes"),
        "{body}"
    );
    assert_eq!(body["error"]["resource"]["limit"], 8 << 20, "{body}");
    assert_eq!(body["error"]["resource"]["file"], "tail.bin", "{body}");
    // Exactly 8 MiB fits: 20 files would too (the core's tests cover the count's edge).
    admin(&stack, &["room", "create", "full", "--member", "ann"]);
    let (c, _) = document(&stack, "ann", "tail.bin", &[b'y'; 10], &[]);
    admin(&stack, &["link", "full", &a]);
    admin(&stack, &["link", "full", &c]);
    let (status, body) = stack.run(run("ann", "full", READ_ALL)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        stdout(&body),
        "big.bin 1 document 8388598 True\ntail.bin 1 document 10 True\n",
        "{body}"
    );

    // A document still processing, one whose processing failed, one the member can no longer
    // read: each its own reason, naming the file; never "unavailable" for the first two.
    for (state, reason) in [
        (&["--processing", "processing"][..], "resource_not_ready"),
        (&["--processing", "failed"][..], "resource_failed"),
        (&["--revoked", "true"][..], "resource_unavailable"),
    ] {
        let room = format!("state-{reason}");
        admin(&stack, &["room", "create", &room, "--member", "ann"]);
        let (doc, _) = document(&stack, "ann", "scan.pdf", b"%PDF-1.4\n%%EOF\n", &[]);
        admin(&stack, &["link", &room, &doc]);
        let mut args = vec!["document", "set", doc.as_str()];
        args.extend_from_slice(state);
        admin(&stack, &args);
        let (status, body) = stack.run(run("ann", &room, LOOK_AROUND)).await;
        assert_eq!((status, code_of(&body)), (422, reason), "{body}");
        assert_eq!(body["error"]["resource"]["file"], "scan.pdf", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("scan.pdf"),
            "{body}"
        );
    }

    // PROJ-2: a document re-authorized from retrieval joins for this turn only; one the member
    // cannot read (another member's private file) is refused by name, never skipped.
    admin(&stack, &["room", "create", "retrieval", "--member", "ann"]);
    let (mine, _) = document(&stack, "ann", "notes.md", b"# notes\n", &[]);
    let (theirs, _) = document(&stack, "bob", "salaries.xlsx", b"PK secret", &[]);
    let mut asked = run("ann", "retrieval", READ_ALL);
    asked["retrieved"] = json!([mine]);
    let (status, body) = stack.run(asked.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stdout(&body), "notes.md 1 document 8 True\n", "{body}");
    let (_, next) = stack.run(run("ann", "retrieval", LOOK_AROUND)).await;
    assert_eq!(
        stdout(&next),
        "none\n",
        "the next turn does not carry it: {next}"
    );
    asked["retrieved"] = json!([mine, theirs]);
    let (status, body) = stack.run(asked).await;
    assert_eq!(
        (status, code_of(&body)),
        (422, "resource_unavailable"),
        "{body}"
    );
    assert_eq!(body["error"]["resource"]["file"], "salaries.xlsx", "{body}");

    // PROJ-6: a tampered byte in the object store is caught by the worker before code starts.
    admin(&stack, &["room", "create", "tampered", "--member", "ann"]);
    let bytes = b"amount\n100\n";
    let (doc, _) = document(&stack, "ann", "ledger.csv", bytes, &[]);
    admin(&stack, &["link", "tampered", &doc]);
    let digest = corral_core::ids::sha256_hex(bytes);
    let stored: PathBuf = stack.state.join("workspaces/res").join(&digest);
    std::fs::write(&stored, b"amount\n900\n").unwrap();
    let (status, body) = stack
        .run(run(
            "ann",
            "tampered",
            "open('/workspace/ran', 'w').write('1')\nprint('ran')\n",
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "not_run", "{body}");
    assert_eq!(
        body["model"]["not_run"], "resource_digest_mismatch",
        "{body}"
    );
    assert_eq!(stdout(&body), "", "{body}");
    let (status, _) = stack.read("ann", "tampered", "ran").await;
    assert_eq!(status, 404, "the code never ran");

    // Nothing authorized: both variables absent, and a run that asked is told no file is
    // attached rather than refused.
    let (status, body) = stack
        .run(run(
            "ann",
            "no-such-room",
            "import os\nprint(os.environ.get('KAIZEN_SHARED_RESOURCES_DIR'))\n",
        ))
        .await;
    assert_eq!((status, stdout(&body)), (200, "None\n"), "{body}");
    admin(&stack, &["room", "create", "empty", "--member", "ann"]);
    let (status, body) = stack
        .run(run(
            "ann",
            "empty",
            "import os\nprint(os.environ.get('KAIZEN_SHARED_RESOURCES_MANIFEST'))\n",
        ))
        .await;
    assert_eq!((status, stdout(&body)), (200, "None\n"), "{body}");
    assert_eq!(
        body["model"]["resources"]["no_file_attached"], true,
        "{body}"
    );
}

/// Holds the pool's only worker with a run of `seconds`, and queues `runs` behind it; once each
/// is admitted (a ticket waits for it), `change` alters the rooms, and the runs' answers are
/// returned. Fails, rather than passing for the wrong reason, if the holding run ended before
/// the change was made.
async fn while_queued(stack: &Stack, runs: Vec<Value>, change: impl FnOnce()) -> Vec<(u16, Value)> {
    let hold_seconds = 12;
    let caller = stack.caller.clone();
    let holding = tokio::spawn(async move {
        caller
            .run_code(&run(
                "holder",
                "holding",
                &format!("import time\ntime.sleep({hold_seconds})\n"),
            ))
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while stack.doc().await.counts().leased < 1 {
        assert!(Instant::now() < deadline, "the holding run never leased");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let count = runs.len();
    let mut queued = Vec::new();
    for body in runs {
        let caller = stack.caller.clone();
        queued.push(tokio::spawn(async move { caller.run_code(&body).await }));
    }
    while stack.doc().await.tickets().count() < count {
        assert!(Instant::now() < deadline, "the runs were never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    change();
    assert!(
        !holding.is_finished(),
        "the holding run ended before the change: the runs were not held between admission and dispatch"
    );
    let (status, body) = holding.await.unwrap().unwrap();
    assert_eq!(status, 200, "{body}");
    let mut answers = Vec::new();
    for run in queued {
        answers.push(run.await.unwrap().expect("the API answers"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proj_03_proj_04_proj_07_what_changes_between_admission_and_dispatch_is_judged_by_the_rules()
 {
    let test = "proj_03_proj_04_proj_07_what_changes_between_admission_and_dispatch_is_judged_by_the_rules";
    let Some(stack) = Stack::start(
        test,
        &[
            ("SANDBOX_WARM_POOL_MIN", "1"),
            ("SANDBOX_POOL_TARGET_IDLE", "0"),
            ("SANDBOX_POOL_MAX_ALLOCATED", "1"),
            ("SANDBOX_MAX_CONCURRENT_CREATES", "1"),
            ("SANDBOX_MAX_CONCURRENT_PER_MEMBER", "1"),
            ("SANDBOX_ACQUIRE_WAIT_SECONDS", "120"),
        ],
        &[],
    ) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while stack.settled().await.counts().warm < 1 {
        assert!(Instant::now() < deadline, "no warm worker");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // PROJ-3: a private room's selection; someone joins between admission and loading.
    for (room, member) in [("solo-asks", "amy"), ("solo-plain", "ada")] {
        admin(&stack, &["room", "create", room, "--member", member]);
        let (picked, _) = document(&stack, member, "library.pdf", b"%PDF-1.4 lib\n%%EOF\n", &[]);
        admin(&stack, &["select", room, member, &picked]);
    }
    // PROJ-7: the run's own new link, another's link, a revision of an admitted file.
    for (room, member) in [("own", "abe"), ("other", "ari"), ("revised", "ava")] {
        admin(
            &stack,
            &[
                "room", "create", room, "--member", member, "--member", "zed",
            ],
        );
        let (doc, _) = document(&stack, member, "plan.docx", b"PK plan v1", &[]);
        admin(&stack, &["link", room, &doc]);
    }
    let (admitted_doc, admitted_root) = {
        let listed = admin(&stack, &["list", "revised"]);
        let doc = &listed["documents"][0];
        (
            doc["reference"].as_str().unwrap().to_owned(),
            doc["root"].as_str().unwrap().to_owned(),
        )
    };
    let mut own = run("abe", "own", READ_ALL);
    own["turn"] = json!("turn-7");
    let runs = vec![
        run("amy", "solo-asks", READ_ALL),
        run("ada", "solo-plain", "print('plain computation')\n"),
        own,
        run("ari", "other", READ_ALL),
        run("ava", "revised", READ_ALL),
    ];
    let answers = while_queued(&stack, runs, || {
        admin(&stack, &["room", "add-member", "solo-asks", "bo"]);
        admin(&stack, &["room", "add-member", "solo-plain", "bo"]);
        let (chart, _) = document(&stack, "abe", "chart.png", b"\x89PNG own", &[]);
        admin(
            &stack,
            &["link", "own", &chart, "--turn", "turn-7", "--member", "abe"],
        );
        let (foreign, _) = document(&stack, "zed", "extra.txt", b"zed's", &[]);
        admin(
            &stack,
            &[
                "link", "other", &foreign, "--turn", "turn-9", "--member", "zed",
            ],
        );
        let (v2, _) = document(
            &stack,
            "ava",
            "plan.docx",
            b"PK plan v2",
            &["--revises", &admitted_root],
        );
        admin(&stack, &["link", "revised", &v2]);
    })
    .await;
    // The selection was the asked-for sole source: the member is told the audience changed.
    let (status, body) = &answers[0];
    assert_eq!(
        (*status, code_of(body)),
        (409, "resource_audience_changed"),
        "{body}"
    );
    // A plain computation is never refused for a selection: it is withheld, and logged.
    let (status, body) = &answers[1];
    assert_eq!(
        (*status, stdout(body)),
        (200, "plain computation\n"),
        "{body}"
    );
    assert_eq!(
        body["model"]["resources"]["withheld"]["event"], "run_code.private_selection_withheld",
        "{body}"
    );
    assert_eq!(
        body["model"]["resources"]["withheld"]["reason"],
        "resource_audience_changed"
    );
    // ...and counted under its event and reason.
    let (_, metrics) = stack.caller.get("/metrics").await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains(
            "corral_events_total{event=\"run_code.private_selection_withheld\",reason=\"resource_audience_changed\"} 1"
        ),
        "{metrics}"
    );
    // The turn's own link does not stop it, and is not projected in it.
    let (status, body) = &answers[2];
    assert_eq!(
        (*status, stdout(body)),
        (200, "plan.docx 1 document 10 True\n"),
        "{body}"
    );
    // Anything else that changed stops the run.
    let (status, body) = &answers[3];
    assert_eq!(
        (*status, code_of(body)),
        (409, "resource_changed"),
        "{body}"
    );
    assert_eq!(body["error"]["resource"]["retry"], true, "{body}");
    // A revision of an admitted file refuses the run...
    let (status, body) = &answers[4];
    assert_eq!(
        (*status, code_of(body)),
        (409, "resource_revised"),
        "{body}"
    );
    // ...and from the next turn both versions are projected, told apart by the manifest.
    let (status, body) = stack.run(run("ava", "revised", READ_ALL)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        stdout(&body),
        "plan.docx 1 document 10 True\nv2-plan.docx 2 document 10 True\n",
        "{body}"
    );
    assert_eq!(
        body["model"]["resources"]["files"][0]["reference"],
        admitted_doc
    );
    // The next turn in the own-link room projects the link too.
    let (_, body) = stack.run(run("abe", "own", READ_ALL)).await;
    assert_eq!(
        stdout(&body),
        "plan.docx 1 document 10 True\nchart.png 1 document 8 True\n",
        "{body}"
    );

    // PROJ-3: a member reaching the room through a project counts: the selection is never
    // considered, and a run that asks is told no file is attached.
    admin(&stack, &["project", "create", "proj"]);
    admin(&stack, &["project", "add-member", "proj", "cy"]);
    admin(
        &stack,
        &[
            "room",
            "create",
            "in-project",
            "--project",
            "proj",
            "--member",
            "amy",
        ],
    );
    let (picked, _) = document(&stack, "amy", "private.csv", b"a\n1\n", &[]);
    admin(&stack, &["select", "in-project", "amy", &picked]);
    let (status, body) = stack.run(run("amy", "in-project", LOOK_AROUND)).await;
    assert_eq!((status, stdout(&body)), (200, "none\n"), "{body}");
    assert_eq!(
        body["model"]["resources"]["withheld"],
        Value::Null,
        "{body}"
    );
    // Without the project's member, it is a private room: the selection joins every run.
    admin(&stack, &["project", "remove-member", "proj", "cy"]);
    let (status, body) = stack.run(run("amy", "in-project", LOOK_AROUND)).await;
    assert_eq!(
        (status, stdout(&body)),
        (200, "['private.csv']\n"),
        "{body}"
    );

    // PROJ-3, PROJ-4: the room's files and the selection together over the bound: the selection
    // is withheld (the combined-bound event) and the run proceeds on the room's files.
    admin(&stack, &["room", "create", "bounded", "--member", "ada"]);
    let (room_file, _) = document(&stack, "ada", "room.bin", &vec![b'r'; 6 << 20], &[]);
    admin(&stack, &["link", "bounded", &room_file]);
    let (big_pick, _) = document(&stack, "ada", "pick.bin", &vec![b'p'; 3 << 20], &[]);
    admin(&stack, &["select", "bounded", "ada", &big_pick]);
    let (status, body) = stack.run(run("ada", "bounded", READ_ALL)).await;
    assert_eq!(
        (status, stdout(&body)),
        (200, "room.bin 1 document 6291456 True\n"),
        "{body}"
    );
    assert_eq!(
        body["model"]["resources"]["withheld"]["event"], "sandbox.private_selection_withheld",
        "{body}"
    );
    assert_eq!(
        body["model"]["resources"]["withheld"]["reason"],
        "resource_over_bytes"
    );
    // A selected file still processing, as the sole source of a run that asked: its reason.
    admin(&stack, &["room", "create", "pending", "--member", "ada"]);
    let (pending, _) = document(
        &stack,
        "ada",
        "pending.pdf",
        b"%PDF",
        &["--processing", "processing"],
    );
    admin(&stack, &["select", "pending", "ada", &pending]);
    let (status, body) = stack.run(run("ada", "pending", READ_ALL)).await;
    assert_eq!(
        (status, code_of(&body)),
        (422, "resource_not_ready"),
        "{body}"
    );
    // The same selection does not refuse a plain computation.
    let (status, body) = stack.run(run("ada", "pending", "print(6 * 7)\n")).await;
    assert_eq!((status, stdout(&body)), (200, "42\n"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_01_out_02_out_03_an_output_is_linked_into_the_room_and_nothing_else_of_the_workspace()
{
    let test =
        "out_01_out_02_out_03_an_output_is_linked_into_the_room_and_nothing_else_of_the_workspace";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    admin(
        &stack,
        &[
            "room", "create", "team", "--member", "ann", "--member", "bob",
        ],
    );
    let (brief, _) = document(&stack, "ann", "brief.txt", b"the brief\n", &[]);
    admin(&stack, &["link", "team", &brief]);
    // Ann's run writes a private scratch file and a returned output.
    let mut body = run(
        "ann",
        "team",
        "open('/workspace/scratch-secret.txt', 'w').write('private notes')\n\
         open('/workspace/summary.csv', 'w').write('k,v\\n1,2\\n')\n\
         print('written')\n",
    );
    body["declared_outputs"] = json!(["summary.csv"]);
    let (status, answer) = stack.run(body).await;
    assert_eq!(status, 200, "{answer}");
    let linked = answer["model"]["resources"]["linked"]
        .as_array()
        .unwrap()
        .clone();
    let summary = linked
        .iter()
        .find(|l| l["path"] == "summary.csv")
        .unwrap_or_else(|| panic!("summary.csv not linked: {answer}"));
    let reference = summary["reference"].as_str().unwrap();
    // OUT-2: the member's rows carry references only, no path and no diagnostics.
    let member_linked = answer["member"]["linked"].as_array().unwrap();
    assert!(
        member_linked.iter().any(|l| l["reference"] == reference),
        "{answer}"
    );
    assert!(
        member_linked.iter().all(|l| l.get("path").is_none()),
        "{answer}"
    );
    // The room now lists it, by a metadata-only reference, under Ann.
    let listed = admin(&stack, &["list", "team"]);
    let names: Vec<&str> = listed["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"summary.csv"), "{listed}");
    assert!(!names.contains(&"scratch-secret.txt"), "{listed}");
    // OUT-3: Bob's next turn reads the linked output and the brief, and nothing else of Ann's.
    let (status, bob) = stack
        .run(run(
            "bob",
            "team",
            "import json, os\n\
             listed = json.loads(os.environ['KAIZEN_SHARED_RESOURCES_MANIFEST'])\n\
             print(sorted(e['filename'] for e in listed))\n\
             print(open([e for e in listed if e['filename'] == 'summary.csv'][0]['path']).read().splitlines())\n\
             print(os.listdir('/workspace'))\n",
        ))
        .await;
    assert_eq!(status, 200, "{bob}");
    assert_eq!(
        stdout(&bob),
        "['brief.txt', 'summary.csv']\n['k,v', '1,2']\n[]\n",
        "{bob}"
    );
    // Ann's workspace stays hers: Bob's reads of the same conversation are his own workspace.
    let (status, _) = stack.read("bob", "team", "scratch-secret.txt").await;
    assert_eq!(status, 404);
    let (status, bytes) = stack.read("ann", "team", "scratch-secret.txt").await;
    assert_eq!((status, bytes.as_slice()), (200, &b"private notes"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_07_declared_outputs_stream_as_transient_progress_replaced_by_references() {
    let test = "ws_07_declared_outputs_stream_as_transient_progress_replaced_by_references";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    // Two declared names: one the run writes, one it never does (a declaration grants nothing).
    let mut body = run(
        "ann",
        "progress",
        "open('/workspace/chart.csv', 'w').write('x,y\\n1,2\\n')\nprint('done')\n",
    );
    body["declared_outputs"] = json!(["chart.csv", "never-written.csv"]);
    let mut events = stack.caller.run_code_events(&body).await.unwrap();
    // The code's output streams between (`run.output`, tests/streams.rs); this test is about
    // the declared outputs.
    let output: String = events
        .iter()
        .filter(|(name, _)| name == "run.output")
        .map(|(_, data)| data["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(output, "done\n", "{events:?}");
    events.retain(|(name, _)| name != "run.output");
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["run.queued", "run.running", "run.result"],
        "{events:?}"
    );
    for (_, data) in &events[..2] {
        let declared = data["declared"].as_array().unwrap();
        assert_eq!(declared.len(), 2, "{data}");
        for entry in declared {
            assert_eq!(entry["downloadable"], false, "{data}");
            assert_eq!(entry["state"], "in_progress", "{data}");
            assert!(entry.get("reference").is_none(), "{data}");
        }
    }
    assert_eq!(events[0].1["run_id"], events[2].1["body"]["run_id"]);
    // At completion the validated references replace them: the written file only.
    let result = &events[2].1;
    assert_eq!(result["status"], 200, "{result}");
    let answer = &result["body"];
    assert_eq!(stdout(answer), "done\n", "{answer}");
    let references: Vec<&str> = answer["member"]["references"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(references, ["chart.csv"], "{answer}");
    // A refused request streams its refusal as the one result.
    let mut refused = run("ann", "progress", "print(1)\n");
    refused["declared_outputs"] = json!(["../escape.csv"]);
    let events = stack.caller.run_code_events(&refused).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "run.result");
    assert_eq!(events[0].1["status"], 400);
    assert_eq!(
        events[0].1["body"]["error"]["code"],
        "declared_output_invalid"
    );
}
