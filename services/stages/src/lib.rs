//! The jail's re-executed stages, and what the supervisor shares with them: the plan, the line
//! protocol, the mount table's reader and the loopback's netlink request.
//!
//! A worker's supervisor executes `corral-stage` (or, without it, its own binary) twice for each
//! jail: stage 1 creates the namespaces, stage 2 builds the filesystem, drops every privilege,
//! applies the limits and the seccomp filter and starts the interpreter (see `stage` for the order
//! of steps). This crate is apart from the rest of the worker (`corral-worker`) so that the stage
//! binary links only what the stages run: each link of everything else (the control API, the live
//! view's encoder and the C++ runtime it brings) was loaded and relocated twice per run
//! (decision 0059).
//!
//! No `unsafe`: every step that must happen in a new process happens in a re-executed copy of the
//! binary rather than between `fork` and `exec`, through `nix`'s safe wrappers.

use std::process::ExitCode;

pub mod mounts;
pub mod netlink;
pub mod plan;
mod seccomp;
mod stage;

/// This build's identity, which a stage binary must print for `__build` to be used: a digest of
/// the sources the stages are built from (`build.rs`).
pub const BUILD: &str = env!("CORRAL_STAGE_BUILD");

/// Runs the jail's hidden stage that `args` name (`__stage1 PLAN`, `__stage2 PLAN`, `__probe`;
/// `__build` prints [`BUILD`]); `None` for any other arguments. Matched exactly, before any
/// command line's parser, and never in its help: they are not for people.
#[must_use]
pub fn hidden_stage(args: &[String]) -> Option<ExitCode> {
    match args {
        [name, plan] if name == "__stage1" => Some(stage::stage1(plan)),
        [name, plan] if name == "__stage2" => Some(stage::stage2(plan)),
        [name] if name == "__probe" => Some(stage::probe()),
        [name] if name == "__build" => {
            println!("{BUILD}");
            Some(ExitCode::SUCCESS)
        }
        _ => None,
    }
}

/// `corral-stage`: the small binary that runs only the jail's hidden stages (decision 0057), so
/// that a jail does not execute all of Corral twice. Anything else is refused.
#[must_use]
pub fn stage_main(args: &[String]) -> ExitCode {
    hidden_stage(args).unwrap_or_else(|| {
        eprintln!(
            "corral-stage: runs only the jail's stages, started by a worker's supervisor; \
             use `corral jail` or `corral worker`"
        );
        ExitCode::from(2)
    })
}
