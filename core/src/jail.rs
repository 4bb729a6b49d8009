//! The rules of one run in the worker's jail (ISO-1, PKG-6): which languages run, why a run is
//! refused before it starts, and which isolation posture is acceptable. The bounds a run may hit
//! are [`crate::bounds`]'s.
//!
//! The worker (`corral-worker`) measures and enforces; every decision about what a measurement
//! means is made here, so the control API, the operator tool and the tests agree.

use std::collections::BTreeSet;

// ---------------------------------------------------------------------------------------------
// Languages and refusals.

/// A language the jail runs. On the wire, its name as the caller writes it (`python`, `node`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Python 3.
    Python,
    /// Node.js.
    Node,
}

impl Language {
    /// Every language, in the order an answer names them.
    pub const ALL: [Language; 2] = [Self::Python, Self::Node];

    /// The language named `text`: its canonical name (`python`, `node`) or one of the aliases an
    /// agent commonly writes for it ([`Language::aliases`]), in any ASCII case. Anything else,
    /// including `python2`, `typescript` and a name with spaces around it, is refused before it
    /// runs (PKG-6) with what the agent needs to write instead.
    ///
    /// # Errors
    /// [`UnsupportedLanguage`] for any other name.
    pub fn parse(text: &str) -> Result<Self, UnsupportedLanguage> {
        Self::ALL
            .into_iter()
            .find(|language| {
                language
                    .aliases()
                    .iter()
                    .any(|alias| alias.eq_ignore_ascii_case(text))
            })
            .ok_or_else(|| UnsupportedLanguage::new(text))
    }

    /// The names that mean this language, its canonical name first.
    #[must_use]
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            Self::Python => &["python", "python3", "py"],
            Self::Node => &["node", "nodejs", "node.js", "javascript", "js"],
        }
    }

    /// The name as the caller writes it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::Node => "node",
        }
    }

    /// The extension of the file the code is written to.
    #[must_use]
    pub fn extension(self) -> &'static str {
        match self {
            Self::Python => "py",
            Self::Node => "js",
        }
    }
}

/// The most characters of a refused language name an answer echoes back.
pub const LANGUAGE_ECHO_MAX_CHARS: usize = 64;

/// A language name the jail does not run, said so that an agent can write the right one: the
/// name as asked (bounded to [`LANGUAGE_ECHO_MAX_CHARS`] and escaped, so that an invisible or
/// enormous name is still readable), every supported language with its aliases, and a sentence.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UnsupportedLanguage {
    /// Always [`NotRun::UnsupportedLanguage`].
    pub code: NotRun,
    /// The name asked for: at most [`LANGUAGE_ECHO_MAX_CHARS`] characters, escaped, with `…`
    /// when it was longer.
    pub language: String,
    /// How many characters the name asked for has.
    pub language_chars: usize,
    /// The canonical names that run.
    pub supported: Vec<&'static str>,
    /// Every name accepted for each canonical one.
    pub aliases: std::collections::BTreeMap<&'static str, &'static [&'static str]>,
    /// What to do, for the agent.
    pub message: String,
}

impl UnsupportedLanguage {
    fn new(asked: &str) -> Self {
        let language_chars = asked.chars().count();
        let mut language: String = asked
            .chars()
            .take(LANGUAGE_ECHO_MAX_CHARS)
            .flat_map(char::escape_debug)
            .collect();
        if language_chars > LANGUAGE_ECHO_MAX_CHARS {
            language.push('…');
        }
        let supported: Vec<&'static str> = Language::ALL.iter().map(|l| l.as_str()).collect();
        let aliases = Language::ALL
            .iter()
            .map(|l| (l.as_str(), l.aliases()))
            .collect();
        let what = if asked.is_empty() {
            "no language was given".to_owned()
        } else {
            format!("the language \"{language}\" is not one Corral runs")
        };
        let message = format!(
            "{what}: set \"language\" to \"python\" (Python 3; also python3, py) or \"node\" \
             (Node.js; also nodejs, javascript, js)"
        );
        Self {
            code: NotRun::UnsupportedLanguage,
            language,
            language_chars,
            supported,
            aliases,
            message,
        }
    }
}

