//! The typed request and reply of each worker route. The worker's server decodes exactly these;
//! the client encodes them. Requests refuse unknown fields; replies are read as written by the
//! same release.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use corral_core::bounds::{
    Bound, BoundOverrides, ExecutionBounds, OutputStream, code_fits, lowered_bounds,
};
use corral_core::downloads::{Download, Rejected};
use corral_core::egress::grant::grant_is_sendable;
use corral_core::ids::OpToken;
use corral_core::jail::{Language, NotRun};
use corral_core::packages::resolve::{DependencyFailure, Install};
use corral_core::reset::{ResetEvidence, Verdict, judge};
use corral_core::run::admission::declared_outputs;
use corral_core::run::outcome::Packed;
use serde::{Deserialize, Serialize};

use crate::error::{ErrorBody, ErrorCode, ErrorDetail};
use crate::limits::{DIAGNOSTIC_MAX_CHARS, DIAGNOSTICS_MAX, GRANT_MAX_BYTES};

// ---------------------------------------------------------------------------------------------
// Validate a package (PI-1).

/// The most bytes a validation's reply may have: the surface's lists are bounded by
/// `corral_core::pi::surface::LIST_MAX` names of `NAME_MAX_CHARS` each.
pub const VALIDATE_REPLY_MAX_BYTES: u64 = 2 << 20;

/// `POST /v1/validate_package`: validate the server's file set of an authored Pi package. The
/// worker derives the profile, the dependencies and the tests from the files itself, with the
/// same rules the API checked them by (`corral_core::pi::package`); the request chooses no
/// runtime and no command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidateRequest {
    /// The files, each `{path, base64}`.
    pub files: Vec<WireFile>,
    /// The whole validation's deadline, from the worker's receipt, in milliseconds (at most
    /// `corral_core::pi::DEADLINE_MAX_SECONDS`).
    pub deadline_ms: u64,
    /// The broker token the dependencies install with; none when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_token: Option<String>,
    /// The operation token the reset evidence carries.
    pub token: OpToken,
}

/// One file of a package on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireFile {
    /// The path, relative to the package's root.
    pub path: String,
    /// The bytes, base64.
    pub base64: String,
}

impl WireFile {
    /// `file` on the wire.
    #[must_use]
    pub fn of(file: &corral_core::pi::files::PackageFile) -> Self {
        Self {
            path: file.path.clone(),
            base64: BASE64.encode(&file.bytes),
        }
    }

    /// The file, or `None` when its bytes are not base64.
    #[must_use]
    pub fn decode(&self) -> Option<corral_core::pi::files::PackageFile> {
        Some(corral_core::pi::files::PackageFile {
            path: self.path.clone(),
            bytes: BASE64.decode(&self.base64).ok()?,
        })
    }
}

/// How long a validation's steps took at the worker, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationDurations {
    /// The test tree's install and the tests (an extension package).
    pub tests_ms: u64,
    /// The validation tree, built and its dependencies reinstalled.
    pub reinstall_ms: u64,
    /// Pi's loader in the disposable child, and the parent's reading of its observation.
    pub loader_ms: u64,
    /// The whole validation, before its reset.
    pub total_ms: u64,
}

/// The answer to a validation: the surface the loader registered, believed by the worker's
/// supervisor (the trusted parent) against the file set, or the failure with its stable code.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidateReply {
    /// What the package registers; `None` beside a failure.
    pub surface: Option<corral_core::pi::surface::Surface>,
    /// Why the package failed, closed.
    pub failure: Option<corral_core::pi::Refusal>,
    /// The step that failed.
    pub step: Option<corral_core::pi::Step>,
    /// Why the worker could not carry the validation out (not the package's doing).
    pub not_run: Option<NotRun>,
    /// The Pi runtime's version the child observed.
    pub runtime_version: Option<String>,
    /// A bounded tail of the failing step's output (the tests', the installer's, or the child's
    /// stderr beside a malformed observation).
    pub tail: Option<String>,
    /// Bounded notes.
    pub diagnostics: Vec<String>,
    /// Timings.
    pub durations: ValidationDurations,
    /// The isolation the validation had.
    pub isolation: Isolation,
}

