//! Corral's egress proxy: a thin tokio shell around [`corral_core::egress`] (EGR-1 to EGR-9).
//!
//! What it owns: reading HTTP/1.x proxy requests within bounds, verifying the grant on every
//! request, resolving names itself (fully qualified, uncached, BROW-4), dialing exactly the
//! address the core pinned, tunnelling, and saying why it refused. What it must never do: decide
//! anything itself. Every predicate (target syntax, address classes, the answer-set rule, grant
//! validity) is the core's; this crate only feeds the core what it observed.
//!
//! Modules:
//! - [`judge`]: the one pipeline from request target to verdict, shared by the proxy and
//!   [`decide_cli`] (`corral egress decide`).
//! - [`dns`]: the proxy's resolver and the decide tool's answer table.
//! - [`refusal`]: shell-observed refusal codes and HTTP statuses.
//! - [`json`]: a tiny JSON writer for output and log lines.

pub mod decide_cli;
pub mod dns;
pub mod json;
pub mod judge;
pub mod refusal;
