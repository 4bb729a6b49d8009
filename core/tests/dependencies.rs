//! corral-core's dependency list is pinned: exactly these crates, with their default features off
//! and no feature that brings I/O, async, threads, clocks or ambient randomness.
//!
//! corral-core must stay sans-IO: every rule in it is driven by the production shells, the
//! simulator and the tests alike, which only works while the crate performs nothing itself. A
//! dependency is the easiest way to lose that without noticing (a default `std` feature pulls in
//! `getrandom`, an `async` feature pulls in a runtime). Adding or changing one is a decision: write
//! a record in docs/decisions/ (see 0001-sans-io-core-and-simulator.md), then update this test.
//!
//! The manifest is read as plain text, with just enough parsing for the forms Cargo.toml uses here,
//! so that this check needs no dependency of its own.

// This test reads corral-core's manifest from disk; the crate's own ban on I/O (clippy.toml) is
// for the library, not for the tests that guard it.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The only crates corral-core may depend on, and why each is allowed.
const ALLOWED: &[(&str, &str)] = &[
    ("base64", "base64url text of grants"),
    ("ed25519-dalek", "grant signatures (deterministic; no RNG)"),
    ("hkdf", "derives the grant signing key from the field key"),
    (
        "hmac",
        "the live view's TURN REST credential, HMAC-SHA1 as the TURN server checks it (docs/decisions/0023)",
    ),
    (
        "ipnet",
        "the egress CIDR type and its containment, no_std on core::net (docs/decisions/0028)",
    ),
    (
        "pep440_rs",
        "whether a run's pinned Python version is a PEP 440 version (docs/decisions/0028)",
    ),
    (
        "serde",
        "derives the pool document's encoding for the coordination store (docs/decisions/0004)",
    ),
    (
        "serde_json",
        "reads SANDBOX_PACKAGE_REGISTRIES, a JSON object, with `alloc` only (docs/decisions/0014)",
    ),
    (
        "sha1",
        "the hash of the TURN REST credential's HMAC, fixed by the scheme (docs/decisions/0023)",
    ),
    (
        "sha2",
        "the hash under HKDF and ed25519, and the broker tokens' HMAC (docs/decisions/0014)",
    ),
    (
        "xxhash-rust",
        "xxHash32 of a file's text, whose low 16 bits are its Hashline tag (docs/decisions/0017, 0028)",
    ),
    ("zeroize", "wipes key material"),
];

/// Feature-name parts that mean I/O, async, threads, clocks or ambient randomness. A feature is
/// refused when any of its `-`/`_`-separated parts is one of these, or when it is `default`.
const FORBIDDEN_FEATURE_PARTS: &[&str] = &[
    "std",
    "io",
    "fs",
    "net",
    "os",
    "tokio",
    "async",
    "futures",
    "thread",
    "threads",
    "rayon",
    "parallel",
    "time",
    "clock",
    "rand",
    "rng",
    "getrandom",
    "default",
];

const WHY: &str = "corral-core must stay sans-IO (no I/O, async, clock, ambient randomness or threads); \
     adding or changing one of its dependencies needs a decision record in docs/decisions/ \
     (see 0001-sans-io-core-and-simulator.md) and then an update of core/tests/dependencies.rs";

/// One `[section]` of the manifest: its header and its `key = value` entries, in order.
struct Section {
    header: String,
    entries: Vec<(String, String)>,
}

/// Splits the manifest into sections. Comments are dropped; a value that spans lines (an array
/// or an inline table) is joined until its brackets balance.
fn sections(text: &str) -> Vec<Section> {
    let mut out: Vec<Section> = vec![Section {
        header: String::new(),
        entries: Vec::new(),
    }];
    let mut pending = String::new();
    for raw in text.lines() {
        let line = strip_comment(raw).trim().to_owned();
        if line.is_empty() {
            continue;
        }
        if pending.is_empty() && line.starts_with('[') {
            out.push(Section {
                header: line
                    .trim_matches(|c| c == '[' || c == ']')
                    .trim()
                    .to_owned(),
                entries: Vec::new(),
            });
            continue;
        }
        pending.push_str(&line);
        pending.push(' ');
        if balanced(&pending) {
            let entry = std::mem::take(&mut pending);
            let (key, value) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
            let last = out.last_mut().expect("there is always a section");
            last.entries.push((
                key.trim().trim_matches('"').to_owned(),
                value.trim().to_owned(),
            ));
        }
    }
    assert!(
        pending.is_empty(),
        "core/Cargo.toml: unterminated value: {pending}"
    );
    out
}

/// The line without a `#` comment (a `#` inside a quoted string is kept).
fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    for (index, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted => return &line[..index],
            _ => {}
        }
    }
    line
}

fn balanced(text: &str) -> bool {
    let count = |c: char| text.chars().filter(|x| *x == c).count();
    count('[') == count(']') && count('{') == count('}')
}

