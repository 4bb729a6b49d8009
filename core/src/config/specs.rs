//! The name of every setting Corral reads, and the limits its value must keep.

use super::number::{GIB, MIB, Number, TIB, bytes, count, port, seconds};

pub(super) const HOUR_SECONDS: u64 = 3_600;
const DAY_SECONDS: u64 = 86_400;

pub(super) const WARM_POOL_MIN: Number = count("SANDBOX_WARM_POOL_MIN", 0, 100_000);
pub(super) const POOL_TARGET_IDLE: Number = count("SANDBOX_POOL_TARGET_IDLE", 0, 100_000);
pub(super) const POOL_MAX_ALLOCATED: Number = count("SANDBOX_POOL_MAX_ALLOCATED", 1, 100_000);
pub(super) const MAX_CONCURRENT_CREATES: Number =
    count("SANDBOX_MAX_CONCURRENT_CREATES", 1, 10_000);
pub(super) const BURST_IDLE_TTL: Number =
    seconds("SANDBOX_BURST_IDLE_TTL_SECONDS", 0, 7 * DAY_SECONDS);
pub(super) const ACQUIRE_WAIT: Number = seconds("SANDBOX_ACQUIRE_WAIT_SECONDS", 1, HOUR_SECONDS);
pub(super) const ACQUIRE_QUEUE_MAX: Number = count("SANDBOX_ACQUIRE_QUEUE_MAX", 1, 1_000_000);
pub(super) const MAX_CONCURRENT_PER_MEMBER: Number =
    count("SANDBOX_MAX_CONCURRENT_PER_MEMBER", 1, 100_000);
pub(super) const LEASE_HEARTBEAT: Number =
    seconds("SANDBOX_LEASE_HEARTBEAT_SECONDS", 1, DAY_SECONDS);
pub(super) const LEASE_TTL: Number = seconds("SANDBOX_LEASE_TTL_SECONDS", 1, 7 * DAY_SECONDS);
pub(super) const CREATE_TIMEOUT: Number = seconds("CORRAL_CREATE_TIMEOUT_SECONDS", 1, DAY_SECONDS);
pub(super) const RESET_TIMEOUT: Number = seconds("CORRAL_RESET_TIMEOUT_SECONDS", 1, DAY_SECONDS);
pub(super) const DELETE_RETRY: Number = seconds("CORRAL_DELETE_RETRY_SECONDS", 1, DAY_SECONDS);
pub(super) const INVENTORY_STALE: Number =
    seconds("CORRAL_INVENTORY_STALE_SECONDS", 1, DAY_SECONDS);
pub(super) const BROWSER_IDLE: Number = seconds("CORRAL_BROWSER_IDLE_SECONDS", 1, DAY_SECONDS);
pub(super) const TURN_CREDENTIAL_TTL: Number =
    seconds("CORRAL_TURN_CREDENTIAL_TTL_SECONDS", 60, DAY_SECONDS);
pub(super) const CLAIM_LIFETIME: Number =
    seconds("CORRAL_CLAIM_LIFETIME_SECONDS", 1, 30 * DAY_SECONDS);
pub(super) const MAX_WALL: Number = seconds("SANDBOX_MAX_WALL_SECONDS", 1, DAY_SECONDS);
pub(super) const MAX_OUTPUT: Number = bytes("SANDBOX_MAX_OUTPUT_BYTES", 1, GIB);
pub(super) const MAX_ARTIFACT: Number = bytes("SANDBOX_MAX_ARTIFACT_BYTES", 1, 64 * GIB);
pub(super) const WORKSPACE_MAX: Number = bytes("SANDBOX_WORKSPACE_MAX_BYTES", 1, 64 * GIB);
pub(super) const HASHLINE_STATE_MAX: Number =
    bytes("SANDBOX_HASHLINE_STATE_MAX_BYTES", 1, 16 * GIB);
pub(super) const DEPENDENCY_INSTALL_TIMEOUT: Number =
    seconds("SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS", 1, DAY_SECONDS);
pub(super) const MAX_MEMORY: Number = bytes("SANDBOX_MAX_MEMORY_BYTES", 16 * MIB, TIB);
pub(super) const MAX_PROCESSES: Number = count("SANDBOX_MAX_PROCESSES", 1, 1_000_000);
pub(super) const TMP_MAX: Number = bytes("SANDBOX_TMP_MAX_BYTES", MIB, TIB);
pub(super) const PACKAGE_TOKEN_TTL: Number =
    seconds("SANDBOX_PACKAGE_TOKEN_TTL_SECONDS", 1, DAY_SECONDS);
