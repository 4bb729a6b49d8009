//! The README's settings table is the table `corral config docs` generates from
//! `corral_core::config::SETTINGS`, and `corral config check` parses the environment as the
//! services do. Both run the real binary.

use std::path::Path;
use std::process::{Command, Output};

use corral_core::config::SETTINGS;

const REGENERATE: &str = "regenerate the table with `cargo run -q -p corral -- config docs` and paste it over the \
     README's table (markers included)";

fn corral(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_corral"));
    // A clean environment, so that a developer's own SANDBOX_* variables cannot change the result.
    command.env_clear().args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("the corral binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("stderr is UTF-8")
}

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn readme_names_every_setting_with_its_default() {
    let readme = readme();
    for doc in SETTINGS {
        let row_start = format!("| `{}` |", doc.name);
        let Some(row) = readme.lines().find(|line| line.starts_with(&row_start)) else {
            panic!("README.md has no table row for {}; {REGENERATE}", doc.name);
        };
        let default = if doc.default.is_empty() {
            "(unset)".to_owned()
        } else {
            format!("`{}`", doc.default)
        };
        let cells: Vec<&str> = row.split(" | ").collect();
        assert_eq!(
            cells.get(1).copied(),
            Some(default.as_str()),
            "README.md shows the wrong default for {}: {row}; {REGENERATE}",
            doc.name
        );
    }
}

#[test]
fn readme_table_is_exactly_what_config_docs_prints() {
    let output = corral(&["config", "docs"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let table = stdout(&output);
    assert!(
        readme().contains(&table),
        "README.md's settings table differs from `corral config docs`; {REGENERATE}"
    );
}

#[test]
fn config_check_prints_every_setting_and_succeeds_on_defaults() {
    let output = corral(&["config", "check"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let names: Vec<&str> = text
        .lines()
        .map(|line| line.split_once('=').map_or(line, |(name, _)| name))
        .collect();
    let expected: Vec<&str> = SETTINGS.iter().map(|doc| doc.name).collect();
    assert_eq!(names, expected);
    assert!(text.contains("SANDBOX_POOL_MAX_ALLOCATED=32\n"), "{text}");
}

#[test]
fn config_check_shows_a_value_from_the_environment() {
    let output = corral(
        &["config", "check"],
        &[("SANDBOX_POOL_MAX_ALLOCATED", "40")],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("SANDBOX_POOL_MAX_ALLOCATED=40\n"));
}

#[test]
fn config_check_fails_with_the_error_code_on_a_bad_value() {
    let output = corral(&["config", "check"], &[("SANDBOX_MAX_PROCESSES", "many")]);
    assert_eq!(output.status.code(), Some(1));
    let text = stderr(&output);
    assert!(text.contains("config_invalid_number"), "{text}");
    assert!(text.contains("SANDBOX_MAX_PROCESSES"), "{text}");
    assert!(
        stdout(&output).is_empty(),
        "nothing is described when start-up would fail"
    );
}

#[test]
fn config_check_fails_on_a_relation_between_settings() {
    let output = corral(
        &["config", "check"],
        &[
            ("SANDBOX_WARM_POOL_MIN", "40"),
            ("SANDBOX_POOL_MAX_ALLOCATED", "32"),
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("config_relation"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn config_check_warns_about_a_misspelled_name_without_failing() {
    let output = corral(&["config", "check"], &[("SANDBOX_WARM_POOL_MINIMUM", "5")]);
    assert!(output.status.success());
    assert!(
        stderr(&output).contains("SANDBOX_WARM_POOL_MINIMUM"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn config_check_never_prints_the_field_key() {
    let secret = "field-key-that-must-not-leak-7Qx";
    let output = corral(&["config", "check"], &[("SANDBOX_FIELD_KEY", secret)]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stdout(&output).contains(secret) && !stderr(&output).contains(secret));
    assert!(stdout(&output).contains("SANDBOX_FIELD_KEY=<set>\n"));
}

#[test]
fn config_rejects_unknown_subcommands() {
    assert_eq!(corral(&["config", "nonsense"], &[]).status.code(), Some(2));
    assert_eq!(corral(&["config"], &[]).status.code(), Some(2));
}

#[test]
fn config_check_refuses_a_value_that_is_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let output = Command::new(env!("CARGO_BIN_EXE_corral"))
        .env_clear()
        .args(["config", "check"])
        .env(
            "SANDBOX_MAX_PROCESSES",
            std::ffi::OsStr::from_bytes(b"6\xff4"),
        )
        .output()
        .expect("the corral binary runs");
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("config_not_unicode"),
        "{}",
        stderr(&output)
    );
}
