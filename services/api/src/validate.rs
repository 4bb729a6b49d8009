//! `POST /v1/validate_package` (PI-1): an authored Pi package validated in the worker pool
//! before the platform admits it.
//!
//! A shell, in one line of steps: the request's file set and reviewed manifest are checked by
//! corral-core's static rules (nothing leased for a package they refuse); a lease is taken from
//! the same pool, queue and fairness as a run; the worker validates (tests, a fresh tree with its
//! dependencies reinstalled through the broker, Pi's loader in a disposable child) and answers
//! with the surface its supervisor believed; the surface is compared with the reviewed manifest
//! (`corral_core::pi::surface::compare`); the lease is released, the worker reset on evidence or
//! discarded. The request names neither the Pi runtime nor a command: the profile is the
//! package's, the runtime the lock's. Every failure fails closed with its own code.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use corral_contract::CallError;
use corral_contract::messages::{ValidateReply, ValidateRequest, WireFile};
use corral_core::ids::{ActorId, ConversationId, LeaseNamespace, LeaseScope, MemberId};
use corral_core::pi::files::{PackageFile, check_files};
use corral_core::pi::package::check_package;
use corral_core::pi::surface::{ReviewedManifest, check_declarations, compare};
use corral_core::pi::{
    DEADLINE_DEFAULT_SECONDS, DEADLINE_MAX_SECONDS, Refusal, RefusalCode, Step, runtime_version,
};
use corral_core::pool::Disposition;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::run::{answer, lease};

/// Fields a validation request may not carry: the application derives the profile and the
/// runtime, and the worker's commands are its own (PI-1).
pub const NOT_SELECTABLE: [&str; 6] = [
    "profile",
    "runtime",
    "runtime_version",
    "pi_version",
    "command",
    "worker_command",
];

/// One file of the request: its path and either its text or its bytes in base64.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestFile {
    path: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    base64: Option<String>,
}

/// The request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidatePackage {
    actor: String,
    conversation: String,
    member: String,
    files: Vec<RequestFile>,
    manifest: ReviewedManifest,
    #[serde(default)]
    deadline_seconds: Option<u64>,
}

/// A refusal: `{"outcome": "refused", "admitted": false, "error": {code, message, at, step}}`,
/// with whatever `extra` adds to the error.
fn refused(refusal: &Refusal, step: Step, extra: Value) -> Response {
    let mut error = json!({
        "code": refusal.code.code(),
        "message": refusal.message,
        "at": refusal.at,
        "step": step,
    });
    if let (Some(error), Value::Object(extra)) = (error.as_object_mut(), extra) {
        error.extend(extra);
    }
    let status =
        StatusCode::from_u16(refusal.code.status()).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
    (
        status,
        axum::Json(json!({ "outcome": "refused", "admitted": false, "error": error })),
    )
        .into_response()
}