// ---------------------------------------------------------------------------------------------
// Execute.

/// `POST /v1/execute`: run `code` in a fresh jail with the workspace unpacked from `workspace`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// The language.
    pub language: Language,
    /// The program.
    pub code: String,
    /// The workspace, a tar in base64; none for a fresh, empty workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Bounds in place of the worker's, each no higher.
    #[serde(default)]
    pub bounds: BoundOverrides,
    /// The run's egress grant (EGR-8), which the worker's relay adds to each connection; never
    /// given to the code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// Relative names the run declared as outputs (WS-7).
    #[serde(default)]
    pub declared: Vec<String>,
    /// What to install through the broker before the code runs (PKG-2, PKG-3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<InstallOrder>,
    /// A persistent kernel's cell (KER-1, KER-2): restore, run, checkpoint. None: ephemeral.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelOrder>,
    /// The tools the code may call through the supervisor (KER-5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolOrder>,
    /// The turn's read-only projection (PROJ-5, PROJ-6), which the worker verifies before the
    /// code starts and mounts outside the workspace. None: nothing is authorized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceOrder>,
    /// The operation token the reset evidence carries.
    pub token: OpToken,
    /// The W3C `traceparent` of the API's span that dispatched the run, so the worker's spans
    /// join the run's one trace (OpenTelemetry, when the deployment exports traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Answer as a stream of [`ExecuteFrame`] lines (`application/x-ndjson`): the code's output
    /// as it writes it, then the reply (WS-7's `run.output`). False: one [`ExecuteReply`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream_output: bool,
}

/// One line of a streamed execute answer ([`ExecuteRequest::stream_output`]): the code's output
/// chunks in the order written, each only what the output bound keeps and only whole characters
/// (`corral_core::run::progress::TextChunker`), a stream's bound once it is reached, then exactly
/// one reply or refusal, last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecuteFrame {
    /// A chunk of a stream; never empty.
    Output {
        /// Which stream.
        stream: corral_core::run::progress::Stream,
        /// The chunk.
        text: String,
    },
    /// The stream reached `SANDBOX_MAX_OUTPUT_BYTES`: its later bytes are counted, not sent.
    Bound {
        /// Which stream.
        stream: corral_core::run::progress::Stream,
    },
    /// The run's reply; the last line.
    Reply(Box<ExecuteReply>),
    /// A refusal after the answer began (the workspace refused, staging failed); the last line.
    Refused(ErrorBody),
}

/// A turn's projection as dispatched: the admitted manifest's digest, its entries, and each
/// file's bytes (base64, in the entries' order) as the object store gave them, unverified: the
/// worker checks them against the entries (`corral_core::projection::verify_files`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceOrder {
    /// The room's audience version the turn was admitted with, and re-read before dispatch.
    pub audience_version: u64,
    /// The admitted manifest's digest (`corral_core::projection::Manifest::digest`).
    pub manifest_digest: String,
    /// The entries, in order.
    pub manifest: corral_core::projection::Manifest,
    /// Each entry's bytes, base64.
    pub files: Vec<String>,
}

/// A persistent cell: the key that seals this workspace's checkpoints
/// (`corral_core::kernel::seal_key`), held by the worker's supervisor and never given to the code.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelOrder {
    /// The seal key, 64 hex digits.
    pub seal_key: String,
}

impl std::fmt::Debug for KernelOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KernelOrder { seal_key: <redacted> }")
    }
}

impl KernelOrder {
    /// The order for the workspace `storage_key` under the deployment's seal root.
    #[must_use]
    pub fn new(root: &[u8; 32], storage_key: &str) -> Self {
        Self {
            seal_key: corral_core::ids::hex(&corral_core::kernel::seal_key(root, storage_key)),
        }
    }

