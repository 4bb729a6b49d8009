//! Every setting Corral reads, with its default, parsed and checked once at start-up.
//!
//! The entry point is [`Settings::from_lookup`]: the shell passes a lookup (the process environment
//! in production, a table in tests), and gets back either settings whose every number is in range
//! and whose limits agree with each other, or one [`ConfigError`] that names the setting, the value
//! given and what was expected. [`SETTINGS`] lists every setting with its default, the requirement
//! it serves and its meaning; the README and `corral config check` are generated from it.
//!
//! Two groups are deliberately not parsed here:
//! - Egress policy values ([`EgressSettings`]) are kept as trimmed raw text and never fail start-up
//!   (EGR-5): `crate::egress` resolves them fail-closed, per dispatch, and shows the operator the
//!   difference between the configured and the effective scope.
//! - The field key ([`FieldKeySource`]) is kept as given (or as the path of the file that holds it,
//!   which the shell reads). Its value never appears in `Debug` output, in [`Settings::describe`]
//!   or in an error.
//!
//! Conventions: whitespace around a value is trimmed and an empty value means "unset" (the
//! default), except in `CORRAL_WORKER_PREPARE_LANGUAGES`, where set but empty means "none". Durations are whole seconds. Byte sizes are whole bytes, or a whole number with a
//! `B`, `KiB`, `MiB`, `GiB` (binary) or `KB`, `MB`, `GB` (decimal) suffix in any case, with or
//! without a space. Booleans are `true`/`false`, `1`/`0`, `yes`/`no` or `on`/`off`, in any case.
//! Failing start-up on a bad value is the fail-closed choice for everything except egress.

use std::fmt;

use crate::bounds::ExecutionBounds;
use crate::jail::Language;
use crate::pool::{PoolConfig, PoolMode};

mod describe;
mod error;
mod number;
mod reader;
mod specs;
mod table;
mod validate;

pub use error::ConfigError;
pub use specs::{PYTHON_MODULE_NAME_MAX_BYTES, PYTHON_PREIMPORT_DEFAULT, PYTHON_PREIMPORT_MAX};
pub use table::{SETTINGS, SettingDoc, setting_doc, setting_value};

use error::shown;
use number::MIB;
use reader::Reader;
use specs::*;

/// How the pool obtains workers, as configured by `CORRAL_POOL_MODE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolModeSetting {
    /// `controller` (the default): the controller creates and deletes workers itself.
    Controller,
    /// `platform_operator`: workers are claimed through the platform (POOL-7).
    PlatformOperator,
}

impl PoolModeSetting {
    /// The value as written in `CORRAL_POOL_MODE`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Controller => "controller",
            Self::PlatformOperator => "platform_operator",
        }
    }
}

/// Which registries the package broker fronts (`SANDBOX_PACKAGE_REGISTRIES`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PackageRegistries {
    /// Unset: the public Python and JavaScript registries.
    PublicDefaults,
    /// `{}`: no registry; no install is attempted and the error names the baked stack (PKG-7).
    Disabled,
    /// Any other value, kept as raw text for the broker to interpret.
    Configured(String),
}

/// The package broker's settings (PKG-3, PKG-7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageSettings {
    /// `SANDBOX_PACKAGE_BROKER_URL`: where workers reach the broker; `None` (the default) means the
    /// API on port 8000, which the shell derives from its own address.
    pub broker_url: Option<String>,
    /// `SANDBOX_PACKAGE_TOKEN_TTL_SECONDS` (default 300): lifetime of a broker token.
    pub token_ttl_seconds: u64,
    /// `SANDBOX_PACKAGE_MAX_INDEX_BYTES` (default 8 MiB): largest index page the broker relays.
    pub max_index_bytes: u64,
    /// `SANDBOX_PACKAGE_MAX_FILE_BYTES` (default 100 MB, decimal): largest file the broker relays.
    pub max_file_bytes: u64,
    /// `SANDBOX_PACKAGE_REGISTRIES`: the registries the broker fronts.
    pub registries: PackageRegistries,
}

