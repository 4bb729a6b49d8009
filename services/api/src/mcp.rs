//! Corral as an MCP server (issue 31): `corral mcp` over stdio, and Streamable HTTP at `/mcp`
//! behind the caller credential, on the Rust SDK `rmcp`.
//!
//! Every tool is one call of the API's own routes, so a tool does exactly what the route does and
//! is refused exactly as it is: over HTTP for `corral mcp` (a client of a remote API), in process
//! for `/mcp` (this replica's router, called without a socket). The identity a tool acts for
//! (actor, conversation, member) is never a tool argument the model fills: `corral mcp` takes it
//! from its configuration (`CORRAL_MCP_ACTOR`, `CORRAL_MCP_CONVERSATION`, `CORRAL_MCP_MEMBER`),
//! `/mcp` from the headers the platform sets on its connection ([`ACTOR_HEADER`],
//! [`CONVERSATION_HEADER`], [`MEMBER_HEADER`]); a tool call that names one is refused.
//!
//! Results are text (the API's answer, as the model should read it) plus image content for PNG
//! outputs of a run and a browser session's screenshots.

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, header};
use base64::Engine as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use crate::client::encode;

/// The header naming the actor a `/mcp` connection acts for.
pub const ACTOR_HEADER: &str = "x-corral-actor";
/// The header naming the conversation a `/mcp` connection acts in.
pub const CONVERSATION_HEADER: &str = "x-corral-conversation";
/// The header naming the member a `/mcp` connection acts for (default: the actor).
pub const MEMBER_HEADER: &str = "x-corral-member";

/// The arguments no tool takes: the identity is the server's, never the model's.
const IDENTITY_ARGUMENTS: [&str; 3] = ["actor", "conversation", "member"];

/// The largest PNG output of a run attached as image content; larger ones are named only.
const IMAGE_MAX_BYTES: u64 = 4 << 20;
/// The most PNG outputs of one run attached.
const IMAGES_MAX: usize = 4;

/// Who the tools act for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The actor.
    pub actor: String,
    /// The conversation.
    pub conversation: String,
    /// The member (default: the actor).
    pub member: String,
}

/// Where the tools' calls go.
#[derive(Clone)]
pub enum Api {
    /// A remote API, over HTTP, with the caller credential (`corral mcp`).
    Remote(crate::client::Client),
    /// This replica's routes, in process, with the caller credential (`/mcp`).
    Local {
        /// The routes (without `/mcp`).
        router: axum::Router,
        /// The caller credential the routes check.
        credential: String,
    },
}

impl Api {
    /// `method path` with `body`: the status and the answer's bytes.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Vec<u8>), String> {
        match self {
            Self::Remote(client) => match body {
                Some(body) => {
                    let (status, answer) = client.post(path, body).await?;
                    Ok((status, answer.to_string().into_bytes()))
                }
                None => client.get(path).await,
            },
            Self::Local { router, credential } => {
                let mut request = Request::builder()
                    .method(method)
                    .uri(path)
                    .header(header::AUTHORIZATION, format!("Bearer {credential}"));
                let body = match body {
                    Some(body) => {
                        request = request.header(header::CONTENT_TYPE, "application/json");
                        Body::from(body.to_string())
                    }
                    None => Body::empty(),
                };
                let request = request.body(body).map_err(|e| e.to_string())?;
                let response = router
                    .clone()
                    .oneshot(request)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = response.status().as_u16();
                let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((status, bytes.to_vec()))
            }
        }
    }

    async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let (status, bytes) = self.call(method, path, body).await?;
        let answer = serde_json::from_slice(&bytes).map_err(|e| format!("{path}: {e}"))?;
        Ok((status, answer))
    }
}

/// How a server learns its identity.
#[derive(Clone, Debug)]
enum Scope {
    /// Fixed by configuration (`corral mcp`).
    Fixed(Identity),
    /// From each request's headers (`/mcp`).
    Headers,
}

/// The MCP server.
#[derive(Clone)]
pub struct Server {
    api: Api,
    scope: Scope,
}

