//! The `kube` backend: each worker is one pod and one ClusterIP Service in a namespace.
//!
//! The manifests come from pure functions ([`worker_pod`], [`worker_service`]) so that their
//! fields can be asserted without a cluster. The backend only performs create, delete and list and
//! reports each [`Outcome`] honestly:
//! - create: the pod, then its Service, then a bounded wait until the pod is Ready → `Done`; a
//!   definite refusal before anything exists → `Failed`; a timeout, a 5xx or a lost reply after a
//!   request was sent → `Unknown` (the pool then holds the worker until it is proven absent,
//!   POOL-10); a pod still Pending when the wait ends (unschedulable, an image never pulled) is
//!   `Unknown` too, and the pool deletes it;
//! - delete: the pod and the Service (only objects that carry this worker's labels, by uid), then
//!   a GET of each until both answer 404 → `Done` (POOL-9);
//! - list: pods selected by this pool's labels; a pod in a terminal phase is reported absent, and
//!   so is a pod whose object is gone (deleted behind the controller's back, or removed after its
//!   node was lost): the pool then ends the lease it held and replaces it. A pod only marked for
//!   deletion is still listed: on a partitioned node it may still be running (POOL-9).
//!
//! Waiting for readiness uses a watch, and a fresh list is the source of truth whenever a watch
//! ends or errs, so a closed watch never loses an event.
//!
//! It never updates an object. Its only writes are creates (a 409 AlreadyExists is settled by
//! reading the object, adopted only when it carries this worker's labels) and deletes
//! preconditioned on the uid it read (a 409 Conflict means the name now holds another object,
//! which is read again before anything is deleted).
//!
//! What the API server answers under load, compaction and loss, and what the backend does:
//! - a create whose answer is lost: the object is read by name and adopted when it carries this
//!   worker's labels; when it is absent the create is sent once more (the name is the idempotency
//!   key: a second object cannot be made);
//! - 410 on a watch (its resourceVersion was compacted), as the HTTP answer or as an `ERROR`
//!   event with `Expired`: a fresh list, then a watch from that list's resourceVersion; on a paged
//!   list (an expired continue token): the list starts again from its first page;
//! - 429: the same request again after the server's `Retry-After` ([`THROTTLE_WAIT_DEFAULT`] when
//!   it names none), at most [`THROTTLED_RETRIES_MAX`] times, and never when it asks for longer
//!   than [`THROTTLE_WAIT_MAX`]; a 429 is the one answer that proves the server did nothing.
//!   [`client_from`] builds clients whose 429s carry the `Retry-After` header into the Status.
//!
//! The controller's own service account needs, in the workers' namespace only: `create`, `get`,
//! `list`, `watch` and `delete` on `pods` and `services` (and on `sandboxclaims` of
//! `extensions.agents.x-k8s.io` for [`crate::claim`]). It never needs `patch`, `update`, secrets
//! or anything cluster-wide, and it never force-deletes (zero grace).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, Container, ContainerPort, EnvVar, KeyToPath, Pod, PodSpec,
    PodTemplate, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Service, ServicePort, ServiceSpec, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{
    Api, DeleteParams, ListParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use kube::config::{
    AuthInfo, Cluster, Context as KubeContext, KubeConfigOptions, Kubeconfig, NamedAuthInfo,
    NamedCluster, NamedContext,
};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use corral_core::ids::{ImageId, WorkerId};
use corral_core::pool::Outcome;
use corral_core::store::Unavailable;
use corral_core::time::UnixMillis;

use crate::Backend;

/// The Kubernetes client the backends take (kube's), for callers without kube of their own.
pub use ::kube::Client;

/// The label every Corral worker carries (the ISO-5 NetworkPolicy selects on it).
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// The value of [`LABEL_NAME`] on workers.
pub const WORKER_NAME: &str = "corral-worker";
/// The label that says which system a pod belongs to.
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
/// The value of [`LABEL_PART_OF`].
pub const PART_OF: &str = "corral";
/// The value of [`LABEL_NAME`] on the API's pods (which also serve the package broker).
pub const API_NAME: &str = "corral-api";
/// The value of [`LABEL_NAME`] on the controller's pods.
pub const CONTROLLER_NAME: &str = "corral-controller";
/// The value of [`LABEL_NAME`] on the egress proxy's pods.
pub const EGRESS_PROXY_NAME: &str = "corral-egress-proxy";
/// The value of [`LABEL_NAME`] on the TURN server's (coturn's) pods, when it runs in the cluster.
pub const TURN_NAME: &str = "corral-turn";
/// The value of [`LABEL_NAME`] on Valkey's pods.
pub const VALKEY_NAME: &str = "corral-valkey";
/// The label the API server sets on every namespace, holding its name (immutable); the
/// NetworkPolicies select this system's namespace by it.
pub const LABEL_NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";
/// The label holding the worker id (its `Display` form).
pub const LABEL_WORKER: &str = "corral.dev/worker";
/// The label holding the pool's name.
pub const LABEL_POOL: &str = "corral.dev/pool";
/// The annotation holding the pool's image id (too long and too free-form for a label).
pub const ANNOTATION_IMAGE: &str = "corral.dev/image";
/// The worker's authenticated control API (BROW-7).
pub const CONTROL_PORT: u16 = corral_core::config::WorkerPorts::DEFAULT_CONTROL;
/// The worker's browser-media HTTP and signaling adapter (BROW-7).
pub const BROWSER_PORT: u16 = corral_core::config::WorkerPorts::DEFAULT_BROWSER;
/// The one container of a worker pod.
pub const CONTAINER_NAME: &str = "worker";
/// The key, in the operator's Secret, of the workers' control credential (the one the API and the
/// controller present); mounted read-only as [`CREDENTIAL_FILE`].
pub const CREDENTIAL_KEY: &str = "worker-token";
/// Where the worker container reads its control credential (`CORRAL_WORKER_TOKEN_FILE`).
pub const CREDENTIAL_FILE: &str = "/var/run/corral/worker-token";
/// What the worker container runs: the image must have `corral` on its `PATH` (with the
/// interpreters it runs code in).
pub const WORKER_COMMAND: [&str; 5] = ["corral", "worker", "serve", "--listen", "0.0.0.0:8091"];

/// Watches restarted at most per wait; past it the wait gives up as `Unknown`.
const WATCH_RESTARTS_MAX: u32 = 1_000;
/// Pages read at most per list (of `LIST_PAGE_LIMIT` items each).
const LIST_PAGES_MAX: u32 = 64;
/// Items per list page.
const LIST_PAGE_LIMIT: u32 = 500;
/// Times one list starts again from its first page after its continue token expired (410).
const LIST_RESTARTS_MAX: u32 = 3;
/// Creates sent at most for one object whose answers were lost (the name keeps it one object).
const CREATE_ATTEMPTS_MAX: u32 = 2;
/// Deletes sent at most for one object whose uid precondition failed (409) because the name was
/// taken by a new object in the meantime.
const REMOVE_ATTEMPTS_MAX: u32 = 3;
/// 429 answers one request is sent again after, at most; the next one is taken as a refusal.
pub const THROTTLED_RETRIES_MAX: u32 = 3;
/// The longest `Retry-After` waited out; a server that asks for longer is taken as a refusal at
/// once (it did nothing), and the pool asks again on its own schedule.
pub const THROTTLE_WAIT_MAX: Duration = Duration::from_secs(5);
/// The wait after a 429 that names no delay: the API server's own smallest `Retry-After`, so a
/// throttled request is never sent again at once.
pub const THROTTLE_WAIT_DEFAULT: Duration = Duration::from_secs(1);
/// The largest 429 body [`client_from`]'s clients read to carry `Retry-After` into its Status.
const THROTTLE_BODY_BYTES_MAX: u64 = 64 * 1024;
/// Where a pod's ServiceAccount credentials are mounted: `token`, `ca.crt` and `namespace`.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Which AppArmor profile the worker container runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppArmor {
    /// No AppArmor confinement. The runtime's default profile denies `mount`, which the jail needs.
    Unconfined,
    /// A profile the operator loaded on every node, which must allow `mount`, `umount` and
    /// `pivot_root`.
    Localhost(String),
}

