//! The answers `run_code` gives: a refusal with a stable code, or a run's outcome with the
//! model's and the member's projections (corral-core's), as JSON.

use axum::http::StatusCode;
use corral_contract::{ErrorBody, ExecuteReply};
use corral_core::bounds::OutputStream;
use corral_core::jail::{NotRun, UnsupportedLanguage};
use corral_core::packages::resolve::DependencyFailure;
use corral_core::run::admission::{Refusal, RefusalCode};
use corral_core::run::outcome::{Decided, ErrorCode};
use corral_store::lease::AcquireError;
use serde_json::{Value, json};

use super::keep::Keeping;
use crate::AppState;

/// An answer: its HTTP status and body.
pub type Reply = (StatusCode, Value);

/// A refusal: `{"outcome": "refused", "error": {"code", "message", ...extra}}`.
pub fn refusal(status: StatusCode, code: &str, message: impl Into<String>, extra: Value) -> Reply {
    let mut error = json!({ "code": code, "message": message.into() });
    if let (Some(error), Value::Object(extra)) = (error.as_object_mut(), extra) {
        error.extend(extra);
    }
    (status, json!({ "outcome": "refused", "error": error }))
}

/// A request admission refused (corral-core's code, the field and setting it names).
pub fn request_refused(refused: &Refusal) -> Reply {
    let status = match refused.code {
        RefusalCode::CodeTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        RefusalCode::BoundOverrideRefused => StatusCode::UNPROCESSABLE_ENTITY,
        RefusalCode::InvalidIdentity
        | RefusalCode::KernelUnknown
        | RefusalCode::DeclaredOutputInvalid
        | RefusalCode::ProviderHintInvalid
        | RefusalCode::ToolsInvalid
        | RefusalCode::ResourcesInvalid => StatusCode::BAD_REQUEST,
    };
    refusal(
        status,
        refused.code.code(),
        refused.message.clone(),
        json!({ "field": refused.field, "setting": refused.setting }),
    )
}

/// No lease was granted.
pub fn admission_refused(state: &AppState, error: &AcquireError, wait_ms: u64) -> Reply {
    let code = error.code();
    state.metrics.refusal(code);
    let (status, message, retry) = match error {
        AcquireError::Refused("queue_full") => (
            StatusCode::TOO_MANY_REQUESTS,
            "the wait queue is full (SANDBOX_ACQUIRE_QUEUE_MAX)",
            1,
        ),
        AcquireError::WaitTimeout { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no worker became free within the wait (SANDBOX_ACQUIRE_WAIT_SECONDS)",
            wait_ms.div_ceil(1_000).clamp(1, 30),
        ),
        AcquireError::TicketLost => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the coordination store lost the ticket before its wait was over; nothing ran",
            1,
        ),
        AcquireError::Refused("inventory_unavailable") | AcquireError::CoordinationUnavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "coordination is unavailable: admission fails closed (POOL-11)",
            5,
        ),
        AcquireError::Refused(_) => (StatusCode::CONFLICT, "the pool refused the ticket", 1),
    };
    refusal(
        status,
        code,
        message,
        json!({ "retry_after_seconds": retry }),
    )
}

/// The worker vanished mid-run (or none could be reached): nothing of the run was kept.
pub fn worker_lost(run_id: &str, message: String) -> Reply {
    refusal(
        StatusCode::BAD_GATEWAY,
        "worker_lost",
        message,
        json!({ "run_id": run_id }),
    )
}

/// The worker refused the run before it started, with its typed error.
pub fn worker_refused(run_id: &str, body: &ErrorBody) -> Reply {
    let status = StatusCode::from_u16(body.error.status())
        .ok()
        .filter(StatusCode::is_client_error)
        .unwrap_or(StatusCode::BAD_GATEWAY);
    refusal(
        status,
        body.error.code(),
        "the worker refused the run before it started",
        json!({ "run_id": run_id, "details": body.detail }),
    )
}

/// A `not_run` record answered before any lease (PKG-6).
pub fn not_run_before_lease(run_id: &str, reason: NotRun) -> Reply {
    let decided = Decided::not_run_before_lease(reason);
    let empty = OutputStream::default();
    let model = decided.model(&empty, &empty, &[], &[]);
    (
        StatusCode::OK,
        json!({
            "run_id": run_id,
            "outcome": decided.outcome,
            "error": null,
            "model": model,
            "member": decided.member(),
        }),
    )
}

/// A language the jail does not run (PKG-6): a `not_run` record whose error names the language
/// asked for (bounded and escaped), the ones that run with their aliases, and what to write.
pub fn unsupported_language(run_id: &str, refused: &UnsupportedLanguage) -> Reply {
    let decided = Decided::not_run_before_lease(refused.code);
    let empty = OutputStream::default();
    (
        StatusCode::OK,
        json!({
            "run_id": run_id,
            "outcome": decided.outcome,
            "error": refused,
            "model": decided.model(&empty, &empty, &[], &[]),
            "member": decided.member(),
        }),
    )
}

/// A run stopped by its dependencies before its code ran (PKG-6): a `not_run` record whose error
/// names the packages and the cause, which is what the member reads. `diagnostics` are the
/// worker's, when the install ran there.
pub fn dependencies_failed(
    run_id: &str,
    failure: &DependencyFailure,
    diagnostics: &[String],
) -> Reply {
    let decided = Decided::not_run_before_lease(failure.reason());
    let empty = OutputStream::default();
    let mut model = serde_json::to_value(decided.model(&empty, &empty, diagnostics, &[]))
        .unwrap_or(Value::Null);
    model["dependencies"] = json!({ "failure": failure });
    (
        StatusCode::OK,
        json!({
            "run_id": run_id,
            "outcome": decided.outcome,
            "error": {
                "code": failure.reason(),
                "cause": failure.cause,
                "packages": failure.packages,
                "message": failure.message,
            },
            "model": model,
            "member": decided.member(),
        }),
    )
}

