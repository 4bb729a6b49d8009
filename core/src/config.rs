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

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// The longest part of a rejected value an error repeats, in characters.
const SHOWN_VALUE_MAX_CHARS: usize = 80;

// ---------------------------------------------------------------------------------------------
// The table of settings.

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
    doc("SANDBOX_PACKAGE_REGISTRIES", "", "PKG-7", "Registries the broker fronts (unset: the public ones; {}: none)."),
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
    doc("CORRAL_WORKER_PYTHON_PREIMPORT", "", "corral", "Modules a prepared Python jail imports before its run (comma-separated; a missing one is skipped)."),
    doc("CORRAL_JAIL_ALLOW_WEAKER_ISOLATION", "false", "POOL-4", "Run code even when a waivable isolation primitive is missing."),
    doc("CORRAL_JAIL_CGROUP_ROOT", "/sys/fs/cgroup", "corral", "Where the worker finds the cgroup v1 controllers for its runs."),
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

// ---------------------------------------------------------------------------------------------
// The numeric settings and their legal ranges.

/// What a number counts, which decides how it is parsed and how its range is described.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Count,
    Seconds,
    Bytes,
    Port,
}

/// A numeric setting: its name and the inclusive range an accepted value lies in.
#[derive(Clone, Copy, Debug)]
struct Number {
    name: &'static str,
    unit: Unit,
    min: u64,
    max: u64,
}

const fn count(name: &'static str, min: u64, max: u64) -> Number {
    Number {
        name,
        unit: Unit::Count,
        min,
        max,
    }
}

const fn seconds(name: &'static str, min: u64, max: u64) -> Number {
    Number {
        name,
        unit: Unit::Seconds,
        min,
        max,
    }
}

const fn bytes(name: &'static str, min: u64, max: u64) -> Number {
    Number {
        name,
        unit: Unit::Bytes,
        min,
        max,
    }
}

const fn port(name: &'static str) -> Number {
    Number {
        name,
        unit: Unit::Port,
        min: 1,
        max: 65_535,
    }
}

const HOUR_SECONDS: u64 = 3_600;
const DAY_SECONDS: u64 = 86_400;

const WARM_POOL_MIN: Number = count("SANDBOX_WARM_POOL_MIN", 0, 100_000);
const POOL_TARGET_IDLE: Number = count("SANDBOX_POOL_TARGET_IDLE", 0, 100_000);
const POOL_MAX_ALLOCATED: Number = count("SANDBOX_POOL_MAX_ALLOCATED", 1, 100_000);
const MAX_CONCURRENT_CREATES: Number = count("SANDBOX_MAX_CONCURRENT_CREATES", 1, 10_000);
const BURST_IDLE_TTL: Number = seconds("SANDBOX_BURST_IDLE_TTL_SECONDS", 0, 7 * DAY_SECONDS);
const ACQUIRE_WAIT: Number = seconds("SANDBOX_ACQUIRE_WAIT_SECONDS", 1, HOUR_SECONDS);
const ACQUIRE_QUEUE_MAX: Number = count("SANDBOX_ACQUIRE_QUEUE_MAX", 1, 1_000_000);
const MAX_CONCURRENT_PER_MEMBER: Number = count("SANDBOX_MAX_CONCURRENT_PER_MEMBER", 1, 100_000);
const LEASE_HEARTBEAT: Number = seconds("SANDBOX_LEASE_HEARTBEAT_SECONDS", 1, DAY_SECONDS);
const LEASE_TTL: Number = seconds("SANDBOX_LEASE_TTL_SECONDS", 1, 7 * DAY_SECONDS);
const CREATE_TIMEOUT: Number = seconds("CORRAL_CREATE_TIMEOUT_SECONDS", 1, DAY_SECONDS);
const RESET_TIMEOUT: Number = seconds("CORRAL_RESET_TIMEOUT_SECONDS", 1, DAY_SECONDS);
const DELETE_RETRY: Number = seconds("CORRAL_DELETE_RETRY_SECONDS", 1, DAY_SECONDS);
const INVENTORY_STALE: Number = seconds("CORRAL_INVENTORY_STALE_SECONDS", 1, DAY_SECONDS);
const CLAIM_LIFETIME: Number = seconds("CORRAL_CLAIM_LIFETIME_SECONDS", 1, 30 * DAY_SECONDS);
const MAX_WALL: Number = seconds("SANDBOX_MAX_WALL_SECONDS", 1, DAY_SECONDS);
const MAX_OUTPUT: Number = bytes("SANDBOX_MAX_OUTPUT_BYTES", 1, GIB);
const MAX_ARTIFACT: Number = bytes("SANDBOX_MAX_ARTIFACT_BYTES", 1, 64 * GIB);
const WORKSPACE_MAX: Number = bytes("SANDBOX_WORKSPACE_MAX_BYTES", 1, 64 * GIB);
const HASHLINE_STATE_MAX: Number = bytes("SANDBOX_HASHLINE_STATE_MAX_BYTES", 1, 16 * GIB);
const DEPENDENCY_INSTALL_TIMEOUT: Number =
    seconds("SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS", 1, DAY_SECONDS);
const MAX_MEMORY: Number = bytes("SANDBOX_MAX_MEMORY_BYTES", 16 * MIB, TIB);
const MAX_PROCESSES: Number = count("SANDBOX_MAX_PROCESSES", 1, 1_000_000);
const TMP_MAX: Number = bytes("SANDBOX_TMP_MAX_BYTES", MIB, TIB);
const PACKAGE_TOKEN_TTL: Number = seconds("SANDBOX_PACKAGE_TOKEN_TTL_SECONDS", 1, DAY_SECONDS);
const PACKAGE_MAX_INDEX: Number = bytes("SANDBOX_PACKAGE_MAX_INDEX_BYTES", 1, GIB);
const PACKAGE_MAX_FILE: Number = bytes("SANDBOX_PACKAGE_MAX_FILE_BYTES", 1, 64 * GIB);
const WORKER_CONTROL_PORT: Number = port("CORRAL_WORKER_CONTROL_PORT");
const WORKER_BROWSER_PORT: Number = port("CORRAL_WORKER_BROWSER_PORT");

const WORKSPACE_PERSIST: &str = "SANDBOX_WORKSPACE_PERSIST";
const POOL_MODE: &str = "CORRAL_POOL_MODE";
const PACKAGE_BROKER_URL: &str = "SANDBOX_PACKAGE_BROKER_URL";
const PACKAGE_REGISTRIES: &str = "SANDBOX_PACKAGE_REGISTRIES";
const EGRESS_ENABLED: &str = "SANDBOX_EGRESS_ENABLED";
const EGRESS_MODE: &str = "SANDBOX_EGRESS_MODE";
const EGRESS_ALLOWED_PORTS: &str = "SANDBOX_EGRESS_ALLOWED_PORTS";
const EGRESS_PRIVATE_CIDRS: &str = "SANDBOX_EGRESS_PRIVATE_CIDRS";
const EGRESS_ALLOWED_HOSTS: &str = "SANDBOX_EGRESS_ALLOWED_HOSTS";
const EGRESS_PROXY_URL: &str = "SANDBOX_EGRESS_PROXY_URL";
const EGRESS_DNS_SERVERS: &str = "SANDBOX_EGRESS_DNS_SERVERS";
const EGRESS_TOKEN_TTL: &str = "SANDBOX_EGRESS_TOKEN_TTL_SECONDS";
const FIELD_KEY: &str = "SANDBOX_FIELD_KEY";
const FIELD_KEY_FILE: &str = "SANDBOX_FIELD_KEY_FILE";
const WORKER_PREPARE_LANGUAGES: &str = "CORRAL_WORKER_PREPARE_LANGUAGES";
const WORKER_PYTHON_PREIMPORT: &str = "CORRAL_WORKER_PYTHON_PREIMPORT";
const JAIL_ALLOW_WEAKER_ISOLATION: &str = "CORRAL_JAIL_ALLOW_WEAKER_ISOLATION";
const JAIL_CGROUP_ROOT: &str = "CORRAL_JAIL_CGROUP_ROOT";
/// The longest path a path setting accepts, in bytes (Linux's `PATH_MAX`).
const PATH_MAX_BYTES: usize = 4_096;
/// The most modules `CORRAL_WORKER_PYTHON_PREIMPORT` may name: each costs every preparation.
pub const PYTHON_PREIMPORT_MAX: usize = 64;
/// The longest module name `CORRAL_WORKER_PYTHON_PREIMPORT` accepts, in bytes.
pub const PYTHON_MODULE_NAME_MAX_BYTES: usize = 256;

impl Number {
    /// What an accepted value looks like, for an error message.
    fn expected(&self) -> String {
        match self.unit {
            Unit::Count => format!("a whole number from {} to {}", self.min, self.max),
            Unit::Seconds => format!(
                "a whole number of seconds from {} to {}",
                self.min, self.max
            ),
            Unit::Port => format!("a port number from {} to {}", self.min, self.max),
            Unit::Bytes => format!(
                "a size from {} to {} (whole bytes, or with a KiB, MiB, GiB, KB, MB or GB suffix)",
                human_bytes(self.min),
                human_bytes(self.max)
            ),
        }
    }

