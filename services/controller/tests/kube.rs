//! The `kube` and agent-sandbox backends against a fake Kubernetes API server.
//!
//! This is a mock, not a cluster: no kube-apiserver, kind, k3s or envtest binary can be obtained
//! on the machines these tests run on. The fake is a small axum server on 127.0.0.1 (over TLS with
//! a CA made in the test, for the in-cluster configuration) that each test starts; the backends
//! talk to it through kube's real HTTP client, so requests, status codes, headers, watch streams
//! and timeouts travel over a real socket. It keeps objects in memory and implements only what the
//! backends use, the way the real API server answers it:
//! - create (409 `AlreadyExists` on a taken name), get, delete (uid preconditions: 409 `Conflict`
//!   on a mismatch; a graceful delete keeps the object, with its `deletionTimestamp`, for a few
//!   more GETs), list by label selector (paged when asked, with continue tokens);
//! - resourceVersions: every change gets the next one and is kept in a history; a list answers
//!   the current one, and a watch from a resourceVersion streams every change after it and stays
//!   open (newline-delimited JSON) until its `timeoutSeconds`. A compaction drops the history: a
//!   watch or continue token from before it is answered 410 (an `ERROR` event with an `Expired`
//!   Status, or an HTTP 410 `Gone`), and an open watch that falls behind it gets that event;
//! - 429 `TooManyRequests` with `Retry-After` (a Status with `details.retryAfterSeconds`, or the
//!   plain-text answer of priority and fairness with only the header); 401 without the bearer
//!   token it was told to expect.
//!
//! Knobs make it hang a create before or after acting (a lost answer), fail a create or a delete,
//! replace an object behind a reader's back, keep pods Pending, and compact. The kubelet is a
//! rule: pending objects become Ready when a watch on them starts (or never). What the fake cannot
//! show is the real server's admission and validation of the manifests; the golden tests assert
//! those fields instead.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use corral_controller::Backend;
use corral_controller::claim::{
    AgentSandbox, AgentSandboxBackend, ClaimSettings, parse_rfc3339, rfc3339,
};
use corral_controller::kube::{
    AppArmor, KubeBackend, KubeSettings, Seccomp, THROTTLE_WAIT_DEFAULT, THROTTLE_WAIT_MAX,
    THROTTLED_RETRIES_MAX, client_from, incluster_config_from, object_name, pool_selector,
    worker_pod, worker_pod_template, worker_service,
};
use corral_core::ids::{ImageId, WorkerId};
use corral_core::pool::Outcome;
use corral_core::time::UnixMillis;

const NS: &str = "corral-workers";
const POOL: &str = "main";
const IMAGE: &str = "registry.invalid/corral-worker@sha256:0123";

/// One change, as a watch replays it.
struct Change {
    resource_version: u64,
    plural: String,
    kind: &'static str,
    object: Value,
}

/// Requests the fake answers 429.
struct Throttle {
    method: Method,
    plural: String,
    /// How many more.
    remaining: u32,
    /// The `Retry-After` it names, in seconds.
    retry_after_s: Option<u64>,
    /// Priority and fairness's plain-text answer with only the header, rather than a Status.
    plain_text: bool,
}

/// The fake API server's state and knobs.
#[derive(Default)]
struct Fake {
    /// Objects by (plural, name).
    objects: BTreeMap<(String, String), Value>,
    resource_version: u64,
    /// Every change since the last compaction, oldest first.
    history: Vec<Change>,
    /// A watch or continue token from a resourceVersion below this is answered 410.
    compacted_below: u64,
    /// Sent the resourceVersion after every change; open watches wait on it.
    changed: tokio::sync::watch::Sender<u64>,
    /// Counts watches that started streaming; tests wait on it rather than sleeping.
    streaming: tokio::sync::watch::Sender<u32>,
    /// A plural whose creates never answer and never act.
    hang_create: Option<String>,
    /// A plural whose next creates act, then never answer (the answer is lost).
    lose_create_answers: Option<(String, u32)>,
    /// The uids of objects made by creates whose answers were lost.
    lost_uids: Vec<String>,
    /// A plural whose creates are held unanswered, and act only once `land` says so (a request
    /// that the server processes after its client gave up on it).
    land_late: Option<String>,
    land: tokio::sync::watch::Sender<bool>,
    /// Held creates that have been processed since.
    landed: u32,
    /// A plural whose creates answer with this status code.
    fail_create: Option<(String, u16)>,
    /// A plural whose deletes answer with this status code (after doing nothing).
    fail_delete: Option<(String, u16)>,
    /// After the next GET of (plural, name), the object is replaced by a new one (a new uid) with
    /// these labels, as if deleted and created again behind the reader's back.
    replace_after_get: Option<((String, String), Value)>,
    /// How many more GETs a deleted object stays visible for.
    linger_gets: u32,
    lingering: BTreeMap<(String, String), u32>,
    /// Watches closed without any event before objects become ready.
    closes_before_ready: u32,
    /// Objects never become ready (a pod stays Pending, unschedulable).
    never_ready: bool,
    /// The next lists are each followed by a compaction.
    compact_after_lists: u32,
    /// The kubelet marks pending objects ready just before such a compaction.
    ready_at_compaction: bool,
    /// An expired watch is answered with an HTTP 410 rather than an `ERROR` event.
    expired_watch_as_http: bool,
    /// 410s answered: watches and continue tokens.
    expired: u32,
    /// Items per list page; the server may return fewer items than the limit asked.
    page_size: Option<usize>,
    throttle: Option<Throttle>,
    /// Requests must carry `Authorization: Bearer` this.
    bearer: Option<String>,
    unauthorized: u32,
    lists: u32,
    watches: u32,
    /// Every request: method, path and query; `at` holds when each arrived.
    log: Vec<String>,
    at: Vec<Instant>,
    /// Bodies of DELETE requests.
    delete_bodies: Vec<Value>,
}

type Shared = Arc<Mutex<Fake>>;

fn status_json(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
}

fn status(code: u16, reason: &str) -> Response {
    status_with(code, reason, reason)
}

fn status_with(code: u16, reason: &str, message: &str) -> Response {
    let code_ = StatusCode::from_u16(code).expect("status code");
    (code_, axum::Json(status_json(code, reason, message))).into_response()
}

/// The API server's 429: a Status with `retryAfterSeconds` and the header, or priority and
/// fairness's plain text with only the header.
fn too_many_requests(retry_after_s: Option<u64>, plain_text: bool) -> Response {
    let mut response = if plain_text {
        (
            StatusCode::TOO_MANY_REQUESTS,
            "Too many requests, please try again later.\n",
        )
            .into_response()
    } else {
        let mut body = status_json(
            429,
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        );
        if let Some(seconds) = retry_after_s {
            body["details"] = json!({ "retryAfterSeconds": seconds });
        }
        (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response()
    };
    if let Some(seconds) = retry_after_s {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, seconds.into());
    }
    response
}

fn matches_selector(object: &Value, selector: Option<&str>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (key, value) = term.split_once('=').expect("equality selector");
        object["metadata"]["labels"][key] == value
    })
}

