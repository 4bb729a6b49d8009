//! `corral-stage`: the jail's stages only (decision 0057). A worker's supervisor executes it for
//! each stage of each jail when it sits beside `corral` and is of the same build; without it the
//! supervisor executes `corral` itself, which is slower (all of Corral is loaded twice a jail).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    corral_stages::stage_main(&args)
}
