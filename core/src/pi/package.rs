//! The static checks of a proposed package's `package.json` (PI-1), before anything runs:
//! identity, dependencies, lifecycle scripts and resource paths; and the validation profile the
//! package's own files decide.

use serde_json::{Map, Value};

use super::files::FileSet;
use super::{Profile, Refusal, RefusalCode};

/// The package's manifest: one, at the root.
pub const MANIFEST: &str = "package.json";

/// The longest npm package name (npm's rule).
pub const NAME_MAX_BYTES: usize = 214;
/// The most dependencies of each kind a package may declare.
pub const DEPENDENCIES_MAX: usize = 64;
/// The most entries in one of the `pi` manifest's resource lists.
pub const RESOURCE_ENTRIES_MAX: usize = 64;

/// The packages Pi itself provides to extensions: a package lists them in `peerDependencies`
/// with the range `*` and never installs them (Pi's packaging rule).
pub const RUNTIME_PROVIDED: [&str; 5] = [
    "@mariozechner/pi-ai",
    "@mariozechner/pi-agent-core",
    "@mariozechner/pi-coding-agent",
    "@mariozechner/pi-tui",
    "typebox",
];

/// npm's lifecycle scripts that run on install or pack, which a validated package may not have:
/// installs run with scripts off, and a package that needs one would not work as reviewed.
pub const LIFECYCLE_SCRIPTS: [&str; 12] = [
    "preinstall",
    "install",
    "postinstall",
    "prepublish",
    "preprepare",
    "prepare",
    "postprepare",
    "prepack",
    "postpack",
    "dependencies",
    "preuninstall",
    "postuninstall",
];

/// The dependency fields, each checked by the same rule.
const DEPENDENCY_FIELDS: [&str; 3] = ["dependencies", "devDependencies", "optionalDependencies"];

/// The resource kinds of the `pi` manifest, each with its conventional directory.
pub const RESOURCE_KINDS: [&str; 4] = ["extensions", "skills", "prompts", "themes"];

/// What the static checks established about a package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// Its name.
    pub name: String,
    /// Its exact version.
    pub version: String,
    /// Skill-only, or with extensions: decided by its files, never by the request.
    pub profile: Profile,
    /// What it installs for its validation tree (`name@version`, exact).
    pub dependencies: Vec<String>,
    /// What its test tree installs besides (`devDependencies`, exact).
    pub dev_dependencies: Vec<String>,
    /// Its test files, by Node's test runner's default patterns.
    pub tests: Vec<String>,
}

/// Checks `package.json` and the resources it names against `files`.
///
/// # Errors
/// The first rule broken: identity, dependency, lifecycle script, resource path, missing tests.
pub fn check_package(files: &FileSet) -> Result<Checked, Refusal> {
    let text = files.text(MANIFEST).ok_or_else(|| {
        Refusal::at(
            RefusalCode::PackageIdentityInvalid,
            MANIFEST,
            "a package has one package.json, at its root",
        )
    })?;
    if let Some(nested) = files
        .iter()
        .map(|(p, _)| p)
        .find(|p| p.ends_with("/package.json"))
    {
        return Err(Refusal::at(
            RefusalCode::PackageIdentityInvalid,
            nested,
            "a second package.json: a package has one root",
        ));
    }
    let manifest: Value = serde_json::from_str(text).map_err(|e| {
        Refusal::at(
            RefusalCode::PackageIdentityInvalid,
            MANIFEST,
            format!("not JSON: {e}"),
        )
    })?;
    let manifest = manifest.as_object().ok_or_else(|| {
        Refusal::at(
            RefusalCode::PackageIdentityInvalid,
            MANIFEST,
            "not a JSON object",
        )
    })?;
    let name = identity_field(manifest, "name", name_is_valid)?;
    let version = identity_field(manifest, "version", version_is_exact)?;
    check_scripts(manifest, files)?;
    let mut installs = Vec::new();
    for field in DEPENDENCY_FIELDS {
        installs.push(dependencies(manifest, field)?);
    }
    check_peers(manifest)?;
    for field in ["bundledDependencies", "bundleDependencies"] {
        if manifest.contains_key(field) {
            return Err(Refusal::at(
                RefusalCode::PackageDependencyRefused,
                field,
                "bundled dependencies are refused: dependencies come through the broker",
            ));
        }
    }
    let profile = profile(manifest, files)?;
    let tests = tests(files);
    if profile == Profile::Extension && tests.is_empty() {
        return Err(Refusal::new(
            RefusalCode::PackageTestsMissing,
            "an extension package runs its node:test tests before the loader, and has none \
             (*.test.js, *.test.mjs, *.test.cjs, or files under test/)",
        ));
    }
    let dev_dependencies = installs.remove(1);
    let mut dependencies = installs.remove(0);
    dependencies.extend(installs.remove(0));
    Ok(Checked {
        name,
        version,
        profile,
        dependencies,
        dev_dependencies,
        tests,
    })
}

