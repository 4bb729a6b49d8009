//! What a run that reached a worker means (WS-5, WS-6, OUT-1 to OUT-4, PKG-6, BOUND-1).
//!
//! Two steps, both pure:
//! 1. [`plan`]: from the worker's reply alone, whether anything of the run may be kept. A `not_run`
//!    record the parent honours (PKG-6: only beside a nonzero exit), a record it cannot trust (a
//!    `not_run` beside a zero or missing exit), or a workspace the worker did not pack: nothing is
//!    kept and the prior snapshot stays authoritative (WS-5).
//! 2. [`decide`]: from the reply and what keeping did ([`Kept`]), the one outcome, the error with
//!    its stable code, the downloads with their references, and the two projections: the model's
//!    (bounded output and diagnostics) and the member's (outcome, exit state, references; never a
//!    diagnostic, OUT-2).
//!
//! Keeping (the shell's work between the two) retains each validated download as an output of its
//! own, named by [`crate::workspace::output_reference`] and never pruned (OUT-1), then saves the
//! workspace. A reference exists only when both succeeded.

use crate::bounds::{Bound, OutputStream};
use crate::downloads::{Download, Rejected, undelivered_documents};
use crate::jail::NotRun;
use crate::workspace::output_reference;

/// The exit code that goes with every `not_run` record (PKG-6: a record counts only beside a
/// nonzero exit).
pub const NOT_RUN_EXIT_CODE: i32 = 1;

/// The most rejected documents an error names; the rest are counted.
pub const REJECTED_NAMED_MAX: usize = 16;

/// What became of the workspace at the worker after the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packed {
    /// Packed into an archive, which the reply carries.
    Archive,
    /// The worker refused to pack it: its reason code and the setting, when a bound refused it.
    Refused {
        /// The worker's reason code (`workspace_too_large`, `archive_symlink`, ...).
        reason: String,
        /// The setting whose bound refused it.
        setting: Option<String>,
    },
    /// No archive and no reason: the worker did not return the workspace.
    Missing,
}

/// What the worker reported about a run.
#[derive(Clone, Copy, Debug)]
pub struct Reported<'a> {
    /// The code's exit status; `None` when the worker killed it or did not run it.
    pub exit_code: Option<i32>,
    /// The worker's `not_run` record.
    pub not_run: Option<NotRun>,
    /// The bound hit first, if any.
    pub bound: Option<Bound>,
    /// The validated downloads.
    pub downloads: &'a [Download],
    /// Documents that failed verification (OUT-4).
    pub rejected: &'a [Rejected],
    /// The workspace after the run.
    pub packed: &'a Packed,
}

/// How a `not_run` record is read (PKG-6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// No record: the code ran.
    Ran,
    /// A record beside a nonzero exit: honoured, the code did not run.
    NotRun(NotRun),
    /// A record beside a zero or missing exit: not trusted.
    Inconsistent,
}

impl Reported<'_> {
    /// The `not_run` record as the parent reads it: honoured only beside a nonzero exit.
    #[must_use]
    pub fn record(&self) -> Record {
        match (self.not_run, self.exit_code) {
            (None, _) => Record::Ran,
            (Some(reason), Some(code)) if code != 0 => Record::NotRun(reason),
            (Some(_), Some(_) | None) => Record::Inconsistent,
        }
    }
}

/// Whether anything of a run may be kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Plan {
    /// Retain the validated downloads as outputs, then save the workspace (where persistence is
    /// on), and report what happened as [`Kept`].
    Keep,
    /// Keep nothing; the prior snapshot stays authoritative. Report [`Kept::Nothing`].
    KeepNothing,
}

/// Whether anything of the run `reported` may be kept.
pub fn plan(reported: &Reported<'_>) -> Plan {
    match (reported.record(), reported.packed) {
        (Record::Ran, Packed::Archive) => Plan::Keep,
        (Record::Ran, Packed::Refused { .. } | Packed::Missing)
        | (Record::NotRun(_) | Record::Inconsistent, _) => Plan::KeepNothing,
    }
}