impl Server {
    /// A server acting for `identity` through `api` (`corral mcp`).
    #[must_use]
    pub fn fixed(api: Api, identity: Identity) -> Self {
        Self {
            api,
            scope: Scope::Fixed(identity),
        }
    }

    /// A server acting for the identity each request's headers name (`/mcp`).
    #[must_use]
    pub fn from_headers(api: Api) -> Self {
        Self {
            api,
            scope: Scope::Headers,
        }
    }

    fn identity(&self, context: &RequestContext<RoleServer>) -> Result<Identity, ErrorData> {
        match &self.scope {
            Scope::Fixed(identity) => Ok(identity.clone()),
            Scope::Headers => {
                let parts = context.extensions.get::<axum::http::request::Parts>();
                let get = |name: &str| {
                    parts
                        .and_then(|parts| parts.headers.get(name))
                        .and_then(|value| value.to_str().ok())
                        .map(str::to_owned)
                };
                let (Some(actor), Some(conversation)) =
                    (get(ACTOR_HEADER), get(CONVERSATION_HEADER))
                else {
                    return Err(refused(
                        "identity_missing",
                        format!(
                            "the connection names no identity: set {ACTOR_HEADER} and {CONVERSATION_HEADER} (and {MEMBER_HEADER})"
                        ),
                    ));
                };
                let member = get(MEMBER_HEADER).unwrap_or_else(|| actor.clone());
                Ok(Identity {
                    actor,
                    conversation,
                    member,
                })
            }
        }
    }
}

/// A protocol error with a stable code in its data.
fn refused(code: &str, message: impl Into<String>) -> ErrorData {
    ErrorData::invalid_params(
        Cow::Owned(format!("{code}: {}", message.into())),
        Some(json!({ "code": code })),
    )
}

fn schema(properties: Value, required: &[&str]) -> Arc<JsonObject> {
    let schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    match schema {
        Value::Object(object) => Arc::new(object),
        _ => Arc::new(JsonObject::new()),
    }
}

/// The tools, with their input schemas.
#[must_use]
pub fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "run_code",
            "Run Python or Node code in a fresh sandbox with this conversation's workspace (files \
             persist between calls). kernel=persistent keeps the interpreter's variables across \
             calls. packages installs PyPI or npm packages first. Returns stdout, stderr, the exit \
             code and outcome, and PNG files the code wrote as images.",
            schema(
                json!({
                    "code": { "type": "string", "description": "The program." },
                    "language": { "type": "string", "enum": ["python", "node"], "default": "python" },
                    "kernel": { "type": "string", "enum": ["ephemeral", "persistent"], "default": "ephemeral" },
                    "packages": { "type": "array", "items": { "type": "string" }, "description": "Requirements to install first, e.g. \"rich==13.9.4\"." },
                }),
                &["code"],
            ),
        ),
        Tool::new(
            "list_workspace",
            "List the workspace's files and directories with their sizes.",
            schema(json!({}), &[]),
        ),
        Tool::new(
            "read_workspace",
            "Read a text file of the workspace as numbered lines with Hashline anchors \
             (LINE:TAG|text); edit_workspace takes those anchors.",
            schema(
                json!({
                    "path": { "type": "string" },
                    "start": { "type": "integer", "minimum": 1 },
                    "count": { "type": "integer", "minimum": 1 },
                }),
                &["path"],
            ),
        ),
        Tool::new(
            "edit_workspace",
            "Edit a workspace file by the anchors read_workspace showed: each edit {op: \
             replace|insert_before|insert_after|delete, line, tag, end_line?, text?}, applied \
             all or none.",
            schema(
                json!({
                    "path": { "type": "string" },
                    "edits": { "type": "array", "items": { "type": "object" } },
                }),
                &["path", "edits"],
            ),
        ),
        Tool::new(
            "write_workspace",
            "Create a new text file in the workspace (never replaces one).",
            schema(
                json!({ "path": { "type": "string" }, "text": { "type": "string" } }),
                &["path", "text"],
            ),
        ),
        Tool::new(
            "browser_open",
            "Open a live browser session, optionally at a URL; returns its session id.",
            schema(json!({ "url": { "type": "string" } }), &[]),
        ),
        Tool::new(
            "browser_act",
            "One action in an open browser session: {action: navigate|click|type|press|scroll|\
             text|accessibility|evaluate|screenshot|wait, ...}. A screenshot returns an image.",
            schema(
                json!({ "session": { "type": "string" }, "action": { "type": "object" } }),
                &["session", "action"],
            ),
        ),
        Tool::new(
            "browser_close",
            "Close a browser session.",
            schema(json!({ "session": { "type": "string" } }), &["session"]),
        ),
    ]
}