fn identity_field(
    manifest: &Map<String, Value>,
    field: &str,
    valid: fn(&str) -> bool,
) -> Result<String, Refusal> {
    match manifest.get(field).and_then(Value::as_str) {
        Some(value) if valid(value) => Ok(value.to_owned()),
        Some(value) => Err(Refusal::at(
            RefusalCode::PackageIdentityInvalid,
            field,
            format!("{value:?} is not a valid {field}"),
        )),
        None => Err(Refusal::at(
            RefusalCode::PackageIdentityInvalid,
            field,
            format!("package.json has no {field}"),
        )),
    }
}

/// npm's package name rule: lowercase, at most [`NAME_MAX_BYTES`], URL-safe characters, not
/// starting with `.` or `_`, optionally `@scope/`.
#[must_use]
pub fn name_is_valid(name: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '_'])
            && p.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_')
            })
    };
    if name.len() > NAME_MAX_BYTES {
        return false;
    }
    match name.strip_prefix('@') {
        Some(scoped) => scoped
            .split_once('/')
            .is_some_and(|(scope, rest)| part(scope) && part(rest)),
        None => part(name),
    }
}

/// Whether `version` is one exact semantic version (`1.2.3`, `1.2.3-rc.1`, `1.2.3+build`): no
/// range, tag, URL or path.
#[must_use]
pub fn version_is_exact(version: &str) -> bool {
    let (core, build) = match version.split_once('+') {
        Some((core, build)) => (core, Some(build)),
        None => (version, None),
    };
    let (core, pre) = match core.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (core, None),
    };
    let numeric = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (p == "0" || !p.starts_with('0'))
    };
    let identifiers = |text: &str| {
        text.split('.')
            .all(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| numeric(p))
        && pre.is_none_or(identifiers)
        && build.is_none_or(identifiers)
        && version.len() <= 256
}

fn check_scripts(manifest: &Map<String, Value>, files: &FileSet) -> Result<(), Refusal> {
    if let Some(scripts) = manifest.get("scripts") {
        let scripts = scripts.as_object().ok_or_else(|| {
            Refusal::at(
                RefusalCode::PackageIdentityInvalid,
                "scripts",
                "not an object",
            )
        })?;
        if let Some(name) = scripts
            .keys()
            .find(|k| LIFECYCLE_SCRIPTS.contains(&k.as_str()))
        {
            return Err(Refusal::at(
                RefusalCode::PackageLifecycleScript,
                &format!("scripts.{name}"),
                "lifecycle scripts are refused: nothing of a package runs on install",
            ));
        }
    }
    // npm runs `node-gyp rebuild` as an implicit install script for either of these.
    if files.get("binding.gyp").is_some() || manifest.get("gypfile") == Some(&Value::Bool(true)) {
        return Err(Refusal::at(
            RefusalCode::PackageLifecycleScript,
            "binding.gyp",
            "a native build is an install script, and is refused",
        ));
    }
    Ok(())
}

