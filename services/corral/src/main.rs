//! `corral`: one binary, one subcommand per service or operator tool.

use std::process::ExitCode;

mod api_cmd;
mod config_cmd;
mod controller_cmd;
mod egress_cmd;
mod resources_cmd;
mod run_cmd;
mod stack;
mod turn_server;
mod up_cmd;

const USAGE: &str = "usage: corral <command> [args]

commands:
  config check     parse every setting from the environment and print the result, or the error
  config docs      print the table of every setting (name, default, requirement, meaning) in Markdown
  jail run         run one file in a fresh jail and print the result as JSON (see `corral jail help`)
  jail probe       print which isolation primitives this machine offers
  egress decide    judge one egress target offline, as the proxy would (JSON on stdout)
  egress-proxy     run the egress proxy (settings from the environment; see corral-egress-proxy)
  worker serve     the worker's authenticated control API (see `corral worker help`)
  controller       keep the warm pool with local worker processes (--valkey URL; see the crate docs)
  up               the embedded default: Valkey, API, controller, warm pool, egress proxy (see `corral up --help`)
  run FILE         run one file through the API and print the result (`corral run --help`)
  api              the API service (settings from the environment)
  resources        administer the embedded resource authority (`corral resources --help`)
  help             this text
";

fn main() -> ExitCode {
    // Lossy, never a panic: a non-UTF-8 argument becomes U+FFFD, which every parser refuses
    // (a TARGET with it is denied as non-ASCII).
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let Some(command) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    match command.as_str() {
        "api" => api_cmd::run(rest),
        "config" => config_cmd::run(rest),
        "resources" => resources_cmd::run(rest),
        "run" => run_cmd::run(rest),
        "up" => up_cmd::run(rest),
        "controller" => controller_cmd::run(rest),
        // `["jail"]` re-executes this binary into the jail's hidden stages.
        "jail" => corral_worker::cli::main(rest, &["jail"]),
        "egress" => egress_cmd::run(rest),
        "egress-proxy" => corral_egress_proxy::run::main_from_env(),
        "worker" => corral_worker::serve::main(rest, &["jail"]),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("corral: unknown command {other:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