    /// The key's bytes, when it is 64 hex digits.
    #[must_use]
    pub fn key(&self) -> Option<[u8; 32]> {
        let text = self.seal_key.as_bytes();
        if text.len() != 64 {
            return None;
        }
        let mut key = [0u8; 32];
        for (i, pair) in text.chunks(2).enumerate() {
            let digit = |b: u8| char::from(b).to_digit(16);
            key[i] = u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()?;
        }
        Some(key)
    }
}

/// The tools of a run (KER-5): what the platform advertised, its capability, where the API
/// replica that owns the run takes calls, and the run's token there. The supervisor holds all of
/// it; none of it enters the jail.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolOrder {
    /// The tools and the capability.
    pub grant: corral_core::tools::Tools,
    /// `http://host:port` of the API replica that owns the run.
    pub callback: String,
    /// The run's token for [`crate::routes::TOOL_CALL`]'s owner.
    pub token: String,
}

impl std::fmt::Debug for ToolOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolOrder")
            .field("grant", &self.grant)
            .field("callback", &self.callback)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// One tool call, as the supervisor forwards it to the API replica that owns the run.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The tool.
    pub tool: String,
    /// Its arguments, as the code gave them.
    #[serde(default)]
    pub arguments: serde_json::Value,
    /// The run's capability, which the API hands the platform's endpoint.
    pub capability: String,
}

impl std::fmt::Debug for ToolCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolCall")
            .field("tool", &self.tool)
            .field("capability", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// What a persistent cell's kernel did (KER-2, KER-3): reported beside the run's result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelReport {
    /// The names restored before the cell ran.
    pub restored: Vec<String>,
    /// Whether this cell wrote the checkpoint the workspace now holds; false when it was killed
    /// or ended before its checkpoint, and the previous one stays.
    pub checkpointed: bool,
    /// The names the checkpoint carries.
    pub kept: Vec<String>,
    /// The names the cell had that it does not carry, and why.
    pub not_kept: Vec<corral_core::kernel::NotKept>,
    /// The checkpoint's size.
    pub checkpoint_bytes: u64,
}

/// What a run installs before its code: corral-core's resolution, and the broker token that
/// the worker's relay carries (never given to the code).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallOrder {
    /// The distributions, in the installer's spelling.
    pub install: Vec<Install>,
    /// `name==version` of each baked distribution the install keeps (PKG-2).
    #[serde(default)]
    pub constraints: Vec<String>,
    /// The broker token for this run.
    pub token: String,
}

impl InstallOrder {
    /// Whether every item parses as corral-core parses a request (the API resolved it with the
    /// same functions), and the token can travel in a path.
    #[must_use]
    pub fn is_valid(&self, language: Language) -> bool {
        use corral_core::packages::requirement::{REQUESTED_MAX, parse_npm, parse_python};
        let spec_ok = |spec: &str| match language {
            Language::Python => parse_python(spec).is_ok(),
            Language::Node => parse_npm(spec).is_ok(),
        };
        !self.install.is_empty()
            && self.install.len() <= 2 * REQUESTED_MAX
            && self.install.iter().all(|i| spec_ok(&i.spec))
            && self.constraints.len() <= 256
            && self
                .constraints
                .iter()
                .all(|c| parse_python(c).is_ok_and(|r| r.version.is_some()))
            && !self.token.is_empty()
            && self.token.len() <= 256
            && self
                .token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    }
}

/// An execute request the worker accepted: its bounds and its workspace's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The worker's bounds, lowered by the request's overrides.
    pub bounds: ExecutionBounds,
    /// The declared outputs, normalized.
    pub declared: Vec<String>,
    /// The workspace archive's bytes.
    pub archive: Option<Vec<u8>>,
    /// The projection, its files decoded (still unverified: the worker verifies them before the
    /// code starts).
    pub resources: Option<Projected>,
}

/// A [`ResourceOrder`] with its files decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Projected {
    /// See [`ResourceOrder::audience_version`].
    pub audience_version: u64,
    /// See [`ResourceOrder::manifest_digest`].
    pub manifest_digest: String,
    /// See [`ResourceOrder::manifest`].
    pub manifest: corral_core::projection::Manifest,
    /// Each entry's bytes.
    pub files: Vec<Vec<u8>>,
}

