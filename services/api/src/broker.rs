//! The package broker (PKG-3, PKG-5), served by the API under `/v1/packages/{token}/`: what a
//! run's installer reaches, through the worker's relay, instead of any registry.
//!
//! - Python: `pypi/simple/{project}/` answers the PEP 503 HTML or PEP 691 JSON page of the
//!   upstream index, with every file link rewritten to `pypi/files/{project}/{filename}` under the
//!   same token (the filename last, its hash kept as the fragment), so that the upstream URL is
//!   never seen; `pypi/files/...` serves a file the project's page lists (its sha256 checked), and
//!   `{filename}.metadata` only for a file the page says has one (PEP 658).
//! - npm: `npm/{name}` answers the packument with each `dist.tarball` rewritten to
//!   `npm/-/files/{name}/{file}` (`integrity` kept); the file is served only if the packument lists
//!   it, its sha512 integrity checked.
//! - `status`: whether a registry was unreachable for this token's run, which the worker asks
//!   once after a failed install (pip reports a refused index only as "no matching
//!   distribution").
//!
//! Every upstream dial is bounded (corral-core's `CONNECT_TIMEOUT_MS`, connection and each read);
//! a host that failed is refused for `COOLDOWN_MS` without a dial, answered 503 with
//! `X-Kaizen-Package-Registry: unreachable` and no `Retry-After`. Pages are bounded by
//! `SANDBOX_PACKAGE_MAX_INDEX_BYTES`, files by `SANDBOX_PACKAGE_MAX_FILE_BYTES`. An index
//! redirect is refused (the registry is configuration; a page elsewhere is not it).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use corral_core::config::{PackageRegistries, PackageSettings};
use corral_core::packages::registries::{
    CONNECT_TIMEOUT_MS, Cooldowns, REGISTRY_HEADER, REGISTRY_UNREACHABLE, Registries, TokenRefusal,
    check_token, mint_token,
};
use corral_core::packages::resolve::Available;
use corral_core::time::{MonoMillis, UnixMillis};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256, Sha512};

/// The most file redirects followed (a registry's download host).
const REDIRECTS_MAX: usize = 3;
/// PEP 691's JSON media type.
const PEP691: &str = "application/vnd.pypi.simple.v1+json";

/// The broker's state.
pub struct Broker {
    key: Vec<u8>,
    registries: Registries,
    client: reqwest::Client,
    started: Instant,
    cooldowns: Mutex<Cooldowns>,
    /// Runs that met an unreachable registry.
    unreachable: Mutex<BTreeMap<String, bool>>,
    /// Runs that have ended, and when: their tokens are refused until they would have expired.
    ended: Mutex<BTreeMap<String, MonoMillis>>,
    max_index: u64,
    max_file: u64,
    ttl_ms: u64,
    dials: AtomicU64,
    minted: AtomicU64,
}

/// What an upstream answer is, and so its bound (PKG-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An index page or packument: `SANDBOX_PACKAGE_MAX_INDEX_BYTES`, redirects refused.
    Index,
    /// A package file: `SANDBOX_PACKAGE_MAX_FILE_BYTES`, redirects (a download host) followed.
    File,
}

impl Kind {
    fn setting(self) -> &'static str {
        match self {
            Self::Index => "SANDBOX_PACKAGE_MAX_INDEX_BYTES",
            Self::File => "SANDBOX_PACKAGE_MAX_FILE_BYTES",
        }
    }

    fn too_large(self) -> &'static str {
        match self {
            Self::Index => "package_index_too_large",
            Self::File => "package_file_too_large",
        }
    }
}

/// Why an upstream fetch failed.
#[derive(Debug)]
enum Failure {
    Unreachable(String),
    NotFound,
    Upstream(u16),
    Redirected(String),
    TooLarge { kind: Kind, max: u64 },
    Truncated,
    IndexNotUnderstood(String),
    HashMismatch(String),
    NotListed,
}

