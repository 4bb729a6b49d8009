//! The package broker (PKG-3, PKG-5) served on loopback in front of real registries (pypiserver,
//! verdaccio), dead ports, and a canned HTTP/1.1 server whose answers a test writes byte by byte.
//! A test that needs pypiserver or verdaccio skips without it (`corral_testkit::skip`), and CI
//! (`CORRAL_REQUIRE_SERVICES`) requires them.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use corral_api::broker::Broker;
use corral_core::config::{PackageRegistries, PackageSettings};
use corral_core::packages::registries::CONNECT_TIMEOUT_MS;
use corral_testkit::Need;
use corral_testkit::registries::{
    PyPiServer, SilentPort, TempDir, Verdaccio, build_wheel, pypiserver_missing, refused_port,
    verdaccio_missing,
};
use reqwest::header::{self, HeaderMap, HeaderValue};
use serde_json::Value;
use sha2::{Digest as _, Sha256, Sha512};

/// PEP 691's JSON media type.
const PEP691: &str = "application/vnd.pypi.simple.v1+json";
/// Index and file limits large enough for every page and file these tests serve.
const ROOMY_INDEX_BYTES: u64 = 1 << 20;
const ROOMY_FILE_BYTES: u64 = 8 << 20;
/// How long the test's own client waits for the broker before the test fails.
const CLIENT_TIMEOUT_MS: u64 = 30_000;
/// The field key of the deployment every served broker belongs to.
const FIELD_KEY: &[u8] = b"the field key every replica of this deployment reads";
/// How long one canned connection may take to send its request.
const CANNED_READ_TIMEOUT_MS: u64 = 5_000;
/// The largest request head the canned server reads.
const CANNED_HEAD_MAX_BYTES: usize = 16 * 1024;

// ---------------------------------------------------------------------------------------------
// The broker on loopback, and what it answers.

/// A broker served on 127.0.0.1, and a client for it.
struct Served {
    broker: Arc<Broker>,
    /// `http://127.0.0.1:PORT`.
    base: String,
    client: reqwest::Client,
}

/// One answer of the broker.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The stable code of an error answer.
    fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no error code in {}", self.text()))
            .to_owned()
    }

    fn message(&self) -> String {
        self.json()["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no error message in {}", self.text()))
            .to_owned()
    }

    /// Asserts the status and the error code, saying what came instead.
    fn assert_refused(&self, status: u16, code: &str, what: &str) {
        assert_eq!(
            (self.status, self.code().as_str()),
            (status, code),
            "{what}: {}",
            self.text()
        );
    }
}

fn settings(registries: &str, max_index_bytes: u64, max_file_bytes: u64) -> PackageSettings {
    PackageSettings {
        broker_url: None,
        token_ttl_seconds: 300,
        max_index_bytes,
        max_file_bytes,
        registries: PackageRegistries::Configured(registries.to_owned()),
    }
}

fn client() -> reqwest::Client {
    corral_api::ensure_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_millis(CLIENT_TIMEOUT_MS))
        .build()
        .expect("a client")
}

impl Served {
    /// A broker fronting `registries` (the JSON of `SANDBOX_PACKAGE_REGISTRIES`), served.
    async fn start(registries: &str, max_index_bytes: u64, max_file_bytes: u64) -> Served {
        corral_api::ensure_crypto_provider();
        let broker = Arc::new(
            Broker::new(
                &settings(registries, max_index_bytes, max_file_bytes),
                Some(FIELD_KEY),
            )
            .expect("a broker"),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let address = listener.local_addr().expect("a bound address");
        let app = corral_api::broker::routes(broker.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.expect("the broker serves") });
        Served {
            broker,
            base: format!("http://{address}"),
            client: client(),
        }
    }

    /// A broker whose only registry is the PyPI index `simple_url`.
    async fn pypi(simple_url: &str, max_index_bytes: u64, max_file_bytes: u64) -> Served {
        let registries = serde_json::json!({ "pypi": simple_url }).to_string();
        Served::start(&registries, max_index_bytes, max_file_bytes).await
    }