/// The arguments, checked against `tool`'s schema: no identity, nothing unknown, every required
/// one present, each of its type.
fn check(tool: &Tool, arguments: &JsonObject) -> Result<(), ErrorData> {
    if let Some(name) = IDENTITY_ARGUMENTS
        .iter()
        .find(|name| arguments.contains_key(**name))
    {
        return Err(refused(
            "identity_argument_refused",
            format!("{name} is the server's to set, never a tool argument"),
        ));
    }
    let properties = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object);
    for (name, value) in arguments {
        let Some(declared) = properties.and_then(|p| p.get(name)) else {
            return Err(refused(
                "argument_unknown",
                format!("{} takes no argument {name}", tool.name),
            ));
        };
        let fits = match declared.get("type").and_then(Value::as_str) {
            Some("string") => value.as_str().is_some_and(|text| {
                declared
                    .get("enum")
                    .and_then(Value::as_array)
                    .is_none_or(|allowed| allowed.iter().any(|a| a == text))
            }),
            Some("integer") => value.as_u64().is_some_and(|n| n >= 1),
            Some("array") => value.as_array().is_some_and(|items| {
                declared["items"]["type"] != "string" || items.iter().all(Value::is_string)
            }),
            Some("object") => value.is_object(),
            _ => true,
        };
        if !fits {
            return Err(refused(
                "argument_invalid",
                format!("{name} must be {}", declared),
            ));
        }
    }
    let required = tool.input_schema.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        if !arguments.contains_key(name) {
            return Err(refused(
                "argument_missing",
                format!("{} needs {name}", tool.name),
            ));
        }
    }
    Ok(())
}

fn text(value: &Value) -> ContentBlock {
    ContentBlock::text(serde_json::to_string_pretty(value).unwrap_or_default())
}

/// The API's answer as a tool result: an error result for a refusal (its code and message).
fn answered(status: u16, answer: &Value, mut content: Vec<ContentBlock>) -> CallToolResult {
    if status >= 400 {
        return CallToolResult::error(vec![text(
            &json!({ "status": status, "error": answer["error"] }),
        )]);
    }
    content.insert(0, text(answer));
    CallToolResult::success(content)
}