impl Failure {
    fn response(&self) -> Response {
        let (status, code, message) = match self {
            Self::Unreachable(host) => {
                let mut response = refusal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "package_registry_unreachable",
                    format!("the package registry {host} cannot be reached"),
                );
                response.headers_mut().insert(
                    REGISTRY_HEADER,
                    HeaderValue::from_static(REGISTRY_UNREACHABLE),
                );
                return response;
            }
            Self::NotFound => (
                StatusCode::NOT_FOUND,
                "package_not_found",
                "no such project or file".to_owned(),
            ),
            Self::Upstream(status) => (
                StatusCode::BAD_GATEWAY,
                "package_registry_error",
                format!("the registry answered {status}"),
            ),
            Self::Redirected(to) => (
                StatusCode::BAD_GATEWAY,
                "package_registry_redirected",
                format!(
                    "the registry redirected the index to {to}; only the configured registry is used"
                ),
            ),
            Self::TooLarge { kind, max } => (
                StatusCode::BAD_GATEWAY,
                kind.too_large(),
                format!("over {max} bytes ({})", kind.setting()),
            ),
            Self::Truncated => (
                StatusCode::BAD_GATEWAY,
                "package_download_truncated",
                "the registry's answer ended early".to_owned(),
            ),
            Self::IndexNotUnderstood(why) => (
                StatusCode::BAD_GATEWAY,
                "package_index_malformed",
                format!("the registry's index is not a PEP 503 HTML or PEP 691 JSON page ({why})"),
            ),
            Self::HashMismatch(file) => (
                StatusCode::BAD_GATEWAY,
                "package_hash_mismatch",
                format!("{file} does not match the hash its index gives"),
            ),
            Self::NotListed => (
                StatusCode::NOT_FOUND,
                "package_file_not_listed",
                "the project's index does not list this file".to_owned(),
            ),
        };
        refusal(status, code, message)
    }
}

fn refusal(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        axum::Json(json!({ "error": { "code": code, "message": message } })),
    )
        .into_response()
}

/// One file an index lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The file's name (the last path segment).
    pub filename: String,
    /// Its upstream URL.
    pub url: String,
    /// Its sha256, when the index gives one.
    pub sha256: Option<String>,
    /// `Requires-Python`.
    pub requires_python: Option<String>,
    /// Whether a PEP 658 metadata file accompanies it.
    pub metadata: bool,
    /// Whether it is yanked (and why).
    pub yanked: Option<String>,
}

impl Broker {
    /// The broker for `settings`, or `None` with why when no registry is configured.
    ///
    /// # Errors
    /// `SANDBOX_PACKAGE_REGISTRIES` that does not parse.
    pub fn new(settings: &PackageSettings, field_key: Option<&[u8]>) -> Result<Self, String> {
        let registries = match &settings.registries {
            PackageRegistries::Disabled => Registries::default(),
            PackageRegistries::Configured(text) => Registries::parse(text)?,
            PackageRegistries::PublicDefaults => machine_defaults(),
        };
        crate::ensure_crypto_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .read_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(|e| format!("package broker client: {e}"))?;
        Ok(Self {
            // The deployment's key, so that any replica honours a token another minted; a
            // deployment without a field key has one replica, whose own key will do.
            key: field_key
                .and_then(corral_core::packages::registries::broker_key)
                .map_or_else(
                    || corral_contract::credential::random_bytes().to_vec(),
                    |k| k.to_vec(),
                ),
            registries,
            client,
            started: Instant::now(),
            cooldowns: Mutex::new(Cooldowns::default()),
            unreachable: Mutex::new(BTreeMap::new()),
            ended: Mutex::new(BTreeMap::new()),
            max_index: settings.max_index_bytes,
            max_file: settings.max_file_bytes,
            ttl_ms: settings.token_ttl_seconds.saturating_mul(1_000),
            dials: AtomicU64::new(0),
            minted: AtomicU64::new(0),
        })
    }

    /// Which ecosystems can install.
    #[must_use]
    pub fn available(&self) -> Available {
        self.registries.available()
    }

    /// The registries fronted.
    #[must_use]
    pub fn registries(&self) -> &Registries {
        &self.registries
    }

    /// Upstream dials made so far.
    #[must_use]
    pub fn dials(&self) -> u64 {
        self.dials.load(Ordering::Relaxed)
    }

    /// Tokens minted so far.
    #[must_use]
    pub fn minted(&self) -> u64 {
        self.minted.load(Ordering::Relaxed)
    }

