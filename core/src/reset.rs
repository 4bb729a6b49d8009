//! The evidence a worker returns after a reset, and the one judge of it (POOL-4, POOL-8).
//!
//! Reuse requires positive evidence, not the absence of an error: every measurement must be present
//! and zero, and the evidence must carry the operation token the reset was ordered under. Anything
//! missing, non-zero or mismatched means the worker is discarded.

use crate::ids::OpToken;

/// What a worker measured after killing a run's processes and wiping its workspace. `None` means the
/// worker could not measure it, which is never taken as zero.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResetEvidence {
    /// The operation token the reset was ordered under, echoed by the worker.
    pub token: OpToken,
    /// Processes of the run still alive after the kill.
    pub processes_remaining: Option<u32>,
    /// Entries left in the workspace directory after the wipe.
    pub workspace_entries: Option<u32>,
    /// Entries left in the run's private /tmp and /dev/shm.
    pub scratch_entries: Option<u32>,
    /// Mounts of the run still present.
    pub mounts_remaining: Option<u32>,
}

impl ResetEvidence {
    /// Evidence of a fully clean reset under `token`.
    #[must_use]
    pub fn clean(token: OpToken) -> Self {
        Self {
            token,
            processes_remaining: Some(0),
            workspace_entries: Some(0),
            scratch_entries: Some(0),
            mounts_remaining: Some(0),
        }
    }
}

/// Why a reset did not prove the worker clean. The codes are stable.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Unproven {
    /// The evidence was produced under another operation's token.
    TokenMismatch,
    /// A measurement is missing.
    Unmeasured,
    /// Processes of the run survived.
    ProcessesRemaining,
    /// The workspace is not empty.
    WorkspaceNotEmpty,
    /// /tmp or /dev/shm is not empty.
    ScratchNotEmpty,
    /// A mount of the run survived.
    MountsRemaining,
}

impl Unproven {
    /// The stable reason code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::TokenMismatch => "reset_token_mismatch",
            Self::Unmeasured => "reset_unmeasured",
            Self::ProcessesRemaining => "reset_processes_remaining",
            Self::WorkspaceNotEmpty => "reset_workspace_not_empty",
            Self::ScratchNotEmpty => "reset_scratch_not_empty",
            Self::MountsRemaining => "reset_mounts_remaining",
        }
    }
}

/// The verdict on a reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Verdict {
    /// Proven clean: the worker may be published warm.
    Clean,
    /// Not proven clean: the worker must be discarded.
    Discard(Unproven),
}

/// Judges `evidence` for a reset ordered under `expected`. The only definition of "clean".
#[must_use]
pub fn judge(evidence: &ResetEvidence, expected: OpToken) -> Verdict {
    if evidence.token != expected {
        return Verdict::Discard(Unproven::TokenMismatch);
    }
    let measured = [
        (evidence.processes_remaining, Unproven::ProcessesRemaining),
        (evidence.workspace_entries, Unproven::WorkspaceNotEmpty),
        (evidence.scratch_entries, Unproven::ScratchNotEmpty),
        (evidence.mounts_remaining, Unproven::MountsRemaining),
    ];
    for (value, failure) in measured {
        match value {
            None => return Verdict::Discard(Unproven::Unmeasured),
            Some(0) => {}
            Some(_) => return Verdict::Discard(failure),
        }
    }
    Verdict::Clean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_04_only_complete_zero_evidence_under_the_right_token_is_clean() {
        let token = OpToken(7);
        assert_eq!(judge(&ResetEvidence::clean(token), token), Verdict::Clean);
        assert_eq!(
            judge(&ResetEvidence::clean(OpToken(6)), token),
            Verdict::Discard(Unproven::TokenMismatch)
        );
        let mut e = ResetEvidence::clean(token);
        e.processes_remaining = Some(1);
        assert_eq!(
            judge(&e, token),
            Verdict::Discard(Unproven::ProcessesRemaining)
        );
        let mut e = ResetEvidence::clean(token);
        e.workspace_entries = None;
        assert_eq!(judge(&e, token), Verdict::Discard(Unproven::Unmeasured));
        let mut e = ResetEvidence::clean(token);
        e.scratch_entries = Some(3);
        assert_eq!(
            judge(&e, token),
            Verdict::Discard(Unproven::ScratchNotEmpty)
        );
        let mut e = ResetEvidence::clean(token);
        e.mounts_remaining = Some(1);
        assert_eq!(
            judge(&e, token),
            Verdict::Discard(Unproven::MountsRemaining)
        );
    }
}
