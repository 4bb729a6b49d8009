//! Native Pi package validation (PI-1): the rules of validating an authored Pi package (skills,
//! extensions, prompts, themes) in the worker pool before the platform admits it.
//!
//! Everything here is pure; the API and the worker perform it.
//! - [`files`]: the server-authoritative file set, bounded and canonical.
//! - [`package`]: `package.json`'s identity, dependencies, lifecycle scripts and resource paths,
//!   and the profile (skill-only or extension) the files decide.
//! - [`surface`]: the child's bounded observation, validated; the reviewed manifest and the
//!   comparison with it; which hooks the platform supports.
//!
//! The order is fixed: static checks, then (an extension) the package's `node:test` tests in a
//! test tree, then a fresh validation tree built from the file set with its dependencies
//! reinstalled within what is left of the deadline, then Pi's real loader in a disposable child.
//! Every failure fails closed with its own code; nothing authored ever runs in a trusted process.

use serde::{Deserialize, Serialize};

pub mod files;
pub mod package;
pub mod surface;

/// The Pi runtime the worker bakes: its npm package, and the exact version its lock pins. The
/// lock (`stack/pi/package-lock.json`) is the one definition; this is read from its manifest.
pub const RUNTIME_PACKAGE: &str = "@mariozechner/pi-coding-agent";

/// The version `stack/pi/package.json` pins for [`RUNTIME_PACKAGE`].
#[must_use]
pub fn runtime_version() -> &'static str {
    const MANIFEST: &str = include_str!("../../../stack/pi/package.json");
    // `"@mariozechner/pi-coding-agent": "0.73.1"` in the manifest's dependencies.
    MANIFEST
        .split_once(&format!("\"{RUNTIME_PACKAGE}\""))
        .and_then(|(_, rest)| rest.split('"').nth(1))
        .unwrap_or("unknown")
}

/// The longest validation deadline a request may ask for, and the default.
pub const DEADLINE_MAX_SECONDS: u64 = 300;
/// The default deadline of a validation.
pub const DEADLINE_DEFAULT_SECONDS: u64 = 120;
/// The least time a reinstall starts with: less than this left after the tests fails the
/// validation with [`RefusalCode::PackageDeadlineExceeded`] rather than starting an install
/// that cannot finish.
pub const REINSTALL_MIN_SECONDS: u64 = 5;
/// The least time the loader starts with.
pub const LOADER_MIN_SECONDS: u64 = 2;

/// What a package is validated as, decided by its files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// Skills, prompts or themes only: Pi's skill loader, without a fabricated test.
    SkillOnly,
    /// With extensions: the package's `node:test` tests, then Pi's extension loader.
    Extension,
}

/// The steps of a validation, in order; a deadline exceeded names the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// The static checks.
    Static,
    /// The test tree's install and the tests.
    Tests,
    /// The validation tree's reinstall.
    Reinstall,
    /// Pi's loader.
    Loader,
}

/// Why a validation failed. Every code is stable, and every one fails closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalCode {
    /// Too many files, a file too large, or too many bytes in all.
    PackageTooLarge,
    /// A path that is not canonical, relative and inside, or under `node_modules`.
    PackagePathInvalid,
    /// A path given twice, or both a file and a directory.
    PackagePathDuplicate,
    /// A file that must be text is not UTF-8, or holds a NUL.
    PackageFileNotText,
    /// No single root `package.json`, or a name or version that is not valid and exact, or
    /// not the reviewed manifest's.
    PackageIdentityInvalid,
    /// A dependency that is not an exact registry version, a foreign peer, bundled dependencies.
    PackageDependencyRefused,
    /// A lifecycle script (or a native build, which is one).
    PackageLifecycleScript,
    /// A resource path outside the package, or naming nothing, or no resources at all.
    PackageResourcePathInvalid,
    /// The reviewed manifest's declarations do not match the files (before anything runs).
    PackageDeclarationMismatch,
    /// An extension package with no `node:test` tests.
    PackageTestsMissing,
    /// The package's tests failed.
    PackageTestsFailed,
    /// Installing the package's dependencies through the broker failed.
    PackageInstallFailed,
    /// The validation's deadline was spent before a step could finish (`step` says which).
    PackageDeadlineExceeded,
    /// Pi's loader reported an error for the package.
    PackageLoaderFailed,
    /// The child's observation was not one bounded, well-formed observation.
    PackageObservationMalformed,
    /// The child's output exceeded its bound: a package that floods it is not observed.
    PackageOutputFlooded,
    /// The package subscribes to a hook the platform does not support.
    PackageHookUnsupported,
    /// The loaded surface differs from the reviewed manifest.
    PackageSurfaceDrift,
    /// The worker has no Pi runtime, or it is not the version the lock pins.
    PiRuntimeUnavailable,
}

