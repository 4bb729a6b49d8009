use proptest::prelude::*;

use super::*;
use crate::downloads::InvalidDocument;

const RUN: &str = "0123456789abcdef0123456789abcdef";

fn download(path: &str) -> Download {
    Download {
        path: path.to_owned(),
        bytes: 10,
        media_type: crate::downloads::media_type(path).to_owned(),
    }
}

fn reported<'a>(
    exit_code: Option<i32>,
    downloads: &'a [Download],
    rejected: &'a [Rejected],
    packed: &'a Packed,
) -> Reported<'a> {
    Reported {
        exit_code,
        not_run: None,
        bound: None,
        downloads,
        rejected,
        packed,
    }
}

fn implies(premise: bool, conclusion: bool) -> bool {
    !premise || conclusion
}

#[test]
fn out_04_an_undeclared_invalid_document_makes_the_run_an_error_naming_file_and_check() {
    let downloads = [download("table.csv")];
    let rejected = [Rejected {
        path: "report.pdf".into(),
        check: InvalidDocument::PdfHeaderMissing,
    }];
    let packed = Packed::Archive;
    let reported = reported(Some(0), &downloads, &rejected, &packed);
    assert_eq!(plan(&reported), Plan::Keep);
    let decided = decide(
        &reported,
        &Kept::Stored {
            generation: Some(2),
        },
        &[],
        RUN,
    );
    assert_eq!(decided.outcome, Outcome::Error);
    let error = decided.error.clone().expect("an error");
    assert_eq!(error.code.code(), "output_invalid");
    assert_eq!(error.checks, rejected);
    assert_eq!(error.checks[0].check.code(), "pdf_header_missing");
    // The invalid file has no reference anywhere; the valid one keeps its own.
    let member = decided.member();
    assert_eq!(member.references.len(), 1);
    assert_eq!(member.references[0].path, "table.csv");
    assert!(
        !serde_json::to_string(&member)
            .unwrap()
            .contains("report.pdf")
    );
}

#[test]
fn pkg_06_a_not_run_record_is_honoured_only_beside_a_nonzero_exit() {
    let packed = Packed::Missing;
    let cases = [
        (
            Some(1),
            Record::NotRun(NotRun::JailSetupFailed),
            Outcome::NotRun,
            None,
        ),
        (
            Some(-9),
            Record::NotRun(NotRun::JailSetupFailed),
            Outcome::NotRun,
            None,
        ),
        (
            Some(0),
            Record::Inconsistent,
            Outcome::Error,
            Some(ErrorCode::WorkerRecordInconsistent),
        ),
        (
            None,
            Record::Inconsistent,
            Outcome::Error,
            Some(ErrorCode::WorkerRecordInconsistent),
        ),
    ];
    for (exit_code, record, outcome, error) in cases {
        let mut reported = reported(exit_code, &[], &[], &packed);
        reported.not_run = Some(NotRun::JailSetupFailed);
        assert_eq!(reported.record(), record, "{exit_code:?}");
        assert_eq!(plan(&reported), Plan::KeepNothing);
        let decided = decide(&reported, &Kept::Nothing, &[], RUN);
        assert_eq!(
            (decided.outcome, decided.error.map(|e| e.code)),
            (outcome, error),
            "{exit_code:?}"
        );
    }
}

#[test]
fn out_01_references_name_the_retained_output_and_exist_only_once_kept() {
    let downloads = [download("out/chart.png")];
    let packed = Packed::Archive;
    let reported = reported(Some(0), &downloads, &[], &packed);
    let stored = decide(
        &reported,
        &Kept::Stored {
            generation: Some(7),
        },
        &[],
        RUN,
    );
    let reference = stored.downloads[0].reference.clone().expect("a reference");
    assert_eq!(reference, format!("output:{RUN}/out/chart.png"));
    assert_eq!(
        crate::workspace::parse_output_reference(&reference),
        Some((RUN, "out/chart.png"))
    );
    for kept in [
        Kept::Conflict { generation: 8 },
        Kept::Unavailable {
            message: "down".into(),
        },
    ] {
        let decided = decide(&reported, &kept, &[], RUN);
        assert_eq!(decided.outcome, Outcome::Error, "{kept:?}");
        assert!(decided.member().references.is_empty(), "{kept:?}");
    }
}

