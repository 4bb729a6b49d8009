//! The workspace as clients expect it (issue 31), through `corral up`: its files listed with
//! kinds, sizes and the generation, and a text or binary file created by the rules a run's save
//! follows (create-only, all or nothing, the archive judge's codes), a created text file edited
//! at once by the anchors its answer shows, and the file seen by the next run. Needs root and
//! Valkey; without them each test skips through `corral_testkit::skip`, which CI forbids.

mod common;

use base64::Engine as _;
use common::stack::{Stack, encode, python, stdout};
use serde_json::{Value, json};

async fn list(stack: &Stack, actor: &str, conversation: &str) -> Value {
    let (status, body) = stack
        .caller
        .get(&format!(
            "/v1/list_workspace?actor={}&conversation={}",
            encode(actor),
            encode(conversation)
        ))
        .await
        .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

async fn write(stack: &Stack, body: Value) -> (u16, Value) {
    stack
        .caller
        .post("/v1/write_workspace", &body)
        .await
        .unwrap()
}

fn code(answer: &Value) -> &str {
    answer["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_file_is_listed_edited_by_its_anchors_and_seen_by_the_next_run() {
    let test = "a_created_file_is_listed_edited_by_its_anchors_and_seen_by_the_next_run";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let (a, c) = ("fay", "files");
    assert_eq!(
        list(&stack, a, c).await,
        json!({ "generation": 0, "files": [], "bytes_total": 0,
                "bytes_max": list(&stack, a, c).await["bytes_max"] })
    );
    let (status, created) = write(
        &stack,
        json!({ "actor": a, "conversation": c, "path": "notes/plan.txt", "text": "alpha\nbeta\n" }),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["generation"], 1, "{created}");
    let view = &created["hashline"];
    assert_eq!(view["total_lines"], 2, "{created}");
    // A binary file beside it, by base64: no Hashline view.
    let binary = [0u8, 0xff, 0xfe, 7];
    let (status, blob) = write(
        &stack,
        json!({ "actor": a, "conversation": c, "path": "data.bin",
                "base64": base64::engine::general_purpose::STANDARD.encode(binary) }),
    )
    .await;
    assert_eq!((status, &blob["generation"]), (201, &json!(2)), "{blob}");
    assert!(blob.get("hashline").is_none(), "{blob}");
    let listed = list(&stack, a, c).await;
    assert_eq!(listed["generation"], 2, "{listed}");
    let files: Vec<(String, String, u64)> = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["kind"].as_str().unwrap().to_owned(),
                f["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    // Sorted by path, with the directory the file implies.
    assert_eq!(
        files,
        [
            ("data.bin".to_owned(), "file".to_owned(), 4),
            ("notes".to_owned(), "directory".to_owned(), 0),
            ("notes/plan.txt".to_owned(), "file".to_owned(), 11)
        ],
        "{listed}"
    );
    assert_eq!(stack.read(a, c, "data.bin").await, (200, binary.to_vec()));
    // The answer's anchors edit the created file at once.
    let line = view["lines"].as_str().unwrap().lines().nth(1).unwrap();
    let (number, rest) = line.split_once(':').unwrap();
    let tag = rest.split_once('|').unwrap().0;
    let (status, edited) = stack
        .caller
        .post(
            "/v1/edit_workspace",
            &json!({ "actor": a, "conversation": c, "path": "notes/plan.txt",
                     "edits": [{ "op": "replace", "line": number.parse::<u32>().unwrap(),
                                 "tag": tag, "text": "gamma" }] }),
        )
        .await
        .unwrap();
    assert_eq!(
        (status, &edited["outcome"]),
        (200, &json!("applied")),
        "{edited}"
    );
    // The next run sees both files as they are now.
    let (status, ran) = stack
        .run(python(
            a,
            c,
            "print(open('notes/plan.txt').read(), end='')\nprint(list(open('data.bin', 'rb').read()))",
        ))
        .await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(stdout(&ran), "alpha\ngamma\n[0, 255, 254, 7]\n", "{ran}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_a_runs_save_would_refuse_is_refused_with_its_code_and_changes_nothing() {
    let test =
        "a_create_that_a_runs_save_would_refuse_is_refused_with_its_code_and_changes_nothing";
    // A small workspace bound, to reach it.
    let Some(stack) = Stack::start(test, &[("SANDBOX_WORKSPACE_MAX_BYTES", "65536")], &[]) else {
        return;
    };
    let (a, c) = ("gus", "refusals");
    let body = |path: &str, text: &str| json!({ "actor": a, "conversation": c, "path": path, "text": text });
    let (status, _) = write(&stack, body("kept.txt", "one\n")).await;
    assert_eq!(status, 201);
    let cases: Vec<(Value, u16, &str)> = vec![
        (body("kept.txt", "two\n"), 409, "workspace_path_exists"),
        (body("kept.txt/under", "x"), 400, "archive_path_under_file"),
        (body("../escape.txt", "x"), 400, "archive_path_parent"),
        (body("/etc/passwd", "x"), 400, "archive_path_absolute"),
        (
            body("a/./b", "x"),
            400,
            "archive_path_dot_or_empty_component",
        ),
        (body("", "x"), 400, "archive_path_empty"),
        (
            body("big.txt", &"x".repeat(70_000)),
            413,
            "archive_too_large",
        ),
        (
            json!({ "actor": a, "conversation": c, "path": "both", "text": "x", "base64": "eA==" }),
            400,
            "content_invalid",
        ),
        (
            json!({ "actor": a, "conversation": c, "path": "bad", "base64": "not base64!" }),
            400,
            "content_not_base64",
        ),
        (
            body("x", "x")
                .as_object()
                .map(|o| {
                    let mut o = o.clone();
                    o.insert("actor".into(), json!(""));
                    Value::Object(o)
                })
                .unwrap(),
            400,
            "invalid_identity",
        ),
    ];
    for (request, status, expected) in cases {
        let (got, answer) = write(&stack, request.clone()).await;
        assert_eq!(
            (got, code(&answer)),
            (status, expected),
            "{request}: {answer}"
        );
    }
    let listed = list(&stack, a, c).await;
    assert_eq!(listed["generation"], 1, "{listed}");
    assert_eq!(listed["files"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(stack.read(a, c, "kept.txt").await, (200, b"one\n".to_vec()));
}
