//! The loader's side of validation (PI-1): the child's observation, parsed by the trusted parent
//! with bounds and believed only as far as the server's file set proves it; the surface it
//! yields; the reviewed manifest and the comparison with it; the hooks the platform supports.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::files::FileSet;
use super::package::Checked;
use super::{Profile, Refusal, RefusalCode, runtime_version};

/// The prefix of the child's one observation line.
pub const OBSERVATION_MARK: &str = "corral-pi-observation ";
/// The most bytes an observation line may have.
pub const OBSERVATION_MAX_BYTES: usize = 256 * 1024;
/// The most entries of any one list of an observation or a manifest.
pub const LIST_MAX: usize = 256;
/// The longest name (a skill's, tool's, command's, hook's, flag's...).
pub const NAME_MAX_CHARS: usize = 128;
/// The longest description or message kept.
pub const TEXT_MAX_CHARS: usize = 1024;
/// How much of the child's stderr a malformed observation carries for diagnosis.
pub const STDERR_TAIL_BYTES: usize = 2_048;

/// The hooks (`pi.on` events) an admitted package may subscribe to: the agent's session, turn,
/// message and tool-execution lifecycle. Not supported: hooks that see or rewrite provider
/// traffic (`before_provider_request`, `after_provider_response`: the platform's credentials),
/// that change the model or the session tree, that take the member's raw input or shell
/// (`input`, `user_bash`), that discover resources, and any name Pi does not define.
pub const SUPPORTED_HOOKS: [&str; 18] = [
    "session_start",
    "session_shutdown",
    "session_before_compact",
    "session_compact",
    "context",
    "before_agent_start",
    "agent_start",
    "agent_end",
    "turn_start",
    "turn_end",
    "message_start",
    "message_update",
    "message_end",
    "tool_execution_start",
    "tool_execution_update",
    "tool_execution_end",
    "tool_call",
    "tool_result",
];

/// A named resource with its description.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Named {
    /// Its name.
    pub name: Option<String>,
    /// Its description.
    #[serde(default)]
    pub description: Option<String>,
    /// Its file, relative to the package (skills, prompts, themes).
    #[serde(default)]
    pub path: Option<String>,
}

/// One loaded extension as the child saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservedExtension {
    /// Its file, relative to the package.
    pub path: String,
    /// Its tools.
    #[serde(default)]
    pub tools: Vec<Named>,
    /// Its commands.
    #[serde(default)]
    pub commands: Vec<Named>,
    /// The events it subscribes to.
    #[serde(default)]
    pub hooks: Vec<Option<String>>,
    /// Its command-line flags.
    #[serde(default)]
    pub flags: Vec<Option<String>>,
    /// Its keyboard shortcuts.
    #[serde(default)]
    pub shortcuts: Vec<Option<String>>,
    /// Its message renderers.
    #[serde(default)]
    pub renderers: Vec<Option<String>>,
}

/// An error or diagnostic the loader reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reported {
    /// `warning`, `error`, `collision` (diagnostics only).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// What it said.
    pub message: Option<String>,
    /// The file, relative to the package.
    #[serde(default)]
    pub path: Option<String>,
}

/// The runtime the child ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Its npm package.
    pub package: String,
    /// The version it reported.
    pub version: Option<String>,
}

/// The child's observation, as parsed: well-formed and bounded, not yet believed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observation {
    /// The runtime.
    pub runtime: Runtime,
    /// `skills` or `extension`.
    pub mode: Option<String>,
    /// Skills loaded.
    pub skills: Vec<Named>,
    /// Prompt templates loaded.
    pub prompts: Vec<Named>,
    /// Themes loaded.
    pub themes: Vec<Named>,
    /// Extensions loaded.
    pub extensions: Vec<ObservedExtension>,
    /// Model providers the extensions registered.
    pub providers: Vec<Option<String>>,
    /// Load errors.
    pub errors: Vec<Reported>,
    /// Diagnostics.
    pub diagnostics: Vec<Reported>,
}