    fn now(&self) -> MonoMillis {
        MonoMillis(u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// The wall clock tokens expire on: every replica's reading of it is close enough.
    fn wall() -> UnixMillis {
        UnixMillis(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// A token for run `run`, living `SANDBOX_PACKAGE_TOKEN_TTL_SECONDS`.
    #[must_use]
    pub fn mint(&self, run: &str) -> String {
        self.minted.fetch_add(1, Ordering::Relaxed);
        mint_token(
            &self.key,
            run,
            UnixMillis(Self::wall().0.saturating_add(self.ttl_ms)),
        )
    }

    /// A token minted to expire at `expires_ms` on the wall clock (tests of expiry).
    #[must_use]
    pub fn mint_expiring_at(&self, run: &str, expires_ms: u64) -> String {
        mint_token(&self.key, run, UnixMillis(expires_ms))
    }

    fn check(&self, token: &str) -> Result<String, Box<Response>> {
        let run = check_token(&self.key, token, Self::wall()).map_err(|refused| {
            let message = match refused {
                TokenRefusal::Invalid => "not a package token of this deployment",
                TokenRefusal::Expired => {
                    "the package token has expired (SANDBOX_PACKAGE_TOKEN_TTL_SECONDS)"
                }
            };
            Box::new(refusal(
                StatusCode::FORBIDDEN,
                refused.code(),
                message.to_owned(),
            ))
        })?;
        if self
            .ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(&run)
        {
            return Err(Box::new(refusal(
                StatusCode::FORBIDDEN,
                "package_token_revoked",
                "the run this token was minted for has ended".to_owned(),
            )));
        }
        Ok(run)
    }

    /// Run `run` has ended: its token is refused from now on (PKG-3: a token is bound to its
    /// run), and what the broker remembered of it is dropped. Ended runs are remembered until
    /// their tokens would have expired anyway.
    pub fn end(&self, run: &str) {
        self.unreachable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(run);
        let now = self.now();
        let mut ended = self
            .ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ended.retain(|_, at| at.plus_ms(self.ttl_ms) > now);
        ended.insert(run.to_owned(), now);
    }

    fn mark_unreachable(&self, run: &str) {
        self.unreachable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(run.to_owned(), true);
    }

    /// GETs `url` (following file redirects when `follow`), at most `max` bytes.
    async fn fetch(
        &self,
        run: &str,
        url: &str,
        accept: &str,
        kind: Kind,
    ) -> Result<(String, Vec<u8>), Failure> {
        let (max, follow) = match kind {
            Kind::Index => (self.max_index, false),
            Kind::File => (self.max_file, true),
        };
        let mut url = reqwest::Url::parse(url).map_err(|_| Failure::NotFound)?;
        for _ in 0..=REDIRECTS_MAX {
            let host = format!(
                "{}:{}",
                url.host_str().unwrap_or("").to_ascii_lowercase(),
                url.port_or_known_default().unwrap_or(0)
            );
            if self
                .cooldowns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .refuses(&host, self.now())
            {
                self.mark_unreachable(run);
                return Err(Failure::Unreachable(host));
            }
            self.dials.fetch_add(1, Ordering::Relaxed);
            let sent = self
                .client
                .get(url.clone())
                .header(header::ACCEPT, accept)
                .send()
                .await;
            let response = match sent {
                Ok(response) => response,
                Err(error) if error.is_connect() || error.is_timeout() => {
                    self.cooldowns
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .failed(&host, self.now());
                    self.mark_unreachable(run);
                    return Err(Failure::Unreachable(host));
                }
                Err(_) => return Err(Failure::Truncated),
            };
            let status = response.status();
            if status.is_redirection() {
                let to = response
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|l| url.join(l).ok());
                let Some(to) = to else {
                    return Err(Failure::Upstream(status.as_u16()));
                };
                if !follow {
                    return Err(Failure::Redirected(to.host_str().unwrap_or("").to_owned()));
                }
                url = to;
                continue;
            }
            if status == reqwest::StatusCode::NOT_FOUND {
                return Err(Failure::NotFound);
            }
            if !status.is_success() {
                return Err(Failure::Upstream(status.as_u16()));
            }
            return read_body(response, kind, max).await;
        }
        Err(Failure::Upstream(310))
    }

    /// The files the upstream index lists for `project`.
    async fn project(&self, run: &str, project: &str) -> Result<Vec<Listed>, Failure> {
        let base = self.registries.pypi.as_deref().ok_or(Failure::NotFound)?;
        let project = corral_core::packages::requirement::normalize(project);
        if project.is_empty()
            || !project
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(Failure::NotFound);
        }
        let page = format!("{}/{project}/", base.trim_end_matches('/'));
        let (content_type, body) = self
            .fetch(
                run,
                &page,
                &format!("{PEP691}, text/html;q=0.1"),
                Kind::Index,
            )
            .await?;
        let page_url = reqwest::Url::parse(&page).map_err(|_| Failure::NotFound)?;
        parse_index(&content_type, &body, &page_url).map_err(Failure::IndexNotUnderstood)
    }
}

/// The registries this machine's package managers are configured with, for an unset
/// `SANDBOX_PACKAGE_REGISTRIES`: pip's index (its configuration, or its own default) and npm's.
/// A manager that cannot say leaves its ecosystem without a registry.
fn machine_defaults() -> Registries {
    let output = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| s.starts_with("http://") || s.starts_with("https://"))
    };
    let pypi = std::env::var("PIP_INDEX_URL")
        .ok()
        .or_else(|| {
            output(
                "/usr/bin/python3",
                &["-m", "pip", "config", "get", "global.index-url"],
            )
        })
        .or_else(|| {
            output(
                "/usr/bin/python3",
                &[
                    "-c",
                    "from pip._internal.models.index import PyPI; print(PyPI.simple_url)",
                ],
            )
        });
    let npm = output("npm", &["config", "get", "registry"]);
    Registries { pypi, npm }
}