    /// Parses `text` (already trimmed, not empty) and checks its range.
    fn parse(&self, text: &str) -> Result<u64, ConfigError> {
        let parsed = match self.unit {
            Unit::Bytes => parse_byte_size(text),
            Unit::Count | Unit::Seconds | Unit::Port => parse_digits(text),
        };
        match parsed {
            Parsed::Invalid => Err(ConfigError::InvalidNumber {
                setting: self.name,
                value: shown(text),
                expected: self.expected(),
            }),
            Parsed::TooLarge => Err(self.out_of_range(shown(text))),
            Parsed::Value(value) if value < self.min || value > self.max => {
                Err(self.out_of_range(shown(text)))
            }
            Parsed::Value(value) => Ok(value),
        }
    }

    /// Checks a value already held in [`Settings`].
    fn check(&self, value: u64) -> Result<(), ConfigError> {
        if value < self.min || value > self.max {
            return Err(self.out_of_range(value.to_string()));
        }
        Ok(())
    }

    fn out_of_range(&self, value: String) -> ConfigError {
        ConfigError::OutOfRange {
            setting: self.name,
            value,
            expected: self.expected(),
        }
    }
}

/// The outcome of reading a whole number.
enum Parsed {
    Value(u64),
    TooLarge,
    Invalid,
}

/// Decimal digits only: no sign, no separators.
fn parse_digits(text: &str) -> Parsed {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Parsed::Invalid;
    }
    match text.parse::<u64>() {
        Ok(value) => Parsed::Value(value),
        // Only digits, so the one way to fail is a number beyond u64.
        Err(_) => Parsed::TooLarge,
    }
}

/// Suffixes a byte size may carry, matched without regard to case.
const BYTE_SUFFIXES: &[(&str, u64)] = &[
    ("B", 1),
    ("KiB", KIB),
    ("MiB", MIB),
    ("GiB", GIB),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
];

/// Whole bytes, or a whole number and a suffix, with optional space between them.
fn parse_byte_size(text: &str) -> Parsed {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, rest) = text.split_at(digits_end);
    let suffix = rest.trim_start();
    let multiplier = if suffix.is_empty() {
        1
    } else {
        match BYTE_SUFFIXES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(suffix))
        {
            Some((_, multiplier)) => *multiplier,
            None => return Parsed::Invalid,
        }
    };
    match parse_digits(digits) {
        Parsed::Value(value) => value
            .checked_mul(multiplier)
            .map_or(Parsed::TooLarge, Parsed::Value),
        other => other,
    }
}

/// A byte count as an operator would write it: the largest unit that divides it exactly.
fn human_bytes(value: u64) -> String {
    const UNITS: &[(&str, u64)] = &[
        ("TiB", TIB),
        ("GiB", GIB),
        ("MiB", MIB),
        ("KiB", KIB),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KB", 1_000),
    ];
    for (name, size) in UNITS {
        if value != 0 && value.is_multiple_of(*size) {
            return format!("{} {name}", value / size);
        }
    }
    format!("{value} B")
}

/// A rejected value as an error repeats it: bounded, so a huge value cannot flood a log.
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_VALUE_MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

/// A setting that cannot be accepted. Its `Display` names the setting, the value given and what
/// is expected; [`ConfigError::code`] is stable for scripts and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The value is not a number of the expected form (`config_invalid_number`).
    InvalidNumber {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
        /// What an accepted value looks like.
        expected: String,
    },
    /// The value is a number outside the setting's range (`config_out_of_range`).
    OutOfRange {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
        /// What an accepted value looks like.
        expected: String,
    },
    /// The value is not a boolean (`config_invalid_bool`).
    InvalidBool {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
    },
    /// The value is not one of the setting's choices (`config_invalid_choice`).
    InvalidChoice {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
        /// The accepted choices.
        expected: &'static str,
    },
    /// The value is not an absolute path (`config_invalid_path`).
    InvalidPath {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
    },
    /// The value is not an `http://` or `https://` URL with a host (`config_invalid_url`).
    InvalidUrl {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
    },
    /// Two settings that are each valid disagree (`config_relation`).
    Relation {
        /// The setting the rule constrains.
        setting: &'static str,
        /// Its effective value.
        value: u64,
        /// The comparison that must hold, such as "at most" or "less than".
        rule: &'static str,
        /// The setting it is compared with.
        other: &'static str,
        /// That setting's effective value.
        other_value: u64,
        /// Why the rule exists.
        why: &'static str,
    },
    /// Two settings that exclude each other are both set (`config_conflict`).
    Conflict {
        /// The first setting.
        setting: &'static str,
        /// The second setting.
        other: &'static str,
    },
    /// An item of a comma-separated list is not acceptable (`config_invalid_list_item`).
    InvalidListItem {
        /// The setting.
        setting: &'static str,
        /// The item refused (trimmed, and shortened when long).
        item: String,
        /// What every item must be.
        expected: &'static str,
    },
    /// A name Corral does not read was given to [`Settings::from_pairs`] (`config_unknown_setting`).
    UnknownSetting {
        /// The name given (shortened when long).
        setting: String,
    },
}

impl ConfigError {
    /// The stable code of this kind of error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidNumber { .. } => "config_invalid_number",
            Self::OutOfRange { .. } => "config_out_of_range",
            Self::InvalidBool { .. } => "config_invalid_bool",
            Self::InvalidChoice { .. } => "config_invalid_choice",
            Self::InvalidPath { .. } => "config_invalid_path",
            Self::InvalidUrl { .. } => "config_invalid_url",
            Self::Relation { .. } => "config_relation",
            Self::Conflict { .. } => "config_conflict",
            Self::InvalidListItem { .. } => "config_invalid_list_item",
            Self::UnknownSetting { .. } => "config_unknown_setting",
        }
    }

    /// The setting at fault (for a relation or a conflict, the first of the two).
    #[must_use]
    pub fn setting(&self) -> &str {
        match self {
            Self::InvalidNumber { setting, .. }
            | Self::OutOfRange { setting, .. }
            | Self::InvalidBool { setting, .. }
            | Self::InvalidChoice { setting, .. }
            | Self::InvalidPath { setting, .. }
            | Self::InvalidUrl { setting, .. }
            | Self::Relation { setting, .. }
            | Self::Conflict { setting, .. }
            | Self::InvalidListItem { setting, .. } => setting,
            Self::UnknownSetting { setting } => setting,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidNumber {
                setting,
                value,
                expected,
            }
            | Self::OutOfRange {
                setting,
                value,
                expected,
            } => {
                write!(f, "{setting}={value:?}: expected {expected}")
            }
            Self::InvalidBool { setting, value } => {
                write!(
                    f,
                    "{setting}={value:?}: expected true/false, 1/0, yes/no or on/off"
                )
            }
            Self::InvalidChoice {
                setting,
                value,
                expected,
            } => {
                write!(f, "{setting}={value:?}: expected one of {expected}")
            }
            Self::InvalidPath { setting, value } => {
                write!(
                    f,
                    "{setting}={value:?}: expected an absolute path without control characters"
                )
            }
            Self::InvalidUrl { setting, value } => {
                write!(
                    f,
                    "{setting}={value:?}: expected an http:// or https:// URL with a host"
                )
            }
            Self::Relation {
                setting,
                value,
                rule,
                other,
                other_value,
                why,
            } => {
                write!(
                    f,
                    "{setting}={value} must be {rule} {other}={other_value}: {why}"
                )
            }
            Self::Conflict { setting, other } => {
                write!(
                    f,
                    "{setting} and {other} are both set: set only one of them"
                )
            }
            Self::InvalidListItem {
                setting,
                item,
                expected,
            } => {
                write!(f, "{setting}: {item:?} is not {expected}")
            }
            Self::UnknownSetting { setting } => {
                write!(f, "{setting:?} is not a setting Corral reads")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

// ---------------------------------------------------------------------------------------------
// The settings.

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
    /// `CORRAL_WORKER_PYTHON_PREIMPORT` (default none): modules a prepared Python jail imports
    /// before it waits for the code, each a dotted name of ASCII identifiers, at most
    /// [`PYTHON_PREIMPORT_MAX`] of them, without repeats.
    pub python_preimport: Vec<String>,
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
            egress: EgressSettings::default(),
            field_key: FieldKeySource::Unset,
            worker: WorkerPorts {
                control_port: WorkerPorts::DEFAULT_CONTROL,
                browser_port: WorkerPorts::DEFAULT_BROWSER,
            },
            prepare: PrepareSettings {
                languages: vec![Language::Python],
                python_preimport: Vec::new(),
            },
            jail: JailSettings {
                allow_weaker_isolation: false,
                cgroup_root: "/sys/fs/cgroup".to_owned(),
            },
        }
    }
}