/// What keeping did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept {
    /// The plan kept nothing.
    Nothing,
    /// The outputs are retained and the workspace holds exactly what the run left (saved now, or
    /// unchanged), or persistence is off and only the outputs are retained.
    Stored {
        /// The workspace generation that holds the run's files; `None` when none is stored.
        generation: Option<u64>,
    },
    /// Another run saved this generation first: this run's files were not kept (WS-5).
    Conflict {
        /// The generation taken.
        generation: u64,
    },
    /// The outputs or the workspace could not be written: nothing of this run is authoritative.
    Unavailable {
        /// What failed.
        message: String,
    },
}

/// A run's outcome. The names are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Exit 0, no bound, no error.
    Succeeded,
    /// A nonzero exit.
    Failed,
    /// A bound was hit (`model.bound` names it).
    BoundExceeded,
    /// The code did not run (`model.not_run` says why).
    NotRun,
    /// The run's result could not be delivered as it should (`error` says why).
    Error,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 5] = [
        Self::Succeeded,
        Self::Failed,
        Self::BoundExceeded,
        Self::NotRun,
        Self::Error,
    ];

    /// The stable name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::BoundExceeded => "bound_exceeded",
            Self::NotRun => "not_run",
            Self::Error => "error",
        }
    }
}

wire_code!(Outcome, as_str, "an outcome");

/// Why a run is an error. The codes are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorCode {
    /// A `not_run` record beside a zero or missing exit (PKG-6): not trusted, nothing kept.
    WorkerRecordInconsistent,
    /// The worker returned neither the workspace nor a reason.
    WorkspaceNotReturned,
    /// The worker refused to pack the workspace (`reason` and `setting` say why).
    WorkspaceNotPacked,
    /// Another run saved the workspace first (WS-5).
    WorkspaceConflict,
    /// The outputs or the workspace could not be stored (WS-5).
    WorkspaceStorageUnavailable,
    /// A generated document failed verification (OUT-4): removed from the downloads.
    OutputInvalid,
    /// A declared document was not delivered as a verified, retained attachment (OUT-4).
    DeclaredDocumentMissing,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 7] = [
        Self::WorkerRecordInconsistent,
        Self::WorkspaceNotReturned,
        Self::WorkspaceNotPacked,
        Self::WorkspaceConflict,
        Self::WorkspaceStorageUnavailable,
        Self::OutputInvalid,
        Self::DeclaredDocumentMissing,
    ];

    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::WorkerRecordInconsistent => "worker_record_inconsistent",
            Self::WorkspaceNotReturned => "workspace_not_returned",
            Self::WorkspaceNotPacked => "workspace_not_packed",
            Self::WorkspaceConflict => "workspace_conflict",
            Self::WorkspaceStorageUnavailable => "workspace_storage_unavailable",
            Self::OutputInvalid => "output_invalid",
            Self::DeclaredDocumentMissing => "declared_document_missing",
        }
    }
}

wire_code!(ErrorCode, code, "a run error code");

/// A run's error: the code, a sentence, and what it is about.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunError {
    /// The stable code.
    pub code: ErrorCode,
    /// What happened, for a person.
    pub message: String,
    /// The files it is about (declared documents missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Each rejected document and the check it failed (OUT-4), at most [`REJECTED_NAMED_MAX`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Rejected>,
    /// The worker's reason, when the worker refused something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The setting whose bound is involved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
}

impl RunError {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            paths: Vec::new(),
            checks: Vec::new(),
            reason: None,
            setting: None,
        }
    }
}

/// A download with its reference (`None` when it was not retained).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Referenced {
    /// The file.
    #[serde(flatten)]
    pub download: Download,
    /// `output:<run id>/<path>` once retained.
    pub reference: Option<String>,
}

/// One retained output, as a member sees it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberReference {
    /// Workspace-relative path.
    pub path: String,
    /// Media type.
    pub media_type: String,
    /// Size in bytes.
    pub bytes: u64,
    /// The metadata-only reference.
    pub reference: String,
}

