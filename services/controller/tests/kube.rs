//! The `kube` and agent-sandbox backends against a fake Kubernetes API server.
//!
//! This is a mock, not a cluster: no kube-apiserver, kind, k3s or envtest binary can be obtained
//! on the machines these tests run on. The fake is a small axum server on 127.0.0.1 that each
//! test starts; the backends talk to it through kube's real HTTP client, so requests, status
//! codes, watch streams and timeouts travel over a real socket. It keeps objects in memory and
//! implements only what the backends use: create (409 on a taken name), get, delete (uid
//! preconditions, 409 on a mismatch), list by label selector, and watch (newline-delimited JSON).
//! Knobs make it hang or fail a create, keep a deleted object visible for a few more GETs, and
//! close a watch without events. What it cannot show is the real server's admission and
//! validation of the manifests; the golden tests assert those fields instead.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use corral_controller::Backend;
use corral_controller::claim::{
    AgentSandbox, AgentSandboxBackend, ClaimSettings, parse_rfc3339, rfc3339,
};
use corral_controller::kube::{
    AppArmor, KubeBackend, KubeSettings, Seccomp, object_name, pool_selector, worker_pod,
    worker_service,
};
use corral_core::ids::{ImageId, WorkerId};
use corral_core::pool::Outcome;
use corral_core::time::UnixMillis;

const NS: &str = "corral-workers";
const POOL: &str = "main";
const IMAGE: &str = "registry.invalid/corral-worker@sha256:0123";

/// The fake API server's state and knobs.
#[derive(Default)]
struct Fake {
    /// Objects by (plural, name).
    objects: BTreeMap<(String, String), Value>,
    resource_version: u64,
    /// A plural whose creates never answer.
    hang_create: Option<String>,
    /// A plural whose creates answer with this status code.
    fail_create: Option<(String, u16)>,
    /// A plural whose deletes answer with this status code (after doing nothing).
    fail_delete: Option<(String, u16)>,
    /// How many more GETs a deleted object stays visible for.
    linger_gets: u32,
    lingering: BTreeMap<(String, String), u32>,
    /// Watches closed without any event before objects become ready.
    closes_before_ready: u32,
    /// Objects never become ready.
    never_ready: bool,
    lists: u32,
    watches: u32,
    /// Every request: method, path and query.
    log: Vec<String>,
    /// Bodies of DELETE requests.
    delete_bodies: Vec<Value>,
}

type Shared = Arc<Mutex<Fake>>;

fn status(code: u16, reason: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": reason, "reason": reason, "code": code,
    });
    let code = StatusCode::from_u16(code).expect("status code");
    (code, axum::Json(body)).into_response()
}

fn matches_selector(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (key, value) = term.split_once('=').expect("equality selector");
        object["metadata"]["labels"][key] == value
    })
}

