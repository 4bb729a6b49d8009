//! The command line (issue 25, item 5), through the real binary and from its one definition
//! (`corral::cli`): every subcommand answers `--help` and `--version` without touching anything,
//! an unknown flag or a missing value is refused (exit 2, with the parser's suggestion) before
//! anything is created, and README.md's usage lines are what the definition renders.
//!
//! The subcommands come from the definition itself, so a new one cannot be left out.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use clap::CommandFactory as _;
use corral::cli::Cli;

/// How long `--help` may take: a command that starts a service instead would not exit.
const HELP_TIMEOUT: Duration = Duration::from_secs(30);

const README_BEGIN: &str =
    "<!-- cli-usage:begin (rendered from services/corral/src/cli.rs; tests/cli.rs checks it) -->";
const README_END: &str = "<!-- cli-usage:end -->";

/// One subcommand of the definition: its words after `corral` and its usage as clap renders it.
struct Subcommand {
    path: Vec<String>,
    usage: String,
    /// Whether it only groups other subcommands (it runs nothing of its own).
    group: bool,
    /// Its long flags, other than `--help` and `--version`: (name, whether it takes a value).
    flags: Vec<(String, bool)>,
}

/// Every command of the definition, `corral` itself first, parents before children; clap's own
/// `help` subcommands are not ours.
fn subcommands() -> Vec<Subcommand> {
    let mut root = Cli::command();
    root.build();
    let mut found = Vec::new();
    walk(&mut root, &mut Vec::new(), &mut found);
    found
}

fn walk(command: &mut clap::Command, path: &mut Vec<String>, found: &mut Vec<Subcommand>) {
    let flags = command
        .get_arguments()
        .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
        .filter_map(|arg| {
            let long = arg.get_long()?;
            Some((long.to_owned(), arg.get_action().takes_values()))
        })
        .collect();
    found.push(Subcommand {
        path: path.clone(),
        usage: command.render_usage().to_string(),
        group: command.is_subcommand_required_set(),
        flags,
    });
    for sub in command.get_subcommands_mut() {
        if sub.get_name() == "help" {
            continue;
        }
        path.push(sub.get_name().to_owned());
        walk(sub, path, found);
        path.pop();
    }
}

/// A fresh, empty working directory, removed on drop.
struct EmptyDir(PathBuf);

impl EmptyDir {
    fn new() -> Self {
        static DIRS: AtomicU32 = AtomicU32::new(0);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "corral-cli-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("a scratch directory");
        Self(path)
    }

