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

/// A component's timer kinds: a small enum whose variants number themselves `0..COUNT`.
pub trait TimerKind: Copy + 'static {
    /// Every kind, in order of their numbers.
    const ALL: &'static [Self];
    /// This kind's number, below `ALL.len()`.
    fn index(self) -> usize;
}

/// A deadline table (STYLE.md item 5): at most one deadline per timer kind `K` of a component
/// with `N` kinds. Timers are data; the component fires every expired one and re-arms or clears
/// each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deadlines<K, const N: usize> {
    at: [Option<MonoMillis>; N],
    kind: core::marker::PhantomData<K>,
}

impl<K: TimerKind, const N: usize> Default for Deadlines<K, N> {
    fn default() -> Self {
        assert_eq!(K::ALL.len(), N, "one deadline per timer kind");
        Self {
            at: [None; N],
            kind: core::marker::PhantomData,
        }
    }
}

impl<K: TimerKind, const N: usize> Deadlines<K, N> {
    /// When `kind` fires, if it is armed.
    #[must_use]
    pub fn get(&self, kind: K) -> Option<MonoMillis> {
        self.at[kind.index()]
    }

    /// Arms `kind` for `at`, or clears it with `None`.
    pub fn set(&mut self, kind: K, at: Option<MonoMillis>) {
        self.at[kind.index()] = at;
    }

    /// The earliest deadline armed.
    #[must_use]
    pub fn earliest(&self) -> Option<MonoMillis> {
        self.at.iter().flatten().min().copied()
    }

    /// The kinds due at `now`, each cleared (the caller re-arms what repeats).
    pub fn take_due(&mut self, now: MonoMillis) -> Vec<K> {
        let due: Vec<K> = K::ALL
            .iter()
            .copied()
            .filter(|kind| self.get(*kind).is_some_and(|at| at <= now))
            .collect();
        for kind in &due {
            self.set(*kind, None);
        }
        due
    }
}
