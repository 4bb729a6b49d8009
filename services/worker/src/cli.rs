//! `corral jail`: run one file in the jail, for operators and tests, and the hidden entry points
//! of the jail's re-executed stages.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use corral_core::config::Settings;
use corral_core::ids::OpToken;
use corral_core::jail::{Language, NotRun};

use crate::stage;
use crate::supervisor::{Reexec, RunRequest, Worker, refusal_text};

/// Usage of `corral jail`.
pub const USAGE: &str =
    "usage: corral jail run --language python|node [--workspace DIR] [--wall-seconds N]
                      [--grant-file FILE] FILE
       corral jail probe

run     runs FILE in a fresh jail and prints one JSON object: exit_code, stdout, stderr, bound,
        downloads, not_run and reset_evidence (with bounds, isolation, diagnostics, durations).
        Exit status 0 when the code ran (whatever its own exit code), 3 when it was not run,
        2 for unusable arguments or settings.
        --workspace DIR  the code sees a copy of DIR's files; validated downloads are copied back
        --wall-seconds N the wall limit for this run, in place of SANDBOX_MAX_WALL_SECONDS
        --grant-file F   the run's egress grant, which the jail's relay adds to every connection
                         it carries to SANDBOX_EGRESS_PROXY_URL (without one it refuses them all)
probe   prints which isolation primitives this machine offers, as JSON.

Settings come from the environment (SANDBOX_*, CORRAL_JAIL_*); see `corral config check`.
";

const EXIT_RAN: u8 = 0;
const EXIT_USAGE: u8 = 2;
const EXIT_NOT_RUN: u8 = 3;

/// Runs `corral jail <args>`. `prefix` is what re-executes this binary into `jail` (`["jail"]`
/// for `corral`, empty for `corral-jail`).
pub fn main(args: &[String], prefix: &[&str]) -> ExitCode {
    let Some(command) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(EXIT_USAGE);
    };
    let rest = &args[1..];
    match (command.as_str(), rest) {
        ("__stage1", [plan]) => stage::stage1(plan),
        ("__stage2", [plan]) => stage::stage2(plan),
        ("__probe", []) => stage::probe(),
        ("run", _) => run(rest, prefix),
        ("probe", []) => probe(prefix),
        ("help" | "--help" | "-h", _) => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => usage_error(&format!("unknown command {command:?}")),
    }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("corral jail: {message}\n\n{USAGE}");
    ExitCode::from(EXIT_USAGE)
}

fn settings() -> Result<Settings, ExitCode> {
    Settings::from_lookup(|name| std::env::var(name).ok()).map_err(|error| {
        eprintln!("corral jail: {error}");
        ExitCode::from(EXIT_USAGE)
    })
}

/// Parsed arguments of `run`.
struct RunArgs {
    language: String,
    workspace: Option<PathBuf>,
    wall_seconds: Option<u64>,
    grant_file: Option<PathBuf>,
    file: PathBuf,
}

fn parse_run(args: &[String]) -> Result<RunArgs, String> {
    let mut language = None;
    let mut workspace = None;
    let mut wall_seconds = None;
    let mut grant_file = None;
    let mut file = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| rest.next().cloned())
                .ok_or(format!("{name} needs a value"))
        };
        match flag {
            "--language" => language = Some(value("--language")?),
            "--workspace" => workspace = Some(PathBuf::from(value("--workspace")?)),
            "--grant-file" => grant_file = Some(PathBuf::from(value("--grant-file")?)),
            "--wall-seconds" => {
                let text = value("--wall-seconds")?;
                let seconds: u64 = text
                    .parse()
                    .ok()
                    .filter(|s| (1..=86_400).contains(s))
                    .ok_or(format!(
                        "--wall-seconds {text:?}: expected a whole number from 1 to 86400"
                    ))?;
                wall_seconds = Some(seconds);
            }
            "--" => {
                file = rest.next().map(PathBuf::from);
                break;
            }
            other if other.starts_with("--") => return Err(format!("unknown option {other}")),
            _ if file.is_none() => file = Some(PathBuf::from(arg)),
            _ => return Err(format!("unexpected argument {arg:?}")),
        }
    }
    if rest.next().is_some() {
        return Err("unexpected arguments after FILE".to_owned());
    }
    Ok(RunArgs {
        language: language.ok_or("--language is required")?,
        workspace,
        wall_seconds,
        grant_file,
        file: file.ok_or("FILE is required")?,
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

fn run(args: &[String], prefix: &[&str]) -> ExitCode {
    let args = match parse_run(args) {
        Ok(args) => args,
        Err(message) => return usage_error(&message),
    };
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
    let mut worker = Worker::start(settings, Reexec::this_binary(prefix));
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
        }),
        Err(reason) => worker.refuse(reason, OpToken(0)),
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
    let worker = Worker::start(settings, Reexec::this_binary(prefix));
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
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn run_arguments() {
        let parsed = parse_run(&strings(&[
            "--language",
            "python",
            "--wall-seconds=5",
            "x.py",
        ]))
        .unwrap();
        assert_eq!(
            (parsed.language.as_str(), parsed.wall_seconds),
            ("python", Some(5))
        );
        assert_eq!(parsed.file, PathBuf::from("x.py"));
        assert_eq!(parsed.grant_file, None);
        let parsed = parse_run(&strings(&[
            "--language",
            "python",
            "--grant-file",
            "g",
            "x.py",
        ]))
        .unwrap();
        assert_eq!(parsed.grant_file, Some(PathBuf::from("g")));
        for bad in [
            &["x.py"][..],
            &["--language", "python"],
            &["--language", "python", "--wall-seconds", "0", "x.py"],
            &["--language", "python", "--bogus", "x.py"],
            &["--language", "python", "a.py", "b.py"],
            &["--language"],
        ] {
            assert!(parse_run(&strings(bad)).is_err(), "{bad:?}");
        }
    }
}
