//! Time is an input, and it comes in two kinds that never mix.
//!
//! - [`UnixMillis`]: deployment time, milliseconds since the Unix epoch on the deployment's one clock
//!   (Valkey's `TIME`). Deadlines stored in shared state use it, never a replica's own clock.
//! - [`MonoMillis`]: a component's own monotonic instant, for its local timers. Never stored in
//!   shared state.

use std::fmt;

/// Deployment time in milliseconds since the Unix epoch, read from the deployment's one clock.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// This time plus `ms`, saturating.
    #[must_use]
    pub fn plus_ms(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, or zero when `earlier` is later.
    #[must_use]
    pub fn ms_since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A component's monotonic instant in milliseconds from an arbitrary origin; local timers only.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct MonoMillis(pub u64);

impl MonoMillis {
    /// This instant plus `ms`, saturating.
    #[must_use]
    pub fn plus_ms(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }
}
