//! The OpenAPI document the API serves at `/openapi.json`.

use serde_json::{Value, json};

fn refusal() -> Value {
    json!({ "description": "Refused: `error.code` is stable, `error.message` says why",
            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Refusal" } } } })
}

/// The document.
#[must_use]
pub fn document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": { "title": "Corral API", "version": env!("CARGO_PKG_VERSION"),
                  "description": "Run untrusted Python and Node code for an actor in a conversation, in a leased, single-tenant worker." },
        "components": components(),
        "paths": paths()
    })
}

/// The security schemes and the schemas the paths refer to.
fn components() -> Value {
    json!({
            "securitySchemes": {
                "caller": { "type": "http", "scheme": "bearer", "description": "The agent platform's service credential" },
                "admin": { "type": "http", "scheme": "bearer", "description": "The administrator's credential" }
            },
            "schemas": {
                "Refusal": { "type": "object", "required": ["outcome", "error"], "properties": {
                    "outcome": { "const": "refused" },
                    "error": { "type": "object", "required": ["code", "message"], "properties": {
                        "code": { "type": "string" }, "message": { "type": "string" },
                        "retry_after_seconds": { "type": "integer" }, "setting": { "type": "string" },
                        "field": { "type": "string" }, "path": { "type": "string" } } } } },
                "RunCode": run_code_schema(),
                "RunResult": run_result_schema()
            }
    })
}

/// Every path the API serves, by route.
fn paths() -> Value {
    json!({
            "/v1/run_code": run_code_path(),
            "/v1/runs/{run_id}/events": run_events_path(),
            "/v1/list_workspace": list_workspace_path(),
            "/v1/write_workspace": write_workspace_path(),
            "/v1/read_output": read_output_path(),
            "/v1/read_workspace": read_workspace_path(),
            "/v1/edit_workspace": edit_workspace_path(),
            "/v1/validate_package": validate_package_path(),
            "/v1/admin/egress_policy": egress_policy_path(),
            "/v1/browser_sessions": open_browser_session_path(),
            "/v1/browser_sessions/{id}/actions": { "post": {
                "summary": "One bounded action of the agent's (BROW-10)", "security": [{ "caller": [] }],
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } } ],
                "responses": { "200": { "description": "{result, took_ms}" }, "400": refusal(), "401": refusal(), "403": refusal(), "404": refusal(), "422": refusal() } } },
            "/v1/browser_sessions/{id}/private": browser_private_path(),
            "/v1/browser_sessions/{id}/viewers": browser_viewers_path(),
            "/v1/browser_sessions/{id}/close": { "post": {
                "summary": "Close the session: every process stopped, the profile deleted, the worker reset (BROW-13)",
                "security": [{ "caller": [] }],
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } } ],
                "responses": { "200": { "description": "{closed, confirmed, reset_evidence}" }, "401": refusal(), "404": refusal() } } },
            "/api/browser-sessions/{id}/viewport/{path}": { "get": {
                "summary": "The live view's client, by viewer ticket: its page and script only; a path resolving into api/ is viewport_path_refused (BROW-8)",
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } },
                                { "name": "path", "in": "path", "required": true, "schema": { "type": "string" } },
                                { "name": "ticket", "in": "query", "required": true, "schema": { "type": "string" } } ],
                "responses": { "200": { "description": "text/html or text/javascript" }, "400": refusal(), "401": refusal(), "403": refusal(), "404": refusal() } } },
            "/api/browser-sessions/{id}/signal": { "get": {
                "summary": "The live view's signaling WebSocket, by viewer ticket: config (ICE servers, relay only), offer, answer, error, closed (BROW-2)",
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } },
                                { "name": "ticket", "in": "query", "required": true, "schema": { "type": "string" } } ],
                "responses": { "101": { "description": "Switching to the WebSocket" }, "401": refusal(), "403": refusal(), "404": refusal() } } },
            "/v1/egress/verifying_key": { "get": { "summary": "The grant verifying key (public), for the egress proxy",
                "responses": { "200": { "description": "base64url key text", "content": { "text/plain": {} } }, "404": refusal() } } },
            "/healthz": { "get": { "summary": "Liveness", "responses": { "200": { "description": "Alive" } } } },
            "/readyz": { "get": { "summary": "Ready when coordination and storage are; proxy and key state reported",
                "responses": { "200": { "description": "Ready" }, "503": { "description": "Not ready" } } } },
            "/metrics": { "get": { "summary": "Prometheus counters", "responses": { "200": { "description": "Exposition text" } } } },
            "/openapi.json": { "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3.1" } } } }
    })
}