impl ExecuteRequest {
    /// What the worker checks before anything runs, with the functions the API admitted the
    /// request by: the code's size, the grant, the declared names, each bound override (never
    /// above `configured`), the archive's encoding.
    ///
    /// # Errors
    /// The refusal, with its stable code.
    pub fn accept(&self, configured: &ExecutionBounds) -> Result<Accepted, ErrorBody> {
        let refuse = |code, detail| Err(ErrorBody::new(code, detail));
        if !code_fits(self.code.len(), configured) {
            return refuse(
                ErrorCode::CodeTooLarge,
                ErrorDetail {
                    setting: Some("SANDBOX_WORKSPACE_MAX_BYTES".to_owned()),
                    max: Some(configured.workspace_max_bytes),
                    ..ErrorDetail::default()
                },
            );
        }
        self.check_grant()?;
        let declared = match declared_outputs(&self.declared) {
            Ok(declared) => declared,
            Err(message) => {
                return refuse(
                    ErrorCode::DeclaredOutputInvalid,
                    ErrorDetail::message(message),
                );
            }
        };
        let bounds = match lowered_bounds(configured, &self.bounds) {
            Ok(bounds) => bounds,
            Err(refused) => {
                return refuse(
                    ErrorCode::BoundOverrideRefused,
                    ErrorDetail {
                        setting: Some(refused.setting.to_owned()),
                        ..ErrorDetail::default()
                    },
                );
            }
        };
        self.check_orders()?;
        let resources = self.projected()?;
        let archive = match self.workspace.as_deref().map(|text| BASE64.decode(text)) {
            None => None,
            Some(Ok(bytes)) => Some(bytes),
            Some(Err(e)) => {
                return refuse(
                    ErrorCode::WorkspaceNotBase64,
                    ErrorDetail::message(e.to_string()),
                );
            }
        };
        Ok(Accepted {
            bounds,
            declared,
            archive,
            resources,
        })
    }

    /// The grant, if given: within `GRANT_MAX_BYTES`, and a token the relay can send.
    fn check_grant(&self) -> Result<(), ErrorBody> {
        let Some(grant) = &self.grant else {
            return Ok(());
        };
        if grant.len() > GRANT_MAX_BYTES {
            return Err(ErrorBody::new(
                ErrorCode::GrantTooLong,
                ErrorDetail {
                    max: Some(GRANT_MAX_BYTES as u64),
                    ..ErrorDetail::default()
                },
            ));
        }
        if !grant_is_sendable(grant) {
            return Err(ErrorBody::new(
                ErrorCode::GrantMalformed,
                ErrorDetail::message("a grant is non-empty printable ASCII without spaces"),
            ));
        }
        Ok(())
    }

    /// The kernel's seal key, the dependencies, and no resources for a persistent cell.
    fn check_orders(&self) -> Result<(), ErrorBody> {
        if self
            .kernel
            .as_ref()
            .is_some_and(|order| order.key().is_none())
        {
            return Err(ErrorBody::new(
                ErrorCode::BodyInvalid,
                ErrorDetail::message("kernel: the seal key is not 64 hex digits"),
            ));
        }
        if let Some(order) = &self.dependencies
            && !order.is_valid(self.language)
        {
            return Err(ErrorBody::new(
                ErrorCode::BodyInvalid,
                ErrorDetail::message("dependencies: an item corral-core does not accept"),
            ));
        }
        if self.kernel.is_some() && self.resources.is_some() {
            return Err(ErrorBody::new(
                ErrorCode::BodyInvalid,
                ErrorDetail::message("resources: a persistent cell mounts no resources (KER-5)"),
            ));
        }
        Ok(())
    }