/// The member's projection (OUT-2): the outcome, the exit state and the retained references;
/// nothing else, and never a diagnostic.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberProjection {
    /// The outcome.
    pub outcome: Outcome,
    /// The exit state.
    pub exit_code: Option<i32>,
    /// The retained outputs.
    pub references: Vec<MemberReference>,
}

/// What a run means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    /// The one outcome.
    pub outcome: Outcome,
    /// Why it is an error, when it is one.
    pub error: Option<RunError>,
    /// The exit state as reported.
    pub exit_code: Option<i32>,
    /// The honoured `not_run` record.
    pub not_run: Option<NotRun>,
    /// The bound hit first.
    pub bound: Option<Bound>,
    /// The validated downloads with their references.
    pub downloads: Vec<Referenced>,
    /// The workspace generation that holds the run's files, when one does.
    pub generation: Option<u64>,
}

impl Decided {
    /// A `not_run` record answered before any lease (PKG-6): nothing ran, nothing kept.
    #[must_use]
    pub fn not_run_before_lease(reason: NotRun) -> Self {
        Self {
            outcome: Outcome::NotRun,
            error: None,
            exit_code: Some(NOT_RUN_EXIT_CODE),
            not_run: Some(reason),
            bound: None,
            downloads: Vec::new(),
            generation: None,
        }
    }

    /// The member's projection.
    #[must_use]
    pub fn member(&self) -> MemberProjection {
        MemberProjection {
            outcome: self.outcome,
            exit_code: self.exit_code,
            references: self
                .downloads
                .iter()
                .filter_map(|d| {
                    Some(MemberReference {
                        path: d.download.path.clone(),
                        media_type: d.download.media_type.clone(),
                        bytes: d.download.bytes,
                        reference: d.reference.clone()?,
                    })
                })
                .collect(),
        }
    }

    /// The model's view of the decision, beside the run's output.
    #[must_use]
    pub fn model<'a>(
        &'a self,
        stdout: &'a OutputStream,
        stderr: &'a OutputStream,
        diagnostics: &'a [String],
        rejected: &'a [Rejected],
    ) -> ModelView<'a> {
        ModelView {
            exit_code: self.exit_code,
            stdout,
            stderr,
            bound: self.bound,
            not_run: self.not_run,
            diagnostics,
            downloads: &self.downloads,
            rejected,
        }
    }
}

/// The model's projection of a run (OUT-2): bounded output, diagnostics, the downloads with their
/// references and the documents rejected. The API adds the run's egress report, durations and
/// workspace generation beside it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelView<'a> {
    /// The exit state.
    pub exit_code: Option<i32>,
    /// Bounded stdout.
    pub stdout: &'a OutputStream,
    /// Bounded stderr.
    pub stderr: &'a OutputStream,
    /// The bound hit first.
    pub bound: Option<Bound>,
    /// The honoured `not_run` record.
    pub not_run: Option<NotRun>,
    /// The worker's bounded diagnostics.
    pub diagnostics: &'a [String],
    /// The validated downloads and their references.
    pub downloads: &'a [Referenced],
    /// Documents that failed verification.
    pub rejected: &'a [Rejected],
}

