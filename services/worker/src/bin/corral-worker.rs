//! `corral-worker`: the same entry points as `corral worker` and `corral jail`, so that this
//! package's end-to-end tests can run the control API. Operators use `corral worker serve`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        // `["jail"]` re-executes this binary into the jail's stages, routed below.
        Some("serve") => corral_worker::serve::main(&args, &["jail"]),
        Some("jail") => corral_worker::cli::main(&args[1..], &["jail"]),
        _ => {
            eprint!("{}", corral_worker::serve::USAGE);
            ExitCode::from(2)
        }
    }
}