impl Server {
    async fn run_code(
        &self,
        who: &Identity,
        arguments: &JsonObject,
    ) -> Result<CallToolResult, String> {
        let mut request = json!({
            "actor": who.actor, "conversation": who.conversation, "member": who.member,
            "code": arguments["code"], "language": arguments.get("language").cloned().unwrap_or(json!("python")),
        });
        for name in ["kernel", "packages"] {
            if let Some(value) = arguments.get(name) {
                request[name] = value.clone();
            }
        }
        let (status, answer) = self
            .api
            .json(Method::POST, "/v1/run_code", Some(&request))
            .await?;
        if status >= 400 {
            return Ok(answered(status, &answer, Vec::new()));
        }
        // What the model reads: the model's projection and the outcome.
        let shown = json!({
            "run_id": answer["run_id"], "outcome": answer["outcome"], "error": answer["error"],
            "exit_code": answer["model"]["exit_code"],
            "stdout": answer["model"]["stdout"]["text"], "stderr": answer["model"]["stderr"]["text"],
            "outputs": answer["member"]["references"],
        });
        let mut images = Vec::new();
        let references = answer["member"]["references"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for reference in references
            .iter()
            .filter(|r| {
                r["media_type"] == "image/png"
                    && r["bytes"].as_u64().is_some_and(|b| b <= IMAGE_MAX_BYTES)
            })
            .take(IMAGES_MAX)
        {
            let path = format!(
                "/v1/read_output?actor={}&conversation={}&reference={}",
                encode(&who.actor),
                encode(&who.conversation),
                encode(reference["reference"].as_str().unwrap_or_default())
            );
            if let Ok((200, png)) = self.api.call(Method::GET, &path, None).await {
                images.push(ContentBlock::image(
                    base64::engine::general_purpose::STANDARD.encode(png),
                    "image/png",
                ));
            }
        }
        Ok(answered(status, &shown, images))
    }

    async fn call_tool_as(
        &self,
        who: &Identity,
        name: &str,
        arguments: &JsonObject,
    ) -> Result<CallToolResult, String> {
        let scoped = json!({ "actor": who.actor, "conversation": who.conversation });
        let query = format!(
            "actor={}&conversation={}",
            encode(&who.actor),
            encode(&who.conversation)
        );
        let with = |body: Value, names: &[&str]| with_arguments(body, arguments, names);
        let (status, answer, content) = match name {
            "run_code" => return self.run_code(who, arguments).await,
            "list_workspace" => {
                let (status, answer) = self
                    .api
                    .json(Method::GET, &format!("/v1/list_workspace?{query}"), None)
                    .await?;
                (status, answer, Vec::new())
            }
            "read_workspace" => {
                let (status, answer) = self.read_workspace(&query, arguments).await?;
                (status, answer, Vec::new())
            }
            "edit_workspace" => {
                let body = with(scoped, &["path", "edits"]);
                let (status, answer) = self
                    .api
                    .json(Method::POST, "/v1/edit_workspace", Some(&body))
                    .await?;
                (status, answer, Vec::new())
            }
            "write_workspace" => {
                let body = with(scoped, &["path", "text"]);
                let (status, answer) = self
                    .api
                    .json(Method::POST, "/v1/write_workspace", Some(&body))
                    .await?;
                (status, answer, Vec::new())
            }
            "browser_open" => {
                let body = with(
                    json!({ "actor": who.actor, "conversation": who.conversation, "member": who.member }),
                    &["url"],
                );
                let (status, answer) = self
                    .api
                    .json(Method::POST, "/v1/browser_sessions", Some(&body))
                    .await?;
                (status, answer, Vec::new())
            }
            "browser_act" => {
                self.browser_act(arguments, with(scoped, &["action"]))
                    .await?
            }
            "browser_close" => {
                let session = encode(arguments["session"].as_str().unwrap_or_default());
                let (status, answer) = self
                    .api
                    .json(
                        Method::POST,
                        &format!("/v1/browser_sessions/{session}/close"),
                        Some(&scoped),
                    )
                    .await?;
                (status, answer, Vec::new())
            }
            _ => unreachable!("checked against the tool list"),
        };
        Ok(answered(status, &answer, content))
    }

    /// `read_workspace` as the Hashline view, from `start` for `count` lines when given.
    async fn read_workspace(
        &self,
        query: &str,
        arguments: &JsonObject,
    ) -> Result<(u16, Value), String> {
        let mut path = format!(
            "/v1/read_workspace?{query}&view=hashline&path={}",
            encode(arguments["path"].as_str().unwrap_or_default())
        );
        for name in ["start", "count"] {
            if let Some(n) = arguments.get(name).and_then(Value::as_u64) {
                path.push_str(&format!("&{name}={n}"));
            }
        }
        self.api.json(Method::GET, &path, None).await
    }

    /// `browser_act` on the session `arguments` names, with `body`; a screenshot comes back as
    /// an image.
    async fn browser_act(
        &self,
        arguments: &JsonObject,
        body: Value,
    ) -> Result<(u16, Value, Vec<ContentBlock>), String> {
        let session = encode(arguments["session"].as_str().unwrap_or_default());
        let (status, mut answer) = self
            .api
            .json(
                Method::POST,
                &format!("/v1/browser_sessions/{session}/actions"),
                Some(&body),
            )
            .await?;
        // A screenshot is an image, not base64 text for the model to read.
        let mut content = Vec::new();
        if let Some(png) = answer["result"]["png"].as_str().map(str::to_owned) {
            content.push(ContentBlock::image(png, "image/png"));
            answer["result"]["png"] = json!("(the image)");
        }
        Ok((status, answer, content))
    }
}

/// `body` with each of `names` that `arguments` has copied into it.
fn with_arguments(mut body: Value, arguments: &JsonObject, names: &[&str]) -> Value {
    for name in names {
        if let Some(value) = arguments.get(*name) {
            body[*name] = value.clone();
        }
    }
    body
}

impl rmcp::ServerHandler for Server {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("corral", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Corral runs code in disposable sandboxes with a persistent per-conversation \
                 workspace, and drives live browser sessions.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().into_iter().find(|tool| tool.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = self.get_tool(&request.name) else {
            return Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("tool_unknown: no tool {}", request.name),
                Some(json!({ "code": "tool_unknown" })),
            ));
        };
        let arguments = request.arguments.unwrap_or_default();
        check(&tool, &arguments)?;
        let who = self.identity(&context)?;
        self.call_tool_as(&who, &request.name, &arguments)
            .await
            .map(CallToolResponse::from)
            .map_err(|e| ErrorData::internal_error(format!("the API did not answer: {e}"), None))
    }
}

