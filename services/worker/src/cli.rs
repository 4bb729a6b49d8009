//! `corral jail`: run one file in the jail, for operators and tests, and the hidden entry points
//! of the jail's re-executed stages.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use corral_core::config::Settings;
use corral_core::ids::OpToken;
use corral_core::jail::{Language, NotRun};

use crate::supervisor::{Reexec, RunRequest, Worker, refusal_text};

/// Where `corral jail`'s settings come from, shown under its help.
const SETTINGS_NOTE: &str =
    "Settings come from the environment (SANDBOX_*, CORRAL_JAIL_*); see `corral config check`.";

/// `corral jail`'s commands (the hidden stages are not among them: see [`hidden_stage`]).
#[derive(Subcommand)]
pub enum JailCommand {
    /// Run FILE in a fresh jail and print the result as one JSON object
    ///
    /// The object has exit_code, stdout, stderr, bound, downloads, not_run and reset_evidence
    /// (with bounds, isolation, diagnostics, durations). Exit status 0 when the code ran
    /// (whatever its own exit code), 3 when it was not run, 2 for unusable arguments or settings.
    #[command(after_help = SETTINGS_NOTE)]
    Run(RunArgs),
    /// Print which isolation primitives this machine offers, as JSON
    #[command(after_help = SETTINGS_NOTE)]
    Probe,
}

/// The arguments of `corral jail run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The language of FILE, python or node (any other is refused as not run, exit 3)
    #[arg(long, value_name = "python|node")]
    language: String,
    /// The code sees a copy of DIR's files; validated downloads are copied back
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// The wall limit for this run, in place of SANDBOX_MAX_WALL_SECONDS
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    wall_seconds: Option<u64>,
    /// The run's egress grant, which the jail's relay adds to every connection it carries to
    /// SANDBOX_EGRESS_PROXY_URL (without one it refuses them all)
    #[arg(long, value_name = "FILE")]
    grant_file: Option<PathBuf>,
    /// The file to run
    file: PathBuf,
}

/// `corral jail` on its own (the `corral-jail` binary); `corral` embeds [`JailCommand`].
#[derive(Parser)]
#[command(name = "jail", bin_name = "corral jail", version, after_help = SETTINGS_NOTE)]
#[command(args_override_self = true)]
#[command(about = "Run one file in a fresh jail, or probe this machine's isolation")]
struct JailCli {
    #[command(subcommand)]
    command: JailCommand,
}

const EXIT_RAN: u8 = 0;
const EXIT_USAGE: u8 = 2;
const EXIT_NOT_RUN: u8 = 3;

/// Runs `corral jail <args>` (the hidden stages included). `prefix` is what re-executes this
/// binary into `jail` (`["jail"]` for `corral`, empty for `corral-jail`).
pub fn main(args: &[String], prefix: &[&str]) -> ExitCode {
    if let Some(code) = hidden_stage(args) {
        return code;
    }
    let cli = JailCli::parse_from(std::iter::once("jail").chain(args.iter().map(String::as_str)));
    run_command(cli.command, prefix)
}

/// Runs the jail's hidden stage that `args` name, which this binary re-executes itself into
/// (`corral_stages::hidden_stage`); `None` for any other arguments.
#[must_use]
pub fn hidden_stage(args: &[String]) -> Option<ExitCode> {
    corral_stages::hidden_stage(args)
}

/// Runs one parsed `corral jail` command.
pub fn run_command(command: JailCommand, prefix: &[&str]) -> ExitCode {
    match command {
        JailCommand::Run(args) => run(args, prefix),
        JailCommand::Probe => probe(prefix),
    }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("corral jail: {message}");
    ExitCode::from(EXIT_USAGE)
}

fn settings() -> Result<Settings, ExitCode> {
    Settings::from_lookup(|name| std::env::var(name).ok()).map_err(|error| {
        eprintln!("corral jail: {error}");
        ExitCode::from(EXIT_USAGE)
    })
}

/// Reads at most `max_bytes + 1` bytes of `path`, so that an oversized file is seen as such
/// without reading it whole.
fn read_code(path: &PathBuf, max_bytes: u64) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if file.metadata().is_ok_and(|meta| meta.is_dir()) {
        return Err(format!("{} is a directory", path.display()));
    }
    let mut code = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut code)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(code)
}

/// Reads a grant file: its one token, surrounding whitespace (a final newline) not part of it.
fn read_grant(path: &PathBuf) -> Result<String, String> {
    let max_bytes = corral_contract::limits::GRANT_MAX_BYTES as u64;
    let raw = read_code(path, max_bytes)?;
    let grant = String::from_utf8(raw)
        .map_err(|_| format!("--grant-file {}: not UTF-8", path.display()))?;
    let grant = grant.trim();
    if grant.len() as u64 > max_bytes || !corral_core::egress::grant::grant_is_sendable(grant) {
        return Err(format!(
            "--grant-file {}: expected one token of printable ASCII, at most {max_bytes} bytes",
            path.display()
        ));
    }
    Ok(grant.to_owned())
}

