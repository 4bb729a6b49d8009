//! The one error a setting can cause, and how it repeats a rejected value.

use std::fmt;

/// The longest part of a rejected value an error repeats, in characters.
const SHOWN_VALUE_MAX_CHARS: usize = 80;

/// A setting that cannot be accepted. Its `Display` names the setting, the value given and what
/// is expected; [`ConfigError::code`] is stable for scripts and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The value is not a number of the expected form (`config_invalid_number`).
    InvalidNumber {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
        /// What an accepted value looks like.
        expected: String,
    },
    /// The value is a number outside the setting's range (`config_out_of_range`).
    OutOfRange {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
        /// What an accepted value looks like.
        expected: String,
    },
    /// The value is not a boolean (`config_invalid_bool`).
    InvalidBool {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
    },
    /// The value is not one of the setting's choices (`config_invalid_choice`).
    InvalidChoice {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
        /// The accepted choices.
        expected: &'static str,
    },
    /// The value is not an absolute path (`config_invalid_path`).
    InvalidPath {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
    },
    /// The value is not an `http://` or `https://` URL with a host (`config_invalid_url`).
    InvalidUrl {
        /// The setting.
        setting: &'static str,
        /// The value given (trimmed, and shortened when long).
        value: String,
    },
    /// Two settings that are each valid disagree (`config_relation`).
    Relation {
        /// The setting the rule constrains.
        setting: &'static str,
        /// Its effective value.
        value: u64,
        /// The comparison that must hold, such as "at most" or "less than".
        rule: &'static str,
        /// The setting it is compared with.
        other: &'static str,
        /// That setting's effective value.
        other_value: u64,
        /// Why the rule exists.
        why: &'static str,
    },
    /// Two settings that exclude each other are both set (`config_conflict`).
    Conflict {
        /// The first setting.
        setting: &'static str,
        /// The second setting.
        other: &'static str,
    },
    /// An item of a comma-separated list is not acceptable (`config_invalid_list_item`).
    InvalidListItem {
        /// The setting.
        setting: &'static str,
        /// The item refused (trimmed, and shortened when long).
        item: String,
        /// What every item must be.
        expected: &'static str,
    },
    /// A name Corral does not read was given to [`Settings::from_pairs`] (`config_unknown_setting`).
    ///
    /// [`Settings::from_pairs`]: super::Settings::from_pairs
    UnknownSetting {
        /// The name given (shortened when long).
        setting: String,
    },
}

impl ConfigError {
    /// The stable code of this kind of error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidNumber { .. } => "config_invalid_number",
            Self::OutOfRange { .. } => "config_out_of_range",
            Self::InvalidBool { .. } => "config_invalid_bool",
            Self::InvalidChoice { .. } => "config_invalid_choice",
            Self::InvalidPath { .. } => "config_invalid_path",
            Self::InvalidUrl { .. } => "config_invalid_url",
            Self::Relation { .. } => "config_relation",
            Self::Conflict { .. } => "config_conflict",
            Self::InvalidListItem { .. } => "config_invalid_list_item",
            Self::UnknownSetting { .. } => "config_unknown_setting",
        }
    }

    /// The setting at fault (for a relation or a conflict, the first of the two).
    #[must_use]
    pub fn setting(&self) -> &str {
        match self {
            Self::InvalidNumber { setting, .. }
            | Self::OutOfRange { setting, .. }
            | Self::InvalidBool { setting, .. }
            | Self::InvalidChoice { setting, .. }
            | Self::InvalidPath { setting, .. }
            | Self::InvalidUrl { setting, .. }
            | Self::Relation { setting, .. }
            | Self::Conflict { setting, .. }
            | Self::InvalidListItem { setting, .. } => setting,
            Self::UnknownSetting { setting } => setting,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidNumber {
                setting,
                value,
                expected,
            }
            | Self::OutOfRange {
                setting,
                value,
                expected,
            } => {
                write!(f, "{setting}={value:?}: expected {expected}")
            }
            Self::InvalidBool { setting, value } => {
                write!(
                    f,
                    "{setting}={value:?}: expected true/false, 1/0, yes/no or on/off"
                )
            }
            Self::InvalidChoice {
                setting,
                value,
                expected,
            } => {
                write!(f, "{setting}={value:?}: expected one of {expected}")
            }
            Self::InvalidPath { setting, value } => {
                write!(
                    f,
                    "{setting}={value:?}: expected an absolute path without control characters"
                )
            }
            Self::InvalidUrl { setting, value } => {
                write!(
                    f,
                    "{setting}={value:?}: expected an http:// or https:// URL with a host"
                )
            }
            Self::Relation {
                setting,
                value,
                rule,
                other,
                other_value,
                why,
            } => {
                write!(
                    f,
                    "{setting}={value} must be {rule} {other}={other_value}: {why}"
                )
            }
            Self::Conflict { setting, other } => {
                write!(
                    f,
                    "{setting} and {other} are both set: set only one of them"
                )
            }
            Self::InvalidListItem {
                setting,
                item,
                expected,
            } => {
                write!(f, "{setting}: {item:?} is not {expected}")
            }
            Self::UnknownSetting { setting } => {
                write!(f, "{setting:?} is not a setting Corral reads")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// A rejected value as an error repeats it: bounded, so a huge value cannot flood a log.
pub(super) fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_VALUE_MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}
