//! `corral-jail`: the same entry point as `corral jail`, so that this package's end-to-end tests
//! can run it. Operators use `corral jail`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    corral_worker::cli::main(&args, &[])
}
