//! What a `run_code` request may ask (ISO-1, WS-4, WS-7, KER-1, BOUND-1, POOL-3, EGR-4, PKG-6).
//!
//! [`admit`] takes the request as received and the deployment's settings, and answers one of:
//! - [`Admission::Admitted`]: every field checked and typed, ready to lease a worker for;
//! - [`Admission::NotRun`]: a `not_run` record, answered before any lease (PKG-6: a persistent
//!   cell that names the shared-resource contract);
//! - [`Admission::UnsupportedLanguage`]: a `not_run` record whose error names the language asked
//!   for and the ones that run;
//! - [`Admission::Refused`]: a malformed request, with a stable code and the field it names.
//!
//! The worker checks what reaches it again with the same functions (the language is a type on the
//! wire, the bounds go through [`crate::bounds::lowered_bounds`], the code through
//! [`crate::bounds::code_fits`]), so nothing an admitted request asks can differ at the worker.

use crate::bounds::{BoundOverrides, ExecutionBounds, code_fits, lowered_bounds};
use crate::config::Settings;
use crate::downloads::relative_path;
use crate::egress::grant::PROVIDER_HINT_MAX;
use crate::egress::target::NAME_MAX_BYTES;
use crate::ids::{ActorId, ConversationId, MemberId, first_invalid_identity, identity_is_valid};
use crate::jail::{Language, NotRun, UnsupportedLanguage};
use crate::kernel::{Kernel, names_resource_contract};
use crate::packages::resolve::{Available, DependencyFailure, Resolution, resolve};
use crate::packages::stack::baked;
use crate::tools::Tools;

/// The most names a run may declare as outputs (WS-7).
pub const DECLARED_MAX: usize = 64;

/// The body of `POST /v1/run_code`, as received: strings where the caller may be wrong, so that
/// [`admit`] can say exactly what is wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunCodeRequest {
    /// Whose workspace (with the conversation).
    pub actor: String,
    /// The conversation.
    pub conversation: String,
    /// The member the lease counts against (POOL-3).
    pub member: String,
    /// `python` or `node`.
    pub language: String,
    /// The program.
    pub code: String,
    /// Relative names the run will create (WS-7): shown as progress, granting nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub declared_outputs: Vec<String>,
    /// Hosts the provider hints at (EGR-4): narrows `host_allowlist`, ignored elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_hint: Option<Vec<String>>,
    /// `ephemeral` (the default) or `persistent` (KER-1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Per-run bounds, each no higher than the deployment's.
    #[serde(default, skip_serializing_if = "is_default")]
    pub bounds: BoundOverrides,
    /// How long to wait for a worker, capped by `SANDBOX_ACQUIRE_WAIT_SECONDS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
    /// Packages the run needs beyond what its imports name (PKG-4): Python requirement names
    /// with optional exact versions (`humanize`, `pandas==2.2.3`), or npm names
    /// (`left-pad@1.3.0`). Never a URL, a path, an index or an installer flag.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// The read-only tools the platform advertises for the run, and the capability that calls
    /// them (KER-5); the code calls them through the worker's supervisor, never holding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Tools>,
    /// Whether the member enabled tool-result compression (CMP-1): the model's stdout and
    /// stderr may be shortened; the raw output stays canonical beside them.
    #[serde(default, skip_serializing_if = "is_false")]
    pub compress_output: bool,
    /// The agent's turn this run belongs to (PROJ-7): links the turn made since admission are
    /// the run's own. Without one, the run is a turn of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<String>,
    /// Documents the agent re-authorized from a retrieval result for this turn only (PROJ-2),
    /// by reference; the authority judges each under the member. The conversation's own
    /// attachments are never listed here: the server resolves them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retrieved: Vec<String>,
}

/// The most references a turn may re-authorize from retrieval (PROJ-2).
pub const RETRIEVED_MAX: usize = crate::projection::FILES_MAX * 2;

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(value: &bool) -> bool {
    !*value
}

fn is_default(overrides: &BoundOverrides) -> bool {
    *overrides == BoundOverrides::default()
}