/// The `run_code` request body.
fn run_code_schema() -> Value {
    json!({ "type": "object", "required": ["actor", "conversation", "member", "language", "code"],
                    "additionalProperties": false, "properties": {
                    "actor": { "type": "string", "maxLength": 256 },
                    "conversation": { "type": "string", "maxLength": 256 },
                    "member": { "type": "string", "maxLength": 256 },
                    "language": { "enum": ["python", "node"] },
                    "code": { "type": "string" },
                    "declared_outputs": { "type": "array", "items": { "type": "string" } },
                    "provider_hint": { "type": "array", "items": { "type": "string" } },
                    "packages": { "type": "array", "maxItems": 32, "items": { "type": "string", "maxLength": 214 },
                        "description": "Packages the run needs beyond its imports (PKG-4): Python names with an optional exact version (humanize, pandas==2.2.3), or npm names (left-pad@1.3.0); never a URL, path, index or installer flag" },
                    "kernel": { "enum": ["ephemeral", "persistent"], "default": "ephemeral" },
                    "tools": tools_schema(),
                    "compress_output": { "type": "boolean", "default": false, "description": "Tool-result compression (CMP-1): the model's stdout and stderr may be shortened (repeated lines, long numeric tables), with model.compression saying what was elided; the raw streams are returned beside, in raw" },
                    "turn": { "type": "string", "description": "The agent turn this run belongs to (PROJ-7): links the same turn made since admission are the run's own and do not stop it" },
                    "retrieved": { "type": "array", "items": { "type": "string" }, "maxItems": corral_core::run::admission::RETRIEVED_MAX,
                        "description": "Documents re-authorized from a retrieval result for this turn only (PROJ-2), by reference. The conversation's attachments are never listed: the server resolves them. Projected files are found through KAIZEN_SHARED_RESOURCES_DIR and KAIZEN_SHARED_RESOURCES_MANIFEST (a JSON array of path, reference, kind, version, digest, filename, media_type, size); open each entry's path, never a name rebuilt from a display name" },
                    "bounds": { "type": "object", "properties": {
                        "wall_seconds": { "type": "integer" }, "output_bytes": { "type": "integer" },
                        "artifact_bytes": { "type": "integer" }, "memory_bytes": { "type": "integer" },
                        "processes": { "type": "integer" } } },
                    "wait_seconds": { "type": "integer" } } })
}

/// The read-only tools a run may call, and the capability for them.
fn tools_schema() -> Value {
    json!({ "type": "object", "description": "Read-only tools the code may call through `corral_tools` (KER-5): the platform's tools and its opaque capability, which the worker's supervisor holds and the code never sees; write tools and run_code are never callable",
                        "required": ["tools", "capability"], "additionalProperties": false, "properties": {
                        "capability": { "type": "string", "maxLength": 4096 },
                        "tools": { "type": "array", "maxItems": 32, "items": { "type": "object", "required": ["name", "access"], "properties": {
                            "name": { "type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$" }, "access": { "enum": ["read", "write"] } } } } } })
}