/// The egress policy exactly as configured: trimmed raw text, `None` when unset or empty.
///
/// Nothing here is parsed and nothing here fails start-up (EGR-5): `crate::egress` resolves these
/// values per dispatch, fail-closed, and applies the defaults below to unset values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressSettings {
    /// `SANDBOX_EGRESS_ENABLED` (default `true`).
    pub enabled: Option<String>,
    /// `SANDBOX_EGRESS_MODE` (default `public_internet`).
    pub mode: Option<String>,
    /// `SANDBOX_EGRESS_ALLOWED_PORTS` (default `80,443`).
    pub allowed_ports: Option<String>,
    /// `SANDBOX_EGRESS_PRIVATE_CIDRS` (no default).
    pub private_cidrs: Option<String>,
    /// `SANDBOX_EGRESS_ALLOWED_HOSTS` (no default).
    pub allowed_hosts: Option<String>,
    /// `SANDBOX_EGRESS_PROXY_URL` (no default).
    pub proxy_url: Option<String>,
    /// `SANDBOX_EGRESS_DNS_SERVERS` (no default).
    pub dns_servers: Option<String>,
    /// `SANDBOX_EGRESS_TOKEN_TTL_SECONDS` (default 600).
    pub token_ttl_seconds: Option<String>,
}

impl EgressSettings {
    /// The specification's default for `SANDBOX_EGRESS_ENABLED` (ISO-4).
    pub const DEFAULT_ENABLED: bool = true;
    /// The specification's default for `SANDBOX_EGRESS_MODE` (ISO-4).
    pub const DEFAULT_MODE: &'static str = "public_internet";
    /// The specification's default for `SANDBOX_EGRESS_ALLOWED_PORTS` (EGR-1).
    pub const DEFAULT_ALLOWED_PORTS: &'static str = "80,443";
    /// The specification's default for `SANDBOX_EGRESS_TOKEN_TTL_SECONDS` (EGR-1, EGR-6).
    pub const DEFAULT_TOKEN_TTL_SECONDS: u64 = 600;
}

/// The deployment's field key. Its `Debug` output never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct FieldKey(String);

impl FieldKey {
    /// The key itself, for deriving signing keys; never log or display it.
    #[must_use]
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for FieldKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FieldKey(<redacted>)")
    }
}

/// Where the field key comes from (EGR-7). Unset means egress resolves to `isolated` (EGR-5, EGR-8);
/// `corral up` generates a key when none is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldKeySource {
    /// Neither `SANDBOX_FIELD_KEY` nor `SANDBOX_FIELD_KEY_FILE` is set.
    Unset,
    /// `SANDBOX_FIELD_KEY`: the key itself.
    Value(FieldKey),
    /// `SANDBOX_FIELD_KEY_FILE`: the path of a file the shell reads the key from.
    File(String),
}

/// The worker's two ports (BROW-7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerPorts {
    /// `CORRAL_WORKER_CONTROL_PORT` (default 8091): the authenticated control API.
    pub control_port: u16,
    /// `CORRAL_WORKER_BROWSER_PORT` (default 8080): the browser-media HTTP and signaling adapter.
    pub browser_port: u16,
}

impl WorkerPorts {
    /// The control API's port unless configured (BROW-7).
    pub const DEFAULT_CONTROL: u16 = 8091;
    /// The browser-media adapter's port unless configured (BROW-7).
    pub const DEFAULT_BROWSER: u16 = 8080;
}

/// What a warm worker prepares before any lease (ARCHITECTURE.md, "Running code").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrepareSettings {
    /// `CORRAL_WORKER_PREPARE_LANGUAGES` (default `python`): the languages a warm worker
    /// keeps one prepared jail each for, in the order given, without repeats. Unlike other
    /// settings, set but empty means none (unset is the default).
    pub languages: Vec<Language>,
    /// `CORRAL_WORKER_PYTHON_PREIMPORT` (default [`PYTHON_PREIMPORT_DEFAULT`]; set but blank:
    /// none): modules a prepared Python jail imports before it waits for the code, each a dotted
    /// name of ASCII identifiers, at most [`PYTHON_PREIMPORT_MAX`] of them, without repeats.
    pub python_preimport: Vec<String>,
    /// `CORRAL_WORKER_PREIMPORT_IDLE_SECONDS` (default 10; 0: never): how long a worker waits
    /// idle, its Python jail prepared without `python_preimport` (its last run used none of
    /// them), before it prepares that jail again with them (decision 0037).
    pub preimport_idle_seconds: u64,
}

