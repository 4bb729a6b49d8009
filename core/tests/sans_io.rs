//! corral-core's sources name no I/O, async runtime, thread, clock or unordered collection.
//!
//! clippy.toml bans the types and methods themselves, but only where clippy runs and only for the
//! paths it lists; this plain scan of core/src catches the rest (a `use std::thread;`, a `tokio`
//! path, a `HashMap` behind a type alias) in every `cargo test`. Whole-line comments may mention
//! these names: explaining why one is absent is fine. Everything else is code, strings included.

// This test reads corral-core's sources from disk; the crate's own ban on I/O (clippy.toml) is for
// the library, not for the tests that guard it.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::path::{Path, PathBuf};

/// Tokens that must not appear in corral-core's code, and why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("tokio", "corral-core has no async runtime"),
    ("async fn", "corral-core has no async"),
    (".await", "corral-core has no async"),
    ("std::fs", "corral-core performs no I/O"),
    ("std::net::TcpStream", "corral-core performs no I/O"),
    ("std::process", "corral-core performs no I/O"),
    ("std::env", "configuration is passed in as a lookup"),
    ("std::thread", "corral-core has no threads"),
    ("SystemTime", "time is an input (corral_core::time)"),
    ("Instant::now", "time is an input (corral_core::time)"),
    ("getrandom", "randomness is an input (a seed)"),
    (
        "HashMap",
        "iteration order can reach an output; use BTreeMap",
    ),
    (
        "HashSet",
        "iteration order can reach an output; use BTreeSet",
    ),
];

/// Modules of `std` that must not be imported by name, as in `use std::{fs, thread};`.
const FORBIDDEN_STD_MODULES: &[&str] = &["fs", "net", "process", "env", "thread"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Every line of code in core/src as (file, line number, text), whole-line comments left out.
fn code_lines() -> Vec<(String, usize, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    assert!(
        files.len() > 5,
        "core/src holds corral-core's sources: found {files:?}"
    );
    let mut lines = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (index, line) in text.lines().enumerate() {
            if !line.trim_start().starts_with("//") {
                lines.push((shown.clone(), index + 1, line.to_owned()));
            }
        }
    }
    lines
}

/// The names inside each `std::{...}` group on the line.
fn std_group_names(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find("std::{") {
        let after = &rest[start + "std::{".len()..];
        let group = after.split('}').next().unwrap_or("");
        names.extend(
            group
                .split(',')
                .map(|item| item.split("::").next().unwrap_or("").trim().to_owned()),
        );
        rest = after;
    }
    names
}

#[test]
fn core_sources_name_no_io_async_thread_clock_or_unordered_collection() {
    let mut found = Vec::new();
    for (file, number, line) in code_lines() {
        for (token, why) in FORBIDDEN {
            if line.contains(token) {
                found.push(format!(
                    "{file}:{number}: `{token}` ({why}): {}",
                    line.trim()
                ));
            }
        }
        for name in std_group_names(&line) {
            if FORBIDDEN_STD_MODULES.contains(&name.as_str()) {
                found.push(format!(
                    "{file}:{number}: `std::{{{name}}}` (corral-core performs no I/O): {}",
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "corral-core must stay sans-IO: time, randomness and observations are inputs, effects are outputs \
         (docs/decisions/0001-sans-io-core-and-simulator.md). Found:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_sees_grouped_std_imports() {
    assert_eq!(std_group_names("use std::{fmt, fs::File};"), ["fmt", "fs"]);
    assert!(std_group_names("use std::collections::BTreeMap;").is_empty());
}
