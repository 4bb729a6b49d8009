//! `corral config check`: parse the settings from this process's environment.

use std::process::ExitCode;

pub fn run(args: &[String]) -> ExitCode {
    match args.first().map(String::as_str) {
        Some("check") => {
            println!("config: (settings parser lands with corral-core::config)");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: corral config check");
            ExitCode::from(2)
        }
    }
}