/// One dependency field's entries as `name@version`, each an exact version from a registry.
fn dependencies(manifest: &Map<String, Value>, field: &str) -> Result<Vec<String>, Refusal> {
    let Some(value) = manifest.get(field) else {
        return Ok(Vec::new());
    };
    let entries = value.as_object().ok_or_else(|| {
        Refusal::at(
            RefusalCode::PackageDependencyRefused,
            field,
            "not an object of names and versions",
        )
    })?;
    if entries.len() > DEPENDENCIES_MAX {
        return Err(Refusal::at(
            RefusalCode::PackageDependencyRefused,
            field,
            format!("{} entries; at most {DEPENDENCIES_MAX}", entries.len()),
        ));
    }
    let mut specs = Vec::new();
    for (name, spec) in entries {
        let at = format!("{field}.{name}");
        if !name_is_valid(name) {
            return Err(Refusal::at(
                RefusalCode::PackageDependencyRefused,
                &at,
                "not a valid package name",
            ));
        }
        if RUNTIME_PROVIDED.contains(&name.as_str()) {
            return Err(Refusal::at(
                RefusalCode::PackageDependencyRefused,
                &at,
                "Pi provides this package: list it in peerDependencies with \"*\"",
            ));
        }
        let spec = spec.as_str().unwrap_or_default();
        if !version_is_exact(spec) {
            return Err(Refusal::at(
                RefusalCode::PackageDependencyRefused,
                &at,
                format!(
                    "{spec:?} is not an exact version: only registry packages at exact versions \
                     (no range, tag, git, path, URL or alias)"
                ),
            ));
        }
        specs.push(format!("{name}@{spec}"));
    }
    Ok(specs)
}

/// Peers are only what Pi provides, with the range `*`: nothing is installed for them.
fn check_peers(manifest: &Map<String, Value>) -> Result<(), Refusal> {
    let Some(peers) = manifest.get("peerDependencies") else {
        return Ok(());
    };
    let peers = peers.as_object().ok_or_else(|| {
        Refusal::at(
            RefusalCode::PackageDependencyRefused,
            "peerDependencies",
            "not an object",
        )
    })?;
    for (name, range) in peers {
        if !RUNTIME_PROVIDED.contains(&name.as_str()) || range.as_str() != Some("*") {
            return Err(Refusal::at(
                RefusalCode::PackageDependencyRefused,
                &format!("peerDependencies.{name}"),
                "only the packages Pi provides may be peers, with the range \"*\"",
            ));
        }
    }
    Ok(())
}

/// The profile, from the `pi` manifest or the conventional directories, after checking every
/// resource path the manifest names.
fn profile(manifest: &Map<String, Value>, files: &FileSet) -> Result<Profile, Refusal> {
    let declared = match manifest.get("pi") {
        None => None,
        Some(Value::Object(pi)) => Some(pi),
        Some(_) => {
            return Err(Refusal::at(
                RefusalCode::PackageResourcePathInvalid,
                "pi",
                "not an object",
            ));
        }
    };
    let mut extensions = false;
    let mut any = false;
    for kind in RESOURCE_KINDS {
        let present = match declared {
            // A `pi` manifest loads exactly the kinds it lists.
            Some(pi) => match pi.get(kind) {
                Some(entries) => resource_entries(kind, entries, files)?,
                None => false,
            },
            // Without one, Pi discovers the conventional directories.
            None => files.is_dir(kind),
        };
        any |= present;
        extensions |= present && kind == "extensions";
    }
    if !any {
        return Err(Refusal::new(
            RefusalCode::PackageResourcePathInvalid,
            "the package declares no resources: no `pi` manifest entries and none of the \
             directories extensions/, skills/, prompts/, themes/",
        ));
    }
    Ok(if extensions {
        Profile::Extension
    } else {
        Profile::SkillOnly
    })
}