fn is_ready(object: &Value) -> bool {
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|all| {
            all.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn set_ready(plural: &str, object: &mut Value) {
    object["status"] = if plural == "pods" {
        json!({ "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] })
    } else {
        json!({ "conditions": [{ "type": "Ready", "status": "True", "reason": "SandboxReady" }] })
    };
}

/// Splits `/api/v1/namespaces/{ns}/{plural}[/{name}]` (or the `/apis/{group}/{version}/…` form).
fn route(path: &str) -> Option<(String, Option<String>)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..)?,
        Some(&"apis") => segments.get(3..)?,
        _ => return None,
    };
    match rest {
        ["namespaces", _, plural] => Some(((*plural).to_owned(), None)),
        ["namespaces", _, plural, name] => Some(((*plural).to_owned(), Some((*name).to_owned()))),
        _ => None,
    }
}

impl Fake {
    /// Stores `object` under the next resourceVersion and tells every watch.
    fn put(&mut self, plural: &str, mut object: Value, kind: &'static str) -> Value {
        self.resource_version += 1;
        let version = self.resource_version;
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        let name = object["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_owned();
        self.objects
            .insert((plural.to_owned(), name), object.clone());
        self.record(plural, kind, object.clone());
        object
    }

    /// Removes an object as the API server does once nothing holds it any more.
    fn remove(&mut self, plural: &str, name: &str) -> Option<Value> {
        let object = self.objects.remove(&(plural.to_owned(), name.to_owned()))?;
        self.resource_version += 1;
        self.record(plural, "DELETED", object.clone());
        Some(object)
    }

    fn record(&mut self, plural: &str, kind: &'static str, object: Value) {
        self.history.push(Change {
            resource_version: self.resource_version,
            plural: plural.to_owned(),
            kind,
            object,
        });
        self.changed.send_replace(self.resource_version);
    }

    /// The kubelet: every pending object of `plural` that `selector` selects becomes Ready.
    fn make_ready(&mut self, plural: &str, selector: Option<&str>) {
        let pending: Vec<Value> = self
            .objects
            .iter()
            .filter(|((p, _), o)| p == plural && matches_selector(o, selector) && !is_ready(o))
            .map(|(_, o)| o.clone())
            .collect();
        for mut object in pending {
            set_ready(plural, &mut object);
            self.put(plural, object, "MODIFIED");
        }
    }

    /// etcd compacts: a write elsewhere in the cluster moves the resourceVersion on, and every
    /// change before it is forgotten. Open watches wake and find themselves behind.
    fn compact(&mut self) {
        self.resource_version += 1;
        self.compacted_below = self.resource_version;
        self.history.clear();
        self.changed.send_replace(self.resource_version);
    }

    fn create(&mut self, plural: &str, body: &Bytes) -> Response {
        if let Some((_, code)) = self.fail_create.clone().filter(|(p, _)| p == plural) {
            return status(code, "Refused");
        }
        let mut object: Value = serde_json::from_slice(body).expect("json body");
        let name = object["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_owned();
        if self
            .objects
            .contains_key(&(plural.to_owned(), name.clone()))
        {
            let message = format!("{plural} \"{name}\" already exists");
            return status_with(409, "AlreadyExists", &message);
        }
        object["metadata"]["uid"] = json!(format!("uid-{name}-{}", self.resource_version + 1));
        if plural == "pods" {
            object["status"] = if self.never_ready {
                json!({ "phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient memory.",
                }] })
            } else {
                json!({ "phase": "Pending" })
            };
        }
        let object = self.put(plural, object, "ADDED");
        (StatusCode::CREATED, axum::Json(object)).into_response()
    }

    fn list(&mut self, plural: &str, query: &BTreeMap<String, String>) -> Response {
        self.lists += 1;
        let selector = query.get("labelSelector").map(String::as_str);
        let (snapshot, offset) = match query.get("continue") {
            Some(token) => {
                let (version, offset) = token.split_once(':').expect("our continue token");
                (
                    version.parse::<u64>().expect("version"),
                    offset.parse::<usize>().expect("offset"),
                )
            }
            None => (self.resource_version, 0),
        };
        if snapshot < self.compacted_below {
            self.expired += 1;
            let message = "The provided continue parameter is too old to display a consistent \
                           list result. You can start a new list without the continue parameter.";
            return status_with(410, "Expired", message);
        }
        let all: Vec<Value> = self
            .objects
            .iter()
            .filter(|((p, _), o)| p == plural && matches_selector(o, selector))
            .map(|(_, o)| o.clone())
            .collect();
        let page = self.page_size.unwrap_or(usize::MAX);
        let items: Vec<Value> = all.iter().skip(offset).take(page).cloned().collect();
        let next = offset + items.len();
        let mut metadata = json!({ "resourceVersion": snapshot.to_string() });
        if next < all.len() {
            metadata["continue"] = json!(format!("{snapshot}:{next}"));
        }
        let list =
            json!({ "kind": "List", "apiVersion": "v1", "metadata": metadata, "items": items });
        if self.compact_after_lists > 0 {
            self.compact_after_lists -= 1;
            if self.ready_at_compaction {
                self.make_ready(plural, selector);
            }
            self.compact();
        }
        axum::Json(list).into_response()
    }

    fn get(&mut self, plural: &str, name: &str) -> Response {
        let key = (plural.to_owned(), name.to_owned());
        if let Some(left) = self.lingering.get(&key).copied() {
            if left == 0 {
                self.lingering.remove(&key);
                self.remove(plural, name);
            } else {
                self.lingering.insert(key.clone(), left - 1);
            }
        }
        let Some(object) = self.objects.get(&key).cloned() else {
            return status(404, "NotFound");
        };
        if let Some((_, labels)) = self.replace_after_get.take_if(|(k, _)| *k == key) {
            // Someone deletes it and makes another under the same name.
            self.remove(plural, name);
            let mut replacement = object.clone();
            replacement["metadata"]["labels"] = labels;
            replacement["metadata"]["uid"] = json!(format!("uid-{name}-again"));
            self.put(plural, replacement, "ADDED");
        }
        axum::Json(object).into_response()
    }

    fn delete(&mut self, plural: &str, name: &str, body: &Bytes) -> Response {
        let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        self.delete_bodies.push(options.clone());
        if let Some((_, code)) = self.fail_delete.clone().filter(|(p, _)| p == plural) {
            return status(code, "Refused");
        }
        let key = (plural.to_owned(), name.to_owned());
        let Some(mut object) = self.objects.get(&key).cloned() else {
            return status(404, "NotFound");
        };
        let wanted = &options["preconditions"]["uid"];
        if !wanted.is_null() && *wanted != object["metadata"]["uid"] {
            let message = format!(
                "Precondition failed: UID in precondition: {wanted}, UID in object meta: {}",
                object["metadata"]["uid"]
            );
            return status_with(409, "Conflict", &message);
        }
        if self.linger_gets > 0 {
            // A graceful delete: the object stays, marked, until the kubelet has stopped it.
            let linger = self.linger_gets;
            self.lingering.insert(key, linger);
            object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            axum::Json(self.put(plural, object, "MODIFIED")).into_response()
        } else {
            self.remove(plural, name);
            axum::Json(object).into_response()
        }
    }
}

/// What an open watch has sent so far.
struct Watcher {
    fake: Shared,
    plural: String,
    selector: Option<String>,
    /// The last resourceVersion it has considered.
    cursor: u64,
    changed: tokio::sync::watch::Receiver<u64>,
    until: tokio::time::Instant,
    ended: bool,
}

/// The next lines of an open watch: every change after its cursor, or the `ERROR` event that ends
/// it once it has fallen behind a compaction; `None` at its timeout.
async fn next_lines(mut w: Watcher) -> Option<(Result<String, std::convert::Infallible>, Watcher)> {
    if w.ended {
        return None;
    }
    loop {
        let lines = {
            let mut f = w.fake.lock().expect("fake");
            if w.cursor < f.compacted_below {
                f.expired += 1;
                w.ended = true;
                let message = format!(
                    "too old resource version: {} ({})",
                    w.cursor, f.compacted_below
                );
                let event =
                    json!({ "type": "ERROR", "object": status_json(410, "Expired", &message) });
                format!("{event}\n")
            } else {
                let mut lines = String::new();
                for change in f.history.iter().filter(|c| {
                    c.resource_version > w.cursor
                        && c.plural == w.plural
                        && matches_selector(&c.object, w.selector.as_deref())
                }) {
                    let event = json!({ "type": change.kind, "object": change.object });
                    lines.push_str(&format!("{event}\n"));
                }
                w.cursor = f.resource_version;
                lines
            }
        };
        if !lines.is_empty() {
            return Some((Ok(lines), w));
        }
        tokio::select! {
            changed = w.changed.changed() => {
                if changed.is_err() {
                    return None;
                }
            }
            () = tokio::time::sleep_until(w.until) => return None,
        }
    }
}

fn watch(
    fake: &Shared,
    f: &mut Fake,
    plural: String,
    query: &BTreeMap<String, String>,
) -> Response {
    f.watches += 1;
    let selector = query.get("labelSelector").cloned();
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(f.resource_version);
    if from < f.compacted_below {
        f.expired += 1;
        let message = format!("too old resource version: {from} ({})", f.compacted_below);
        if f.expired_watch_as_http {
            return status_with(410, "Gone", &message);
        }
        let event = json!({ "type": "ERROR", "object": status_json(410, "Expired", &message) });
        return (StatusCode::OK, format!("{event}\n")).into_response();
    }
    if f.closes_before_ready > 0 {
        f.closes_before_ready -= 1;
        // The watch closes with nothing said; what happened meanwhile is only in a list.
        if f.closes_before_ready == 0 && !f.never_ready {
            f.make_ready(&plural, selector.as_deref());
        }
        return (StatusCode::OK, "").into_response();
    }
    if !f.never_ready {
        f.make_ready(&plural, selector.as_deref());
    }
    let seconds = query
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(290);
    let watcher = Watcher {
        fake: fake.clone(),
        plural,
        selector,
        cursor: from,
        changed: f.changed.subscribe(),
        until: tokio::time::Instant::now() + Duration::from_secs(seconds),
        ended: false,
    };
    f.streaming.send_modify(|n| *n += 1);
    let lines = futures::stream::unfold(watcher, next_lines);
    (StatusCode::OK, Body::from_stream(lines)).into_response()
}

/// A create that is never answered.
enum Held {
    /// It never acts either.
    Hang,
    /// It acted.
    AfterActing,
    /// It acts once `land` says so, on a task of its own (the server processes a request its
    /// client gave up on).
    Late,
}

async fn handle(
    State(fake): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Response {
    let Some((plural, name)) = route(uri.path()) else {
        return status(404, "NotFound");
    };
    let held = {
        let mut f = fake.lock().expect("fake");
        f.log.push(format!(
            "{method} {}?{}",
            uri.path(),
            uri.query().unwrap_or("")
        ));
        f.at.push(Instant::now());
        if let Some(token) = f.bearer.clone() {
            let sent = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if sent != Some(format!("Bearer {token}").as_str()) {
                f.unauthorized += 1;
                return status(401, "Unauthorized");
            }
        }
        if let Some(t) = f
            .throttle
            .as_mut()
            .filter(|t| t.method == method && t.plural == plural && t.remaining > 0)
        {
            t.remaining -= 1;
            return too_many_requests(t.retry_after_s, t.plain_text);
        }
        let creating = method == Method::POST;
        if creating && f.hang_create.as_deref() == Some(plural.as_str()) {
            Some(Held::Hang)
        } else if creating && f.land_late.as_deref() == Some(plural.as_str()) {
            Some(Held::Late)
        } else if creating
            && let Some((_, left)) = f
                .lose_create_answers
                .as_mut()
                .filter(|(p, left)| *p == plural && *left > 0)
        {
            *left -= 1;
            let made = f.create(&plural, &body);
            let name = serde_json::from_slice::<Value>(&body).expect("json")["metadata"]["name"]
                .as_str()
                .expect("name")
                .to_owned();
            if made.status() == StatusCode::CREATED {
                let uid = f.objects[&(plural.clone(), name)]["metadata"]["uid"].clone();
                f.lost_uids.push(uid.as_str().expect("uid").to_owned());
            }
            Some(Held::AfterActing)
        } else {
            None
        }
    };
    match held {
        Some(Held::Late) => {
            let mut land = fake.lock().expect("fake").land.subscribe();
            let fake = fake.clone();
            let plural = plural.clone();
            tokio::spawn(async move {
                if land.wait_for(|go| *go).await.is_ok() {
                    let mut f = fake.lock().expect("fake");
                    let _ = f.create(&plural, &body);
                    f.landed += 1;
                    f.changed.send_modify(|_| {});
                }
            });
            std::future::pending::<()>().await;
            unreachable!("a held request is never answered")
        }
        Some(Held::Hang | Held::AfterActing) => {
            std::future::pending::<()>().await;
            unreachable!("a held request is never answered")
        }
        None => {}
    }
    let mut f = fake.lock().expect("fake");
    match (method, name) {
        (Method::POST, None) => f.create(&plural, &body),
        (Method::GET, None) if query.get("watch").is_some_and(|w| w == "true") => {
            watch(&fake, &mut f, plural, &query)
        }
        (Method::GET, None) => f.list(&plural, &query),
        (Method::GET, Some(name)) => f.get(&plural, &name),
        (Method::DELETE, Some(name)) => f.delete(&plural, &name, &body),
        _ => status(405, "MethodNotAllowed"),
    }
}

fn router(fake: &Shared) -> axum::Router {
    axum::Router::new()
        .fallback(handle)
        .with_state(fake.clone())
}

/// Starts the fake on a free loopback port.
async fn start_fake() -> (Shared, SocketAddr) {
    let fake: Shared = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = router(&fake);
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (fake, addr)
}

/// A listener that serves TLS with one certificate.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            // A client that refuses the certificate ends its handshake here.
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// A CA made for one test, and the certificate for 127.0.0.1 it signed for the fake.
struct Pki {
    ca_pem: String,
    server_cert: tokio_rustls::rustls::pki_types::CertificateDer<'static>,
    server_key: Vec<u8>,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "corral test cluster CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA");
    let server_key = rcgen::KeyPair::generate().expect("key");
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .signed_by(&server_key, &*ca)
        .expect("signed");
    Pki {
        ca_pem: ca.pem(),
        server_cert: server.der().clone(),
        server_key: server_key.serialize_der(),
    }
}

/// Starts the fake over TLS with `pki`'s server certificate.
async fn start_fake_tls(pki: &Pki) -> (Shared, SocketAddr) {
    use tokio_rustls::rustls;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(pki.server_key.clone());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![pki.server_cert.clone()], key.into())
        .expect("server certificate");
    let fake: Shared = Arc::default();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = tcp.local_addr().expect("addr");
    let listener = TlsListener {
        tcp,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    let app = router(&fake);
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (fake, addr)
}

/// A ServiceAccount mount as the kubelet projects it: `token`, `ca.crt` and `namespace`.
struct ServiceAccountDir(PathBuf);

impl ServiceAccountDir {
    fn new(test: &str, token: &str, ca_pem: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("corral-kube-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("token"), token).expect("token");
        std::fs::write(dir.join("ca.crt"), ca_pem).expect("ca.crt");
        std::fs::write(dir.join("namespace"), NS).expect("namespace");
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ServiceAccountDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The client the controller builds, for the plain-HTTP fake.
fn client(addr: SocketAddr) -> kube::Client {
    let url = format!("http://{addr}").parse().expect("url");
    let mut config = kube::Config::new(url);
    config.default_namespace = NS.to_owned();
    client_from(config).expect("client")
}

fn settings() -> KubeSettings {
    let mut s = KubeSettings::new(NS, POOL, ImageId(IMAGE.to_owned()));
    s.ready_timeout = Duration::from_secs(5);
    s.delete_timeout = Duration::from_secs(5);
    s.request_timeout = Duration::from_millis(500);
    s.poll_interval = Duration::from_millis(20);
    s
}

async fn kube_backend() -> (Shared, KubeBackend) {
    kube_backend_with(settings()).await
}

async fn kube_backend_with(settings: KubeSettings) -> (Shared, KubeBackend) {
    let (fake, addr) = start_fake().await;
    let backend = KubeBackend::new(client(addr), settings).expect("backend");
    (fake, backend)
}

fn worker(seq: u64) -> WorkerId {
    WorkerId { epoch: 0xab, seq }
}

fn image() -> ImageId {
    ImageId(IMAGE.to_owned())
}

fn stored(fake: &Shared, plural: &str, name: &str) -> Option<Value> {
    let f = fake.lock().expect("fake");
    f.objects
        .get(&(plural.to_owned(), name.to_owned()))
        .cloned()
}

/// Waits, within `bound`, until `done` holds of the fake; it is checked after every change.
async fn until(fake: &Shared, bound: Duration, done: impl Fn(&Fake) -> bool) {
    let mut changed = fake.lock().expect("fake").changed.subscribe();
    let waited = tokio::time::timeout(bound, async {
        while !done(&fake.lock().expect("fake")) {
            changed.changed().await.expect("the fake lives");
        }
    })
    .await;
    assert!(waited.is_ok(), "the fake never got there within {bound:?}");
}

// ---- golden manifests ----

#[test]
fn every_worker_pod_is_the_pools_template_with_its_own_name_label_and_id() {
    let mut s = settings();
    s.resources.memory.limit = "5Gi".to_owned();
    let template = serde_json::to_value(worker_pod_template(&s, &image())).expect("json");
    let pod = serde_json::to_value(worker_pod(&s, worker(7), &image())).expect("json");
    assert_eq!(template["kind"], "PodTemplate");
    assert_eq!(template["metadata"]["name"], "corral-worker");
    // The pod's spec is the template's with CORRAL_WORKER_ID first in the environment.
    let mut spec = pod["spec"].clone();
    let env = spec["containers"][0]["env"]
        .as_array_mut()
        .expect("an environment");
    let id = env.remove(0);
    assert_eq!(id["name"], "CORRAL_WORKER_ID");
    assert_eq!(id["value"], worker(7).to_string());
    assert_eq!(spec, template["template"]["spec"]);
    // Its labels are the template's and its own worker label.
    let mut labels = pod["metadata"]["labels"].clone();
    assert_eq!(
        labels
            .as_object_mut()
            .expect("labels")
            .remove("corral.dev/worker"),
        Some(serde_json::json!("w-ab-7"))
    );
    assert_eq!(labels, template["template"]["metadata"]["labels"]);
    // Bounded: the pod's limits are what the settings say (decision 0032).
    let resources = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(resources["limits"]["memory"], "5Gi");
    assert_eq!(resources["limits"]["cpu"], "2");
    assert_eq!(resources["requests"]["cpu"], "500m");
    assert_eq!(resources["requests"]["memory"], "1Gi");
}

#[test]
fn pod_manifest_has_the_fields_the_cluster_relies_on() {
    let pod = worker_pod(&settings(), worker(7), &image());
    let json = serde_json::to_value(&pod).expect("json");
    assert_eq!(json["metadata"]["name"], "w-ab-7");
    assert_eq!(json["metadata"]["namespace"], NS);
    let labels = &json["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/name"], "corral-worker");
    assert_eq!(labels["app.kubernetes.io/part-of"], "corral");
    assert_eq!(labels["corral.dev/worker"], "w-ab-7");
    assert_eq!(labels["corral.dev/pool"], POOL);
    let spec = &json["spec"];
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["enableServiceLinks"], false);
    assert_eq!(spec["hostUsers"], false);
    assert_eq!(spec["restartPolicy"], "Never");
    // Only when configured: gVisor is never a prerequisite (ISO-3).
    assert!(spec.get("runtimeClassName").is_none());
    let container = &spec["containers"][0];
    assert_eq!(container["image"], IMAGE);
    assert_eq!(container["ports"][0]["containerPort"], 8091);
    assert_eq!(container["ports"][0]["name"], "control");
    assert_eq!(container["ports"][1]["containerPort"], 8080);
    assert_eq!(container["ports"][1]["name"], "browser");
    assert_eq!(container["readinessProbe"]["tcpSocket"]["port"], 8091);
    assert_eq!(container["env"][0]["name"], "CORRAL_WORKER_ID");
    assert_eq!(container["env"][0]["value"], "w-ab-7");
    assert_eq!(
        container["command"],
        json!(["corral", "worker", "serve", "--listen", "0.0.0.0:8091"])
    );
    // The control credential comes from the operator's Secret, read-only, never from the spec.
    assert_eq!(container["env"][1]["name"], "CORRAL_WORKER_TOKEN_FILE");
    assert_eq!(container["env"][1]["value"], "/var/run/corral/worker-token");
    assert_eq!(
        container["volumeMounts"],
        json!([{ "name": "credential", "mountPath": "/var/run/corral", "readOnly": true }])
    );
    assert_eq!(
        spec["volumes"],
        json!([{
            "name": "credential",
            "secret": {
                "secretName": "corral-worker-credential",
                "items": [{ "key": "worker-token", "path": "worker-token" }],
                "defaultMode": 0o400,
                "optional": false,
            },
        }])
    );
    assert_eq!(
        container["env"].as_array().map(Vec::len),
        Some(2),
        "nothing else in the environment"
    );
    let security = &container["securityContext"];
    assert_eq!(
        security,
        &json!({
            "privileged": false,
            "allowPrivilegeEscalation": true,
            "runAsUser": 0,
            "runAsNonRoot": false,
            "capabilities": {
                "drop": ["ALL"],
                "add": ["SYS_ADMIN", "SETUID", "SETGID", "CHOWN", "FOWNER", "DAC_OVERRIDE", "KILL"],
            },
            "seccompProfile": { "type": "Unconfined" },
            "appArmorProfile": { "type": "Unconfined" },
            "procMount": "Unmasked",
        })
    );
}

#[test]
fn pod_manifest_names_the_runtime_class_and_profiles_when_configured() {
    let mut s = settings();
    s.worker_env = vec![(
        "SANDBOX_EGRESS_PROXY_URL".to_owned(),
        "http://corral-egress.corral.svc:3128".to_owned(),
    )];
    let json = serde_json::to_value(worker_pod(&s, worker(1), &image())).expect("json");
    assert_eq!(
        json["spec"]["containers"][0]["env"][2],
        json!({ "name": "SANDBOX_EGRESS_PROXY_URL", "value": "http://corral-egress.corral.svc:3128" })
    );
    s.runtime_class = Some("gvisor".to_owned());
    s.apparmor = AppArmor::Localhost("corral-worker".to_owned());
    s.seccomp = Seccomp::Localhost("profiles/corral-worker.json".to_owned());
    let json = serde_json::to_value(worker_pod(&s, worker(1), &image())).expect("json");
    assert_eq!(json["spec"]["runtimeClassName"], "gvisor");
    assert_eq!(
        json["spec"]["containers"][0]["securityContext"]["seccompProfile"],
        json!({ "type": "Localhost", "localhostProfile": "profiles/corral-worker.json" })
    );
    assert_eq!(
        json["spec"]["containers"][0]["securityContext"]["appArmorProfile"],
        json!({ "type": "Localhost", "localhostProfile": "corral-worker" })
    );
}

#[test]
fn service_manifest_is_cluster_ip_on_both_ports_selecting_its_pod() {
    let s = settings();
    let service = serde_json::to_value(worker_service(&s, worker(7))).expect("json");
    let pod = serde_json::to_value(worker_pod(&s, worker(7), &image())).expect("json");
    assert_eq!(service["metadata"]["name"], "w-ab-7");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(service["spec"]["ports"][0]["port"], 8091);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], 8091);
    assert_eq!(service["spec"]["ports"][1]["port"], 8080);
    assert_eq!(service["spec"]["ports"][1]["targetPort"], 8080);
    assert_eq!(service["spec"]["ports"].as_array().map(Vec::len), Some(2));
    assert_eq!(service["metadata"]["labels"], pod["metadata"]["labels"]);
    assert_eq!(service["spec"]["selector"], pod["metadata"]["labels"]);
    assert!(service["spec"].get("nodePort").is_none());
}

