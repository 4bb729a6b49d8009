//! No two modules of a crate import each other, directly or around a circle: an import circle is a
//! sign of a concern in the wrong file (each type belongs in the module it serves). Every crate of
//! the workspace is read as text; a module's test code (a `tests.rs`, or whatever follows its
//! first `#[cfg(test)]`) and its comments are left out, and a module may always use its ancestors
//! and descendants.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path inside its crate (`["egress", "grant"]`; the crate root is `[]`).
type ModulePath = Vec<String>;

/// The crates' source roots, relative to this crate.
const CRATES: &[&str] = &[
    "../../core/src",
    "../../sim/src",
    "../../benches/src",
    "../api/src",
    "../contract/src",
    "../controller/src",
    "../corral/src",
    "../egress-proxy/src",
    "../store/src",
    "../testkit/src",
    "../worker/src",
];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The module a source file is, or `None` for test files and binaries' entry points.
fn module_of(root: &Path, file: &Path) -> Option<ModulePath> {
    let relative = file.strip_prefix(root).ok()?;
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    match last.as_str() {
        "tests.rs" => None,
        "lib.rs" | "main.rs" | "mod.rs" => Some(parts),
        name => {
            parts.push(name.trim_end_matches(".rs").to_owned());
            Some(parts)
        }
    }
}

/// A file's code without its test module and its comments (a doc link is not an import).
fn code_of(text: &str) -> String {
    let code = text.find("\n#[cfg(test)]").map_or(text, |at| &text[..at]);
    code.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn identifier(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    (&text[..end], &text[end..])
}

/// Every path a piece of code names after `prefix::` (`crate::a::b`, `super::{x, y::z}`).
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let needle = format!("{prefix}::");
    let mut rest = code;
    while let Some(at) = rest.find(&needle) {
        let before = rest[..at].chars().last();
        rest = &rest[at + needle.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        paths.extend(tree(rest, Vec::new()));
    }
    paths
}

/// The paths of a use tree starting at `text` (`a::b`, `{a, b::c}`), each prefixed by `base`.
fn tree(text: &str, base: Vec<String>) -> Vec<Vec<String>> {
    let text = text.trim_start();
    if let Some(inner) = text.strip_prefix('{') {
        let mut depth = 0usize;
        let mut end = inner.len();
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = i;
                    break;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        let mut paths = Vec::new();
        let mut depth = 0usize;
        let mut start = 0;
        let inner = &inner[..end];
        for (i, c) in inner
            .char_indices()
            .chain(std::iter::once((inner.len(), ',')))
        {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths.extend(tree(&inner[start..i], base.clone()));
                    start = i + 1;
                }
                _ => {}
            }
        }
        return paths;
    }
    let (name, after) = identifier(text);
    if name.is_empty() {
        return vec![base];
    }
    let mut path = base;
    path.push(name.to_owned());
    match after.strip_prefix("::") {
        Some(more) => tree(more, path),
        None => vec![path],
    }
}

/// The longest known module `path` starts with.
fn resolve(path: &[String], modules: &BTreeSet<ModulePath>) -> Option<ModulePath> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| modules.contains(prefix))
}

fn related(a: &ModulePath, b: &ModulePath) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The module graph of one crate: module to the modules it imports (ancestors and descendants
/// left out).
fn graph(root: &Path) -> BTreeMap<ModulePath, BTreeSet<ModulePath>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let code: BTreeMap<ModulePath, String> = files
        .iter()
        .filter_map(|file| {
            let module = module_of(root, file)?;
            let text = std::fs::read_to_string(file).expect("source");
            Some((module, code_of(&text)))
        })
        .collect();
    let modules: BTreeSet<ModulePath> = code.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for (module, text) in &code {
        let parent: ModulePath = module[..module.len().saturating_sub(1)].to_vec();
        let mut targets = BTreeSet::new();
        for path in paths_after(text, "crate") {
            targets.extend(resolve(&path, &modules));
        }
        for path in paths_after(text, "super") {
            let mut absolute = parent.clone();
            absolute.extend(path);
            targets.extend(resolve(&absolute, &modules));
        }
        targets.retain(|target| !related(target, module));
        edges.insert(module.clone(), targets);
    }
    edges
}

/// A circle of imports, if the graph has one.
fn circle(edges: &BTreeMap<ModulePath, BTreeSet<ModulePath>>) -> Option<Vec<ModulePath>> {
    fn visit(
        node: &ModulePath,
        edges: &BTreeMap<ModulePath, BTreeSet<ModulePath>>,
        stack: &mut Vec<ModulePath>,
        done: &mut BTreeSet<ModulePath>,
    ) -> Option<Vec<ModulePath>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut found = stack[at..].to_vec();
            found.push(node.clone());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, edges, stack, done) {
                return Some(found);
            }
        }
        stack.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_an_import_circle() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut circles = Vec::new();
    for krate in CRATES {
        let root = here.join(krate);
        if let Some(found) = circle(&graph(&root)) {
            let shown: Vec<String> = found.iter().map(|m| m.join("::")).collect();
            circles.push(format!("{krate}: {}", shown.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reader_finds_a_circle_and_reads_use_trees() {
    let a: ModulePath = vec!["a".into()];
    let b: ModulePath = vec!["b".into()];
    let circular = BTreeMap::from([
        (a.clone(), BTreeSet::from([b.clone()])),
        (b.clone(), BTreeSet::from([a.clone()])),
    ]);
    assert!(circle(&circular).is_some());
    let straight = BTreeMap::from([
        (a.clone(), BTreeSet::from([b.clone()])),
        (b, BTreeSet::new()),
    ]);
    assert_eq!(circle(&straight), None);
    let paths = paths_after(
        "use crate::{config::{self, Settings}, jail::Language};\nlet x = crate::bounds::f();",
        "crate",
    );
    assert_eq!(
        paths,
        [
            vec!["config", "self"],
            vec!["config", "Settings"],
            vec!["jail", "Language"],
            vec!["bounds", "f"],
        ]
        .map(|p| p.into_iter().map(String::from).collect::<Vec<_>>())
    );
}
