//! Numeric settings: what each counts, its legal range, and the parsing of numbers and byte sizes.

use super::error::{ConfigError, shown};

const KIB: u64 = 1 << 10;
pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;
pub(super) const TIB: u64 = 1 << 40;

/// What a number counts, which decides how it is parsed and how its range is described.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Count,
    Seconds,
    Bytes,
    Port,
}

/// A numeric setting: its name and the inclusive range an accepted value lies in.
#[derive(Clone, Copy, Debug)]
pub(super) struct Number {
    pub(super) name: &'static str,
    unit: Unit,
    pub(super) min: u64,
    pub(super) max: u64,
}

pub(super) const fn count(name: &'static str, min: u64, max: u64) -> Number {
    Number {
        name,
        unit: Unit::Count,
        min,
        max,
    }
}

pub(super) const fn seconds(name: &'static str, min: u64, max: u64) -> Number {
    Number {
        name,
        unit: Unit::Seconds,
        min,
        max,
    }
}

pub(super) const fn bytes(name: &'static str, min: u64, max: u64) -> Number {
    Number {
        name,
        unit: Unit::Bytes,
        min,
        max,
    }
}

pub(super) const fn port(name: &'static str) -> Number {
    Number {
        name,
        unit: Unit::Port,
        min: 1,
        max: 65_535,
    }
}

impl Number {
    /// What an accepted value looks like, for an error message.
    fn expected(&self) -> String {
        match self.unit {
            Unit::Count => format!("a whole number from {} to {}", self.min, self.max),
            Unit::Seconds => format!(
                "a whole number of seconds from {} to {}",
                self.min, self.max
            ),
            Unit::Port => format!("a port number from {} to {}", self.min, self.max),
            Unit::Bytes => format!(
                "a size from {} to {} (whole bytes, or with a KiB, MiB, GiB, KB, MB or GB suffix)",
                human_bytes(self.min),
                human_bytes(self.max)
            ),
        }
    }

    /// Parses `text` (already trimmed, not empty) and checks its range.
    pub(super) fn parse(&self, text: &str) -> Result<u64, ConfigError> {
        let parsed = match self.unit {
            Unit::Bytes => parse_byte_size(text),
            Unit::Count | Unit::Seconds | Unit::Port => parse_digits(text),
        };
        match parsed {
            Parsed::Invalid => Err(ConfigError::InvalidNumber {
                setting: self.name,
                value: shown(text),
                expected: self.expected(),
            }),
            Parsed::TooLarge => Err(self.out_of_range(shown(text))),
            Parsed::Value(value) if value < self.min || value > self.max => {
                Err(self.out_of_range(shown(text)))
            }
            Parsed::Value(value) => Ok(value),
        }
    }

    /// Checks a value already held in [`Settings`].
    ///
    /// [`Settings`]: super::Settings
    pub(super) fn check(&self, value: u64) -> Result<(), ConfigError> {
        if value < self.min || value > self.max {
            return Err(self.out_of_range(value.to_string()));
        }
        Ok(())
    }

    pub(super) fn out_of_range(&self, value: String) -> ConfigError {
        ConfigError::OutOfRange {
            setting: self.name,
            value,
            expected: self.expected(),
        }
    }
}

/// The outcome of reading a whole number.
enum Parsed {
    Value(u64),
    TooLarge,
    Invalid,
}

/// Decimal digits only: no sign, no separators.
fn parse_digits(text: &str) -> Parsed {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Parsed::Invalid;
    }
    match text.parse::<u64>() {
        Ok(value) => Parsed::Value(value),
        // Only digits, so the one way to fail is a number beyond u64.
        Err(_) => Parsed::TooLarge,
    }
}

/// Suffixes a byte size may carry, matched without regard to case.
const BYTE_SUFFIXES: &[(&str, u64)] = &[
    ("B", 1),
    ("KiB", KIB),
    ("MiB", MIB),
    ("GiB", GIB),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
];

/// Whole bytes, or a whole number and a suffix, with optional space between them.
fn parse_byte_size(text: &str) -> Parsed {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, rest) = text.split_at(digits_end);
    let suffix = rest.trim_start();
    let multiplier = if suffix.is_empty() {
        1
    } else {
        match BYTE_SUFFIXES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(suffix))
        {
            Some((_, multiplier)) => *multiplier,
            None => return Parsed::Invalid,
        }
    };
    match parse_digits(digits) {
        Parsed::Value(value) => value
            .checked_mul(multiplier)
            .map_or(Parsed::TooLarge, Parsed::Value),
        other => other,
    }
}

/// A byte count as an operator would write it: the largest unit that divides it exactly.
fn human_bytes(value: u64) -> String {
    const UNITS: &[(&str, u64)] = &[
        ("TiB", TIB),
        ("GiB", GIB),
        ("MiB", MIB),
        ("KiB", KIB),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KB", 1_000),
    ];
    for (name, size) in UNITS {
        if value != 0 && value.is_multiple_of(*size) {
            return format!("{} {name}", value / size);
        }
    }
    format!("{value} B")
}
