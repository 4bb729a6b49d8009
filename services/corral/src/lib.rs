//! The `corral` binary's command line, as a library so that its tests can render every
//! subcommand's help from the one definition (the binary is `src/main.rs`).

pub mod cli;
