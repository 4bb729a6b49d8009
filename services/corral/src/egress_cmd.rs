//! `corral egress …`: operator tools for egress. The logic lives in `corral-egress-proxy`.

use std::io::Write as _;
use std::process::ExitCode;

use corral_egress_proxy::decide_cli::{self, DecideArgs, DecideOutput};

/// Runs `corral egress decide <args>`: its own parser maps every refusal onto its one JSON
/// object (exit 2), which the conformance suites read.
pub fn decide(args: &[String]) -> ExitCode {
    print(decide_cli::run(args))
}

/// Runs `corral egress decide` with arguments the `corral` parser already took.
pub fn decide_parsed(args: DecideArgs) -> ExitCode {
    print(decide_cli::run_parsed(&args))
}

fn print(out: DecideOutput) -> ExitCode {
    // A closed stdout or stderr leaves nothing better to do than the exit status.
    let _ = std::io::stdout().lock().write_all(out.stdout.as_bytes());
    let _ = std::io::stderr().lock().write_all(out.stderr.as_bytes());
    ExitCode::from(out.exit_code)
}