    /// The resources to project, their files decoded, if the request carries them.
    fn projected(&self) -> Result<Option<Projected>, ErrorBody> {
        let Some(order) = &self.resources else {
            return Ok(None);
        };
        let files: Result<Vec<Vec<u8>>, _> =
            order.files.iter().map(|text| BASE64.decode(text)).collect();
        let Ok(files) = files else {
            return Err(ErrorBody::new(
                ErrorCode::BodyInvalid,
                ErrorDetail::message("resources: a file is not base64"),
            ));
        };
        Ok(Some(Projected {
            audience_version: order.audience_version,
            manifest_digest: order.manifest_digest.clone(),
            manifest: order.manifest.clone(),
            files,
        }))
    }
}

/// `POST /v1/browser/open` (BROW-1, BROW-13): start a session's runtime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrowserOpenRequest {
    /// The session's egress grant, which the worker's relay adds to each of Chromium's
    /// connections (its only route out); never given to the browser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// The desktop's width (default `corral_core::browser::WIDTH`).
    #[serde(default = "default_width")]
    pub width: u32,
    /// The desktop's height.
    #[serde(default = "default_height")]
    pub height: u32,
    /// The operation token the evidence of a failed open's reset carries.
    pub token: OpToken,
    /// A first navigation, made as the runtime starts (its setup and the page's load overlap);
    /// the API has admitted it (`corral_core::browser::judge_call`) and the worker checks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The live view's relay (BROW-9): the TURN authority's address as the API resolved it from
    /// its own configuration, and the session's credential. Absent: no live view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_view: Option<LiveViewOrder>,
}

/// What the worker's media adapter allocates its relay with (BROW-9, ISO-5).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveViewOrder {
    /// The TURN authority's address (`ip:port`).
    pub turn: std::net::SocketAddr,
    /// The TURN REST credential's username (`expiry:session`).
    pub username: String,
    /// Its password (base64 HMAC-SHA1 of the username under the shared secret).
    pub password: String,
}

impl std::fmt::Debug for LiveViewOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveViewOrder")
            .field("turn", &self.turn)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// `POST /v1/browser/signal`: one viewer's offer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrowserSignalRequest {
    /// The viewer (one signaling relay): a new offer from it replaces its peer.
    pub viewer: String,
    /// The member watching through it.
    pub member: String,
    /// The SDP offer (video to receive, the input data channel), with its relayed candidates.
    pub sdp: String,
}

/// The answer to a [`BrowserSignalRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrowserSignalReply {
    /// The SDP answer, whose one candidate is the worker's relayed address.
    pub sdp: String,
}

/// The answer to a renewed [`LiveViewOrder`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrowserTurnReply {
    /// The new relay's address.
    pub relayed: std::net::SocketAddr,
}

/// `POST /v1/browser/private`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrowserPrivateRequest {
    /// The member whose interval is private (their viewers stay), or none: the interval ended.
    pub member: Option<String>,
}

/// The answer to a [`BrowserPrivateRequest`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrowserPrivateReply {
    /// The viewers whose peers were removed.
    pub removed: Vec<String>,
}

fn default_width() -> u32 {
    corral_core::browser::WIDTH
}

fn default_height() -> u32 {
    corral_core::browser::HEIGHT
}

/// The answer to a [`BrowserOpenRequest`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrowserOpenReply {
    /// How long the runtime took to start, in milliseconds.
    pub start_ms: u64,
    /// When each step of the start finished, in milliseconds from the bridge's own start:
    /// `display`, `chromium` (its first page exists) and `attached` (the driver owns it).
    #[serde(default)]
    pub phases_ms: std::collections::BTreeMap<String, u64>,
    /// How the first navigation went, when the open asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub navigated: Option<BrowserNavigated>,
    /// The live view's relayed address, when one was ordered and allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relayed: Option<std::net::SocketAddr>,
    /// The isolation the session has.
    pub isolation: Isolation,
    /// Notes.
    pub diagnostics: Vec<String>,
}

/// The first navigation of an open: its result, or the action error with its code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrowserNavigated {
    /// The navigation's result, as a `navigate` action's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// The action error's stable code (`corral_core::browser::ActionError`) and message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<(String, String)>,
    /// How long the navigation took on the worker, in milliseconds.
    pub took_ms: u64,
}