/// A request admitted: every field checked and typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// Whose workspace.
    pub actor: ActorId,
    /// The conversation.
    pub conversation: ConversationId,
    /// The member the lease counts against.
    pub member: MemberId,
    /// The language, parsed once.
    pub language: Language,
    /// The program, within [`code_fits`].
    pub code: String,
    /// The declared outputs, each a normalized relative path, without repeats, in the order given.
    pub declared: Vec<String>,
    /// The overrides asked for, forwarded to the worker (which applies them to its own ceiling).
    pub overrides: BoundOverrides,
    /// The bounds the run gets here: the configured ones, lowered by the overrides.
    pub bounds: ExecutionBounds,
    /// The provider hint, at most [`PROVIDER_HINT_MAX`] names.
    pub provider_hint: Option<Vec<String>>,
    /// How long to wait for a worker, at most `SANDBOX_ACQUIRE_WAIT_SECONDS`, over every attempt.
    pub wait_ms: u64,
    /// What the run's dependencies need: satisfied by the baked stack, or installed through the
    /// broker before the code runs.
    pub dependencies: Resolution,
    /// Ephemeral, or persistent (KER-1): a persistent cell restores and checkpoints its
    /// variables, and has no egress (KER-5).
    pub kernel: Kernel,
    /// The tools the code may call (KER-5).
    pub tools: Option<Tools>,
    /// Whether the model's output may be compressed (CMP-1).
    pub compress_output: bool,
    /// The turn (PROJ-7).
    pub turn: Option<String>,
    /// The re-authorized references (PROJ-2), without repeats.
    pub retrieved: Vec<String>,
    /// Whether the code names the shared-resource contract: it asked for files (PROJ-4).
    pub asks_for_files: bool,
}

impl Admitted {
    /// Whether this is a Python run that uses the data stack a warm jail pre-imports
    /// (`CORRAL_WORKER_PYTHON_PREIMPORT`, `settings.prepare.python_preimport`): its lease goes first
    /// to a worker that holds the stack's jail (decision 0058).
    #[must_use]
    pub fn uses_stack(&self, settings: &Settings) -> bool {
        self.language == Language::Python
            && crate::packages::imports::uses_any(
                self.code.as_bytes(),
                &settings.prepare.python_preimport,
            )
    }
}

/// Why a request is refused. The codes are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalCode {
    /// An actor, conversation or member that is empty, too long or has a control character.
    InvalidIdentity,
    /// A kernel other than `ephemeral` or `persistent`.
    KernelUnknown,
    /// The code is larger than `SANDBOX_WORKSPACE_MAX_BYTES`.
    CodeTooLarge,
    /// A bound override that is zero or above the deployment's bound.
    BoundOverrideRefused,
    /// Too many declared outputs, or one that is not a relative path inside the workspace.
    DeclaredOutputInvalid,
    /// Too many provider-hint names, or one longer than a DNS name.
    ProviderHintInvalid,
    /// A malformed tool list or capability (KER-5).
    ToolsInvalid,
    /// A malformed turn, or too many or malformed retrieved references (PROJ-2, PROJ-7).
    ResourcesInvalid,
}

impl RefusalCode {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::InvalidIdentity => "invalid_identity",
            Self::KernelUnknown => "kernel_unknown",
            Self::CodeTooLarge => "code_too_large",
            Self::BoundOverrideRefused => "bound_override_refused",
            Self::DeclaredOutputInvalid => "declared_output_invalid",
            Self::ProviderHintInvalid => "provider_hint_invalid",
            Self::ToolsInvalid => "tools_invalid",
            Self::ResourcesInvalid => "resources_invalid",
        }
    }
}

/// A refused request: the code, the field it names, the setting when a bound refused it, and a
/// sentence for a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The stable code.
    pub code: RefusalCode,
    /// The request field at fault.
    pub field: &'static str,
    /// The setting whose bound refused it, if one did.
    pub setting: Option<&'static str>,
    /// What is wrong, for a person.
    pub message: String,
}