/// Reads settings through the caller's lookup: trims, treats empty as unset, applies defaults.
struct Reader<F> {
    lookup: F,
}

impl<F: Fn(&str) -> Option<String>> Reader<F> {
    /// The trimmed value of `name`, or `None` when it is unset or blank.
    fn raw(&self, name: &'static str) -> Option<String> {
        setting_value(&(self.lookup)(name)?).map(str::to_owned)
    }

    fn number(&self, spec: &Number, default: u64) -> Result<u64, ConfigError> {
        match self.raw(spec.name) {
            None => Ok(default),
            Some(text) => spec.parse(&text),
        }
    }

    fn number_u32(&self, spec: &Number, default: u32) -> Result<u32, ConfigError> {
        let value = self.number(spec, u64::from(default))?;
        u32::try_from(value).map_err(|_| spec.out_of_range(value.to_string()))
    }

    fn number_u16(&self, spec: &Number, default: u16) -> Result<u16, ConfigError> {
        let value = self.number(spec, u64::from(default))?;
        u16::try_from(value).map_err(|_| spec.out_of_range(value.to_string()))
    }

    fn flag(&self, name: &'static str, default: bool) -> Result<bool, ConfigError> {
        let Some(text) = self.raw(name) else {
            return Ok(default);
        };
        match text.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(ConfigError::InvalidBool {
                setting: name,
                value: shown(&text),
            }),
        }
    }

    fn pool_mode(&self) -> Result<PoolModeSetting, ConfigError> {
        let Some(text) = self.raw(POOL_MODE) else {
            return Ok(PoolModeSetting::Controller);
        };
        match text.to_ascii_lowercase().as_str() {
            "controller" => Ok(PoolModeSetting::Controller),
            "platform_operator" => Ok(PoolModeSetting::PlatformOperator),
            _ => Err(ConfigError::InvalidChoice {
                setting: POOL_MODE,
                value: shown(&text),
                expected: "controller, platform_operator",
            }),
        }
    }

    /// An absolute path without control characters, no longer than `PATH_MAX_BYTES`.
    fn path(&self, name: &'static str, default: &str) -> Result<String, ConfigError> {
        let Some(text) = self.raw(name) else {
            return Ok(default.to_owned());
        };
        let acceptable = text.starts_with('/')
            && text.len() <= PATH_MAX_BYTES
            && !text.chars().any(char::is_control);
        if acceptable {
            Ok(text)
        } else {
            Err(ConfigError::InvalidPath {
                setting: name,
                value: shown(&text),
            })
        }
    }

    /// `CORRAL_WORKER_PREPARE_LANGUAGES`: unset is the default, set but blank is none (the one
    /// setting where blank is not unset: "prepare nothing" needs a spelling).
    fn prepare_languages(&self, default: &[Language]) -> Result<Vec<Language>, ConfigError> {
        let Some(text) = (self.lookup)(WORKER_PREPARE_LANGUAGES) else {
            return Ok(default.to_vec());
        };
        let mut languages = Vec::new();
        for item in list_items(&text) {
            let language = Language::parse(&item.to_ascii_lowercase()).map_err(|_| {
                ConfigError::InvalidListItem {
                    setting: WORKER_PREPARE_LANGUAGES,
                    item: shown(item),
                    expected: "python or node (a comma-separated list; set but empty: none)",
                }
            })?;
            if !languages.contains(&language) {
                languages.push(language);
            }
        }
        Ok(languages)
    }

    /// `CORRAL_WORKER_PYTHON_PREIMPORT`: dotted module names, none by default.
    fn python_preimport(&self) -> Result<Vec<String>, ConfigError> {
        let Some(text) = self.raw(WORKER_PYTHON_PREIMPORT) else {
            return Ok(Vec::new());
        };
        let refused = |item: &str, expected: &'static str| ConfigError::InvalidListItem {
            setting: WORKER_PYTHON_PREIMPORT,
            item: shown(item),
            expected,
        };
        let mut modules: Vec<String> = Vec::new();
        for item in list_items(&text) {
            if !is_python_module_name(item) {
                return Err(refused(
                    item,
                    "a dotted Python module name of ASCII identifiers (a comma-separated list)",
                ));
            }
            if modules.iter().any(|m| m == item) {
                continue;
            }
            if modules.len() == PYTHON_PREIMPORT_MAX {
                return Err(refused(
                    item,
                    "within the first 64 modules (the most accepted)",
                ));
            }
            modules.push(item.to_owned());
        }
        Ok(modules)
    }

    fn broker_url(&self) -> Result<Option<String>, ConfigError> {
        let Some(text) = self.raw(PACKAGE_BROKER_URL) else {
            return Ok(None);
        };
        if is_http_url(&text) {
            Ok(Some(text))
        } else {
            Err(ConfigError::InvalidUrl {
                setting: PACKAGE_BROKER_URL,
                value: shown(&redact_userinfo(&text)),
            })
        }
    }

    fn registries(&self) -> PackageRegistries {
        match self.raw(PACKAGE_REGISTRIES) {
            None => PackageRegistries::PublicDefaults,
            Some(text) if text.chars().filter(|c| !c.is_whitespace()).eq("{}".chars()) => {
                PackageRegistries::Disabled
            }
            Some(text) => PackageRegistries::Configured(text),
        }
    }

    fn egress(&self) -> EgressSettings {
        EgressSettings {
            enabled: self.raw(EGRESS_ENABLED),
            mode: self.raw(EGRESS_MODE),
            allowed_ports: self.raw(EGRESS_ALLOWED_PORTS),
            private_cidrs: self.raw(EGRESS_PRIVATE_CIDRS),
            allowed_hosts: self.raw(EGRESS_ALLOWED_HOSTS),
            proxy_url: self.raw(EGRESS_PROXY_URL),
            dns_servers: self.raw(EGRESS_DNS_SERVERS),
            token_ttl_seconds: self.raw(EGRESS_TOKEN_TTL),
        }
    }

    fn field_key(&self) -> Result<FieldKeySource, ConfigError> {
        match (self.raw(FIELD_KEY), self.raw(FIELD_KEY_FILE)) {
            (None, None) => Ok(FieldKeySource::Unset),
            (Some(key), None) => Ok(FieldKeySource::Value(FieldKey(key))),
            (None, Some(path)) => Ok(FieldKeySource::File(path)),
            (Some(_), Some(_)) => Err(ConfigError::Conflict {
                setting: FIELD_KEY,
                other: FIELD_KEY_FILE,
            }),
        }
    }
}

/// The trimmed items of a comma-separated list; none for a blank text. An empty item (`a,,b`, a
/// trailing comma) is kept, for the caller to refuse.
fn list_items(text: &str) -> Vec<&str> {
    if text.trim().is_empty() {
        return Vec::new();
    }
    text.split(',').map(str::trim).collect()
}

