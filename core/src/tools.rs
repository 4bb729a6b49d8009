//! Read-only tool callbacks (KER-5, decision 0018): the tools the calling platform advertises for
//! a run, which the run's code may call through the worker's supervisor. The platform passes the
//! tools and an opaque capability with the request; the supervisor holds the capability, and the
//! API replica that owns the run forwards each call to the platform's tool endpoint with it, so
//! the code never holds it. Only read tools are callable: a write tool and a recursive `run_code`
//! are refused by name, whatever the platform advertised.
//!
//! Pure: the limits, the request's validation and the judgement of one call.

use serde::{Deserialize, Serialize};

/// Where the supervisor's tool relay listens inside the jail.
pub const JAIL_TOOLS_PORT: u16 = 8099;
/// The most tools a run may be given.
pub const TOOLS_MAX: usize = 32;
/// The longest tool name.
pub const NAME_MAX_BYTES: usize = 64;
/// The longest capability.
pub const CAPABILITY_MAX_BYTES: usize = 4096;
/// The largest call (the JSON the code sends) the relay reads.
pub const CALL_MAX_BYTES: usize = 64 * 1024;
/// The largest payload a call returns to the code: "the normal bounded tool payload".
pub const PAYLOAD_MAX_BYTES: usize = 256 * 1024;
/// How long one call may take, the platform's answer included.
pub const CALL_TIMEOUT_MS: u64 = 30_000;
/// The name recursive code execution goes by: never callable from code.
pub const RECURSIVE: &str = "run_code";

/// What a tool may do, as the platform advertises it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Reads only: callable.
    Read,
    /// Changes something: never callable from code.
    Write,
}

/// One advertised tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// What it may do.
    pub access: Access,
}

/// The tools of a run and the capability that calls them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tools {
    /// The tools advertised.
    pub tools: Vec<Tool>,
    /// The platform's opaque capability for this run; never given to code, never logged.
    pub capability: String,
}

impl core::fmt::Debug for Tools {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Tools")
            .field("tools", &self.tools)
            .field("capability", &"<redacted>")
            .finish()
    }
}

impl Tools {
    /// What is wrong with them, if anything: at most [`TOOLS_MAX`] tools, names of
    /// `[A-Za-z0-9_.-]`, 1 to [`NAME_MAX_BYTES`] long and not repeated, and a capability of 1 to
    /// [`CAPABILITY_MAX_BYTES`] printable ASCII characters.
    ///
    /// # Errors
    /// A sentence saying what.
    pub fn check(&self) -> Result<(), String> {
        if self.tools.len() > TOOLS_MAX {
            return Err(format!("at most {TOOLS_MAX} tools"));
        }
        for (i, tool) in self.tools.iter().enumerate() {
            let valid = !tool.name.is_empty()
                && tool.name.len() <= NAME_MAX_BYTES
                && tool
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
            if !valid {
                return Err(format!(
                    "tool name {:?} must be 1 to {NAME_MAX_BYTES} of A-Z a-z 0-9 _ . -",
                    tool.name
                ));
            }
            if self.tools[..i].iter().any(|t| t.name == tool.name) {
                return Err(format!("tool {:?} is given twice", tool.name));
            }
        }
        let capability_ok = !self.capability.is_empty()
            && self.capability.len() <= CAPABILITY_MAX_BYTES
            && self.capability.bytes().all(|b| b.is_ascii_graphic());
        if !capability_ok {
            return Err(format!(
                "the capability must be 1 to {CAPABILITY_MAX_BYTES} printable ASCII characters"
            ));
        }
        Ok(())
    }

    /// Judges a call of `name`.
    ///
    /// # Errors
    /// Why it is refused.
    pub fn judge(&self, name: &str) -> Result<(), CallRefusal> {
        if name == RECURSIVE {
            return Err(CallRefusal::Recursive);
        }
        match self.tools.iter().find(|t| t.name == name) {
            None => Err(CallRefusal::NotGranted),
            Some(Tool {
                access: Access::Write,
                ..
            }) => Err(CallRefusal::Write),
            Some(_) => Ok(()),
        }
    }

    /// The names the code may call.
    #[must_use]
    pub fn callable(&self) -> Vec<&str> {
        self.tools
            .iter()
            .filter(|t| self.judge(&t.name).is_ok())
            .map(|t| t.name.as_str())
            .collect()
    }
}

/// Why a call was refused. The codes are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallRefusal {
    /// The run was given no tool of that name.
    NotGranted,
    /// The tool writes: code may call read tools only.
    Write,
    /// Recursive code execution.
    Recursive,
    /// The call is not `{"tool": name, "arguments": {...}}` within [`CALL_MAX_BYTES`].
    Malformed,
    /// The platform's answer exceeded [`PAYLOAD_MAX_BYTES`].
    PayloadTooLarge,
    /// The platform's tool endpoint could not be reached or did not answer in time.
    Unavailable,
}

impl CallRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::NotGranted => "tool_not_granted",
            Self::Write => "tool_write_refused",
            Self::Recursive => "tool_recursive_refused",
            Self::Malformed => "tool_call_malformed",
            Self::PayloadTooLarge => "tool_payload_too_large",
            Self::Unavailable => "tool_unavailable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Tools {
        Tools {
            tools: vec![
                Tool {
                    name: "docs.search".into(),
                    access: Access::Read,
                },
                Tool {
                    name: "mail.send".into(),
                    access: Access::Write,
                },
                Tool {
                    name: RECURSIVE.into(),
                    access: Access::Read,
                },
            ],
            capability: "cap-123".into(),
        }
    }

    #[test]
    fn ker_05_only_advertised_read_tools_are_callable() {
        let tools = tools();
        assert_eq!(tools.judge("docs.search"), Ok(()));
        assert_eq!(tools.judge("mail.send"), Err(CallRefusal::Write));
        assert_eq!(tools.judge("run_code"), Err(CallRefusal::Recursive));
        assert_eq!(tools.judge("docs.delete"), Err(CallRefusal::NotGranted));
        assert_eq!(tools.callable(), ["docs.search"]);
        assert!(!format!("{tools:?}").contains("cap-123"));
    }

    #[test]
    fn ker_05_malformed_tool_grants_are_refused() {
        assert!(tools().check().is_ok());
        let mut bad = tools();
        bad.capability = String::new();
        assert!(bad.check().is_err());
        let mut bad = tools();
        bad.capability = "has space".into();
        assert!(bad.check().is_err());
        let mut bad = tools();
        bad.tools[0].name = "a/b".into();
        assert!(bad.check().is_err());
        let mut bad = tools();
        bad.tools[1].name = "docs.search".into();
        assert!(bad.check().is_err());
        let mut bad = tools();
        bad.tools = (0..=TOOLS_MAX)
            .map(|i| Tool {
                name: format!("t{i}"),
                access: Access::Read,
            })
            .collect();
        assert!(bad.check().is_err());
    }
}