fn run(args: RunArgs, prefix: &[&str]) -> ExitCode {
    let settings = match settings() {
        Ok(settings) => settings,
        Err(code) => return code,
    };
    let code = match read_code(&args.file, settings.bounds.workspace_max_bytes) {
        Ok(code) => code,
        Err(message) => return usage_error(&message),
    };
    if let Some(dir) = &args.workspace
        && !std::fs::symlink_metadata(dir).is_ok_and(|meta| meta.is_dir())
    {
        return usage_error(&format!("--workspace {}: not a directory", dir.display()));
    }
    let grant = match args.grant_file.as_ref().map(read_grant).transpose() {
        Ok(grant) => grant,
        Err(message) => return usage_error(&message),
    };
    let mut worker = Worker::start(settings, Reexec::for_stages(prefix));
    let result = match Language::parse(&args.language) {
        Ok(language) => worker.run(&RunRequest {
            language,
            code,
            workspace: args.workspace,
            wall_seconds: args.wall_seconds,
            declared: Vec::new(),
            token: OpToken(0),
            bounds: None,
            pack_workspace: false,
            grant,
            install: None,
            kernel: None,
            tools: None,
            resources: None,
            tap: None,
        }),
        Err(refused) => {
            eprintln!("corral jail: {refused}");
            worker.refuse(refused.code, OpToken(0))
        }
    };
    let reply = result.reply;
    if reply.not_run == Some(NotRun::IsolationUnavailable) {
        eprintln!("{}", refusal_text(&reply.isolation, &reply.diagnostics));
    }
    match serde_json::to_string(&reply) {
        Ok(json) => println!("{json}"),
        Err(error) => {
            eprintln!("corral jail: cannot encode the result: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    ExitCode::from(if reply.not_run.is_some() {
        EXIT_NOT_RUN
    } else {
        EXIT_RAN
    })
}

fn probe(prefix: &[&str]) -> ExitCode {
    let settings = match settings() {
        Ok(settings) => settings,
        Err(code) => return code,
    };
    let worker = Worker::start(settings, Reexec::for_stages(prefix));
    let missing: serde_json::Map<String, serde_json::Value> = worker
        .missing()
        .into_iter()
        .map(|(name, why)| (name.to_owned(), serde_json::Value::String(why)))
        .collect();
    let posture = match worker.posture() {
        Ok(corral_core::jail::Posture::Full) => "full",
        Ok(corral_core::jail::Posture::Weaker { .. }) => "weaker",
        Err(_) => "refused",
    };
    println!(
        "{}",
        serde_json::json!({ "posture": posture, "missing": missing })
    );
    ExitCode::from(if posture == "refused" {
        EXIT_NOT_RUN
    } else {
        EXIT_RAN
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    fn parse_run(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let args = ["jail", "run"].iter().chain(args);
        match JailCli::try_parse_from(args)?.command {
            JailCommand::Run(args) => Ok(args),
            JailCommand::Probe => unreachable!("parsed `run`"),
        }
    }

    #[test]
    fn run_arguments() {
        let parsed = parse_run(&["--language", "python", "--wall-seconds=5", "x.py"]).unwrap();
        assert_eq!(
            (parsed.language.as_str(), parsed.wall_seconds),
            ("python", Some(5))
        );
        assert_eq!(parsed.file, PathBuf::from("x.py"));
        assert_eq!(parsed.grant_file, None);
        let parsed = parse_run(&["--language", "python", "--grant-file", "g", "x.py"]).unwrap();
        assert_eq!(parsed.grant_file, Some(PathBuf::from("g")));
        let parsed = parse_run(&["--language", "node", "--", "-x.js"]).unwrap();
        assert_eq!(parsed.file, PathBuf::from("-x.js"));
        for bad in [
            &["x.py"][..],
            &["--language", "python"],
            &["--language", "python", "--wall-seconds", "0", "x.py"],
            &["--language", "python", "--wall-seconds", "86401", "x.py"],
            &["--language", "python", "--bogus", "x.py"],
            &["--language", "python", "a.py", "b.py"],
            &["--language"],
        ] {
            let error = parse_run(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(error.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn a_language_the_jail_does_not_know_is_not_a_usage_error() {
        // It is refused as not run (exit 3) with a JSON reply, after parsing.
        let parsed = parse_run(&["--language", "ruby", "x.rb"]).unwrap();
        assert_eq!(parsed.language, "ruby");
    }

    #[test]
    fn hidden_stages_are_matched_exactly_and_kept_out_of_the_help() {
        let strings = |args: &[&str]| args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        for not_a_stage in [
            &["__stage1"][..],
            &["__stage1", "a", "b"],
            &["__probe", "x"],
            &["run", "__stage1"],
        ] {
            assert!(
                hidden_stage(&strings(not_a_stage)).is_none(),
                "{not_a_stage:?}"
            );
        }
        let help = JailCli::command().render_long_help().to_string();
        assert!(!help.contains("__"), "{help}");
    }
}