/// Checks one resource list: strings, each relative and inside the package (after an optional
/// `!`, `+` or `-` filter mark), not under `node_modules`; a literal path must exist. Returns
/// whether the list includes anything.
fn resource_entries(kind: &str, entries: &Value, files: &FileSet) -> Result<bool, Refusal> {
    let field = format!("pi.{kind}");
    let refuse = |why: String| {
        Err(Refusal::at(
            RefusalCode::PackageResourcePathInvalid,
            &field,
            why,
        ))
    };
    let Some(entries) = entries.as_array() else {
        return refuse("not a list of paths".to_owned());
    };
    if entries.len() > RESOURCE_ENTRIES_MAX {
        return refuse(format!("more than {RESOURCE_ENTRIES_MAX} entries"));
    }
    let mut includes = false;
    for entry in entries {
        let Some(text) = entry.as_str() else {
            return refuse("an entry that is not a string".to_owned());
        };
        let (excludes, path) = match text.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, text.trim_start_matches(['+', '-'])),
        };
        let path = path.strip_prefix("./").unwrap_or(path);
        let path = path.strip_suffix('/').unwrap_or(path);
        if path.is_empty()
            || path.starts_with(['/', '~'])
            || path.contains('\\')
            || path.chars().any(char::is_control)
            || path
                .split('/')
                .any(|part| matches!(part, "" | "." | ".." | "node_modules"))
        {
            return refuse(format!(
                "{text:?} is not a relative path inside the package"
            ));
        }
        let glob = path.contains(['*', '?', '[', '{']);
        if !glob && !excludes && files.get(path).is_none() && !files.is_dir(path) {
            return refuse(format!("{text:?} names nothing in the package"));
        }
        includes |= !excludes;
    }
    Ok(includes)
}

