//! `corral egress …`: operator tools for egress. The logic lives in `corral-egress-proxy`.

use std::io::Write as _;
use std::process::ExitCode;

const USAGE: &str = "usage: corral egress decide [flags] TARGET   (corral egress decide --help)";

/// Runs `corral egress <args>`.
pub fn run(args: &[String]) -> ExitCode {
    match args.first().map(String::as_str) {
        Some("decide") => {
            let out = corral_egress_proxy::decide_cli::run(&args[1..]);
            // A closed stdout or stderr leaves nothing better to do than the exit status.
            let _ = std::io::stdout().lock().write_all(out.stdout.as_bytes());
            let _ = std::io::stderr().lock().write_all(out.stderr.as_bytes());
            ExitCode::from(out.exit_code)
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
