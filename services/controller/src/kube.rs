//! The `kube` backend: each worker is one pod and one ClusterIP Service in a namespace.
//!
//! The manifests come from pure functions ([`worker_pod`], [`worker_service`]) so that their
//! fields can be asserted without a cluster. The backend only performs create, delete and list and
//! reports each [`Outcome`] honestly:
//! - create: the pod, then its Service, then a bounded wait until the pod is Ready → `Done`; a
//!   definite refusal before anything exists → `Failed`; a timeout, a 5xx or a lost reply after a
//!   request was sent → `Unknown` (the pool then holds the worker until it is proven absent,
//!   POOL-10);
//! - delete: the pod and the Service (only objects that carry this worker's labels, by uid), then
//!   a GET of each until both answer 404 → `Done` (POOL-9);
//! - list: pods selected by this pool's labels; a pod in a terminal phase is reported absent.
//!
//! Waiting for readiness uses a watch, and a fresh list is the source of truth whenever a watch
//! ends or errs, so a closed watch never loses an event.
//!
//! The controller's own service account needs, in the workers' namespace only: `create`, `get`,
//! `list`, `watch` and `delete` on `pods` and `services` (and on `sandboxclaims` of
//! `extensions.agents.x-k8s.io` for [`crate::claim`]). It never needs `patch`, `update`, secrets
//! or anything cluster-wide, and it never force-deletes (zero grace).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, Container, ContainerPort, EnvVar, KeyToPath, Pod, PodSpec,
    Probe, SeccompProfile, SecretVolumeSource, SecurityContext, Service, ServicePort, ServiceSpec,
    TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{
    Api, DeleteParams, ListParams, PostParams, Preconditions, WatchEvent, WatchParams,
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
        Ok(())
    }
}

/// The cluster from the kubeconfig, or from the pod's service account inside a cluster.
///
/// # Errors
/// When neither is there.
pub async fn cluster_client() -> Result<kube::Client, String> {
    kube::Client::try_default()
        .await
        .map_err(|e| format!("no Kubernetes cluster (kubeconfig or in-cluster): {e}"))
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
    BTreeMap::from([
        (LABEL_NAME.to_owned(), WORKER_NAME.to_owned()),
        (LABEL_PART_OF.to_owned(), PART_OF.to_owned()),
        (LABEL_WORKER.to_owned(), object_name(worker)),
        (LABEL_POOL.to_owned(), pool.to_owned()),
    ])
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

/// The pod of `worker`, running `image`.
///
/// No service-account token is mounted (the worker never talks to the API server, and code that
/// escapes the jail must not find a credential), service links are off (no other Service's
/// address leaks into the environment), and a crashed worker is not restarted: its pod ends in a
/// terminal phase and the pool replaces it, because a restarted worker would have lost whatever
/// its lease held.
///
/// The worker's control credential comes from the operator's Secret
/// ([`KubeSettings::credential_secret`]), mounted read-only and readable by its owner only; the
/// container runs [`WORKER_COMMAND`].
pub fn worker_pod(settings: &KubeSettings, worker: WorkerId, image: &ImageId) -> Pod {
    let name = object_name(worker);
    let port = |name: &str, port: u16| ContainerPort {
        name: Some(name.to_owned()),
        container_port: i32::from(port),
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    };
    let env = |name: &str, value: String| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    };
    let (credential_dir, credential_name) = CREDENTIAL_FILE
        .rsplit_once('/')
        .unwrap_or(("/", CREDENTIAL_FILE));
    let container = Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(image.0.clone()),
        command: Some(WORKER_COMMAND.iter().map(|s| (*s).to_owned()).collect()),
        env: Some(
            [
                // A worker refuses requests that name another worker (decision 0009).
                env("CORRAL_WORKER_ID", worker.to_string()),
                env("CORRAL_WORKER_TOKEN_FILE", CREDENTIAL_FILE.to_owned()),
            ]
            .into_iter()
            .chain(
                settings
                    .worker_env
                    .iter()
                    .map(|(name, value)| env(name, value.clone())),
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
        security_context: Some(worker_security_context(
            &settings.apparmor,
            &settings.seccomp,
        )),
        ..Container::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(settings.namespace.clone()),
            labels: Some(worker_labels(&settings.pool, worker)),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_IMAGE.to_owned(),
                image.0.clone(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
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
        }),
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
    /// Any other definite refusal (a 4xx the server answers before acting).
    Refused,
    /// Nobody can tell: a timeout, a 5xx, a lost connection, an unreadable answer.
    Unknown,
}

/// Runs one request bounded by `timeout` and classifies its answer.
pub(crate) async fn ask<T>(
    timeout: Duration,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Answer<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(value)) => Answer::Ok(value),
        Ok(Err(kube::Error::Api(status))) => match status.code {
            404 => Answer::NotFound,
            409 => Answer::Conflict,
            // 408 is the server's own timeout: it may have acted.
            408 => Answer::Unknown,
            400..=499 => Answer::Refused,
            _ => Answer::Unknown,
        },
        Ok(Err(_)) | Err(_) => Answer::Unknown,
    }
}

