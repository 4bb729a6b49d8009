//! Corral's sans-IO core: every allocation rule and every security decision, defined once.
//!
//! This crate owns the rules; it never performs them. It has no I/O, no async, no clock, no ambient
//! randomness, no threads and no unordered iteration (see `clippy.toml` beside this crate, which CI
//! enforces with warnings as errors). Time, randomness and observations of the world are inputs;
//! effects to perform are outputs. The production shells, the simulator and the tests all drive the
//! same code, so a bug the simulator finds is a bug in what ships.
//!
//! Modules:
//! - [`bounds`]: the bounds of one run: ceilings, lower overrides, which were hit, output caps.
//! - [`config`]: every setting, its default, fail-closed parsing.
//! - [`downloads`]: which files a run returns, and document verification (OUT-4).
//! - [`egress`]: the one egress decision (modes, address classes, target parsing) and signed grants.
//! - [`holder`]: the lease holder, a state machine that owns one lease from grant to release.
//! - [`jail`]: the rules of one run: languages, refusals, isolation posture, bounds, output caps.
//! - [`packages`]: requested packages, the baked stack, what a run's dependencies need, the broker's rules.
//! - [`pool`]: the allocation rules, a pure transition over one pool's shared document.
//! - [`reconcile`]: the controller's reconciler, a state machine that orders each pass.
//! - [`run`]: one `run_code`, decided: admission, and the outcome of what the worker reported.
//! - [`reset`]: the evidence a worker returns after a reset, and its one judge.
//! - [`store`]: the contract of the store that holds the pool document (Valkey in production).
//! - [`workspace`]: the judge of every entry of a workspace archive (paths, kinds, the bound).
//! - [`time`]: the two kinds of time, never mixed.
//! - [`ids`]: identities shared across modules.
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]
#![warn(missing_docs)]

/// Puts a code enum on the wire as its stable code: `wire_code!(Type, method, "what it is")`
/// serializes a value as `value.method()` and reads back the one of `Type::ALL` whose
/// `method()` is the text, refusing any other text. The crate using it depends on `serde`.
#[macro_export]
macro_rules! wire_code {
    ($ty:ty, $method:ident, $what:literal) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.$method())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                <$ty>::ALL
                    .into_iter()
                    .find(|value| value.$method() == text)
                    .ok_or_else(|| {
                        serde::de::Error::custom(format!(concat!("not ", $what, ": {:?}"), text))
                    })
            }
        }
    };
}

pub mod bounds;
pub mod browser;
pub mod config;
pub mod downloads;
pub mod egress;
pub mod hashline;
pub mod holder;
pub mod ids;
pub mod jail;
pub mod kernel;
pub mod packages;
pub mod pi;
pub mod pool;
pub mod projection;
pub mod reconcile;
pub mod reset;
pub mod run;
pub mod store;
pub mod time;
pub mod tools;
pub mod workspace;
