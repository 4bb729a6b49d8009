//! The result of one run, as `corral jail run` prints it and the control API will return it.

use corral_core::jail::CappedOutput;
use corral_core::reset::{ResetEvidence, Verdict, judge};
use serde::Serialize;

use crate::archive::ArchiveError;

/// The most diagnostics a result carries, and the longest one, in characters.
pub const DIAGNOSTICS_MAX: usize = 32;
/// See [`DIAGNOSTICS_MAX`].
pub const DIAGNOSTIC_MAX_CHARS: usize = 512;

/// One output stream of a run.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct StreamResult {
    /// The bytes kept, as UTF-8 (invalid sequences replaced).
    pub text: String,
    /// Whether bytes past `SANDBOX_MAX_OUTPUT_BYTES` were dropped.
    pub truncated: bool,
    /// Every byte the stream carried.
    pub bytes_total: u64,
    /// Bytes dropped past the cap.
    pub bytes_dropped: u64,
}

impl From<&CappedOutput> for StreamResult {
    fn from(output: &CappedOutput) -> Self {
        Self {
            text: String::from_utf8_lossy(output.kept()).into_owned(),
            truncated: output.truncated(),
            bytes_total: output.bytes_total(),
            bytes_dropped: output.bytes_dropped(),
        }
    }
}

/// A file in the typed download list.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DownloadResult {
    /// Workspace-relative path.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Media type.
    pub media_type: &'static str,
}

/// The reset evidence with the core's verdict on it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct EvidenceResult {
    /// The operation token the reset ran under.
    pub token: u64,
    /// Processes of the run left after the kill.
    pub processes_remaining: Option<u32>,
    /// Entries left in the workspace after the wipe.
    pub workspace_entries: Option<u32>,
    /// Entries left in /tmp and /dev/shm after the wipe.
    pub scratch_entries: Option<u32>,
    /// Mounts of the run left.
    pub mounts_remaining: Option<u32>,
    /// `clean`, or the reason code for discarding the worker (`corral_core::reset::judge`).
    pub verdict: &'static str,
}

impl EvidenceResult {
    /// The evidence and the core's verdict on it.
    pub fn judged(evidence: &ResetEvidence) -> Self {
        let verdict = match judge(evidence, evidence.token) {
            Verdict::Clean => "clean",
            Verdict::Discard(reason) => reason.code(),
        };
        Self {
            token: evidence.token.0,
            processes_remaining: evidence.processes_remaining,
            workspace_entries: evidence.workspace_entries,
            scratch_entries: evidence.scratch_entries,
            mounts_remaining: evidence.mounts_remaining,
            verdict,
        }
    }
}

/// The isolation a run had.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct IsolationResult {
    /// `full`, `weaker` (the operator waived what `missing` lists), or `refused`.
    pub posture: &'static str,
    /// The primitives found missing at start.
    pub missing: Vec<&'static str>,
}

/// How long the phases took, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Durations {
    /// From the start of the request to the end of the reset.
    pub total_ms: u64,
    /// From the jail's `G` to the end of the code.
    pub run_ms: u64,
    /// The kill, wipe and measurement.
    pub reset_ms: u64,
}

/// The result of one run.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct RunResult {
    /// The code's exit status (128 plus the signal when a signal ended it); null when the code
    /// did not run or the worker killed it at the wall limit.
    pub exit_code: Option<i32>,
    /// The code's stdout.
    pub stdout: StreamResult,
    /// The code's stderr.
    pub stderr: StreamResult,
    /// The setting of the bound the run hit (the first by precedence), or null.
    pub bound: Option<&'static str>,
    /// Every bound the run hit, in precedence order.
    pub bounds: Vec<&'static str>,
    /// The typed download list.
    pub downloads: Vec<DownloadResult>,
    /// Why the code was not run, or null.
    pub not_run: Option<&'static str>,
    /// What the reset measured, with the core's verdict.
    pub reset_evidence: Option<EvidenceResult>,
    /// The isolation the run had, or why it was refused.
    pub isolation: IsolationResult,
    /// Bounded notes: skipped files, invalid documents, waived primitives, failed steps.
    pub diagnostics: Vec<String>,
    /// Whether the code ran in the jail prepared before the request (its interpreter already
    /// started), rather than one built for it.
    pub warm: bool,
    /// Timings.
    pub durations: Durations,
    /// The workspace packed after the run, when the request asked for it (the control API encodes
    /// it itself; `corral jail run` copies downloads back instead).
    #[serde(skip)]
    pub workspace_archive: Option<Result<Vec<u8>, ArchiveError>>,
}

/// Appends `note` to `diagnostics` within the bounds: shortened when long, dropped (with one
/// final note saying so) when there are too many.
pub fn note(diagnostics: &mut Vec<String>, note: impl Into<String>) {
    let mut note: String = note.into();
    if note.chars().count() > DIAGNOSTIC_MAX_CHARS {
        note = note.chars().take(DIAGNOSTIC_MAX_CHARS).collect::<String>() + "…";
    }
    match diagnostics.len() {
        n if n + 1 < DIAGNOSTICS_MAX => diagnostics.push(note),
        n if n + 1 == DIAGNOSTICS_MAX => diagnostics.push("further diagnostics omitted".to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostics_are_bounded() {
        let mut diagnostics = Vec::new();
        for index in 0..100 {
            note(&mut diagnostics, format!("{index} {}", "x".repeat(2000)));
        }
        assert_eq!(diagnostics.len(), DIAGNOSTICS_MAX);
        assert!(
            diagnostics
                .iter()
                .all(|d| d.chars().count() <= DIAGNOSTIC_MAX_CHARS + 1)
        );
        assert_eq!(
            diagnostics.last().map(String::as_str),
            Some("further diagnostics omitted")
        );
    }
}
