//! Chaos on real processes (issue 27).
//!
//! [`history`] is what the load's clients record: every operation with its monotonic start and
//! end and what it was told, the pool's observed state, and the faults injected. [`check`] reads
//! a history and finds every violation of the rules the deployment promises under faults, each
//! printed with the operations involved. The binary (`corral-chaos`, `just chaos`) starts the
//! deployment from the real binaries, drives the load, injects the faults from one seed, and
//! checks the history it recorded.

pub mod check;
pub mod history;
pub mod rng;
