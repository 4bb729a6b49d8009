//! A small client of the API, for `corral run`, the sample run of `corral up`, tests and the load
//! generator.

use std::time::Duration;

use serde_json::Value;

/// A client of one API.
#[derive(Clone)]
pub struct Client {
    base: String,
    credential: String,
    http: reqwest::Client,
}

impl Client {
    /// A client of the API at `base` (`http://host:port`) presenting `credential`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(base: &str, credential: &str) -> Result<Self, String> {
        crate::ensure_crypto_provider();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(600))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            credential: credential.to_owned(),
            http,
        })
    }

    /// `POST /v1/run_code`: the status and the JSON answer.
    ///
    /// # Errors
    /// When the API cannot be reached or answers with something other than JSON.
    pub async fn run_code(&self, request: &Value) -> Result<(u16, Value), String> {
        self.post("/v1/run_code", request).await
    }

    /// `POST /v1/run_code` as a server-sent event stream (WS-7): each event's name and JSON
    /// data, in order, read to the stream's end (the last is `run.result`).
    ///
    /// # Errors
    /// When the API cannot be reached, or an event's data is not JSON.
    pub async fn run_code_events(&self, request: &Value) -> Result<Vec<(String, Value)>, String> {
        let mut stream = self.run_code_stream(request).await?;
        let mut events = Vec::new();
        while let Some(event) = stream.next().await? {
            events.push((event.name, event.data));
        }
        Ok(events)
    }

    /// `POST /v1/run_code` as a server-sent event stream (WS-7), read event by event as it comes.
    ///
    /// # Errors
    /// When the API cannot be reached.
    pub async fn run_code_stream(&self, request: &Value) -> Result<Events, String> {
        let response = self
            .http
            .post(format!("{}/v1/run_code", self.base))
            .bearer_auth(&self.credential)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(request)
            .send()
            .await
            .map_err(|e| format!("{}: {e}", self.base))?;
        Ok(Events::new(response))
    }

    /// `GET /v1/runs/{run_id}/events`: a streamed run's events after `last_event_id` (all without
    /// one), from whichever replica this client talks to; or the refusal's status and JSON.
    ///
    /// # Errors
    /// When the API cannot be reached or a refusal is not JSON.
    pub async fn resume_events(
        &self,
        run_id: &str,
        actor: &str,
        conversation: &str,
        last_event_id: Option<&str>,
    ) -> Result<Result<Events, (u16, Value)>, String> {
        let mut request = self
            .http
            .get(format!(
                "{}/v1/runs/{}/events?actor={}&conversation={}",
                self.base,
                encode(run_id),
                encode(actor),
                encode(conversation)
            ))
            .bearer_auth(&self.credential)
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("{}: {e}", self.base))?;
        let status = response.status().as_u16();
        if status != 200 {
            let body = response
                .json()
                .await
                .map_err(|e| format!("{}: {e}", self.base))?;
            return Ok(Err((status, body)));
        }
        Ok(Ok(Events::new(response)))
    }

    /// `POST path` with a JSON body and the credential: status and JSON answer.
    ///
    /// # Errors
    /// When the API cannot be reached or answers with something other than JSON.
    pub async fn post(&self, path: &str, body: &Value) -> Result<(u16, Value), String> {
        self.send_json(reqwest::Method::POST, path, body).await
    }

    /// `GET path` with the credential: status and body bytes.
    ///
    /// # Errors
    /// When the API cannot be reached.
    pub async fn get(&self, path_and_query: &str) -> Result<(u16, Vec<u8>), String> {
        let reply = self
            .http
            .get(format!("{}{path_and_query}", self.base))
            .bearer_auth(&self.credential)
            .send()
            .await
            .map_err(|e| format!("{}: {e}", self.base))?;
        let status = reply.status().as_u16();
        let body = reply.bytes().await.map_err(|e| e.to_string())?.to_vec();
        Ok((status, body))
    }

    /// `PUT path` with a JSON body and the credential: status and JSON answer.
    ///
    /// # Errors
    /// When the API cannot be reached or answers with something other than JSON.
    pub async fn put(&self, path: &str, body: &Value) -> Result<(u16, Value), String> {
        self.send_json(reqwest::Method::PUT, path, body).await
    }

    /// `POST /v1/run_code`: the status, the JSON answer, and the `Retry-After` header when the
    /// answer carries one (a refusal that says when to come back).
    ///
    /// # Errors
    /// When the API cannot be reached or answers with something other than JSON.
    pub async fn run_code_retry_after(
        &self,
        request: &Value,
    ) -> Result<(u16, Value, Option<String>), String> {
        self.send(reqwest::Method::POST, "/v1/run_code", request)
            .await
    }

    async fn send_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &Value,
    ) -> Result<(u16, Value), String> {
        let (status, body, _) = self.send(method, path, body).await?;
        Ok((status, body))
    }

    /// A JSON request with the credential: the status, the JSON answer and its `Retry-After`.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &Value,
    ) -> Result<(u16, Value, Option<String>), String> {
        let reply = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.credential)
            .json(body)
            .send()
            .await
            .map_err(|e| format!("{}: {e}", self.base))?;
        let status = reply.status().as_u16();
        let retry_after = reply
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let body = reply
            .json()
            .await
            .map_err(|e| format!("{}: {e}", self.base))?;
        Ok((status, body, retry_after))
    }
}