/// A dotted name of ASCII identifiers (`numpy`, `os.path`, `_private`), no longer than
/// [`PYTHON_MODULE_NAME_MAX_BYTES`]: nothing a bootstrap could read as anything but a name.
fn is_python_module_name(text: &str) -> bool {
    text.len() <= PYTHON_MODULE_NAME_MAX_BYTES
        && text.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// An `http://` or `https://` URL with a host and no whitespace or control characters.
fn is_http_url(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"));
    let Some(rest) = rest else {
        return false;
    };
    let host_present = rest
        .chars()
        .next()
        .is_some_and(|c| !matches!(c, '/' | '?' | '#' | '@' | ':'));
    host_present && !text.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// `text` with any `user:password@` in its authority replaced, for display.
fn redact_userinfo(text: &str) -> String {
    let Some(scheme_end) = text.find("://") else {
        return text.to_owned();
    };
    let authority_start = scheme_end + 3;
    let authority_len = text[authority_start..]
        .find(['/', '?', '#'])
        .unwrap_or(text.len() - authority_start);
    let authority = &text[authority_start..authority_start + authority_len];
    match authority.rfind('@') {
        Some(at) => format!(
            "{}<redacted>{}",
            &text[..authority_start],
            &text[authority_start + at..]
        ),
        None => text.to_owned(),
    }
}

impl Settings {
    /// Parses every setting through `lookup` (the environment, in production) and checks the
    /// relations between them. Each setting is looked up exactly once.
    ///
    /// # Errors
    /// The first setting, in [`SETTINGS`] order, that is malformed or out of range, else the first
    /// relation between settings that does not hold. Egress values never cause an error.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
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
            egress: r.egress(),
            field_key: r.field_key()?,
            worker: WorkerPorts {
                control_port: r.number_u16(&WORKER_CONTROL_PORT, d.worker.control_port)?,
                browser_port: r.number_u16(&WORKER_BROWSER_PORT, d.worker.browser_port)?,
            },
            prepare: PrepareSettings {
                languages: r.prepare_languages(&d.prepare.languages)?,
                python_preimport: r.python_preimport()?,
            },
            jail: JailSettings {
                allow_weaker_isolation: r
                    .flag(JAIL_ALLOW_WEAKER_ISOLATION, d.jail.allow_weaker_isolation)?,
                cgroup_root: r.path(JAIL_CGROUP_ROOT, &d.jail.cgroup_root)?,
            },
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

    /// The numeric fields with the range each must lie in.
    fn numbers(&self) -> [(&'static Number, u64); 29] {
        let b = &self.bounds;
        let p = &self.packages;
        [
            (&WARM_POOL_MIN, u64::from(self.warm_pool_min)),
            (&POOL_TARGET_IDLE, u64::from(self.pool_target_idle)),
            (&POOL_MAX_ALLOCATED, u64::from(self.pool_max_allocated)),
            (
                &MAX_CONCURRENT_CREATES,
                u64::from(self.max_concurrent_creates),
            ),
            (&BURST_IDLE_TTL, self.burst_idle_ttl_seconds),
            (&ACQUIRE_WAIT, self.acquire_wait_seconds),
            (&ACQUIRE_QUEUE_MAX, u64::from(self.acquire_queue_max)),
            (
                &MAX_CONCURRENT_PER_MEMBER,
                u64::from(self.max_concurrent_per_member),
            ),
            (&LEASE_HEARTBEAT, self.lease_heartbeat_seconds),
            (&LEASE_TTL, self.lease_ttl_seconds),
            (&CREATE_TIMEOUT, self.create_timeout_seconds),
            (&RESET_TIMEOUT, self.reset_timeout_seconds),
            (&DELETE_RETRY, self.delete_retry_seconds),
            (&INVENTORY_STALE, self.inventory_stale_seconds),
            (&CLAIM_LIFETIME, self.claim_lifetime_seconds),
            (&MAX_WALL, b.max_wall_seconds),
            (&MAX_OUTPUT, b.max_output_bytes),
            (&MAX_ARTIFACT, b.max_artifact_bytes),
            (&WORKSPACE_MAX, b.workspace_max_bytes),
            (&HASHLINE_STATE_MAX, b.hashline_state_max_bytes),
            (
                &DEPENDENCY_INSTALL_TIMEOUT,
                b.dependency_install_timeout_seconds,
            ),
            (&MAX_MEMORY, b.max_memory_bytes),
            (&MAX_PROCESSES, u64::from(b.max_processes)),
            (&TMP_MAX, b.tmp_max_bytes),
            (&PACKAGE_TOKEN_TTL, p.token_ttl_seconds),
            (&PACKAGE_MAX_INDEX, p.max_index_bytes),
            (&PACKAGE_MAX_FILE, p.max_file_bytes),
            (&WORKER_CONTROL_PORT, u64::from(self.worker.control_port)),
            (&WORKER_BROWSER_PORT, u64::from(self.worker.browser_port)),
        ]
    }

    /// Checks every number's range and every relation between settings.
    ///
    /// # Errors
    /// The first number out of range, else the first relation that does not hold.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (spec, value) in self.numbers() {
            spec.check(value)?;
        }
        let ceiling = (&POOL_MAX_ALLOCATED, u64::from(self.pool_max_allocated));
        let heartbeat = (&LEASE_HEARTBEAT, self.lease_heartbeat_seconds);
        at_most(
            (&WARM_POOL_MIN, u64::from(self.warm_pool_min)),
            ceiling,
            "the warm minimum is kept allocated, under the ceiling",
        )?;
        at_most(
            (&POOL_TARGET_IDLE, u64::from(self.pool_target_idle)),
            ceiling,
            "idle workers are allocated, under the ceiling",
        )?;
        at_most(
            (
                &MAX_CONCURRENT_CREATES,
                u64::from(self.max_concurrent_creates),
            ),
            ceiling,
            "workers being created count toward the ceiling",
        )?;
        at_most(
            (
                &MAX_CONCURRENT_PER_MEMBER,
                u64::from(self.max_concurrent_per_member),
            ),
            ceiling,
            "a member's leases are allocated workers, under the ceiling",
        )?;
        relation(
            heartbeat,
            "less than",
            (&LEASE_TTL, self.lease_ttl_seconds),
            |a, b| a < b,
            "a lease must be renewed before it expires",
        )?;
        at_most(
            (
                &DEPENDENCY_INSTALL_TIMEOUT,
                self.bounds.dependency_install_timeout_seconds,
            ),
            (&PACKAGE_TOKEN_TTL, self.packages.token_ttl_seconds),
            "the broker token must outlive the install it serves",
        )?;
        relation(
            (&WORKER_CONTROL_PORT, u64::from(self.worker.control_port)),
            "different from",
            (&WORKER_BROWSER_PORT, u64::from(self.worker.browser_port)),
            |a, b| a != b,
            "the worker serves its control API and the browser adapter on separate ports",
        )?;
        if self.pool_mode == PoolModeSetting::PlatformOperator {
            relation(
                (&CLAIM_LIFETIME, self.claim_lifetime_seconds),
                "greater than",
                heartbeat,
                |a, b| a > b,
                "a platform claim must outlive its first renewal (CORRAL_POOL_MODE=platform_operator)",
            )?;
        }
        Ok(())
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
            #[cfg(feature = "sim-mutations")]
            mutation: None,
        }
    }

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
            JAIL_ALLOW_WEAKER_ISOLATION,
            self.jail.allow_weaker_isolation.to_string(),
        ));
        out.push((JAIL_CGROUP_ROOT, self.jail.cgroup_root.clone()));
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

/// Seconds to milliseconds; every range keeps this far from overflow, and it saturates anyway.
fn ms(seconds: u64) -> u64 {
    seconds.saturating_mul(1_000)
}