/// Takes the child's one observation out of its stdout: exactly one line with
/// [`OBSERVATION_MARK`], at most [`OBSERVATION_MAX_BYTES`], JSON of [`Observation`]'s shape, with
/// every list within [`LIST_MAX`]. Output the authored code printed around it is ignored, unless
/// it flooded the stream past its bound (`truncated`): then nothing of it is believed.
///
/// # Errors
/// [`RefusalCode::PackageOutputFlooded`] when `truncated`;
/// [`RefusalCode::PackageObservationMalformed`]: none, two, too long, not the shape.
pub fn parse_observation(stdout: &[u8], truncated: bool) -> Result<Observation, Refusal> {
    let malformed = |why: &str| Refusal::new(RefusalCode::PackageObservationMalformed, why);
    if truncated {
        return Err(Refusal::new(
            RefusalCode::PackageOutputFlooded,
            "the loader's output exceeded its bound (SANDBOX_MAX_OUTPUT_BYTES): nothing of it is believed",
        ));
    }
    let mark = OBSERVATION_MARK.as_bytes();
    let mut lines = stdout
        .split(|b| *b == b'\n')
        .filter(|line| line.starts_with(mark));
    let line = match (lines.next(), lines.next()) {
        (Some(line), None) => line,
        (None, _) => return Err(malformed("the loader wrote no observation")),
        (Some(_), Some(_)) => {
            return Err(malformed(
                "more than one observation: one came from the package",
            ));
        }
    };
    if line.len() > OBSERVATION_MAX_BYTES {
        return Err(malformed("the observation is longer than its bound"));
    }
    let observation: Observation = serde_json::from_slice(&line[mark.len()..])
        .map_err(|e| malformed(&format!("the observation is not well-formed: {e}")))?;
    let lists = [
        observation.skills.len(),
        observation.prompts.len(),
        observation.themes.len(),
        observation.extensions.len(),
        observation.providers.len(),
        observation.errors.len(),
        observation.diagnostics.len(),
    ];
    let inner = observation.extensions.iter().flat_map(|e| {
        [
            e.tools.len(),
            e.commands.len(),
            e.hooks.len(),
            e.flags.len(),
            e.shortcuts.len(),
            e.renderers.len(),
        ]
    });
    if lists.into_iter().chain(inner).any(|n| n > LIST_MAX) {
        return Err(malformed(
            "a list of the observation is longer than its bound",
        ));
    }
    Ok(observation)
}

/// The package's surface: what it registers, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Surface {
    /// Skills.
    #[serde(default)]
    pub skills: BTreeSet<String>,
    /// Prompt templates.
    #[serde(default)]
    pub prompts: BTreeSet<String>,
    /// Themes.
    #[serde(default)]
    pub themes: BTreeSet<String>,
    /// Tools.
    #[serde(default)]
    pub tools: BTreeSet<String>,
    /// Commands.
    #[serde(default)]
    pub commands: BTreeSet<String>,
    /// Hooks (events subscribed to).
    #[serde(default)]
    pub hooks: BTreeSet<String>,
    /// Flags.
    #[serde(default)]
    pub flags: BTreeSet<String>,
    /// Shortcuts.
    #[serde(default)]
    pub shortcuts: BTreeSet<String>,
    /// Message renderers.
    #[serde(default)]
    pub renderers: BTreeSet<String>,
}

impl Surface {
    fn lists(&self) -> [(&'static str, &BTreeSet<String>); 9] {
        [
            ("skills", &self.skills),
            ("prompts", &self.prompts),
            ("themes", &self.themes),
            ("tools", &self.tools),
            ("commands", &self.commands),
            ("hooks", &self.hooks),
            ("flags", &self.flags),
            ("shortcuts", &self.shortcuts),
            ("renderers", &self.renderers),
        ]
    }

    /// Whether it registers any code-backed entry (tools, commands, hooks, flags, shortcuts,
    /// renderers): only an extension can.
    #[must_use]
    pub fn has_code(&self) -> bool {
        self.lists()[3..].iter().any(|(_, set)| !set.is_empty())
    }
}

/// The manifest the platform's reviewer approved: the package's identity and its surface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewedManifest {
    /// The package's name.
    pub name: String,
    /// Its exact version.
    pub version: String,
    /// What it registers.
    #[serde(flatten)]
    pub surface: Surface,
}

/// A difference between the loaded surface and the reviewed one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drift {
    /// `kind:name` entries the manifest declares and the package does not register.
    pub missing: Vec<String>,
    /// `kind:name` entries the package registers and the manifest does not declare.
    pub unexpected: Vec<String>,
}

impl Drift {
    /// Whether there is none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty()
    }
}

/// Compares `loaded` with `reviewed`, entry by entry.
#[must_use]
pub fn compare(loaded: &Surface, reviewed: &Surface) -> Drift {
    let mut drift = Drift::default();
    for ((kind, have), (_, want)) in loaded.lists().into_iter().zip(reviewed.lists()) {
        drift
            .missing
            .extend(want.difference(have).map(|name| format!("{kind}:{name}")));
        drift
            .unexpected
            .extend(have.difference(want).map(|name| format!("{kind}:{name}")));
    }
    drift
}