#[test]
fn settings_refuse_a_forced_delete_and_a_bad_pool_label() {
    let mut s = settings();
    s.delete_grace_seconds = 0;
    assert!(s.validate().is_err());
    let mut s = settings();
    s.pool = "Not a label!".to_owned();
    assert!(s.validate().is_err());
    assert!(settings().validate().is_ok());
}

// ---- the kube backend ----

#[tokio::test]
async fn create_makes_the_pod_and_its_service_and_waits_until_ready() {
    let (fake, backend) = kube_backend().await;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    let pod = stored(&fake, "pods", "w-ab-1").expect("pod");
    let service = stored(&fake, "services", "w-ab-1").expect("service");
    assert_eq!(pod["metadata"]["labels"]["corral.dev/worker"], "w-ab-1");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    // The Service is owned by its pod, so the cluster collects it with the pod.
    assert_eq!(
        service["metadata"]["ownerReferences"][0]["uid"],
        pod["metadata"]["uid"]
    );
    assert_eq!(service["metadata"]["ownerReferences"][0]["kind"], "Pod");
    let f = fake.lock().expect("fake");
    assert_eq!(f.watches, 1);
}

#[tokio::test]
async fn create_that_hangs_is_unknown() {
    let (fake, backend) = kube_backend().await;
    fake.lock().expect("fake").hang_create = Some("pods".to_owned());
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Unknown
    );
}

