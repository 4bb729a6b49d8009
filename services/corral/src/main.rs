//! `corral`: one binary, one subcommand per service or operator tool. The command line is
//! [`corral::cli`]; each subcommand's work is in its `*_cmd` module.

use std::process::ExitCode;

use clap::Parser as _;
use corral::cli::{Cli, Command, EgressCommand};

mod api_cmd;
mod config_cmd;
mod controller_cmd;
mod egress_cmd;
mod health;
mod logging;
mod mcp_cmd;
mod network_policy_cmd;
mod resources_cmd;
mod run_cmd;
mod stack;
mod turn_server;
mod up_cmd;

fn main() -> ExitCode {
    // Lossy, never a panic: a non-UTF-8 argument becomes U+FFFD, which every parser refuses
    // (a TARGET with it is denied as non-ASCII).
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    // Before the parser: the jail's hidden stages this binary re-executes itself into, and
    // `egress decide`, whose every refusal is its one JSON object on stdout.
    match args.split_first() {
        Some((command, rest)) if command == "jail" => {
            if let Some(code) = corral_worker::cli::hidden_stage(rest) {
                return code;
            }
        }
        Some((command, [decide, rest @ ..])) if command == "egress" && decide == "decide" => {
            return egress_cmd::decide(rest);
        }
        _ => {}
    }
    let cli = Cli::parse_from(std::iter::once("corral".to_owned()).chain(args));
    // The services log (and trace) through `tracing`; the operator tools print for a person.
    let service = match &cli.command {
        Command::Up(_) => Some("corral"),
        Command::Api => Some("corral-api"),
        Command::Controller(_) => Some("corral-controller"),
        Command::Worker(_) => Some("corral-worker"),
        Command::EgressProxy => Some("corral-egress-proxy"),
        Command::Mcp(_) => Some("corral-mcp"),
        _ => None,
    };
    if let Some(service) = service
        && let Err(why) = logging::init(service)
    {
        eprintln!("corral: {why}");
        return ExitCode::from(2);
    }
    let code = run(cli.command);
    logging::shutdown();
    code
}

fn run(command: Command) -> ExitCode {
    match command {
        Command::Up(args) => up_cmd::run(args),
        Command::Run(args) => run_cmd::run(args),
        Command::Mcp(args) => mcp_cmd::run(args),
        Command::Api => api_cmd::run(),
        Command::Controller(args) => controller_cmd::run(args),
        // `["jail"]` re-executes this binary into the jail's hidden stages.
        Command::Worker(command) => corral_worker::serve::run_command(command, &["jail"]),
        Command::EgressProxy => corral_egress_proxy::run::main_from_env(),
        Command::Egress(EgressCommand::Decide(args)) => egress_cmd::decide_parsed(args),
        Command::Jail(command) => corral_worker::cli::run_command(command, &["jail"]),
        Command::Resources(args) => resources_cmd::run(args),
        Command::Config(command) => config_cmd::run(command),
    }
}