    /// What is in it now.
    fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .expect("the scratch directory is readable")
            .map(|entry| {
                entry
                    .expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }
}

impl Drop for EmptyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `corral ARGS` in `dir`, with settings in the environment that would stop any service
/// from starting (so that `--help` is shown to read none of them), and returns what it printed.
fn corral_in(dir: &EmptyDir, args: &[String]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .current_dir(&dir.0)
        .env_clear()
        .env("SANDBOX_MAX_PROCESSES", "many")
        .env("CORRAL_API_LISTEN", "nowhere")
        .env("CORRAL_EGRESS_LISTEN", "nowhere")
        .env("CORRAL_WORKER_CONTROL_PORT", "none")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the corral binary runs");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > HELP_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`corral {}` did not exit: it started something",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("its output")
}

fn words(path: &[String], extra: &[&str]) -> Vec<String> {
    path.iter()
        .cloned()
        .chain(extra.iter().map(|s| (*s).to_owned()))
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `corral PATH EXTRA` exited with `code` and left the directory empty; its output.
fn refused_or_answered(path: &[String], extra: &[&str], code: i32) -> Output {
    let dir = EmptyDir::new();
    let args = words(path, extra);
    let output = corral_in(&dir, &args);
    let shown = format!(
        "`corral {}`: exit {:?}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        output.status.code(),
        text(&output.stdout),
        text(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(code), "{shown}");
    assert_eq!(
        dir.entries(),
        Vec::<String>::new(),
        "it created files: {shown}"
    );
    output
}

#[test]
fn cli_the_definition_has_every_subcommand() {
    let paths: Vec<String> = subcommands().iter().map(|s| s.path.join(" ")).collect();
    for expected in [
        "config check",
        "config docs",
        "jail run",
        "jail probe",
        "egress decide",
        "egress-proxy",
        "worker serve",
        "controller",
        "controller network-policy",
        "up",
        "run",
        "api",
        "resources list",
        "resources document add",
    ] {
        assert!(paths.iter().any(|p| p == expected), "{expected}: {paths:?}");
    }
    assert!(
        !paths.iter().any(|p| p.contains("__")),
        "the jail's hidden stages stay out of the definition: {paths:?}"
    );
}

#[test]
fn cli_every_subcommand_help_prints_usage_and_touches_nothing() {
    for subcommand in subcommands() {
        for flag in ["--help", "-h"] {
            let output = refused_or_answered(&subcommand.path, &[flag], 0);
            let stdout = text(&output.stdout);
            let named: Vec<&str> = std::iter::once("corral")
                .chain(subcommand.path.iter().map(String::as_str))
                .collect();
            let usage = format!("Usage: {}", named.join(" "));
            assert!(stdout.contains(&usage), "{usage}: {stdout}");
            // What the binary printed is what the definition renders, `egress decide`'s own
            // parser included.
            assert!(
                stdout.contains(subcommand.usage.trim_end()),
                "{:?} {flag}: the definition renders\n{}\nthe binary printed\n{stdout}",
                subcommand.path,
                subcommand.usage
            );
        }
    }
}

#[test]
fn cli_every_subcommand_version_prints_the_version_and_touches_nothing() {
    for subcommand in subcommands() {
        for flag in ["--version", "-V"] {
            let output = refused_or_answered(&subcommand.path, &[flag], 0);
            let stdout = text(&output.stdout);
            assert!(
                stdout.trim_end().ends_with(env!("CARGO_PKG_VERSION")),
                "{:?} {flag}: {stdout}",
                subcommand.path
            );
        }
    }
}

#[test]
fn cli_resources_list_help_is_help_not_a_room() {
    for args in [
        &["resources", "list", "--help"][..],
        &["resources", "--db", "authority.db", "list", "--help"],
        &["resources", "list", "room", "--help"],
    ] {
        let path: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        let output = refused_or_answered(&path, &[], 0);
        let stdout = text(&output.stdout);
        assert!(stdout.contains("Usage: corral resources list"), "{stdout}");
        assert!(!stdout.contains("\"room\""), "{stdout}");
    }
}

#[test]
fn cli_unknown_flags_are_refused_with_a_suggestion_before_anything_is_created() {
    for subcommand in subcommands() {
        // A misspelling of one of its own flags (of `--help` where it has none).
        let long = subcommand
            .flags
            .first()
            .map_or("help", |(name, _)| name.as_str());
        let typo = format!("--{}", &long[..long.len() - 1]);
        let output = refused_or_answered(&subcommand.path, &[&typo], 2);
        let stderr = text(&output.stderr);
        assert!(
            stderr.contains(&format!("unexpected argument '{typo}'"))
                && stderr.contains("tip: a similar argument exists"),
            "{:?} {typo}: {stderr}",
            subcommand.path
        );
    }
    // And a plain unknown word where a subcommand belongs.
    let output = refused_or_answered(&["resources".to_owned()], &["lsit", "room"], 2);
    assert!(text(&output.stderr).contains("tip: a similar subcommand exists: 'list'"));
}

#[test]
fn cli_missing_values_are_refused_before_anything_is_created() {
    let mut checked = 0;
    for subcommand in subcommands() {
        for (long, _) in subcommand.flags.iter().filter(|(_, value)| *value) {
            let flag = format!("--{long}");
            let output = refused_or_answered(&subcommand.path, &[&flag], 2);
            let stderr = text(&output.stderr);
            assert!(
                stderr.contains(&format!("a value is required for '{flag} <"))
                    && stderr.contains("try '--help'"),
                "{:?} {flag}: {stderr}",
                subcommand.path
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} flags take a value?");
}

#[test]
fn cli_egress_decide_refusals_stay_its_one_usage_object() {
    for args in [&["--allowed-prot", "443", "a:1"][..], &["--mode"], &[]] {
        let path = words(&["egress".to_owned(), "decide".to_owned()], args);
        let output = refused_or_answered(&path, &[], 2);
        let stdout = text(&output.stdout);
        assert!(
            stdout.starts_with(r#"{"error":"usage","message":""#) && stdout.ends_with("}\n"),
            "{args:?}: {stdout}"
        );
        assert_eq!(stdout.matches('\n').count(), 1, "{stdout}");
    }
    let path = words(
        &["egress".to_owned(), "decide".to_owned()],
        &["--allowed-prot", "443", "a:1"],
    );
    let stdout = text(&refused_or_answered(&path, &[], 2).stdout);
    assert!(
        stdout.contains("--allowed-port"),
        "the suggestion: {stdout}"
    );
}

/// README.md's block of usage lines, as the definition renders it: every subcommand that runs
/// something, each line of its usage.
fn usage_block() -> String {
    let mut block = format!("{README_BEGIN}\n```text\n");
    for subcommand in subcommands().iter().filter(|s| !s.group) {
        for line in subcommand.usage.lines() {
            let line = line.trim_start_matches("Usage:").trim();
            block.push_str(line);
            block.push('\n');
        }
    }
    block.push_str("```\n");
    block.push_str(README_END);
    block.push('\n');
    block
}

#[test]
fn cli_readme_usage_lines_are_what_the_definitions_render() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let expected = usage_block();
    assert!(
        readme.contains(&expected),
        "README.md's usage lines differ from the command line's definition; put this in their \
         place (markers included):\n\n{expected}"
    );
}