#[tokio::test]
async fn create_answered_with_500_is_unknown() {
    let (fake, backend) = kube_backend().await;
    fake.lock().expect("fake").fail_create = Some(("pods".to_owned(), 500));
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Unknown
    );
}

#[tokio::test]
async fn create_of_the_service_that_fails_after_the_pod_exists_is_unknown() {
    let (fake, backend) = kube_backend().await;
    fake.lock().expect("fake").fail_create = Some(("services".to_owned(), 403));
    // The pod exists without its Service: not Failed (it is not absent), so the pool deletes it.
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Unknown
    );
    assert!(stored(&fake, "pods", "w-ab-1").is_some());
}

#[tokio::test]
async fn create_refused_with_a_4xx_is_failed() {
    let (fake, backend) = kube_backend().await;
    fake.lock().expect("fake").fail_create = Some(("pods".to_owned(), 403));
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Failed
    );
    assert!(stored(&fake, "services", "w-ab-1").is_none());
}

#[tokio::test]
async fn create_that_never_becomes_ready_is_unknown() {
    let mut s = settings();
    s.ready_timeout = Duration::from_millis(300);
    let (fake, backend) = kube_backend_with(s).await;
    fake.lock().expect("fake").never_ready = true;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Unknown
    );
}

#[tokio::test]
async fn create_adopts_an_existing_pod_only_when_it_carries_our_id() {
    let (fake, backend) = kube_backend().await;
    // A lost reply: the pod and the Service exist from an earlier attempt, and are ours.
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    // Someone else's pod with the same name is never taken for ours.
    {
        let mut f = fake.lock().expect("fake");
        f.objects.insert(
            ("pods".to_owned(), "w-ab-2".to_owned()),
            json!({ "metadata": { "name": "w-ab-2", "uid": "foreign", "labels": { "app": "other" } } }),
        );
    }
    assert_eq!(
        backend.create(worker(2), &image(), None).await,
        Outcome::Failed
    );
}

#[tokio::test]
async fn watch_that_closes_is_restarted_from_a_fresh_list() {
    let (fake, backend) = kube_backend().await;
    fake.lock().expect("fake").closes_before_ready = 1;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    let f = fake.lock().expect("fake");
    // The closed watch said nothing; the second list is what saw the pod Ready.
    assert_eq!(f.watches, 1);
    assert_eq!(f.lists, 2);
}

#[tokio::test]
async fn delete_is_done_only_once_both_objects_answer_404() {
    let (fake, backend) = kube_backend().await;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    fake.lock().expect("fake").linger_gets = 1;
    let gets_before = get_count(&fake, "/pods/w-ab-1");
    assert_eq!(backend.delete(worker(1)).await, Outcome::Done);
    assert!(stored(&fake, "pods", "w-ab-1").is_none());
    assert!(stored(&fake, "services", "w-ab-1").is_none());
    // One GET before the delete, one that still saw the pod, one that saw 404.
    assert_eq!(get_count(&fake, "/pods/w-ab-1") - gets_before, 3);
    let f = fake.lock().expect("fake");
    let pod_delete = &f.delete_bodies[0];
    assert!(pod_delete["preconditions"]["uid"].is_string());
    // A forced (zero-grace) delete would make absence prove nothing.
    assert_eq!(pod_delete["gracePeriodSeconds"], 5);
}

fn get_count(fake: &Shared, suffix: &str) -> usize {
    let f = fake.lock().expect("fake");
    f.log
        .iter()
        .filter(|line| {
            line.starts_with("GET ") && line.split('?').next().is_some_and(|p| p.ends_with(suffix))
        })
        .count()
}

#[tokio::test]
async fn delete_that_is_never_confirmed_is_unknown() {
    let mut s = settings();
    s.delete_timeout = Duration::from_millis(200);
    let (fake, backend) = kube_backend_with(s).await;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    fake.lock().expect("fake").linger_gets = u32::MAX;
    assert_eq!(backend.delete(worker(1)).await, Outcome::Unknown);
}

#[tokio::test]
async fn delete_of_an_absent_worker_is_done_and_a_foreign_object_is_never_deleted() {
    let (fake, backend) = kube_backend().await;
    assert_eq!(backend.delete(worker(9)).await, Outcome::Done);
    fake.lock().expect("fake").objects.insert(
        ("pods".to_owned(), "w-ab-3".to_owned()),
        json!({ "metadata": { "name": "w-ab-3", "uid": "foreign", "labels": {} } }),
    );
    assert_eq!(backend.delete(worker(3)).await, Outcome::Failed);
    assert!(stored(&fake, "pods", "w-ab-3").is_some());
}

#[tokio::test]
async fn list_selects_this_pools_workers_by_label_and_drops_terminated_pods() {
    let (fake, backend) = kube_backend().await;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    assert_eq!(
        backend.create(worker(2), &image(), None).await,
        Outcome::Done
    );
    {
        let mut f = fake.lock().expect("fake");
        let mut other = worker_pod(&settings(), worker(3), &image());
        other
            .metadata
            .labels
            .get_or_insert_default()
            .insert("corral.dev/pool".to_owned(), "other".to_owned());
        f.objects.insert(
            ("pods".to_owned(), "w-ab-3".to_owned()),
            serde_json::to_value(other).expect("json"),
        );
        let pod2 = f
            .objects
            .get_mut(&("pods".to_owned(), "w-ab-2".to_owned()))
            .expect("pod 2");
        pod2["status"]["phase"] = json!("Failed");
    }
    let present = backend.list().await.expect("list");
    assert_eq!(present.into_iter().collect::<Vec<_>>(), vec![worker(1)]);
    // The list asked by this pool's labels.
    let f = fake.lock().expect("fake");
    let selector = pool_selector(POOL);
    assert!(f.log.iter().any(
        |l| l.starts_with("GET /api/v1/namespaces/corral-workers/pods?")
            && l.contains("labelSelector")
    ));
    assert!(selector.contains("corral.dev/pool=main"));
    // The terminated pod's objects were asked to go.
    assert!(
        !f.objects
            .contains_key(&("pods".to_owned(), "w-ab-2".to_owned()))
    );
}

#[tokio::test]
async fn list_is_unavailable_when_the_server_is_not() {
    let backend = KubeBackend::new(
        client_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("url"),
        ))
        .expect("client"),
        settings(),
    )
    .expect("backend");
    assert!(backend.list().await.is_err());
}

// ---- the agent-sandbox claim backend ----

fn wall_now_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock");
    u64::try_from(since.as_millis()).expect("millis")
}