/// Which seccomp profile the worker container runs under (the supervisor, not sandboxed code:
/// the jail installs its own filter on every sandboxed process, decision 0005).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seccomp {
    /// No runtime filter on the supervisor. The runtime's default profile cannot be used: it has
    /// no `pivot_root` at all, with or without `SYS_ADMIN`, and the jail pivots into its root.
    Unconfined,
    /// A profile the operator installed on every node (relative to the kubelet's seccomp
    /// directory): the runtime's default plus `pivot_root` is enough.
    Localhost(String),
}

/// One resource's request and limit, as Kubernetes quantities (`500m`, `2`, `1Gi`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    /// What the scheduler reserves for the worker.
    pub request: String,
    /// What the kubelet lets the worker use: its cgroup's limit.
    pub limit: String,
}

impl Bound {
    /// `REQUEST:LIMIT`, or one quantity for both (`--worker-cpu 500m:2`, `--worker-memory 3Gi`).
    ///
    /// # Errors
    /// When either side is not a quantity.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (request, limit) = text.split_once(':').unwrap_or((text, text));
        for quantity in [request, limit] {
            if !is_quantity(quantity) {
                return Err(format!(
                    "{quantity:?} is not a Kubernetes quantity (digits with an optional fraction \
                     and one of the suffixes m, k, M, G, T, Ki, Mi, Gi, Ti; REQUEST:LIMIT or one \
                     for both)"
                ));
            }
        }
        Ok(Self {
            request: request.to_owned(),
            limit: limit.to_owned(),
        })
    }
}

/// Whether `text` is a quantity this backend hands the API server: a plain decimal number with
/// one optional decimal or binary suffix. (Kubernetes also takes exponents; nobody sizes a worker
/// with them, and a typo in one would otherwise be found only by the API server, on every
/// create.)
fn is_quantity(text: &str) -> bool {
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let mut parts = number.split('.');
    let whole = parts.next().unwrap_or("");
    let fraction = parts.next();
    let number_ok = parts.next().is_none()
        && (!whole.is_empty() || fraction.is_some_and(|f| !f.is_empty()))
        && fraction.is_none_or(|f| !f.is_empty());
    number_ok
        && matches!(
            suffix,
            "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
        )
}

/// The worker container's requests and limits (decision 0032). The pod is single-tenant: one
/// run or one browser session at a time, so its limits are that run's outer bound, below the
/// run's own (`SANDBOX_MAX_MEMORY_BYTES`, `SANDBOX_MAX_PROCESSES`) where the worker can make
/// per-run cgroups, and the only cgroup bound where it cannot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerResources {
    /// CPU.
    pub cpu: Bound,
    /// Memory: a browser session's Chromium, Xvfb and encoder need most of it.
    pub memory: Bound,
}

impl Default for WorkerResources {
    /// Half a core reserved and two at most; 1 GiB reserved and 3 GiB at most.
    fn default() -> Self {
        Self {
            cpu: Bound {
                request: "500m".to_owned(),
                limit: "2".to_owned(),
            },
            memory: Bound {
                request: "1Gi".to_owned(),
                limit: "3Gi".to_owned(),
            },
        }
    }
}

impl WorkerResources {
    fn validate(&self) -> Result<(), String> {
        for (name, bound) in [("cpu", &self.cpu), ("memory", &self.memory)] {
            for quantity in [&bound.request, &bound.limit] {
                if !is_quantity(quantity) {
                    return Err(format!(
                        "the worker's {name} {quantity:?} is not a quantity"
                    ));
                }
            }
        }
        Ok(())
    }

    fn requirements(&self) -> ResourceRequirements {
        let map = |cpu: &str, memory: &str| {
            BTreeMap::from([
                ("cpu".to_owned(), Quantity(cpu.to_owned())),
                ("memory".to_owned(), Quantity(memory.to_owned())),
            ])
        };
        ResourceRequirements {
            requests: Some(map(&self.cpu.request, &self.memory.request)),
            limits: Some(map(&self.cpu.limit, &self.memory.limit)),
            ..ResourceRequirements::default()
        }
    }
}

