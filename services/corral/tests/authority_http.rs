//! The resource authority's HTTP contract (`docs/resource-authority.openapi.yaml`, decision
//! 0020), against a small platform in this test that implements it: first the client on its
//! own (every answer the contract allows, and each way an authority can fail), then `corral up`
//! pointed at it, with runs projecting the platform's document and linking an output back.

mod common;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use common::stack::{Stack, stdout};
use corral_api::resources::{Authority, AuthorityError, JournalQuery, LinkRequest, ScopeQuery};
use corral_core::projection::Kind;
use serde_json::{Value, json};

const BYTES: &[u8] = b"platform bytes\n";

/// How the platform answers.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Mode {
    Contract = 0,
    NotJson = 1,
    MalformedDocument = 2,
    ServerError = 3,
    Oversized = 4,
    Forbidden = 5,
}

#[derive(Default)]
struct Platform {
    mode: AtomicU8,
    links: Mutex<Vec<Value>>,
}

fn document(digest: &str) -> Value {
    json!({ "reference": "plat-doc-1", "root": "plat-root-1", "version": 1, "kind": "document",
            "processing": "ready", "readable": true, "digest": digest,
            "media_type": "text/plain", "size": BYTES.len(), "name": "from the platform.txt" })
}

async fn rooms(
    State(platform): State<Arc<Platform>>,
    Path(op): Path<String>,
    Json(query): Json<Value>,
) -> Response {
    let mode = platform.mode.load(Ordering::SeqCst);
    if query["room"] != "plat-room" {
        return StatusCode::NOT_FOUND.into_response();
    }
    let digest = match mode {
        m if m == Mode::NotJson as u8 => return "<html>oops</html>".into_response(),
        m if m == Mode::ServerError as u8 => {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
        m if m == Mode::Forbidden as u8 => return StatusCode::FORBIDDEN.into_response(),
        m if m == Mode::Oversized as u8 => {
            return format!("{{\"pad\": \"{}\"}}", "x".repeat(5 << 20)).into_response();
        }
        m if m == Mode::MalformedDocument as u8 => "not-a-digest".to_owned(),
        _ => corral_core::ids::sha256_hex(BYTES),
    };
    let audience = json!({ "version": 3, "members": ["pia"] });
    match op.as_str() {
        "scope" => {
            Json(json!({ "audience": audience, "position": 10, "documents": [document(&digest)] }))
        }
        "audience" => Json(audience),
        "selection" => Json(json!({ "documents": [] })),
        "journal" => Json(json!({ "documents": [document(&digest)], "links": [] })),
        "link" => {
            platform.links.lock().unwrap().push(query);
            Json(json!({ "reference": "plat-out-1", "version": 1, "position": 11 }))
        }
        _ => return StatusCode::NOT_FOUND.into_response(),
    }
    .into_response()
}

/// Serves the platform on a free port; its base URL.
async fn serve(platform: Arc<Platform>) -> String {
    let app = axum::Router::new()
        .route("/v1/rooms/{op}", axum::routing::post(rooms))
        .with_state(platform);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn scope_query(room: &str) -> ScopeQuery {
    ScopeQuery {
        room: room.to_owned(),
        member: "pia".to_owned(),
        retrieved: Vec::new(),
    }
}

#[tokio::test]
async fn proj_08_the_http_client_reads_the_contract_and_names_each_failure() {
    let platform = Arc::new(Platform::default());
    let base = serve(platform.clone()).await;
    let authority = Authority::open(&base).unwrap();
    // The contract's answers.
    let scope = authority
        .scope(&scope_query("plat-room"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((scope.audience.version, scope.position), (3, 10));
    assert!(scope.audience.is_only("pia"));
    assert_eq!(scope.documents[0].reference, "plat-doc-1");
    assert!(scope.documents[0].readable);
    assert_eq!(authority.audience("plat-room").await.unwrap().version, 3);
    assert!(
        authority
            .selection("plat-room", "pia")
            .await
            .unwrap()
            .is_empty()
    );
    let journal = authority
        .journal(&JournalQuery {
            room: "plat-room".into(),
            member: "pia".into(),
            since: 10,
            retrieved: Vec::new(),
        })
        .await
        .unwrap();
    assert!(journal.links.is_empty());
    let linked = authority
        .link(&LinkRequest {
            room: "plat-room".into(),
            member: "pia".into(),
            turn: "t".into(),
            name: "out.csv".into(),
            digest: "ab".repeat(32),
            media_type: "text/csv".into(),
            size: 3,
            kind: Kind::Output,
        })
        .await
        .unwrap();
    assert_eq!(
        (linked.reference.as_str(), linked.position),
        ("plat-out-1", 11)
    );
    assert_eq!(platform.links.lock().unwrap()[0]["turn"], "t");
    // An unknown room is no scope, not an error.
    assert_eq!(
        authority.scope(&scope_query("elsewhere")).await.unwrap(),
        None
    );
    // Each failure, with its own code.
    for (mode, code) in [
        (Mode::NotJson, "resource_authority_invalid"),
        (Mode::MalformedDocument, "resource_authority_invalid"),
        (Mode::Oversized, "resource_authority_invalid"),
        (Mode::Forbidden, "resource_authority_invalid"),
        (Mode::ServerError, "resource_authority_unreachable"),
    ] {
        platform.mode.store(mode as u8, Ordering::SeqCst);
        let error = authority
            .scope(&scope_query("plat-room"))
            .await
            .unwrap_err();
        assert_eq!(error.code(), code, "{error}");
    }
    // Down: nothing listens.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let down = Authority::open(&format!("http://127.0.0.1:{port}")).unwrap();
    assert!(matches!(
        down.scope(&scope_query("plat-room")).await,
        Err(AuthorityError::Unreachable(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proj_01_out_01_corral_up_projects_and_links_through_the_http_contract() {
    let test = "proj_01_out_01_corral_up_projects_and_links_through_the_http_contract";
    let platform = Arc::new(Platform::default());
    let base = serve(platform.clone()).await;
    let Some(stack) = Stack::start(test, &[("CORRAL_RESOURCE_AUTHORITY_URL", &base)], &[]) else {
        return;
    };
    // The platform describes the document; its bytes are in Corral's object store by digest.
    let res = stack.state.join("workspaces/res");
    std::fs::create_dir_all(&res).unwrap();
    std::fs::write(res.join(corral_core::ids::sha256_hex(BYTES)), BYTES).unwrap();
    let mut body = json!({ "actor": "pia", "conversation": "plat-room", "member": "pia",
        "language": "python", "turn": "turn-1", "declared_outputs": ["answer.txt"],
        "code": "import json, os\n\
                 e = json.loads(os.environ['KAIZEN_SHARED_RESOURCES_MANIFEST'])[0]\n\
                 text = open(e['path']).read()\n\
                 open('/workspace/answer.txt', 'w').write(text.upper())\n\
                 print(e['filename'], e['reference'], repr(text))\n" });
    let (status, answer) = stack.run(body.clone()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        stdout(&answer),
        "from the platform.txt plat-doc-1 'platform bytes\\n'\n",
        "{answer}"
    );
    assert_eq!(
        answer["model"]["resources"]["linked"][0]["reference"], "plat-out-1",
        "{answer}"
    );
    let link = platform.links.lock().unwrap()[0].clone();
    assert_eq!(
        (
            link["turn"].as_str(),
            link["member"].as_str(),
            link["name"].as_str()
        ),
        (Some("turn-1"), Some("pia"), Some("answer.txt")),
        "{link}"
    );
    assert_eq!(
        link["digest"],
        corral_core::ids::sha256_hex(b"PLATFORM BYTES\n")
    );
    // The linked bytes are where the contract says: in the object store under their digest.
    let stored = std::fs::read(res.join(link["digest"].as_str().unwrap())).unwrap();
    assert_eq!(stored, b"PLATFORM BYTES\n");
    // A platform answering garbage, or failing, fails the run closed with its own reason; the
    // code never runs and nothing falls back to running without the files.
    for (mode, status, code) in [
        (Mode::NotJson, 502, "resource_authority_invalid"),
        (Mode::MalformedDocument, 502, "resource_authority_invalid"),
        (Mode::ServerError, 503, "resource_authority_unreachable"),
    ] {
        platform.mode.store(mode as u8, Ordering::SeqCst);
        body["code"] = json!("open('/workspace/ran.txt', 'w').write('1')\n");
        let (got, answer) = stack.run(body.clone()).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{answer}"
        );
    }
    let (status, _) = stack.read("pia", "plat-room", "ran.txt").await;
    assert_eq!(status, 404, "the code never ran");
    // The platform recovered: the next run projects again.
    platform.mode.store(Mode::Contract as u8, Ordering::SeqCst);
    body["code"] =
        json!("import os\nprint(sorted(os.listdir(os.environ['KAIZEN_SHARED_RESOURCES_DIR'])))\n");
    let (status, answer) = stack.run(body).await;
    assert_eq!(
        (status, stdout(&answer)),
        (200, "['from the platform.txt']\n"),
        "{answer}"
    );
}