fn reply(reply: answer::Reply) -> Response {
    let (status, body) = reply;
    let retry = body["error"]["retry_after_seconds"].as_u64();
    let mut response = (status, axum::Json(body)).into_response();
    if let Some(retry) = retry
        && let Ok(value) = retry.to_string().parse()
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// The handler.
pub async fn validate_package(
    State(state): State<Arc<AppState>>,
    body: axum::body::Bytes,
) -> Response {
    let started = Instant::now();
    let request = match parse_request(&state, &body) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    drop(body);
    let deadline_seconds = match check_request(&request) {
        Ok(deadline_seconds) => deadline_seconds,
        Err(response) => return *response,
    };
    // The static checks, before any lease.
    let files = match decode_files(request.files) {
        Ok(files) => files,
        Err(response) => return *response,
    };
    let wire: Vec<WireFile> = files.iter().map(WireFile::of).collect();
    let checked = check_files(files).and_then(|set| {
        let checked = check_package(&set)?;
        check_declarations(&request.manifest, &checked, &set)?;
        Ok(checked)
    });
    let checked = match checked {
        Ok(checked) => checked,
        Err(refusal) => {
            state.metrics.refusal(refusal.code.code());
            return refused(&refusal, Step::Static, Value::Null);
        }
    };
    let static_ms = millis(started.elapsed());
    let validation_id = corral_core::ids::hex(&corral_contract::credential::random_bytes());
    let (granted, asked_at) = match acquire(
        &state,
        &request.actor,
        &request.conversation,
        &request.member,
    )
    .await
    {
        Ok(acquired) => acquired,
        Err(response) => return *response,
    };
    let holder = lease::Holder::start(state.clone(), granted, asked_at);
    let needs_broker = !checked.dependencies.is_empty() || !checked.dev_dependencies.is_empty();
    let install_token = needs_broker
        .then(|| {
            state
                .broker
                .as_ref()
                .map(|broker| broker.mint(&validation_id))
        })
        .flatten();
    let order = ValidateRequest {
        files: wire,
        deadline_ms: deadline_seconds * 1_000,
        install_token,
        token: granted.token,
    };
    let called = state.workers.validate_package(granted.worker, &order).await;
    if let Some(broker) = &state.broker {
        broker.end(&validation_id);
    }
    let worker_reply = match called {
        Ok(worker_reply) => worker_reply,
        Err(error) => return worker_failed(&state, holder, &validation_id, &error),
    };
    holder.release(Disposition::Reset);
    judged(
        &state,
        &validation_id,
        &request.manifest,
        checked.profile,
        static_ms,
        worker_reply,
    )
}

/// The request, parsed, or the refusal of a body that is not JSON, chooses what is derived, or
/// is not a request.
fn parse_request(state: &AppState, body: &[u8]) -> Result<ValidatePackage, Box<Response>> {
    let raw: Value = match serde_json::from_slice(body) {
        Ok(raw) => raw,
        Err(e) => {
            let code = corral_contract::ErrorBody::of_json(&e).error.code();
            return Err(Box::new(crate::refusal::error(
                StatusCode::BAD_REQUEST,
                code,
                e.to_string(),
            )));
        }
    };
    if let Some(field) = NOT_SELECTABLE.iter().find(|f| raw.get(**f).is_some()) {
        state.metrics.refusal("validation_profile_not_selectable");
        return Err(Box::new(crate::refusal::error(
            StatusCode::BAD_REQUEST,
            "validation_profile_not_selectable",
            format!(
                "`{field}` cannot be chosen: the profile is derived from the package and the Pi \
                 runtime is the deployment's ({})",
                runtime_version()
            ),
        )));
    }
    serde_json::from_value(raw).map_err(|e| {
        Box::new(crate::refusal::error(
            StatusCode::BAD_REQUEST,
            "body_invalid",
            e.to_string(),
        ))
    })
}

/// The request's deadline in seconds, or the refusal of an invalid identity or deadline.
fn check_request(request: &ValidatePackage) -> Result<u64, Box<Response>> {
    if let Some(bad) =
        crate::refusal::workspace_identity_refused(&request.actor, &request.conversation)
    {
        return Err(Box::new(bad));
    }
    if !corral_core::ids::identity_is_valid(&request.member) {
        return Err(Box::new(crate::refusal::error(
            StatusCode::BAD_REQUEST,
            "invalid_identity",
            "member must be 1 to 256 bytes with no control character",
        )));
    }
    let deadline_seconds = request.deadline_seconds.unwrap_or(DEADLINE_DEFAULT_SECONDS);
    if deadline_seconds == 0 || deadline_seconds > DEADLINE_MAX_SECONDS {
        return Err(Box::new(crate::refusal::error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bound_override_refused",
            format!("deadline_seconds must be 1 to {DEADLINE_MAX_SECONDS}"),
        )));
    }
    Ok(deadline_seconds)
}

/// The request's files with their bytes, or the refusal of one without exactly one valid body.
fn decode_files(request_files: Vec<RequestFile>) -> Result<Vec<PackageFile>, Box<Response>> {
    let mut files = Vec::with_capacity(request_files.len());
    for file in request_files {
        let bytes = match (file.text, file.base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(encoded)) => {
                match base64::engine::general_purpose::STANDARD.decode(encoded) {
                    Ok(bytes) => bytes,
                    Err(_) => {
                        return Err(Box::new(crate::refusal::error(
                            StatusCode::BAD_REQUEST,
                            "body_invalid",
                            format!("files[{:?}].base64 is not base64", file.path),
                        )));
                    }
                }
            }
            _ => {
                return Err(Box::new(crate::refusal::error(
                    StatusCode::BAD_REQUEST,
                    "body_invalid",
                    format!(
                        "files[{:?}] needs exactly one of `text` and `base64`",
                        file.path
                    ),
                )));
            }
        };
        files.push(PackageFile {
            path: file.path,
            bytes,
        });
    }
    Ok(files)
}