/// The result of a run: for the model and for members.
fn run_result_schema() -> Value {
    json!({ "type": "object", "properties": {
                    "run_id": { "type": "string" },
                    "outcome": { "enum": ["succeeded", "failed", "bound_exceeded", "not_run", "error"] },
                    "error": { "type": ["object", "null"], "description": "When the outcome is error, or not_run for packages (dependency_request_invalid, dependency_install_failed with cause and packages) or for a language (unsupported_language with the language asked for, bounded and escaped, its length in language_chars, the supported ones and their aliases): a stable code (output_invalid, declared_document_missing, workspace_conflict, workspace_storage_unavailable, workspace_not_packed, workspace_not_returned, worker_record_inconsistent), a message, and the paths, checks, reason or setting it is about" },
                    "model": { "type": "object", "description": "For the model: bounded output, diagnostics, typed downloads", "properties": {
                        "exit_code": { "type": ["integer", "null"] }, "stdout": output_stream_schema(), "stderr": output_stream_schema(),
                        "bound": { "type": ["string", "null"], "description": "The setting whose bound the run hit" },
                        "results": { "type": "array", "description": "Rich results (Python): the last expression's value and the figures left open, each by media type: text/plain, text/html, image/png (base64)", "items": { "type": "object" } },
                        "not_run": { "type": ["string", "null"], "description": "Why the code did not run: unsupported_language, persistent_kernel_unavailable, resource_persistent_kernel, kernel_checkpoint_corrupt, kernel_checkpoint_untrusted, kernel_checkpoint_incompatible, dependency_request_invalid, dependency_install_failed, ..." },
                        "dependencies": { "type": "object", "description": "What the baked stack satisfied, what was installed through the broker (and install_ms), notes; or the failure: cause (no_registry, registry_unreachable, timed_out, install_failed), packages, message" },
                        "diagnostics": { "type": "array", "items": { "type": "string" } },
                        "downloads": { "type": "array", "items": { "type": "object", "properties": {
                            "path": { "type": "string" }, "bytes": { "type": "integer" }, "media_type": { "type": "string" },
                            "reference": { "type": ["string", "null"], "description": "output:<run id>/<path>, readable through /v1/read_output whatever later runs save" } } } },
                        "rejected": { "type": "array", "description": "Documents that failed verification (OUT-4), removed from the downloads", "items": { "type": "object", "properties": {
                            "path": { "type": "string" }, "check": { "type": "string" } } } },
                        "egress": { "type": "object" },
                        "kernel": kernel_schema(),
                        "workspace": { "type": "object", "properties": { "generation": { "type": ["integer", "null"] }, "saved": { "type": "boolean" } } } } },
                    "member": { "type": "object", "description": "For members: outcome, exit state and references only", "properties": {
                        "outcome": { "type": "string" }, "exit_code": { "type": ["integer", "null"] },
                        "references": { "type": "array", "items": { "type": "object" } } } } } })
}

/// One bounded output stream of a run.
fn output_stream_schema() -> Value {
    json!({ "type": "object", "properties": {
        "text": { "type": "string" }, "truncated": { "type": "boolean" },
        "bytes_total": { "type": "integer" }, "bytes_dropped": { "type": "integer" } } })
}

/// A persistent cell's kernel state in a run's result.
fn kernel_schema() -> Value {
    json!({ "type": ["object", "null"], "description": "A persistent cell's kernel (KER-1 to KER-4); null for an ephemeral run", "properties": {
                            "mode": { "enum": ["persistent"] }, "durability": { "enum": ["object_store", "affinity"] },
                            "restored": { "type": "array", "items": { "type": "string" } },
                            "kept": { "type": "array", "items": { "type": "string" } },
                            "not_kept": { "type": "array", "items": { "type": "object", "properties": {
                                "name": { "type": "string" }, "reason": { "type": "string" } } } },
                            "checkpointed": { "type": "boolean" }, "checkpoint_bytes": { "type": "integer" },
                            "durable": { "type": "boolean", "description": "Checkpointed by this cell and kept with its workspace" },
                            "session_ended": { "type": ["string", "null"], "description": "Affinity mode: why an earlier session (and its state) is gone" } } })
}

/// `POST /v1/run_code`.
fn run_code_path() -> Value {
    json!({ "post": {
                "summary": "Run code in a leased worker, with the actor-and-conversation workspace",
                "security": [{ "caller": [] }],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RunCode" } } } },
                "responses": {
                    "200": { "description": "The run's result (whatever the code's own exit code). With `Accept: text/event-stream`, a server-sent event stream instead (WS-7): `run.queued` and `run.running` (`{run_id, declared: [{path, state: in_progress, downloadable: false}]}`), `run.output` (`{stream: stdout|stderr, text}`, the code's output as it writes it: the bytes the answer keeps, whole characters) and `run.bound` (`{stream, bound}`, once a stream reaches SANDBOX_MAX_OUTPUT_BYTES), then one `run.result` (`{status, body}`, the answer the plain request would have had). Every event has the id `<run_id>-<n>`, from 1; the events are kept deployment-wide, so `GET /v1/runs/{run_id}/events` with `Last-Event-ID` resumes the stream on any replica",
                             "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RunResult" } },
                                          "text/event-stream": { "schema": { "type": "string" } } } },
                    "400": refusal(), "401": refusal(), "409": refusal(), "413": refusal(), "422": refusal(),
                    "429": refusal(), "502": refusal(), "503": refusal() } } })
}