/// Splits `text` at commas outside brackets, braces and quotes.
fn split_top_level(text: &str) -> Vec<String> {
    let (mut parts, mut current, mut depth, mut quoted) = (Vec::new(), String::new(), 0i32, false);
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            '[' | '{' if !quoted => depth += 1,
            ']' | '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The strings of an array value such as `["alloc", "zeroize"]`.
fn string_array(value: &str) -> Vec<String> {
    let inner = value.trim().trim_start_matches('[').trim_end_matches(']');
    split_top_level(inner)
        .into_iter()
        .map(|s| s.trim_matches('"').to_owned())
        .collect()
}

/// A dependency as declared: `name = "1.0"` or `name = { version = "1.0", ... }`.
#[derive(Debug)]
struct Dependency {
    crate_name: String,
    default_features: bool,
    features: Vec<String>,
    keys: BTreeMap<String, String>,
}

fn dependency(name: &str, value: &str) -> Dependency {
    let value = value.trim();
    if !value.starts_with('{') {
        // A bare version requirement keeps the default features.
        return Dependency {
            crate_name: name.to_owned(),
            default_features: true,
            features: Vec::new(),
            keys: BTreeMap::new(),
        };
    }
    let inner = value.trim_start_matches('{').trim_end_matches('}');
    let keys: BTreeMap<String, String> = split_top_level(inner)
        .into_iter()
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair.as_str(), ""));
            (key.trim().to_owned(), value.trim().to_owned())
        })
        .collect();
    Dependency {
        crate_name: keys
            .get("package")
            .map_or(name, |p| p.trim_matches('"'))
            .to_owned(),
        default_features: keys.get("default-features").is_none_or(|v| v != "false"),
        features: keys
            .get("features")
            .map(|v| string_array(v))
            .unwrap_or_default(),
        keys,
    }
}

fn manifest() -> Vec<Section> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    sections(&text)
}

fn dependencies() -> Vec<Dependency> {
    let manifest = manifest();
    let section = manifest
        .iter()
        .find(|s| s.header == "dependencies")
        .expect("core/Cargo.toml has a [dependencies] section");
    section
        .entries
        .iter()
        .map(|(name, value)| dependency(name, value))
        .collect()
}

fn forbidden_part(feature: &str) -> Option<&'static str> {
    feature.split(['-', '_']).find_map(|part| {
        FORBIDDEN_FEATURE_PARTS
            .iter()
            .copied()
            .find(|f| f.eq_ignore_ascii_case(part))
    })
}

#[test]
fn core_depends_on_exactly_the_pinned_crates() {
    let found: BTreeSet<String> = dependencies().into_iter().map(|d| d.crate_name).collect();
    let allowed: BTreeSet<String> = ALLOWED.iter().map(|(name, _)| (*name).to_owned()).collect();
    assert_eq!(
        found, allowed,
        "corral-core's [dependencies] changed. {WHY}"
    );
}

#[test]
fn core_dependencies_enable_no_io_or_async_features() {
    for dep in dependencies() {
        assert!(
            !dep.keys.contains_key("workspace"),
            "{}: declare corral-core's dependencies in core/Cargo.toml itself, so their features are visible here. {WHY}",
            dep.crate_name
        );
        assert!(
            !dep.keys.contains_key("optional"),
            "{}: an optional dependency is switched on by a feature this test does not follow. {WHY}",
            dep.crate_name
        );
        assert!(
            !dep.default_features,
            "{}: default features must be off (`default-features = false`): defaults commonly enable `std`, \
             an OS random source or a runtime. {WHY}",
            dep.crate_name
        );
        for feature in &dep.features {
            assert!(
                forbidden_part(feature).is_none(),
                "{} enables feature {feature:?}, which looks like I/O, async, threads, clocks or randomness. {WHY}",
                dep.crate_name
            );
        }
    }
}

#[test]
fn core_has_no_other_kind_of_dependency() {
    for section in manifest() {
        let header = section.header.as_str();
        let is_dependency_table = header.contains("dependencies");
        assert!(
            !is_dependency_table || header == "dependencies" || header == "dev-dependencies",
            "core/Cargo.toml has a [{header}] section; corral-core's dependencies are all listed in [dependencies]. {WHY}"
        );
    }
}

#[test]
fn core_features_enable_no_dependency_features() {
    let manifest = manifest();
    let Some(features) = manifest.iter().find(|s| s.header == "features") else {
        return;
    };
    for (name, value) in &features.entries {
        for enabled in string_array(value) {
            assert!(
                !enabled.contains('/') && !enabled.starts_with("dep:"),
                "corral-core's feature {name:?} enables {enabled:?}: a feature may not switch on a dependency or its \
                 features, or this pinned list stops being the whole story. {WHY}"
            );
        }
    }
}

#[test]
fn the_parser_reads_the_forms_it_claims_to() {
    let parsed = sections(
        "[package]\nname = \"x\" # comment\n[dependencies]\na = \"1\"\nb = { version = \"2\", default-features = false, features = [\n  \"alloc\", # why\n  \"zeroize\",\n] }\n",
    );
    let deps: Vec<Dependency> = parsed[2]
        .entries
        .iter()
        .map(|(n, v)| dependency(n, v))
        .collect();
    assert_eq!(deps.len(), 2);
    assert!(deps[0].default_features);
    assert!(!deps[1].default_features);
    assert_eq!(deps[1].features, ["alloc", "zeroize"]);
    assert_eq!(forbidden_part("os_rng"), Some("os"));
    assert_eq!(forbidden_part("std"), Some("std"));
    assert_eq!(forbidden_part("fast"), None);
    assert_eq!(forbidden_part("alloc"), None);
}