#[test]
fn out_04_a_declared_document_succeeds_only_when_retained() {
    let declared = ["report.docx".to_owned()];
    let packed = Packed::Archive;
    let missing = reported(Some(0), &[], &[], &packed);
    let decided = decide(
        &missing,
        &Kept::Stored {
            generation: Some(1),
        },
        &declared,
        RUN,
    );
    assert_eq!(
        decided.error.map(|e| (e.code, e.paths)),
        Some((ErrorCode::DeclaredDocumentMissing, declared.to_vec()))
    );
    let downloads = [download("report.docx")];
    let delivered = reported(Some(0), &downloads, &[], &packed);
    let decided = decide(
        &delivered,
        &Kept::Stored {
            generation: Some(1),
        },
        &declared,
        RUN,
    );
    assert_eq!(decided.outcome, Outcome::Succeeded);
}

#[test]
fn a_workspace_not_returned_or_not_packed_keeps_nothing_and_says_which() {
    let missing = Packed::Missing;
    let reported_missing = reported(Some(0), &[], &[], &missing);
    assert_eq!(plan(&reported_missing), Plan::KeepNothing);
    let decided = decide(&reported_missing, &Kept::Nothing, &[], RUN);
    assert_eq!(
        decided.error.map(|e| e.code),
        Some(ErrorCode::WorkspaceNotReturned)
    );
    let refused = Packed::Refused {
        reason: "workspace_too_large".into(),
        setting: Some("SANDBOX_WORKSPACE_MAX_BYTES".into()),
    };
    let reported_refused = reported(Some(0), &[], &[], &refused);
    let decided = decide(&reported_refused, &Kept::Nothing, &[], RUN);
    let error = decided.error.expect("an error");
    assert_eq!(
        (
            error.code,
            error.reason.as_deref(),
            error.setting.as_deref()
        ),
        (
            ErrorCode::WorkspaceNotPacked,
            Some("workspace_too_large"),
            Some("SANDBOX_WORKSPACE_MAX_BYTES")
        )
    );
}

#[test]
fn out_02_the_member_projection_has_exactly_outcome_exit_code_and_references() {
    let decided = Decided::not_run_before_lease(NotRun::UnsupportedLanguage);
    let member = serde_json::to_value(decided.member()).unwrap();
    let keys: Vec<&str> = member
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["exit_code", "outcome", "references"]);
    assert_eq!(member["outcome"], "not_run");
    assert_eq!(member["exit_code"], NOT_RUN_EXIT_CODE);
}

// Combinators rather than `prop_oneof!`, which holds an `Arc` this crate's lints refuse.
fn not_run_strategy() -> impl Strategy<Value = Option<NotRun>> {
    proptest::option::of(proptest::sample::select(NotRun::ALL.to_vec()))
}

fn bound_strategy() -> impl Strategy<Value = Option<Bound>> {
    proptest::option::of(proptest::sample::select(Bound::ALL.to_vec()))
}

fn exit_code_strategy() -> impl Strategy<Value = Option<i32>> {
    (0u8..4, any::<i32>()).prop_map(|(kind, any)| match kind {
        0 => None,
        1 => Some(0),
        2 => Some(1),
        _ => Some(any),
    })
}

fn packed_strategy() -> impl Strategy<Value = Packed> {
    (0u8..3).prop_map(|kind| match kind {
        0 => Packed::Archive,
        1 => Packed::Missing,
        _ => Packed::Refused {
            reason: "workspace_too_large".into(),
            setting: Some("SANDBOX_WORKSPACE_MAX_BYTES".into()),
        },
    })
}

fn kept_strategy() -> impl Strategy<Value = Kept> {
    (0u8..4).prop_map(|kind| match kind {
        0 => Kept::Stored { generation: None },
        1 => Kept::Stored {
            generation: Some(3),
        },
        2 => Kept::Conflict { generation: 4 },
        _ => Kept::Unavailable {
            message: "secret diagnostic text".into(),
        },
    })
}