/// What the API adds to the model's projection of a run.
pub struct Context<'a> {
    /// The run's id.
    pub run_id: &'a str,
    /// The declared outputs.
    pub declared: &'a [String],
    /// The egress report.
    pub egress: Value,
    /// The worker that ran it.
    pub worker: String,
    /// Where the API's time went.
    pub phases: serde_json::Map<String, Value>,
    /// What the run's dependencies needed (PKG-1, PKG-2).
    pub dependencies: Value,
    /// A persistent cell's kernel report; `null` for an ephemeral run.
    pub kernel: Value,
    /// Whether the member enabled tool-result compression (CMP-1).
    pub compress: bool,
    /// The turn's projection and the outputs linked into its room (PROJ-5, OUT-1); `None` when
    /// the authority knows no room for the run.
    pub resources: Option<Value>,
}

/// A run's outcome: corral-core's decision, with the worker's output and the API's context.
pub fn decided(
    decided: &Decided,
    reply: &ExecuteReply,
    keeping: &Keeping,
    context: Context<'_>,
) -> Reply {
    let status = match decided.error.as_ref().map(|e| e.code) {
        Some(ErrorCode::WorkspaceConflict) => StatusCode::CONFLICT,
        Some(ErrorCode::WorkspaceStorageUnavailable) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    };
    // CMP-1: after everything else has decided what the model may see, its copy of stdout and
    // stderr may be shortened; the raw streams stay canonical in `raw`.
    let compressed = context
        .compress
        .then(|| compress_streams(&reply.stdout, &reply.stderr))
        .flatten();
    let (stdout, stderr) = compressed
        .as_ref()
        .map_or((&reply.stdout, &reply.stderr), |c| (&c.stdout, &c.stderr));
    let mut model =
        serde_json::to_value(decided.model(stdout, stderr, &reply.diagnostics, &reply.rejected))
            .unwrap_or(Value::Null);
    if let Some(model) = model.as_object_mut() {
        model.insert("bounds".into(), json!(reply.bounds));
        model.insert("declared_outputs".into(), json!(context.declared));
        model.insert("egress".into(), context.egress);
        model.insert(
            "workspace".into(),
            json!({ "generation": decided.generation, "saved": keeping.saved, "unchanged": keeping.unchanged }),
        );
        model.insert("warm".into(), json!(reply.warm));
        model.insert("results".into(), json!(reply.results));
        model.insert("dependencies".into(), context.dependencies);
        model.insert("kernel".into(), context.kernel);
        if let Some(compressed) = &compressed {
            model.insert("compression".into(), compressed.notes.clone());
        }
        if let Some(resources) = &context.resources {
            model.insert("resources".into(), resources.clone());
        }
        model.insert("worker".into(), json!(context.worker));
        let mut durations = json!(reply.durations);
        durations["api"] = Value::Object(context.phases);
        model.insert("durations".into(), durations);
    }
    let mut body = json!({
        "run_id": context.run_id,
        "outcome": decided.outcome,
        "error": decided.error,
        "model": model,
        "member": decided.member(),
    });
    if compressed.is_some() {
        body["raw"] = json!({ "stdout": reply.stdout, "stderr": reply.stderr });
    }
    // The member's rows carry the linked references only: no path, no diagnostics (OUT-2).
    if let Some(linked) = context
        .resources
        .as_ref()
        .and_then(|r| r.get("linked"))
        .and_then(Value::as_array)
    {
        body["member"]["linked"] = json!(
            linked
                .iter()
                .filter_map(|l| l.get("reference").map(|reference| json!({
                    "reference": reference, "media_type": l["media_type"], "size": l["size"],
                })))
                .collect::<Vec<_>>()
        );
    }
    (status, body)
}

/// The model's copies of a run's streams, compressed (CMP-1).
struct Streams {
    stdout: OutputStream,
    stderr: OutputStream,
    notes: Value,
}

/// Compresses what `corral_core::run::compress` shortens; `None` when neither stream would be.
fn compress_streams(stdout: &OutputStream, stderr: &OutputStream) -> Option<Streams> {
    use corral_core::run::compress::compress;
    let one = |stream: &OutputStream| match compress(&stream.text) {
        Some(c) => (
            OutputStream {
                text: c.text,
                ..stream.clone()
            },
            json!(c.notes),
        ),
        None => (stream.clone(), json!([])),
    };
    let (out, out_notes) = one(stdout);
    let (err, err_notes) = one(stderr);
    (out.text != stdout.text || err.text != stderr.text).then(|| Streams {
        stdout: out,
        stderr: err,
        notes: json!({
            "stdout": out_notes,
            "stderr": err_notes,
            "note": "shortened for the model; the raw output is canonical (the answer's `raw`)",
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_06_an_unsupported_language_is_answered_with_what_to_write() {
        let refused = corral_core::jail::Language::parse("ruby").expect_err("ruby");
        let (status, body) = unsupported_language("r1", &refused);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            (
                &body["outcome"],
                &body["model"]["not_run"],
                &body["error"]["code"],
                &body["error"]["language"],
                &body["error"]["supported"],
            ),
            (
                &json!("not_run"),
                &json!("unsupported_language"),
                &json!("unsupported_language"),
                &json!("ruby"),
                &json!(["python", "node"]),
            ),
            "{body}"
        );
        assert_eq!(body["error"]["aliases"]["node"][3], "javascript", "{body}");
        assert_ne!(body["model"]["exit_code"], 0, "{body}");
        assert_eq!(body["member"]["outcome"], "not_run", "{body}");
    }
}