/// How worker pods are made and how long the backend waits for them.
#[derive(Clone, Debug)]
pub struct KubeSettings {
    /// The namespace of worker pods and Services.
    pub namespace: String,
    /// The pool's name, the value of [`LABEL_POOL`] (a valid label value).
    pub pool: String,
    /// The container image of the worker (a digest reference), which is also the pool's image id.
    pub image: ImageId,
    /// The RuntimeClass (gVisor) when the operator chose one (ISO-3); never required.
    pub runtime_class: Option<String>,
    /// The Secret holding the workers' control credential under [`CREDENTIAL_KEY`]. A worker
    /// refuses to serve without one, and it never travels in the pod's spec.
    pub credential_secret: String,
    /// Settings the worker container gets beside its own (for example the egress proxy's address,
    /// `SANDBOX_EGRESS_PROXY_URL`). Never a credential: those come from Secrets.
    pub worker_env: Vec<(String, String)>,
    /// The worker container's requests and limits (decision 0032).
    pub resources: WorkerResources,
    /// The worker container's AppArmor profile.
    pub apparmor: AppArmor,
    /// The worker container's seccomp profile.
    pub seccomp: Seccomp,
    /// How long a create waits for the pod to become Ready.
    pub ready_timeout: Duration,
    /// How long a delete waits for both objects to be confirmed absent.
    pub delete_timeout: Duration,
    /// How long one API request may take before its outcome is unknown.
    pub request_timeout: Duration,
    /// The pause between two GETs while confirming absence, and after a failed list or watch.
    pub poll_interval: Duration,
    /// The pod's termination grace on delete. Never zero: a zero grace is a forced deletion that
    /// removes the object before the kubelet has stopped the containers, so absence would prove
    /// nothing.
    pub delete_grace_seconds: u32,
}

impl KubeSettings {
    /// Settings with the default waits: 120 s to be ready, 60 s to be gone, 10 s per request.
    pub fn new(namespace: &str, pool: &str, image: ImageId) -> Self {
        Self {
            namespace: namespace.to_owned(),
            pool: pool.to_owned(),
            image,
            runtime_class: None,
            credential_secret: "corral-worker-credential".to_owned(),
            worker_env: Vec::new(),
            resources: WorkerResources::default(),
            apparmor: AppArmor::Unconfined,
            seccomp: Seccomp::Unconfined,
            ready_timeout: Duration::from_secs(120),
            delete_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(500),
            delete_grace_seconds: 5,
        }
    }

    /// Checks what the API server would otherwise refuse on every create.
    pub fn validate(&self) -> Result<(), String> {
        if !is_label_value(&self.pool) || self.pool.is_empty() {
            return Err(format!("pool name {:?} is not a label value", self.pool));
        }
        if self.namespace.is_empty() {
            return Err("the namespace is empty".to_owned());
        }
        if self.credential_secret.is_empty() {
            return Err("no Secret named for the workers' credential".to_owned());
        }
        if self.delete_grace_seconds == 0 {
            return Err("a zero delete grace is a forced deletion; use at least 1 s".to_owned());
        }
        self.resources.validate()
    }
}

/// The cluster from the kubeconfig, or from the pod's service account inside a cluster
/// ([`incluster_config_from`] on [`SERVICE_ACCOUNT_DIR`] and `KUBERNETES_SERVICE_HOST`/`_PORT`),
/// in that order, as kube's `Config::infer` does; the client is [`client_from`]'s.
///
/// # Errors
/// When neither is there.
pub async fn cluster_client() -> Result<kube::Client, String> {
    let config = match kube::Config::from_kubeconfig(&KubeConfigOptions::default()).await {
        Ok(config) => config,
        Err(kubeconfig) => {
            let host = std::env::var("KUBERNETES_SERVICE_HOST");
            let port = std::env::var("KUBERNETES_SERVICE_PORT");
            let (Ok(host), Ok(port)) = (host, port) else {
                return Err(format!(
                    "no Kubernetes cluster: no kubeconfig ({kubeconfig}), and not in a cluster \
                     (KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT unset)"
                ));
            };
            incluster_config_from(Path::new(SERVICE_ACCOUNT_DIR), &host, &port)
                .await
                .map_err(|e| {
                    format!("no Kubernetes cluster: no kubeconfig ({kubeconfig}); in-cluster: {e}")
                })?
        }
    };
    client_from(config)
}

