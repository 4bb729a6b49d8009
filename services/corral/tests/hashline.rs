//! Hashline reads and edits through the whole stack (WS-3 to WS-5, decision 0017): `corral up`,
//! files written by runs, read with tags and edited by anchors through the API as an agent
//! platform would. Needs root and Valkey; without them each test skips through
//! `corral_testkit::skip`, which CI forbids.

mod common;

use std::path::{Path, PathBuf};

use common::stack::{Stack, encode, python, stdout};
use serde_json::{Value, json};

/// Runs `code` in `conversation` of actor `ann`; the answer.
async fn run(stack: &Stack, conversation: &str, code: &str) -> Value {
    let (status, body) = stack.run(python("ann", conversation, code)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "succeeded", "{body}");
    body
}

/// Writes `text` to `path` in a run.
async fn write(stack: &Stack, conversation: &str, path: &str, text: &str) {
    run(
        stack,
        conversation,
        &format!("open({path:?}, 'w', newline='').write({text:?})\n"),
    )
    .await;
}

async fn read_tagged(
    stack: &Stack,
    conversation: &str,
    path: &str,
    range: Option<(u32, u32)>,
) -> (u16, Value) {
    let mut query = format!(
        "/v1/read_workspace?actor=ann&conversation={}&path={}&view=hashline",
        encode(conversation),
        encode(path)
    );
    if let Some((start, count)) = range {
        query.push_str(&format!("&start={start}&count={count}"));
    }
    let (status, body) = stack.caller.get(&query).await.expect("the API answers");
    (status, serde_json::from_slice(&body).expect("JSON"))
}

async fn edit(stack: &Stack, conversation: &str, path: &str, edits: Value) -> (u16, Value) {
    stack
        .caller
        .post(
            "/v1/edit_workspace",
            &json!({ "actor": "ann", "conversation": conversation, "path": path, "edits": edits }),
        )
        .await
        .expect("the API answers")
}

async fn raw(stack: &Stack, conversation: &str, path: &str) -> String {
    let (status, bytes) = stack.read("ann", conversation, path).await;
    assert_eq!(status, 200);
    String::from_utf8(bytes).unwrap()
}