proptest! {
    /// Every combination of exit code, `not_run`, bound, download validity and keeping result
    /// maps to exactly one outcome; a `not_run` beside a zero or missing exit never yields
    /// `not_run`; and the member projection never carries a diagnostic.
    #[test]
    fn pkg_06_out_02_out_04_every_reply_maps_to_exactly_one_outcome(
        exit_code in exit_code_strategy(),
        not_run in not_run_strategy(),
        bound in bound_strategy(),
        invalid in proptest::collection::vec(proptest::sample::select(InvalidDocument::ALL.to_vec()), 0..3),
        valid in 0usize..3,
        declared_pdf in any::<bool>(),
        packed in packed_strategy(),
        kept_if_kept in kept_strategy(),
    ) {
        let downloads: Vec<Download> = (0..valid).map(|i| download(&format!("f{i}.csv"))).collect();
        let rejected: Vec<Rejected> = invalid
            .iter()
            .enumerate()
            .map(|(i, check)| Rejected { path: format!("bad{i}.pdf"), check: *check })
            .collect();
        let declared: Vec<String> = if declared_pdf { vec!["want.pdf".into()] } else { Vec::new() };
        let reported = Reported {
            exit_code, not_run, bound,
            downloads: &downloads, rejected: &rejected, packed: &packed,
        };
        let kept = match plan(&reported) {
            Plan::Keep => kept_if_kept.clone(),
            Plan::KeepNothing => Kept::Nothing,
        };
        let decided = decide(&reported, &kept, &declared, RUN);
        // The outcome and the error, stated from the reply alone (PKG-6, OUT-4, WS-5): a record
        // beside a zero or missing exit is untrusted; an honoured one is not_run with no error;
        // otherwise the workspace's packing, then keeping, then (unless a bound explains the run)
        // a rejected document, then a declared document that a clean exit did not deliver.
        let untrusted_record = not_run.is_some() && exit_code.is_none_or(|code| code == 0);
        let honoured_record = not_run.is_some() && !untrusted_record;
        prop_assert_eq!(plan(&reported) == Plan::Keep, not_run.is_none() && packed == Packed::Archive);
        let expected_error = if untrusted_record {
            Some(ErrorCode::WorkerRecordInconsistent)
        } else if honoured_record {
            None
        } else {
            match (&packed, &kept_if_kept) {
                (Packed::Refused { .. }, _) => Some(ErrorCode::WorkspaceNotPacked),
                (Packed::Missing, _) => Some(ErrorCode::WorkspaceNotReturned),
                (Packed::Archive, Kept::Conflict { .. }) => Some(ErrorCode::WorkspaceConflict),
                (Packed::Archive, Kept::Unavailable { .. }) => {
                    Some(ErrorCode::WorkspaceStorageUnavailable)
                }
                (Packed::Archive, Kept::Stored { .. } | Kept::Nothing) => {
                    if bound.is_some() {
                        None
                    } else if !invalid.is_empty() {
                        Some(ErrorCode::OutputInvalid)
                    } else if declared_pdf && exit_code == Some(0) {
                        // `want.pdf` is never among the downloads (`f<i>.csv`).
                        Some(ErrorCode::DeclaredDocumentMissing)
                    } else {
                        None
                    }
                }
            }
        };
        let expected_outcome = if expected_error.is_some() {
            Outcome::Error
        } else if honoured_record {
            Outcome::NotRun
        } else if bound.is_some() {
            Outcome::BoundExceeded
        } else if exit_code == Some(0) {
            Outcome::Succeeded
        } else {
            Outcome::Failed
        };
        prop_assert_eq!(
            (decided.outcome, decided.error.as_ref().map(|e| e.code)),
            (expected_outcome, expected_error)
        );
        // PKG-6.
        let untrusted = not_run.is_some() && exit_code.is_none_or(|c| c == 0);
        prop_assert!(implies(untrusted, decided.outcome != Outcome::NotRun));
        prop_assert!(implies(
            untrusted,
            decided.error.as_ref().map(|e| e.code) == Some(ErrorCode::WorkerRecordInconsistent)
        ));
        prop_assert_eq!(decided.outcome == Outcome::NotRun, decided.not_run.is_some());
        // OUT-4: a rejected document never gets a reference, and an error names it when no
        // earlier error or bound explains the run.
        let member = decided.member();
        prop_assert!(rejected
            .iter()
            .all(|bad| member.references.iter().all(|r| r.path != bad.path)));
        let stored = matches!(kept, Kept::Stored { .. });
        prop_assert!(implies(
            !rejected.is_empty() && not_run.is_none() && bound.is_none()
                && packed == Packed::Archive && stored,
            decided.error.as_ref().map(|e| e.code) == Some(ErrorCode::OutputInvalid)
        ));
        // References only when retained.
        prop_assert_eq!(member.references.is_empty(), downloads.is_empty() || !stored);
        // OUT-2: the member's projection never carries a diagnostic: exactly three keys, and no
        // text of the error, the worker's reasons or the storage message.
        let text = serde_json::to_string(&member).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(value.as_object().unwrap().len(), 3);
        prop_assert!(!text.contains("secret diagnostic text"));
        prop_assert!(!text.contains("workspace_too_large"));
        prop_assert!(decided.error.iter().all(|e| !text.contains(e.code.code())));
        prop_assert!(decided.error.iter().all(|e| !text.contains(&e.message)));
    }
}