/// Reads an index page: PEP 691 JSON, or PEP 503 HTML.
///
/// # Errors
/// Neither, or not readable as its type says.
pub fn parse_index(
    content_type: &str,
    body: &[u8],
    page: &reqwest::Url,
) -> Result<Vec<Listed>, String> {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let mut listed = if media == PEP691 {
        let document: Value = serde_json::from_slice(body).map_err(|e| format!("JSON: {e}"))?;
        let files = document["files"].as_array().ok_or("JSON without files")?;
        files
            .iter()
            .filter_map(|file| {
                let url = page.join(file["url"].as_str()?).ok()?;
                Some(Listed {
                    filename: file["filename"].as_str()?.to_owned(),
                    url: without_fragment(&url),
                    sha256: file["hashes"]["sha256"]
                        .as_str()
                        .map(str::to_ascii_lowercase),
                    requires_python: file["requires-python"].as_str().map(str::to_owned),
                    metadata: truthy(&file["core-metadata"]) || truthy(&file["dist-info-metadata"]),
                    yanked: match &file["yanked"] {
                        Value::Bool(true) => Some(String::new()),
                        Value::String(why) => Some(why.clone()),
                        _ => None,
                    },
                })
            })
            .collect::<Vec<_>>()
    } else if media == "text/html" || media == "application/vnd.pypi.simple.v1+html" {
        let text = std::str::from_utf8(body).map_err(|_| "HTML that is not UTF-8")?;
        anchors(text)
            .into_iter()
            .filter_map(|attributes| {
                let href = attributes.get("href")?;
                let url = page.join(&unescape(href)).ok()?;
                let filename = url.path_segments()?.next_back()?.to_owned();
                let sha256 = url
                    .fragment()
                    .and_then(|f| f.strip_prefix("sha256="))
                    .map(str::to_ascii_lowercase);
                Some(Listed {
                    filename: percent_decode(&filename),
                    url: without_fragment(&url),
                    sha256,
                    requires_python: attributes.get("data-requires-python").map(|v| unescape(v)),
                    metadata: attributes.contains_key("data-core-metadata")
                        || attributes.contains_key("data-dist-info-metadata"),
                    yanked: attributes.get("data-yanked").map(|v| unescape(v)),
                })
            })
            .collect()
    } else {
        return Err(format!("content type {media:?}"));
    };
    listed.retain(|l| {
        !l.filename.contains('/')
            && (l.filename.ends_with(".whl")
                || l.filename.ends_with(".tar.gz")
                || l.filename.ends_with(".zip"))
    });
    Ok(listed)
}

fn truthy(value: &Value) -> bool {
    matches!(value, Value::Bool(true) | Value::Object(_))
}