/// A worker leased for the validation, or the refusal.
async fn acquire(
    state: &Arc<AppState>,
    actor: &str,
    conversation: &str,
    member: &str,
) -> Result<(corral_store::lease::Granted, tokio::time::Instant), Box<Response>> {
    // The same queue, ceiling and fairness as a run.
    let scope = LeaseScope {
        namespace: LeaseNamespace::Code,
        actor: ActorId(actor.to_owned()),
        conversation: ConversationId(conversation.to_owned()),
    };
    let wait = Duration::from_millis(state.settings.pool().acquire_wait_ms);
    let mut watch = None;
    let acquired = lease::acquire_in(
        state,
        &MemberId(member.to_owned()),
        scope,
        false,
        tokio::time::Instant::now() + wait,
        &mut watch,
    )
    .await;
    acquired.map_err(|error| {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let answered = answer::admission_refused(state, &error, wait_ms);
        if let corral_store::lease::AcquireError::WaitTimeout { orders } = error {
            lease::perform_orders(state.clone(), orders);
        }
        Box::new(reply(answered))
    })
}

/// Releases the lease of a worker that did not answer, and the answer saying nothing was admitted.
fn worker_failed(
    state: &AppState,
    holder: lease::Holder,
    validation_id: &str,
    error: &CallError,
) -> Response {
    // A worker that never saw the package is as it was; any other is unproven.
    let disposition = match error {
        CallError::Refused(body) if body.error.before_anything_ran() => Disposition::Reset,
        _ => Disposition::Discard,
    };
    holder.release(disposition);
    state.metrics.refusal("worker_lost");
    reply(answer::worker_lost(
        validation_id,
        format!("the validation's worker did not answer ({error}); nothing was admitted"),
    ))
}

/// The worker's answer judged against the reviewed manifest.
fn judged(
    state: &AppState,
    validation_id: &str,
    manifest: &ReviewedManifest,
    profile: corral_core::pi::Profile,
    static_ms: u64,
    worker: ValidateReply,
) -> Response {
    let durations = json!({
        "static_ms": static_ms,
        "tests_ms": worker.durations.tests_ms,
        "reinstall_ms": worker.durations.reinstall_ms,
        "loader_ms": worker.durations.loader_ms,
        "worker_total_ms": worker.durations.total_ms,
    });
    let context = json!({
        "validation_id": validation_id,
        "profile": profile,
        "runtime": { "package": corral_core::pi::RUNTIME_PACKAGE, "version": worker.runtime_version },
        "durations": durations,
        "diagnostics": worker.diagnostics,
    });
    if let Some(not_run) = worker.not_run {
        state.metrics.refusal(not_run.code());
        return crate::refusal::error(
            StatusCode::SERVICE_UNAVAILABLE,
            not_run.code(),
            format!(
                "the worker could not carry the validation out ({}); nothing was admitted",
                not_run.code()
            ),
        );
    }
    if let Some(failure) = worker.failure {
        state.metrics.refusal(failure.code.code());
        let mut extra = context;
        extra["tail"] = json!(worker.tail);
        return refused(&failure, worker.step.unwrap_or(Step::Loader), extra);
    }
    let Some(surface) = worker.surface else {
        let refusal = Refusal::new(
            RefusalCode::PackageObservationMalformed,
            "the worker answered with neither a surface nor a failure",
        );
        return refused(&refusal, Step::Loader, context);
    };
    let drift = compare(&surface, &manifest.surface);
    if !drift.is_empty() {
        state
            .metrics
            .refusal(RefusalCode::PackageSurfaceDrift.code());
        let refusal = Refusal::new(
            RefusalCode::PackageSurfaceDrift,
            "the package's loaded surface differs from the reviewed manifest",
        );
        let mut extra = context;
        extra["surface"] = json!(surface);
        extra["drift"] = json!(drift);
        return refused(&refusal, Step::Loader, extra);
    }
    let mut body = context;
    body["outcome"] = json!("admitted");
    body["admitted"] = json!(true);
    body["surface"] = json!(surface);
    body["drift"] = json!(drift);
    (StatusCode::OK, axum::Json(body)).into_response()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