/// How the worker builds its jails (ISO-1, POOL-4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JailSettings {
    /// `CORRAL_JAIL_ALLOW_WEAKER_ISOLATION` (default off): run code even when a waivable isolation
    /// primitive (user namespaces, seccomp, a cgroup controller) is missing. Off, a missing
    /// primitive refuses the run; the name says what turning it on accepts.
    pub allow_weaker_isolation: bool,
    /// `CORRAL_JAIL_CGROUP_ROOT` (default `/sys/fs/cgroup`): where the cgroup v1 `memory` and
    /// `pids` controllers are mounted.
    pub cgroup_root: String,
    /// `CORRAL_JAIL_PYTHON_STACK` (default `/opt/corral/python`): the baked Python stack's
    /// environment (PKG-1), built by `scripts/build-python-stack`. The jail binds it read-only at
    /// the same path and runs Python from it; without it, Python runs bare and says so.
    pub python_stack: String,
    /// `CORRAL_JAIL_PI_RUNTIME` (default `/opt/corral/pi`): the baked Pi runtime (PI-1), built by
    /// `scripts/build-pi-runtime`. The jail binds it read-only at the same path for package
    /// validation; without it, a validation fails closed with `pi_runtime_unavailable`.
    pub pi_runtime: String,
}

/// Every setting, parsed, in range, and with its limits agreeing with each other.
///
/// Build it with [`Settings::from_lookup`] (or [`Settings::default`] for the defaults). The fields
/// are public for reading; code that changes one must call [`Settings::validate`] again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `SANDBOX_WARM_POOL_MIN` (default 3): workers kept allocated even when idle.
    pub warm_pool_min: u32,
    /// `SANDBOX_POOL_TARGET_IDLE` (default 1): idle workers kept beside the leased ones.
    pub pool_target_idle: u32,
    /// `SANDBOX_POOL_MAX_ALLOCATED` (default 32): the hard ceiling over every state.
    pub pool_max_allocated: u32,
    /// `SANDBOX_MAX_CONCURRENT_CREATES` (default 3): creations in flight at once.
    pub max_concurrent_creates: u32,
    /// `SANDBOX_BURST_IDLE_TTL_SECONDS` (default 300): how long idle capacity above target lingers.
    pub burst_idle_ttl_seconds: u64,
    /// `SANDBOX_ACQUIRE_WAIT_SECONDS` (default 30): the longest a request waits for a worker.
    pub acquire_wait_seconds: u64,
    /// `SANDBOX_ACQUIRE_QUEUE_MAX` (default 256): the most requests waiting at once.
    pub acquire_queue_max: u32,
    /// `SANDBOX_MAX_CONCURRENT_PER_MEMBER` (default 2): leases one member holds at once.
    pub max_concurrent_per_member: u32,
    /// `SANDBOX_LEASE_HEARTBEAT_SECONDS` (default 60): how often a holder renews its lease.
    pub lease_heartbeat_seconds: u64,
    /// `SANDBOX_LEASE_TTL_SECONDS` (default 900): how long a lease lives without renewal.
    pub lease_ttl_seconds: u64,
    /// `CORRAL_CREATE_TIMEOUT_SECONDS` (default 120): a create not reported by then is ambiguous.
    pub create_timeout_seconds: u64,
    /// `CORRAL_RESET_TIMEOUT_SECONDS` (default 30): a reset not reported by then is unproven.
    pub reset_timeout_seconds: u64,
    /// `CORRAL_DELETE_RETRY_SECONDS` (default 10): how often an unconfirmed delete is ordered again.
    pub delete_retry_seconds: u64,
    /// `CORRAL_INVENTORY_STALE_SECONDS` (default 30): admission closes when inventory is older.
    pub inventory_stale_seconds: u64,
    /// `CORRAL_POOL_MODE` (default `controller`): how workers are obtained.
    pub pool_mode: PoolModeSetting,
    /// `CORRAL_CLAIM_LIFETIME_SECONDS` (default 3600): a platform claim's lifetime from creation;
    /// used only in `platform_operator` mode.
    pub claim_lifetime_seconds: u64,
    /// The bounds of one run (BOUND-1) and of its worker.
    pub bounds: ExecutionBounds,
    /// `SANDBOX_WORKSPACE_PERSIST` (default on): keep workspaces across runs (WS-2).
    pub workspace_persist: bool,
    /// The package broker's settings.
    pub packages: PackageSettings,
    /// `CORRAL_TOOL_ENDPOINT_URL`: the platform's tool endpoint (KER-5); `None`: no tool call is
    /// forwarded.
    pub tool_endpoint_url: Option<String>,
    /// `CORRAL_RESOURCE_AUTHORITY_URL`: the platform's resource authority (PROJ-1 to PROJ-8,
    /// OUT-1): `http(s)://…` for the documented JSON contract, `sqlite:///abs/path.db` for the
    /// embedded one; `None`: no document is ever projected and no output linked.
    pub resource_authority_url: Option<String>,
    /// `CORRAL_BROWSER_IDLE_SECONDS` (default 900): a browser session idle this long is reaped
    /// (BROW-6).
    pub browser_idle_seconds: u64,
    /// The live view's TURN authority and its shared secret (BROW-9).
    pub turn: TurnSettings,
    /// The egress policy as configured, unparsed.
    pub egress: EgressSettings,
    /// Where the field key comes from.
    pub field_key: FieldKeySource,
    /// The worker's ports.
    pub worker: WorkerPorts,
    /// What a warm worker prepares.
    pub prepare: PrepareSettings,
    /// How the worker builds its jails.
    pub jail: JailSettings,
    /// `CORRAL_SIM_MUTATION`, read only by builds with the `sim-mutations` feature (never the
    /// shipped binary, decision 0003): one pool rule broken on purpose (a
    /// [`crate::pool::Mutation`]'s name), so that the chaos suite can prove it notices.
    #[cfg(feature = "sim-mutations")]
    pub sim_mutation: Option<crate::pool::Mutation>,
}