fn without_fragment(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    url.set_fragment(None);
    url.to_string()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The attributes of every `<a ...>` tag in `html`.
fn anchors(html: &str) -> Vec<BTreeMap<String, String>> {
    let mut found = Vec::new();
    let lower = html.to_ascii_lowercase();
    let mut at = 0;
    while let Some(start) = lower[at..].find("<a") {
        let start = at + start + 2;
        let Some(end) = lower[start..].find('>') else {
            break;
        };
        let end = start + end;
        at = end;
        if !lower[start..].starts_with(|c: char| c.is_ascii_whitespace()) {
            continue;
        }
        let tag = &html[start..end];
        let mut attributes = BTreeMap::new();
        let mut rest = tag.trim_start();
        while !rest.is_empty() {
            let name_end = rest
                .find(|c: char| c == '=' || c.is_ascii_whitespace() || c == '/')
                .unwrap_or(rest.len());
            let name = rest[..name_end].to_ascii_lowercase();
            rest = rest[name_end..].trim_start();
            let value = if let Some(after) = rest.strip_prefix('=') {
                let after = after.trim_start();
                let (value, remaining) = match after.chars().next() {
                    Some(quote @ ('"' | '\'')) => {
                        let close = after[1..].find(quote).map_or(after.len(), |i| i + 1);
                        (&after[1..close], after.get(close + 1..).unwrap_or(""))
                    }
                    _ => {
                        let close = after
                            .find(|c: char| c.is_ascii_whitespace())
                            .unwrap_or(after.len());
                        (&after[..close], &after[close..])
                    }
                };
                rest = remaining.trim_start();
                value.to_owned()
            } else {
                rest = rest.trim_start_matches('/').trim_start();
                String::new()
            };
            if !name.is_empty() {
                attributes.insert(name, value);
            }
        }
        found.push(attributes);
    }
    found
}

// ---------------------------------------------------------------------------------------------
// Handlers.

/// The routes under `/v1/packages/{token}/`.
pub fn routes(broker: Arc<Broker>) -> Router {
    Router::new()
        .route("/v1/packages/{token}/pypi/simple/{project}/", get(simple))
        .route("/v1/packages/{token}/pypi/simple/{project}", get(simple))
        .route(
            "/v1/packages/{token}/pypi/files/{project}/{filename}",
            get(file),
        )
        .route("/v1/packages/{token}/npm/{*path}", get(npm))
        .route("/v1/packages/{token}/status", get(status))
        .with_state(broker)
}

fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains(PEP691))
}