async fn claim_backend() -> (Shared, AgentSandboxBackend) {
    let (fake, addr) = start_fake().await;
    let mut s = ClaimSettings::new(
        NS,
        POOL,
        ImageId("agent-sandbox:python@sha256:0123".to_owned()),
    );
    s.ready_timeout = Duration::from_secs(5);
    s.delete_timeout = Duration::from_secs(5);
    s.request_timeout = Duration::from_millis(500);
    s.poll_interval = Duration::from_millis(20);
    let platform = AgentSandbox {
        template: "corral-worker".to_owned(),
        warm_pool: Some("corral-warm".to_owned()),
    };
    (fake, AgentSandboxBackend::new(client(addr), platform, s))
}

#[test]
fn rfc3339_round_trips_at_second_precision() {
    assert_eq!(
        rfc3339(UnixMillis(1_767_225_600_999)).as_deref(),
        Some("2026-01-01T00:00:00Z")
    );
    assert_eq!(
        parse_rfc3339("2026-01-01T00:00:00Z"),
        Some(UnixMillis(1_767_225_600_000))
    );
}

#[tokio::test]
async fn claim_is_created_with_its_fixed_deadline_and_waited_on() {
    let (fake, backend) = claim_backend().await;
    let deadline = UnixMillis(wall_now_ms() + 3_600_000);
    assert_eq!(
        backend.create(worker(1), &image(), Some(deadline)).await,
        Outcome::Done
    );
    let claim = stored(&fake, "sandboxclaims", "w-ab-1").expect("claim");
    assert_eq!(claim["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(claim["kind"], "SandboxClaim");
    assert_eq!(claim["spec"]["sandboxTemplateRef"]["name"], "corral-worker");
    assert_eq!(claim["spec"]["warmpool"], "corral-warm");
    assert_eq!(claim["spec"]["lifecycle"]["shutdownPolicy"], "Delete");
    let shutdown = claim["spec"]["lifecycle"]["shutdownTime"]
        .as_str()
        .expect("shutdownTime");
    assert_eq!(Some(shutdown.to_owned()), rfc3339(deadline));
    assert_eq!(claim["metadata"]["labels"]["corral.dev/worker"], "w-ab-1");
    assert_eq!(claim["metadata"]["labels"]["corral.dev/pool"], POOL);
    let f = fake.lock().expect("fake");
    assert!(f.log.iter().any(|l| l.starts_with(
        "POST /apis/extensions.agents.x-k8s.io/v1beta1/namespaces/corral-workers/sandboxclaims"
    )));
}

#[tokio::test]
async fn claim_without_a_deadline_or_past_it_is_refused_before_any_request() {
    let (fake, backend) = claim_backend().await;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Failed
    );
    let past = UnixMillis(wall_now_ms() - 1_000);
    assert_eq!(
        backend.create(worker(1), &image(), Some(past)).await,
        Outcome::Failed
    );
    assert!(fake.lock().expect("fake").log.is_empty());
}

#[tokio::test]
async fn claim_create_that_hangs_or_fails_with_500_is_unknown() {
    let (fake, backend) = claim_backend().await;
    let deadline = UnixMillis(wall_now_ms() + 3_600_000);
    fake.lock().expect("fake").hang_create = Some("sandboxclaims".to_owned());
    assert_eq!(
        backend.create(worker(1), &image(), Some(deadline)).await,
        Outcome::Unknown
    );
    {
        let mut f = fake.lock().expect("fake");
        f.hang_create = None;
        f.fail_create = Some(("sandboxclaims".to_owned(), 503));
    }
    assert_eq!(
        backend.create(worker(2), &image(), Some(deadline)).await,
        Outcome::Unknown
    );
}

#[tokio::test]
async fn claim_delete_is_confirmed_absent_and_renewal_only_confirms_existence() {
    let (fake, backend) = claim_backend().await;
    let deadline = UnixMillis(wall_now_ms() + 3_600_000);
    assert_eq!(
        backend.create(worker(1), &image(), Some(deadline)).await,
        Outcome::Done
    );
    let before = stored(&fake, "sandboxclaims", "w-ab-1").expect("claim");
    let requests = fake.lock().expect("fake").log.len();
    assert!(backend.list().await.expect("list").contains(&worker(1)));
    // A renewal (the reconciler's listing) is one request and changes nothing.
    assert_eq!(fake.lock().expect("fake").log.len(), requests + 1);
    assert_eq!(stored(&fake, "sandboxclaims", "w-ab-1"), Some(before));
    fake.lock().expect("fake").linger_gets = 1;
    assert_eq!(backend.delete(worker(1)).await, Outcome::Done);
    assert!(stored(&fake, "sandboxclaims", "w-ab-1").is_none());
    assert!(!backend.list().await.expect("list").contains(&worker(1)));
}

#[tokio::test]
async fn claim_list_selects_this_pool_and_treats_a_claim_past_its_deadline_as_gone() {
    let (fake, backend) = claim_backend().await;
    let deadline = UnixMillis(wall_now_ms() + 3_600_000);
    assert_eq!(
        backend.create(worker(1), &image(), Some(deadline)).await,
        Outcome::Done
    );
    assert_eq!(
        backend.create(worker(2), &image(), Some(deadline)).await,
        Outcome::Done
    );
    {
        let mut f = fake.lock().expect("fake");
        // Worker 2's claim is past its deadline though the API still shows it.
        let claim = f
            .objects
            .get_mut(&("sandboxclaims".to_owned(), "w-ab-2".to_owned()))
            .expect("claim 2");
        claim["spec"]["lifecycle"]["shutdownTime"] = json!("2020-01-01T00:00:00Z");
        let mut other = claim.clone();
        other["metadata"]["name"] = json!("w-ab-3");
        other["metadata"]["labels"]["corral.dev/worker"] = json!("w-ab-3");
        other["metadata"]["labels"]["corral.dev/pool"] = json!("other");
        other["spec"]["lifecycle"]["shutdownTime"] = json!(rfc3339(deadline));
        f.objects
            .insert(("sandboxclaims".to_owned(), "w-ab-3".to_owned()), other);
    }
    let present = backend.list().await.expect("list");
    assert_eq!(present.into_iter().collect::<Vec<_>>(), vec![worker(1)]);
}

#[tokio::test]
async fn claim_watch_that_closes_is_restarted_from_a_fresh_list() {
    let (fake, backend) = claim_backend().await;
    fake.lock().expect("fake").closes_before_ready = 1;
    let deadline = UnixMillis(wall_now_ms() + 3_600_000);
    assert_eq!(
        backend.create(worker(1), &image(), Some(deadline)).await,
        Outcome::Done
    );
    let f = fake.lock().expect("fake");
    assert_eq!((f.watches, f.lists), (1, 2));
}

#[tokio::test]
async fn claim_that_reaches_its_deadline_before_it_is_ready_is_unknown() {
    let (fake, backend) = claim_backend().await;
    fake.lock().expect("fake").never_ready = true;
    let deadline = UnixMillis(wall_now_ms() + 1_500);
    let started = std::time::Instant::now();
    assert_eq!(
        backend.create(worker(1), &image(), Some(deadline)).await,
        Outcome::Unknown
    );
    // It gave up at the claim's deadline (not earlier, not at the 5 s readiness bound).
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    assert!(stored(&fake, "sandboxclaims", "w-ab-1").is_some());
}

#[tokio::test]
async fn delete_answered_with_500_is_unknown_and_with_403_is_failed() {
    let mut s = settings();
    s.delete_timeout = Duration::from_millis(200);
    let (fake, backend) = kube_backend_with(s).await;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    fake.lock().expect("fake").fail_delete = Some(("pods".to_owned(), 500));
    // The pod is still there: nobody may free its capacity (POOL-9).
    assert_eq!(backend.delete(worker(1)).await, Outcome::Unknown);
    fake.lock().expect("fake").fail_delete = Some(("pods".to_owned(), 403));
    assert_eq!(backend.delete(worker(1)).await, Outcome::Failed);
    assert!(stored(&fake, "pods", "w-ab-1").is_some());
    fake.lock().expect("fake").fail_delete = None;
    assert_eq!(backend.delete(worker(1)).await, Outcome::Done);
}

// ---- the API server's real behaviour ----

/// When each `method` request to a path ending in `path_suffix` arrived at the fake.
fn requests(fake: &Shared, method: &str, path_suffix: &str) -> Vec<Instant> {
    let f = fake.lock().expect("fake");
    f.log
        .iter()
        .zip(&f.at)
        .filter(|(line, _)| {
            line.starts_with(&format!("{method} "))
                && line
                    .split('?')
                    .next()
                    .is_some_and(|p| p.ends_with(path_suffix))
        })
        .map(|(_, at)| *at)
        .collect()
}

fn gaps(times: &[Instant]) -> Vec<Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

fn pods_of(fake: &Shared, worker: WorkerId) -> Vec<Value> {
    let f = fake.lock().expect("fake");
    f.objects
        .iter()
        .filter(|((p, _), o)| {
            p == "pods" && o["metadata"]["labels"]["corral.dev/worker"] == object_name(worker)
        })
        .map(|(_, o)| o.clone())
        .collect()
}

#[tokio::test]
async fn watch_answered_410_gone_relists_and_still_sees_the_pod_ready() {
    let (fake, backend) = kube_backend().await;
    {
        let mut f = fake.lock().expect("fake");
        // Right after the first list the pod becomes Ready and etcd compacts, so the watch from
        // that list's resourceVersion is answered 410 and only a fresh list can tell.
        f.compact_after_lists = 1;
        f.ready_at_compaction = true;
        f.expired_watch_as_http = true;
    }
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    let f = fake.lock().expect("fake");
    assert_eq!(f.expired, 1, "the watch was answered 410");
    assert_eq!((f.watches, f.lists), (1, 2), "{:?}", f.log);
}

#[tokio::test]
async fn watch_expired_with_an_error_event_relists_and_resumes_from_the_new_resource_version() {
    let (fake, backend) = kube_backend().await;
    {
        let mut f = fake.lock().expect("fake");
        // The watch cache's answer: 200, then one ERROR event with a 410 `Expired` Status. The
        // pod is still Pending at the next list; it becomes Ready once a watch is on again.
        f.compact_after_lists = 1;
    }
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    let f = fake.lock().expect("fake");
    assert_eq!(f.expired, 1);
    assert_eq!((f.watches, f.lists), (2, 2), "{:?}", f.log);
    // The second watch started from the second list's resourceVersion, past the compaction.
    let watched_from: Vec<u64> = f
        .log
        .iter()
        .filter(|l| l.contains("watch=true"))
        .filter_map(|l| {
            l.split(['?', '&'])
                .find_map(|kv| kv.strip_prefix("resourceVersion="))
                .and_then(|v| v.parse().ok())
        })
        .collect();
    assert_eq!(watched_from.len(), 2);
    assert!(watched_from[0] < f.compacted_below && watched_from[1] >= f.compacted_below);
}

#[tokio::test]
async fn an_open_watch_that_falls_behind_a_compaction_is_relisted_and_resumed() {
    let (fake, backend) = kube_backend().await;
    fake.lock().expect("fake").never_ready = true;
    let mut streaming = fake.lock().expect("fake").streaming.subscribe();
    let backend = Arc::new(backend);
    let creating = {
        let backend = backend.clone();
        tokio::spawn(async move { backend.create(worker(1), &image(), None).await })
    };
    tokio::time::timeout(Duration::from_secs(5), streaming.wait_for(|n| *n >= 1))
        .await
        .expect("a watch opened within the bound")
        .expect("the fake lives");
    {
        let mut f = fake.lock().expect("fake");
        // The open watch falls behind: the server ends it with an ERROR event. The kubelet now
        // makes the pod Ready as soon as a watch is on again.
        f.never_ready = false;
        f.compact();
    }
    assert_eq!(creating.await.expect("create"), Outcome::Done);
    let f = fake.lock().expect("fake");
    assert_eq!(f.expired, 1);
    assert_eq!((f.watches, f.lists), (2, 2), "{:?}", f.log);
}

#[tokio::test]
async fn a_list_whose_continue_token_expired_starts_again_from_the_first_page() {
    let (fake, backend) = kube_backend().await;
    for seq in 1..=3 {
        assert_eq!(
            backend.create(worker(seq), &image(), None).await,
            Outcome::Done
        );
    }
    let lists_before = {
        let mut f = fake.lock().expect("fake");
        // One pod per page, and the history is compacted after the first page: its continue
        // token is answered 410.
        f.page_size = Some(1);
        f.compact_after_lists = 1;
        f.lists
    };
    let present = backend.list().await.expect("list");
    assert_eq!(present, BTreeSet::from([worker(1), worker(2), worker(3)]));
    let f = fake.lock().expect("fake");
    assert_eq!(f.expired, 1, "the continue token was answered 410");
    // The first page, the expired continue, then all three pages again.
    assert_eq!(f.lists - lists_before, 5, "{:?}", f.log);
}

#[tokio::test]
async fn a_429_with_retry_after_is_waited_out_and_the_create_goes_through() {
    let (fake, backend) = kube_backend().await;
    // Longer than the wait used when a 429 names none, so only honouring it passes.
    let retry_after_s = 2;
    assert!(Duration::from_secs(retry_after_s) > THROTTLE_WAIT_DEFAULT);
    fake.lock().expect("fake").throttle = Some(Throttle {
        method: Method::POST,
        plural: "pods".to_owned(),
        remaining: 1,
        retry_after_s: Some(retry_after_s),
        plain_text: false,
    });
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    let posts = requests(&fake, "POST", "/pods");
    assert_eq!(posts.len(), 2, "one throttled, one served");
    assert!(gaps(&posts)[0] >= Duration::from_secs(retry_after_s));
    assert_eq!(pods_of(&fake, worker(1)).len(), 1);
}

#[tokio::test]
async fn a_429_from_priority_and_fairness_with_only_the_header_is_honoured() {
    let (fake, backend) = kube_backend().await;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    let retry_after_s = 2;
    assert!(Duration::from_secs(retry_after_s) > THROTTLE_WAIT_DEFAULT);
    fake.lock().expect("fake").throttle = Some(Throttle {
        method: Method::GET,
        plural: "pods".to_owned(),
        remaining: 1,
        retry_after_s: Some(retry_after_s),
        plain_text: true,
    });
    let before = requests(&fake, "GET", "/pods").len();
    assert_eq!(
        backend.list().await.expect("list"),
        BTreeSet::from([worker(1)])
    );
    let lists = requests(&fake, "GET", "/pods");
    assert_eq!(lists.len() - before, 2, "one throttled, one served");
    assert!(gaps(&lists[before..])[0] >= Duration::from_secs(retry_after_s));
}

#[tokio::test]
async fn a_429_that_never_ends_is_given_up_after_a_bounded_number_of_spaced_tries() {
    let (fake, backend) = kube_backend().await;
    // No Retry-After at all: the backend still never sends again at once.
    fake.lock().expect("fake").throttle = Some(Throttle {
        method: Method::GET,
        plural: "pods".to_owned(),
        remaining: u32::MAX,
        retry_after_s: None,
        plain_text: false,
    });
    assert!(backend.list().await.is_err(), "unavailable");
    let lists = requests(&fake, "GET", "/pods");
    assert_eq!(
        u32::try_from(lists.len()).expect("count"),
        THROTTLED_RETRIES_MAX + 1
    );
    assert!(
        gaps(&lists).iter().all(|gap| *gap >= THROTTLE_WAIT_DEFAULT),
        "{:?}",
        gaps(&lists)
    );
}

#[tokio::test]
async fn a_retry_after_beyond_the_bound_is_not_waited_and_the_create_is_failed() {
    let (fake, backend) = kube_backend().await;
    fake.lock().expect("fake").throttle = Some(Throttle {
        method: Method::POST,
        plural: "pods".to_owned(),
        remaining: u32::MAX,
        retry_after_s: Some(THROTTLE_WAIT_MAX.as_secs() + 1),
        plain_text: false,
    });
    let started = Instant::now();
    // A 429 proves the server made nothing: Failed, and the pool may create again.
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Failed
    );
    assert!(started.elapsed() < THROTTLE_WAIT_MAX);
    assert_eq!(requests(&fake, "POST", "/pods").len(), 1);
    assert!(pods_of(&fake, worker(1)).is_empty());
}