/// Checks the reviewed manifest against the package before anything runs: the same identity,
/// bounded lists of names, only supported hooks, no code-backed entry for a skill-only package,
/// and each declared skill and prompt present in the files.
///
/// # Errors
/// [`RefusalCode::PackageDeclarationMismatch`], or [`RefusalCode::PackageHookUnsupported`] for a
/// declared hook the platform does not support.
pub fn check_declarations(
    reviewed: &ReviewedManifest,
    checked: &Checked,
    files: &FileSet,
) -> Result<(), Refusal> {
    let mismatch = |at: &str, why: String| {
        Err(Refusal::at(
            RefusalCode::PackageDeclarationMismatch,
            at,
            why,
        ))
    };
    if reviewed.name != checked.name || reviewed.version != checked.version {
        return mismatch(
            "manifest.name",
            format!(
                "the reviewed manifest is for {}@{}, the package is {}@{}",
                reviewed.name, reviewed.version, checked.name, checked.version
            ),
        );
    }
    for (kind, names) in reviewed.surface.lists() {
        if names.len() > LIST_MAX {
            return mismatch(kind, format!("more than {LIST_MAX} entries"));
        }
        if let Some(bad) = names.iter().find(|n| !name_is_valid(n)) {
            return mismatch(kind, format!("{bad:?} is not a name"));
        }
    }
    if let Some(hook) = reviewed
        .surface
        .hooks
        .iter()
        .find(|h| !SUPPORTED_HOOKS.contains(&h.as_str()))
    {
        return Err(Refusal::at(
            RefusalCode::PackageHookUnsupported,
            &format!("manifest.hooks.{hook}"),
            "the platform does not support this hook",
        ));
    }
    if checked.profile == Profile::SkillOnly && reviewed.surface.has_code() {
        return mismatch(
            "manifest",
            "the manifest declares tools, commands or hooks, and the package has no extension"
                .to_owned(),
        );
    }
    for skill in &reviewed.surface.skills {
        let present = files.iter().any(|(path, _)| {
            path.ends_with(&format!("/{skill}/SKILL.md"))
                || path.ends_with(&format!("skills/{skill}.md"))
        });
        if !present {
            return mismatch(
                &format!("manifest.skills.{skill}"),
                "no SKILL.md in a directory of that name".to_owned(),
            );
        }
    }
    for prompt in &reviewed.surface.prompts {
        if !files
            .iter()
            .any(|(path, _)| path.rsplit('/').next() == Some(&format!("{prompt}.md")))
        {
            return mismatch(
                &format!("manifest.prompts.{prompt}"),
                "no markdown file of that name".to_owned(),
            );
        }
    }
    Ok(())
}