/// `GET /v1/packages/{token}/pypi/simple/{project}/`.
pub async fn simple(
    State(broker): State<Arc<Broker>>,
    Path((token, project)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let run = match broker.check(&token) {
        Ok(run) => run,
        Err(response) => return *response,
    };
    let listed = match broker.project(&run, &project).await {
        Ok(listed) => listed,
        Err(failure) => return failure.response(),
    };
    let project = corral_core::packages::requirement::normalize(&project);
    let link = |l: &Listed| format!("/v1/packages/{token}/pypi/files/{project}/{}", l.filename);
    if wants_json(&headers) {
        let files: Vec<Value> = listed
            .iter()
            .map(|l| {
                let mut file = json!({
                    "filename": l.filename,
                    "url": link(l),
                    "hashes": l.sha256.as_ref().map_or(json!({}), |h| json!({ "sha256": h })),
                });
                if let Some(requires) = &l.requires_python {
                    file["requires-python"] = json!(requires);
                }
                if l.metadata {
                    file["core-metadata"] = json!(true);
                }
                if let Some(why) = &l.yanked {
                    file["yanked"] = if why.is_empty() {
                        json!(true)
                    } else {
                        json!(why)
                    };
                }
                file
            })
            .collect();
        let body = json!({ "meta": { "api-version": "1.0" }, "name": project, "files": files });
        return ([(header::CONTENT_TYPE, PEP691)], body.to_string()).into_response();
    }
    let mut html = String::from("<!DOCTYPE html>\n<html><body>\n");
    for l in &listed {
        let fragment = l
            .sha256
            .as_ref()
            .map(|h| format!("#sha256={h}"))
            .unwrap_or_default();
        let mut attributes = String::new();
        if let Some(requires) = &l.requires_python {
            attributes.push_str(&format!(" data-requires-python=\"{}\"", escape(requires)));
        }
        if l.metadata {
            attributes.push_str(" data-core-metadata=\"true\"");
        }
        if let Some(why) = &l.yanked {
            attributes.push_str(&format!(" data-yanked=\"{}\"", escape(why)));
        }
        html.push_str(&format!(
            "<a href=\"{}{fragment}\"{attributes}>{}</a><br/>\n",
            escape(&link(l)),
            escape(&l.filename)
        ));
    }
    html.push_str("</body></html>\n");
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

/// `GET /v1/packages/{token}/pypi/files/{project}/{filename}`: a file the project's index lists,
/// or the PEP 658 metadata of one that has it.
pub async fn file(
    State(broker): State<Arc<Broker>>,
    Path((token, project, filename)): Path<(String, String, String)>,
) -> Response {
    let run = match broker.check(&token) {
        Ok(run) => run,
        Err(response) => return *response,
    };
    let listed = match broker.project(&run, &project).await {
        Ok(listed) => listed,
        Err(failure) => return failure.response(),
    };
    let (wanted, metadata) = match filename.strip_suffix(".metadata") {
        Some(wheel) => (wheel, true),
        None => (filename.as_str(), false),
    };
    let Some(entry) = listed.iter().find(|l| l.filename == wanted) else {
        return Failure::NotListed.response();
    };
    if metadata && !entry.metadata {
        return Failure::NotListed.response();
    }
    let url = if metadata {
        format!("{}.metadata", entry.url)
    } else {
        entry.url.clone()
    };
    let (_, body) = match broker.fetch(&run, &url, "*/*", Kind::File).await {
        Ok(fetched) => fetched,
        Err(failure) => return failure.response(),
    };
    if !metadata
        && let Some(expected) = &entry.sha256
        && corral_core::ids::hex(&Sha256::digest(&body)) != *expected
    {
        return Failure::HashMismatch(entry.filename.clone()).response();
    }
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from(body),
    )
        .into_response()
}

/// A successful answer's content type and body, at most `max` bytes, and whole.
async fn read_body(
    mut response: reqwest::Response,
    kind: Kind,
    max: u64,
) -> Result<(String, Vec<u8>), Failure> {
    if response.content_length().is_some_and(|n| n > max) {
        return Err(Failure::TooLarge { kind, max });
    }
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let expected = response.content_length();
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() as u64 > max {
                    return Err(Failure::TooLarge { kind, max });
                }
            }
            Ok(None) => break,
            Err(_) => return Err(Failure::Truncated),
        }
    }
    if expected.is_some_and(|n| n != body.len() as u64) {
        return Err(Failure::Truncated);
    }
    Ok((content_type, body))
}

/// `GET /v1/packages/{token}/npm/{*path}`: a packument (`{name}`, `@scope/{name}`), or a tarball
/// it lists (`-/files/{name}/{file}`).
pub async fn npm(
    State(broker): State<Arc<Broker>>,
    Path((token, path)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let run = match broker.check(&token) {
        Ok(run) => run,
        Err(response) => return *response,
    };
    let Some(base) = broker.registries.npm.clone() else {
        return Failure::NotFound.response();
    };
    let path = percent_decode(&path);
    let (name, file) = match path.strip_prefix("-/files/") {
        Some(rest) => match rest.rsplit_once('/') {
            Some((name, file)) => (name.to_owned(), Some(file.to_owned())),
            None => return Failure::NotFound.response(),
        },
        None => (path.clone(), None),
    };
    if corral_core::packages::requirement::parse_npm(&name)
        .map(|r| r.version.is_some())
        .unwrap_or(true)
    {
        return Failure::NotFound.response();
    }
    let escaped = name.replace('/', "%2f");
    let packument_url = format!("{}/{escaped}", base.trim_end_matches('/'));
    let (_, body) = match broker
        .fetch(&run, &packument_url, "application/json", Kind::Index)
        .await
    {
        Ok(fetched) => fetched,
        Err(failure) => return failure.response(),
    };
    let Ok(packument) = serde_json::from_slice::<Value>(&body) else {
        return Failure::IndexNotUnderstood("a packument that is not JSON".to_owned()).response();
    };
    match file {
        None => packument_answer(packument, &headers, &token, &name),
        Some(file) => tarball_answer(&broker, &run, &packument, &packument_url, file).await,
    }
}

/// The packument with every tarball's URL rewritten to this broker's, without attachments.
fn packument_answer(
    mut packument: Value,
    headers: &HeaderMap,
    token: &str,
    name: &str,
) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1:8000")
        .to_owned();
    if let Some(versions) = packument["versions"].as_object_mut() {
        for version in versions.values_mut() {
            let Some(tarball) = version["dist"]["tarball"].as_str() else {
                continue;
            };
            let file = tarball.rsplit('/').next().unwrap_or("").to_owned();
            version["dist"]["tarball"] = json!(format!(
                "http://{host}/v1/packages/{token}/npm/-/files/{name}/{file}"
            ));
        }
    }
    if let Some(object) = packument.as_object_mut() {
        object.remove("_attachments");
    }
    (
        [(header::CONTENT_TYPE, "application/json")],
        packument.to_string(),
    )
        .into_response()
}