    /// GET `path` (from `/v1/...`) with `headers`.
    async fn get_with(&self, path: &str, headers: &[(header::HeaderName, &str)]) -> Answer {
        let mut request = self.client.get(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(name, HeaderValue::from_str(value).expect("a header"));
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: the body: {e}"))
            .to_vec();
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.get_with(path, &[]).await
    }

    async fn simple(&self, token: &str, project: &str) -> Answer {
        self.get(&format!("/v1/packages/{token}/pypi/simple/{project}/"))
            .await
    }

    async fn file(&self, token: &str, project: &str, filename: &str) -> Answer {
        self.get(&format!(
            "/v1/packages/{token}/pypi/files/{project}/{filename}"
        ))
        .await
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Every `href="..."` value of `html`, in order.
fn hrefs(html: &str) -> Vec<String> {
    html.split("href=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap_or("").to_owned())
        .collect()
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned()
}

/// Text that deflate cannot shrink much: `bytes` characters of a fixed pseudo-random sequence.
fn noise(bytes: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut text = String::with_capacity(bytes + bytes / 64);
    for i in 0..bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push(char::from(
            ALPHABET[usize::try_from(state % 64).expect("< 64")],
        ));
        if i % 64 == 63 {
            text.push('\n');
        }
    }
    text
}

// ---------------------------------------------------------------------------------------------
// A canned upstream.

/// An HTTP/1.1 server on 127.0.0.1 that answers each connection's first request with the raw
/// bytes its path maps to (a 404 for any other path), then closes the connection.
struct Canned {
    address: SocketAddr,
    stopping: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
}

impl Canned {
    /// Serves the answers `routes(port)` gives: (request path, raw response).
    fn start(routes: impl FnOnce(u16) -> Vec<(String, Vec<u8>)>) -> Canned {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let address = listener.local_addr().expect("a bound address");
        let routes: BTreeMap<String, Vec<u8>> = routes(address.port()).into_iter().collect();
        let stopping = Arc::new(AtomicBool::new(false));
        let server = {
            let stopping = stopping.clone();
            std::thread::spawn(move || answer_each(&listener, &routes, &stopping))
        };
        Canned {
            address,
            stopping,
            server: Some(server),
        }
    }

    /// `http://127.0.0.1:PORT/simple/`.
    fn simple_url(&self) -> String {
        format!("http://{}/simple/", self.address)
    }
}

impl Drop for Canned {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the acceptor, which sees `stopping` and returns.
        if TcpStream::connect_timeout(&self.address, Duration::from_secs(1)).is_ok()
            && let Some(server) = self.server.take()
        {
            let _ = server.join();
        }
    }
}

fn answer_each(listener: &TcpListener, routes: &BTreeMap<String, Vec<u8>>, stopping: &AtomicBool) {
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(CANNED_READ_TIMEOUT_MS)));
        let Some(path) = request_path(&mut stream) else {
            continue;
        };
        let not_found = || answer("404 Not Found", "text/plain", b"not here");
        let response = routes.get(&path).cloned().unwrap_or_else(not_found);
        let _ = stream.write_all(&response);
        let _ = stream.flush();
    }
}

/// The path of the request on `stream`, once its head has arrived.
fn request_path(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > CANNED_HEAD_MAX_BYTES {
            return None;
        }
        let n = stream.read(&mut buffer).ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buffer[..n]);
    }
    let line = head.split(|&b| b == b'\r').next()?;
    let mut words = std::str::from_utf8(line).ok()?.split(' ');
    words.next()?;
    words.next().map(str::to_owned)
}

/// A complete HTTP/1.1 response.
fn answer(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(body);
    response
}

fn route(path: &str, response: Vec<u8>) -> (String, Vec<u8>) {
    (path.to_owned(), response)
}

/// A PEP 503 page linking each (href, attributes) with its file name as the text.
fn html_index(links: &[(&str, &str)]) -> Vec<u8> {
    let mut html = String::from("<!DOCTYPE html>\n<html><body>\n");
    for (href, attributes) in links {
        let text = href
            .split('#')
            .next()
            .and_then(|h| h.rsplit('/').next())
            .unwrap_or("");
        html.push_str(&format!("<a href=\"{href}\"{attributes}>{text}</a><br/>\n"));
    }
    html.push_str("</body></html>\n");
    answer("200 OK", "text/html; charset=utf-8", html.as_bytes())
}

// ---------------------------------------------------------------------------------------------
// pypiserver.