/// `GET /v1/runs/{run_id}/events`: resume a streamed run's events.
fn run_events_path() -> Value {
    json!({ "get": {
                "summary": "Resume a streamed run's events after Last-Event-ID (all without one), on any replica, to its run.result",
                "security": [{ "caller": [] }],
                "parameters": [
                    { "name": "run_id", "in": "path", "required": true, "schema": { "type": "string" } },
                    { "name": "actor", "in": "query", "required": true, "schema": { "type": "string" } },
                    { "name": "conversation", "in": "query", "required": true, "schema": { "type": "string" } },
                    { "name": "Last-Event-ID", "in": "header", "required": false, "schema": { "type": "string" } } ],
                "responses": {
                    "200": { "description": "The events after Last-Event-ID, then the rest as they come, to run.result: the same ids and data the first stream had",
                             "content": { "text/event-stream": { "schema": { "type": "string" } } } },
                    "400": { "description": "last_event_id_invalid (not <run_id>-<n>), last_event_id_foreign (another run's), last_event_id_future (an event this run has not had), or invalid_identity" },
                    "401": refusal(),
                    "404": { "description": "run_events_unknown: not a streamed run of this actor and conversation, or its events expired" },
                    "503": refusal() } } })
}

/// `GET /v1/list_workspace`.
fn list_workspace_path() -> Value {
    json!({ "get": {
                "summary": "List the stored workspace: paths, kinds and sizes, sorted, with the generation (0 and none before any save)",
                "security": [{ "caller": [] }],
                "parameters": [
                    { "name": "actor", "in": "query", "required": true, "schema": { "type": "string" } },
                    { "name": "conversation", "in": "query", "required": true, "schema": { "type": "string" } } ],
                "responses": {
                    "200": { "description": "{generation, files: [{path, kind: file|directory, bytes}], bytes_total, bytes_max}" },
                    "400": refusal(), "401": refusal(), "503": refusal() } } })
}

/// `POST /v1/write_workspace`.
fn write_workspace_path() -> Value {
    json!({ "post": {
                "summary": "Create one file (text or base64 bytes) as the next generation, by the rules a run's save follows; never replaces",
                "security": [{ "caller": [] }],
                "requestBody": { "required": true, "content": { "application/json": { "schema": {
                    "type": "object", "required": ["actor", "conversation", "path"], "additionalProperties": false,
                    "properties": { "actor": { "type": "string" }, "conversation": { "type": "string" }, "path": { "type": "string" },
                                    "text": { "type": "string" }, "base64": { "type": "string" } } } } } },
                "responses": {
                    "201": { "description": "{outcome: created, path, generation, bytes, hashline?}: a text file's Hashline view, recorded as shown" },
                    "400": refusal(), "401": refusal(), "409": refusal(), "413": refusal(), "503": refusal() } } })
}

/// `GET /v1/read_output`.
fn read_output_path() -> Value {
    json!({ "get": {
                "summary": "Read one retained output by the reference a run returned (OUT-1)",
                "security": [{ "caller": [] }],
                "parameters": [
                    { "name": "actor", "in": "query", "required": true, "schema": { "type": "string" } },
                    { "name": "conversation", "in": "query", "required": true, "schema": { "type": "string" } },
                    { "name": "reference", "in": "query", "required": true, "schema": { "type": "string" } } ],
                "responses": {
                    "200": { "description": "The output's bytes, with its media type" },
                    "400": refusal(), "401": refusal(), "404": refusal(), "503": refusal() } } })
}

/// `GET /v1/read_workspace`.
fn read_workspace_path() -> Value {
    json!({ "get": {
                "summary": "Read one file of a workspace by relative path",
                "security": [{ "caller": [] }],
                "parameters": [
                    { "name": "actor", "in": "query", "required": true, "schema": { "type": "string" } },
                    { "name": "conversation", "in": "query", "required": true, "schema": { "type": "string" } },
                    { "name": "path", "in": "query", "required": true, "schema": { "type": "string" } },
                    { "name": "view", "in": "query", "schema": { "enum": ["raw", "hashline"], "default": "raw" } },
                    { "name": "start", "in": "query", "schema": { "type": "integer", "minimum": 1 }, "description": "view=hashline: the first line shown" },
                    { "name": "count", "in": "query", "schema": { "type": "integer", "maximum": 2000 }, "description": "view=hashline: how many lines" } ],
                "responses": { "200": { "description": "The file's bytes; with view=hashline, {path, generation, tag, total_lines, first_line, lines} with lines as LINE:TAG|text (WS-3)",
                                        "content": { "application/octet-stream": {}, "application/json": {} } },
                               "400": refusal(), "401": refusal(), "404": refusal(), "409": refusal(), "413": refusal(), "422": refusal() } } })
}