#[tokio::test]
async fn a_create_whose_answer_is_lost_adopts_the_pod_it_made() {
    let (fake, backend) = kube_backend().await;
    fake.lock().expect("fake").lose_create_answers = Some(("pods".to_owned(), 1));
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    let pods = pods_of(&fake, worker(1));
    assert_eq!(pods.len(), 1, "one pod, never a duplicate");
    let lost = fake.lock().expect("fake").lost_uids.clone();
    assert_eq!(lost.len(), 1, "the create acted and its answer was lost");
    assert_eq!(pods[0]["metadata"]["uid"], lost[0].as_str());
    // The Service is owned by the pod the lost create made.
    let service = stored(&fake, "services", &object_name(worker(1))).expect("its Service");
    assert_eq!(
        service["metadata"]["ownerReferences"][0]["uid"],
        lost[0].as_str()
    );
}

#[tokio::test]
async fn a_create_whose_answer_for_the_service_is_lost_adopts_the_service_it_made() {
    let (fake, backend) = kube_backend().await;
    fake.lock().expect("fake").lose_create_answers = Some(("services".to_owned(), 1));
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    let lost = fake.lock().expect("fake").lost_uids.clone();
    let service = stored(&fake, "services", &object_name(worker(1))).expect("its Service");
    assert_eq!(lost.len(), 1);
    assert_eq!(service["metadata"]["uid"], lost[0].as_str());
}

#[tokio::test]
async fn a_create_answered_409_whose_pod_cannot_be_read_is_unknown_never_failed() {
    let (fake, backend) = kube_backend().await;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    // The create is answered AlreadyExists and the GET that would settle it is throttled past
    // the bound: the pod exists, so the create must not be reported as never made.
    fake.lock().expect("fake").throttle = Some(Throttle {
        method: Method::GET,
        plural: "pods".to_owned(),
        remaining: u32::MAX,
        retry_after_s: Some(THROTTLE_WAIT_MAX.as_secs() + 1),
        plain_text: false,
    });
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Unknown
    );
    assert_eq!(pods_of(&fake, worker(1)).len(), 1);
}

#[tokio::test]
async fn a_delete_answered_409_because_the_name_was_retaken_reads_again_and_deletes_only_ours() {
    let (fake, backend) = kube_backend().await;
    for seq in [1, 2] {
        assert_eq!(
            backend.create(worker(seq), &image(), None).await,
            Outcome::Done
        );
    }
    // The backend only creates and deletes; its one conditional write is the delete, on the uid
    // it read. Between its GET and its DELETE the pod is replaced by one that is also worker 1's.
    let ours = stored(&fake, "pods", "w-ab-1").expect("pod")["metadata"]["labels"].clone();
    let first_uid = stored(&fake, "pods", "w-ab-1").expect("pod")["metadata"]["uid"].clone();
    fake.lock().expect("fake").replace_after_get =
        Some((("pods".to_owned(), "w-ab-1".to_owned()), ours));
    assert_eq!(backend.delete(worker(1)).await, Outcome::Done);
    assert!(stored(&fake, "pods", "w-ab-1").is_none());
    let preconditions: Vec<Value> = fake
        .lock()
        .expect("fake")
        .delete_bodies
        .iter()
        .map(|b| b["preconditions"]["uid"].clone())
        .collect();
    assert_eq!(
        preconditions[0], first_uid,
        "the first delete named the uid it read"
    );
    assert_ne!(preconditions[1], first_uid, "the second, the replacement's");

    // Replaced by someone else's object: read again, and never deleted.
    let foreign = json!({ "app": "someone-else" });
    fake.lock().expect("fake").replace_after_get =
        Some((("pods".to_owned(), "w-ab-2".to_owned()), foreign.clone()));
    assert_eq!(backend.delete(worker(2)).await, Outcome::Failed);
    let left = stored(&fake, "pods", "w-ab-2").expect("the foreign pod is left alone");
    assert_eq!(left["metadata"]["labels"], foreign);
}