/// Wheels of `corral-demo` 1.0 and 2.0 behind a pypiserver; `None` after a skip.
struct Demo {
    _dir: TempDir,
    wheels: Vec<PathBuf>,
    server: PyPiServer,
}

impl Demo {
    fn start_or_skip(test: &str) -> Option<Demo> {
        if let Some(why) = pypiserver_missing() {
            corral_testkit::skip(test, Need::Services, &why);
            return None;
        }
        let dir = TempDir::new("broker-wheels");
        let wheels = ["1.0", "2.0"]
            .iter()
            .map(|version| {
                let module = format!("VERSION = {version:?}\n");
                build_wheel(
                    dir.path(),
                    "corral-demo",
                    version,
                    &[],
                    &[("corral_demo/__init__.py", module.as_str())],
                )
            })
            .collect();
        let server = PyPiServer::start(dir.path()).expect("pypiserver starts");
        Some(Demo {
            _dir: dir,
            wheels,
            server,
        })
    }

    /// Each wheel's file name and sha256.
    fn expected(&self) -> BTreeMap<String, String> {
        self.wheels
            .iter()
            .map(|w| {
                let bytes = std::fs::read(w).expect("the wheel");
                (file_name(w), sha256_hex(&bytes))
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_03_index_pages_point_at_the_broker_and_hide_the_registry() {
    let Some(demo) =
        Demo::start_or_skip("broker::pkg_03_index_pages_point_at_the_broker_and_hide_the_registry")
    else {
        return;
    };
    let expected = demo.expected();
    assert_eq!(expected.len(), 2);
    let served = Served::pypi(
        &demo.server.simple_url(),
        ROOMY_INDEX_BYTES,
        ROOMY_FILE_BYTES,
    )
    .await;
    let token = served.broker.mint("run-a");
    let prefix = format!("/v1/packages/{token}/pypi/files/corral-demo/");
    let port = demo.server.port();
    let hidden = [
        format!("127.0.0.1:{port}"),
        format!(":{port}"),
        "127.0.0.1".to_owned(),
        "/packages/corral_demo".to_owned(),
    ];

    // The HTML page: one link per wheel, under the broker, its sha256 as the fragment.
    let html = served.simple(&token, "corral-demo").await;
    assert_eq!(html.status, 200, "{}", html.text());
    let page = html.text();
    let mut seen = BTreeMap::new();
    for href in hrefs(&page) {
        let (link, fragment) = href.split_once('#').expect("a #sha256= fragment");
        let filename = link
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{link} is not under {prefix}"));
        seen.insert(filename.to_owned(), fragment.to_owned());
    }
    let fragments: BTreeMap<String, String> = expected
        .iter()
        .map(|(name, sha)| (name.clone(), format!("sha256={sha}")))
        .collect();
    assert_eq!(seen, fragments, "{page}");
    for text in &hidden {
        assert!(
            !page.contains(text.as_str()),
            "the HTML page shows {text}: {page}"
        );
    }

    // The PEP 691 page: the same files, the same hashes.
    let json = served
        .get_with(
            &format!("/v1/packages/{token}/pypi/simple/corral-demo/"),
            &[(header::ACCEPT, PEP691)],
        )
        .await;
    assert_eq!(json.status, 200, "{}", json.text());
    assert_eq!(
        json.headers
            .get(header::CONTENT_TYPE)
            .map(HeaderValue::as_bytes),
        Some(PEP691.as_bytes())
    );
    let document = json.json();
    let files = document["files"].as_array().expect("files");
    let mut listed = BTreeMap::new();
    for file in files {
        let filename = file["filename"].as_str().expect("a filename");
        let url = file["url"].as_str().expect("a url");
        assert_eq!(url, format!("{prefix}{filename}"));
        let sha = file["hashes"]["sha256"].as_str().expect("a sha256");
        listed.insert(filename.to_owned(), sha.to_owned());
    }
    assert_eq!(listed, expected, "{}", json.text());
    let text = json.text();
    for hide in &hidden {
        assert!(
            !text.contains(hide.as_str()),
            "the JSON page shows {hide}: {text}"
        );
    }

    // Each listed file, through the broker, is the wheel.
    for href in hrefs(&page) {
        let link = href.split('#').next().expect("a link");
        let file = served.get(link).await;
        assert_eq!(file.status, 200, "{link}: {}", file.text());
        let filename = link.rsplit('/').next().expect("a file name");
        assert_eq!(
            Some(&sha256_hex(&file.body)),
            expected.get(filename),
            "{link}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_03_a_metadata_sidecar_only_for_an_approved_wheel() {
    const TEST: &str = "broker::pkg_03_a_metadata_sidecar_only_for_an_approved_wheel";
    // A canned index that announces core metadata for one wheel and not the other; both sidecars
    // exist upstream, so a refusal is the broker's.
    let with = "meta-1.0-py3-none-any.whl";
    let without = "meta-2.0-py3-none-any.whl";
    let sidecar = b"Metadata-Version: 2.1\nName: meta\nVersion: 1.0\n".to_vec();
    let canned = Canned::start(|_| {
        let with_href = format!("/files/{with}");
        let without_href = format!("/files/{without}");
        vec![
            route(
                "/simple/meta/",
                html_index(&[
                    (&with_href, " data-core-metadata=\"true\""),
                    (&without_href, ""),
                ]),
            ),
            route(
                &format!("/files/{with}.metadata"),
                answer("200 OK", "text/plain", &sidecar),
            ),
            route(
                &format!("/files/{without}.metadata"),
                answer("200 OK", "text/plain", b"Metadata-Version: 2.1\n"),
            ),
        ]
    });
    let served = Served::pypi(&canned.simple_url(), ROOMY_INDEX_BYTES, ROOMY_FILE_BYTES).await;
    let token = served.broker.mint("run-a");
    let served_sidecar = served
        .file(&token, "meta", &format!("{with}.metadata"))
        .await;
    assert_eq!(served_sidecar.status, 200, "{}", served_sidecar.text());
    assert_eq!(served_sidecar.body, sidecar);
    let dials = served.broker.dials();
    served
        .file(&token, "meta", &format!("{without}.metadata"))
        .await
        .assert_refused(404, "package_file_not_listed", "an unannounced sidecar");
    assert_eq!(
        served.broker.dials(),
        dials + 1,
        "only the index is fetched for an unannounced sidecar"
    );

    // pypiserver announces no core metadata: no sidecar, and no file its index does not list.
    let Some(demo) = Demo::start_or_skip(TEST) else {
        return;
    };
    let served = Served::pypi(
        &demo.server.simple_url(),
        ROOMY_INDEX_BYTES,
        ROOMY_FILE_BYTES,
    )
    .await;
    let token = served.broker.mint("run-a");
    let wheel = file_name(&demo.wheels[0]);
    let whole = served.file(&token, "corral-demo", &wheel).await;
    assert_eq!(whole.status, 200, "the wheel itself: {}", whole.text());
    served
        .file(&token, "corral-demo", &format!("{wheel}.metadata"))
        .await
        .assert_refused(404, "package_file_not_listed", "pypiserver's sidecar");
    served
        .file(&token, "corral-demo", "corral_demo-3.0-py3-none-any.whl")
        .await
        .assert_refused(404, "package_file_not_listed", "an unlisted wheel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_03_an_index_or_a_file_over_its_limit_is_refused_naming_it() {
    const TEST: &str = "broker::pkg_03_an_index_or_a_file_over_its_limit_is_refused_naming_it";
    if let Some(why) = pypiserver_missing() {
        corral_testkit::skip(TEST, Need::Services, &why);
        return;
    }
    let dir = TempDir::new("broker-big-wheel");
    let module = format!("'''\n{}'''\n", noise(20_000));
    let wheel = build_wheel(
        dir.path(),
        "corral-big",
        "1.0",
        &[],
        &[("corral_big/__init__.py", module.as_str())],
    );
    let wheel_bytes = std::fs::metadata(&wheel).expect("the wheel").len();
    assert!(
        wheel_bytes > 10_000,
        "the wheel is only {wheel_bytes} bytes"
    );
    let server = PyPiServer::start(dir.path()).expect("pypiserver starts");

    let small_index = Served::pypi(&server.simple_url(), 100, ROOMY_FILE_BYTES).await;
    let token = small_index.broker.mint("run-a");
    let refused = small_index.simple(&token, "corral-big").await;
    refused.assert_refused(502, "package_index_too_large", "a 100-byte index limit");
    assert!(
        refused
            .message()
            .contains("SANDBOX_PACKAGE_MAX_INDEX_BYTES"),
        "{}",
        refused.text()
    );

    let small_file = Served::pypi(&server.simple_url(), ROOMY_INDEX_BYTES, wheel_bytes / 2).await;
    let token = small_file.broker.mint("run-a");
    let page = small_file.simple(&token, "corral-big").await;
    assert_eq!(
        page.status,
        200,
        "the index is within its limit: {}",
        page.text()
    );
    let refused = small_file
        .file(&token, "corral-big", &file_name(&wheel))
        .await;
    refused.assert_refused(502, "package_file_too_large", "a file over its limit");
    assert!(
        refused.message().contains("SANDBOX_PACKAGE_MAX_FILE_BYTES"),
        "{}",
        refused.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_03_expired_ended_and_forged_tokens_are_refused() {
    let canned = Canned::start(|_| {
        vec![route(
            "/simple/ok/",
            html_index(&[("/files/ok-1.0-py3-none-any.whl", "")]),
        )]
    });
    let served = Served::pypi(&canned.simple_url(), ROOMY_INDEX_BYTES, ROOMY_FILE_BYTES).await;

    let ending = served.broker.mint("run-a");
    let before = served.simple(&ending, "ok").await;
    assert_eq!(before.status, 200, "before the run ends: {}", before.text());
    served.broker.end("run-a");
    let dials = served.broker.dials();
    served.simple(&ending, "ok").await.assert_refused(
        403,
        "package_token_revoked",
        "an ended run's token",
    );

    let expired = served.broker.mint_expiring_at("run-b", 0);
    served.simple(&expired, "ok").await.assert_refused(
        403,
        "package_token_expired",
        "an expired token",
    );

    let good = served.broker.mint("run-c");
    let last = good.chars().last().expect("a token");
    let changed = format!(
        "{}{}",
        &good[..good.len() - 1],
        if last == 'A' { 'B' } else { 'A' }
    );
    assert_ne!(changed, good);
    served.simple(&changed, "ok").await.assert_refused(
        403,
        "package_token_invalid",
        "one signature character changed",
    );
    let other_run = good.replacen("run-c", "run-d", 1);
    assert_ne!(other_run, good);
    served.simple(&other_run, "ok").await.assert_refused(
        403,
        "package_token_invalid",
        "another run's name",
    );

    let broker_of = |field_key: &[u8]| {
        Broker::new(
            &settings(
                &serde_json::json!({ "pypi": canned.simple_url() }).to_string(),
                ROOMY_INDEX_BYTES,
                ROOMY_FILE_BYTES,
            ),
            Some(field_key),
        )
        .expect("another broker")
    };
    let elsewhere = broker_of(b"another deployment's field key, as long as ours").mint("run-c");
    served.simple(&elsewhere, "ok").await.assert_refused(
        403,
        "package_token_invalid",
        "another broker's token",
    );
    assert_eq!(
        served.broker.dials(),
        dials,
        "a refused token dials nothing"
    );

    let still = served.simple(&good, "ok").await;
    assert_eq!(still.status, 200, "the unchanged token: {}", still.text());
    // Another replica of this deployment minted it: the installer reached this one.
    let replica = broker_of(FIELD_KEY).mint("run-e");
    let across = served.simple(&replica, "ok").await;
    assert_eq!(
        across.status,
        200,
        "another replica's token: {}",
        across.text()
    );
}

/// Asserts a 503 that says the registry is unreachable, with no `Retry-After`.
fn assert_unreachable(answer: &Answer, what: &str) {
    answer.assert_refused(503, "package_registry_unreachable", what);
    assert_eq!(
        answer
            .headers
            .get("x-kaizen-package-registry")
            .map(HeaderValue::as_bytes),
        Some(&b"unreachable"[..]),
        "{what}"
    );
    assert!(
        answer.headers.get(header::RETRY_AFTER).is_none(),
        "{what}: a Retry-After"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_05_an_unreachable_registry_answers_503_and_is_not_dialled_again_during_the_cooldown() {
    let silent = SilentPort::start();
    let served = Served::pypi(
        &format!("http://127.0.0.1:{}/simple/", silent.port()),
        ROOMY_INDEX_BYTES,
        ROOMY_FILE_BYTES,
    )
    .await;
    let token = served.broker.mint("run-a");
    let bystander = served.broker.mint("run-b");

    let started = Instant::now();
    let first = served.simple(&token, "corral-demo").await;
    let first_ms = started.elapsed().as_millis();
    assert_unreachable(&first, "a silent registry");
    assert!(
        (u128::from(CONNECT_TIMEOUT_MS) - 1_000..10_000).contains(&first_ms),
        "a silent registry answered after {first_ms} ms"
    );
    assert_eq!(served.broker.dials(), 1);
    assert_eq!(silent.wait_accepted(1, Duration::from_secs(5)), 1);

    let started = Instant::now();
    let second = served.simple(&token, "corral-demo").await;
    let second_ms = started.elapsed().as_millis();
    assert_unreachable(&second, "a silent registry, cooling down");
    assert!(
        second_ms < 1_000,
        "the cooldown answered after {second_ms} ms"
    );
    assert_eq!(served.broker.dials(), 1, "dialled during the cooldown");
    assert_eq!(
        silent.wait_accepted(2, Duration::from_millis(300)),
        1,
        "a connection during the cooldown"
    );

    let status = served.get(&format!("/v1/packages/{token}/status")).await;
    assert_eq!(status.status, 200, "{}", status.text());
    assert_eq!(
        status.json(),
        serde_json::json!({ "registry_unreachable": true })
    );
    let status = served
        .get(&format!("/v1/packages/{bystander}/status"))
        .await;
    assert_eq!(status.status, 200, "{}", status.text());
    assert_eq!(
        status.json(),
        serde_json::json!({ "registry_unreachable": false })
    );

    // A port that refuses: the same answer, at once, and no second dial.
    let refused = Served::pypi(
        &format!("http://127.0.0.1:{}/simple/", refused_port()),
        ROOMY_INDEX_BYTES,
        ROOMY_FILE_BYTES,
    )
    .await;
    let token = refused.broker.mint("run-a");
    assert_unreachable(
        &refused.simple(&token, "corral-demo").await,
        "a refusing registry",
    );
    assert_eq!(refused.broker.dials(), 1);
    assert_unreachable(
        &refused.simple(&token, "corral-demo").await,
        "a refusing registry, cooling down",
    );
    assert_eq!(refused.broker.dials(), 1, "dialled during the cooldown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_03_bad_upstream_answers_end_in_specific_errors() {
    let zeros = "0".repeat(64);
    let canned = Canned::start(|port| {
        vec![
            route(
                "/simple/ctype/",
                answer(
                    "200 OK",
                    "application/octet-stream",
                    b"<a href=\"/files/ctype-1.0-py3-none-any.whl\">x</a>",
                ),
            ),
            route(
                "/simple/redirect/",
                format!(
                    "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.2:{port}/simple/x/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                .into_bytes(),
            ),
            route(
                "/simple/hash/",
                html_index(&[(&format!("/files/hash-1.0-py3-none-any.whl#sha256={zeros}"), "")]),
            ),
            route(
                "/files/hash-1.0-py3-none-any.whl",
                answer("200 OK", "application/octet-stream", b"not the bytes hashed"),
            ),
            route(
                "/simple/short/",
                html_index(&[("/files/short-1.0-py3-none-any.whl", "")]),
            ),
            route(
                "/files/short-1.0-py3-none-any.whl",
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n0123456789".to_vec(),
            ),
            route(
                "/simple/json/",
                answer("200 OK", PEP691, b"{\"files\": [this is not JSON"),
            ),
        ]
    });
    let served = Served::pypi(&canned.simple_url(), ROOMY_INDEX_BYTES, ROOMY_FILE_BYTES).await;
    let token = served.broker.mint("run-a");

    served.simple(&token, "ctype").await.assert_refused(
        502,
        "package_index_malformed",
        "an index served as application/octet-stream",
    );
    let redirected = served.simple(&token, "redirect").await;
    redirected.assert_refused(
        502,
        "package_registry_redirected",
        "an index redirected to another host",
    );
    assert!(
        redirected.message().contains("127.0.0.2"),
        "{}",
        redirected.text()
    );
    served
        .file(&token, "hash", "hash-1.0-py3-none-any.whl")
        .await
        .assert_refused(502, "package_hash_mismatch", "a file unlike its hash");
    served
        .file(&token, "short", "short-1.0-py3-none-any.whl")
        .await
        .assert_refused(502, "package_download_truncated", "a file that ends early");
    served.simple(&token, "json").await.assert_refused(
        502,
        "package_index_malformed",
        "a PEP 691 index that is not JSON",
    );
}

// ---------------------------------------------------------------------------------------------
// verdaccio.

/// The packument of `name` as verdaccio itself answers it.
async fn packument_upstream(registry: &Verdaccio, escaped: &str) -> Value {
    let response = client()
        .get(format!("{}/{escaped}", registry.url()))
        .send()
        .await
        .expect("verdaccio answers");
    assert_eq!(response.status().as_u16(), 200, "verdaccio's {escaped}");
    response.json().await.expect("a JSON packument")
}

/// Asserts that the broker's packument of `name` (requested as `escaped`) points its 1.0.0
/// tarball at the broker under `host`, keeps verdaccio's integrity and hides verdaccio's port,
/// and that the tarball through the broker has that integrity.
async fn assert_brokered(
    served: &Served,
    registry: &Verdaccio,
    token: &str,
    name: &str,
    escaped: &str,
    file: &str,
) {
    let host = "corral-broker.test:8000";
    let upstream = packument_upstream(registry, escaped).await;
    let integrity = upstream["versions"]["1.0.0"]["dist"]["integrity"]
        .as_str()
        .expect("verdaccio gives an integrity")
        .to_owned();
    let answer = served
        .get_with(
            &format!("/v1/packages/{token}/npm/{escaped}"),
            &[(header::HOST, host)],
        )
        .await;
    assert_eq!(answer.status, 200, "{name}: {}", answer.text());
    let packument = answer.json();
    let dist = &packument["versions"]["1.0.0"]["dist"];
    let path = format!("/v1/packages/{token}/npm/-/files/{name}/{file}");
    assert_eq!(
        dist["tarball"].as_str(),
        Some(format!("http://{host}{path}").as_str()),
        "{name}"
    );
    assert_eq!(
        dist["integrity"].as_str(),
        Some(integrity.as_str()),
        "{name}"
    );
    let text = answer.text();
    let port = registry.port();
    for hidden in [format!(":{port}"), "127.0.0.1".to_owned()] {
        assert!(
            !text.contains(hidden.as_str()),
            "{name}: the packument shows {hidden}: {text}"
        );
    }

    let tarball = served.get(&path).await;
    assert_eq!(tarball.status, 200, "{name}: {}", tarball.text());
    let digest = base64::engine::general_purpose::STANDARD.encode(Sha512::digest(&tarball.body));
    assert_eq!(format!("sha512-{digest}"), integrity, "{name}: the tarball");

    served
        .get(&format!(
            "/v1/packages/{token}/npm/-/files/{name}/not-listed-9.9.9.tgz"
        ))
        .await
        .assert_refused(
            404,
            "package_file_not_listed",
            "a tarball the packument lacks",
        );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_03_npm_packuments_point_at_the_broker_and_keep_integrity() {
    const TEST: &str = "broker::pkg_03_npm_packuments_point_at_the_broker_and_keep_integrity";
    if let Some(why) = verdaccio_missing() {
        corral_testkit::skip(TEST, Need::Services, &why);
        return;
    }
    let registry = Verdaccio::start().expect("verdaccio starts");
    registry
        .publish("corral-left", "1.0.0", &[], &[])
        .expect("publishes corral-left");
    registry
        .publish("@corral/right", "1.0.0", &[], &[])
        .expect("publishes @corral/right");
    let registries = serde_json::json!({ "npm": format!("{}/", registry.url()) }).to_string();
    let served = Served::start(&registries, ROOMY_INDEX_BYTES, ROOMY_FILE_BYTES).await;
    let token = served.broker.mint("run-a");

    assert_brokered(
        &served,
        &registry,
        &token,
        "corral-left",
        "corral-left",
        "corral-left-1.0.0.tgz",
    )
    .await;
    assert_brokered(
        &served,
        &registry,
        &token,
        "@corral/right",
        "@corral%2fright",
        "right-1.0.0.tgz",
    )
    .await;
}