/// The in-cluster configuration from a ServiceAccount mount `dir` (`token`, `ca.crt`,
/// `namespace`) and the API server's `host` and `port` (`KUBERNETES_SERVICE_HOST`/`_PORT`): what
/// kube's `Config::incluster` builds from its fixed paths. The server is verified against the CA
/// file (re-read when it rotates), and every request carries the token file's token (re-read as
/// it is refreshed).
///
/// # Errors
/// When the port is not a port, a file is missing or empty, or the CA is not PEM certificates.
pub async fn incluster_config_from(
    dir: &Path,
    host: &str,
    port: &str,
) -> Result<kube::Config, String> {
    let port: u16 = port
        .trim()
        .parse()
        .map_err(|e| format!("KUBERNETES_SERVICE_PORT {port:?}: {e}"))?;
    // IPv6 addresses are bracketed; 443 is left implicit, as client-go does.
    let authority = match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
        _ => host.to_owned(),
    };
    let server = if port == 443 {
        format!("https://{authority}")
    } else {
        format!("https://{authority}:{port}")
    };
    let path_of = |name: &str| {
        let path = dir.join(name);
        path.to_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{} is not UTF-8", path.display()))
    };
    let (token_file, ca_file) = (path_of("token")?, path_of("ca.crt")?);
    let namespace = std::fs::read_to_string(dir.join("namespace"))
        .map_err(|e| format!("{}: {e}", dir.join("namespace").display()))?;
    let namespace = namespace.trim();
    if namespace.is_empty() {
        return Err(format!("{} is empty", dir.join("namespace").display()));
    }
    let token_bytes = std::fs::metadata(&token_file)
        .map_err(|e| format!("{token_file}: {e}"))?
        .len();
    if token_bytes == 0 {
        return Err(format!("{token_file} is empty"));
    }
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "in-cluster".to_owned(),
            cluster: Some(Cluster {
                server: Some(server),
                certificate_authority: Some(ca_file.clone()),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "service-account".to_owned(),
            auth_info: Some(AuthInfo {
                token_file: Some(token_file),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: "in-cluster".to_owned(),
            context: Some(KubeContext {
                cluster: "in-cluster".to_owned(),
                user: Some("service-account".to_owned()),
                namespace: Some(namespace.to_owned()),
                ..KubeContext::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some("in-cluster".to_owned()),
        ..Kubeconfig::default()
    };
    // kube reads and parses the CA file here, so a missing or unreadable CA fails now.
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("the ServiceAccount's configuration: {e}"))?;
    config.root_cert_file = Some(ca_file.into());
    Ok(config)
}

/// A client of the cluster `config` names, for the backends.
///
/// kube's own retries are off: they wait whatever delay a server asks, without a bound, and send
/// again requests answered 503 or 504 that may have acted; the one retry policy is the backend's
/// ([`THROTTLED_RETRIES_MAX`]). A 429's `Retry-After` header is carried into the Status kube hands
/// the backend (where a Status body has no `retryAfterSeconds`, or the body is the API server's
/// plain-text answer from priority and fairness), so that policy honours what the server said.
///
/// # Errors
/// When kube cannot build a client from `config` (a TLS setting, an unreadable token file).
pub fn client_from(mut config: kube::Config) -> Result<kube::Client, String> {
    config.default_retry = false;
    let namespace = config.default_namespace.clone();
    let inner = kube::Client::try_from(config).map_err(|e| format!("a Kubernetes client: {e}"))?;
    Ok(kube::Client::new(RetryAfterInStatus(inner), namespace))
}

/// A client that rewrites each 429 so that its Status carries the `Retry-After` header.
#[derive(Clone)]
struct RetryAfterInStatus(kube::Client);

impl tower_service::Service<http::Request<kube::client::Body>> for RetryAfterInStatus {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner client buffers: it is always ready to take a request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move {
            let response = client.send(request).await?;
            retry_after_in_status(response).await
        })
    }
}

/// `response` itself, or, for a 429 with a `Retry-After` in seconds, a Status whose
/// `details.retryAfterSeconds` says it (kube keeps the body of an error and drops its headers).
async fn retry_after_in_status(
    response: http::Response<kube::client::Body>,
) -> Result<http::Response<kube::client::Body>, kube::Error> {
    if response.status() != http::StatusCode::TOO_MANY_REQUESTS {
        return Ok(response);
    }
    let (mut parts, body) = response.into_parts();
    let header = |name: http::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let seconds = header(http::header::RETRY_AFTER);
    let small = header(http::header::CONTENT_LENGTH).is_some_and(|n| n <= THROTTLE_BODY_BYTES_MAX);
    let (Some(seconds), true) = (seconds, small) else {
        return Ok(http::Response::from_parts(parts, body));
    };
    let bytes = body.collect_bytes().await?;
    let mut status = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .filter(|v| v["kind"] == "Status")
        .unwrap_or_else(|| {
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": String::from_utf8_lossy(&bytes).trim(),
                "reason": "TooManyRequests", "code": 429,
            })
        });
    if status["details"]["retryAfterSeconds"].as_u64().unwrap_or(0) == 0 {
        status["details"]["retryAfterSeconds"] = serde_json::json!(seconds);
    }
    let body = serde_json::to_vec(&status).map_err(kube::Error::SerdeError)?;
    parts.headers.remove(http::header::CONTENT_LENGTH);
    parts.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(http::Response::from_parts(
        parts,
        kube::client::Body::from(body),
    ))
}

/// True for a valid label value: at most 63 characters, alphanumerics with `-`, `_`, `.` inside.
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_none_or(u8::is_ascii_alphanumeric)
        && bytes.last().is_none_or(u8::is_ascii_alphanumeric)
}

/// The object name of a worker's pod and Service: its id, lowercased (DNS-1035 safe).
pub fn object_name(worker: WorkerId) -> String {
    worker.to_string().to_ascii_lowercase()
}

/// The labels of a worker's pod and Service.
pub fn worker_labels(pool: &str, worker: WorkerId) -> BTreeMap<String, String> {
    let mut labels = pool_labels(pool);
    labels.insert(LABEL_WORKER.to_owned(), object_name(worker));
    labels
}

/// The label selector of every worker in `pool`.
pub fn pool_selector(pool: &str) -> String {
    format!("{LABEL_NAME}={WORKER_NAME},{LABEL_PART_OF}={PART_OF},{LABEL_POOL}={pool}")
}

/// The label selector of one worker in `pool`.
pub fn worker_selector(pool: &str, worker: WorkerId) -> String {
    format!(
        "{},{LABEL_WORKER}={}",
        pool_selector(pool),
        object_name(worker)
    )
}