/// What [`admit`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Ready to lease a worker for.
    Admitted(Box<Admitted>),
    /// Answered with a `not_run` record, before any lease.
    NotRun(NotRun),
    /// Refused as malformed.
    Refused(Refusal),
    /// Answered with a `not_run` record of its dependencies (PKG-6), before any lease.
    Dependencies(DependencyFailure),
    /// Answered with a `not_run` record naming the language asked for and the ones that run
    /// (PKG-6), before any lease.
    UnsupportedLanguage(UnsupportedLanguage),
}

fn refused(
    code: RefusalCode,
    field: &'static str,
    setting: Option<&'static str>,
    message: impl Into<String>,
) -> Admission {
    Admission::Refused(Refusal {
        code,
        field,
        setting,
        message: message.into(),
    })
}

/// Judges `request` under `settings`, with the registries `available` to the broker. Checks run
/// in a fixed order (identity, kernel, language, code, bounds, declared outputs, provider hint,
/// tools, dependencies) and the first failure answers.
#[must_use]
pub fn admit(request: RunCodeRequest, settings: &Settings, available: Available) -> Admission {
    if let Some((field, message)) = first_invalid_identity(&[
        ("actor", &request.actor),
        ("conversation", &request.conversation),
        ("member", &request.member),
    ]) {
        return refused(RefusalCode::InvalidIdentity, field, None, message);
    }
    let kernel = match request.kernel.as_deref().map(Kernel::parse) {
        None => Kernel::Ephemeral,
        Some(Some(kernel)) => kernel,
        Some(None) => {
            return refused(
                RefusalCode::KernelUnknown,
                "kernel",
                None,
                "kernel must be ephemeral or persistent",
            );
        }
    };
    let language = match Language::parse(&request.language) {
        Ok(language) => language,
        Err(refused) => return Admission::UnsupportedLanguage(refused),
    };
    // A persistent kernel mounts no resources (KER-5). Whether its checkpoints can be sealed
    // (a field key) is the shell's to know: it answers `persistent_kernel_unavailable` without.
    if kernel == Kernel::Persistent && names_resource_contract(&request.code) {
        return Admission::NotRun(NotRun::ResourcePersistentKernel);
    }
    let configured = &settings.bounds;
    if !code_fits(request.code.len(), configured) {
        return refused(
            RefusalCode::CodeTooLarge,
            "code",
            Some("SANDBOX_WORKSPACE_MAX_BYTES"),
            format!(
                "the code is over {} bytes (SANDBOX_WORKSPACE_MAX_BYTES)",
                configured.workspace_max_bytes
            ),
        );
    }
    let bounds = match lowered_bounds(configured, &request.bounds) {
        Ok(bounds) => bounds,
        Err(refusal) => {
            return refused(
                RefusalCode::BoundOverrideRefused,
                "bounds",
                Some(refusal.setting),
                format!(
                    "a bound override must be at least 1 and at most the deployment's {}",
                    refusal.setting
                ),
            );
        }
    };
    let declared = match declared_outputs(&request.declared_outputs) {
        Ok(declared) => declared,
        Err(message) => {
            return refused(
                RefusalCode::DeclaredOutputInvalid,
                "declared_outputs",
                None,
                message,
            );
        }
    };
    if let Some(hint) = &request.provider_hint
        && (hint.len() > PROVIDER_HINT_MAX || hint.iter().any(|h| h.len() > NAME_MAX_BYTES))
    {
        return refused(
            RefusalCode::ProviderHintInvalid,
            "provider_hint",
            None,
            format!("at most {PROVIDER_HINT_MAX} host names of at most {NAME_MAX_BYTES} bytes"),
        );
    }
    if let Some(Err(message)) = request.tools.as_ref().map(Tools::check) {
        return refused(RefusalCode::ToolsInvalid, "tools", None, message);
    }
    if let Some(turn) = &request.turn
        && !identity_is_valid(turn)
    {
        return refused(
            RefusalCode::ResourcesInvalid,
            "turn",
            None,
            "turn must be 1 to 256 bytes with no control character",
        );
    }
    if request.retrieved.len() > RETRIEVED_MAX
        || !request.retrieved.iter().all(|r| identity_is_valid(r))
    {
        return refused(
            RefusalCode::ResourcesInvalid,
            "retrieved",
            None,
            format!(
                "retrieved lists at most {RETRIEVED_MAX} references of 1 to 256 bytes with no control character"
            ),
        );
    }
    let mut retrieved: Vec<String> = Vec::with_capacity(request.retrieved.len());
    for reference in request.retrieved {
        if !retrieved.contains(&reference) {
            retrieved.push(reference);
        }
    }
    let dependencies = match resolve(
        language,
        &request.packages,
        &request.code,
        baked(),
        available,
    ) {
        Ok(resolution) => resolution,
        Err(failure) => return Admission::Dependencies(failure),
    };
    let wait_max_ms = settings.pool().acquire_wait_ms;
    let wait_ms = request
        .wait_seconds
        .map_or(wait_max_ms, |s| s.saturating_mul(1_000).min(wait_max_ms));
    let asks_for_files = names_resource_contract(&request.code);
    Admission::Admitted(Box::new(Admitted {
        actor: ActorId(request.actor),
        conversation: ConversationId(request.conversation),
        member: MemberId(request.member),
        language,
        code: request.code,
        declared,
        overrides: request.bounds,
        bounds,
        provider_hint: request.provider_hint,
        wait_ms,
        dependencies,
        kernel,
        tools: request.tools,
        compress_output: request.compress_output,
        turn: request.turn,
        retrieved,
        asks_for_files,
    }))
}

