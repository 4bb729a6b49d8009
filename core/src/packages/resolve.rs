//! The one decision of what a run's dependencies need (PKG-1, PKG-2, PKG-4, PKG-6, PKG-7): what
//! the baked stack satisfies locally, what must come through the broker, and what refuses the run
//! before it starts. The API decides with it (no broker token is minted for a run that needs
//! none); the worker receives the result and checks every item again with the same parser.

use super::imports::{imported_modules, known_distribution};
use super::requirement::{REQUESTED_MAX, normalize, parse_npm, parse_python};
use super::stack::BakedStack;
use crate::jail::{Language, NotRun};

/// Why a run's dependencies stopped it, in the `not_run` record (PKG-6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// The request itself was refused before anything was installed.
    RequestInvalid,
    /// No registry is configured for the ecosystem (`SANDBOX_PACKAGE_REGISTRIES={}`).
    NoRegistry,
    /// The broker could not reach the registry (PKG-5).
    RegistryUnreachable,
    /// The install ran past `SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS`.
    TimedOut,
    /// The installer failed for another reason (its output's tail is in the diagnostics).
    InstallFailed,
}

impl Cause {
    /// Every cause.
    pub const ALL: [Cause; 5] = [
        Self::RequestInvalid,
        Self::NoRegistry,
        Self::RegistryUnreachable,
        Self::TimedOut,
        Self::InstallFailed,
    ];

    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::RequestInvalid => "request_invalid",
            Self::NoRegistry => "no_registry",
            Self::RegistryUnreachable => "registry_unreachable",
            Self::TimedOut => "timed_out",
            Self::InstallFailed => "install_failed",
        }
    }

    /// The `not_run` reason a failure of this cause is recorded under.
    #[must_use]
    pub fn not_run(self) -> NotRun {
        match self {
            Self::RequestInvalid => NotRun::DependencyRequestInvalid,
            _ => NotRun::DependencyInstallFailed,
        }
    }
}

crate::wire_code!(Cause, code, "a dependency failure cause");

/// A run stopped by its dependencies before its code ran: the record's detail.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DependencyFailure {
    /// Why.
    pub cause: Cause,
    /// The packages concerned, as requested.
    pub packages: Vec<String>,
    /// What happened, for the model and the member.
    pub message: String,
}

impl DependencyFailure {
    /// The `not_run` reason it is recorded under.
    #[must_use]
    pub fn reason(&self) -> NotRun {
        self.cause.not_run()
    }

    /// The failure of an install that ran (PKG-5): unreachable, timed out, or failed.
    #[must_use]
    pub fn of_install(cause: Cause, packages: Vec<String>) -> Self {
        let names = packages.join(", ");
        let message = match cause {
            Cause::RegistryUnreachable => format!(
                "could not install {names}: the package registry is unreachable; the baked \
                 packages need none"
            ),
            Cause::TimedOut => format!(
                "could not install {names} within SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS"
            ),
            _ => format!("could not install {names}: the installer failed (see diagnostics)"),
        };
        Self {
            cause,
            packages,
            message,
        }
    }
}

/// Which registries a run's installs may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Available {
    /// A Python index is configured.
    pub python: bool,
    /// An npm registry is configured.
    pub npm: bool,
}

/// One distribution the run installs through the broker.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Install {
    /// The requirement as the installer reads it (`name==1.0`, `name@1.0.0`).
    pub spec: String,
    /// The import that inferred it, when the run did not request it by name: the worker drops it
    /// when the workspace has a module of that name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inferred_from: Option<String>,
    /// The baked version it replaces for this run (PKG-2), when it pins a baked distribution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
}

/// What a run's dependencies need.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resolution {
    /// Baked distributions the run uses (`name version`), satisfied locally.
    pub satisfied: Vec<String>,
    /// What the broker must provide.
    pub install: Vec<Install>,
    /// `name==version` of every baked distribution the run does not replace: the install keeps
    /// them, so that no transitive dependency shadows a baked one (PKG-2).
    pub constraints: Vec<String>,
    /// Notes for the model: inferred imports left to the code.
    pub notes: Vec<String>,
}

impl Resolution {
    /// Whether anything must be installed (and so a broker token minted).
    #[must_use]
    pub fn needs_broker(&self) -> bool {
        !self.install.is_empty()
    }

    /// Whether the install pins the baked distribution `name` to another version.
    fn replaces(&self, name: &str) -> bool {
        self.install
            .iter()
            .any(|i| i.replaces.is_some() && i.spec.starts_with(&format!("{name}==")))
    }

    /// The requested names of what is installed, for a failure's record.
    #[must_use]
    pub fn packages(&self) -> Vec<String> {
        self.install.iter().map(|i| i.spec.clone()).collect()
    }
}

fn invalid(raw: &str, why: &str) -> DependencyFailure {
    DependencyFailure {
        cause: Cause::RequestInvalid,
        packages: vec![raw.to_owned()],
        message: format!("{raw:?}: {why}"),
    }
}

