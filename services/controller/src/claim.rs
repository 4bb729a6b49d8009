//! The platform-operator backend (POOL-7): workers are claims on a platform, each with a deadline
//! fixed at creation.
//!
//! [`ClaimPlatform`] says how one platform spells a claim; [`ClaimBackend`] performs create,
//! delete and list on any such platform through kube's dynamic API (no generated types).
//! [`AgentSandbox`] is the kubernetes-sigs/agent-sandbox platform: a `SandboxClaim`
//! (`extensions.agents.x-k8s.io/v1beta1`) that names a `SandboxTemplate` and optionally a
//! `SandboxWarmPool`, with `spec.lifecycle.shutdownTime` as its fixed deadline.
//!
//! A renewal only confirms the claim still exists: a lease's heartbeat renews it in the pool no
//! further than the claim's fixed deadline (corral-core), and each reconcile pass lists the pool's
//! claims (one request, which changes nothing) and reports one missing or past its deadline as
//! absent. Nothing ever extends a deadline, and a claim past its deadline is gone whatever the API
//! still shows.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use kube::api::{Api, ApiResource, DynamicObject};
use tokio::time::Instant;

use corral_core::ids::{ImageId, WorkerId};
use corral_core::pool::Outcome;
use corral_core::store::Unavailable;
use corral_core::time::UnixMillis;

use crate::Backend;
use crate::kube::{
    Answer, Readiness, Removal, confirm_absent, create_or_adopt, labelled_worker, list_all,
    object_name, pool_selector, remove, wait_ready, worker_labels, worker_selector,
};

/// How one platform spells a claim with a fixed deadline.
pub trait ClaimPlatform: Send + Sync {
    /// The claim's API group, version, kind and plural.
    fn resource(&self) -> ApiResource;
    /// The claim's body (`spec` and anything else beside `metadata`) for a claim ending at
    /// `deadline`.
    fn body(&self, deadline: UnixMillis) -> serde_json::Value;
    /// What the claim's status says (its deadline is judged by the backend).
    fn readiness(&self, claim: &DynamicObject) -> Readiness;
    /// The claim's fixed deadline as the platform recorded it.
    fn deadline(&self, claim: &DynamicObject) -> Option<UnixMillis>;
}

/// The kubernetes-sigs/agent-sandbox platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSandbox {
    /// The `SandboxTemplate` every claim names (it fixes the worker image).
    pub template: String,
    /// The `SandboxWarmPool` to adopt from; `None` lets the platform choose any matching pool.
    pub warm_pool: Option<String>,
}

/// The API group of agent-sandbox's claims.
pub const AGENT_SANDBOX_GROUP: &str = "extensions.agents.x-k8s.io";
/// The API version of agent-sandbox's claims.
pub const AGENT_SANDBOX_VERSION: &str = "v1beta1";