/// The answer to an action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrowserActReply {
    /// The action's result (its shape is the action's).
    pub result: serde_json::Value,
    /// How long it took, in milliseconds.
    pub took_ms: u64,
}

/// `POST /v1/browser/close` (BROW-13).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrowserCloseRequest {
    /// The operation token the reset evidence carries.
    pub token: OpToken,
}

/// The answer to a [`BrowserCloseRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrowserCloseReply {
    /// Whether the runtime stopped when told to (every process gone before the reset's kill).
    pub confirmed: bool,
    /// The reset's evidence.
    pub reset_evidence: EvidenceReport,
    /// Notes.
    pub diagnostics: Vec<String>,
}

/// The isolation a run had.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// `full`, `weaker` (the operator waived what `missing` lists), or `refused`.
    pub posture: String,
    /// The primitives found missing at start.
    pub missing: Vec<String>,
}

/// How long the phases of a run took at the worker, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Durations {
    /// From the start of the request to the end of the run's own reset.
    pub total_ms: u64,
    /// From the code's start to its end.
    pub run_ms: u64,
    /// The kill, wipe and measurement.
    pub reset_ms: u64,
}

/// The workspace after a run, as the reply carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspaceReturn {
    /// Not packed: the request did not ask (`corral jail run` copies downloads back instead), or
    /// the run never reached its workspace.
    #[default]
    NotPacked,
    /// Packed: a tar in base64.
    Packed {
        /// The archive.
        archive: String,
    },
    /// The worker refused to pack it.
    Refused {
        /// The reason code.
        reason: String,
        /// The setting whose bound refused it.
        setting: Option<String>,
        /// What happened, for a person.
        message: String,
    },
}

impl WorkspaceReturn {
    /// What corral-core's outcome needs to know of it.
    #[must_use]
    pub fn packed(&self) -> Packed {
        match self {
            Self::NotPacked => Packed::Missing,
            Self::Packed { .. } => Packed::Archive,
            Self::Refused {
                reason, setting, ..
            } => Packed::Refused {
                reason: reason.clone(),
                setting: setting.clone(),
            },
        }
    }

    /// The archive's bytes, when packed and valid base64.
    #[must_use]
    pub fn archive(&self) -> Option<Vec<u8>> {
        match self {
            Self::Packed { archive } => BASE64.decode(archive).ok(),
            Self::NotPacked | Self::Refused { .. } => None,
        }
    }

    /// Packs `bytes`.
    #[must_use]
    pub fn of_archive(bytes: &[u8]) -> Self {
        Self::Packed {
            archive: archive_text(bytes),
        }
    }
}

/// A workspace archive as the execute request and reply carry it: base64.
#[must_use]
pub fn archive_text(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// The reply to an execute: the run's result (also what `corral jail run` prints).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecuteReply {
    /// The code's exit status (128 plus the signal when a signal ended it); null when the worker
    /// killed it at the wall limit; [`corral_core::run::outcome::NOT_RUN_EXIT_CODE`] beside a
    /// `not_run` record (PKG-6).
    pub exit_code: Option<i32>,
    /// The code's stdout.
    pub stdout: OutputStream,
    /// The code's stderr.
    pub stderr: OutputStream,
    /// The bound hit first, by precedence.
    pub bound: Option<Bound>,
    /// Every bound hit, in precedence order.
    pub bounds: Vec<Bound>,
    /// The typed download list: validated files only.
    pub downloads: Vec<Download>,
    /// Documents that failed verification, left out of the downloads (OUT-4).
    pub rejected: Vec<Rejected>,
    /// Why the code was not run.
    pub not_run: Option<NotRun>,
    /// What the run's own reset measured, with the core's verdict: `corral jail run`'s. The
    /// control API's execute answers before that reset (`None`); the next `/v1/reset` counts
    /// what it left.
    pub reset_evidence: Option<EvidenceReport>,
    /// The isolation the run had, or why it was refused.
    pub isolation: Isolation,
    /// Bounded notes: skipped files, waived primitives, failed steps.
    pub diagnostics: Vec<String>,
    /// Whether the code ran in the jail prepared before the request.
    pub warm: bool,
    /// Timings.
    pub durations: Durations,
    /// The workspace after the run.
    pub workspace: WorkspaceReturn,
    /// What the run installed before its code, or why it could not (PKG-6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<InstallReport>,
    /// What a persistent cell's kernel restored and kept (KER-2, KER-3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelReport>,
    /// Rich results: the last expression's value and the figures left open, as Jupyter shows
    /// them (`corral_core::run::results`), within their bounds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<corral_core::run::results::RichResult>,
}