impl RefusalCode {
    /// Every code.
    pub const ALL: [RefusalCode; 19] = [
        Self::PackageTooLarge,
        Self::PackagePathInvalid,
        Self::PackagePathDuplicate,
        Self::PackageFileNotText,
        Self::PackageIdentityInvalid,
        Self::PackageDependencyRefused,
        Self::PackageLifecycleScript,
        Self::PackageResourcePathInvalid,
        Self::PackageDeclarationMismatch,
        Self::PackageTestsMissing,
        Self::PackageTestsFailed,
        Self::PackageInstallFailed,
        Self::PackageDeadlineExceeded,
        Self::PackageLoaderFailed,
        Self::PackageObservationMalformed,
        Self::PackageOutputFlooded,
        Self::PackageHookUnsupported,
        Self::PackageSurfaceDrift,
        Self::PiRuntimeUnavailable,
    ];

    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::PackageTooLarge => "package_too_large",
            Self::PackagePathInvalid => "package_path_invalid",
            Self::PackagePathDuplicate => "package_path_duplicate",
            Self::PackageFileNotText => "package_file_not_text",
            Self::PackageIdentityInvalid => "package_identity_invalid",
            Self::PackageDependencyRefused => "package_dependency_refused",
            Self::PackageLifecycleScript => "package_lifecycle_script",
            Self::PackageResourcePathInvalid => "package_resource_path_invalid",
            Self::PackageDeclarationMismatch => "package_declaration_mismatch",
            Self::PackageTestsMissing => "package_tests_missing",
            Self::PackageTestsFailed => "package_tests_failed",
            Self::PackageInstallFailed => "package_install_failed",
            Self::PackageDeadlineExceeded => "package_deadline_exceeded",
            Self::PackageLoaderFailed => "package_loader_failed",
            Self::PackageObservationMalformed => "package_observation_malformed",
            Self::PackageOutputFlooded => "package_output_flooded",
            Self::PackageHookUnsupported => "package_hook_unsupported",
            Self::PackageSurfaceDrift => "package_surface_drift",
            Self::PiRuntimeUnavailable => "pi_runtime_unavailable",
        }
    }

    /// Whether the refusal is the static checks': nothing ran, no worker was leased.
    #[must_use]
    pub fn is_static(self) -> bool {
        matches!(
            self,
            Self::PackageTooLarge
                | Self::PackagePathInvalid
                | Self::PackagePathDuplicate
                | Self::PackageFileNotText
                | Self::PackageIdentityInvalid
                | Self::PackageDependencyRefused
                | Self::PackageLifecycleScript
                | Self::PackageResourcePathInvalid
                | Self::PackageDeclarationMismatch
                | Self::PackageTestsMissing
        )
    }

    /// The HTTP status the API answers it with: 413 for size, 503 for a missing runtime, 422 for
    /// every other (the request was understood; the package is not admitted).
    #[must_use]
    pub fn status(self) -> u16 {
        match self {
            Self::PackageTooLarge => 413,
            Self::PiRuntimeUnavailable => 503,
            _ => 422,
        }
    }
}

crate::wire_code!(RefusalCode, code, "a package validation code");

/// A failed validation: the code, what it is about (a path or field), and a sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The stable code.
    pub code: RefusalCode,
    /// The file, field or step it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// A sentence for a person.
    pub message: String,
}

impl Refusal {
    /// A refusal about the whole package.
    #[must_use]
    pub fn new(code: RefusalCode, message: impl Into<String>) -> Self {
        Self {
            code,
            at: None,
            message: message.into(),
        }
    }

    /// A refusal about `at`.
    #[must_use]
    pub fn at(code: RefusalCode, at: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            at: Some(at.chars().take(256).collect()),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_version_is_the_locks_exact_version() {
        assert!(
            package::version_is_exact(runtime_version()),
            "{}",
            runtime_version()
        );
    }

    #[test]
    fn codes_are_distinct_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for code in RefusalCode::ALL {
            assert!(seen.insert(code.code()), "{}", code.code());
            let text = serde_json::to_string(&code).expect("encodes");
            assert_eq!(
                serde_json::from_str::<RefusalCode>(&text).expect("decodes"),
                code
            );
        }
    }
}
