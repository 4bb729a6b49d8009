//! The table of settings: each one's name, default, requirement and meaning, as documentation.

/// One setting as documentation: its name, default, the requirement it serves and its meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettingDoc {
    /// The environment variable, verbatim (a wire contract).
    pub name: &'static str,
    /// The default as an operator would write it; empty when the setting has no value by default.
    pub default: &'static str,
    /// The requirement it serves (`POOL-1`, `BOUND-1`, `EGR-1`, ...), or `corral` for Corral's own.
    pub requirement: &'static str,
    /// What it means, in one line.
    pub meaning: &'static str,
}

/// Every setting Corral reads, in the order [`Settings::describe`] lists them.
///
/// [`Settings::describe`]: super::Settings::describe
#[rustfmt::skip]
pub const SETTINGS: &[SettingDoc] = &[
    doc("SANDBOX_WARM_POOL_MIN", "3", "POOL-1", "Workers kept allocated even when idle."),
    doc("SANDBOX_POOL_TARGET_IDLE", "1", "POOL-1", "Idle workers kept beside the leased ones after a burst."),
    doc("SANDBOX_POOL_MAX_ALLOCATED", "32", "POOL-1", "Hard ceiling on workers allocated in any state."),
    doc("SANDBOX_MAX_CONCURRENT_CREATES", "3", "POOL-1", "Worker creations in flight at once."),
    doc("SANDBOX_BURST_IDLE_TTL_SECONDS", "300", "POOL-1", "How long idle capacity above the target lingers."),
    doc("SANDBOX_ACQUIRE_WAIT_SECONDS", "30", "POOL-1", "Longest a request waits for a worker before failing."),
    doc("SANDBOX_ACQUIRE_QUEUE_MAX", "256", "POOL-1", "Most requests waiting for a worker at once."),
    doc("SANDBOX_MAX_CONCURRENT_PER_MEMBER", "2", "POOL-1", "Leases one member holds at once (code and browser)."),
    doc("SANDBOX_LEASE_HEARTBEAT_SECONDS", "60", "POOL-6", "How often a lease holder renews its lease."),
    doc("SANDBOX_LEASE_TTL_SECONDS", "900", "POOL-6", "How long a lease lives without renewal."),
    doc("CORRAL_CREATE_TIMEOUT_SECONDS", "120", "POOL-10", "A create not reported by then is ambiguous."),
    doc("CORRAL_RESET_TIMEOUT_SECONDS", "30", "POOL-4", "A reset not reported by then is unproven."),
    doc("CORRAL_DELETE_RETRY_SECONDS", "10", "POOL-9", "How often an unconfirmed delete is ordered again."),
    doc("CORRAL_INVENTORY_STALE_SECONDS", "30", "POOL-11", "Admission closes when inventory is older than this."),
    doc("CORRAL_POOL_MODE", "controller", "POOL-7", "How workers are obtained: controller or platform_operator."),
    doc("CORRAL_CLAIM_LIFETIME_SECONDS", "3600", "POOL-7", "Lifetime of a platform claim from its creation (platform_operator)."),
    doc("SANDBOX_MAX_WALL_SECONDS", "30", "BOUND-1", "Wall-clock limit of one run."),
    doc("SANDBOX_MAX_OUTPUT_BYTES", "1 MiB", "BOUND-1", "Most stdout and stderr one run returns."),
    doc("SANDBOX_MAX_ARTIFACT_BYTES", "10 MiB", "BOUND-1", "Largest output file one run may return."),
    doc("SANDBOX_WORKSPACE_MAX_BYTES", "8 MiB", "BOUND-1", "Largest workspace snapshot."),
    doc("SANDBOX_HASHLINE_STATE_MAX_BYTES", "64 MiB", "BOUND-1", "Largest Hashline authority record."),
    doc("SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS", "120", "BOUND-1", "Longest a dependency install may take."),
    doc("SANDBOX_MAX_MEMORY_BYTES", "512 MiB", "corral", "Memory limit of a run's processes on the worker."),
    doc("SANDBOX_MAX_PROCESSES", "64", "corral", "Most processes a run may have at once."),
    doc("SANDBOX_TMP_MAX_BYTES", "64 MiB", "corral", "Size of a run's temporary directory."),
    doc("SANDBOX_WORKSPACE_PERSIST", "true", "WS-2", "Keep workspaces across runs in the object store."),
    doc("SANDBOX_PACKAGE_BROKER_URL", "", "PKG-3", "URL of the package broker (unset: the API on port 8000)."),
    doc("SANDBOX_PACKAGE_TOKEN_TTL_SECONDS", "300", "PKG-3", "Lifetime of a package broker token."),
    doc("SANDBOX_PACKAGE_MAX_INDEX_BYTES", "8 MiB", "PKG-3", "Largest registry index page the broker relays."),
    doc("SANDBOX_PACKAGE_MAX_FILE_BYTES", "100 MB", "PKG-3", "Largest package file the broker relays."),
    doc("SANDBOX_PACKAGE_REGISTRIES", "", "PKG-7", "Registries the broker fronts, {\"pypi\": URL, \"npm\": URL} (unset: this machine's pip and npm configuration; {}: none)."),
    doc("SANDBOX_EGRESS_ENABLED", "true", "ISO-4", "Egress through the proxy is on (enabled is not open)."),
    doc("SANDBOX_EGRESS_MODE", "public_internet", "EGR-1", "isolated, public_internet, private_network or host_allowlist."),
    doc("SANDBOX_EGRESS_ALLOWED_PORTS", "80,443", "EGR-1", "Destination ports egress may reach."),
    doc("SANDBOX_EGRESS_PRIVATE_CIDRS", "", "EGR-1", "Private ranges reachable in private_network mode."),
    doc("SANDBOX_EGRESS_ALLOWED_HOSTS", "", "EGR-1", "Exact hosts reachable in host_allowlist mode."),
    doc("SANDBOX_EGRESS_PROXY_URL", "", "EGR-5", "Address of the egress proxy (unset: egress resolves to isolated)."),
    doc("SANDBOX_EGRESS_DNS_SERVERS", "", "EGR-2", "Resolvers the egress proxy asks (unset: the system's)."),
    doc("SANDBOX_EGRESS_TOKEN_TTL_SECONDS", "600", "EGR-6", "Lifetime of an egress token (at most 4 hours)."),
    doc("SANDBOX_FIELD_KEY", "", "EGR-7", "The deployment's field key; egress signing keys derive from it."),
    doc("SANDBOX_FIELD_KEY_FILE", "", "EGR-7", "Path of a file holding the field key (instead of SANDBOX_FIELD_KEY)."),
    doc("CORRAL_WORKER_CONTROL_PORT", "8091", "BROW-7", "Port of the worker's authenticated control API."),
    doc("CORRAL_WORKER_BROWSER_PORT", "8080", "BROW-7", "Port of the worker's browser-media adapter."),
    doc("CORRAL_WORKER_PREPARE_LANGUAGES", "python", "corral", "Languages a warm worker keeps a jail prepared for (comma-separated, e.g. python,node; set but empty: none)."),
    doc("CORRAL_WORKER_PYTHON_PREIMPORT", "numpy,pandas,matplotlib", "PKG-1", "Modules a prepared Python jail imports before its run (comma-separated; a missing one is skipped; set but empty: none). A worker prepares such a jail after a run that imported one of them (or after an idle wait), and the pool hands a run that imports one to such a worker first (decision 0058)."),
    doc("CORRAL_WORKER_PREIMPORT_IDLE_SECONDS", "10", "PKG-1", "How long a worker waits idle, its Python jail prepared without the pre-imported modules, before it prepares it again with them (0: never)."),
    doc("CORRAL_JAIL_ALLOW_WEAKER_ISOLATION", "false", "POOL-4", "Run code even when a waivable isolation primitive is missing."),
    doc("CORRAL_JAIL_CGROUP_ROOT", "/sys/fs/cgroup", "corral", "Where the worker finds the cgroup v1 controllers for its runs."),
    doc("CORRAL_JAIL_PI_RUNTIME", "/opt/corral/pi", "PI-1", "The baked Pi runtime (scripts/build-pi-runtime); the jail binds it read-only for package validation, which fails closed without it."),
    doc("CORRAL_JAIL_PYTHON_STACK", "/opt/corral/python", "PKG-1", "The baked Python stack's environment (scripts/build-python-stack); the jail binds it read-only and runs Python from it."),
    doc("CORRAL_TOOL_ENDPOINT_URL", "", "KER-5", "The platform's read-only tool endpoint the API forwards code's tool calls to (unset: tools are refused; corral up: its built-in sample)."),
    doc("CORRAL_RESOURCE_AUTHORITY_URL", "", "PROJ-1", "The platform's resource authority: rooms, audiences, documents and links (http(s)://… for the JSON contract in docs/resource-authority.openapi.yaml, sqlite:///abs/path.db for the embedded one; unset: nothing is projected or linked; corral up: an embedded one in its state directory)."),
    doc("CORRAL_BROWSER_IDLE_SECONDS", "900", "BROW-6", "A browser session idle this long is closed and its worker reset and released."),
    doc("CORRAL_TURN_URL", "", "BROW-9", "The one TURN authority of the live view, turn:HOST:PORT, reached over UDP and plain TCP (unset: browser sessions are refused with turn_not_configured; corral up: a coturn it starts on loopback)."),
    doc("CORRAL_TURN_SECRET_FILE", "", "BROW-9", "Path of a file holding the TURN server's shared secret (coturn's static-auth-secret), at least 16 bytes."),
    doc("CORRAL_TURN_CREDENTIAL_TTL_SECONDS", "3600", "BROW-9", "How long a TURN credential minted for a session and its viewers lasts."),
];

const fn doc(
    name: &'static str,
    default: &'static str,
    requirement: &'static str,
    meaning: &'static str,
) -> SettingDoc {
    SettingDoc {
        name,
        default,
        requirement,
        meaning,
    }
}

/// A setting's value as given, read as every source of settings is read (the environment, the
/// administrator's egress policy): surrounding whitespace is not part of it, and a blank value is
/// an unset one.
#[must_use]
pub fn setting_value(raw: &str) -> Option<&str> {
    Some(raw.trim()).filter(|value| !value.is_empty())
}

/// The documentation of the setting called `name`, if Corral reads one by that name.
#[must_use]
pub fn setting_doc(name: &str) -> Option<&'static SettingDoc> {
    SETTINGS.iter().find(|doc| doc.name == name)
}