#[tokio::test]
async fn the_backends_never_update_an_object() {
    let (fake, backend) = kube_backend().await;
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    assert!(backend.list().await.expect("list").contains(&worker(1)));
    assert_eq!(backend.delete(worker(1)).await, Outcome::Done);
    let (claims, claim_backend) = claim_backend().await;
    let deadline = UnixMillis(wall_now_ms() + 3_600_000);
    assert_eq!(
        claim_backend
            .create(worker(1), &image(), Some(deadline))
            .await,
        Outcome::Done
    );
    assert!(
        claim_backend
            .list()
            .await
            .expect("list")
            .contains(&worker(1))
    );
    assert_eq!(claim_backend.delete(worker(1)).await, Outcome::Done);
    for fake in [fake, claims] {
        let f = fake.lock().expect("fake");
        assert!(!f.log.is_empty());
        assert!(
            f.log.iter().all(|l| l.starts_with("GET ")
                || l.starts_with("POST ")
                || l.starts_with("DELETE ")),
            "no PUT or PATCH: {:?}",
            f.log
        );
    }
}

#[tokio::test]
async fn in_cluster_configuration_reads_the_service_accounts_token_and_ca() {
    let pki = pki();
    let (fake, addr) = start_fake_tls(&pki).await;
    let token = "eyJhbGciOiJSUzI1NiJ9.service-account.signature";
    fake.lock().expect("fake").bearer = Some(token.to_owned());
    let dir = ServiceAccountDir::new("in-cluster", token, &pki.ca_pem);
    let config = incluster_config_from(dir.path(), "127.0.0.1", &addr.port().to_string())
        .await
        .expect("in-cluster configuration");
    assert_eq!(config.default_namespace, NS, "from the namespace file");
    assert_eq!(
        config.cluster_url.to_string(),
        format!("https://127.0.0.1:{}/", addr.port())
    );
    let client = client_from(config).expect("client");
    let backend = KubeBackend::new(client, settings()).expect("backend");
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Done
    );
    assert_eq!(
        backend.list().await.expect("list"),
        BTreeSet::from([worker(1)])
    );
    let f = fake.lock().expect("fake");
    // Every request came over TLS, verified against the CA file, and carried the token.
    assert!(f.log.len() >= 4, "{:?}", f.log);
    assert_eq!(f.unauthorized, 0);
}

#[tokio::test]
async fn in_cluster_configuration_with_a_wrong_token_is_answered_401_and_unavailable() {
    let pki = pki();
    let (fake, addr) = start_fake_tls(&pki).await;
    fake.lock().expect("fake").bearer = Some("the-right-token".to_owned());
    let dir = ServiceAccountDir::new("wrong-token", "a-revoked-token", &pki.ca_pem);
    let config = incluster_config_from(dir.path(), "127.0.0.1", &addr.port().to_string())
        .await
        .expect("in-cluster configuration");
    let backend =
        KubeBackend::new(client_from(config).expect("client"), settings()).expect("backend");
    assert!(backend.list().await.is_err(), "unavailable");
    // A 401 is a refusal before anything is made.
    assert_eq!(
        backend.create(worker(1), &image(), None).await,
        Outcome::Failed
    );
    let f = fake.lock().expect("fake");
    assert!(f.unauthorized >= 2);
    assert!(f.objects.is_empty());
}

#[tokio::test]
async fn in_cluster_configuration_refuses_a_server_its_ca_did_not_sign() {
    let pki = pki();
    let (fake, addr) = start_fake_tls(&pki).await;
    let token = "token";
    let other_ca = self::pki().ca_pem;
    let dir = ServiceAccountDir::new("other-ca", token, &other_ca);
    let config = incluster_config_from(dir.path(), "127.0.0.1", &addr.port().to_string())
        .await
        .expect("in-cluster configuration");
    let backend =
        KubeBackend::new(client_from(config).expect("client"), settings()).expect("backend");
    assert!(backend.list().await.is_err(), "unavailable");
    assert!(
        fake.lock().expect("fake").log.is_empty(),
        "no request got past the handshake"
    );
}

#[tokio::test]
async fn in_cluster_configuration_without_its_files_is_an_error() {
    let pki = pki();
    let dir = ServiceAccountDir::new("missing-files", "token", &pki.ca_pem);
    std::fs::remove_file(dir.path().join("token")).expect("rm token");
    assert!(
        incluster_config_from(dir.path(), "127.0.0.1", "6443")
            .await
            .is_err()
    );
    let dir = ServiceAccountDir::new("missing-ca", "token", &pki.ca_pem);
    std::fs::remove_file(dir.path().join("ca.crt")).expect("rm ca.crt");
    assert!(
        incluster_config_from(dir.path(), "127.0.0.1", "6443")
            .await
            .is_err()
    );
    let dir = ServiceAccountDir::new("bad-port", "token", &pki.ca_pem);
    assert!(
        incluster_config_from(dir.path(), "127.0.0.1", "https")
            .await
            .is_err()
    );
    // And with every file there, the IPv6 host is bracketed.
    let config = incluster_config_from(dir.path(), "fd00::1", "6443")
        .await
        .expect("configuration");
    assert_eq!(config.cluster_url.to_string(), "https://[fd00::1]:6443/");
}

// ---- the pool's rules on what the backend answers ----

mod with_the_pool {
    use super::*;
    use corral_core::ids::{
        ActorId, ConversationId, LeaseNamespace, LeaseScope, MemberId, OpToken, TicketId,
    };
    use corral_core::pool::{Applied, Command, Effect, Event, PoolConfig, PoolDoc, RemovalReason};

    /// corral-core's pool, driven by hand with what the backend answers.
    struct Pool {
        doc: PoolDoc,
        config: PoolConfig,
        now: UnixMillis,
    }

    impl Pool {
        fn new(warm_min: u32) -> Self {
            let mut pool = Self {
                doc: PoolDoc::new(0xab, UnixMillis(1_000)),
                config: PoolConfig {
                    warm_min,
                    max_allocated: 4,
                    max_concurrent_creates: 4,
                    ..PoolConfig::default()
                },
                now: UnixMillis(1_000),
            };
            let _ = pool.apply(Command::PublishImage { image: image() });
            let _ = pool.observe(BTreeSet::new());
            pool
        }

        fn apply(&mut self, command: Command) -> Applied {
            self.now = self.now.plus_ms(10);
            self.doc.apply(command, self.now, &self.config)
        }

        /// A listing taken now.
        fn observe(&mut self, present: BTreeSet<WorkerId>) -> Applied {
            let as_of = self.now.plus_ms(5);
            self.apply(Command::InventoryObserved { as_of, present })
        }

        fn tick(&mut self) -> Applied {
            self.apply(Command::Tick { image: image() })
        }
    }