/// The tarball `file` the packument lists, fetched and checked against its integrity.
async fn tarball_answer(
    broker: &Broker,
    run: &str,
    packument: &Value,
    packument_url: &str,
    file: String,
) -> Response {
    let listed = packument["versions"].as_object().and_then(|versions| {
        versions.values().find_map(|version| {
            let tarball = version["dist"]["tarball"].as_str()?;
            (tarball.rsplit('/').next() == Some(file.as_str())).then(|| {
                (
                    tarball.to_owned(),
                    version["dist"]["integrity"].as_str().map(str::to_owned),
                )
            })
        })
    });
    let Some((url, integrity)) = listed else {
        return Failure::NotListed.response();
    };
    let url = reqwest::Url::parse(packument_url)
        .ok()
        .and_then(|base| base.join(&url).ok())
        .map_or(url, |u| u.to_string());
    let (_, body) = match broker.fetch(run, &url, "*/*", Kind::File).await {
        Ok(fetched) => fetched,
        Err(failure) => return failure.response(),
    };
    if let Some(expected) = integrity.as_deref().and_then(|i| i.strip_prefix("sha512-"))
        && base64::engine::general_purpose::STANDARD.encode(Sha512::digest(&body)) != expected
    {
        return Failure::HashMismatch(file).response();
    }
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from(body),
    )
        .into_response()
}

/// `GET /v1/packages/{token}/status`: whether this token's run met an unreachable registry.
pub async fn status(State(broker): State<Arc<Broker>>, Path(token): Path<String>) -> Response {
    // An expired token may still ask: the install it served has just failed.
    let run = match check_token(&broker.key, &token, UnixMillis(0)) {
        Ok(run) => run,
        Err(_) => {
            return refusal(
                StatusCode::FORBIDDEN,
                "package_token_invalid",
                "not a package token of this deployment".to_owned(),
            );
        }
    };
    let unreachable = broker
        .unreachable
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&run)
        .copied()
        .unwrap_or(false);
    axum::Json(json!({ "registry_unreachable": unreachable })).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_03_html_and_json_indexes_list_the_same_files() {
        let page = reqwest::Url::parse("http://r.invalid/simple/demo/").unwrap();
        let html = br#"<html><body><a href="../../packages/demo-1.0-py3-none-any.whl#sha256=AB12" data-requires-python="&gt;=3.8" data-core-metadata="sha256=x">demo-1.0-py3-none-any.whl</a>
            <A HREF='/packages/demo-1.0.tar.gz'>demo-1.0.tar.gz</A><a href="/x/readme.txt">no</a></body></html>"#;
        let listed = parse_index("text/html; charset=utf-8", html, &page).unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(
            listed[0].url,
            "http://r.invalid/packages/demo-1.0-py3-none-any.whl"
        );
        assert_eq!(listed[0].sha256.as_deref(), Some("ab12"));
        assert_eq!(listed[0].requires_python.as_deref(), Some(">=3.8"));
        assert!(listed[0].metadata && !listed[1].metadata);
        let json = br#"{"meta":{"api-version":"1.0"},"name":"demo","files":[{"filename":"demo-1.0-py3-none-any.whl","url":"../../packages/demo-1.0-py3-none-any.whl","hashes":{"sha256":"ab12"},"core-metadata":{"sha256":"x"}}]}"#;
        let listed_json = parse_index(PEP691, json, &page).unwrap();
        assert_eq!(listed_json[0].url, listed[0].url);
        assert!(listed_json[0].metadata);
        assert!(parse_index("application/octet-stream", b"x", &page).is_err());
        assert!(parse_index(PEP691, b"{not json", &page).is_err());
    }
}