/// What a run's install did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallReport {
    /// What was installed.
    pub installed: Vec<String>,
    /// Why the install failed, beside a `dependency_install_failed` record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<DependencyFailure>,
    /// How long it took.
    pub install_ms: u64,
}

/// Appends `note` to `diagnostics` within the contract's bounds: shortened when long, dropped
/// (with one final note saying so) when there are too many.
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

// ---------------------------------------------------------------------------------------------
// Reset.

/// `POST /v1/reset`: kill everything, wipe, measure, under `token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetRequest {
    /// The operation token the evidence must carry.
    pub token: OpToken,
}

/// Reset evidence with the core's verdict on it (`clean`, or the reason to discard).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceReport {
    /// What was measured, under which token.
    #[serde(flatten)]
    pub evidence: ResetEvidence,
    /// `clean`, or the reason code for discarding the worker.
    pub verdict: String,
}

impl EvidenceReport {
    /// `evidence` with the core's verdict on it, judged against the token it carries (the pool
    /// judges it again against the token it ordered).
    #[must_use]
    pub fn judged(evidence: ResetEvidence) -> Self {
        let verdict = match judge(&evidence, evidence.token) {
            Verdict::Clean => "clean".to_owned(),
            Verdict::Discard(reason) => reason.code().to_owned(),
        };
        Self { evidence, verdict }
    }
}

/// The reply to a reset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetReply {
    /// The evidence.
    pub reset_evidence: EvidenceReport,
    /// Bounded notes on what could not be wiped or measured.
    pub diagnostics: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Health.

