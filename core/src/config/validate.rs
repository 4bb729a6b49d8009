//! The checks of settings already parsed: every number's range and every relation between two.

use super::error::ConfigError;
use super::number::Number;
use super::specs::*;
use super::{PoolModeSetting, Settings};

impl Settings {
    /// The numeric fields with the range each must lie in.
    pub(super) fn numbers(&self) -> [(&'static Number, u64); 32] {
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
            (&BROWSER_IDLE, self.browser_idle_seconds),
            (&TURN_CREDENTIAL_TTL, self.turn.credential_ttl_seconds),
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
            (&WORKER_PREIMPORT_IDLE, self.prepare.preimport_idle_seconds),
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