/// `text` percent-encoded for a URL's path segment or query value: every byte but the unreserved
/// ones (RFC 3986).
#[must_use]
pub fn encode(text: &str) -> String {
    use std::fmt::Write as _;
    text.bytes().fold(String::new(), |mut out, b| {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
        out
    })
}

/// One server-sent event: its id, name and JSON data.
#[derive(Clone, Debug, PartialEq)]
pub struct SseEvent {
    /// `id:`, when the event has one.
    pub id: Option<String>,
    /// `event:` (`message` when absent).
    pub name: String,
    /// `data:`, as JSON.
    pub data: Value,
}

/// A server-sent event stream, read as it arrives.
pub struct Events {
    response: reqwest::Response,
    buffer: Vec<u8>,
    /// The HTTP status of the stream's answer.
    pub status: u16,
}

impl Events {
    fn new(response: reqwest::Response) -> Self {
        Self {
            status: response.status().as_u16(),
            response,
            buffer: Vec::new(),
        }
    }

    /// The next event; `None` at the stream's end.
    ///
    /// # Errors
    /// When the connection breaks, or an event's data is not JSON.
    pub async fn next(&mut self) -> Result<Option<SseEvent>, String> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let block = String::from_utf8_lossy(&block);
                if block.trim().is_empty() || block.lines().all(|l| l.starts_with(':')) {
                    continue;
                }
                return parse_event(&block).map(Some);
            }
            match self.response.chunk().await.map_err(|e| e.to_string())? {
                Some(chunk) => self.buffer.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }
}

fn parse_event(block: &str) -> Result<SseEvent, String> {
    let mut event = SseEvent {
        id: None,
        name: String::from("message"),
        data: Value::Null,
    };
    let mut data = String::new();
    for line in block.lines() {
        let field = |prefix: &str| {
            line.strip_prefix(prefix)
                .map(|value| value.strip_prefix(' ').unwrap_or(value).to_owned())
        };
        if let Some(value) = field("event:") {
            event.name = value;
        } else if let Some(value) = field("id:") {
            event.id = Some(value);
        } else if let Some(value) = field("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(&value);
        }
    }
    event.data = serde_json::from_str(&data).map_err(|e| format!("{}: {e}", event.name))?;
    Ok(event)
}

/// A person-readable rendering of a `run_code` answer.
#[must_use]
pub fn render(status: u16, body: &Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let outcome = body["outcome"].as_str().unwrap_or("?");
    if outcome == "refused" {
        let _ = writeln!(
            out,
            "refused ({status}): {} — {}",
            body["error"]["code"].as_str().unwrap_or("?"),
            body["error"]["message"].as_str().unwrap_or("")
        );
        if let Some(retry) = body["error"]["retry_after_seconds"].as_u64() {
            let _ = writeln!(out, "retry after {retry} s");
        }
        return out;
    }
    let model = &body["model"];
    for (name, stream) in [("stdout", &model["stdout"]), ("stderr", &model["stderr"])] {
        let text = stream["text"].as_str().unwrap_or("");
        if !text.is_empty() {
            let _ = writeln!(out, "--- {name} ---\n{}", text.trim_end_matches('\n'));
        }
        if stream["truncated"].as_bool() == Some(true) {
            let _ = writeln!(
                out,
                "({name} truncated: {} of {} bytes dropped)",
                stream["bytes_dropped"], stream["bytes_total"]
            );
        }
    }
    for download in model["downloads"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "download: {} ({}, {} bytes){}",
            download["path"].as_str().unwrap_or("?"),
            download["media_type"].as_str().unwrap_or("?"),
            download["bytes"],
            download["reference"]
                .as_str()
                .map_or(String::new(), |r| format!(", {r}"))
        );
    }
    for rejected in model["rejected"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "rejected: {} ({})",
            rejected["path"].as_str().unwrap_or("?"),
            rejected["check"].as_str().unwrap_or("?")
        );
    }
    let _ = write!(out, "outcome: {outcome}, exit code {}", model["exit_code"]);
    if let Some(bound) = model["bound"].as_str() {
        let _ = write!(out, ", bound hit: {bound}");
    }
    if let Some(reason) = model["not_run"].as_str() {
        let _ = write!(out, ", not run: {reason}");
    }
    if let Some(code) = body["error"]["code"].as_str() {
        let _ = write!(
            out,
            ", error: {code} — {}",
            body["error"]["message"].as_str().unwrap_or("")
        );
    }
    let _ = writeln!(
        out,
        " (egress: {})",
        model["egress"]["effective_mode"].as_str().unwrap_or("?")
    );
    out
}