/// `POST /v1/edit_workspace`.
fn edit_workspace_path() -> Value {
    json!({ "post": {
                "summary": "Edit one text file of a workspace by Hashline anchors, all or nothing (WS-3 to WS-5)",
                "security": [{ "caller": [] }],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object",
                    "required": ["actor", "conversation", "path", "edits"], "additionalProperties": false, "properties": {
                    "actor": { "type": "string" }, "conversation": { "type": "string" }, "path": { "type": "string" },
                    "edits": { "type": "array", "maxItems": 64, "items": { "type": "object", "required": ["op", "tag", "line"], "properties": {
                        "op": { "enum": ["replace", "insert_before", "insert_after", "delete", "yank"] },
                        "tag": { "type": "string", "pattern": "^[0-9a-fA-F]{4}$" }, "line": { "type": "integer", "minimum": 0 },
                        "end_line": { "type": "integer" }, "text": { "type": "string" }, "register": { "type": "string", "maxLength": 32 } } } } } } } } },
                "responses": {
                    "200": { "description": "{outcome: applied, path, generation, tag, lines}: the lines written, with the new tag" },
                    "400": refusal(), "401": refusal(), "404": refusal(), "409": refusal(), "413": refusal(), "422": refusal(), "503": refusal() } } })
}

/// `POST /v1/validate_package`.
fn validate_package_path() -> Value {
    json!({ "post": {
                "summary": "Validate an authored Pi package in a leased worker before admission (PI-1): static checks, its node:test tests (an extension), a fresh tree with dependencies reinstalled through the broker, Pi's real loader in a disposable child, and the surface compared with the reviewed manifest. The profile and the Pi runtime are derived, never chosen",
                "security": [{ "caller": [] }],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "additionalProperties": false,
                    "required": ["actor", "conversation", "member", "files", "manifest"],
                    "properties": {
                        "actor": { "type": "string" }, "conversation": { "type": "string" }, "member": { "type": "string" },
                        "files": { "type": "array", "maxItems": corral_core::pi::files::FILES_MAX, "items": { "type": "object", "additionalProperties": false, "required": ["path"],
                            "properties": { "path": { "type": "string" }, "text": { "type": "string" }, "base64": { "type": "string" } } } },
                        "manifest": { "type": "object", "description": "The reviewed manifest: name, version, and the names of the skills, prompts, themes, tools, commands, hooks, flags, shortcuts and renderers the package registers",
                            "required": ["name", "version"], "properties": { "name": { "type": "string" }, "version": { "type": "string" } } },
                        "deadline_seconds": { "type": "integer", "minimum": 1, "maximum": corral_core::pi::DEADLINE_MAX_SECONDS, "default": corral_core::pi::DEADLINE_DEFAULT_SECONDS } } } } } },
                "responses": {
                    "200": { "description": "Admitted: {outcome: admitted, admitted: true, validation_id, profile, runtime {package, version}, surface, drift, durations {static_ms, tests_ms, reinstall_ms, loader_ms}}" },
                    "400": refusal(), "401": refusal(), "413": refusal(),
                    "422": { "description": "Not admitted, failed closed: error.code is one of the package_* codes (or pi_runtime_unavailable), error.step the step, error.tail a bounded output tail" },
                    "429": refusal(), "503": refusal() } } })
}

/// `GET` and `PUT /v1/admin/egress_policy`.
fn egress_policy_path() -> Value {
    json!({
                "get": { "summary": "The egress policy: values, configured and effective mode, notes, revision",
                         "security": [{ "admin": [] }], "responses": { "200": { "description": "The policy" }, "401": refusal() } },
                "put": { "summary": "Replace the egress policy; applies to the next run",
                         "security": [{ "admin": [] }],
                         "requestBody": { "content": { "application/json": { "schema": { "type": "object", "properties": {
                             "SANDBOX_EGRESS_ENABLED": {}, "SANDBOX_EGRESS_MODE": {}, "SANDBOX_EGRESS_ALLOWED_PORTS": {},
                             "SANDBOX_EGRESS_PRIVATE_CIDRS": {}, "SANDBOX_EGRESS_ALLOWED_HOSTS": {},
                             "SANDBOX_EGRESS_TOKEN_TTL_SECONDS": {} }, "additionalProperties": false } } } },
                         "responses": { "200": { "description": "The policy as now in force" }, "400": refusal(), "401": refusal() } } })
}