/// The worker container's security context: what the jail needs to build its namespaces, and no
/// more.
///
/// The worker's supervisor runs as root *inside the pod's own user namespace* (`hostUsers: false`
/// on the pod, see [`worker_pod`]), so every capability below is scoped to that namespace and is
/// not root on the node. From there it unshares a private mount namespace for its run
/// directories, and each run's stage 1 creates user, mount, network, IPC, UTS, pid and cgroup
/// namespaces, then pivots into a read-only root with a fresh `/proc` (decision 0005).
/// - `privileged: false`: no device access, no host paths, the runtime's masks stay except /proc.
/// - `runAsUser: 0`, `runAsNonRoot: false`: the supervisor writes the jail's uid/gid maps, places
///   runs in cgroups and wipes workspaces of other uids.
/// - capabilities: drop `ALL`, then add
///   - `SYS_ADMIN`: `unshare(CLONE_NEWNS)` and the tmpfs mounts of the supervisor; it is also what
///     would make the runtime's default seccomp profile admit `unshare`, `mount`, `umount2` and
///     `setns` (but not `pivot_root`, see below);
///   - `SETUID`, `SETGID`: writing the stage's uid and gid maps and dropping to the run's user;
///   - `CHOWN`, `FOWNER`, `DAC_OVERRIDE`: giving the workspace to the run's user and wiping what
///     that user left behind whatever modes it set;
///   - `KILL`: killing every process of a run, which runs under another uid.
/// - `allowPrivilegeEscalation: true`, stated rather than defaulted: Kubernetes documents it as
///   always true with `SYS_ADMIN` (its validation refuses `false` beside `CAP_SYS_ADMIN`), so
///   `false` would be false comfort. `no_new_privs` is set by the jail's stage 2 on every
///   sandboxed process, which is where it matters.
/// - seccomp `Unconfined` or a named `Localhost` profile: the runtime's default profile admits
///   `unshare` and `mount` only with `SYS_ADMIN`, and never `pivot_root`, which the jail needs;
///   the jail installs its own filter on every sandboxed process either way.
/// - AppArmor `Unconfined` or a named `Localhost` profile: the runtime's default profile denies
///   `mount`.
/// - `procMount: Unmasked`: a new user namespace may mount `/proc` only when the mount it came
///   from is fully visible; the runtime's masks over `/proc/kcore` and friends forbid the jail's
///   `/proc`. The API accepts `Unmasked` only with `hostUsers: false`.
///
/// The operator must admit this in the workers' namespace: Pod Security `privileged` level
/// (baseline forbids `SYS_ADMIN`, unconfined AppArmor and seccomp, and an unmasked /proc), nodes
/// and a runtime that support pod user namespaces, and the `ProcMountType` feature.
pub fn worker_security_context(apparmor: &AppArmor, seccomp: &Seccomp) -> SecurityContext {
    let apparmor = match apparmor {
        AppArmor::Unconfined => AppArmorProfile {
            type_: "Unconfined".to_owned(),
            localhost_profile: None,
        },
        AppArmor::Localhost(name) => AppArmorProfile {
            type_: "Localhost".to_owned(),
            localhost_profile: Some(name.clone()),
        },
    };
    SecurityContext {
        privileged: Some(false),
        allow_privilege_escalation: Some(true),
        run_as_user: Some(0),
        run_as_non_root: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: Some(
                [
                    "SYS_ADMIN",
                    "SETUID",
                    "SETGID",
                    "CHOWN",
                    "FOWNER",
                    "DAC_OVERRIDE",
                    "KILL",
                ]
                .map(str::to_owned)
                .to_vec(),
            ),
        }),
        seccomp_profile: Some(match seccomp {
            Seccomp::Unconfined => SeccompProfile {
                type_: "Unconfined".to_owned(),
                localhost_profile: None,
            },
            Seccomp::Localhost(path) => SeccompProfile {
                type_: "Localhost".to_owned(),
                localhost_profile: Some(path.clone()),
            },
        }),
        app_armor_profile: Some(apparmor),
        proc_mount: Some("Unmasked".to_owned()),
        ..SecurityContext::default()
    }
}

/// The labels of every worker pod in `pool`: [`worker_labels`] without the worker's own.
pub fn pool_labels(pool: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_owned(), WORKER_NAME.to_owned()),
        (LABEL_PART_OF.to_owned(), PART_OF.to_owned()),
        (LABEL_POOL.to_owned(), pool.to_owned()),
    ])
}

/// The pod every worker of the pool gets, as a PodTemplate named [`WORKER_NAME`] in the workers'
/// namespace: [`worker_pod`] is this with the worker's name, label, image annotation and
/// `CORRAL_WORKER_ID`. `corral controller worker-pod` prints it, and `kind-cluster/check` holds
/// the manifests' PodTemplate to it, so that what the manifests state and lint is what the
/// controller creates.
///
/// No service-account token is mounted (the worker never talks to the API server, and code that
/// escapes the jail must not find a credential), service links are off (no other Service's
/// address leaks into the environment), and a crashed worker is not restarted: its pod ends in a
/// terminal phase and the pool replaces it, because a restarted worker would have lost whatever
/// its lease held.
///
/// The worker's control credential comes from the operator's Secret
/// ([`KubeSettings::credential_secret`]), mounted read-only and readable by its owner only; the
/// container runs [`WORKER_COMMAND`] within [`KubeSettings::resources`].
pub fn worker_pod_template(settings: &KubeSettings, image: &ImageId) -> PodTemplate {
    let labels = pool_labels(&settings.pool);
    PodTemplate {
        metadata: ObjectMeta {
            name: Some(WORKER_NAME.to_owned()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        template: Some(PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..ObjectMeta::default()
            }),
            spec: Some(worker_pod_spec(settings, image)),
        }),
    }
}

/// [`worker_pod_template`]'s pod spec.
fn worker_pod_spec(settings: &KubeSettings, image: &ImageId) -> PodSpec {
    let port = |name: &str, port: u16| ContainerPort {
        name: Some(name.to_owned()),
        container_port: i32::from(port),
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    };
    let (credential_dir, credential_name) = CREDENTIAL_FILE
        .rsplit_once('/')
        .unwrap_or(("/", CREDENTIAL_FILE));
    let container = Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(image.0.clone()),
        command: Some(WORKER_COMMAND.iter().map(|s| (*s).to_owned()).collect()),
        env: Some(
            std::iter::once(env_var("CORRAL_WORKER_TOKEN_FILE", CREDENTIAL_FILE))
                .chain(
                    settings
                        .worker_env
                        .iter()
                        .map(|(name, value)| env_var(name, value)),
                )
                .collect(),
        ),
        volume_mounts: Some(vec![VolumeMount {
            name: "credential".to_owned(),
            mount_path: credential_dir.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        ports: Some(vec![
            port("control", CONTROL_PORT),
            port("browser", BROWSER_PORT),
        ]),
        // Ready means the control API accepts connections; a TCP probe needs no credential.
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(CONTROL_PORT)),
                host: None,
            }),
            period_seconds: Some(1),
            ..Probe::default()
        }),
        resources: Some(settings.resources.requirements()),
        security_context: Some(worker_security_context(
            &settings.apparmor,
            &settings.seccomp,
        )),
        ..Container::default()
    };
    PodSpec {
        containers: vec![container],
        runtime_class_name: settings.runtime_class.clone(),
        volumes: Some(vec![Volume {
            name: "credential".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(settings.credential_secret.clone()),
                items: Some(vec![KeyToPath {
                    key: CREDENTIAL_KEY.to_owned(),
                    path: credential_name.to_owned(),
                    ..KeyToPath::default()
                }]),
                default_mode: Some(0o400),
                optional: Some(false),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        }]),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_users: Some(false),
        restart_policy: Some("Never".to_owned()),
        ..PodSpec::default()
    }
}

fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    }
}

/// The pod of `worker`, running `image`: the pool's [`worker_pod_template`] with the worker's
/// name, its [`LABEL_WORKER`] label, the image annotation, and `CORRAL_WORKER_ID` first in its
/// environment (a worker refuses requests that name another worker, decision 0009).
pub fn worker_pod(settings: &KubeSettings, worker: WorkerId, image: &ImageId) -> Pod {
    let mut spec = worker_pod_spec(settings, image);
    for container in &mut spec.containers {
        container
            .env
            .get_or_insert_with(Vec::new)
            .insert(0, env_var("CORRAL_WORKER_ID", &worker.to_string()));
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(object_name(worker)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(worker_labels(&settings.pool, worker)),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_IMAGE.to_owned(),
                image.0.clone(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The ClusterIP Service of `worker`: ports 8091 and 8080, selecting exactly its pod. Never a
/// NodePort or LoadBalancer: workers are reached only from inside the cluster (BROW-9, ISO-5).
pub fn worker_service(settings: &KubeSettings, worker: WorkerId) -> Service {
    let port = |name: &str, port: u16| ServicePort {
        name: Some(name.to_owned()),
        port: i32::from(port),
        target_port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    };
    Service {
        metadata: ObjectMeta {
            name: Some(object_name(worker)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(worker_labels(&settings.pool, worker)),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(worker_labels(&settings.pool, worker)),
            ports: Some(vec![
                port("control", CONTROL_PORT),
                port("browser", BROWSER_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// What one API request came to.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// It succeeded.
    Ok(T),
    /// 404.
    NotFound,
    /// 409: it already exists, or a precondition did not hold.
    Conflict,
    /// 410: the resourceVersion or continue token it named was compacted away.
    Gone,
    /// Any other definite refusal (a 4xx the server answers before acting, a 429 not waited out).
    Refused,
    /// Nobody can tell: a timeout, a 5xx, a lost connection, an unreadable answer.
    Unknown,
}

/// Runs one request, each attempt bounded by `timeout`, and classifies its answer. A 429 is sent
/// again after the server's `Retry-After`, within [`THROTTLED_RETRIES_MAX`] and
/// [`THROTTLE_WAIT_MAX`]: the server refused it before acting, so sending it again is safe.
pub(crate) async fn ask<T, R>(timeout: Duration, mut request: impl FnMut() -> R) -> Answer<T>
where
    R: Future<Output = Result<T, kube::Error>>,
{
    let mut throttled = 0;
    loop {
        let status = match tokio::time::timeout(timeout, request()).await {
            Ok(Ok(value)) => return Answer::Ok(value),
            Ok(Err(kube::Error::Api(status))) => status,
            Ok(Err(_)) | Err(_) => return Answer::Unknown,
        };
        let answer = match status.code {
            404 => Answer::NotFound,
            409 => Answer::Conflict,
            410 => Answer::Gone,
            429 => Answer::Refused,
            // 408 is the server's own timeout: it may have acted.
            408 => Answer::Unknown,
            400..=499 => Answer::Refused,
            _ => Answer::Unknown,
        };
        if status.code != 429 {
            return answer;
        }
        let wait = status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|seconds| *seconds > 0)
            .map_or(THROTTLE_WAIT_DEFAULT, |s| Duration::from_secs(u64::from(s)));
        if throttled >= THROTTLED_RETRIES_MAX || wait > THROTTLE_WAIT_MAX {
            return answer;
        }
        throttled += 1;
        tokio::time::sleep(wait).await;
    }
}

/// True when `object` carries `worker`'s id and `pool`'s name: it is ours to adopt or delete.
pub(crate) fn is_ours<K: Resource>(object: &K, pool: &str, worker: WorkerId) -> bool {
    let labels = object.labels();
    labels.get(LABEL_WORKER) == Some(&object_name(worker))
        && labels.get(LABEL_POOL).map(String::as_str) == Some(pool)
}

/// Creates `object`; an existing one counts only when it carries `worker`'s labels.
///
/// A create whose answer is lost may have made the object. It is read by name: adopted when it is
/// ours, and when it is absent the create is sent once more. The name makes a second object
/// impossible: a create that lands late is answered 409, and a 409 is settled by reading.
pub(crate) async fn create_or_adopt<K>(
    api: &Api<K>,
    object: &K,
    pool: &str,
    worker: WorkerId,
    timeout: Duration,
) -> Answer<K>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + Debug,
{
    let params = PostParams::default();
    let name = object_name(worker);
    for attempt in 0..CREATE_ATTEMPTS_MAX {
        match ask(timeout, || api.create(&params, object)).await {
            Answer::Ok(made) => return Answer::Ok(made),
            Answer::Conflict => return adopt(api, &name, pool, worker, timeout).await,
            // Refused before acting; after a lost answer, though, the first attempt may have.
            refused @ (Answer::Refused | Answer::NotFound | Answer::Gone) => {
                return if attempt == 0 {
                    refused
                } else {
                    Answer::Unknown
                };
            }
            Answer::Unknown => match ask(timeout, || api.get(&name)).await {
                Answer::Ok(found) if is_ours(&found, pool, worker) => return Answer::Ok(found),
                // The name is someone else's: nothing of ours was made under it.
                Answer::Ok(_) => return Answer::Refused,
                // Not made (or not yet): ask again.
                Answer::NotFound => {}
                Answer::Conflict | Answer::Gone | Answer::Refused | Answer::Unknown => {
                    return Answer::Unknown;
                }
            },
        }
    }
    Answer::Unknown
}

/// Settles a 409 on a create: the object named `name` is ours (an earlier attempt whose answer
/// was lost made it) or someone else's, which is never adopted.
async fn adopt<K>(
    api: &Api<K>,
    name: &str,
    pool: &str,
    worker: WorkerId,
    timeout: Duration,
) -> Answer<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match ask(timeout, || api.get(name)).await {
        Answer::Ok(found) if is_ours(&found, pool, worker) => Answer::Ok(found),
        Answer::Ok(_) => Answer::Refused,
        // It existed a moment ago and is gone now (being deleted), or it could not be read: it
        // exists or may, so nothing is settled (never `Failed`, which would free it).
        Answer::NotFound | Answer::Conflict | Answer::Gone | Answer::Refused | Answer::Unknown => {
            Answer::Unknown
        }
    }
}

/// Where one object stands after a delete request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    /// It answered 404.
    Absent,
    /// The delete was accepted; absence is not yet confirmed.
    Deleting,
    /// The server refused the delete, or the object is not ours.
    Refused,
    /// Nobody can tell.
    Unknown,
}

/// Deletes the object named after `worker` if it is ours, by uid, so that a different object
/// created under the same name in the meantime is never deleted: a 409 (the uid no longer
/// matches) reads the name again, and deletes what is there only if it is ours too.
pub(crate) async fn remove<K>(
    api: &Api<K>,
    pool: &str,
    worker: WorkerId,
    grace_seconds: Option<u32>,
    timeout: Duration,
) -> Removal
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let name = object_name(worker);
    for _ in 0..REMOVE_ATTEMPTS_MAX {
        let found = match ask(timeout, || api.get(&name)).await {
            Answer::Ok(found) => found,
            Answer::NotFound => return Removal::Absent,
            Answer::Refused | Answer::Conflict | Answer::Gone => return Removal::Refused,
            Answer::Unknown => return Removal::Unknown,
        };
        if !is_ours(&found, pool, worker) {
            return Removal::Refused;
        }
        let params = DeleteParams {
            grace_period_seconds: grace_seconds,
            preconditions: Some(Preconditions {
                uid: found.uid(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match ask(timeout, || api.delete(&name, &params)).await {
            Answer::Ok(_) => return Removal::Deleting,
            Answer::NotFound => return Removal::Absent,
            // The uid no longer matches: the name holds another object now; read it again.
            Answer::Conflict => {}
            Answer::Unknown => return Removal::Unknown,
            Answer::Refused | Answer::Gone => return Removal::Refused,
        }
    }
    // Replaced under every read: the next delete the pool orders looks again.
    Removal::Unknown
}

/// GETs the object named after `worker` until it answers 404 or `deadline` passes.
pub(crate) async fn confirm_absent<K>(
    api: &Api<K>,
    worker: WorkerId,
    deadline: Instant,
    poll_interval: Duration,
    timeout: Duration,
) -> bool
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let name = object_name(worker);
    loop {
        if let Answer::NotFound = ask(timeout, || api.get(&name)).await {
            return true;
        }
        if Instant::now() + poll_interval > deadline {
            return false;
        }
        tokio::time::sleep(poll_interval).await;
    }
}

/// What an object's state says about readiness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Ready to serve.
    Ready,
    /// Not yet.
    Pending,
    /// It will never be ready (a terminal phase, a failed claim).
    Dead,
}

/// Waits until the object selected by `selector` is ready, by list then watch, re-listing
/// whenever the watch ends: the list is the source of truth after every restart. A watch answered
/// 410 (its resourceVersion compacted), whether as the HTTP answer or as an `ERROR` event, ends
/// the same way: a fresh list, and a watch from that list's resourceVersion.
pub(crate) async fn wait_ready<K>(
    api: &Api<K>,
    selector: &str,
    readiness: impl Fn(&K) -> Readiness,
    deadline: Instant,
    poll_interval: Duration,
    timeout: Duration,
) -> Outcome
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    for _ in 0..WATCH_RESTARTS_MAX {
        if Instant::now() >= deadline {
            return Outcome::Unknown;
        }
        let list_params = ListParams::default().labels(selector);
        let listed = match ask(timeout, || api.list(&list_params)).await {
            Answer::Ok(listed) => listed,
            _ => {
                tokio::time::sleep(poll_interval).await;
                continue;
            }
        };
        let Some(object) = listed.items.first() else {
            // Created a moment ago and gone now: someone deleted it; the pool must find out.
            return Outcome::Unknown;
        };
        match readiness(object) {
            Readiness::Ready => return Outcome::Done,
            // It exists but will never serve: the pool deletes it.
            Readiness::Dead => return Outcome::Unknown,
            Readiness::Pending => {}
        }
        let Some(version) = listed.metadata.resource_version.clone() else {
            tokio::time::sleep(poll_interval).await;
            continue;
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let params = WatchParams::default()
            .labels(selector)
            .timeout(u32::try_from(remaining.as_secs().clamp(1, 290)).unwrap_or(290));
        let Answer::Ok(stream) = ask(timeout, || api.watch(&params, &version)).await else {
            tokio::time::sleep(poll_interval).await;
            continue;
        };
        let mut stream = std::pin::pin!(stream);
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, stream.next()).await {
            match event {
                Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => {
                    match readiness(&object) {
                        Readiness::Ready => return Outcome::Done,
                        Readiness::Dead => return Outcome::Unknown,
                        Readiness::Pending => {}
                    }
                }
                Ok(WatchEvent::Deleted(_)) => return Outcome::Unknown,
                Ok(WatchEvent::Bookmark(_)) => {}
                // An error event (410 Expired: the watch fell behind a compaction) or an
                // unreadable line: start again from a list.
                Ok(WatchEvent::Error(_)) | Err(_) => break,
            }
        }
        // The watch ended without a verdict. A pause before the next list keeps a server that
        // closes every watch at once from turning this into a busy loop that spends the restart
        // bound long before the deadline.
        tokio::time::sleep(poll_interval).await;
    }
    Outcome::Unknown
}

/// Lists every object selected by `selector`, page by page. A continue token the server no
/// longer honours (410: the snapshot the pages came from was compacted) starts the list again from
/// its first page, so the inventory is always one snapshot.
pub(crate) async fn list_all<K>(
    api: &Api<K>,
    selector: &str,
    timeout: Duration,
) -> Result<Vec<K>, Unavailable>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let first = ListParams::default()
        .labels(selector)
        .limit(LIST_PAGE_LIMIT);
    let mut items = Vec::new();
    let mut params = first.clone();
    let mut restarts = 0;
    for _ in 0..LIST_PAGES_MAX {
        match ask(timeout, || api.list(&params)).await {
            Answer::Ok(page) => {
                items.extend(page.items);
                match page.metadata.continue_ {
                    Some(token) if !token.is_empty() => {
                        params = first.clone().continue_token(&token);
                    }
                    _ => return Ok(items),
                }
            }
            Answer::Gone if params.continue_token.is_some() && restarts < LIST_RESTARTS_MAX => {
                restarts += 1;
                items.clear();
                params = first.clone();
            }
            Answer::Gone
            | Answer::NotFound
            | Answer::Conflict
            | Answer::Refused
            | Answer::Unknown => return Err(Unavailable),
        }
    }
    // More pages than the bound: a partial inventory would prove workers absent that are not.
    Err(Unavailable)
}

/// The worker id an object names in its labels.
pub(crate) fn labelled_worker<K: Resource>(object: &K) -> Option<WorkerId> {
    object
        .labels()
        .get(LABEL_WORKER)
        .and_then(|id| WorkerId::parse(id))
}

/// A pod's readiness: its Ready condition, or dead once its phase is terminal.
fn pod_readiness(pod: &Pod) -> Readiness {
    let Some(status) = &pod.status else {
        return Readiness::Pending;
    };
    if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) {
        return Readiness::Dead;
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready {
        Readiness::Ready
    } else {
        Readiness::Pending
    }
}

/// Workers as pods, each with a ClusterIP Service.
pub struct KubeBackend {
    pods: Api<Pod>,
    services: Api<Service>,
    settings: KubeSettings,
}

impl KubeBackend {
    /// A backend that talks to the cluster through `client`.
    pub fn new(client: kube::Client, settings: KubeSettings) -> Result<Self, String> {
        settings.validate()?;
        Ok(Self {
            pods: Api::namespaced(client.clone(), &settings.namespace),
            services: Api::namespaced(client, &settings.namespace),
            settings,
        })
    }

    /// The settings this backend creates workers with.
    pub fn settings(&self) -> &KubeSettings {
        &self.settings
    }

    /// Deletes both objects of `worker` and confirms each absent.
    async fn remove_worker(&self, worker: WorkerId) -> Outcome {
        let s = &self.settings;
        let pool = &s.pool;
        let grace = Some(s.delete_grace_seconds);
        let pod = remove(&self.pods, pool, worker, grace, s.request_timeout).await;
        let service = remove(&self.services, pool, worker, None, s.request_timeout).await;
        if pod == Removal::Refused || service == Removal::Refused {
            return Outcome::Failed;
        }
        let deadline = Instant::now() + s.delete_timeout;
        let pod_gone = confirm_absent(
            &self.pods,
            worker,
            deadline,
            s.poll_interval,
            s.request_timeout,
        )
        .await;
        let service_gone = pod_gone
            && confirm_absent(
                &self.services,
                worker,
                deadline,
                s.poll_interval,
                s.request_timeout,
            )
            .await;
        if pod_gone && service_gone {
            Outcome::Done
        } else {
            Outcome::Unknown
        }
    }
}

impl Backend for KubeBackend {
    fn image(&self) -> ImageId {
        self.settings.image.clone()
    }

    async fn create(
        &self,
        worker: WorkerId,
        image: &ImageId,
        _claim_deadline: Option<UnixMillis>,
    ) -> Outcome {
        let s = &self.settings;
        // The pod comes first: the Service is then owned by it, so the cluster's garbage
        // collector removes a Service whose pod is gone, even one this controller never deletes.
        let pod = worker_pod(s, worker, image);
        let created = create_or_adopt(&self.pods, &pod, &s.pool, worker, s.request_timeout).await;
        let pod = match created {
            Answer::Ok(pod) => pod,
            // Nothing was made: the server refused before acting (or the name is someone else's).
            Answer::Refused | Answer::NotFound | Answer::Gone => return Outcome::Failed,
            Answer::Conflict | Answer::Unknown => return Outcome::Unknown,
        };
        let mut service = worker_service(s, worker);
        if let Some(uid) = pod.uid() {
            service.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Pod".to_owned(),
                name: object_name(worker),
                uid,
                controller: None,
                block_owner_deletion: None,
            }]);
        }
        let made =
            create_or_adopt(&self.services, &service, &s.pool, worker, s.request_timeout).await;
        if !matches!(made, Answer::Ok(_)) {
            // The pod exists without its Service: not usable, and not absent either. The pool
            // deletes it and confirms it gone (POOL-10).
            return Outcome::Unknown;
        }
        let deadline = Instant::now() + s.ready_timeout;
        let selector = worker_selector(&s.pool, worker);
        wait_ready(
            &self.pods,
            &selector,
            pod_readiness,
            deadline,
            s.poll_interval,
            s.request_timeout,
        )
        .await
    }

    async fn delete(&self, worker: WorkerId) -> Outcome {
        self.remove_worker(worker).await
    }

    async fn list(&self) -> Result<BTreeSet<WorkerId>, Unavailable> {
        let s = &self.settings;
        let pods = list_all(&self.pods, &pool_selector(&s.pool), s.request_timeout).await?;
        let mut present = BTreeSet::new();
        for pod in &pods {
            let Some(worker) = labelled_worker(pod) else {
                continue;
            };
            if pod_readiness(pod) == Readiness::Dead {
                // Its containers have exited and, with restartPolicy Never, never run again: the
                // worker is gone. Its objects are removed here (best effort, retried by every
                // later list) because the pool will forget it and never order a delete.
                let _ = self.remove_worker_quickly(worker).await;
                continue;
            }
            present.insert(worker);
        }
        Ok(present)
    }
}

impl KubeBackend {
    /// Asks for the deletion of both objects without waiting for absence.
    async fn remove_worker_quickly(&self, worker: WorkerId) -> (Removal, Removal) {
        let s = &self.settings;
        let grace = Some(s.delete_grace_seconds);
        let pod = remove(&self.pods, &s.pool, worker, grace, s.request_timeout).await;
        let service = remove(&self.services, &s.pool, worker, None, s.request_timeout).await;
        (pod, service)
    }
}