fn no_registry(packages: Vec<String>, message: String) -> DependencyFailure {
    DependencyFailure {
        cause: Cause::NoRegistry,
        packages,
        message,
    }
}

/// Decides what a run in `language` with the requested `packages` and `code` needs, given the
/// baked `stack` and the `available` registries.
///
/// # Errors
/// The failure that stops the run before its code: a request refused (PKG-4), a package with no
/// registry to come from (PKG-7), a baked pin to another version with no registry (PKG-2).
pub fn resolve(
    language: Language,
    packages: &[String],
    code: &str,
    stack: &BakedStack,
    available: Available,
) -> Result<Resolution, DependencyFailure> {
    if packages.len() > REQUESTED_MAX {
        return Err(DependencyFailure {
            cause: Cause::RequestInvalid,
            packages: Vec::new(),
            message: format!("at most {REQUESTED_MAX} packages may be requested"),
        });
    }
    match language {
        Language::Python => resolve_python(packages, code, stack, available.python),
        Language::Node => resolve_npm(packages, available.npm),
    }
}

fn resolve_python(
    packages: &[String],
    code: &str,
    stack: &BakedStack,
    registry: bool,
) -> Result<Resolution, DependencyFailure> {
    let mut requested = Vec::new();
    for raw in packages {
        let requirement = parse_python(raw).map_err(|why| invalid(raw, why))?;
        if let Some(other) = requested.iter().find(
            |(_, r): &&(&String, super::requirement::PythonRequirement)| r.name == requirement.name,
        ) && other.1 != requirement
        {
            return Err(invalid(
                raw,
                "the same distribution is requested twice, differently",
            ));
        }
        requested.push((raw, requirement));
    }
    requested.dedup_by(|a, b| a.1 == b.1);
    let mut resolution = Resolution::default();
    let mut unavailable = Vec::new();
    for (raw, requirement) in &requested {
        match stack.distribution(&requirement.name) {
            Some(baked)
                if requirement.extras.is_empty()
                    && requirement
                        .version
                        .as_deref()
                        .is_none_or(|v| v == baked.version) =>
            {
                resolution
                    .satisfied
                    .push(format!("{} {}", baked.name, baked.version));
            }
            Some(baked) => {
                let pinned = requirement
                    .version
                    .as_ref()
                    .filter(|v| **v != baked.version);
                if !registry {
                    return Err(no_registry(
                        vec![(*raw).clone()],
                        format!(
                            "{} is not available: no Python package registry is configured \
                             (SANDBOX_PACKAGE_REGISTRIES names none); the baked stack has {} {}",
                            requirement.spec(),
                            baked.name,
                            baked.version
                        ),
                    ));
                }
                let spec = match pinned {
                    Some(_) => requirement.spec(),
                    // Extras of a baked distribution: installed beside the baked version.
                    None => {
                        let mut r = requirement.clone();
                        r.version = Some(baked.version.clone());
                        r.spec()
                    }
                };
                resolution.install.push(Install {
                    spec,
                    inferred_from: None,
                    replaces: pinned.map(|_| baked.version.clone()),
                });
            }
            None if !registry => unavailable.push((*raw).clone()),
            None => resolution.install.push(Install {
                spec: requirement.spec(),
                inferred_from: None,
                replaces: None,
            }),
        }
    }
    if !unavailable.is_empty() {
        return Err(no_registry(
            unavailable.clone(),
            format!(
                "{} cannot be installed: no Python package registry is configured \
                 (SANDBOX_PACKAGE_REGISTRIES names none); only the baked stack is available: {}",
                unavailable.join(", "),
                stack.summary()
            ),
        ));
    }
    for module in imported_modules(code) {
        if let Some(baked) = stack.providing(&module) {
            let used = format!("{} {}", baked.name, baked.version);
            let replaced = resolution.replaces(&baked.name);
            if !replaced && !resolution.satisfied.contains(&used) {
                resolution.satisfied.push(used);
            }
            continue;
        }
        let Some(distribution) = known_distribution(&module) else {
            continue;
        };
        let name = normalize(distribution);
        if requested.iter().any(|(_, r)| r.name == name) {
            continue;
        }
        if registry {
            resolution.install.push(Install {
                spec: name,
                inferred_from: Some(module),
                replaces: None,
            });
        } else {
            resolution.notes.push(format!(
                "import {module}: {distribution} is not baked and no package registry is \
                 configured, so it was not installed"
            ));
        }
    }
    resolution.satisfied.sort();
    resolution.satisfied.dedup();
    if resolution.needs_broker() {
        resolution.constraints = stack
            .distributions
            .iter()
            .filter(|baked| !resolution.replaces(&baked.name))
            .map(|baked| format!("{}=={}", baked.name, baked.version))
            .collect();
    }
    Ok(resolution)
}

