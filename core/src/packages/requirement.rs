//! What a run may ask to install (PKG-4): a distribution's name with an optional exact version,
//! and nothing else. A URL, a path, an index, an installer flag, an environment marker or a range
//! is refused with a sentence that says which, before anything runs.
//!
//! The grammar is PEP 508's narrowest form, `name[extra,...]==version`, read here by hand; whether
//! the version is a PEP 440 version is `pep440_rs`'s to say. Why not `pep508_rs`: decision 0028.

use std::str::FromStr;

/// The longest requirement accepted, in bytes.
pub const REQUIREMENT_MAX_BYTES: usize = 214;
/// The most packages one run may request.
pub const REQUESTED_MAX: usize = 32;

/// A Python requirement: a PEP 508 name, optional extras, optional `==version`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PythonRequirement {
    /// The name normalized as PEP 503 says (lowercase, each run of `-`, `_`, `.` one `-`).
    pub name: String,
    /// Extras, normalized the same way, sorted, without repeats.
    pub extras: Vec<String>,
    /// The exact version asked for.
    pub version: Option<String>,
}

impl PythonRequirement {
    /// The requirement as pip reads it: `name[extras]==version`.
    #[must_use]
    pub fn spec(&self) -> String {
        let mut spec = self.name.clone();
        if !self.extras.is_empty() {
            spec.push('[');
            spec.push_str(&self.extras.join(","));
            spec.push(']');
        }
        if let Some(version) = &self.version {
            spec.push_str("==");
            spec.push_str(version);
        }
        spec
    }
}

/// A JavaScript requirement: an npm package name (scoped or not) with an optional exact version.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NpmRequirement {
    /// `name` or `@scope/name`.
    pub name: String,
    /// The exact version asked for.
    pub version: Option<String>,
}

impl NpmRequirement {
    /// The requirement as npm reads it: `name@version` or `name`.
    #[must_use]
    pub fn spec(&self) -> String {
        match &self.version {
            Some(version) => format!("{}@{version}", self.name),
            None => self.name.clone(),
        }
    }
}

/// PEP 503's normalized form of a distribution name.
#[must_use]
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            separator = true;
            continue;
        }
        if separator && !out.is_empty() {
            out.push('-');
        }
        separator = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The first thing wrong with `text` that every ecosystem refuses: an installer flag, a URL, a
/// path, a control character or whitespace inside, the length.
fn refused_shape(text: &str) -> Option<&'static str> {
    if text.is_empty() {
        return Some("a requirement is a distribution's name, and this one is empty");
    }
    if text.len() > REQUIREMENT_MAX_BYTES {
        return Some("a requirement is at most 214 bytes");
    }
    if text.starts_with('-') {
        return Some(
            "installer flags (such as --index-url or -e) are not accepted; name a distribution",
        );
    }
    if text.contains("://") || text.to_ascii_lowercase().starts_with("git+") {
        return Some(
            "a URL is not accepted; name a distribution (the broker chooses the registry)",
        );
    }
    if text.starts_with('.') || text.starts_with('~') || text.contains('\\') {
        return Some("a path is not accepted; name a distribution");
    }
    if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Some("a requirement has no spaces or control characters");
    }
    None
}

fn is_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A PEP 440 version as a run may pin it: starts with a digit, then digits, letters, `.`, `!`,
/// `+`, `-`, `_` (no wildcard, no operator, no leading `v`), and `pep440_rs` reads it as a
/// version. The spelling given is kept: the baked stack compares versions as written.
fn is_python_version(text: &str) -> bool {
    text.as_bytes().first().is_some_and(u8::is_ascii_digit)
        && text.len() <= 64
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'!' | b'+' | b'-' | b'_'))
        && pep440_rs::Version::from_str(text).is_ok()
}