/// The one outcome of the run `reported`, given what keeping did (`kept`, as [`plan`] ordered),
/// the declared outputs and the run's id (which names its retained outputs).
#[must_use]
pub fn decide(reported: &Reported<'_>, kept: &Kept, declared: &[String], run_id: &str) -> Decided {
    let record = reported.record();
    let retained = matches!(kept, Kept::Stored { .. });
    let downloads: Vec<Referenced> = reported
        .downloads
        .iter()
        .map(|download| Referenced {
            reference: retained.then(|| output_reference(run_id, &download.path)),
            download: download.clone(),
        })
        .collect();
    let error = error_of(reported, record, kept, declared, &downloads);
    let outcome = match (&error, record) {
        (Some(_), _) => Outcome::Error,
        (None, Record::NotRun(_)) => Outcome::NotRun,
        (None, Record::Ran | Record::Inconsistent) => match (reported.bound, reported.exit_code) {
            (Some(_), _) => Outcome::BoundExceeded,
            (None, Some(0)) => Outcome::Succeeded,
            (None, _) => Outcome::Failed,
        },
    };
    let generation = match kept {
        Kept::Stored { generation } => *generation,
        Kept::Nothing | Kept::Conflict { .. } | Kept::Unavailable { .. } => None,
    };
    let decided = Decided {
        outcome,
        error,
        exit_code: reported.exit_code,
        not_run: match record {
            Record::NotRun(reason) => Some(reason),
            Record::Ran | Record::Inconsistent => None,
        },
        bound: reported.bound,
        downloads,
        generation,
    };
    assert!(
        decided.outcome != Outcome::NotRun || decided.exit_code.is_some_and(|code| code != 0),
        "a not_run outcome only beside a nonzero exit"
    );
    assert!(
        decided.downloads.iter().all(|d| d.reference.is_none()) || retained,
        "a reference only to a retained output"
    );
    decided
}

/// The error of a run, by precedence: what makes its record untrustworthy, then what kept its
/// files from being stored, then what is wrong with its outputs.
fn error_of(
    reported: &Reported<'_>,
    record: Record,
    kept: &Kept,
    declared: &[String],
    downloads: &[Referenced],
) -> Option<RunError> {
    if record == Record::Inconsistent {
        return Some(RunError::new(
            ErrorCode::WorkerRecordInconsistent,
            "the worker reported not_run beside a zero or missing exit; nothing was kept and the \
             prior snapshot stays authoritative",
        ));
    }
    if let Record::NotRun(_) = record {
        return None;
    }
    match reported.packed {
        Packed::Archive => {}
        Packed::Refused { reason, setting } => {
            let mut error = RunError::new(
                ErrorCode::WorkspaceNotPacked,
                "the worker could not pack the workspace; the prior snapshot stays authoritative",
            );
            error.reason = Some(reason.clone());
            error.setting.clone_from(setting);
            return Some(error);
        }
        Packed::Missing => {
            return Some(RunError::new(
                ErrorCode::WorkspaceNotReturned,
                "the worker returned no workspace; the prior snapshot stays authoritative",
            ));
        }
    }
    match kept {
        Kept::Stored { .. } | Kept::Nothing => {}
        Kept::Conflict { generation } => {
            return Some(RunError::new(
                ErrorCode::WorkspaceConflict,
                format!(
                    "another run saved generation {generation} of this workspace first; this \
                     run's files were not kept and the other run's snapshot is authoritative"
                ),
            ));
        }
        Kept::Unavailable { message } => {
            return Some(RunError::new(
                ErrorCode::WorkspaceStorageUnavailable,
                format!(
                    "the run's files could not be stored ({message}); the prior snapshot stays \
                     authoritative"
                ),
            ));
        }
    }
    if reported.bound.is_some() {
        // A run stopped at a bound leaves partial files; the bound is the reason to report.
        return None;
    }
    if !reported.rejected.is_empty() {
        let mut error = RunError::new(
            ErrorCode::OutputInvalid,
            format!(
                "{} generated document(s) failed verification and were removed from the \
                 downloads; the files are still in the workspace",
                reported.rejected.len()
            ),
        );
        error.checks = reported
            .rejected
            .iter()
            .take(REJECTED_NAMED_MAX)
            .cloned()
            .collect();
        return Some(error);
    }
    let delivered: Vec<&str> = downloads
        .iter()
        .filter(|d| d.reference.is_some())
        .map(|d| d.download.path.as_str())
        .collect();
    let missing = undelivered_documents(declared, &delivered);
    if reported.exit_code == Some(0) && !missing.is_empty() {
        let mut error = RunError::new(
            ErrorCode::DeclaredDocumentMissing,
            "a declared .pdf, .docx, .pptx or .xlsx was not delivered as a verified, retained \
             attachment",
        );
        error.paths = missing.into_iter().map(str::to_owned).collect();
        return Some(error);
    }
    None
}

#[cfg(test)]
mod tests;