fn resolve_npm(packages: &[String], registry: bool) -> Result<Resolution, DependencyFailure> {
    let mut resolution = Resolution::default();
    for raw in packages {
        let requirement = parse_npm(raw).map_err(|why| invalid(raw, why))?;
        let spec = requirement.spec();
        if !resolution.install.iter().any(|i| i.spec == spec) {
            resolution.install.push(Install {
                spec,
                inferred_from: None,
                replaces: None,
            });
        }
    }
    if !registry && !resolution.install.is_empty() {
        return Err(no_registry(
            packages.to_vec(),
            "no npm registry is configured (SANDBOX_PACKAGE_REGISTRIES); the baked stack is \
             Python's only"
                .to_owned(),
        ));
    }
    Ok(resolution)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "# t\npandas\t2.3.3\tpandas\nnumpy\t2.3.4\tnumpy\n\
                         python-docx\t1.2.0\tdocx\ntabulate\t0.9.0\ttabulate\n";
    const BOTH: Available = Available {
        python: true,
        npm: true,
    };
    const NONE: Available = Available {
        python: false,
        npm: false,
    };

    fn stack() -> BakedStack {
        BakedStack::parse(TABLE).unwrap()
    }

    fn py(
        packages: &[&str],
        code: &str,
        available: Available,
    ) -> Result<Resolution, DependencyFailure> {
        let packages: Vec<String> = packages.iter().map(|p| (*p).to_owned()).collect();
        resolve(Language::Python, &packages, code, &stack(), available)
    }

    #[test]
    fn pkg_01_pkg_04_a_baked_import_or_name_needs_no_broker() {
        let r = py(
            &["pandas", "tabulate==0.9.0"],
            "import docx\nimport numpy as np\n",
            BOTH,
        )
        .unwrap();
        assert!(!r.needs_broker());
        assert_eq!(
            r.satisfied,
            [
                "numpy 2.3.4",
                "pandas 2.3.3",
                "python-docx 1.2.0",
                "tabulate 0.9.0"
            ]
        );
        assert!(r.constraints.is_empty());
    }

    #[test]
    fn pkg_02_a_baked_pin_to_another_version_installs_and_the_rest_stay_pinned() {
        let r = py(&["pandas==2.2.3", "humanize"], "import pandas", BOTH).unwrap();
        assert_eq!(r.packages(), ["pandas==2.2.3", "humanize"]);
        assert_eq!(r.install[0].replaces.as_deref(), Some("2.3.3"));
        // Every other baked distribution is kept at its version; the replaced one is not.
        assert_eq!(
            r.constraints,
            ["numpy==2.3.4", "python-docx==1.2.0", "tabulate==0.9.0"]
        );
        assert!(!r.satisfied.iter().any(|s| s.starts_with("pandas")));
    }

    #[test]
    fn pkg_07_no_registry_names_the_baked_stack_and_the_baked_version() {
        let e = py(&["humanize"], "", NONE).unwrap_err();
        assert_eq!(
            (e.cause, e.reason()),
            (Cause::NoRegistry, NotRun::DependencyInstallFailed)
        );
        assert!(
            e.message.contains("pandas 2.3.3") && e.message.contains("SANDBOX_PACKAGE_REGISTRIES")
        );
        let e = py(&["pandas==2.2.3"], "", NONE).unwrap_err();
        assert!(
            e.message.contains("the baked stack has pandas 2.3.3"),
            "{}",
            e.message
        );
        // The baked version itself needs no registry.
        assert!(py(&["pandas==2.3.3"], "", NONE).is_ok());
        // An inferred import with no registry is a note, not a failure.
        let r = py(&[], "import humanize", NONE).unwrap();
        assert!(r.install.is_empty() && r.notes.len() == 1);
        let e = resolve(Language::Node, &["left-pad".to_owned()], "", &stack(), NONE).unwrap_err();
        assert_eq!(e.cause, Cause::NoRegistry);
    }

    #[test]
    fn pkg_04_imports_infer_known_distributions_only() {
        let r = py(&[], "import sklearn\nimport my_helpers\nimport os\n", BOTH).unwrap();
        assert_eq!(r.packages(), ["scikit-learn"]);
        assert_eq!(r.install[0].inferred_from.as_deref(), Some("sklearn"));
        // Requested by name: not inferred twice.
        let r = py(&["humanize==4.9.0"], "import humanize", BOTH).unwrap();
        assert_eq!(r.packages(), ["humanize==4.9.0"]);
    }

    #[test]
    fn pkg_06_a_bad_request_is_refused_before_anything() {
        for bad in [
            "--index-url=http://x",
            "-e",
            "./x",
            "https://x/y.whl",
            "x>=1",
        ] {
            let e = py(&[bad], "", BOTH).unwrap_err();
            assert_eq!(
                (e.cause, e.reason()),
                (Cause::RequestInvalid, NotRun::DependencyRequestInvalid),
                "{bad}"
            );
            assert_eq!(e.packages, [bad]);
        }
        assert!(py(&["a==1", "A==2"], "", BOTH).is_err());
        let many: Vec<String> = (0..=REQUESTED_MAX).map(|i| format!("p{i}")).collect();
        assert!(resolve(Language::Python, &many, "", &stack(), BOTH).is_err());
    }
}