/// The package's test files, by Node's test runner's default patterns: `*.test.{js,mjs,cjs}`,
/// `*-test.*`, `*_test.*`, `test.*`, and every such file under a `test` directory.
fn tests(files: &FileSet) -> Vec<String> {
    files
        .iter()
        .map(|(p, _)| p)
        .filter(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            let Some((stem, ext)) = name.rsplit_once('.') else {
                return false;
            };
            matches!(ext, "js" | "mjs" | "cjs")
                && (stem == "test"
                    || stem.ends_with(".test")
                    || stem.ends_with("-test")
                    || stem.ends_with("_test")
                    || path.split('/').rev().skip(1).any(|dir| dir == "test"))
        })
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::files::{PackageFile, check_files};
    use super::*;

    fn set(files: &[(&str, &str)]) -> FileSet {
        check_files(
            files
                .iter()
                .map(|(p, t)| PackageFile {
                    path: (*p).to_owned(),
                    bytes: t.as_bytes().to_vec(),
                })
                .collect(),
        )
        .expect("a valid file set")
    }

    const SKILL: (&str, &str) = (
        "skills/tidy/SKILL.md",
        "---\nname: tidy\ndescription: Tidies.\n---\n",
    );

    fn with_manifest(manifest: &str) -> Result<Checked, Refusal> {
        check_package(&set(&[("package.json", manifest), SKILL]))
    }

    #[test]
    fn pi_1_a_skill_package_is_skill_only_and_an_extension_needs_tests() {
        let checked = with_manifest(r#"{"name":"tidy","version":"1.0.0"}"#).expect("accepted");
        assert_eq!(checked.profile, Profile::SkillOnly);
        let extension = set(&[
            (
                "package.json",
                r#"{"name":"x","version":"1.0.0","pi":{"extensions":["./extensions"]}}"#,
            ),
            ("extensions/index.ts", "export default function () {}"),
        ]);
        assert_eq!(
            check_package(&extension).expect_err("no tests").code,
            RefusalCode::PackageTestsMissing
        );
        let tested = set(&[
            (
                "package.json",
                r#"{"name":"x","version":"1.0.0","pi":{"extensions":["./extensions"]}}"#,
            ),
            ("extensions/index.ts", "export default function () {}"),
            ("test/index.test.mjs", "import test from 'node:test';"),
        ]);
        let checked = check_package(&tested).expect("accepted");
        assert_eq!(checked.profile, Profile::Extension);
        assert_eq!(checked.tests, ["test/index.test.mjs"]);
    }

    #[test]
    fn pi_1_identity_must_be_a_valid_name_and_an_exact_version() {
        for manifest in [
            r#"{"version":"1.0.0"}"#,
            r#"{"name":"Upper","version":"1.0.0"}"#,
            r#"{"name":"x","version":"^1.0.0"}"#,
            r#"{"name":"x","version":"1.0"}"#,
            r#"{"name":"x","version":"01.0.0"}"#,
            "[]",
            "not json",
        ] {
            assert_eq!(
                with_manifest(manifest).expect_err(manifest).code,
                RefusalCode::PackageIdentityInvalid,
                "{manifest}"
            );
        }
        assert!(with_manifest(r#"{"name":"@scope/x","version":"1.2.3-rc.1+b.5"}"#).is_ok());
    }

    #[test]
    fn pi_1_dependencies_are_exact_registry_versions() {
        for spec in [
            "^1.0.0",
            "~1.0.0",
            "*",
            "latest",
            "git+https://example.invalid/x.git",
            "github:user/repo",
            "file:../x",
            "link:../x",
            "https://example.invalid/x.tgz",
            "npm:other@1.0.0",
            "workspace:*",
            "1.0.0 || 2.0.0",
        ] {
            let manifest =
                format!(r#"{{"name":"x","version":"1.0.0","dependencies":{{"y":"{spec}"}}}}"#);
            assert_eq!(
                with_manifest(&manifest).expect_err(spec).code,
                RefusalCode::PackageDependencyRefused,
                "{spec}"
            );
        }
        let checked = with_manifest(
            r#"{"name":"x","version":"1.0.0","dependencies":{"y":"1.2.3"},"devDependencies":{"z":"2.0.0"},
                "peerDependencies":{"@mariozechner/pi-coding-agent":"*"}}"#,
        )
        .expect("accepted");
        assert_eq!(checked.dependencies, ["y@1.2.3"]);
        assert_eq!(checked.dev_dependencies, ["z@2.0.0"]);
        let peer = r#"{"name":"x","version":"1.0.0","peerDependencies":{"left-pad":"*"}}"#;
        assert_eq!(
            with_manifest(peer).expect_err("a foreign peer").code,
            RefusalCode::PackageDependencyRefused
        );
    }

    #[test]
    fn pi_1_lifecycle_scripts_are_refused() {
        for script in LIFECYCLE_SCRIPTS {
            let manifest =
                format!(r#"{{"name":"x","version":"1.0.0","scripts":{{"{script}":"node x.js"}}}}"#);
            assert_eq!(
                with_manifest(&manifest).expect_err(script).code,
                RefusalCode::PackageLifecycleScript,
                "{script}"
            );
        }
        let test_script = r#"{"name":"x","version":"1.0.0","scripts":{"test":"node --test"}}"#;
        assert!(with_manifest(test_script).is_ok());
        let gyp = set(&[
            ("package.json", r#"{"name":"x","version":"1.0.0"}"#),
            SKILL,
            ("binding.gyp", "{}"),
        ]);
        assert_eq!(
            check_package(&gyp).expect_err("gyp").code,
            RefusalCode::PackageLifecycleScript
        );
    }

    #[test]
    fn pi_1_resource_paths_stay_inside_the_package() {
        for entry in [
            "../outside",
            "/etc",
            "~/.pi",
            "skills/../../x",
            "node_modules/y/skills",
            "missing",
        ] {
            let manifest =
                format!(r#"{{"name":"x","version":"1.0.0","pi":{{"skills":["{entry}"]}}}}"#);
            assert_eq!(
                with_manifest(&manifest).expect_err(entry).code,
                RefusalCode::PackageResourcePathInvalid,
                "{entry}"
            );
        }
        let globbed =
            r#"{"name":"x","version":"1.0.0","pi":{"skills":["./skills/*", "!skills/old"]}}"#;
        assert!(with_manifest(globbed).is_ok());
    }

    #[test]
    fn a_second_package_json_is_a_second_root() {
        let two = set(&[
            ("package.json", r#"{"name":"x","version":"1.0.0"}"#),
            SKILL,
            ("skills/tidy/package.json", "{}"),
        ]);
        assert_eq!(
            check_package(&two).expect_err("two roots").code,
            RefusalCode::PackageIdentityInvalid
        );
    }
}
