//! `corral`: one binary, one subcommand per service or operator tool.

use std::process::ExitCode;

mod config_cmd;

const USAGE: &str = "usage: corral <command> [args]

commands:
  config check     parse every setting from the environment and print the result, or the error
  config docs      print the table of every setting (name, default, requirement, meaning) in Markdown
  jail run         run one file in a fresh jail and print the result as JSON (see `corral jail help`)
  jail probe       print which isolation primitives this machine offers
  worker serve     the worker's authenticated control API (see `corral worker help`)
  help             this text
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    match command.as_str() {
        "config" => config_cmd::run(rest),
        // `["jail"]` re-executes this binary into the jail's hidden stages.
        "jail" => corral_worker::cli::main(rest, &["jail"]),
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
