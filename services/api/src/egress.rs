//! The egress policy at dispatch (EGR-4, EGR-5, EGR-8, EGR-9): read per run, resolved by
//! corral-core, a grant minted only when the resolved mode is enforceable here and now.
//!
//! The values are the administrator's (stored in Valkey with a revision, `corral_store::policy`)
//! or, until an administrator sets any, the deployment's settings (revision 0). Resolution is the
//! core's and fails closed: a value this release does not define, a missing field key or proxy
//! address, resolve to `isolated`. On top of that the API refuses a credential when the proxy
//! cannot enforce it (EGR-8): when it does not answer (`proxy_unreachable`), and when it holds no
//! verifying key for this API's grants (`proxy_key_unavailable`). Being enabled is not being
//! open. With no grant the worker's relay refuses every connection.
//!
//! The proxy is probed at most once a second with a grant of its own, for a target every policy
//! refuses (`CONNECT 0.0.0.0:1`): a proxy that verified the grant answers 403 for the target,
//! one without the key answers 407. So the probe proves what a run needs, not just a listening
//! socket.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use corral_core::config::EgressSettings as ConfiguredEgress;
use corral_core::egress::{
    EgressSettings, ExecutionId, GrantRequest, GrantSigner, Resolution, narrow_by_hint, resolve,
};
use corral_core::ids::ActorId;
use corral_core::time::UnixMillis;
use corral_store::ValkeyStore;
use corral_store::policy::StoredPolicy;
use serde_json::{Value, json};

/// How long the API waits for the proxy's answer to a probe before calling it unreachable.
const PROXY_PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// The largest probe answer head read.
const PROXY_PROBE_ANSWER_MAX_BYTES: usize = 4096;

/// What the last probe of the proxy found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyState {
    /// No `SANDBOX_EGRESS_PROXY_URL`.
    NotConfigured,
    /// It did not answer the probe.
    Unreachable,
    /// It answered, but holds no verifying key for this API's grants: it would refuse them all.
    NoVerifyingKey,
    /// It verified this API's grant.
    Ready,
}

impl ProxyState {
    /// How an administrator and `/readyz` see it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotConfigured => "not_configured",
            Self::Unreachable => "unreachable",
            Self::NoVerifyingKey => "no_verifying_key",
            Self::Ready => "reachable",
        }
    }

    /// The note a run's egress report carries when the proxy is why it has no grant.
    fn note(self) -> Option<&'static str> {
        match self {
            Self::NotConfigured | Self::Ready => None,
            Self::Unreachable => Some("proxy_unreachable"),
            Self::NoVerifyingKey => Some("proxy_key_unavailable"),
        }
    }
}

/// What a run got: its grant (a credential: never logged, never returned to a caller) and why.
#[derive(Clone, Default)]
pub struct RunEgress {
    /// The grant, when one was minted.
    pub grant: Option<String>,
    /// The report shown to the model and operators: configured and effective mode, notes.
    pub report: Value,
    /// The effective mode's name.
    pub effective_mode: &'static str,
}

impl RunEgress {
    /// A persistent cell's: no grant, whatever the policy (KER-5).
    #[must_use]
    pub fn persistent_kernel() -> Self {
        Self {
            grant: None,
            report: json!({
                "effective_mode": "isolated",
                "notes": [corral_core::kernel::EGRESS_NOTE],
            }),
            effective_mode: "isolated",
        }
    }
}

/// The deployment's egress side: its settings, its signer (from the field key) and its proxy.
pub struct Egress {
    configured: ConfiguredEgress,
    signer: Option<GrantSigner>,
    proxy: Option<SocketAddr>,
    key_problem: Option<String>,
    /// The last probe of the proxy and when it was made.
    probed: std::sync::Mutex<Option<(std::time::Instant, ProxyState)>>,
}

/// How long one probe of the proxy stands for.
const PROXY_PROBE_VALID: Duration = Duration::from_secs(1);

impl Egress {
    /// From the deployment's egress settings and field key bytes (none when no key is configured).
    pub fn new(configured: ConfiguredEgress, field_key: Option<&[u8]>) -> Self {
        let (signer, key_problem) = match field_key.map(GrantSigner::from_field_key) {
            Some(Ok(signer)) => (Some(signer), None),
            Some(Err(e)) => (None, Some(e.code().to_owned())),
            None => (None, None),
        };
        let proxy = configured.proxy_url.as_deref().and_then(proxy_address);
        Self {
            configured,
            signer,
            proxy,
            key_problem,
            probed: std::sync::Mutex::new(None),
        }
    }

