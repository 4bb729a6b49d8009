//! Corral's sans-IO core: every allocation rule and every security decision, defined once.
//!
//! This crate owns the rules; it never performs them. It has no I/O, no async, no clock, no ambient
//! randomness, no threads and no unordered iteration (see `clippy.toml` beside this crate, which CI
//! enforces with warnings as errors). Time, randomness and observations of the world are inputs;
//! effects to perform are outputs. The production shells, the simulator and the tests all drive the
//! same code, so a bug the simulator finds is a bug in what ships.
//!
//! Modules:
//! - [`config`]: every setting, its default, fail-closed parsing.
//! - [`downloads`]: which files a run returns, and document verification (OUT-4).
//! - [`egress`]: the one egress decision (modes, address classes, target parsing) and signed grants.
//! - [`holder`]: the lease holder, a state machine that owns one lease from grant to release.
//! - [`jail`]: the rules of one run: languages, refusals, isolation posture, bounds, output caps.
//! - [`pool`]: the allocation rules, a pure transition over one pool's shared document.
//! - [`reconcile`]: the controller's reconciler, a state machine that orders each pass.
//! - [`reset`]: the evidence a worker returns after a reset, and its one judge.
//! - [`store`]: the contract of the store that holds the pool document (Valkey in production).
//! - [`workspace`]: the judge of every entry of a workspace archive (paths, kinds, the bound).
//! - [`time`]: the two kinds of time, never mixed.
//! - [`ids`]: identities shared across modules.
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]
#![warn(missing_docs)]

pub mod config;
pub mod downloads;
pub mod egress;
pub mod holder;
pub mod ids;
pub mod jail;
pub mod pool;
pub mod reconcile;
pub mod reset;
pub mod store;
pub mod time;
pub mod workspace;