/// The declared outputs as normalized relative paths without repeats, or what is wrong with them.
///
/// # Errors
/// Too many names, or a name that is not a relative path inside the workspace (WS-4).
pub fn declared_outputs(names: &[String]) -> Result<Vec<String>, String> {
    if names.len() > DECLARED_MAX {
        return Err(format!("at most {DECLARED_MAX} declared outputs"));
    }
    let mut declared: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let path = relative_path(name)
            .map_err(|refused| format!("declared output {name:?}: {}", refused.code()))?;
        if !declared.contains(&path) {
            declared.push(path);
        }
    }
    Ok(declared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RunCodeRequest {
        RunCodeRequest {
            actor: "a".into(),
            conversation: "c".into(),
            member: "m".into(),
            language: "python".into(),
            code: "print(1)".into(),
            ..RunCodeRequest::default()
        }
    }

    const ANY: Available = Available {
        python: true,
        npm: true,
    };

    fn settings() -> Settings {
        Settings::from_pairs(&[("SANDBOX_ACQUIRE_WAIT_SECONDS", "30")]).unwrap()
    }

    fn refusal(request: RunCodeRequest) -> Refusal {
        match admit(request, &settings(), ANY) {
            Admission::Refused(refusal) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_admitted_request_is_parsed_typed_and_capped_by_the_settings() {
        let mut asked = request();
        asked.bounds.max_wall_seconds = Some(5);
        asked.declared_outputs = vec!["./out/report.pdf".into(), "out/report.pdf".into()];
        asked.wait_seconds = Some(3_600);
        let Admission::Admitted(admitted) = admit(asked, &settings(), ANY) else {
            panic!("not admitted");
        };
        assert_eq!(admitted.language, Language::Python);
        assert_eq!(admitted.bounds.max_wall_seconds, 5);
        assert_eq!(admitted.declared, ["out/report.pdf"]);
        assert_eq!(
            admitted.wait_ms, 30_000,
            "the wait is capped by the setting"
        );
    }

    #[test]
    fn pkg_06_an_unsupported_language_is_not_run_before_a_lease() {
        let mut ruby = request();
        ruby.language = "ruby".into();
        let Admission::UnsupportedLanguage(refused) = admit(ruby, &settings(), ANY) else {
            panic!("ruby is not refused as an unsupported language");
        };
        assert_eq!(
            (
                refused.code,
                refused.language.as_str(),
                refused.supported.as_slice()
            ),
            (
                NotRun::UnsupportedLanguage,
                "ruby",
                ["python", "node"].as_slice()
            )
        );
        let mut alias = request();
        alias.language = "python3".into();
        let Admission::Admitted(admitted) = admit(alias, &settings(), ANY) else {
            panic!("python3 is not admitted");
        };
        assert_eq!(admitted.language, Language::Python);
    }

    #[test]
    fn ker_05_a_persistent_cell_naming_the_resource_contract_is_not_run() {
        let keyed = settings();
        let mut persistent = request();
        persistent.kernel = Some("persistent".into());
        let Admission::Admitted(admitted) = admit(persistent.clone(), &keyed, ANY) else {
            panic!("a keyed persistent cell is admitted");
        };
        assert_eq!(admitted.kernel, Kernel::Persistent);
        for name in crate::kernel::RESOURCE_CONTRACT {
            let mut asks = persistent.clone();
            asks.code = format!("import os\nprint(os.environ.get({name:?}))");
            assert_eq!(
                admit(asks.clone(), &keyed, ANY),
                Admission::NotRun(NotRun::ResourcePersistentKernel)
            );
            // The same code in an ephemeral run is admitted.
            asks.kernel = None;
            assert!(matches!(admit(asks, &keyed, ANY), Admission::Admitted(_)));
        }
    }

    #[test]
    fn pkg_06_a_bad_dependency_request_is_not_run_before_a_lease() {
        for bad in [
            "--index-url=http://x/simple",
            "-e",
            "./pkg",
            "https://x/p.whl",
            "p @ file:///x",
        ] {
            let mut asked = request();
            asked.packages = vec![bad.into()];
            match admit(asked, &settings(), ANY) {
                Admission::Dependencies(failure) => {
                    assert_eq!(failure.reason(), NotRun::DependencyRequestInvalid, "{bad}");
                }
                other => panic!("{bad}: expected a dependency refusal, got {other:?}"),
            }
        }
        let mut docx = request();
        docx.code = "import docx\nimport pandas".into();
        let Admission::Admitted(admitted) = admit(docx, &settings(), ANY) else {
            panic!("not admitted");
        };
        assert!(
            !admitted.dependencies.needs_broker(),
            "the baked stack provides docx and pandas"
        );
        assert!(
            admitted
                .dependencies
                .satisfied
                .iter()
                .any(|s| s.starts_with("python-docx "))
        );
    }

    #[test]
    fn each_malformed_field_is_refused_with_its_own_code() {
        let mut bad_actor = request();
        bad_actor.actor = "a\nb".into();
        let bad_actor = refusal(bad_actor);
        assert_eq!(
            (bad_actor.code, bad_actor.field),
            (RefusalCode::InvalidIdentity, "actor")
        );
        let mut kernel = request();
        kernel.kernel = Some("warm".into());
        assert_eq!(refusal(kernel).code, RefusalCode::KernelUnknown);
        let mut big = request();
        big.code = "x".repeat(8 * 1024 * 1024 + 1);
        let big = refusal(big);
        assert_eq!(
            (big.code, big.setting),
            (
                RefusalCode::CodeTooLarge,
                Some("SANDBOX_WORKSPACE_MAX_BYTES")
            )
        );
        let mut raised = request();
        raised.bounds.max_memory_bytes = Some(u64::MAX);
        let raised = refusal(raised);
        assert_eq!(
            (raised.code, raised.setting),
            (
                RefusalCode::BoundOverrideRefused,
                Some("SANDBOX_MAX_MEMORY_BYTES")
            )
        );
        for names in [
            vec!["../x.pdf".to_owned()],
            vec!["/etc/passwd".to_owned()],
            vec![String::new()],
            (0..=DECLARED_MAX).map(|i| format!("f{i}")).collect(),
        ] {
            let mut declared = request();
            declared.declared_outputs = names;
            assert_eq!(refusal(declared).code, RefusalCode::DeclaredOutputInvalid);
        }
        let mut hint = request();
        hint.provider_hint = Some(vec!["h".repeat(NAME_MAX_BYTES + 1)]);
        assert_eq!(refusal(hint).code, RefusalCode::ProviderHintInvalid);
    }

    #[test]
    fn an_unknown_field_is_not_a_request() {
        let parsed: Result<RunCodeRequest, _> = serde_json::from_str(
            r#"{"actor":"a","conversation":"c","member":"m","language":"python","code":"1","sudo":true}"#,
        );
        assert!(parsed.is_err());
    }
}