    /// The verifying key's text, when there is a signer.
    pub fn verifying_key(&self) -> Option<String> {
        self.signer
            .as_ref()
            .map(|signer| signer.verifier().public_key_text())
    }

    /// What the proxy is now: probed at most once a second.
    pub async fn proxy_state(&self) -> ProxyState {
        let Some(address) = self.proxy else {
            return ProxyState::NotConfigured;
        };
        if let Ok(probed) = self.probed.lock()
            && let Some((at, state)) = *probed
            && at.elapsed() < PROXY_PROBE_VALID
        {
            return state;
        }
        let state = tokio::time::timeout(PROXY_PROBE_TIMEOUT, self.probe(address))
            .await
            .unwrap_or(ProxyState::Unreachable);
        if let Ok(mut probed) = self.probed.lock() {
            *probed = Some((std::time::Instant::now(), state));
        }
        state
    }

    /// Asks the proxy to judge a grant of this API's for a target every policy refuses.
    async fn probe(&self, address: SocketAddr) -> ProxyState {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
            return ProxyState::Unreachable;
        };
        let Some(signer) = &self.signer else {
            // Without a signer no run gets a grant; that it answers is all there is to know.
            return ProxyState::Ready;
        };
        let Ok(ports) = corral_core::egress::AllowedPorts::new([1]) else {
            return ProxyState::NoVerifyingKey;
        };
        let policy = corral_core::egress::Policy::PublicInternet { ports };
        let actor = ActorId(String::from("corral-api"));
        let request = GrantRequest {
            policy: &policy,
            provider_hint: None,
            run: "corral-proxy-probe",
            actor: &actor,
            execution_id: ExecutionId(corral_contract::credential::random_bytes()),
            policy_revision: 0,
            now: wall_clock(),
            ttl: corral_core::egress::TokenTtl::DEFAULT,
        };
        let Ok(minted) = signer.mint(&request) else {
            return ProxyState::NoVerifyingKey;
        };
        let head = format!(
            "CONNECT 0.0.0.0:1 HTTP/1.1\r\nHost: 0.0.0.0:1\r\nProxy-Authorization: Bearer {}\r\n\r\n",
            minted.token
        );
        if stream.write_all(head.as_bytes()).await.is_err() {
            return ProxyState::Unreachable;
        }
        let mut answer = vec![0u8; PROXY_PROBE_ANSWER_MAX_BYTES];
        let mut read = 0;
        while read < answer.len() && !answer[..read].windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut answer[read..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
        let head = String::from_utf8_lossy(&answer[..read]);
        match head.split_whitespace().nth(1) {
            // The grant verified; the target was refused, as every policy refuses it.
            Some("403") => ProxyState::Ready,
            // The grant did not verify: no key, or not this API's.
            Some("407") => ProxyState::NoVerifyingKey,
            _ => ProxyState::Unreachable,
        }
    }