/// Whether `name` is a name a surface may hold: 1 to [`NAME_MAX_CHARS`] printable characters,
/// no whitespace.
#[must_use]
pub fn name_is_valid(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= NAME_MAX_CHARS
        && !name.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// Believes an observation as far as the trusted side can: the runtime is the lock's, the child
/// ran the profile's mode, the loader reported no error and no diagnostic, every name is valid,
/// every file it names is one of the server's and a skill's name is its directory's, a skill-only
/// package loaded no code, and every hook is supported. Returns the surface.
///
/// # Errors
/// [`RefusalCode::PiRuntimeUnavailable`], [`RefusalCode::PackageLoaderFailed`],
/// [`RefusalCode::PackageObservationMalformed`], [`RefusalCode::PackageHookUnsupported`].
pub fn believe(
    observation: &Observation,
    profile: Profile,
    files: &FileSet,
) -> Result<Surface, Refusal> {
    let malformed = |why: String| Err(Refusal::new(RefusalCode::PackageObservationMalformed, why));
    if observation.runtime.version.as_deref() != Some(runtime_version()) {
        return Err(Refusal::new(
            RefusalCode::PiRuntimeUnavailable,
            format!(
                "the worker's Pi runtime reported {:?}; the lock pins {}",
                observation.runtime.version,
                runtime_version()
            ),
        ));
    }
    let mode = match profile {
        Profile::SkillOnly => "skills",
        Profile::Extension => "extension",
    };
    if observation.mode.as_deref() != Some(mode) {
        return malformed(format!("the observation is not of the {mode} mode"));
    }
    if let Some(first) = observation.errors.first() {
        return Err(loader_failed(first, observation.errors.len()));
    }
    if let Some(first) = observation.diagnostics.first() {
        return Err(loader_failed(first, observation.diagnostics.len()));
    }
    let mut surface = Surface::default();
    let in_files = |path: &Option<String>| path.as_deref().is_some_and(|p| files.get(p).is_some());
    for (list, into, kind) in [
        (&observation.skills, &mut surface.skills, "skill"),
        (&observation.prompts, &mut surface.prompts, "prompt"),
        (&observation.themes, &mut surface.themes, "theme"),
    ] {
        for entry in list {
            let name = entry.name.as_deref().unwrap_or_default();
            if !name_is_valid(name) || !in_files(&entry.path) {
                return malformed(format!(
                    "a {kind} named {name:?} at {:?}, which is not a file of the package",
                    entry.path
                ));
            }
            into.insert(name.to_owned());
        }
    }
    for skill in &observation.skills {
        let path = skill.path.as_deref().unwrap_or_default();
        let dir = path.rsplit('/').nth(1).unwrap_or_default();
        let name = skill.name.as_deref().unwrap_or_default();
        let named_file = path.rsplit('/').next() == Some(&format!("{name}.md"));
        if dir != name && !named_file {
            return Err(Refusal::at(
                RefusalCode::PackageLoaderFailed,
                path,
                format!("the skill {name:?} is not named for its directory {dir:?}"),
            ));
        }
    }
    if profile == Profile::SkillOnly && !observation.extensions.is_empty() {
        return malformed("a skill-only package loaded an extension".to_owned());
    }
    for extension in &observation.extensions {
        if files.get(&extension.path).is_none() {
            return malformed(format!(
                "an extension at {:?}, which is not a file of the package",
                extension.path
            ));
        }
        let named = |list: &[Named]| list.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
        for (names, into) in [
            (named(&extension.tools), &mut surface.tools),
            (named(&extension.commands), &mut surface.commands),
            (extension.hooks.clone(), &mut surface.hooks),
            (extension.flags.clone(), &mut surface.flags),
            (extension.shortcuts.clone(), &mut surface.shortcuts),
            (extension.renderers.clone(), &mut surface.renderers),
        ] {
            for name in names {
                match name {
                    Some(name) if name_is_valid(&name) => {
                        into.insert(name);
                    }
                    other => return malformed(format!("a registered name {other:?}")),
                }
            }
        }
    }
    if let Some(hook) = surface
        .hooks
        .iter()
        .find(|h| !SUPPORTED_HOOKS.contains(&h.as_str()))
    {
        return Err(Refusal::at(
            RefusalCode::PackageHookUnsupported,
            hook,
            "the package subscribes to a hook the platform does not support",
        ));
    }
    if let Some(provider) = observation.providers.first() {
        return Err(Refusal::at(
            RefusalCode::PackageHookUnsupported,
            "registerProvider",
            format!(
                "the package registers a model provider ({provider:?}); the platform does not support one"
            ),
        ));
    }
    Ok(surface)
}

fn loader_failed(first: &Reported, count: usize) -> Refusal {
    let message: String = first
        .message
        .as_deref()
        .unwrap_or("no message")
        .chars()
        .take(TEXT_MAX_CHARS)
        .collect();
    let more = if count > 1 {
        format!(" (and {} more)", count - 1)
    } else {
        String::new()
    };
    Refusal {
        code: RefusalCode::PackageLoaderFailed,
        at: first.path.clone(),
        message: format!("Pi's loader: {message}{more}"),
    }
}

/// The last [`STDERR_TAIL_BYTES`] of `stderr`, as text: all a malformed observation carries.
#[must_use]
pub fn stderr_tail(stderr: &str) -> String {
    let skip = stderr.len().saturating_sub(STDERR_TAIL_BYTES);
    let start = (skip..=stderr.len())
        .find(|i| stderr.is_char_boundary(*i))
        .unwrap_or(stderr.len());
    stderr[start..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::super::files::{PackageFile, check_files};
    use super::*;

    fn files() -> FileSet {
        check_files(
            [
                ("package.json", "{}"),
                ("skills/tidy/SKILL.md", "---\nname: tidy\n---\n"),
                ("extensions/index.ts", "export default () => {}"),
            ]
            .iter()
            .map(|(p, t)| PackageFile {
                path: (*p).to_owned(),
                bytes: t.as_bytes().to_vec(),
            })
            .collect(),
        )
        .expect("files")
    }

    fn line(json: &str) -> Vec<u8> {
        format!("noise from the package\n{OBSERVATION_MARK}{json}\nmore noise\n").into_bytes()
    }

    fn observation(extension: &str) -> String {
        format!(
            r#"{{"runtime":{{"package":"{}","version":"{}"}},"mode":"extension",
            "skills":[{{"name":"tidy","description":"Tidies.","path":"skills/tidy/SKILL.md"}}],
            "prompts":[],"themes":[],"extensions":[{extension}],"providers":[],"errors":[],"diagnostics":[]}}"#,
            super::super::RUNTIME_PACKAGE,
            runtime_version()
        )
        .replace('\n', " ")
    }

    const EXTENSION: &str = r#"{"path":"extensions/index.ts","tools":[{"name":"shout","description":"x"}],
        "commands":[{"name":"shout","description":"y"}],"hooks":["tool_call"],"flags":[],"shortcuts":[],"renderers":[]}"#;

    #[test]
    fn pi_1_an_observation_is_one_marked_line_of_the_shape() {
        let parsed = parse_observation(&line(&observation(&EXTENSION.replace('\n', " "))), false)
            .expect("parsed");
        let surface = believe(&parsed, Profile::Extension, &files()).expect("believed");
        assert_eq!(surface.tools, BTreeSet::from(["shout".to_owned()]));
        assert_eq!(surface.hooks, BTreeSet::from(["tool_call".to_owned()]));
        let flooded = [line(&observation("")), b"x".repeat(1000)].concat();
        assert_eq!(
            parse_observation(&flooded, true).expect_err("flooded").code,
            RefusalCode::PackageOutputFlooded
        );
        for (stdout, truncated) in [
            (b"garbage".to_vec(), false),
            (format!("{OBSERVATION_MARK}{{not json").into_bytes(), false),
            (
                [line(&observation("")), line(&observation(""))].concat(),
                false,
            ),
            (
                line(r#"{"runtime":{"package":"x","version":"1"},"extra":1}"#),
                false,
            ),
        ] {
            assert_eq!(
                parse_observation(&stdout, truncated)
                    .expect_err("malformed")
                    .code,
                RefusalCode::PackageObservationMalformed
            );
        }
    }

    #[test]
    fn pi_1_a_file_the_server_does_not_hold_is_not_believed() {
        let forged = EXTENSION
            .replace("extensions/index.ts", "extensions/other.ts")
            .replace('\n', " ");
        let parsed = parse_observation(&line(&observation(&forged)), false).expect("parsed");
        assert_eq!(
            believe(&parsed, Profile::Extension, &files())
                .expect_err("forged")
                .code,
            RefusalCode::PackageObservationMalformed
        );
    }

    #[test]
    fn pi_1_unsupported_hooks_and_loader_errors_fail_closed() {
        let input = EXTENSION.replace("tool_call", "input").replace('\n', " ");
        let parsed = parse_observation(&line(&observation(&input)), false).expect("parsed");
        assert_eq!(
            believe(&parsed, Profile::Extension, &files())
                .expect_err("unsupported")
                .code,
            RefusalCode::PackageHookUnsupported
        );
        let failed = observation("").replace(
            r#""errors":[]"#,
            r#""errors":[{"path":"extensions/index.ts","message":"boom"}]"#,
        );
        let parsed = parse_observation(&line(&failed), false).expect("parsed");
        let refusal = believe(&parsed, Profile::Extension, &files()).expect_err("failed");
        assert_eq!(refusal.code, RefusalCode::PackageLoaderFailed);
        assert!(refusal.message.contains("boom"), "{}", refusal.message);
        let other = observation("").replace(runtime_version(), "0.0.1");
        let parsed = parse_observation(&line(&other), false).expect("parsed");
        assert_eq!(
            believe(&parsed, Profile::Extension, &files())
                .expect_err("runtime")
                .code,
            RefusalCode::PiRuntimeUnavailable
        );
    }

    #[test]
    fn pi_1_drift_names_what_is_missing_and_what_is_unexpected() {
        let loaded = Surface {
            tools: BTreeSet::from(["a".to_owned(), "b".to_owned()]),
            ..Surface::default()
        };
        let reviewed = Surface {
            tools: BTreeSet::from(["b".to_owned(), "c".to_owned()]),
            ..Surface::default()
        };
        let drift = compare(&loaded, &reviewed);
        assert_eq!(drift.missing, ["tools:c"]);
        assert_eq!(drift.unexpected, ["tools:a"]);
        assert!(compare(&loaded, &loaded).is_empty());
    }

    #[test]
    fn the_stderr_tail_is_bounded_on_a_character_boundary() {
        let long = "é".repeat(STDERR_TAIL_BYTES);
        let tail = stderr_tail(&long);
        assert!(tail.len() <= STDERR_TAIL_BYTES);
        assert!(tail.chars().all(|c| c == 'é'));
    }
}
