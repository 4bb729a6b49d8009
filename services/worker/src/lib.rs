//! The worker's jail: runs one piece of untrusted code per run in fresh namespaces, bounds it,
//! collects its downloads and resets with evidence (ISO-1, POOL-4, BOUND-1, WS-6, OUT-4).
//!
//! What it owns: building the jail, enforcing the bounds the settings name, measuring what the
//! run did and what the reset left behind. What it must never do: decide. Which language runs,
//! which posture is acceptable, which bound was hit, which files are downloads, whether a document
//! is valid and whether a reset is clean are all `corral_core` decisions (`jail`, `downloads`,
//! `reset`); this crate measures and asks. It also never runs code outside a jail, never hands the
//! code a credential (a run's egress grant stays in the supervisor), and never reuses a jail
//! across runs.
//!
//! The jail, per run (see `stage` for the order of steps inside it):
//! - the supervisor (this process, root) creates a run directory in its own private mount
//!   namespace, with a size-bounded tmpfs for the workspace and one for /tmp and /dev/shm, and a
//!   cgroup (v1 `memory` and `pids`) for the run;
//! - it re-executes its own binary as stage 1, which creates new user, mount, network, IPC, UTS
//!   and pid namespaces; the supervisor writes the user namespace's id maps (the run's root and
//!   its unprivileged user map to two host uids no one else uses);
//! - stage 1 brings loopback up and starts stage 2, pid 1 of the new pid namespace, which builds a
//!   read-only root (system directories bound read-only, a synthesized /etc, minimal /dev, a fresh
//!   /proc, the workspace, /tmp and /dev/shm), pivots into it, drops to the unprivileged user,
//!   applies rlimits, `PR_SET_NO_NEW_PRIVS` and a seccomp filter, and starts the interpreter;
//! - when the interpreter exits, pid 1 exits and the kernel kills everything left in the pid
//!   namespace. At the wall limit the supervisor kills stage 1, every process in the run's cgroup
//!   and every process of the run's uids.
//!
//! A warm worker (`corral worker serve`) keeps the next run's jail prepared, one per language of
//! `CORRAL_WORKER_PREPARE_LANGUAGES`: built exactly as above, but the interpreter it starts is a
//! small bootstrap that blocks reading the program from its stdin, a pipe only the supervisor
//! writes (Python's first imports `CORRAL_WORKER_PYTHON_PREIMPORT`). A run that takes the one of
//! its language copies the workspace in, writes the code down the pipe and closes it (the wall
//! limit counts from there), and is then supervised, collected and reset like any other; the jail
//! serves that one run. The reset between leases kills everything else of the supervisor's runs
//! and keeps the untaken ones whose interpreter still waits with an empty workspace: no run has
//! reached them (their own namespaces, uids, cgroups and directories), and building them again
//! would only cost the next tenant; the jails the last run took are prepared after it (see
//! docs/decisions/0010 and 0060). `corral jail run` never prepares one.
//!
//! The network namespace has only loopback, where the supervisor holds the egress relay (`relay`,
//! EGR-8): before stage 1 is let go, a short-lived supervisor thread joins the jail's network
//! namespace, brings loopback up and binds 127.0.0.1:3128 there; the socket stays in that
//! namespace, and the code's `HTTP_PROXY`, `HTTPS_PROXY`, `http_proxy`, `https_proxy` and
//! `ALL_PROXY` name it. Each connection is carried, from the supervisor's own namespace, to
//! `SANDBOX_EGRESS_PROXY_URL` with `Proxy-Authorization: Bearer <the run's grant>` added by the
//! relay, so the grant is never in the jail; with no grant (or no proxy) every connection gets
//! 407 `grant_missing` and the proxy is never contacted. A prepared jail's relay listens from its
//! preparation and gets the grant when a run takes it; the relay closes, with every connection,
//! at the run's reset. See docs/decisions/0008.
//!
//! Around the jail: `archive` unpacks the workspace archive a run is handed (every entry judged by
//! `corral_core::workspace` before it is written, moved into place only whole) and packs the
//! workspace after it; `serve` is the authenticated control API (`corral worker serve`) that runs
//! one execution or reset at a time on the one [`Worker`].
//!
//! No `unsafe`: the namespace, mount and credential calls are `nix`'s safe wrappers, and every
//! step that must happen in a new process happens in a re-executed copy of this binary rather
//! than between `fork` and `exec`.

pub mod archive;
pub mod cli;
pub mod serve;

/// The jail's per-run cgroups, for a harness that must leave none behind (corral-chaos).
pub use cgroup::{remove_stale as remove_stale_run_groups, run_groups};

mod capture;
mod cgroup;
mod probe;
mod relay;
mod result;
mod supervisor;
mod sweep;
mod tools;
mod trace;
mod workspace;

pub use result::RunResult;
pub use supervisor::{RUNTIME_PROGRAMS, Reexec, RunRequest, STAGE_BINARY, STAGE_BUILD, Worker};
