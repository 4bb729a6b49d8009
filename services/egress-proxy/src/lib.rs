//! Corral's egress proxy: a thin tokio shell around [`corral_core::egress`] (EGR-1 to EGR-9).
//!
//! What it owns: reading HTTP/1.x proxy requests within bounds, verifying the grant on every
//! request, resolving names itself (fully qualified, uncached, BROW-4), dialing exactly the
//! address the core pinned, tunnelling, and saying why it refused. What it must never do: decide
//! anything itself. Every predicate (target syntax, address classes, the answer-set rule, grant
//! validity) is the core's; this crate only feeds the core what it observed. It holds the
//! verifying key only and can never mint a grant.
//!
//! Modules:
//! - [`proxy`]: the server (`corral egress-proxy`), one task per connection; [`run`] starts it.
//! - [`judge`]: the one pipeline from request target to verdict, shared by the proxy and
//!   [`decide_cli`] (`corral egress decide`).
//! - [`dns`]: the proxy's resolver and the decide tool's answer table.
//! - [`key`]: the verifying key, re-read when it changes (EGR-9); [`grants`]: verified grants
//!   kept by exact token and key, their time re-checked by the core on every use.
//! - [`http`], [`tunnel`]: bounded request heads, refusals, the tunnel and the plain-HTTP relay.
//! - [`config`]: the proxy's operational settings.
//! - [`observe`]: one JSON log line and one counter per decision.
//! - [`refusal`]: shell-observed refusal codes and HTTP statuses.
//! - [`json`]: a tiny JSON writer for output and log lines.

//!
//! Decisions (each tested; change them deliberately):
//! - NXDOMAIN is an empty answer to the core (`dns_empty_answer`, 502), in the proxy and in
//!   `decide`; a name server error is `dns_lookup_failed` (502) and no answer in time is
//!   `dns_timeout` (504). A failure of either the A or the AAAA query fails the lookup: the
//!   decision is made over the complete answer set or not at all.
//! - The answer set is the A records then the AAAA records, each in the order received; the core
//!   pins its first address. `decide --answer` keeps the order given.
//! - Requests are judged in this order: the grant (407), the target and `Host` (403), the body
//!   framing (400), the policy and DNS (403/502/504), the upstream connection (502/504).
//! - One request per client connection for plain HTTP (`Connection: close` upstream, exactly one
//!   checked body forwarded, nothing read after it), so every request is verified and judged,
//!   and a pipelined request can never ride on an allowed one.
//! - Verified grants are kept by exact token and verifying key ([`grants`]); their time is
//!   re-checked by the core on every use and a key change empties the store.
//! - Tunnels use splice(2) through a kernel pipe per direction (no user-space copy, and no
//!   64 KiB buffers touched per idle tunnel); copying is the fallback.
//! - One serving thread per core, each a single-threaded runtime with its own `SO_REUSEPORT`
//!   socket on the listen address, so a connection never changes thread ([`run`]);
//!   `TOKIO_WORKER_THREADS` sets how many (decision 0054).

pub mod config;
pub mod decide_cli;
pub mod dns;
pub mod grants;
pub mod http;
pub mod json;
pub mod judge;
pub mod key;
pub mod observe;
pub mod proxy;
pub mod refusal;
pub mod run;
pub mod tunnel;
