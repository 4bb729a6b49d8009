//! Every setting's effective value as an operator would write it, with secrets hidden.

use super::reader::redact_userinfo;
use super::specs::*;
use super::table::SETTINGS;
use super::{FieldKeySource, PackageRegistries, Settings};

impl Settings {
    /// Every setting's name and effective value, in [`SETTINGS`] order, as an operator would write
    /// it. The field key shows only as `<set>` or `<unset>`, and credentials in URLs as
    /// `<redacted>`; an unset value without a default shows as `<unset>`.
    #[must_use]
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = Vec::with_capacity(SETTINGS.len());
        let numbers = self.numbers();
        let number = |name: &'static str| -> String {
            numbers
                .iter()
                .find(|(spec, _)| spec.name == name)
                .map_or_else(unset, |(_, value)| value.to_string())
        };
        for name in [
            WARM_POOL_MIN.name,
            POOL_TARGET_IDLE.name,
            POOL_MAX_ALLOCATED.name,
            MAX_CONCURRENT_CREATES.name,
            BURST_IDLE_TTL.name,
            ACQUIRE_WAIT.name,
            ACQUIRE_QUEUE_MAX.name,
            MAX_CONCURRENT_PER_MEMBER.name,
            LEASE_HEARTBEAT.name,
            LEASE_TTL.name,
            CREATE_TIMEOUT.name,
            RESET_TIMEOUT.name,
            DELETE_RETRY.name,
            INVENTORY_STALE.name,
        ] {
            out.push((name, number(name)));
        }
        out.push((POOL_MODE, self.pool_mode.as_str().to_owned()));
        for name in [
            CLAIM_LIFETIME.name,
            MAX_WALL.name,
            MAX_OUTPUT.name,
            MAX_ARTIFACT.name,
            WORKSPACE_MAX.name,
            HASHLINE_STATE_MAX.name,
            DEPENDENCY_INSTALL_TIMEOUT.name,
            MAX_MEMORY.name,
            MAX_PROCESSES.name,
            TMP_MAX.name,
        ] {
            out.push((name, number(name)));
        }
        out.push((WORKSPACE_PERSIST, self.workspace_persist.to_string()));
        out.push((
            PACKAGE_BROKER_URL,
            optional(self.packages.broker_url.as_deref().map(redact_userinfo)),
        ));
        for name in [
            PACKAGE_TOKEN_TTL.name,
            PACKAGE_MAX_INDEX.name,
            PACKAGE_MAX_FILE.name,
        ] {
            out.push((name, number(name)));
        }
        out.push((
            PACKAGE_REGISTRIES,
            match &self.packages.registries {
                PackageRegistries::PublicDefaults => unset(),
                PackageRegistries::Disabled => "{}".to_owned(),
                PackageRegistries::Configured(text) => text.clone(),
            },
        ));
        self.describe_egress(&mut out);
        let (key, key_file) = match &self.field_key {
            FieldKeySource::Unset => ("<unset>", unset()),
            FieldKeySource::Value(_) => ("<set>", unset()),
            FieldKeySource::File(path) => ("<unset>", path.clone()),
        };
        out.push((FIELD_KEY, key.to_owned()));
        out.push((FIELD_KEY_FILE, key_file));
        for name in [WORKER_CONTROL_PORT.name, WORKER_BROWSER_PORT.name] {
            out.push((name, number(name)));
        }
        let languages: Vec<&str> = self.prepare.languages.iter().map(|l| l.as_str()).collect();
        out.push((WORKER_PREPARE_LANGUAGES, languages.join(",")));
        out.push((
            WORKER_PYTHON_PREIMPORT,
            if self.prepare.python_preimport.is_empty() {
                unset()
            } else {
                self.prepare.python_preimport.join(",")
            },
        ));
        out.push((
            WORKER_PREIMPORT_IDLE.name,
            number(WORKER_PREIMPORT_IDLE.name),
        ));
        out.push((
            JAIL_ALLOW_WEAKER_ISOLATION,
            self.jail.allow_weaker_isolation.to_string(),
        ));
        out.push((JAIL_CGROUP_ROOT, self.jail.cgroup_root.clone()));
        out.push((JAIL_PI_RUNTIME, self.jail.pi_runtime.clone()));
        out.push((JAIL_PYTHON_STACK, self.jail.python_stack.clone()));
        out.push((
            TOOL_ENDPOINT_URL,
            optional(self.tool_endpoint_url.as_deref().map(redact_userinfo)),
        ));
        out.push((
            RESOURCE_AUTHORITY_URL,
            optional(self.resource_authority_url.as_deref().map(redact_userinfo)),
        ));
        out.push((BROWSER_IDLE.name, self.browser_idle_seconds.to_string()));
        out.push((TURN_URL, optional(self.turn.url.clone())));
        out.push((TURN_SECRET_FILE, optional(self.turn.secret_file.clone())));
        out.push((
            TURN_CREDENTIAL_TTL.name,
            self.turn.credential_ttl_seconds.to_string(),
        ));
        out
    }

    fn describe_egress(&self, out: &mut Vec<(&'static str, String)>) {
        let e = &self.egress;
        let raw = |value: &Option<String>| optional(value.clone());
        out.push((EGRESS_ENABLED, raw(&e.enabled)));
        out.push((EGRESS_MODE, raw(&e.mode)));
        out.push((EGRESS_ALLOWED_PORTS, raw(&e.allowed_ports)));
        out.push((EGRESS_PRIVATE_CIDRS, raw(&e.private_cidrs)));
        out.push((EGRESS_ALLOWED_HOSTS, raw(&e.allowed_hosts)));
        out.push((
            EGRESS_PROXY_URL,
            optional(e.proxy_url.as_deref().map(redact_userinfo)),
        ));
        out.push((EGRESS_DNS_SERVERS, raw(&e.dns_servers)));
        out.push((EGRESS_TOKEN_TTL, raw(&e.token_ttl_seconds)));
    }
}

fn unset() -> String {
    "<unset>".to_owned()
}

fn optional(value: Option<String>) -> String {
    value.unwrap_or_else(unset)
}
