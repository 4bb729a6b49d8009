//! EGR-8's guards at dispatch, against real parts: the API's egress side with a real Valkey and a
//! real egress proxy (`corral egress-proxy`). A run gets no credential when the proxy does not
//! answer, when it holds no verifying key for the API's grants, or when the policy cannot be read;
//! and gets one once the proxy holds the key (so each refusal is the guard's, not a broken test).
//! Needs a Valkey server; without one it says why and skips, and CI requires it.

use std::io::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_api::egress::{Egress, ProxyState};
use corral_core::config::EgressSettings;
use corral_core::ids::ActorId;
use corral_core::time::UnixMillis;
use corral_store::ValkeyStore;
use corral_store::valkey_server::ValkeyServer;

const FIELD_KEY: &[u8] = b"egress-guards-field-key-0123456789";

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn configured(proxy_port: u16) -> EgressSettings {
    EgressSettings {
        mode: Some(String::from("public_internet")),
        proxy_url: Some(format!("http://127.0.0.1:{proxy_port}")),
        ..EgressSettings::default()
    }
}

/// Asserts that `run` got no credential, and that its report says `why`.
fn assert_no_grant(run: &corral_api::egress::RunEgress, why: &str) {
    assert_eq!(
        (run.grant.is_none(), run.effective_mode),
        (true, "isolated"),
        "{}",
        run.report
    );
    assert!(
        run.report["notes"].to_string().contains(why),
        "{why}: {}",
        run.report
    );
}

fn now() -> UnixMillis {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    UnixMillis(u64::try_from(since.as_millis()).expect("fits"))
}

/// `corral egress-proxy` on `port`, reading its verifying key from `key_file`.
struct Proxy(Child);

impl Proxy {
    fn start(port: u16, key_file: &Path) -> Proxy {
        let child = Command::new(env!("CARGO_BIN_EXE_corral"))
            .arg("egress-proxy")
            .env("CORRAL_EGRESS_LISTEN", format!("127.0.0.1:{port}"))
            .env("CORRAL_EGRESS_VERIFYING_KEY_FILE", key_file)
            .env_remove("CORRAL_EGRESS_VERIFYING_KEY_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the proxy starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the proxy never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        Proxy(child)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Makes the policy key hold a string, so that reading it as the policy's hash fails (WRONGTYPE).
fn break_policy(url: &str) {
    let address = url.trim_start_matches("redis://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(address).expect("valkey");
    let key = corral_store::policy::POLICY_KEY;
    write!(
        stream,
        "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$1\r\nx\r\n",
        key.len()
    )
    .expect("sent");
    let mut answer = [0u8; 5];
    std::io::Read::read_exact(&mut stream, &mut answer).expect("answered");
    assert_eq!(&answer, b"+OK\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egr_08_no_credential_unless_the_proxy_can_verify_it_and_the_policy_is_read() {
    let Some(server) = ValkeyServer::start_or_skip(
        "egr_08_no_credential_unless_the_proxy_can_verify_it_and_the_policy_is_read",
    ) else {
        return;
    };
    let store = ValkeyStore::connect(&server.url(), "guards")
        .await
        .expect("connects");
    let actor = ActorId(String::from("guarded"));

    // Nobody listens on the proxy's port.
    let closed = free_port();
    let egress = Egress::new(configured(closed), Some(FIELD_KEY));
    assert_eq!(egress.proxy_state().await, ProxyState::Unreachable);
    let run = egress.for_run(&store, "r1", &actor, None, now()).await;
    assert_no_grant(&run, "proxy_unreachable");

    // A real proxy that holds no verifying key (its key file is missing): it would refuse every
    // grant, so none is minted.
    let dir = std::env::temp_dir().join(format!("corral-egress-guards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let key_file = dir.join("verifying-key");
    let _ = std::fs::remove_file(&key_file);
    let port = free_port();
    let _proxy = Proxy::start(port, &key_file);
    let keyless = Egress::new(configured(port), Some(FIELD_KEY));
    assert_eq!(keyless.proxy_state().await, ProxyState::NoVerifyingKey);
    let run = keyless.for_run(&store, "r2", &actor, None, now()).await;
    assert_no_grant(&run, "proxy_key_unavailable");

    // Given the API's key, the same proxy verifies the probe and the run gets its grant.
    let key = keyless.verifying_key().expect("a signer");
    std::fs::write(&key_file, key).expect("key written");
    let keyed = Egress::new(configured(port), Some(FIELD_KEY));
    assert_eq!(keyed.proxy_state().await, ProxyState::Ready);
    let run = keyed.for_run(&store, "r3", &actor, None, now()).await;
    assert_eq!(
        (run.grant.is_some(), run.effective_mode),
        (true, "public_internet"),
        "{}",
        run.report
    );

    // The policy cannot be read: no credential, and the report says why.
    break_policy(&server.url());
    let run = keyed.for_run(&store, "r4", &actor, None, now()).await;
    assert_no_grant(&run, "policy_unavailable");
    let _ = std::fs::remove_dir_all(&dir);
}