impl std::fmt::Display for UnsupportedLanguage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Why code was not run. Returned before any of the code executes; the codes are stable (PKG-6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NotRun {
    /// The language is not Python or Node.
    UnsupportedLanguage,
    /// An isolation primitive the jail needs is missing and the operator did not accept a weaker
    /// posture ([`Primitive`] says which).
    IsolationUnavailable,
    /// The workspace handed in is larger than `SANDBOX_WORKSPACE_MAX_BYTES` or has more entries
    /// than a workspace may hold.
    WorkspaceTooLarge,
    /// The code itself is larger than `SANDBOX_WORKSPACE_MAX_BYTES`.
    CodeTooLarge,
    /// The jail could not be built for another reason; the diagnostics say which step failed.
    JailSetupFailed,
    /// A persistent kernel was asked for and cannot be given here (KER-1): the deployment has no
    /// field key to seal its checkpoints with. The code is refused rather than run ephemerally.
    PersistentKernelUnavailable,
    /// A persistent cell names the shared-resource contract; a persistent kernel mounts no
    /// resources (KER-5).
    ResourcePersistentKernel,
    /// The kernel's checkpoint is not a checkpoint, truncated, or does not match its header.
    KernelCheckpointCorrupt,
    /// The kernel's checkpoint has no valid seal: it was not written by a persistent cell of this
    /// workspace (see the kernel module).
    KernelCheckpointUntrusted,
    /// The kernel's checkpoint was written by another interpreter or stack.
    KernelCheckpointIncompatible,
    /// A requested package was refused before anything was installed (PKG-4, PKG-6): a URL, a
    /// path, an index, an installer flag, or not a distribution's name.
    DependencyRequestInvalid,
    /// The run's dependencies could not be installed (PKG-5, PKG-6, PKG-7): the record's
    /// `dependencies` says which packages and why.
    DependencyInstallFailed,
    /// A projection entry's filename is not a safe, unique, server-assigned name inside the
    /// projection (PROJ-6).
    ResourcePathInvalid,
    /// The projection's entries are not the manifest the turn was admitted with (PROJ-6).
    ResourceManifestMismatch,
    /// A projected file's bytes are not the size or digest its entry pins (PROJ-6).
    ResourceDigestMismatch,
}

impl NotRun {
    /// Every reason.
    pub const ALL: [NotRun; 15] = [
        Self::UnsupportedLanguage,
        Self::IsolationUnavailable,
        Self::WorkspaceTooLarge,
        Self::CodeTooLarge,
        Self::JailSetupFailed,
        Self::PersistentKernelUnavailable,
        Self::ResourcePersistentKernel,
        Self::KernelCheckpointCorrupt,
        Self::KernelCheckpointUntrusted,
        Self::KernelCheckpointIncompatible,
        Self::DependencyRequestInvalid,
        Self::DependencyInstallFailed,
        Self::ResourcePathInvalid,
        Self::ResourceManifestMismatch,
        Self::ResourceDigestMismatch,
    ];

    /// The stable reason code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::UnsupportedLanguage => "unsupported_language",
            Self::IsolationUnavailable => "isolation_unavailable",
            Self::WorkspaceTooLarge => "workspace_too_large",
            Self::CodeTooLarge => "code_too_large",
            Self::JailSetupFailed => "jail_setup_failed",
            Self::PersistentKernelUnavailable => "persistent_kernel_unavailable",
            Self::ResourcePersistentKernel => "resource_persistent_kernel",
            Self::KernelCheckpointCorrupt => "kernel_checkpoint_corrupt",
            Self::KernelCheckpointUntrusted => "kernel_checkpoint_untrusted",
            Self::KernelCheckpointIncompatible => "kernel_checkpoint_incompatible",
            Self::DependencyRequestInvalid => "dependency_request_invalid",
            Self::DependencyInstallFailed => "dependency_install_failed",
            Self::ResourcePathInvalid => "resource_path_invalid",
            Self::ResourceManifestMismatch => "resource_manifest_mismatch",
            Self::ResourceDigestMismatch => "resource_digest_mismatch",
        }
    }
}

// On the wire a reason is its code (`unsupported_language`, ...).
wire_code!(NotRun, code, "a not_run reason");

// ---------------------------------------------------------------------------------------------
// Isolation posture.

/// An isolation primitive the jail is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Primitive {
    /// The supervisor runs as root (it mounts, maps ids and creates cgroups).
    Privileges,
    /// New pid, mount, network, IPC and UTS namespaces.
    Namespaces,
    /// A new user namespace, so that root inside the jail is nobody outside it.
    UserNamespaces,
    /// A seccomp filter.
    Seccomp,
    /// A cgroup v1 `memory` controller the supervisor can create groups in.
    CgroupMemory,
    /// A cgroup v1 `pids` controller the supervisor can create groups in.
    CgroupPids,
}