/// Parses one Python requirement (PKG-4).
///
/// # Errors
/// What is wrong, as a sentence for the model.
pub fn parse_python(raw: &str) -> Result<PythonRequirement, &'static str> {
    let text = raw.trim();
    if let Some(why) = refused_shape(text) {
        return Err(why);
    }
    if text.contains('@') {
        return Err("a direct reference (name @ url) is not accepted; name a distribution");
    }
    if text.contains('/') {
        return Err("a path is not accepted; name a distribution");
    }
    if text.contains(';') {
        return Err("environment markers are not accepted");
    }
    let (head, version) = match text.split_once("==") {
        Some((head, version)) => (head, Some(version)),
        None => (text, None),
    };
    let outside_extras = head.split_once('[').map_or(head, |(name, _)| name);
    let after_extras = head.rsplit_once(']').map_or("", |(_, rest)| rest);
    if outside_extras.contains(['<', '>', '=', '!', '~', ',', '*'])
        || !after_extras.is_empty()
        || version.is_some_and(|v| v.contains('='))
    {
        return Err("only an exact version (name==version) may be given");
    }
    let (name, extras) = match head.split_once('[') {
        Some((name, rest)) => {
            let inner = rest
                .strip_suffix(']')
                .ok_or("extras are written name[extra,...]")?;
            let mut extras = Vec::new();
            for extra in inner.split(',') {
                if !is_name(extra) {
                    return Err("an extra is a name of letters, digits, '-', '_' and '.'");
                }
                extras.push(normalize(extra));
            }
            extras.sort();
            extras.dedup();
            (name, extras)
        }
        None => (head, Vec::new()),
    };
    if !is_name(name) {
        return Err(
            "a distribution's name has letters, digits, '-', '_' and '.', and starts and ends with a letter or digit",
        );
    }
    let version = match version {
        None => None,
        Some(v) if is_python_version(v) => Some(v.to_owned()),
        Some(v) if v.contains('*') => {
            return Err("only an exact version (name==version) may be given");
        }
        Some(_) => return Err("the version is not a PEP 440 version"),
    };
    Ok(PythonRequirement {
        name: normalize(name),
        extras,
        version,
    })
}

fn is_npm_segment(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && !matches!(bytes.first(), Some(b'.' | b'_'))
        && bytes.iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.' | b'~')
        })
}

/// An exact semantic version: `MAJOR.MINOR.PATCH` with an optional pre-release and build.
fn is_semver(text: &str) -> bool {
    let (core, _) = text.split_once('+').unwrap_or((text, ""));
    let (core, pre) = core.split_once('-').unwrap_or((core, ""));
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && text.len() <= 64
        && pre
            .bytes()
            .chain(text.split_once('+').map_or("", |(_, b)| b).bytes())
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
}