    fn creates(applied: &Applied) -> Vec<(WorkerId, OpToken)> {
        applied
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::Create { worker, token, .. } => Some((*worker, *token)),
                _ => None,
            })
            .collect()
    }

    fn deletes(applied: &Applied) -> Vec<(WorkerId, OpToken)> {
        applied
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::Delete { worker, token } => Some((*worker, *token)),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_pod_stuck_pending_is_unknown_and_removed() {
        let mut s = settings();
        s.ready_timeout = Duration::from_millis(300);
        let (fake, backend) = kube_backend_with(s.clone()).await;
        // Unschedulable: the pod exists, Pending, and no node will take it.
        fake.lock().expect("fake").never_ready = true;
        let mut pool = Pool::new(1);
        let ordered = creates(&pool.tick());
        let [(worker, token)] = ordered[..] else {
            panic!("one create: {ordered:?}");
        };
        let started = Instant::now();
        let outcome = backend.create(worker, &image(), None).await;
        assert_eq!(outcome, Outcome::Unknown, "never Failed: the pod exists");
        assert!(
            started.elapsed() >= s.ready_timeout,
            "it waited out its bound"
        );
        let pod = pods_of(&fake, worker).pop().expect("the pod exists");
        assert_eq!(pod["status"]["phase"], "Pending");
        // The pool's rule for an ambiguous create: delete it, and free it only once absent.
        let reported = pool.apply(Command::CreateReported {
            worker,
            token,
            outcome,
        });
        assert!(reported.events.contains(&Event::WorkerRemoving {
            worker,
            reason: RemovalReason::AmbiguousCreate,
        }));
        let ordered = deletes(&reported);
        let [(deleted, token)] = ordered[..] else {
            panic!("one delete: {ordered:?}");
        };
        assert_eq!(deleted, worker);
        assert_eq!(backend.delete(worker).await, Outcome::Done);
        assert!(pods_of(&fake, worker).is_empty());
        assert!(stored(&fake, "services", &object_name(worker)).is_none());
        let gone = pool.apply(Command::DeleteReported {
            worker,
            token,
            outcome: Outcome::Done,
        });
        assert!(gone.events.contains(&Event::WorkerGone { worker }));
        assert!(!pool.doc.workers().contains_key(&worker));
    }

    #[tokio::test]
    async fn a_pod_deleted_behind_the_controllers_back_is_gone_from_the_listing() {
        let (fake, backend) = kube_backend().await;
        let mut pool = Pool::new(2);
        for (worker, token) in creates(&pool.tick()) {
            let outcome = backend.create(worker, &image(), None).await;
            assert_eq!(outcome, Outcome::Done);
            let _ = pool.apply(Command::CreateReported {
                worker,
                token,
                outcome,
            });
        }
        let _ = pool.observe(backend.list().await.expect("list"));
        let granted = pool.apply(Command::Acquire {
            ticket: TicketId(1),
            member: MemberId("m".to_owned()),
            scope: LeaseScope {
                namespace: LeaseNamespace::Code,
                actor: ActorId("a".to_owned()),
                conversation: ConversationId("c".to_owned()),
            },
            wait_ms: 1_000,
            stack: false,
        });
        let Some(leased) = granted.events.iter().find_map(|e| match e {
            Event::Granted { worker, .. } => Some(*worker),
            _ => None,
        }) else {
            panic!("no grant: {granted:?}");
        };
        let name = object_name(leased);

        // Its node stops answering: the pod is marked for deletion and not Ready, but it may
        // still run on a partitioned node, so it is still listed (POOL-9).
        {
            let mut f = fake.lock().expect("fake");
            let mut pod = f.objects[&("pods".to_owned(), name.clone())].clone();
            pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            pod["status"]["conditions"] = json!([{ "type": "Ready", "status": "False" }]);
            pod["status"]["reason"] = json!("NodeLost");
            f.put("pods", pod, "MODIFIED");
        }
        assert!(backend.list().await.expect("list").contains(&leased));

        // Then the pod's object is removed (the pod garbage collector, a forced delete).
        let pod = fake
            .lock()
            .expect("fake")
            .remove("pods", &name)
            .expect("its pod");
        let present = backend.list().await.expect("list");
        assert!(!present.contains(&leased), "gone from the listing");
        assert_eq!(present.len(), 1, "the other worker is still there");

        // corral-core's rule for a listing without it: the lease is lost, the worker forgotten,
        // and a replacement ordered.
        let observed = pool.observe(present);
        assert!(
            observed.events.iter().any(|e| matches!(
                e,
                Event::LeaseLost { worker, reason: RemovalReason::Orphan, .. } if *worker == leased
            )),
            "{observed:?}"
        );
        assert!(!pool.doc.workers().contains_key(&leased));
        let replacement = creates(&observed)
            .into_iter()
            .chain(creates(&pool.tick()))
            .collect::<Vec<_>>();
        assert_eq!(replacement.len(), 1, "one replacement: {replacement:?}");
        // Its Service is owned by the lost pod, so the cluster's garbage collector removes it
        // (the fake has none).
        let service = stored(&fake, "services", &name).expect("its Service");
        assert_eq!(
            service["metadata"]["ownerReferences"][0]["uid"],
            pod["metadata"]["uid"]
        );
    }

    #[tokio::test]
    async fn a_create_that_lands_after_its_answers_were_lost_is_still_deleted() {
        let (fake, backend) = kube_backend().await;
        // The server holds both creates the backend sends and acts on them only after the
        // backend gave up: the outcome is unknown, and the pod appears afterwards.
        fake.lock().expect("fake").land_late = Some("pods".to_owned());
        let mut pool = Pool::new(1);
        let ordered = creates(&pool.tick());
        let [(worker, token)] = ordered[..] else {
            panic!("one create: {ordered:?}");
        };
        let outcome = backend.create(worker, &image(), None).await;
        assert_eq!(outcome, Outcome::Unknown);
        let held = requests(&fake, "POST", "/pods").len();
        assert!(held >= 1);
        fake.lock().expect("fake").land.send_replace(true);
        until(&fake, Duration::from_secs(5), |f| {
            usize::try_from(f.landed).ok() == Some(held)
        })
        .await;
        assert_eq!(
            pods_of(&fake, worker).len(),
            1,
            "it landed once, never twice"
        );
        assert!(backend.list().await.expect("list").contains(&worker));
        let reported = pool.apply(Command::CreateReported {
            worker,
            token,
            outcome,
        });
        assert_eq!(deletes(&reported).first().map(|d| d.0), Some(worker));
        assert_eq!(backend.delete(worker).await, Outcome::Done);
        assert!(pods_of(&fake, worker).is_empty(), "nothing leaks");
    }
}

// ---- the reconciler on these backends, with a real Valkey ----

mod with_reconciler {
    use super::*;
    use corral_controller::{Reconciler, WorkerControl};
    use corral_core::ids::OpToken;
    use corral_core::pool::{PoolConfig, PoolDoc, PoolMode};
    use corral_core::reset::ResetEvidence;
    use corral_core::store::Loaded;
    use corral_store::ValkeyStore;
    use corral_store::valkey_server::ValkeyServer;

    struct Clean;

    impl WorkerControl for Clean {
        async fn reset(&self, _worker: WorkerId, token: OpToken) -> Option<ResetEvidence> {
            Some(ResetEvidence::clean(token))
        }
    }

    fn valkey(test: &str) -> Option<ValkeyServer> {
        ValkeyServer::start_or_skip(test)
    }

    async fn doc<B: Backend>(r: &Reconciler<B, Clean>) -> PoolDoc {
        match r.store().load().await {
            Ok(Loaded::Found { doc, .. }) => doc,
            other => panic!("no pool document: {other:?}"),
        }
    }

    async fn until_warm<B: Backend>(r: &Reconciler<B, Clean>, warm: usize) {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let _ = r.pass().await;
            if usize::try_from(doc(r).await.counts().warm).ok() == Some(warm) {
                return;
            }
        }
        panic!("never warm: {:?}", doc(r).await.counts());
    }

    fn config(mode: PoolMode) -> PoolConfig {
        PoolConfig {
            warm_min: 2,
            max_allocated: 4,
            max_concurrent_creates: 1,
            inventory_stale_ms: 60_000,
            mode,
            ..PoolConfig::default()
        }
    }

    #[tokio::test]
    async fn the_warm_minimum_is_reached_with_worker_pods() {
        let Some(server) = valkey("the_warm_minimum_is_reached_with_worker_pods") else {
            return;
        };
        let store = ValkeyStore::connect(&server.url(), "kube-warm")
            .await
            .expect("connects");
        let (fake, backend) = kube_backend().await;
        let r = Reconciler::new(store, backend, Clean, config(PoolMode::Controller));
        until_warm(&r, 2).await;
        assert_eq!(r.backend().list().await.expect("list").len(), 2);
        let f = fake.lock().expect("fake");
        let services = f.objects.keys().filter(|(p, _)| p == "services").count();
        assert_eq!(services, 2);
    }

    /// A pod the cluster loses (its node went away) is noticed from the inventory, leaves the
    /// pool, and is replaced.
    #[tokio::test]
    async fn pool_02_a_lost_pod_leaves_the_pool_and_is_replaced() {
        let Some(server) = valkey("pool_02_a_lost_pod_leaves_the_pool_and_is_replaced") else {
            return;
        };
        let store = ValkeyStore::connect(&server.url(), "kube-lost")
            .await
            .expect("connects");
        let (fake, backend) = kube_backend().await;
        let r = Reconciler::new(store, backend, Clean, config(PoolMode::Controller));
        until_warm(&r, 2).await;
        let first: Vec<WorkerId> = doc(&r).await.workers().keys().copied().collect();
        let lost = object_name(first[0]);
        let pod = fake
            .lock()
            .expect("fake")
            .objects
            .remove(&("pods".to_owned(), lost.clone()))
            .expect("its pod");
        let started = std::time::Instant::now();
        loop {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the lost pod was never replaced: {:?}",
                doc(&r).await.counts()
            );
            let _ = r.pass().await;
            let pool = doc(&r).await;
            if pool.counts().warm == 2 && !pool.workers().contains_key(&first[0]) {
                break;
            }
        }
        // Its Service is owned by the lost pod, so the cluster's garbage collector removes it
        // (the fake has none).
        let service = stored(&fake, "services", &lost).expect("its Service");
        assert_eq!(
            service["metadata"]["ownerReferences"][0]["uid"],
            pod["metadata"]["uid"]
        );
        let f = fake.lock().expect("fake");
        let created = f
            .log
            .iter()
            .filter(|line| line.starts_with("POST") && line.contains("/pods?"))
            .count();
        assert_eq!(created, 3, "two pods, then one replacement: {:?}", f.log);
    }

    #[tokio::test]
    async fn platform_operator_mode_claims_with_the_pools_fixed_deadline() {
        let Some(server) = valkey("platform_operator_mode_claims_with_the_pools_fixed_deadline")
        else {
            return;
        };
        let store = ValkeyStore::connect(&server.url(), "claims-warm")
            .await
            .expect("connects");
        let (fake, backend) = claim_backend().await;
        let lifetime_ms = 3_600_000;
        let mode = PoolMode::PlatformOperator {
            claim_lifetime_ms: lifetime_ms,
        };
        let before = wall_now_ms();
        let r = Reconciler::new(store, backend, Clean, config(mode));
        until_warm(&r, 2).await;
        let after = wall_now_ms();
        let f = fake.lock().expect("fake");
        let claims: Vec<&Value> = f
            .objects
            .iter()
            .filter(|((p, _), _)| p == "sandboxclaims")
            .map(|(_, o)| o)
            .collect();
        assert_eq!(claims.len(), 2);
        for claim in claims {
            let text = claim["spec"]["lifecycle"]["shutdownTime"]
                .as_str()
                .expect("shutdownTime");
            let at = parse_rfc3339(text).expect("rfc3339").0;
            // Fixed at creation: the pool's clock (Valkey's) plus the claim lifetime.
            assert!(
                at + 1_000 >= before + lifetime_ms && at <= after + lifetime_ms,
                "{text}"
            );
        }
    }
}