/// The reply to `GET /health`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReply {
    /// Always `ok` when the worker answers.
    pub status: String,
    /// `full`, `weaker` or `refused`.
    pub posture: String,
    /// Whether a run or reset is in progress.
    pub busy: bool,
    /// Whether a prepared jail waits for the next execute.
    pub prepared: bool,
    /// The languages whose prepared jails wait.
    pub prepared_languages: Vec<Language>,
    /// The largest execute body this worker accepts.
    pub body_max_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ExecuteRequest {
        ExecuteRequest {
            language: Language::Python,
            code: "print(1)".to_owned(),
            workspace: None,
            bounds: BoundOverrides::default(),
            grant: None,
            declared: Vec::new(),
            dependencies: None,
            kernel: None,
            tools: None,
            resources: None,
            token: OpToken(3),
            traceparent: None,
            stream_output: false,
        }
    }

    #[test]
    fn a_streamed_answer_is_one_tagged_frame_per_line() {
        let output = ExecuteFrame::Output {
            stream: corral_core::run::progress::Stream::Stderr,
            text: "a\nb".to_owned(),
        };
        let line = serde_json::to_string(&output).unwrap();
        assert_eq!(line, r#"{"output":{"stream":"stderr","text":"a\nb"}}"#);
        assert_eq!(serde_json::from_str::<ExecuteFrame>(&line).unwrap(), output);
        let reply = ExecuteFrame::Reply(Box::default());
        let line = serde_json::to_string(&reply).unwrap();
        assert!(line.starts_with(r#"{"reply":{"#), "{line}");
        assert!(serde_json::from_str::<ExecuteFrame>(r#"{"other":1}"#).is_err());
        // Not asked for, the field is not sent: an older worker decodes the request.
        assert!(
            !serde_json::to_string(&request())
                .unwrap()
                .contains("stream_output")
        );
    }

    #[test]
    fn a_kernel_order_needs_a_64_hex_digit_key_and_never_prints_it() {
        let order = KernelOrder::new(&[7; 32], "workspace");
        assert_eq!(order.seal_key.len(), 64);
        assert_eq!(
            order.key(),
            Some(corral_core::kernel::seal_key(&[7; 32], "workspace"))
        );
        assert!(!format!("{order:?}").contains(&order.seal_key));
        let mut request = request();
        request.kernel = Some(order);
        assert!(request.accept(&configured()).is_ok());
        for bad in ["", "00", &"g".repeat(64), &"0".repeat(63), &"0".repeat(65)] {
            request.kernel = Some(KernelOrder {
                seal_key: bad.to_owned(),
            });
            assert_eq!(
                request.accept(&configured()).unwrap_err().error,
                ErrorCode::BodyInvalid,
                "{bad:?}"
            );
        }
    }

    fn configured() -> ExecutionBounds {
        corral_core::config::Settings::from_pairs(&[])
            .unwrap()
            .bounds
    }

    fn refusal(request: &ExecuteRequest) -> ErrorCode {
        request.accept(&configured()).expect_err("refused").error
    }

    #[test]
    fn the_wire_form_of_an_execute_request_is_stable() {
        let text = serde_json::to_string(&request()).unwrap();
        assert_eq!(
            text,
            r#"{"language":"python","code":"print(1)","bounds":{},"declared":[],"token":3}"#
        );
        let back: ExecuteRequest = serde_json::from_str(&text).unwrap();
        assert_eq!(back, request());
        for bad in [
            r#"{"language":"ruby","code":"1","token":1}"#,
            r#"{"language":"python","code":"1","token":1,"sudo":true}"#,
            r#"{"language":"python","code":"1"}"#,
            r#"{"language":"python","code":"1","token":1,"bounds":{"wall":1}}"#,
        ] {
            let error = serde_json::from_str::<ExecuteRequest>(bad).unwrap_err();
            assert_eq!(
                ErrorBody::of_json(&error).error,
                ErrorCode::BodyInvalid,
                "{bad}"
            );
        }
    }

    #[test]
    fn egr_08_a_grant_up_to_cores_limit_is_accepted_and_one_past_it_refused() {
        let mut at_limit = request();
        at_limit.grant = Some("g".repeat(GRANT_MAX_BYTES));
        assert!(at_limit.accept(&configured()).is_ok());
        let mut over = request();
        over.grant = Some("g".repeat(GRANT_MAX_BYTES + 1));
        assert_eq!(refusal(&over), ErrorCode::GrantTooLong);
        let mut spaced = request();
        spaced.grant = Some("a b".to_owned());
        assert_eq!(refusal(&spaced), ErrorCode::GrantMalformed);
    }

    #[test]
    fn each_malformed_field_is_refused_with_its_own_code() {
        let mut code = request();
        code.code = "x".repeat(8 * 1024 * 1024 + 1);
        assert_eq!(refusal(&code), ErrorCode::CodeTooLarge);
        let mut declared = request();
        declared.declared = vec!["../escape.pdf".to_owned()];
        assert_eq!(refusal(&declared), ErrorCode::DeclaredOutputInvalid);
        let mut raised = request();
        raised.bounds.max_wall_seconds = Some(u64::MAX);
        assert_eq!(refusal(&raised), ErrorCode::BoundOverrideRefused);
        let mut archive = request();
        archive.workspace = Some("not base64!".to_owned());
        assert_eq!(refusal(&archive), ErrorCode::WorkspaceNotBase64);
    }

    #[test]
    fn the_workspace_return_says_what_the_outcome_needs() {
        assert_eq!(WorkspaceReturn::NotPacked.packed(), Packed::Missing);
        let packed = WorkspaceReturn::of_archive(b"tar");
        assert_eq!(packed.packed(), Packed::Archive);
        assert_eq!(packed.archive().as_deref(), Some(&b"tar"[..]));
        let text = serde_json::to_string(&packed).unwrap();
        assert_eq!(text, r#"{"state":"packed","archive":"dGFy"}"#);
    }

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
