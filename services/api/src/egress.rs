//! The egress policy at dispatch (EGR-4, EGR-5, EGR-8, EGR-9): read per run, resolved by
//! corral-core, a grant minted only when the resolved mode is enforceable here and now.
//!
//! The values are the administrator's (stored in Valkey with a revision, `corral_store::policy`)
//! or, until an administrator sets any, the deployment's settings (revision 0). Resolution is the
//! core's and fails closed: a value this release does not define, a missing field key or proxy
//! address, resolve to `isolated`. On top of that the API refuses a credential when the proxy
//! does not answer (`proxy_unreachable`): being enabled is not being open (EGR-8). With no grant
//! the worker's relay refuses every connection.

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

/// How long the API waits for the proxy to accept a connection before calling it unreachable.
const PROXY_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

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

/// The deployment's egress side: its settings, its signer (from the field key) and its proxy.
pub struct Egress {
    configured: ConfiguredEgress,
    signer: Option<GrantSigner>,
    proxy: Option<SocketAddr>,
    key_problem: Option<String>,
    /// The last probe of the proxy and when it was made.
    probed: std::sync::Mutex<Option<(std::time::Instant, bool)>>,
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

    /// Whether the proxy accepted a connection within the last second (probed again when older).
    pub async fn proxy_reachable(&self) -> bool {
        let Some(address) = self.proxy else {
            return false;
        };
        if let Ok(probed) = self.probed.lock()
            && let Some((at, reachable)) = *probed
            && at.elapsed() < PROXY_PROBE_VALID
        {
            return reachable;
        }
        let reachable = matches!(
            tokio::time::timeout(PROXY_PROBE_TIMEOUT, tokio::net::TcpStream::connect(address))
                .await,
            Ok(Ok(_))
        );
        if let Ok(mut probed) = self.probed.lock() {
            *probed = Some((std::time::Instant::now(), reachable));
        }
        reachable
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
            *value = stored.fields.get(*name).cloned();
        }
        (stored.revision, values)
    }

    /// Resolves the values in force, with what this deployment holds right now.
    fn resolve(
        &self,
        values: &BTreeMap<&'static str, Option<String>>,
        proxy_reachable: bool,
    ) -> Resolution {
        let get = |name: &str| values.get(name).and_then(|v| v.as_deref());
        resolve(&EgressSettings {
            enabled: get("SANDBOX_EGRESS_ENABLED"),
            mode: get("SANDBOX_EGRESS_MODE"),
            allowed_ports: get("SANDBOX_EGRESS_ALLOWED_PORTS"),
            private_cidrs: get("SANDBOX_EGRESS_PRIVATE_CIDRS"),
            allowed_hosts: get("SANDBOX_EGRESS_ALLOWED_HOSTS"),
            token_ttl_seconds: get("SANDBOX_EGRESS_TOKEN_TTL_SECONDS"),
            proxy_address_present: self.proxy.is_some() && proxy_reachable,
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
        let reachable = self.proxy_reachable().await;
        let resolution = self.resolve(&values, reachable);
        Ok(json!({
            "revision": revision,
            "source": if stored.is_some() { "admin" } else { "deployment_settings" },
            "values": values,
            "configured_mode": resolution.configured.display_text(),
            "effective_mode": resolution.effective_mode().as_str(),
            "notes": notes(&resolution, self.proxy.is_some() && !reachable),
            "field_key": if self.signer.is_some() { "present" } else { self.key_problem.as_deref().unwrap_or("missing") },
            "proxy": match (self.proxy, reachable) {
                (None, _) => "not_configured",
                (Some(_), true) => "reachable",
                (Some(_), false) => "unreachable",
            },
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
        let reachable = self.proxy_reachable().await;
        let resolution = self.resolve(&values, reachable);
        let hint: Option<Vec<&str>> = hint.map(|h| h.iter().map(String::as_str).collect());
        let policy = narrow_by_hint(&resolution.policy, hint.as_deref());
        let mut notes = notes(&resolution, self.proxy.is_some() && !reachable);
        let grant = match &self.signer {
            Some(signer) if policy.mode().as_str() != "isolated" => {
                let request = GrantRequest {
                    policy: &policy,
                    provider_hint: None,
                    run,
                    actor,
                    execution_id: ExecutionId(random_bytes()),
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

fn notes(resolution: &Resolution, proxy_unreachable: bool) -> Vec<&'static str> {
    let mut notes: Vec<&'static str> = resolution.notes.iter().map(|n| n.code()).collect();
    if proxy_unreachable {
        notes.push("proxy_unreachable");
    }
    notes
}

/// `http://host:port` (an IP literal host) to its socket address.
fn proxy_address(url: &str) -> Option<SocketAddr> {
    let rest = url.strip_prefix("http://")?.trim_end_matches('/');
    rest.parse().ok().or_else(|| {
        use std::net::ToSocketAddrs as _;
        rest.to_socket_addrs().ok()?.next()
    })
}

/// 16 bytes from the system's randomness.
pub fn random_bytes() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No randomness means no unique ids: never fall back to something guessable silently.
        panic!("the system has no randomness");
    }
    bytes
}
