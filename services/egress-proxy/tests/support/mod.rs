//! Shared fixtures for the proxy's end-to-end tests: a stub DNS server on loopback, the proxy
//! running in-process on a real socket, grants, a raw HTTP client, and network namespaces.
//!
//! Nothing here sends traffic anywhere but loopback and the namespaces a test creates.
#![allow(dead_code)]

pub use corral_testkit::dns as dns_stub;
pub mod netns;

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use corral_core::egress::{
    EgressSettings, ExecutionId, GrantRequest, GrantSigner, Policy, TokenTtl, resolve,
};
use corral_core::ids::ActorId;
use corral_core::time::UnixMillis;
use corral_egress_proxy::config::Limits;
use corral_egress_proxy::dns::HickoryResolve;
use corral_egress_proxy::key::{KeySource, KeyStore};
use corral_egress_proxy::observe::{LogSink, Observer, unix_now_ms};
use corral_egress_proxy::proxy::{Dialer, DirectDialer, Proxy};

/// A field key for tests; the API derives its signing key the same way.
pub const FIELD_KEY: &[u8] = b"corral-test-field-key-0123456789";
/// Another deployment's field key.
pub const OTHER_FIELD_KEY: &[u8] = b"some-other-deployment-key-987654";

/// The policy a deployment with these settings resolves to (as the API would mint under).
pub fn policy(mode: &str, ports: &str, cidrs: &str, hosts: &str) -> Policy {
    resolve(&EgressSettings {
        enabled: None,
        mode: Some(mode),
        allowed_ports: Some(ports),
        private_cidrs: Some(cidrs),
        allowed_hosts: Some(hosts),
        token_ttl_seconds: None,
        proxy_address_present: true,
        field_key_present: true,
    })
    .policy
}

/// Mints a grant for `policy`, issued at `now_ms`, with the key derived from `field_key`.
pub fn mint_at(field_key: &[u8], policy: &Policy, now_ms: u64) -> String {
    let signer = GrantSigner::from_field_key(field_key).expect("signer");
    let actor = ActorId("actor-1".to_owned());
    signer
        .mint(&GrantRequest {
            policy,
            provider_hint: None,
            run: "run-1",
            actor: &actor,
            execution_id: ExecutionId([7; 16]),
            policy_revision: 3,
            now: UnixMillis(now_ms),
            ttl: TokenTtl::DEFAULT,
        })
        .expect("mint")
        .token
}

/// A grant minted now with the test field key.
pub fn mint(policy: &Policy) -> String {
    mint_at(FIELD_KEY, policy, unix_now_ms())
}

/// The token with its claims bytes edited and the signature kept.
pub fn tamper(token: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims = URL_SAFE_NO_PAD.decode(parts[1]).expect("claims");
    edit(&mut claims);
    format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(&claims),
        parts[2]
    )
}

/// Writes the verifying key of `field_key` to `path` (atomically, as the API would).
pub fn write_key_file(path: &PathBuf, field_key: &[u8]) {
    let text = GrantSigner::from_field_key(field_key)
        .expect("signer")
        .verifier()
        .public_key_text();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write key");
    std::fs::rename(&tmp, path).expect("rename key");
}

/// A fresh directory for one test's files.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("corral-egress-{tag}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Short bounds so timeouts show up quickly in tests.
pub fn test_limits() -> Limits {
    Limits {
        header_max_bytes: 32 * 1024,
        header_timeout: Duration::from_millis(500),
        dns_timeout: Duration::from_millis(400),
        connect_timeout: Duration::from_millis(400),
        idle_timeout: Duration::from_millis(600),
        connections_max: 64,
    }
}

/// A proxy running in-process on a loopback port.
pub struct RunningProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its key file.
    pub key_file: PathBuf,
    /// Its counters.
    pub observer: Arc<Observer>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Starts a proxy on `runtime` resolving through `dns` with `dialer`; its key file holds the
/// test field key's verifying key.
pub fn start_proxy_with<D: Dialer>(
    runtime: &tokio::runtime::Runtime,
    dns: SocketAddr,
    limits: Limits,
    dialer: D,
) -> RunningProxy {
    let resolver = HickoryResolve::new(Some(&[dns]), limits.dns_timeout).expect("resolver");
    start_proxy_resolving(runtime, resolver, limits, dialer)
}

/// [`start_proxy_with`] with a resolver of the test's own.
pub fn start_proxy_resolving<D: Dialer>(
    runtime: &tokio::runtime::Runtime,
    resolver: HickoryResolve,
    limits: Limits,
    dialer: D,
) -> RunningProxy {
    let dir = temp_dir("proxy");
    let key_file = dir.join("verifying-key");
    write_key_file(&key_file, FIELD_KEY);
    let observer = Observer::new(LogSink::Discard);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let addr = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let proxy = Proxy::new(
            limits,
            KeyStore::new(KeySource::File(key_file.clone())),
            resolver,
            dialer,
            Arc::clone(&observer),
        );
        tokio::spawn(proxy.serve(listener, async {
            let _ = stopped.await;
        }));
        addr
    });
    RunningProxy {
        addr,
        key_file,
        observer,
        stop: Some(stop),
    }
}

/// Starts a proxy with the production dialer.
pub fn start_proxy(
    runtime: &tokio::runtime::Runtime,
    dns: SocketAddr,
    limits: Limits,
) -> RunningProxy {
    start_proxy_with(runtime, dns, limits, DirectDialer)
}

/// A multi-threaded runtime for one test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A parsed response head.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// `X-Corral-Egress-Reason`, if present.
    pub reason: Option<String>,
    /// The whole head text.
    pub head: String,
    /// What followed the head (up to EOF or the read bound).
    pub body: Vec<u8>,
}

/// Sends `request` on a new connection and reads the answer until the proxy closes (or 5 s).
pub fn exchange(proxy: SocketAddr, request: &[u8]) -> Response {
    let mut stream = TcpStream::connect(proxy).expect("connect to proxy");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream.write_all(request).expect("send");
    read_response(&mut stream)
}

/// Reads a response head and then everything until EOF (or the read timeout).
pub fn read_response(stream: &mut TcpStream) -> Response {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
        }
        if bytes.len() > 4 * 1024 * 1024 {
            break;
        }
    }
    parse_response(&bytes)
}

/// Reads only the response head (up to the empty line), leaving the connection open.
pub fn read_head_only(stream: &mut TcpStream) -> Response {
    let mut bytes = Vec::new();
    let mut byte = [0u8; 1];
    while !bytes.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(0) | Err(_) => break,
            Ok(_) => bytes.push(byte[0]),
        }
    }
    parse_response(&bytes)
}

fn parse_response(bytes: &[u8]) -> Response {
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(bytes.len(), |p| p + 4);
    let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let reason = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("x-corral-egress-reason")
            .then(|| value.trim().to_owned())
    });
    Response {
        status,
        reason,
        head,
        body: bytes[end..].to_vec(),
    }
}

/// A CONNECT request with an optional grant.
pub fn connect_request(target: &str, grant: Option<&str>) -> Vec<u8> {
    let auth = grant.map_or_else(String::new, |g| {
        format!("Proxy-Authorization: Bearer {g}\r\n")
    });
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n").into_bytes()
}

/// An absolute-form GET with a grant and a Host header.
pub fn get_request(url: &str, host: &str, grant: &str) -> Vec<u8> {
    format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: Bearer {grant}\r\nUser-Agent: corral-test\r\n\r\n").into_bytes()
}

/// The first address of an IP text.
pub fn ip(text: &str) -> IpAddr {
    text.parse().expect("ip")
}