/// The live view's TURN settings (BROW-9, ISO-5), kept as given: the URL is judged by
/// [`crate::browser::turn::TurnAuthority::parse`] when a session opens, so that a missing or
/// malformed one refuses the open with its own code rather than stopping the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnSettings {
    /// `CORRAL_TURN_URL`: the one TURN authority, `turn:HOST:PORT` (UDP and plain TCP).
    pub url: Option<String>,
    /// `CORRAL_TURN_SECRET_FILE`: the file holding the shared secret of the TURN REST scheme
    /// (coturn's `static-auth-secret`).
    pub secret_file: Option<String>,
    /// `CORRAL_TURN_CREDENTIAL_TTL_SECONDS` (default 3600): how long a minted credential lasts.
    pub credential_ttl_seconds: u64,
}

impl Default for Settings {
    /// The specification's defaults, and Corral's own where the specification names none.
    fn default() -> Self {
        Self {
            warm_pool_min: 3,
            pool_target_idle: 1,
            pool_max_allocated: 32,
            max_concurrent_creates: 3,
            burst_idle_ttl_seconds: 300,
            acquire_wait_seconds: 30,
            acquire_queue_max: 256,
            max_concurrent_per_member: 2,
            lease_heartbeat_seconds: 60,
            lease_ttl_seconds: 900,
            create_timeout_seconds: 120,
            reset_timeout_seconds: 30,
            delete_retry_seconds: 10,
            inventory_stale_seconds: 30,
            pool_mode: PoolModeSetting::Controller,
            claim_lifetime_seconds: HOUR_SECONDS,
            bounds: ExecutionBounds {
                max_wall_seconds: 30,
                max_output_bytes: MIB,
                max_artifact_bytes: 10 * MIB,
                workspace_max_bytes: 8 * MIB,
                hashline_state_max_bytes: 64 * MIB,
                dependency_install_timeout_seconds: 120,
                max_memory_bytes: 512 * MIB,
                max_processes: 64,
                tmp_max_bytes: 64 * MIB,
            },
            workspace_persist: true,
            packages: PackageSettings {
                broker_url: None,
                token_ttl_seconds: 300,
                max_index_bytes: 8 * MIB,
                max_file_bytes: 100_000_000,
                registries: PackageRegistries::PublicDefaults,
            },
            tool_endpoint_url: None,
            resource_authority_url: None,
            browser_idle_seconds: crate::browser::IDLE_SECONDS,
            turn: TurnSettings {
                url: None,
                secret_file: None,
                credential_ttl_seconds: crate::browser::turn::CREDENTIAL_TTL_SECONDS,
            },
            egress: EgressSettings::default(),
            field_key: FieldKeySource::Unset,
            worker: WorkerPorts {
                control_port: WorkerPorts::DEFAULT_CONTROL,
                browser_port: WorkerPorts::DEFAULT_BROWSER,
            },
            prepare: PrepareSettings {
                languages: vec![Language::Python],
                // The heavy part of the baked stack (PKG-1, decision 0015).
                python_preimport: PYTHON_PREIMPORT_DEFAULT
                    .iter()
                    .map(|m| (*m).to_owned())
                    .collect(),
                preimport_idle_seconds: 10,
            },
            jail: JailSettings {
                allow_weaker_isolation: false,
                cgroup_root: "/sys/fs/cgroup".to_owned(),
                python_stack: "/opt/corral/python".to_owned(),
                pi_runtime: "/opt/corral/pi".to_owned(),
            },
            #[cfg(feature = "sim-mutations")]
            sim_mutation: None,
        }
    }
}