/// `millis` as RFC 3339 in UTC with second precision (the form `metav1.Time` serializes), rounded
/// down so the platform never ends a claim later than the pool believes.
pub fn rfc3339(millis: UnixMillis) -> Option<String> {
    let seconds = i64::try_from(millis.0 / 1_000).ok()?;
    let at = jiff::Timestamp::from_second(seconds).ok()?;
    Some(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// Parses an RFC 3339 time as recorded by the API server.
pub fn parse_rfc3339(text: &str) -> Option<UnixMillis> {
    let at: jiff::Timestamp = text.parse().ok()?;
    u64::try_from(at.as_millisecond()).ok().map(UnixMillis)
}

impl ClaimPlatform for AgentSandbox {
    fn resource(&self) -> ApiResource {
        ApiResource {
            group: AGENT_SANDBOX_GROUP.to_owned(),
            version: AGENT_SANDBOX_VERSION.to_owned(),
            api_version: format!("{AGENT_SANDBOX_GROUP}/{AGENT_SANDBOX_VERSION}"),
            kind: "SandboxClaim".to_owned(),
            plural: "sandboxclaims".to_owned(),
        }
    }

    fn body(&self, deadline: UnixMillis) -> serde_json::Value {
        let mut spec = serde_json::json!({
            "sandboxTemplateRef": { "name": self.template },
            "lifecycle": {
                "shutdownTime": rfc3339(deadline),
                // At the deadline the platform deletes the sandbox and the claim: past it the
                // worker is gone, as POOL-7 says, and no object lingers.
                "shutdownPolicy": "Delete",
            },
        });
        if let (Some(pool), Some(map)) = (&self.warm_pool, spec.as_object_mut()) {
            map.insert("warmpool".to_owned(), serde_json::json!(pool));
        }
        serde_json::json!({ "spec": spec })
    }

    fn readiness(&self, claim: &DynamicObject) -> Readiness {
        let conditions = claim.data["status"]["conditions"].as_array();
        let ready = conditions.and_then(|all| all.iter().find(|c| c["type"] == "Ready"));
        // Expiry is judged by the backend from the fixed deadline, not from condition reasons,
        // whose spelling the platform may change.
        match ready {
            Some(c) if c["status"] == "True" => Readiness::Ready,
            _ => Readiness::Pending,
        }
    }

    fn deadline(&self, claim: &DynamicObject) -> Option<UnixMillis> {
        claim.data["spec"]["lifecycle"]["shutdownTime"]
            .as_str()
            .and_then(parse_rfc3339)
    }
}

/// How long claim operations wait.
#[derive(Clone, Debug)]
pub struct ClaimSettings {
    /// The namespace of the claims.
    pub namespace: String,
    /// The pool's name (the `corral.dev/pool` label on every claim).
    pub pool: String,
    /// The image id the pool publishes: the template and its image digest, as the operator names
    /// them (the platform, not this controller, chooses the image).
    pub image: ImageId,
    /// How long a create waits for the claim to be Ready.
    pub ready_timeout: Duration,
    /// How long a delete waits for the claim to be confirmed absent.
    pub delete_timeout: Duration,
    /// How long one API request may take before its outcome is unknown.
    pub request_timeout: Duration,
    /// The pause between two GETs while confirming absence.
    pub poll_interval: Duration,
}

impl ClaimSettings {
    /// Settings with the default waits: 120 s to be ready, 60 s to be gone, 10 s per request.
    pub fn new(namespace: &str, pool: &str, image: ImageId) -> Self {
        Self {
            namespace: namespace.to_owned(),
            pool: pool.to_owned(),
            image,
            ready_timeout: Duration::from_secs(120),
            delete_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(500),
        }
    }
}

/// Workers as claims on a platform.
pub struct ClaimBackend<P> {
    claims: Api<DynamicObject>,
    resource: ApiResource,
    platform: P,
    settings: ClaimSettings,
}

/// Workers as agent-sandbox `SandboxClaim`s.
pub type AgentSandboxBackend = ClaimBackend<AgentSandbox>;

/// Milliseconds since the Unix epoch by this machine's clock.
fn wall_now() -> UnixMillis {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    UnixMillis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

impl<P: ClaimPlatform> ClaimBackend<P> {
    /// A backend that claims workers from `platform` through `client`.
    pub fn new(client: kube::Client, platform: P, settings: ClaimSettings) -> Self {
        let resource = platform.resource();
        Self {
            claims: Api::namespaced_with(client, &settings.namespace, &resource),
            resource,
            platform,
            settings,
        }
    }

    /// The claim object of `worker` ending at `deadline`.
    pub fn claim(&self, worker: WorkerId, deadline: UnixMillis) -> DynamicObject {
        let mut claim = DynamicObject::new(&object_name(worker), &self.resource)
            .within(&self.settings.namespace)
            .data(self.platform.body(deadline));
        claim.metadata.labels = Some(worker_labels(&self.settings.pool, worker));
        claim
    }

    /// True while `claim`'s deadline is ahead of `now`; a claim without a readable deadline is
    /// not one this backend made, and is not live.
    fn is_live(&self, claim: &DynamicObject, now: UnixMillis) -> bool {
        self.platform.deadline(claim).is_some_and(|d| d > now)
    }
}

impl<P: ClaimPlatform> Backend for ClaimBackend<P> {
    fn image(&self) -> ImageId {
        self.settings.image.clone()
    }

    async fn create(
        &self,
        worker: WorkerId,
        _image: &ImageId,
        claim_deadline: Option<UnixMillis>,
    ) -> Outcome {
        let s = &self.settings;
        // A platform claim without a fixed deadline would outlive the pool's accounting: refuse
        // before anything is sent.
        let Some(deadline) = claim_deadline else {
            return Outcome::Failed;
        };
        if deadline <= wall_now() || rfc3339(deadline).is_none() {
            return Outcome::Failed;
        }
        let claim = self.claim(worker, deadline);
        let made = create_or_adopt(&self.claims, &claim, &s.pool, worker, s.request_timeout).await;
        match made {
            Answer::Ok(found) => {
                // An adopted claim must carry the deadline the pool fixed, or the pool would
                // believe in a lease the platform ends at another time.
                if self
                    .platform
                    .deadline(&found)
                    .is_some_and(|d| d.0 / 1_000 != deadline.0 / 1_000)
                {
                    return Outcome::Unknown;
                }
            }
            Answer::Refused | Answer::NotFound | Answer::Gone => return Outcome::Failed,
            Answer::Conflict | Answer::Unknown => return Outcome::Unknown,
        }
        // Never past the claim's deadline: the platform ends the claim there, and an open watch
        // that says nothing would otherwise hold the wait to the full readiness bound.
        let until_deadline = Duration::from_millis(deadline.0.saturating_sub(wall_now().0));
        let ready_by = Instant::now() + s.ready_timeout.min(until_deadline);
        wait_ready(
            &self.claims,
            &worker_selector(&s.pool, worker),
            |claim| {
                // A claim past its fixed deadline is gone and will never serve (POOL-7).
                if self.is_live(claim, wall_now()) {
                    self.platform.readiness(claim)
                } else {
                    Readiness::Dead
                }
            },
            ready_by,
            s.poll_interval,
            s.request_timeout,
        )
        .await
    }

    async fn delete(&self, worker: WorkerId) -> Outcome {
        let s = &self.settings;
        match remove(&self.claims, &s.pool, worker, None, s.request_timeout).await {
            Removal::Refused => return Outcome::Failed,
            Removal::Absent | Removal::Deleting | Removal::Unknown => {}
        }
        let deadline = Instant::now() + s.delete_timeout;
        if confirm_absent(
            &self.claims,
            worker,
            deadline,
            s.poll_interval,
            s.request_timeout,
        )
        .await
        {
            Outcome::Done
        } else {
            Outcome::Unknown
        }
    }

    async fn list(&self) -> Result<BTreeSet<WorkerId>, Unavailable> {
        let s = &self.settings;
        let claims = list_all(&self.claims, &pool_selector(&s.pool), s.request_timeout).await?;
        let now = wall_now();
        Ok(claims
            .iter()
            // Past its deadline a claim is gone (POOL-7), even while the API still shows it.
            .filter(|claim| self.is_live(claim, now))
            .filter_map(labelled_worker)
            .collect())
    }
}