pub(super) const PACKAGE_MAX_INDEX: Number = bytes("SANDBOX_PACKAGE_MAX_INDEX_BYTES", 1, GIB);
pub(super) const PACKAGE_MAX_FILE: Number = bytes("SANDBOX_PACKAGE_MAX_FILE_BYTES", 1, 64 * GIB);
pub(super) const WORKER_CONTROL_PORT: Number = port("CORRAL_WORKER_CONTROL_PORT");
pub(super) const WORKER_BROWSER_PORT: Number = port("CORRAL_WORKER_BROWSER_PORT");

pub(super) const WORKSPACE_PERSIST: &str = "SANDBOX_WORKSPACE_PERSIST";
pub(super) const POOL_MODE: &str = "CORRAL_POOL_MODE";
pub(super) const PACKAGE_BROKER_URL: &str = "SANDBOX_PACKAGE_BROKER_URL";
pub(super) const TOOL_ENDPOINT_URL: &str = "CORRAL_TOOL_ENDPOINT_URL";
pub(super) const RESOURCE_AUTHORITY_URL: &str = "CORRAL_RESOURCE_AUTHORITY_URL";
pub(super) const TURN_URL: &str = "CORRAL_TURN_URL";
pub(super) const TURN_SECRET_FILE: &str = "CORRAL_TURN_SECRET_FILE";
pub(super) const PACKAGE_REGISTRIES: &str = "SANDBOX_PACKAGE_REGISTRIES";
pub(super) const EGRESS_ENABLED: &str = "SANDBOX_EGRESS_ENABLED";
pub(super) const EGRESS_MODE: &str = "SANDBOX_EGRESS_MODE";
pub(super) const EGRESS_ALLOWED_PORTS: &str = "SANDBOX_EGRESS_ALLOWED_PORTS";
pub(super) const EGRESS_PRIVATE_CIDRS: &str = "SANDBOX_EGRESS_PRIVATE_CIDRS";
pub(super) const EGRESS_ALLOWED_HOSTS: &str = "SANDBOX_EGRESS_ALLOWED_HOSTS";
pub(super) const EGRESS_PROXY_URL: &str = "SANDBOX_EGRESS_PROXY_URL";
pub(super) const EGRESS_DNS_SERVERS: &str = "SANDBOX_EGRESS_DNS_SERVERS";
pub(super) const EGRESS_TOKEN_TTL: &str = "SANDBOX_EGRESS_TOKEN_TTL_SECONDS";
pub(super) const FIELD_KEY: &str = "SANDBOX_FIELD_KEY";
pub(super) const FIELD_KEY_FILE: &str = "SANDBOX_FIELD_KEY_FILE";
pub(super) const WORKER_PREPARE_LANGUAGES: &str = "CORRAL_WORKER_PREPARE_LANGUAGES";
pub(super) const WORKER_PYTHON_PREIMPORT: &str = "CORRAL_WORKER_PYTHON_PREIMPORT";
pub(super) const WORKER_PREIMPORT_IDLE: Number =
    seconds("CORRAL_WORKER_PREIMPORT_IDLE_SECONDS", 0, DAY_SECONDS);
pub(super) const JAIL_ALLOW_WEAKER_ISOLATION: &str = "CORRAL_JAIL_ALLOW_WEAKER_ISOLATION";
pub(super) const JAIL_CGROUP_ROOT: &str = "CORRAL_JAIL_CGROUP_ROOT";
pub(super) const JAIL_PYTHON_STACK: &str = "CORRAL_JAIL_PYTHON_STACK";
pub(super) const JAIL_PI_RUNTIME: &str = "CORRAL_JAIL_PI_RUNTIME";
/// The longest path a path setting accepts, in bytes (Linux's `PATH_MAX`).
pub(super) const PATH_MAX_BYTES: usize = 4_096;
/// The most modules `CORRAL_WORKER_PYTHON_PREIMPORT` may name: each costs every preparation.
pub const PYTHON_PREIMPORT_MAX: usize = 64;
/// What a prepared Python jail imports when `CORRAL_WORKER_PYTHON_PREIMPORT` is unset: the heavy
/// part of the baked stack (PKG-1), so that importing it in a run costs next to nothing.
pub const PYTHON_PREIMPORT_DEFAULT: &[&str] = &["numpy", "pandas", "matplotlib"];
/// The longest module name `CORRAL_WORKER_PYTHON_PREIMPORT` accepts, in bytes.
pub const PYTHON_MODULE_NAME_MAX_BYTES: usize = 256;
