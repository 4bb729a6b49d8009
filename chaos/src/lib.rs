//! Chaos on real processes (issue 27).
//!
//! [`history`] is what the load's clients record: every operation with its monotonic start and
//! end and what it was told, the pool's observed state, and the faults injected. [`check`] reads
//! a history and finds every violation of the rules the deployment promises under faults, each
//! printed with the operations involved. [`harness`] starts the deployment from the real binaries
//! ([`deploy`], with the far side of its egress, [`egress`]), drives the load ([`load`]), injects the faults from one seed ([`faults`]), and
//! leaves nothing behind ([`hygiene`]).

pub mod check;
pub mod clock;
pub mod deploy;
pub mod egress;
pub mod faults;
pub mod harness;
pub mod history;
pub mod hygiene;
pub mod link;
pub mod load;
pub mod rng;