/// `POST /v1/browser_sessions`.
fn open_browser_session_path() -> Value {
    json!({ "post": {
                "summary": "Open a browser session on a leased worker (BROW-1, BROW-13): its answer carries live_view.ice_servers (relay only) and the viewers route",
                "security": [{ "caller": [] }],
                "requestBody": { "content": { "application/json": { "schema": { "type": "object",
                    "required": ["actor", "conversation", "member"],
                    "properties": { "actor": { "type": "string" }, "conversation": { "type": "string" }, "member": { "type": "string" },
                                    "url": { "type": "string" }, "wait_seconds": { "type": "integer" } },
                    "additionalProperties": false } } } },
                "responses": { "200": { "description": "{session, worker, start_ms, start_phases_ms, isolation, diagnostics, egress, live_view, navigated?}" },
                               "400": refusal(), "401": refusal(), "422": refusal(), "503": refusal() } } })
}

/// `POST /v1/browser_sessions/{id}/private`.
fn browser_private_path() -> Value {
    json!({ "post": {
                "summary": "Start or end a member's private interval (BROW-12): the agent's reads and actions are refused, other members' viewers are cut off",
                "security": [{ "caller": [] }],
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } } ],
                "requestBody": { "content": { "application/json": { "schema": { "type": "object",
                    "required": ["actor", "conversation", "private"],
                    "properties": { "actor": { "type": "string" }, "conversation": { "type": "string" }, "private": { "type": "boolean" },
                                    "member": { "type": "string", "description": "whose interval it is (default: the actor)" } },
                    "additionalProperties": false } } } },
                "responses": { "200": { "description": "{session, private, member, viewers_removed}" }, "400": refusal(), "401": refusal(), "404": refusal(), "502": refusal() } } })
}

/// `POST /v1/browser_sessions/{id}/viewers`.
fn browser_viewers_path() -> Value {
    json!({ "post": {
                "summary": "A member's ticket to watch the session's live view (BROW-8)",
                "security": [{ "caller": [] }],
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } } ],
                "requestBody": { "content": { "application/json": { "schema": { "type": "object",
                    "required": ["actor", "conversation", "member"],
                    "properties": { "actor": { "type": "string" }, "conversation": { "type": "string" }, "member": { "type": "string" } },
                    "additionalProperties": false } } } },
                "responses": { "200": { "description": "{session, member, ticket, expires_at_ms, viewport, signal}" }, "400": refusal(), "401": refusal(), "404": refusal() } } })
}

#[cfg(test)]
mod tests {
    use corral_core::run::admission::RunCodeRequest;

    /// The document names exactly the fields `run_code` accepts (it refuses any other).
    #[test]
    fn the_run_code_schema_names_every_field_the_api_accepts() {
        let request = RunCodeRequest {
            declared_outputs: vec!["a".into()],
            provider_hint: Some(vec!["h".into()]),
            kernel: Some("ephemeral".into()),
            wait_seconds: Some(1),
            packages: vec!["p".into()],
            tools: Some(corral_core::tools::Tools {
                tools: Vec::new(),
                capability: "c".into(),
            }),
            compress_output: true,
            turn: Some("t".into()),
            retrieved: vec!["r".into()],
            bounds: corral_core::bounds::BoundOverrides {
                max_wall_seconds: Some(1),
                ..Default::default()
            },
            ..RunCodeRequest::default()
        };
        let accepted = serde_json::to_value(&request).expect("encodes");
        let mut accepted: Vec<&String> = accepted.as_object().expect("object").keys().collect();
        accepted.sort();
        let document = super::document();
        let properties = document["components"]["schemas"]["RunCode"]["properties"]
            .as_object()
            .expect("RunCode has properties");
        let mut documented: Vec<&String> = properties.keys().collect();
        documented.sort();
        assert_eq!(documented, accepted);
    }
}