impl Primitive {
    /// The stable name.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Privileges => "root",
            Self::Namespaces => "namespaces",
            Self::UserNamespaces => "user_namespaces",
            Self::Seccomp => "seccomp",
            Self::CgroupMemory => "cgroup_memory",
            Self::CgroupPids => "cgroup_pids",
        }
    }

    /// Whether the operator may waive it. Without root or the basic namespaces there is no jail
    /// at all (no read-only root, no private network), so those are never waived. Without the
    /// others the jail still stands, with an unprivileged host uid and resource limits instead.
    #[must_use]
    pub fn waivable(self) -> bool {
        match self {
            Self::Privileges | Self::Namespaces => false,
            Self::UserNamespaces | Self::Seccomp | Self::CgroupMemory | Self::CgroupPids => true,
        }
    }
}

/// The isolation a run gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Posture {
    /// Every primitive is present.
    Full,
    /// The operator accepted running without these (`CORRAL_JAIL_ALLOW_WEAKER_ISOLATION`).
    Weaker {
        /// The primitives missing, every one waivable.
        waived: BTreeSet<Primitive>,
    },
}

/// The decision on the primitives found missing at start: the posture to run with, or the
/// primitives that refuse the run.
///
/// # Errors
/// The missing primitives when any is missing and either the operator did not accept a weaker
/// posture or one of them cannot be waived.
pub fn posture(
    missing: &BTreeSet<Primitive>,
    allow_weaker_isolation: bool,
) -> Result<Posture, BTreeSet<Primitive>> {
    if missing.is_empty() {
        return Ok(Posture::Full);
    }
    if allow_weaker_isolation && missing.iter().all(|primitive| primitive.waivable()) {
        return Ok(Posture::Weaker {
            waived: missing.clone(),
        });
    }
    Err(missing.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_06_only_python_and_node_run_under_their_names_and_aliases() {
        for (name, language) in [
            ("python", Language::Python),
            ("Python", Language::Python),
            ("python3", Language::Python),
            ("PY", Language::Python),
            ("node", Language::Node),
            ("nodejs", Language::Node),
            ("Node.js", Language::Node),
            ("javascript", Language::Node),
            ("JS", Language::Node),
        ] {
            assert_eq!(Language::parse(name), Ok(language), "{name:?}");
        }
        for other in [
            "ruby",
            "python2",
            "",
            "bash",
            "node ",
            " python",
            "typescript",
            "ts",
        ] {
            let refused = Language::parse(other).expect_err(other);
            assert_eq!(refused.code, NotRun::UnsupportedLanguage, "{other:?}");
            assert_eq!(refused.supported, ["python", "node"], "{other:?}");
            assert!(
                refused.message.contains("\"python\""),
                "{}",
                refused.message
            );
            assert!(refused.message.contains("\"node\""), "{}", refused.message);
        }
        assert_eq!(NotRun::UnsupportedLanguage.code(), "unsupported_language");
    }

    #[test]
    fn pkg_06_a_refused_language_is_named_bounded_and_escaped() {
        let ruby = Language::parse("ruby").expect_err("ruby");
        assert_eq!(ruby.language, "ruby");
        assert!(ruby.message.contains("\"ruby\""), "{}", ruby.message);
        let empty = Language::parse("").expect_err("empty");
        assert!(
            empty.message.starts_with("no language was given"),
            "{}",
            empty.message
        );
        let long = "x".repeat(10_000);
        let refused = Language::parse(&long).expect_err("long");
        assert_eq!(refused.language_chars, 10_000);
        assert_eq!(
            refused.language,
            format!("{}…", "x".repeat(LANGUAGE_ECHO_MAX_CHARS))
        );
        assert!(refused.message.len() < 400, "{}", refused.message.len());
        let hostile = Language::parse("ru\u{0}by\"\n\u{202e}").expect_err("hostile");
        assert_eq!(hostile.language, "ru\\0by\\\"\\n\\u{202e}");
        assert!(
            !hostile.message.chars().any(char::is_control),
            "{}",
            hostile.message
        );
    }

    #[test]
    fn a_missing_primitive_refuses_unless_waived_and_waivable() {
        let none = BTreeSet::new();
        assert_eq!(posture(&none, false), Ok(Posture::Full));
        assert_eq!(posture(&none, true), Ok(Posture::Full));
        let seccomp: BTreeSet<_> = [Primitive::Seccomp].into();
        assert_eq!(posture(&seccomp, false), Err(seccomp.clone()));
        assert_eq!(
            posture(&seccomp, true),
            Ok(Posture::Weaker {
                waived: seccomp.clone()
            })
        );
        let fatal: BTreeSet<_> = [Primitive::Seccomp, Primitive::Namespaces].into();
        assert_eq!(posture(&fatal, true), Err(fatal.clone()));
        let root: BTreeSet<_> = [Primitive::Privileges].into();
        assert_eq!(posture(&root, true), Err(root.clone()));
    }
}
