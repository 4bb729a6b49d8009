//! The reader of a lookup: each setting read once, trimmed, parsed and defaulted.

use crate::jail::Language;

use super::error::{ConfigError, shown};
use super::number::Number;
use super::specs::*;
use super::table::setting_value;
use super::{EgressSettings, FieldKey, FieldKeySource, PackageRegistries, PoolModeSetting};

/// Reads settings through the caller's lookup: trims, treats empty as unset, applies defaults.
pub(super) struct Reader<F> {
    pub(super) lookup: F,
}

impl<F: Fn(&str) -> Option<String>> Reader<F> {
    /// The trimmed value of `name`, or `None` when it is unset or blank.
    pub(super) fn raw(&self, name: &'static str) -> Option<String> {
        setting_value(&(self.lookup)(name)?).map(str::to_owned)
    }

    pub(super) fn number(&self, spec: &Number, default: u64) -> Result<u64, ConfigError> {
        match self.raw(spec.name) {
            None => Ok(default),
            Some(text) => spec.parse(&text),
        }
    }

    pub(super) fn number_u32(&self, spec: &Number, default: u32) -> Result<u32, ConfigError> {
        let value = self.number(spec, u64::from(default))?;
        u32::try_from(value).map_err(|_| spec.out_of_range(value.to_string()))
    }

    pub(super) fn number_u16(&self, spec: &Number, default: u16) -> Result<u16, ConfigError> {
        let value = self.number(spec, u64::from(default))?;
        u16::try_from(value).map_err(|_| spec.out_of_range(value.to_string()))
    }

    pub(super) fn flag(&self, name: &'static str, default: bool) -> Result<bool, ConfigError> {
        let Some(text) = self.raw(name) else {
            return Ok(default);
        };
        match text.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(ConfigError::InvalidBool {
                setting: name,
                value: shown(&text),
            }),
        }
    }

    pub(super) fn pool_mode(&self) -> Result<PoolModeSetting, ConfigError> {
        let Some(text) = self.raw(POOL_MODE) else {
            return Ok(PoolModeSetting::Controller);
        };
        match text.to_ascii_lowercase().as_str() {
            "controller" => Ok(PoolModeSetting::Controller),
            "platform_operator" => Ok(PoolModeSetting::PlatformOperator),
            _ => Err(ConfigError::InvalidChoice {
                setting: POOL_MODE,
                value: shown(&text),
                expected: "controller, platform_operator",
            }),
        }
    }

    /// An absolute path without control characters, no longer than `PATH_MAX_BYTES`.
    pub(super) fn path(&self, name: &'static str, default: &str) -> Result<String, ConfigError> {
        let Some(text) = self.raw(name) else {
            return Ok(default.to_owned());
        };
        let acceptable = text.starts_with('/')
            && text.len() <= PATH_MAX_BYTES
            && !text.chars().any(char::is_control);
        if acceptable {
            Ok(text)
        } else {
            Err(ConfigError::InvalidPath {
                setting: name,
                value: shown(&text),
            })
        }
    }

    /// `CORRAL_WORKER_PREPARE_LANGUAGES`: unset is the default, set but blank is none (the one
    /// setting where blank is not unset: "prepare nothing" needs a spelling).
    pub(super) fn prepare_languages(
        &self,
        default: &[Language],
    ) -> Result<Vec<Language>, ConfigError> {
        let Some(text) = (self.lookup)(WORKER_PREPARE_LANGUAGES) else {
            return Ok(default.to_vec());
        };
        let mut languages = Vec::new();
        for item in list_items(&text) {
            let language = Language::parse(item).map_err(|_| ConfigError::InvalidListItem {
                setting: WORKER_PREPARE_LANGUAGES,
                item: shown(item),
                expected: "python or node, or an alias of one (a comma-separated list; set \
                               but empty: none)",
            })?;
            if !languages.contains(&language) {
                languages.push(language);
            }
        }
        Ok(languages)
    }

    /// `CORRAL_WORKER_PYTHON_PREIMPORT`: dotted module names; unset is `default`, set but blank
    /// is none (like `CORRAL_WORKER_PREPARE_LANGUAGES`).
    pub(super) fn python_preimport(&self, default: &[String]) -> Result<Vec<String>, ConfigError> {
        let Some(text) = (self.lookup)(WORKER_PYTHON_PREIMPORT) else {
            return Ok(default.to_vec());
        };
        let refused = |item: &str, expected: &'static str| ConfigError::InvalidListItem {
            setting: WORKER_PYTHON_PREIMPORT,
            item: shown(item),
            expected,
        };
        let mut modules: Vec<String> = Vec::new();
        for item in list_items(&text) {
            if !is_python_module_name(item) {
                return Err(refused(
                    item,
                    "a dotted Python module name of ASCII identifiers (a comma-separated list)",
                ));
            }
            if modules.iter().any(|m| m == item) {
                continue;
            }
            if modules.len() == PYTHON_PREIMPORT_MAX {
                return Err(refused(
                    item,
                    "within the first 64 modules (the most accepted)",
                ));
            }
            modules.push(item.to_owned());
        }
        Ok(modules)
    }

    pub(super) fn broker_url(&self) -> Result<Option<String>, ConfigError> {
        self.http_url(PACKAGE_BROKER_URL)
    }

    /// An optional `http://` or `https://` URL setting.
    pub(super) fn http_url(&self, setting: &'static str) -> Result<Option<String>, ConfigError> {
        let Some(text) = self.raw(setting) else {
            return Ok(None);
        };
        if is_http_url(&text) {
            Ok(Some(text))
        } else {
            Err(ConfigError::InvalidUrl {
                setting,
                value: shown(&redact_userinfo(&text)),
            })
        }
    }

    /// An `http(s)://` URL, or `sqlite://` and an absolute path.
    pub(super) fn authority_url(
        &self,
        setting: &'static str,
    ) -> Result<Option<String>, ConfigError> {
        let Some(text) = self.raw(setting) else {
            return Ok(None);
        };
        let sqlite = text
            .strip_prefix("sqlite://")
            .is_some_and(|path| path.starts_with('/') && path.len() > 1 && !path.contains('\0'));
        if sqlite || is_http_url(&text) {
            Ok(Some(text))
        } else {
            Err(ConfigError::InvalidUrl {
                setting,
                value: shown(&redact_userinfo(&text)),
            })
        }
    }

    pub(super) fn registries(&self) -> PackageRegistries {
        match self.raw(PACKAGE_REGISTRIES) {
            None => PackageRegistries::PublicDefaults,
            Some(text) if text.chars().filter(|c| !c.is_whitespace()).eq("{}".chars()) => {
                PackageRegistries::Disabled
            }
            Some(text) => PackageRegistries::Configured(text),
        }
    }

    pub(super) fn egress(&self) -> EgressSettings {
        EgressSettings {
            enabled: self.raw(EGRESS_ENABLED),
            mode: self.raw(EGRESS_MODE),
            allowed_ports: self.raw(EGRESS_ALLOWED_PORTS),
            private_cidrs: self.raw(EGRESS_PRIVATE_CIDRS),
            allowed_hosts: self.raw(EGRESS_ALLOWED_HOSTS),
            proxy_url: self.raw(EGRESS_PROXY_URL),
            dns_servers: self.raw(EGRESS_DNS_SERVERS),
            token_ttl_seconds: self.raw(EGRESS_TOKEN_TTL),
        }
    }

    pub(super) fn field_key(&self) -> Result<FieldKeySource, ConfigError> {
        match (self.raw(FIELD_KEY), self.raw(FIELD_KEY_FILE)) {
            (None, None) => Ok(FieldKeySource::Unset),
            (Some(key), None) => Ok(FieldKeySource::Value(FieldKey(key))),
            (None, Some(path)) => Ok(FieldKeySource::File(path)),
            (Some(_), Some(_)) => Err(ConfigError::Conflict {
                setting: FIELD_KEY,
                other: FIELD_KEY_FILE,
            }),
        }
    }
}