fn mark_ready(plural: &str, object: &mut Value) {
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

async fn handle(
    State(fake): State<Shared>,
    method: Method,
    uri: Uri,
    Query(query): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Response {
    let Some((plural, name)) = route(uri.path()) else {
        return status(404, "NotFound");
    };
    let hang = {
        let mut f = fake.lock().expect("fake");
        f.log.push(format!(
            "{method} {}?{}",
            uri.path(),
            uri.query().unwrap_or("")
        ));
        method == Method::POST && f.hang_create.as_deref() == Some(plural.as_str())
    };
    if hang {
        tokio::time::sleep(Duration::from_secs(3_600)).await;
    }
    let mut f = fake.lock().expect("fake");
    match (method, name) {
        (Method::POST, None) => {
            if let Some((_, code)) = f.fail_create.clone().filter(|(p, _)| *p == plural) {
                return status(code, "Refused");
            }
            let mut object: Value = serde_json::from_slice(&body).expect("json body");
            let name = object["metadata"]["name"]
                .as_str()
                .expect("name")
                .to_owned();
            let key = (plural.clone(), name);
            if f.objects.contains_key(&key) {
                return status(409, "AlreadyExists");
            }
            f.resource_version += 1;
            object["metadata"]["uid"] = json!(format!("uid-{}-{}", key.1, f.resource_version));
            object["metadata"]["resourceVersion"] = json!(f.resource_version.to_string());
            if plural == "pods" {
                object["status"] = json!({ "phase": "Pending" });
            }
            f.objects.insert(key, object.clone());
            (StatusCode::CREATED, axum::Json(object)).into_response()
        }
        (Method::GET, None) if query.get("watch").is_some_and(|w| w == "true") => {
            f.watches += 1;
            let selector = query.get("labelSelector");
            if f.closes_before_ready > 0 {
                f.closes_before_ready -= 1;
                // The watch closes with nothing said; what happened meanwhile is only in a list.
                if f.closes_before_ready == 0 && !f.never_ready {
                    for ((p, _), object) in f.objects.iter_mut() {
                        if *p == plural && matches_selector(object, selector) {
                            mark_ready(&plural, object);
                        }
                    }
                }
                return (StatusCode::OK, "").into_response();
            }
            if f.never_ready {
                return (StatusCode::OK, "").into_response();
            }
            let mut lines = String::new();
            for ((p, _), object) in f.objects.iter_mut() {
                if *p == plural && matches_selector(object, selector) {
                    mark_ready(&plural, object);
                    let event = json!({ "type": "MODIFIED", "object": object });
                    lines.push_str(&format!("{event}\n"));
                }
            }
            (StatusCode::OK, lines).into_response()
        }
        (Method::GET, None) => {
            f.lists += 1;
            let selector = query.get("labelSelector");
            let items: Vec<Value> = f
                .objects
                .iter()
                .filter(|((p, _), o)| *p == plural && matches_selector(o, selector))
                .map(|(_, o)| o.clone())
                .collect();
            let list = json!({
                "kind": "List", "apiVersion": "v1",
                "metadata": { "resourceVersion": f.resource_version.to_string() },
                "items": items,
            });
            axum::Json(list).into_response()
        }
        (Method::GET, Some(name)) => {
            let key = (plural, name);
            if let Some(left) = f.lingering.get(&key).copied() {
                if left == 0 {
                    f.lingering.remove(&key);
                    f.objects.remove(&key);
                } else {
                    f.lingering.insert(key.clone(), left - 1);
                }
            }
            match f.objects.get(&key) {
                Some(object) => axum::Json(object.clone()).into_response(),
                None => status(404, "NotFound"),
            }
        }
        (Method::DELETE, Some(name)) => {
            let options: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            f.delete_bodies.push(options.clone());
            if let Some((_, code)) = f.fail_delete.clone().filter(|(p, _)| *p == plural) {
                return status(code, "Refused");
            }
            let key = (plural, name);
            let Some(object) = f.objects.get(&key).cloned() else {
                return status(404, "NotFound");
            };
            let wanted = &options["preconditions"]["uid"];
            if !wanted.is_null() && *wanted != object["metadata"]["uid"] {
                return status(409, "Conflict");
            }
            if f.linger_gets > 0 {
                let linger = f.linger_gets;
                f.lingering.insert(key, linger);
            } else {
                f.objects.remove(&key);
            }
            axum::Json(object).into_response()
        }
        _ => status(405, "MethodNotAllowed"),
    }
}

/// Starts the fake on a free loopback port.
async fn start_fake() -> (Shared, SocketAddr) {
    let fake: Shared = Arc::default();
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (fake, addr)
}

fn client(addr: SocketAddr) -> kube::Client {
    let url = format!("http://{addr}").parse().expect("url");
    let mut config = kube::Config::new(url);
    config.default_namespace = NS.to_owned();
    kube::Client::try_from(config).expect("client")
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

// ---- golden manifests ----

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
        kube::Client::try_from(kube::Config::new(
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