/// `/mcp`: the Streamable HTTP service over `router` (this replica's routes, without `/mcp`),
/// for the router's caller-authenticated part.
#[must_use]
pub fn service(
    router: axum::Router,
    credential: String,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    Server,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let api = Api::Local { router, credential };
    // The caller credential guards the route; a DNS rebinding page cannot present it.
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(Server::from_headers(api.clone())),
        Arc::default(),
        config,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(value: Value) -> JsonObject {
        value.as_object().unwrap().clone()
    }

    fn tool(name: &str) -> Tool {
        tools().into_iter().find(|t| t.name == name).unwrap()
    }

    fn code_of(error: ErrorData) -> String {
        error.data.unwrap()["code"].as_str().unwrap().to_owned()
    }

    #[test]
    fn an_identity_argument_is_refused_whatever_the_tool() {
        for name in ["run_code", "list_workspace", "read_workspace"] {
            for identity in IDENTITY_ARGUMENTS {
                let refused = check(
                    &tool(name),
                    &args(json!({ identity: "someone", "code": "1", "path": "a" })),
                );
                assert_eq!(
                    code_of(refused.unwrap_err()),
                    "identity_argument_refused",
                    "{name} {identity}"
                );
            }
        }
    }

    #[test]
    fn arguments_of_the_wrong_type_unknown_or_missing_are_refused_with_their_codes() {
        let run = tool("run_code");
        assert!(check(&run, &args(json!({ "code": "print(1)" }))).is_ok());
        assert!(
            check(
                &run,
                &args(json!({ "code": "1", "language": "node", "packages": ["a==1"] }))
            )
            .is_ok()
        );
        for (bad, code) in [
            (json!({ "code": 7 }), "argument_invalid"),
            (
                json!({ "code": "1", "language": "ruby" }),
                "argument_invalid",
            ),
            (json!({ "code": "1", "packages": [1] }), "argument_invalid"),
            (json!({ "code": "1", "shell": true }), "argument_unknown"),
            (json!({}), "argument_missing"),
        ] {
            assert_eq!(
                code_of(check(&run, &args(bad.clone())).unwrap_err()),
                code,
                "{bad}"
            );
        }
        let read = tool("read_workspace");
        assert_eq!(
            code_of(check(&read, &args(json!({ "path": "a", "start": 0 }))).unwrap_err()),
            "argument_invalid"
        );
    }
}