/// The trimmed items of a comma-separated list; none for a blank text. An empty item (`a,,b`, a
/// trailing comma) is kept, for the caller to refuse.
fn list_items(text: &str) -> Vec<&str> {
    if text.trim().is_empty() {
        return Vec::new();
    }
    text.split(',').map(str::trim).collect()
}

/// A dotted name of ASCII identifiers (`numpy`, `os.path`, `_private`), no longer than
/// [`PYTHON_MODULE_NAME_MAX_BYTES`]: nothing a bootstrap could read as anything but a name.
fn is_python_module_name(text: &str) -> bool {
    text.len() <= PYTHON_MODULE_NAME_MAX_BYTES
        && text.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// An `http://` or `https://` URL with a host and no whitespace or control characters.
fn is_http_url(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"));
    let Some(rest) = rest else {
        return false;
    };
    let host_present = rest
        .chars()
        .next()
        .is_some_and(|c| !matches!(c, '/' | '?' | '#' | '@' | ':'));
    host_present && !text.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// `text` with any `user:password@` in its authority replaced, for display.
pub(super) fn redact_userinfo(text: &str) -> String {
    let Some(scheme_end) = text.find("://") else {
        return text.to_owned();
    };
    let authority_start = scheme_end + 3;
    let authority_len = text[authority_start..]
        .find(['/', '?', '#'])
        .unwrap_or(text.len() - authority_start);
    let authority = &text[authority_start..authority_start + authority_len];
    match authority.rfind('@') {
        Some(at) => format!(
            "{}<redacted>{}",
            &text[..authority_start],
            &text[authority_start + at..]
        ),
        None => text.to_owned(),
    }
}