/// True when `object` carries `worker`'s id and `pool`'s name: it is ours to adopt or delete.
pub(crate) fn is_ours<K: Resource>(object: &K, pool: &str, worker: WorkerId) -> bool {
    let labels = object.labels();
    labels.get(LABEL_WORKER) == Some(&object_name(worker))
        && labels.get(LABEL_POOL).map(String::as_str) == Some(pool)
}

/// Creates `object`; an existing one counts only when it carries `worker`'s labels.
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
    match ask(timeout, api.create(&PostParams::default(), object)).await {
        Answer::Conflict => {
            // An earlier attempt whose reply was lost may have made it: adopt it only if it is
            // ours, never an object that merely has the same name.
            match ask(timeout, api.get(&object_name(worker))).await {
                Answer::Ok(found) if is_ours(&found, pool, worker) => Answer::Ok(found),
                Answer::Ok(_) => Answer::Refused,
                // It existed a moment ago and is gone now (being deleted): nothing is settled.
                Answer::NotFound => Answer::Unknown,
                other => other,
            }
        }
        other => other,
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
/// created under the same name in the meantime is never deleted.
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
    let found = match ask(timeout, api.get(&name)).await {
        Answer::Ok(found) => found,
        Answer::NotFound => return Removal::Absent,
        Answer::Refused | Answer::Conflict => return Removal::Refused,
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
    match ask(timeout, api.delete(&name, &params)).await {
        Answer::Ok(_) => Removal::Deleting,
        Answer::NotFound => Removal::Absent,
        // The uid no longer matches: what is there now is another object; the next attempt
        // looks again.
        Answer::Conflict | Answer::Unknown => Removal::Unknown,
        Answer::Refused => Removal::Refused,
    }
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
        if let Answer::NotFound = ask(timeout, api.get(&name)).await {
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
/// whenever the watch ends: the list is the source of truth after every restart.
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
        let listed = match ask(timeout, api.list(&ListParams::default().labels(selector))).await {
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
        let watched = tokio::time::timeout(timeout, api.watch(&params, &version)).await;
        let Ok(Ok(stream)) = watched else {
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
                // An error event (410 Gone) or an unreadable line: start again from a list.
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

/// Lists every object selected by `selector`, page by page.
pub(crate) async fn list_all<K>(
    api: &Api<K>,
    selector: &str,
    timeout: Duration,
) -> Result<Vec<K>, Unavailable>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut items = Vec::new();
    let mut params = ListParams::default()
        .labels(selector)
        .limit(LIST_PAGE_LIMIT);
    for _ in 0..LIST_PAGES_MAX {
        let Answer::Ok(page) = ask(timeout, api.list(&params)).await else {
            return Err(Unavailable);
        };
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(items),
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
            Answer::Refused | Answer::NotFound => return Outcome::Failed,
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