/// Parses one npm requirement (PKG-4): `name`, `@scope/name`, each with an optional
/// `@MAJOR.MINOR.PATCH`.
///
/// # Errors
/// What is wrong, as a sentence for the model.
pub fn parse_npm(raw: &str) -> Result<NpmRequirement, &'static str> {
    let text = raw.trim();
    if let Some(why) = refused_shape(text) {
        return Err(why);
    }
    if text.contains(':') {
        return Err("a URL or protocol (git:, file:, npm:) is not accepted; name a package");
    }
    let (scope, rest) = match text.strip_prefix('@') {
        Some(rest) => {
            let (scope, rest) = rest
                .split_once('/')
                .ok_or("a scoped package is written @scope/name")?;
            (Some(scope), rest)
        }
        None => (None, text),
    };
    let (name, version) = match rest.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (rest, None),
    };
    if name.contains('/') || scope.is_some_and(|s| s.contains('/')) {
        return Err("a path is not accepted; name a package");
    }
    if !is_npm_segment(name) || !scope.is_none_or(is_npm_segment) {
        return Err("an npm package name has lowercase letters, digits, '-', '_', '.' and '~'");
    }
    let version = match version {
        None => None,
        Some(v) if is_semver(v) => Some(v.to_owned()),
        Some(_) => return Err("only an exact version (name@1.2.3) may be given"),
    };
    Ok(NpmRequirement {
        name: match scope {
            Some(scope) => format!("@{scope}/{name}"),
            None => name.to_owned(),
        },
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_04_names_and_exact_versions_are_accepted() {
        let r = parse_python("Python_Docx==1.1.2").unwrap();
        assert_eq!(r.name, "python-docx");
        assert_eq!(r.version.as_deref(), Some("1.1.2"));
        assert_eq!(r.spec(), "python-docx==1.1.2");
        let r = parse_python(" requests[socks,Security] ").unwrap();
        assert_eq!(r.extras, ["security", "socks"]);
        assert_eq!(r.spec(), "requests[security,socks]");
        assert_eq!(parse_python("a.b__c").unwrap().name, "a-b-c");
        let n = parse_npm("@scope/left-pad@1.3.0").unwrap();
        assert_eq!(
            (n.name.as_str(), n.version.as_deref()),
            ("@scope/left-pad", Some("1.3.0"))
        );
        assert_eq!(parse_npm("lodash").unwrap().spec(), "lodash");
    }

    #[test]
    fn pkg_04_urls_paths_indexes_and_flags_are_refused() {
        for bad in [
            "https://example.invalid/x.whl",
            "pkg @ https://example.invalid/x.whl",
            "pkg@https://example.invalid/x.whl",
            "git+https://example.invalid/x.git",
            "./local",
            "../up",
            "/abs/path",
            "dir/pkg",
            "C:\\x",
            "--index-url=https://example.invalid/simple",
            "--index-url",
            "-e",
            "-e.",
            "-r requirements.txt",
            "pkg --extra-index-url x",
            "pkg; python_version<'3'",
            "pkg>=1",
            "pkg~=1.0",
            "pkg==1.*",
            "pkg===1",
            "pkg!=1",
            "pkg==1,<2",
            "",
            "   ",
            "-",
            "pkg\n--index-url x",
            "pkg[",
            "_pkg",
            "pkg==v1",
        ] {
            assert!(parse_python(bad).is_err(), "accepted {bad:?}");
        }
        for bad in [
            "git+https://example.invalid/x.git",
            "file:../x",
            "npm:other@1.0.0",
            "github:user/repo",
            "user/repo",
            "./x",
            "--registry=http://x",
            "-g",
            "Upper",
            "x@latest",
            "x@^1.0.0",
            "x@1.0",
            "@scope",
            "@scope/a/b",
            "",
        ] {
            assert!(parse_npm(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn pkg_04_a_pinned_version_is_a_pep_440_version_kept_as_written() {
        for (given, kept) in [
            ("pkg==1.0.0-beta", "1.0.0-beta"),
            ("pkg==2.0rc1", "2.0rc1"),
            ("pkg==1!2.0", "1!2.0"),
            ("pkg==1.0.post1", "1.0.post1"),
            ("pkg==1.0.dev3", "1.0.dev3"),
            ("pkg==1.0+local.7", "1.0+local.7"),
            ("pkg==1.0_post_1", "1.0_post_1"),
            ("pkg==2024.10", "2024.10"),
        ] {
            let r = parse_python(given).unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!(r.version.as_deref(), Some(kept), "{given}");
        }
        for bad in [
            "pkg==1.0foo",
            "pkg==1..0",
            "pkg==1.0-",
            "pkg==1.0+",
            "pkg==1.0+a+b",
            "pkg==1!",
            "pkg==1.0.0-beta.1.x",
        ] {
            assert_eq!(
                parse_python(bad),
                Err("the version is not a PEP 440 version"),
                "{bad}"
            );
        }
        // PEP 440 reads a leading `v`; a run's pin does not have one.
        assert!(parse_python("pkg==v1.0").is_err());
    }

    #[test]
    fn pkg_04_each_refusal_says_what_is_wrong() {
        assert!(
            parse_python("--index-url")
                .unwrap_err()
                .contains("installer flags")
        );
        assert!(parse_python("https://x/y").unwrap_err().contains("URL"));
        assert!(parse_python("./x").unwrap_err().contains("path"));
        assert!(parse_python("x>=1").unwrap_err().contains("exact version"));
        assert!(parse_npm("x@^1").unwrap_err().contains("exact version"));
    }
}