    /// The values in force: the administrator's, else the deployment's.
    fn values(
        &self,
        stored: Option<&StoredPolicy>,
    ) -> (u64, BTreeMap<&'static str, Option<String>>) {
        let c = &self.configured;
        let mut values: BTreeMap<&'static str, Option<String>> = BTreeMap::from([
            ("SANDBOX_EGRESS_ENABLED", c.enabled.clone()),
            ("SANDBOX_EGRESS_MODE", c.mode.clone()),
            ("SANDBOX_EGRESS_ALLOWED_PORTS", c.allowed_ports.clone()),
            ("SANDBOX_EGRESS_PRIVATE_CIDRS", c.private_cidrs.clone()),
            ("SANDBOX_EGRESS_ALLOWED_HOSTS", c.allowed_hosts.clone()),
            (
                "SANDBOX_EGRESS_TOKEN_TTL_SECONDS",
                c.token_ttl_seconds.clone(),
            ),
        ]);
        let Some(stored) = stored else {
            return (0, values);
        };
        for (name, value) in &mut values {
            *value = stored
                .fields
                .get(*name)
                .and_then(|v| corral_core::config::setting_value(v))
                .map(str::to_owned);
        }
        (stored.revision, values)
    }

    /// Resolves the values in force, with what this deployment holds right now.
    fn resolve(
        &self,
        values: &BTreeMap<&'static str, Option<String>>,
        proxy: ProxyState,
    ) -> Resolution {
        let get = |name: &str| values.get(name).and_then(|v| v.as_deref());
        resolve(&EgressSettings {
            enabled: get("SANDBOX_EGRESS_ENABLED"),
            mode: get("SANDBOX_EGRESS_MODE"),
            allowed_ports: get("SANDBOX_EGRESS_ALLOWED_PORTS"),
            private_cidrs: get("SANDBOX_EGRESS_PRIVATE_CIDRS"),
            allowed_hosts: get("SANDBOX_EGRESS_ALLOWED_HOSTS"),
            token_ttl_seconds: get("SANDBOX_EGRESS_TOKEN_TTL_SECONDS"),
            proxy_address_present: proxy == ProxyState::Ready,
            field_key_present: self.signer.is_some(),
        })
    }

    /// The policy as an administrator sees it (EGR-5): the values, configured and effective mode,
    /// the notes, the revision, and the state of the key and the proxy.
    pub async fn describe(
        &self,
        store: &ValkeyStore,
    ) -> Result<Value, corral_core::store::Unavailable> {
        let stored = store.egress_policy().await?;
        let (revision, values) = self.values(stored.as_ref());
        let proxy = self.proxy_state().await;
        let resolution = self.resolve(&values, proxy);
        Ok(json!({
            "revision": revision,
            "source": if stored.is_some() { "admin" } else { "deployment_settings" },
            "values": values,
            "configured_mode": resolution.configured.display_text(),
            "effective_mode": resolution.effective_mode().as_str(),
            "notes": notes(&resolution, proxy),
            "field_key": if self.signer.is_some() { "present" } else { self.key_problem.as_deref().unwrap_or("missing") },
            "proxy": proxy.as_str(),
        }))
    }

    /// The egress of one run: the policy read now (EGR-9), resolved, narrowed by the provider hint
    /// (EGR-4), and a grant when the result is enforceable.
    pub async fn for_run(
        &self,
        store: &ValkeyStore,
        run: &str,
        actor: &ActorId,
        hint: Option<&[String]>,
        now: UnixMillis,
    ) -> RunEgress {
        let stored = match store.egress_policy().await {
            Ok(stored) => stored,
            Err(_) => {
                return RunEgress {
                    grant: None,
                    report: json!({ "effective_mode": "isolated", "notes": ["policy_unavailable"] }),
                    effective_mode: "isolated",
                };
            }
        };
        let (revision, values) = self.values(stored.as_ref());
        let proxy = self.proxy_state().await;
        let resolution = self.resolve(&values, proxy);
        let hint: Option<Vec<&str>> = hint.map(|h| h.iter().map(String::as_str).collect());
        let policy = narrow_by_hint(&resolution.policy, hint.as_deref());
        let mut notes = notes(&resolution, proxy);
        let grant = match &self.signer {
            Some(signer) if policy.mode().as_str() != "isolated" => {
                let request = GrantRequest {
                    policy: &policy,
                    provider_hint: None,
                    run,
                    actor,
                    execution_id: ExecutionId(corral_contract::credential::random_bytes()),
                    policy_revision: revision,
                    now,
                    ttl: resolution.token_ttl,
                };
                match signer.mint(&request) {
                    Ok(minted) => Some(minted.token),
                    Err(e) => {
                        notes.push(e.code());
                        None
                    }
                }
            }
            _ => None,
        };
        let effective_mode = if grant.is_some() {
            policy.mode().as_str()
        } else {
            "isolated"
        };
        RunEgress {
            report: json!({
                "configured_mode": resolution.configured.display_text(),
                "effective_mode": effective_mode,
                "policy_revision": revision,
                "notes": notes,
            }),
            grant,
            effective_mode,
        }
    }
}

fn notes(resolution: &Resolution, proxy: ProxyState) -> Vec<&'static str> {
    let mut notes: Vec<&'static str> = resolution.notes.iter().map(|n| n.code()).collect();
    notes.extend(proxy.note());
    notes
}

/// This host's wall clock, for the probe grant's issue time (the proxy checks it against its own).
fn wall_clock() -> UnixMillis {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    UnixMillis(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
}

/// `http://host:port` (an IP literal host) to its socket address.
fn proxy_address(url: &str) -> Option<SocketAddr> {
    let rest = url.strip_prefix("http://")?.trim_end_matches('/');
    rest.parse().ok().or_else(|| {
        use std::net::ToSocketAddrs as _;
        rest.to_socket_addrs().ok()?.next()
    })
}