/// `a <= b`, as a relation error naming both settings when it does not hold.
fn at_most(
    a: (&'static Number, u64),
    b: (&'static Number, u64),
    why: &'static str,
) -> Result<(), ConfigError> {
    relation(a, "at most", b, |x, y| x <= y, why)
}

/// `holds(a, b)`, as a relation error naming both settings when it does not hold.
fn relation(
    a: (&'static Number, u64),
    rule: &'static str,
    b: (&'static Number, u64),
    holds: impl Fn(u64, u64) -> bool,
    why: &'static str,
) -> Result<(), ConfigError> {
    if holds(a.1, b.1) {
        return Ok(());
    }
    Err(ConfigError::Relation {
        setting: a.0.name,
        value: a.1,
        rule,
        other: b.0.name,
        other_value: b.1,
        why,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Settings {
        match Settings::from_pairs(pairs) {
            Ok(settings) => settings,
            Err(error) => panic!("{pairs:?} refused: {error}"),
        }
    }

    fn refuse(pairs: &[(&str, &str)]) -> ConfigError {
        match Settings::from_pairs(pairs) {
            Ok(settings) => panic!("{pairs:?} accepted: {settings:?}"),
            Err(error) => error,
        }
    }

    /// Asserts a relation error naming both settings, in its fields and in its message.
    fn assert_relation(pairs: &[(&str, &str)], setting: &str, other: &str) {
        let error = refuse(pairs);
        assert_eq!(error.code(), "config_relation", "{error}");
        assert_eq!(error.setting(), setting, "{error}");
        let ConfigError::Relation { other: named, .. } = &error else {
            panic!("not a relation: {error:?}");
        };
        assert_eq!(*named, other);
        let message = error.to_string();
        assert!(
            message.contains(setting) && message.contains(other),
            "{message}"
        );
    }

    #[test]
    fn pool_01_defaults_match_the_specification() {
        let s = Settings::default();
        assert_eq!(s.warm_pool_min, 3);
        assert_eq!(s.pool_target_idle, 1);
        assert_eq!(s.pool_max_allocated, 32);
        assert_eq!(s.max_concurrent_creates, 3);
        assert_eq!(s.burst_idle_ttl_seconds, 300);
        assert_eq!(s.acquire_wait_seconds, 30);
        assert_eq!(s.acquire_queue_max, 256);
        assert_eq!(s.max_concurrent_per_member, 2);
        assert_eq!(Settings::from_lookup(|_| None), Ok(s.clone()));
        let pool = s.pool();
        assert_eq!(pool, PoolConfig::default());
        assert_eq!(
            (pool.burst_idle_ttl_ms, pool.acquire_wait_ms),
            (300_000, 30_000)
        );
    }

    #[test]
    fn lease_defaults_match_the_specification() {
        let s = Settings::default();
        assert_eq!((s.lease_heartbeat_seconds, s.lease_ttl_seconds), (60, 900));
        assert_eq!(
            (s.pool().lease_heartbeat_ms, s.pool().lease_ttl_ms),
            (60_000, 900_000)
        );
    }

    #[test]
    fn every_bound_names_a_documented_setting() {
        for bound in crate::bounds::Bound::ALL {
            assert!(setting_doc(bound.setting()).is_some(), "{bound:?}");
        }
    }

    #[test]
    fn execution_bound_defaults_match_the_specification() {
        let b = Settings::default().bounds;
        assert_eq!(b.max_wall_seconds, 30);
        assert_eq!(b.max_output_bytes, 1024 * 1024);
        assert_eq!(b.max_artifact_bytes, 10 * 1024 * 1024);
        assert_eq!(b.workspace_max_bytes, 8 * 1024 * 1024);
        assert_eq!(b.hashline_state_max_bytes, 64 * 1024 * 1024);
        assert_eq!(b.dependency_install_timeout_seconds, 120);
    }

    #[test]
    fn corral_own_defaults() {
        let s = Settings::default();
        assert_eq!(s.bounds.max_memory_bytes, 512 * 1024 * 1024);
        assert_eq!(s.bounds.max_processes, 64);
        assert_eq!(s.bounds.tmp_max_bytes, 64 * 1024 * 1024);
        assert_eq!(
            (
                s.create_timeout_seconds,
                s.reset_timeout_seconds,
                s.delete_retry_seconds
            ),
            (120, 30, 10)
        );
        assert_eq!(s.inventory_stale_seconds, 30);
        assert_eq!(s.pool_mode, PoolModeSetting::Controller);
        assert_eq!(s.claim_lifetime_seconds, 3600);
        assert_eq!(
            s.worker,
            WorkerPorts {
                control_port: 8091,
                browser_port: 8080
            }
        );
        assert_eq!(s.field_key, FieldKeySource::Unset);
    }

    #[test]
    fn workspace_persist_defaults_on() {
        assert!(Settings::default().workspace_persist);
        assert!(!parse(&[("SANDBOX_WORKSPACE_PERSIST", "off")]).workspace_persist);
    }

    #[test]
    fn package_settings_default_to_the_specification() {
        let p = Settings::default().packages;
        assert_eq!(p.broker_url, None);
        assert_eq!(p.token_ttl_seconds, 300);
        assert_eq!(p.max_index_bytes, 8 * 1024 * 1024);
        assert_eq!(p.max_file_bytes, 100_000_000);
        assert_eq!(p.registries, PackageRegistries::PublicDefaults);
    }

    #[test]
    fn an_empty_registry_object_parses_as_no_registry() {
        for text in ["{}", " { } ", "{\n}"] {
            let s = parse(&[("SANDBOX_PACKAGE_REGISTRIES", text)]);
            assert_eq!(
                s.packages.registries,
                PackageRegistries::Disabled,
                "{text:?}"
            );
        }
        let raw = r#"{"pypi": "https://pypi.example/simple"}"#;
        let s = parse(&[("SANDBOX_PACKAGE_REGISTRIES", raw)]);
        assert_eq!(
            s.packages.registries,
            PackageRegistries::Configured(raw.to_owned())
        );
    }

    #[test]
    fn egr_01_egress_defaults_match_the_specification() {
        assert_eq!(EgressSettings::DEFAULT_ENABLED.to_string(), "true");
        assert_eq!(EgressSettings::DEFAULT_MODE, "public_internet");
        assert_eq!(EgressSettings::DEFAULT_ALLOWED_PORTS, "80,443");
        assert_eq!(EgressSettings::DEFAULT_TOKEN_TTL_SECONDS, 600);
        let doc_default = |name| setting_doc(name).map(|doc| doc.default);
        assert_eq!(doc_default("SANDBOX_EGRESS_ENABLED"), Some("true"));
        assert_eq!(doc_default("SANDBOX_EGRESS_MODE"), Some("public_internet"));
        assert_eq!(doc_default("SANDBOX_EGRESS_ALLOWED_PORTS"), Some("80,443"));
        assert_eq!(doc_default("SANDBOX_EGRESS_TOKEN_TTL_SECONDS"), Some("600"));
        // Unset stays unset: the egress module applies the defaults when it resolves.
        assert_eq!(Settings::default().egress, EgressSettings::default());
    }

    #[test]
    fn egr_05_egress_values_never_fail_start_up() {
        let garbage = "\u{0}not a value;; 99999999999999999999999 -1 ✗";
        let pairs: Vec<(&str, &str)> = [
            "SANDBOX_EGRESS_ENABLED",
            "SANDBOX_EGRESS_MODE",
            "SANDBOX_EGRESS_ALLOWED_PORTS",
            "SANDBOX_EGRESS_PRIVATE_CIDRS",
            "SANDBOX_EGRESS_ALLOWED_HOSTS",
            "SANDBOX_EGRESS_PROXY_URL",
            "SANDBOX_EGRESS_DNS_SERVERS",
            "SANDBOX_EGRESS_TOKEN_TTL_SECONDS",
        ]
        .into_iter()
        .map(|name| (name, garbage))
        .collect();
        let s = parse(&pairs);
        let kept = Some(garbage.trim().to_owned());
        assert_eq!(s.egress.enabled, kept);
        assert_eq!(s.egress.mode, kept);
        assert_eq!(s.egress.allowed_ports, kept);
        assert_eq!(s.egress.private_cidrs, kept);
        assert_eq!(s.egress.allowed_hosts, kept);
        assert_eq!(s.egress.proxy_url, kept);
        assert_eq!(s.egress.dns_servers, kept);
        assert_eq!(s.egress.token_ttl_seconds, kept);
        let s = parse(&[
            ("SANDBOX_EGRESS_MODE", "  host_allowlist \n"),
            ("SANDBOX_EGRESS_ENABLED", " "),
        ]);
        assert_eq!(s.egress.mode.as_deref(), Some("host_allowlist"));
        assert_eq!(s.egress.enabled, None);
    }

    #[test]
    fn every_setting_in_the_table_is_read_and_nothing_else() {
        let asked: RefCell<Vec<String>> = RefCell::new(Vec::new());
        let result = Settings::from_lookup(|name| {
            asked.borrow_mut().push(name.to_owned());
            None
        });
        assert!(result.is_ok());
        let asked = asked.into_inner();
        let unique: BTreeSet<&str> = asked.iter().map(String::as_str).collect();
        assert_eq!(
            unique.len(),
            asked.len(),
            "a setting is looked up twice: {asked:?}"
        );
        let table: BTreeSet<&str> = SETTINGS.iter().map(|doc| doc.name).collect();
        assert_eq!(table.len(), SETTINGS.len(), "a setting is listed twice");
        assert_eq!(unique, table);
    }

    #[test]
    fn describe_lists_every_setting_in_table_order() {
        let described: Vec<&str> = Settings::default()
            .describe()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let table: Vec<&str> = SETTINGS.iter().map(|doc| doc.name).collect();
        assert_eq!(described, table);
    }

    #[test]
    fn table_is_complete_and_its_defaults_parse_to_the_defaults() {
        for doc in SETTINGS {
            assert!(
                !doc.meaning.is_empty() && !doc.requirement.is_empty(),
                "{}",
                doc.name
            );
            assert!(
                doc.name.starts_with("SANDBOX_") || doc.name.starts_with("CORRAL_"),
                "{}",
                doc.name
            );
            // Egress values are kept raw, so writing their default is not the same as leaving it unset.
            if doc.default.is_empty() || doc.name.starts_with("SANDBOX_EGRESS_") {
                continue;
            }
            let parsed = parse(&[(doc.name, doc.default)]);
            assert_eq!(parsed, Settings::default(), "{}={}", doc.name, doc.default);
        }
    }

    #[test]
    fn describe_shows_the_effective_values() {
        let described = Settings::default().describe();
        let value = |name: &str| {
            described
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(value("SANDBOX_MAX_OUTPUT_BYTES"), "1048576");
        assert_eq!(value("SANDBOX_WORKSPACE_PERSIST"), "true");
        assert_eq!(value("CORRAL_POOL_MODE"), "controller");
        assert_eq!(value("SANDBOX_EGRESS_MODE"), "<unset>");
        assert_eq!(value("SANDBOX_FIELD_KEY"), "<unset>");
        // Every described value reads back as the same settings.
        let pairs: Vec<(&str, &str)> = described
            .iter()
            .filter(|(_, v)| !v.starts_with('<'))
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        let mut reread = parse(&pairs);
        reread.egress = EgressSettings::default();
        assert_eq!(reread, Settings::default());
    }

    #[test]
    fn describe_redacts_credentials_in_urls() {
        let s = parse(&[
            ("SANDBOX_EGRESS_PROXY_URL", "http://user:pw@proxy:3128/x"),
            ("SANDBOX_PACKAGE_BROKER_URL", "https://tok@api:8000/simple"),
        ]);
        let text = format!("{:?}", s.describe());
        assert!(!text.contains("pw") && !text.contains("tok@"), "{text}");
        assert!(text.contains("http://<redacted>@proxy:3128/x"), "{text}");
        assert!(
            text.contains("https://<redacted>@api:8000/simple"),
            "{text}"
        );
    }

    #[test]
    fn field_key_never_appears_in_debug_describe_or_errors() {
        let secret = "s3cr3t-field-key-Zq9";
        let s = parse(&[("SANDBOX_FIELD_KEY", secret)]);
        let FieldKeySource::Value(key) = &s.field_key else {
            panic!("field key not kept: {:?}", s.field_key);
        };
        assert_eq!(key.expose_secret(), secret);
        for text in [
            format!("{s:?}"),
            format!("{s:#?}"),
            format!("{:?}", s.describe()),
        ] {
            assert!(!text.contains(secret), "{text}");
        }
        let described = s.describe();
        assert!(described.contains(&("SANDBOX_FIELD_KEY", "<set>".to_owned())));
        let error = refuse(&[
            ("SANDBOX_FIELD_KEY", secret),
            ("SANDBOX_FIELD_KEY_FILE", "/run/key"),
        ]);
        assert_eq!(error.code(), "config_conflict");
        assert!(!error.to_string().contains(secret) && !format!("{error:?}").contains(secret));
        let error = refuse(&[
            ("SANDBOX_FIELD_KEY", secret),
            ("SANDBOX_POOL_MAX_ALLOCATED", "0"),
        ]);
        assert!(!error.to_string().contains(secret));
    }

    #[test]
    fn field_key_file_keeps_the_path() {
        let s = parse(&[("SANDBOX_FIELD_KEY_FILE", " /run/secrets/field-key ")]);
        assert_eq!(
            s.field_key,
            FieldKeySource::File("/run/secrets/field-key".to_owned())
        );
        let described = s.describe();
        assert!(described.contains(&("SANDBOX_FIELD_KEY", "<unset>".to_owned())));
        assert!(described.contains(&(
            "SANDBOX_FIELD_KEY_FILE",
            "/run/secrets/field-key".to_owned()
        )));
    }

    #[test]
    fn a_bad_number_names_the_setting() {
        let error = refuse(&[("SANDBOX_POOL_MAX_ALLOCATED", "abc")]);
        assert_eq!(error.code(), "config_invalid_number");
        assert_eq!(
            error.to_string(),
            r#"SANDBOX_POOL_MAX_ALLOCATED="abc": expected a whole number from 1 to 100000"#
        );
        for (name, value) in [
            ("SANDBOX_ACQUIRE_WAIT_SECONDS", "30s"),
            ("SANDBOX_LEASE_TTL_SECONDS", "-1"),
            ("SANDBOX_WARM_POOL_MIN", "+3"),
            ("SANDBOX_MAX_OUTPUT_BYTES", "1 MiBs"),
            ("SANDBOX_MAX_OUTPUT_BYTES", "1.5 MiB"),
            ("SANDBOX_TMP_MAX_BYTES", "MiB"),
            ("CORRAL_WORKER_CONTROL_PORT", "http"),
        ] {
            let error = refuse(&[(name, value)]);
            assert_eq!(error.code(), "config_invalid_number", "{name}={value}");
            assert_eq!(error.setting(), name);
            assert!(
                error
                    .to_string()
                    .starts_with(&format!("{name}={value:?}: expected ")),
                "{error}"
            );
        }
    }

    #[test]
    fn zero_where_it_makes_no_sense_is_refused() {
        for name in [
            "SANDBOX_POOL_MAX_ALLOCATED",
            "SANDBOX_MAX_CONCURRENT_CREATES",
            "SANDBOX_ACQUIRE_WAIT_SECONDS",
            "SANDBOX_ACQUIRE_QUEUE_MAX",
            "SANDBOX_MAX_CONCURRENT_PER_MEMBER",
            "SANDBOX_LEASE_HEARTBEAT_SECONDS",
            "SANDBOX_MAX_WALL_SECONDS",
            "SANDBOX_MAX_OUTPUT_BYTES",
            "SANDBOX_MAX_ARTIFACT_BYTES",
            "SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS",
            "CORRAL_INVENTORY_STALE_SECONDS",
            "CORRAL_CREATE_TIMEOUT_SECONDS",
            "CORRAL_WORKER_CONTROL_PORT",
        ] {
            let error = refuse(&[(name, "0")]);
            assert_eq!(error.code(), "config_out_of_range", "{name}");
            assert_eq!(error.setting(), name);
        }
        // Zero is meaningful here: no warm floor, no idle target, retire burst capacity at once.
        let s = parse(&[
            ("SANDBOX_WARM_POOL_MIN", "0"),
            ("SANDBOX_POOL_TARGET_IDLE", "0"),
            ("SANDBOX_BURST_IDLE_TTL_SECONDS", "0"),
        ]);
        assert_eq!(
            (
                s.warm_pool_min,
                s.pool_target_idle,
                s.burst_idle_ttl_seconds
            ),
            (0, 0, 0)
        );
    }

    #[test]
    fn too_large_is_out_of_range() {
        for (name, value) in [
            ("SANDBOX_POOL_MAX_ALLOCATED", "100001"),
            ("SANDBOX_POOL_MAX_ALLOCATED", "99999999999999999999999999"),
            ("SANDBOX_MAX_OUTPUT_BYTES", "2 GiB"),
            ("SANDBOX_MAX_OUTPUT_BYTES", "18446744073709551615 GiB"),
            ("SANDBOX_MAX_MEMORY_BYTES", "1 MiB"),
            ("CORRAL_WORKER_BROWSER_PORT", "65536"),
        ] {
            let error = refuse(&[(name, value)]);
            assert_eq!(
                error.code(),
                "config_out_of_range",
                "{name}={value}: {error}"
            );
            assert!(
                error.to_string().starts_with(&format!("{name}=")),
                "{error}"
            );
        }
        let error = refuse(&[("SANDBOX_MAX_OUTPUT_BYTES", "2 GiB")]);
        assert!(error.to_string().contains("from 1 B to 1 GiB"), "{error}");
    }

    #[test]
    fn byte_sizes_accept_suffixes() {
        for (value, expected) in [
            ("4096", 4096),
            ("4 KiB", 4096),
            ("4kib", 4096),
            ("2MiB", 2 * 1024 * 1024),
            ("1 GiB", 1 << 30),
            ("5 KB", 5_000),
            ("3 mb", 3_000_000),
            ("1GB", 1_000_000_000),
            ("77 B", 77),
        ] {
            let s = parse(&[("SANDBOX_MAX_ARTIFACT_BYTES", value)]);
            assert_eq!(s.bounds.max_artifact_bytes, expected, "{value}");
        }
    }

    #[test]
    fn booleans_accept_common_spellings_and_nothing_else() {
        for (value, expected) in [
            ("true", true),
            ("TRUE", true),
            ("1", true),
            ("Yes", true),
            ("on", true),
            ("false", false),
            ("0", false),
            ("NO", false),
            ("Off", false),
        ] {
            assert_eq!(
                parse(&[("SANDBOX_WORKSPACE_PERSIST", value)]).workspace_persist,
                expected
            );
        }
        let error = refuse(&[("SANDBOX_WORKSPACE_PERSIST", "maybe")]);
        assert_eq!(error.code(), "config_invalid_bool");
        assert!(
            error
                .to_string()
                .starts_with(r#"SANDBOX_WORKSPACE_PERSIST="maybe": expected"#)
        );
    }

    #[test]
    fn whitespace_is_trimmed_and_empty_means_unset() {
        let s = parse(&[
            ("SANDBOX_POOL_MAX_ALLOCATED", "  40\t\n"),
            ("SANDBOX_WARM_POOL_MIN", "   "),
        ]);
        assert_eq!(s.pool_max_allocated, 40);
        assert_eq!(s.warm_pool_min, 3);
    }

    #[test]
    fn pool_07_platform_operator_mode_carries_the_claim_lifetime() {
        let s = parse(&[
            ("CORRAL_POOL_MODE", "platform_operator"),
            ("CORRAL_CLAIM_LIFETIME_SECONDS", "7200"),
        ]);
        assert_eq!(
            s.pool().mode,
            PoolMode::PlatformOperator {
                claim_lifetime_ms: 7_200_000
            }
        );
        assert_eq!(
            parse(&[("CORRAL_POOL_MODE", "Controller")]).pool().mode,
            PoolMode::Controller
        );
        let error = refuse(&[("CORRAL_POOL_MODE", "kubernetes")]);
        assert_eq!(error.code(), "config_invalid_choice");
        assert!(
            error.to_string().contains("controller, platform_operator"),
            "{error}"
        );
    }

    #[test]
    fn pool_config_converts_seconds_to_milliseconds() {
        let s = parse(&[
            ("SANDBOX_ACQUIRE_WAIT_SECONDS", "7"),
            ("CORRAL_CREATE_TIMEOUT_SECONDS", "11"),
            ("CORRAL_RESET_TIMEOUT_SECONDS", "13"),
            ("CORRAL_DELETE_RETRY_SECONDS", "17"),
            ("CORRAL_INVENTORY_STALE_SECONDS", "19"),
        ]);
        let pool = s.pool();
        assert_eq!(pool.acquire_wait_ms, 7_000);
        assert_eq!(pool.create_timeout_ms, 11_000);
        assert_eq!(pool.reset_timeout_ms, 13_000);
        assert_eq!(pool.delete_retry_ms, 17_000);
        assert_eq!(pool.inventory_stale_ms, 19_000);
    }

    #[test]
    fn relation_warm_minimum_above_the_ceiling() {
        let pairs = [
            ("SANDBOX_WARM_POOL_MIN", "40"),
            ("SANDBOX_POOL_MAX_ALLOCATED", "32"),
        ];
        assert_relation(
            &pairs,
            "SANDBOX_WARM_POOL_MIN",
            "SANDBOX_POOL_MAX_ALLOCATED",
        );
        assert!(refuse(&pairs).to_string().starts_with(
            "SANDBOX_WARM_POOL_MIN=40 must be at most SANDBOX_POOL_MAX_ALLOCATED=32: "
        ));
        parse(&[
            ("SANDBOX_WARM_POOL_MIN", "32"),
            ("SANDBOX_POOL_MAX_ALLOCATED", "32"),
        ]);
    }

    #[test]
    fn relation_target_idle_above_the_ceiling() {
        assert_relation(
            &[
                ("SANDBOX_POOL_TARGET_IDLE", "5"),
                ("SANDBOX_POOL_MAX_ALLOCATED", "4"),
                ("SANDBOX_WARM_POOL_MIN", "1"),
            ],
            "SANDBOX_POOL_TARGET_IDLE",
            "SANDBOX_POOL_MAX_ALLOCATED",
        );
    }

    #[test]
    fn relation_concurrent_creates_above_the_ceiling() {
        assert_relation(
            &[("SANDBOX_MAX_CONCURRENT_CREATES", "33")],
            "SANDBOX_MAX_CONCURRENT_CREATES",
            "SANDBOX_POOL_MAX_ALLOCATED",
        );
    }

    #[test]
    fn relation_per_member_above_the_ceiling() {
        assert_relation(
            &[("SANDBOX_MAX_CONCURRENT_PER_MEMBER", "33")],
            "SANDBOX_MAX_CONCURRENT_PER_MEMBER",
            "SANDBOX_POOL_MAX_ALLOCATED",
        );
    }

    #[test]
    fn relation_heartbeat_not_below_the_lease_ttl() {
        for (heartbeat, ttl) in [("900", "900"), ("901", "900"), ("60", "30")] {
            assert_relation(
                &[
                    ("SANDBOX_LEASE_HEARTBEAT_SECONDS", heartbeat),
                    ("SANDBOX_LEASE_TTL_SECONDS", ttl),
                ],
                "SANDBOX_LEASE_HEARTBEAT_SECONDS",
                "SANDBOX_LEASE_TTL_SECONDS",
            );
        }
        parse(&[
            ("SANDBOX_LEASE_HEARTBEAT_SECONDS", "899"),
            ("SANDBOX_LEASE_TTL_SECONDS", "900"),
        ]);
    }

    #[test]
    fn relation_install_timeout_beyond_the_package_token() {
        assert_relation(
            &[("SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS", "301")],
            "SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS",
            "SANDBOX_PACKAGE_TOKEN_TTL_SECONDS",
        );
    }

    #[test]
    fn relation_worker_ports_collide() {
        assert_relation(
            &[("CORRAL_WORKER_CONTROL_PORT", "8080")],
            "CORRAL_WORKER_CONTROL_PORT",
            "CORRAL_WORKER_BROWSER_PORT",
        );
    }

    #[test]
    fn relation_claim_lifetime_within_a_heartbeat_in_platform_operator_mode() {
        let short = [("CORRAL_CLAIM_LIFETIME_SECONDS", "60")];
        // Ignored in controller mode, where there are no claims.
        parse(&short);
        assert_relation(
            &[short[0], ("CORRAL_POOL_MODE", "platform_operator")],
            "CORRAL_CLAIM_LIFETIME_SECONDS",
            "SANDBOX_LEASE_HEARTBEAT_SECONDS",
        );
    }

    #[test]
    fn validate_catches_fields_changed_after_parsing() {
        let d = Settings::default();
        let s = Settings {
            bounds: ExecutionBounds {
                max_output_bytes: 0,
                ..d.bounds.clone()
            },
            ..d.clone()
        };
        assert_eq!(
            s.validate().map_err(|e| e.code()),
            Err("config_out_of_range")
        );
        let s = Settings {
            warm_pool_min: 33,
            ..d
        };
        assert_eq!(s.validate().map_err(|e| e.code()), Err("config_relation"));
    }

    #[test]
    fn jail_settings_parse_fail_closed() {
        let d = Settings::default();
        assert!(!d.jail.allow_weaker_isolation);
        assert_eq!(d.jail.cgroup_root, "/sys/fs/cgroup");
        let s = parse(&[
            ("CORRAL_JAIL_ALLOW_WEAKER_ISOLATION", "1"),
            ("CORRAL_JAIL_CGROUP_ROOT", " /nonexistent/cgroup "),
        ]);
        assert!(s.jail.allow_weaker_isolation);
        assert_eq!(s.jail.cgroup_root, "/nonexistent/cgroup");
        let error = refuse(&[("CORRAL_JAIL_ALLOW_WEAKER_ISOLATION", "please")]);
        assert_eq!(error.code(), "config_invalid_bool");
        for bad in ["relative/path", "/with\nnewline", "~/cgroup"] {
            let error = refuse(&[("CORRAL_JAIL_CGROUP_ROOT", bad)]);
            assert_eq!(error.code(), "config_invalid_path", "{bad}");
            assert_eq!(error.setting(), "CORRAL_JAIL_CGROUP_ROOT");
        }
    }

    #[test]
    fn prepare_languages_parse_fail_closed() {
        let d = Settings::default();
        assert_eq!(d.prepare.languages, vec![Language::Python]);
        let languages = |value: &str| {
            parse(&[("CORRAL_WORKER_PREPARE_LANGUAGES", value)])
                .prepare
                .languages
        };
        assert_eq!(languages("python"), vec![Language::Python]);
        assert_eq!(
            languages(" node , Python "),
            vec![Language::Node, Language::Python]
        );
        assert_eq!(languages("node,node"), vec![Language::Node]);
        // Set but empty (or blank) is none; unset is the default.
        assert_eq!(languages(""), Vec::<Language>::new());
        assert_eq!(languages("  "), Vec::<Language>::new());
        assert_eq!(parse(&[]).prepare.languages, d.prepare.languages);
        for (bad, item) in [
            ("python,ruby", "ruby"),
            ("python,,node", ""),
            ("node,", ""),
            ("py", "py"),
        ] {
            let error = refuse(&[("CORRAL_WORKER_PREPARE_LANGUAGES", bad)]);
            assert_eq!(error.code(), "config_invalid_list_item", "{bad}");
            assert_eq!(error.setting(), "CORRAL_WORKER_PREPARE_LANGUAGES", "{bad}");
            let message = error.to_string();
            assert!(
                message.contains("CORRAL_WORKER_PREPARE_LANGUAGES")
                    && message.contains(&format!("{item:?}")),
                "{message}"
            );
        }
    }

    #[test]
    fn python_preimport_parse_fail_closed() {
        assert!(Settings::default().prepare.python_preimport.is_empty());
        let modules = |value: &str| {
            parse(&[("CORRAL_WORKER_PYTHON_PREIMPORT", value)])
                .prepare
                .python_preimport
        };
        assert_eq!(modules(""), Vec::<String>::new());
        assert_eq!(
            modules(" pandas, numpy ,os.path,_private.x1,numpy"),
            vec!["pandas", "numpy", "os.path", "_private.x1"]
        );
        let long = "m".repeat(PYTHON_MODULE_NAME_MAX_BYTES + 1);
        for bad in [
            "json,os;import x",
            "1abc",
            "a..b",
            ".json",
            "json.",
            "json,,os",
            "json,",
            "pan das",
            "__import__('os')",
            "naïve",
            "a-b",
            long.as_str(),
        ] {
            let error = refuse(&[("CORRAL_WORKER_PYTHON_PREIMPORT", bad)]);
            assert_eq!(error.code(), "config_invalid_list_item", "{bad}");
            assert_eq!(error.setting(), "CORRAL_WORKER_PYTHON_PREIMPORT", "{bad}");
            assert!(
                error.to_string().contains("CORRAL_WORKER_PYTHON_PREIMPORT"),
                "{error}"
            );
        }
        let most: Vec<String> = (0..PYTHON_PREIMPORT_MAX).map(|i| format!("m{i}")).collect();
        assert_eq!(modules(&most.join(",")), most);
        let too_many = format!("{},one_more", most.join(","));
        let error = refuse(&[("CORRAL_WORKER_PYTHON_PREIMPORT", too_many.as_str())]);
        assert_eq!(error.setting(), "CORRAL_WORKER_PYTHON_PREIMPORT");
        assert!(error.to_string().contains("one_more"), "{error}");
    }

    #[test]
    fn prepare_settings_describe_and_read_back() {
        let s = parse(&[
            ("CORRAL_WORKER_PREPARE_LANGUAGES", "node"),
            ("CORRAL_WORKER_PYTHON_PREIMPORT", "json,os.path"),
        ]);
        let described = s.describe();
        let value = |name: &str| {
            described
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            value("CORRAL_WORKER_PREPARE_LANGUAGES").as_deref(),
            Some("node")
        );
        assert_eq!(
            value("CORRAL_WORKER_PYTHON_PREIMPORT").as_deref(),
            Some("json,os.path")
        );
        let none = parse(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "")]);
        let described = none.describe();
        let shown = described
            .iter()
            .find(|(n, _)| *n == "CORRAL_WORKER_PREPARE_LANGUAGES")
            .map(|(_, v)| v.as_str());
        assert_eq!(shown, Some(""));
        // What is described reads back as the same settings: empty stays "none".
        assert_eq!(parse(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "")]), none);
    }

    #[test]
    fn broker_url_must_be_http() {
        let s = parse(&[(
            "SANDBOX_PACKAGE_BROKER_URL",
            "http://corral-api:8000/broker",
        )]);
        assert_eq!(
            s.packages.broker_url.as_deref(),
            Some("http://corral-api:8000/broker")
        );
        for bad in [
            "corral-api:8000",
            "ftp://x",
            "http://",
            "http:///path",
            "https://a b",
        ] {
            let error = refuse(&[("SANDBOX_PACKAGE_BROKER_URL", bad)]);
            assert_eq!(error.code(), "config_invalid_url", "{bad}");
        }
    }

    #[test]
    fn from_pairs_refuses_unknown_names() {
        let error = refuse(&[("SANDBOX_WARM_POOL_MINIMUM", "3")]);
        assert_eq!(error.code(), "config_unknown_setting");
        assert_eq!(error.setting(), "SANDBOX_WARM_POOL_MINIMUM");
    }

    #[test]
    fn long_values_are_shortened_in_errors() {
        let long = "x".repeat(10_000);
        let error = refuse(&[("SANDBOX_MAX_PROCESSES", long.as_str())]);
        assert!(error.to_string().len() < 300, "{error}");
    }

    /// Independent of `validate`: every relation the specification and this module promise.
    fn assert_every_relation(s: &Settings) {
        assert!(s.warm_pool_min <= s.pool_max_allocated);
        assert!(s.pool_target_idle <= s.pool_max_allocated);
        assert!(s.max_concurrent_creates <= s.pool_max_allocated);
        assert!(s.max_concurrent_per_member <= s.pool_max_allocated);
        assert!(s.lease_heartbeat_seconds < s.lease_ttl_seconds);
        assert!(s.bounds.max_output_bytes > 0 && s.bounds.max_artifact_bytes > 0);
        assert!(s.bounds.max_wall_seconds > 0 && s.bounds.dependency_install_timeout_seconds > 0);
        assert!(s.inventory_stale_seconds > 0);
        assert!(s.pool_max_allocated > 0 && s.max_concurrent_creates > 0);
        assert!(s.acquire_wait_seconds > 0 && s.acquire_queue_max > 0);
        assert!(s.bounds.dependency_install_timeout_seconds <= s.packages.token_ttl_seconds);
        assert!(s.worker.control_port != s.worker.browser_port);
        assert!(s.worker.control_port > 0 && s.worker.browser_port > 0);
        if s.pool_mode == PoolModeSetting::PlatformOperator {
            assert!(s.claim_lifetime_seconds > s.lease_heartbeat_seconds);
        }
        assert_eq!(s.validate(), Ok(()));
        let pool = s.pool();
        assert!(pool.lease_heartbeat_ms < pool.lease_ttl_ms);
        assert!(pool.inventory_stale_ms > 0);
    }

    /// One of `options`, chosen by weight. (`prop_oneof!` would do, but it expands to an `Arc`,
    /// which this crate's lints forbid.)
    fn one_of(options: Vec<(u32, BoxedStrategy<String>)>) -> BoxedStrategy<String> {
        prop::strategy::Union::new_weighted(options).boxed()
    }

    /// Values that hit both sides of the ranges and relations, and plain noise.
    fn any_value() -> BoxedStrategy<String> {
        let suffixes = vec![
            "", " ", "B", "KiB", "mib", "GiB", "KB", "MB", "gb", "TB", "x",
        ];
        let words = vec![
            "true",
            "false",
            "on",
            "OFF",
            "yes",
            "maybe",
            "",
            "  ",
            "{}",
            "controller",
            "platform_operator",
            "http://api:8000",
            "-1",
            "1e3",
            "0x10",
            "٣",
        ];
        one_of(vec![
            (1, (0u64..80).prop_map(|n| n.to_string()).boxed()),
            (1, (0u64..2_000).prop_map(|n| n.to_string()).boxed()),
            (1, any::<u64>().prop_map(|n| n.to_string()).boxed()),
            (
                1,
                (0u64..5_000, prop::sample::select(suffixes))
                    .prop_map(|(n, suffix)| format!("{n}{suffix}"))
                    .boxed(),
            ),
            (
                1,
                prop::sample::select(words).prop_map(str::to_owned).boxed(),
            ),
            (1, any::<String>().boxed()),
        ])
    }

    /// The range of the numeric setting `name`, if it is one.
    fn number_spec(name: &str) -> Option<Number> {
        Settings::default()
            .numbers()
            .into_iter()
            .map(|(spec, _)| *spec)
            .find(|spec| spec.name == name)
    }

    /// Mostly legal values, crowded at the low end where the relations between settings bite,
    /// now and then a value just outside the range or plain noise.
    fn plausible_value(name: &str) -> BoxedStrategy<String> {
        let words = |words: &[&'static str]| {
            one_of(vec![
                (
                    12,
                    prop::sample::select(words.to_vec())
                        .prop_map(str::to_owned)
                        .boxed(),
                ),
                (1, any_value()),
            ])
        };
        match name {
            "SANDBOX_WORKSPACE_PERSIST" => return words(&["true", "off", "YES", "0"]),
            "CORRAL_POOL_MODE" => {
                return words(&["controller", "platform_operator", "Platform_Operator"]);
            }
            "SANDBOX_PACKAGE_BROKER_URL" => {
                return words(&["http://api:8000", "https://u:p@api/broker"]);
            }
            _ => {}
        }
        let Some(spec) = number_spec(name) else {
            return any_value();
        };
        let low_end = spec.max.min(spec.min + 100);
        one_of(vec![
            (24, (spec.min..=low_end).prop_map(|n| n.to_string()).boxed()),
            (6, (spec.min..=spec.max).prop_map(|n| n.to_string()).boxed()),
            (1, Just(spec.max.saturating_add(1).to_string()).boxed()),
            (1, Just(spec.min.saturating_sub(1).to_string()).boxed()),
            (1, any_value()),
        ])
    }

    fn lookup_in(values: &[Option<String>]) -> impl Fn(&str) -> Option<String> + '_ {
        |name| {
            let index = SETTINGS.iter().position(|doc| doc.name == name)?;
            values.get(index).cloned().flatten()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn from_lookup_never_panics_on_arbitrary_values(
            values in prop::collection::vec(prop::option::of(any_value()), SETTINGS.len()),
        ) {
            match Settings::from_lookup(lookup_in(&values)) {
                Ok(settings) => assert_every_relation(&settings),
                Err(error) => {
                    let message = error.to_string();
                    prop_assert!(message.contains(error.setting()), "{}", message);
                    prop_assert!(error.code().starts_with("config_"));
                    prop_assert!(setting_doc(error.setting()).is_some(), "{}", message);
                }
            }
        }

        #[test]
        fn accepted_settings_satisfy_every_relation(
            values in SETTINGS
                .iter()
                .map(|doc| prop::option::weighted(0.25, plausible_value(doc.name)))
                .collect::<Vec<_>>(),
        ) {
            let Ok(settings) = Settings::from_lookup(lookup_in(&values)) else {
                return Ok(());
            };
            assert_every_relation(&settings);
            let _ = settings.describe();
            // Every value given to a numeric setting is the value accepted.
            for (spec, value) in settings.numbers() {
                if let Some(given) = lookup_in(&values)(spec.name).filter(|v| !v.trim().is_empty()) {
                    prop_assert_eq!(Number::parse(spec, given.trim()), Ok(value));
                }
            }
            // Egress values are kept, trimmed, whatever they are.
            let given = lookup_in(&values)("SANDBOX_EGRESS_MODE");
            let expected = given.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
            prop_assert_eq!(settings.egress.mode, expected);
        }
    }
}
