//! A simulated object store host, and the API's workspace store speaking to it over turmoil's
//! network.
//!
//! The host keeps its objects in `object_store`'s own in-memory store (create-only puts refused
//! as `AlreadyExists`, exactly as the real stores' conditional puts are), and its objects outlive
//! a crash of the host, as an object store's do. The API's side is the API's own
//! [`corral_api::workspaces::Workspaces`] over [`TurmoilObjects`], an [`ObjectStore`] whose every
//! call is one JSON line to the host and one back on a connection of its own, given up after the
//! store client's timeout: a partition, a held message or a crashed host is an error the API's
//! code must handle, and a write whose answer is lost may still have landed.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, Error, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, ObjectStoreExt as _, PutMode, PutMultipartOptions, PutOptions,
    PutPayload, PutResult, Result,
};
use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::dns::Dns;

/// The port the simulated object store listens on.
pub const PORT: u16 = 9000;

/// How long a call may take before the client gives up on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

const STORE: &str = "sim-objects";

/// The host: answers until it is crashed; its objects live in `objects`, outside it.
///
/// # Errors
/// When it cannot listen.
pub async fn host(objects: Arc<InMemory>) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let objects = objects.clone();
        tokio::spawn(async move {
            let (read, mut write) = tokio::io::split(stream);
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let request: Json = serde_json::from_str(&line).unwrap_or(Json::Null);
                let answer = answer(&objects, &request).await;
                if write
                    .write_all(format!("{answer}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
}

fn path_of(request: &Json, field: &str) -> Option<Path> {
    request.get(field).and_then(Json::as_str).map(Path::from)
}

fn failed(error: &Error) -> Json {
    let kind = match error {
        Error::NotFound { .. } => "not_found",
        Error::AlreadyExists { .. } => "exists",
        _ => "failed",
    };
    json!({ "error": kind, "message": error.to_string() })
}

/// Performs one request on the host's objects.
async fn answer(objects: &InMemory, request: &Json) -> Json {
    if let Some(path) = path_of(request, "put") {
        let data: Vec<u8> = request
            .get("data")
            .and_then(|d| serde_json::from_value(d.clone()).ok())
            .unwrap_or_default();
        let mode = if request.get("create").and_then(Json::as_bool) == Some(true) {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        return match objects
            .put_opts(&path, PutPayload::from(Bytes::from(data)), options)
            .await
        {
            Ok(_) => json!({ "ok": null }),
            Err(e) => failed(&e),
        };
    }
    if let Some(path) = path_of(request, "get") {
        return match objects.get(&path).await {
            Ok(found) => match found.bytes().await {
                Ok(bytes) => json!({ "ok": bytes.to_vec() }),
                Err(e) => failed(&e),
            },
            Err(e) => failed(&e),
        };
    }
    if let Some(path) = path_of(request, "delete") {
        return match objects.delete(&path).await {
            Ok(()) => json!({ "ok": null }),
            Err(e) => failed(&e),
        };
    }
    if let Some(prefix) = path_of(request, "list") {
        let listed: Vec<Result<ObjectMeta>> = objects.list(Some(&prefix)).collect().await;
        let mut found = Vec::new();
        for meta in listed {
            match meta {
                Ok(meta) => found.push(json!([meta.location.as_ref(), meta.size])),
                Err(e) => return failed(&e),
            }
        }
        return json!({ "ok": found });
    }
    json!({ "error": "failed", "message": "unknown request" })
}

/// The API's object store client in the world: every call a JSON line to the host at `host`.
#[derive(Clone)]
pub struct TurmoilObjects {
    host: String,
    dns: Dns,
}

impl TurmoilObjects {
    /// A client of the object store host `host`, its name resolved through `dns`.
    #[must_use]
    pub fn new(host: &str, dns: Dns) -> Self {
        Self {
            host: host.to_owned(),
            dns,
        }
    }

    /// One request and its answer (`ok`'s value), within the client's timeout.
    async fn call(&self, request: Json, path: &Path) -> Result<Json> {
        let exchange = async {
            let stream = self.dns.connect(&self.host, PORT).await.ok()?;
            let (read, mut write) = tokio::io::split(stream);
            write
                .write_all(format!("{request}\n").as_bytes())
                .await
                .ok()?;
            let line = BufReader::new(read).lines().next_line().await.ok()??;
            serde_json::from_str::<Json>(&line).ok()
        };
        let answer = tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .ok()
            .flatten();
        let Some(answer) = answer else {
            return Err(generic(format!("{}: no answer", self.host)));
        };
        if let Some(ok) = answer.get("ok") {
            return Ok(ok.clone());
        }
        let message = answer
            .get("message")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned();
        let path = path.to_string();
        Err(match answer.get("error").and_then(Json::as_str) {
            Some("not_found") => Error::NotFound {
                path,
                source: message.into(),
            },
            Some("exists") => Error::AlreadyExists {
                path,
                source: message.into(),
            },
            _ => generic(message),
        })
    }

    async fn list_under(self, prefix: Path) -> Result<Vec<ObjectMeta>> {
        let found = self
            .call(json!({ "list": prefix.as_ref() }), &prefix)
            .await?;
        let found: Vec<(String, u64)> =
            serde_json::from_value(found).map_err(|e| generic(e.to_string()))?;
        Ok(found
            .into_iter()
            .map(|(location, size)| ObjectMeta {
                location: Path::from(location),
                last_modified: chrono::DateTime::UNIX_EPOCH,
                size,
                e_tag: None,
                version: None,
            })
            .collect())
    }
}

fn generic(message: String) -> Error {
    Error::Generic {
        store: STORE,
        source: message.into(),
    }
}

fn unsupported(operation: &str) -> Error {
    Error::NotImplemented {
        operation: operation.to_owned(),
        implementer: STORE.to_owned(),
    }
}

impl fmt::Display for TurmoilObjects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{STORE}({})", self.host)
    }
}

impl fmt::Debug for TurmoilObjects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[async_trait]
impl ObjectStore for TurmoilObjects {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let create = match opts.mode {
            PutMode::Create => true,
            PutMode::Overwrite => false,
            PutMode::Update(_) => return Err(unsupported("put_opts(Update)")),
        };
        let data = Bytes::from(payload).to_vec();
        let request = json!({ "put": location.as_ref(), "create": create, "data": data });
        self.call(request, location).await?;
        Ok(PutResult {
            e_tag: None,
            version: None,
            extensions: Default::default(),
        })
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        Err(unsupported("put_multipart_opts"))
    }

    async fn get_opts(&self, location: &Path, _options: GetOptions) -> Result<GetResult> {
        let found = self
            .call(json!({ "get": location.as_ref() }), location)
            .await?;
        let bytes: Vec<u8> = serde_json::from_value(found).map_err(|e| generic(e.to_string()))?;
        let size = bytes.len() as u64;
        let body = Bytes::from(bytes);
        Ok(GetResult {
            payload: GetResultPayload::Stream(futures::stream::once(async { Ok(body) }).boxed()),
            meta: ObjectMeta {
                location: location.clone(),
                last_modified: chrono::DateTime::UNIX_EPOCH,
                size,
                e_tag: None,
                version: None,
            },
            range: 0..size,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let client = self.clone();
        locations
            .then(move |location| {
                let client = client.clone();
                async move {
                    let location = location?;
                    client
                        .call(json!({ "delete": location.as_ref() }), &location)
                        .await?;
                    Ok(location)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let listing = self.clone().list_under(prefix.cloned().unwrap_or_default());
        futures::stream::once(listing)
            .flat_map(|listed| match listed {
                Ok(found) => futures::stream::iter(found.into_iter().map(Ok)).boxed(),
                Err(e) => futures::stream::once(async { Err(e) }).boxed(),
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, _prefix: Option<&Path>) -> Result<ListResult> {
        Err(unsupported("list_with_delimiter"))
    }

    async fn copy_opts(&self, _from: &Path, _to: &Path, _options: CopyOptions) -> Result<()> {
        Err(unsupported("copy_opts"))
    }
}