/// The setting a `sim-mutations` build reads to break one pool rule on purpose (decision 0033):
/// not in [`SETTINGS`], since the shipped binary has no such setting.
#[cfg(feature = "sim-mutations")]
pub const SIM_MUTATION_SETTING: &str = "CORRAL_SIM_MUTATION";

impl Settings {
    /// The settings a controller hands the workers it creates where they do not share its
    /// environment (kube pods): the egress proxy it was configured with, and the operator's
    /// acceptance of a weaker jail when given (decision 0032). Never a credential: those come
    /// from files or Secrets.
    #[must_use]
    pub fn worker_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(url) = &self.egress.proxy_url {
            env.push((specs::EGRESS_PROXY_URL, url.clone()));
        }
        if self.jail.allow_weaker_isolation {
            env.push((specs::JAIL_ALLOW_WEAKER_ISOLATION, "true".to_owned()));
        }
        env
    }

    /// Parses every setting through `lookup` (the environment, in production) and checks the
    /// relations between them. Each setting is looked up exactly once.
    ///
    /// # Errors
    /// The first setting, in [`SETTINGS`] order, that is malformed or out of range, else the first
    /// relation between settings that does not hold. Egress values never cause an error.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        #[cfg(feature = "sim-mutations")]
        let sim_mutation = match lookup(SIM_MUTATION_SETTING) {
            None => None,
            Some(name) => Some(
                crate::pool::Mutation::ALL
                    .into_iter()
                    .find(|m| m.name() == name.trim())
                    .ok_or(ConfigError::InvalidChoice {
                        setting: SIM_MUTATION_SETTING,
                        value: name,
                        expected: "a corral-core pool mutation's name (corral-sim --help)",
                    })?,
            ),
        };
        let r = Reader { lookup };
        let d = Self::default();
        let settings = Self {
            warm_pool_min: r.number_u32(&WARM_POOL_MIN, d.warm_pool_min)?,
            pool_target_idle: r.number_u32(&POOL_TARGET_IDLE, d.pool_target_idle)?,
            pool_max_allocated: r.number_u32(&POOL_MAX_ALLOCATED, d.pool_max_allocated)?,
            max_concurrent_creates: r
                .number_u32(&MAX_CONCURRENT_CREATES, d.max_concurrent_creates)?,
            burst_idle_ttl_seconds: r.number(&BURST_IDLE_TTL, d.burst_idle_ttl_seconds)?,
            acquire_wait_seconds: r.number(&ACQUIRE_WAIT, d.acquire_wait_seconds)?,
            acquire_queue_max: r.number_u32(&ACQUIRE_QUEUE_MAX, d.acquire_queue_max)?,
            max_concurrent_per_member: r
                .number_u32(&MAX_CONCURRENT_PER_MEMBER, d.max_concurrent_per_member)?,
            lease_heartbeat_seconds: r.number(&LEASE_HEARTBEAT, d.lease_heartbeat_seconds)?,
            lease_ttl_seconds: r.number(&LEASE_TTL, d.lease_ttl_seconds)?,
            create_timeout_seconds: r.number(&CREATE_TIMEOUT, d.create_timeout_seconds)?,
            reset_timeout_seconds: r.number(&RESET_TIMEOUT, d.reset_timeout_seconds)?,
            delete_retry_seconds: r.number(&DELETE_RETRY, d.delete_retry_seconds)?,
            inventory_stale_seconds: r.number(&INVENTORY_STALE, d.inventory_stale_seconds)?,
            pool_mode: r.pool_mode()?,
            claim_lifetime_seconds: r.number(&CLAIM_LIFETIME, d.claim_lifetime_seconds)?,
            bounds: Self::read_bounds(&r, &d.bounds)?,
            workspace_persist: r.flag(WORKSPACE_PERSIST, d.workspace_persist)?,
            packages: Self::read_packages(&r, &d.packages)?,
            tool_endpoint_url: r.http_url(TOOL_ENDPOINT_URL)?,
            resource_authority_url: r.authority_url(RESOURCE_AUTHORITY_URL)?,
            browser_idle_seconds: r.number(&BROWSER_IDLE, d.browser_idle_seconds)?,
            turn: TurnSettings {
                url: r.raw(TURN_URL),
                secret_file: r.raw(TURN_SECRET_FILE),
                credential_ttl_seconds: r
                    .number(&TURN_CREDENTIAL_TTL, d.turn.credential_ttl_seconds)?,
            },
            egress: r.egress(),
            field_key: r.field_key()?,
            worker: WorkerPorts {
                control_port: r.number_u16(&WORKER_CONTROL_PORT, d.worker.control_port)?,
                browser_port: r.number_u16(&WORKER_BROWSER_PORT, d.worker.browser_port)?,
            },
            prepare: PrepareSettings {
                languages: r.prepare_languages(&d.prepare.languages)?,
                python_preimport: r.python_preimport(&d.prepare.python_preimport)?,
                preimport_idle_seconds: r
                    .number(&WORKER_PREIMPORT_IDLE, d.prepare.preimport_idle_seconds)?,
            },
            jail: JailSettings {
                allow_weaker_isolation: r
                    .flag(JAIL_ALLOW_WEAKER_ISOLATION, d.jail.allow_weaker_isolation)?,
                cgroup_root: r.path(JAIL_CGROUP_ROOT, &d.jail.cgroup_root)?,
                python_stack: r.path(JAIL_PYTHON_STACK, &d.jail.python_stack)?,
                pi_runtime: r.path(JAIL_PI_RUNTIME, &d.jail.pi_runtime)?,
            },
            #[cfg(feature = "sim-mutations")]
            sim_mutation,
        };
        settings.validate()?;
        Ok(settings)
    }

    fn read_bounds<F: Fn(&str) -> Option<String>>(
        r: &Reader<F>,
        d: &ExecutionBounds,
    ) -> Result<ExecutionBounds, ConfigError> {
        Ok(ExecutionBounds {
            max_wall_seconds: r.number(&MAX_WALL, d.max_wall_seconds)?,
            max_output_bytes: r.number(&MAX_OUTPUT, d.max_output_bytes)?,
            max_artifact_bytes: r.number(&MAX_ARTIFACT, d.max_artifact_bytes)?,
            workspace_max_bytes: r.number(&WORKSPACE_MAX, d.workspace_max_bytes)?,
            hashline_state_max_bytes: r.number(&HASHLINE_STATE_MAX, d.hashline_state_max_bytes)?,
            dependency_install_timeout_seconds: r.number(
                &DEPENDENCY_INSTALL_TIMEOUT,
                d.dependency_install_timeout_seconds,
            )?,
            max_memory_bytes: r.number(&MAX_MEMORY, d.max_memory_bytes)?,
            max_processes: r.number_u32(&MAX_PROCESSES, d.max_processes)?,
            tmp_max_bytes: r.number(&TMP_MAX, d.tmp_max_bytes)?,
        })
    }

    fn read_packages<F: Fn(&str) -> Option<String>>(
        r: &Reader<F>,
        d: &PackageSettings,
    ) -> Result<PackageSettings, ConfigError> {
        Ok(PackageSettings {
            broker_url: r.broker_url()?,
            token_ttl_seconds: r.number(&PACKAGE_TOKEN_TTL, d.token_ttl_seconds)?,
            max_index_bytes: r.number(&PACKAGE_MAX_INDEX, d.max_index_bytes)?,
            max_file_bytes: r.number(&PACKAGE_MAX_FILE, d.max_file_bytes)?,
            registries: r.registries(),
        })
    }

    /// Settings from `(name, value)` pairs, for tests; a later pair overrides an earlier one.
    ///
    /// # Errors
    /// [`ConfigError::UnknownSetting`] for a name Corral does not read (a typo would otherwise
    /// silently test the default), else whatever [`Settings::from_lookup`] reports.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Result<Self, ConfigError> {
        if let Some((name, _)) = pairs.iter().find(|(name, _)| setting_doc(name).is_none()) {
            return Err(ConfigError::UnknownSetting {
                setting: shown(name),
            });
        }
        Self::from_lookup(|wanted| {
            pairs
                .iter()
                .rev()
                .find(|(name, _)| *name == wanted)
                .map(|(_, value)| (*value).to_owned())
        })
    }

    /// The pool's limits and timeouts, in milliseconds.
    #[must_use]
    pub fn pool(&self) -> PoolConfig {
        PoolConfig {
            warm_min: self.warm_pool_min,
            target_idle: self.pool_target_idle,
            max_allocated: self.pool_max_allocated,
            max_concurrent_creates: self.max_concurrent_creates,
            burst_idle_ttl_ms: ms(self.burst_idle_ttl_seconds),
            acquire_wait_ms: ms(self.acquire_wait_seconds),
            acquire_queue_max: self.acquire_queue_max,
            max_per_member: self.max_concurrent_per_member,
            lease_heartbeat_ms: ms(self.lease_heartbeat_seconds),
            lease_ttl_ms: ms(self.lease_ttl_seconds),
            create_timeout_ms: ms(self.create_timeout_seconds),
            reset_timeout_ms: ms(self.reset_timeout_seconds),
            delete_retry_ms: ms(self.delete_retry_seconds),
            inventory_stale_ms: ms(self.inventory_stale_seconds),
            mode: match self.pool_mode {
                PoolModeSetting::Controller => PoolMode::Controller,
                PoolModeSetting::PlatformOperator => PoolMode::PlatformOperator {
                    claim_lifetime_ms: ms(self.claim_lifetime_seconds),
                },
            },
            stack_idle_ms: (self.prepare.preimport_idle_seconds > 0)
                .then(|| ms(self.prepare.preimport_idle_seconds)),
            #[cfg(feature = "sim-mutations")]
            mutation: self.sim_mutation,
        }
    }
}

/// Seconds to milliseconds; every range keeps this far from overflow, and it saturates anyway.
fn ms(seconds: u64) -> u64 {
    seconds.saturating_mul(1_000)
}

#[cfg(test)]
mod tests;
