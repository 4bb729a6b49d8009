//! One `run_code`, decided (ISO-1, WS-6, WS-7, OUT-1 to OUT-4, PKG-6, KER-1, BOUND-1).
//!
//! The API performs a run; every judgement on it is made here, as pure functions:
//! - [`admission`]: what a request may ask. Identity, the language (parsed once, into
//!   [`crate::jail::Language`]), the code's size, the bound overrides, the declared outputs, the
//!   kernel and the wait. A request is admitted, refused with a stable code, or answered with a
//!   `not_run` record before any lease is taken.
//! - [`outcome`]: what a run that reached a worker means. The worker's reply and the result of
//!   keeping the workspace and the outputs go in; the outcome, the error, the references and the
//!   model's and the member's projections come out.
//!
//! - [`sequence`]: the order of a run's steps, as a machine the shell performs: `admit` → the
//!   turn's scope → lease → inputs → projection → execute on the worker → [`outcome::plan`] →
//!   keep what the plan says (outputs, then the workspace) → [`outcome::decide`] → link → release
//!   → answer, with what each failed step leaves.

pub mod admission;
pub mod compress;
pub mod outcome;
pub mod progress;
pub mod results;
pub mod sequence;
