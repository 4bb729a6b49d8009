//! The allocation rules: a pure transition over one pool's shared document.
//!
//! The document ([`PoolDoc`]) is the whole shared state of one pool: workers with their state and
//! operation token, the FIFO ticket queue, the published worker image and the inventory's last word.
//! Every change is [`PoolDoc::apply`]`(command, now, config)`, which returns the effects to perform
//! and the events to report, and asserts [`PoolDoc::invariants`] before it returns.
//!
//! Calling contract (for the store shells and the simulator):
//! 1. Load the document and its version from the store; read `now` from the deployment's clock.
//! 2. `apply` the command to a copy, then compare-and-set it against the version you loaded.
//! 3. Only after the write is acknowledged, perform every effect (each carries its operation token)
//!    and deliver every event. On a conflict, start again from 1. On an unknown outcome, apply the
//!    same command again: every command is idempotent (tickets are the caller's ids, reports carry
//!    tokens), and a repeated command re-issues the effects it is owed.
//! 4. Report each effect's outcome with its own command (`CreateReported`, `ResetReported`,
//!    `DeleteReported`) carrying the token of the effect.
//!
//! Timers are deadlines stored in the document and fired by [`Command::Tick`], which only the
//! controller sends. Nothing here reads a clock.

mod apply;
mod config;
mod dispatch;
mod doc;
mod invariants;
mod lease;
mod query;
mod report;
mod state;
mod tick;

pub use config::*;
pub use doc::*;

#[cfg(test)]
mod tests;