/// Every object stored for this stack's workspaces, by path, with its bytes.
fn stored(stack: &Stack) -> Vec<(PathBuf, Vec<u8>)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&stack.state.join("workspaces"), &mut out);
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_03_a_file_is_edited_through_its_tags_and_stale_or_unshown_anchors_are_refused() {
    let test = "ws_03_a_file_is_edited_through_its_tags_and_stale_or_unshown_anchors_are_refused";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    write(&stack, "h1", "notes.txt", "alpha\nbeta\ngamma\n").await;
    let (status, view) = read_tagged(&stack, "h1", "notes.txt", Some((1, 2))).await;
    assert_eq!(status, 200, "{view}");
    let tag = view["tag"].as_str().unwrap().to_owned();
    assert_eq!(view["lines"], format!("1:{tag}|alpha\n2:{tag}|beta\n"));
    assert_eq!(view["total_lines"], 3);
    // Line 3 was never shown.
    let (status, refused) = edit(
        &stack,
        "h1",
        "notes.txt",
        json!([{ "op": "replace", "tag": tag, "line": 3, "text": "GAMMA" }]),
    )
    .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("anchor_not_shown")),
        "{refused}"
    );
    // Line 2 was: replaced, and the run after sees it.
    let (status, applied) = edit(
        &stack,
        "h1",
        "notes.txt",
        json!([{ "op": "replace", "tag": tag, "line": 2, "text": "BETA\nbeta two" },
               { "op": "insert_after", "tag": tag, "line": 0, "text": "top" }]),
    )
    .await;
    assert_eq!(status, 200, "{applied}");
    assert_eq!(applied["outcome"], "applied");
    let new_tag = applied["tag"].as_str().unwrap().to_owned();
    assert_eq!(
        applied["lines"],
        format!("1:{new_tag}|top\n3:{new_tag}|BETA\n4:{new_tag}|beta two\n")
    );
    assert_eq!(
        raw(&stack, "h1", "notes.txt").await,
        "top\nalpha\nBETA\nbeta two\ngamma\n"
    );
    let body = run(
        &stack,
        "h1",
        "print(open('notes.txt').read().count('\\n'))\n",
    )
    .await;
    assert_eq!(stdout(&body), "5\n");
    // The old tag is stale; so is the new one once a run changed the file.
    let (status, stale) = edit(
        &stack,
        "h1",
        "notes.txt",
        json!([{ "op": "delete", "tag": tag, "line": 1 }]),
    )
    .await;
    assert_eq!(
        (status, stale["error"]["code"].as_str()),
        (409, Some("stale_anchor")),
        "{stale}"
    );
    run(&stack, "h1", "open('notes.txt', 'a').write('more\\n')\n").await;
    let (status, stale) = edit(
        &stack,
        "h1",
        "notes.txt",
        json!([{ "op": "delete", "tag": new_tag, "line": 1 }]),
    )
    .await;
    assert_eq!(
        (status, stale["error"]["code"].as_str()),
        (409, Some("stale_anchor")),
        "{stale}"
    );
    // Bad input: a malformed tag, an unknown one, a path outside the workspace, a binary file.
    let (status, bad) = edit(
        &stack,
        "h1",
        "notes.txt",
        json!([{ "op": "delete", "tag": "12345", "line": 1 }]),
    )
    .await;
    assert_eq!(
        (status, bad["error"]["code"].as_str()),
        (422, Some("edit_invalid")),
        "{bad}"
    );
    let unknown = if new_tag == "0000" { "0001" } else { "0000" };
    let (status, bad) = edit(
        &stack,
        "h1",
        "notes.txt",
        json!([{ "op": "delete", "tag": unknown, "line": 1 }]),
    )
    .await;
    assert_eq!(
        (status, bad["error"]["code"].as_str()),
        (409, Some("unknown_tag")),
        "{bad}"
    );
    let (status, bad) = edit(
        &stack,
        "h1",
        "../etc/passwd",
        json!([{ "op": "delete", "tag": "abcd", "line": 1 }]),
    )
    .await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["path"], "../etc/passwd", "{bad}");
    run(
        &stack,
        "h1",
        "open('blob.bin', 'wb').write(bytes([0, 255, 1]))\n",
    )
    .await;
    let (status, bad) = read_tagged(&stack, "h1", "blob.bin", None).await;
    assert_eq!(
        (status, bad["error"]["code"].as_str()),
        (422, Some("file_not_text")),
        "{bad}"
    );
    let (status, bad) = edit(
        &stack,
        "h1",
        "notes.txt",
        json!([{ "op": "explode", "tag": "abcd", "line": 1 }]),
    )
    .await;
    assert_eq!(status, 400, "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_03_ws_05_colliding_texts_are_never_confused_and_a_failed_edit_changes_no_byte() {
    let test = "ws_03_ws_05_colliding_texts_are_never_confused_and_a_failed_edit_changes_no_byte";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let first = "line one 263\nline two 4471\n";
    let second = "line one 410\nline two 6970\n";
    write(&stack, "h2", "t.txt", first).await;
    let (_, view) = read_tagged(&stack, "h2", "t.txt", None).await;
    assert_eq!(view["tag"], "1d84", "{view}");
    // A run replaces the text with another of the same tag.
    write(&stack, "h2", "t.txt", second).await;
    let before = stored(&stack);
    let (status, refused) = edit(
        &stack,
        "h2",
        "t.txt",
        json!([{ "op": "replace", "tag": "1d84", "line": 1, "text": "confused" }]),
    )
    .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("stale_anchor")),
        "{refused}"
    );
    assert_eq!(stored(&stack), before, "a refused edit wrote nothing");
    // Shown again: the tag now names two versions, and neither is assumed.
    let (_, again) = read_tagged(&stack, "h2", "t.txt", None).await;
    assert_eq!(again["tag"], "1d84");
    let before = stored(&stack);
    let (status, refused) = edit(
        &stack,
        "h2",
        "t.txt",
        json!([{ "op": "replace", "tag": "1d84", "line": 2, "text": "confused" }]),
    )
    .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("stale_anchor")),
        "{refused}"
    );
    assert_eq!(stored(&stack), before, "a refused edit wrote nothing");
    assert_eq!(raw(&stack, "h2", "t.txt").await, second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_03_the_authority_record_is_in_no_tar_and_nowhere_a_run_can_read() {
    let test = "ws_03_the_authority_record_is_in_no_tar_and_nowhere_a_run_can_read";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    write(&stack, "h3", "a.txt", "one\ntwo\n").await;
    let (_, view) = read_tagged(&stack, "h3", "a.txt", None).await;
    let tag = view["tag"].as_str().unwrap();
    let (status, _) = edit(
        &stack,
        "h3",
        "a.txt",
        json!([{ "op": "yank", "tag": tag, "line": 1, "register": "keep" },
               { "op": "replace", "tag": tag, "line": 2, "text": "TWO" }]),
    )
    .await;
    assert_eq!(status, 200);
    // The record exists in the store, beside the snapshots, and in no snapshot.
    let objects = stored(&stack);
    let records: Vec<&(PathBuf, Vec<u8>)> = objects
        .iter()
        .filter(|(p, _)| p.to_string_lossy().contains("/hashline/"))
        .collect();
    assert!(!records.is_empty(), "no authority record stored");
    let marker = b"\"registers\":{\"keep\"";
    assert!(
        records
            .iter()
            .any(|(_, bytes)| bytes.windows(marker.len()).any(|w| w == marker))
    );
    for (path, bytes) in &objects {
        if path.extension().is_some_and(|e| e == "tar") {
            let mut archive = tar::Archive::new(&bytes[..]);
            for entry in archive.entries().unwrap() {
                let entry = entry.unwrap();
                let name = entry.path().unwrap().to_string_lossy().into_owned();
                assert!(!name.contains("hashline"), "{name} in {}", path.display());
            }
            assert!(
                !bytes.windows(marker.len()).any(|w| w == marker),
                "{}",
                path.display()
            );
        }
    }
    // A run searches everything it can read for the record.
    let body = run(
        &stack,
        "h3",
        "import os\nfound = []\nmarker = b'\"regis' + b'ters\":{\"keep\"'\n\
         for top in os.listdir('/'):\n\
         \x20   if top in ('proc', 'sys', 'dev'):\n\
         \x20       continue\n\
         \x20   for root, dirs, files in os.walk('/' + top):\n\
         \x20       for name in files:\n\
         \x20           path = os.path.join(root, name)\n\
         \x20           if 'hashline' in path:\n\
         \x20               found.append(path)\n\
         \x20               continue\n\
         \x20           if path.startswith(('/usr/', '/lib', '/bin/', '/sbin/', '/opt/')):\n\
         \x20               continue\n\
         \x20           try:\n\
         \x20               if os.path.islink(path) or os.path.getsize(path) > (1 << 20):\n\
         \x20                   continue\n\
         \x20               if marker in open(path, 'rb').read():\n\
         \x20                   found.append(path)\n\
         \x20           except OSError:\n\
         \x20               pass\n\
         print(found)\n",
    )
    .await;
    assert_eq!(stdout(&body), "[]\n", "{body}");
}
