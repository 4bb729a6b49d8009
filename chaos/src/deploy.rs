//! The deployment under test, from the real binaries: Valkey, three API replicas each reaching
//! Valkey through its own [`Link`](crate::link::Link), the controller with the `local` backend
//! and its warm pool of worker processes, and the egress proxy. Workspaces live on a small tmpfs
//! of their own so that the object store can be filled and made read-only.
//!
//! Every process is a child of the harness (a child subreaper, so that workers orphaned by a
//! killed controller stay its descendants) and carries [`MARKER`] in its environment, which is how
//! [`crate::hygiene`] finds what a run left behind.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::link::Link;

/// The environment variable every process of a chaos run carries: its directory.
pub const MARKER: &str = "CORRAL_CHAOS_RUN";
/// How many API replicas.
pub const REPLICAS: usize = 3;
/// The workspace store's size: small, so that it can be filled.
pub const STORE_BYTES: u64 = 256 << 20;

/// Where workspaces are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// A `file://` store on a tmpfs of its own, which can be filled and made read-only.
    Local,
    /// An S3-compatible server (moto's), which can be paused.
    S3,
}

/// moto's S3 server, serving one request at a time so that its create-only put is atomic, as
/// S3's is (see `services/api/tests/workspaces.rs`).
const MOTO_SERVER: &str = "
import moto.server as server
run_simple = server.run_simple
server.run_simple = lambda *args, **kwargs: run_simple(*args, **dict(kwargs, threaded=False))
server.main(__import__('sys').argv[1:])
";
/// The workspaces' bucket on the S3 variant.
const BUCKET: &str = "corral-chaos";

/// The pool's settings for a chaos run.
#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    /// `SANDBOX_WARM_POOL_MIN`.
    pub warm_min: u32,
    /// `SANDBOX_POOL_MAX_ALLOCATED`.
    pub ceiling: u32,
    /// `SANDBOX_MAX_CONCURRENT_PER_MEMBER`.
    pub member_limit: u32,
    /// `SANDBOX_LEASE_HEARTBEAT_SECONDS`.
    pub heartbeat_seconds: u32,
    /// `SANDBOX_LEASE_TTL_SECONDS`.
    pub lease_ttl_seconds: u32,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            warm_min: 3,
            ceiling: 8,
            member_limit: 1,
            heartbeat_seconds: 1,
            lease_ttl_seconds: 4,
        }
    }
}

/// One started process, restartable with the same command.
pub struct Proc {
    /// What it is (`api-1`, `controller`, ...).
    pub name: String,
    command: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    /// The running child, if any.
    pub child: Option<Child>,
    /// The port it serves, for those whose readiness the deployment waits for again.
    pub port: u16,
}

impl Proc {
    /// A process of the run (carrying `marker`) that [`Proc::start`] starts, logging to `log`.
    pub fn new<'a>(
        name: &str,
        command: impl IntoIterator<Item = &'a str>,
        marker: &(String, String),
        log: &Path,
    ) -> Self {
        Self {
            name: name.to_owned(),
            command: command.into_iter().map(str::to_owned).collect(),
            env: vec![marker.clone()],
            log: log.to_owned(),
            child: None,
            port: 0,
        }
    }

    /// Starts it.
    ///
    /// # Errors
    /// When it cannot be spawned.
    pub fn start(&mut self) -> Result<(), String> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = Command::new(&self.command[0])
            .args(&self.command[1..])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.name))?;
        self.child = Some(child);
        Ok(())
    }

    /// Its pid while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok())
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again (after [`Proc::kill`]).
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.start()
    }
}

/// The running deployment.
pub struct Deployment {
    /// The run's directory.
    pub dir: PathBuf,
    /// The corral binary.
    pub corral: PathBuf,
    /// Valkey's port.
    pub valkey_port: u16,
    /// Valkey's URL (direct: the controller's and the harness's).
    pub valkey_url: String,
    /// Valkey.
    pub valkey: Proc,
    /// The API replicas.
    pub apis: Vec<Proc>,
    /// Each replica's URL.
    pub api_urls: Vec<String>,
    /// Each replica's link to Valkey, which a partition cuts.
    pub links: Vec<Link>,
    /// The controller.
    pub controller: Proc,
    /// The egress proxy.
    pub proxy: Proc,
    /// The caller credential.
    pub caller: String,
    /// The pool's settings.
    pub pool: PoolSettings,
    /// Where workspaces are kept (a tmpfs) on the local variant.
    pub store: PathBuf,
    /// Which store.
    pub store_kind: StoreKind,
    /// The S3 server on the S3 variant.
    pub s3: Option<Proc>,
    /// Each replica's clock file ([`crate::clock`]); empty when the clock shim could not be built
    /// (no C compiler), and then no clock is stepped.
    pub clock_files: Vec<PathBuf>,
    /// coturn, the live view's TURN server, when this machine has it (else no browser sessions).
    pub coturn: Option<Proc>,
    /// pypiserver serving the package installs ask for, when this machine has it (else no
    /// installs).
    pub pypi: Option<Proc>,
    /// The egress load's far side, when its link could be made (else no fetches).
    pub far: Option<crate::egress::Far>,
}

/// Where coturn's server is.
const TURNSERVER: &str = "/usr/bin/turnserver";

/// How long a browser session may stay idle before a replica's sweep closes it.
pub const BROWSER_IDLE_SECONDS: u64 = 20;

/// Whether a TURN server on `127.0.0.1:port` answers a STUN Binding request within 200 ms.
fn stun_answers(port: u16) -> bool {
    use corral_core::browser::turn::{binding_request, is_binding_success};
    let Ok(socket) = std::net::UdpSocket::bind("127.0.0.1:0") else {
        return false;
    };
    let transaction = *b"corral-chaos";
    let mut reply = [0u8; 576];
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .is_ok()
        && socket
            .send_to(&binding_request(transaction), ("127.0.0.1", port))
            .is_ok()
        && socket
            .recv(&mut reply)
            .is_ok_and(|n| is_binding_success(&reply[..n], &transaction))
}

/// coturn on loopback with `corral up`'s configuration and a secret of its own in `dir`: the
/// process and its `turn:` URL.
fn start_coturn(
    dir: &Path,
    marker: &(String, String),
    logs: &Path,
) -> Result<(Proc, String), String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let secret = secret(&dir.join("turn-secret"))?;
    let port = free_port()?;
    let config = dir.join("turnserver.conf");
    let text = corral_core::browser::turn::loopback_config(
        port,
        &secret,
        &dir.join("turnserver.pid").display().to_string(),
    );
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&config)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .map_err(|e| format!("{}: {e}", config.display()))?;
    let mut coturn = Proc {
        name: "coturn".to_owned(),
        command: vec![
            TURNSERVER.to_owned(),
            "-c".to_owned(),
            config.display().to_string(),
        ],
        env: vec![marker.clone()],
        log: logs.join("coturn.log"),
        child: None,
        port,
    };
    coturn.start()?;
    wait_for("coturn", Duration::from_secs(10), || stun_answers(port))?;
    Ok((coturn, format!("turn:127.0.0.1:{port}")))
}

/// pypiserver serving one wheel, [`crate::load::PACKAGE`] 1.0, whose module's `MARK` is `mark`:
/// the process and its index URL.
fn start_pypi(
    dir: &Path,
    mark: &str,
    marker: &(String, String),
    logs: &Path,
) -> Result<(Proc, String), String> {
    let wheels = dir.join("wheels");
    fs::create_dir_all(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
    corral_testkit::registries::build_wheel(
        &wheels,
        crate::load::PACKAGE,
        "1.0",
        &[],
        &[(
            &format!("{}.py", crate::load::PACKAGE_MODULE),
            &format!("MARK = {mark:?}\n"),
        )],
    );
    let port = free_port()?;
    let command = corral_testkit::registries::pypiserver_command(&wheels, port);
    let mut pypi = Proc {
        name: "pypiserver".to_owned(),
        command: std::iter::once(command.get_program())
            .chain(command.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        env: vec![marker.clone()],
        log: logs.join("pypiserver.log"),
        child: None,
        port,
    };
    pypi.start()?;
    let url = format!("http://127.0.0.1:{port}");
    wait_for("pypiserver", Duration::from_secs(60), || {
        request(&url, "GET", corral_testkit::registries::PYPISERVER_HEALTH)
            .is_some_and(|(s, _)| s == 200)
    })?;
    Ok((pypi, format!("{url}/simple/")))
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free port: {e}"))
}

fn secret(path: &Path) -> Result<String, String> {
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    fs::write(path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text)
}

/// Polls `ready` until it holds, for at most `bound`.
///
/// # Errors
/// When it never held.
pub fn wait_for(
    what: &str,
    bound: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{what} was not ready within {bound:?}"))
}

/// `method path` with an empty body at `url`: the status and the body.
fn request(url: &str, method: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let address = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

impl Deployment {
    /// Starts everything in `dir` (which [`crate::hygiene`] has made and checked) and waits until
    /// the pool has its warm minimum.
    ///
    /// # Errors
    /// When a part does not start or never becomes ready.
    pub fn start(
        dir: &Path,
        corral: &Path,
        pool: PoolSettings,
        store_kind: StoreKind,
        mark: &str,
    ) -> Result<Self, String> {
        let valkey_binary = corral_store::valkey_server::find_binary()
            .ok_or("no valkey-server (scripts/setup-services installs it)")?;
        for sub in ["valkey", "workers", "logs", "store"] {
            fs::create_dir_all(dir.join(sub)).map_err(|e| format!("{sub}: {e}"))?;
        }
        let store = dir.join("store");
        let caller = secret(&dir.join("api-token"))?;
        secret(&dir.join("admin-token"))?;
        secret(&dir.join("worker-token"))?;
        secret(&dir.join("field-key"))?;
        let marker = (MARKER.to_owned(), dir.display().to_string());
        let logs = dir.join("logs");

        let valkey_port = free_port()?;
        let valkey_url = format!("redis://127.0.0.1:{valkey_port}");
        let mut valkey = Proc {
            name: "valkey".to_owned(),
            command: [
                valkey_binary.display().to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--port".into(),
                valkey_port.to_string(),
                "--dir".into(),
                dir.join("valkey").display().to_string(),
                // A snapshot each second with a change: what "restarted from its snapshot" loads.
                "--save".into(),
                "1 1".into(),
                "--appendonly".into(),
                "no".into(),
            ]
            .to_vec(),
            env: vec![marker.clone()],
            log: logs.join("valkey.log"),
            child: None,
            port: 0,
        };
        valkey.start()?;
        wait_for("valkey", Duration::from_secs(10), || {
            corral_store::valkey_server::ping(valkey_port)
        })?;

        let file = |name: &str| dir.join(name).display().to_string();
        // The workspaces' store.
        let mut s3 = None;
        let store_env: Vec<(String, String)> = match store_kind {
            StoreKind::Local => {
                crate::hygiene::mount_tmpfs(&store, STORE_BYTES)?;
                vec![(
                    "CORRAL_WORKSPACE_URL".to_owned(),
                    format!("file://{}", store.display()),
                )]
            }
            StoreKind::S3 => {
                let port = free_port()?;
                let mut moto = Proc {
                    name: "s3".to_owned(),
                    command: vec![
                        "python3".to_owned(),
                        "-c".to_owned(),
                        MOTO_SERVER.to_owned(),
                        "-H".to_owned(),
                        "127.0.0.1".to_owned(),
                        "-p".to_owned(),
                        port.to_string(),
                    ],
                    env: vec![marker.clone()],
                    log: logs.join("s3.log"),
                    child: None,
                    port: 0,
                };
                moto.start()?;
                let url = format!("http://127.0.0.1:{port}");
                wait_for("the S3 server", Duration::from_secs(60), || {
                    request(&url, "GET", "/").is_some()
                })?;
                let (created, _) = request(&url, "PUT", &format!("/{BUCKET}"))
                    .ok_or("the S3 server did not answer the bucket's creation")?;
                if created != 200 {
                    return Err(format!("creating the bucket: HTTP {created}"));
                }
                s3 = Some(moto);
                [
                    ("CORRAL_WORKSPACE_URL", format!("s3://{BUCKET}/workspaces")),
                    ("AWS_ENDPOINT", url),
                    ("AWS_ALLOW_HTTP", "true".to_owned()),
                    ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false".to_owned()),
                    ("AWS_REGION", "us-east-1".to_owned()),
                    ("AWS_ACCESS_KEY_ID", "corral-chaos".to_owned()),
                    ("AWS_SECRET_ACCESS_KEY", "corral-chaos".to_owned()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect()
            }
        };

        // The live view's TURN server, without which no browser session opens (BROW-9).
        let coturn = if Path::new(TURNSERVER).is_file() {
            Some(start_coturn(dir, &marker, &logs)?)
        } else {
            println!("chaos: no browser sessions: no {TURNSERVER}");
            None
        };
        // The registry installs come from, through the broker.
        let pypi = match corral_testkit::registries::pypiserver_missing() {
            Some(why) => {
                println!("chaos: no installs: {why}");
                None
            }
            None => Some(start_pypi(dir, mark, &marker, &logs)?),
        };
        // The egress load's far side: its target, its canary and the DNS the proxy asks.
        let far = match crate::egress::Far::start(dir, mark, &marker, &logs) {
            Ok(far) => Some(far),
            Err(why) => {
                println!("chaos: no egress load: {why}");
                crate::egress::remove_link();
                None
            }
        };
        let proxy_port = free_port()?;
        let proxy_url = format!("http://127.0.0.1:{proxy_port}");
        let mut extra: Vec<(String, String)> = Vec::new();
        if let Some((_, url)) = &coturn {
            extra.push(("CORRAL_TURN_URL".to_owned(), url.clone()));
            extra.push(("CORRAL_TURN_SECRET_FILE".to_owned(), file("turn-secret")));
        }
        let egress_policy = match &far {
            // The target alone, on its one port.
            Some(far) => [
                ("SANDBOX_EGRESS_MODE", "private_network".to_owned()),
                ("SANDBOX_EGRESS_PRIVATE_CIDRS", far.cidrs()),
                (
                    "SANDBOX_EGRESS_ALLOWED_PORTS",
                    crate::egress::PORT.to_string(),
                ),
            ]
            .to_vec(),
            None => [("SANDBOX_EGRESS_MODE", "public_internet".to_owned())].to_vec(),
        };
        extra.extend(egress_policy.into_iter().map(|(k, v)| (k.to_owned(), v)));
        if let Some((_, url)) = &pypi {
            extra.push((
                "SANDBOX_PACKAGE_REGISTRIES".to_owned(),
                serde_json::json!({ "pypi": url }).to_string(),
            ));
        }
        let settings: Vec<(String, String)> = [
            ("SANDBOX_WARM_POOL_MIN", pool.warm_min.to_string()),
            ("SANDBOX_POOL_TARGET_IDLE", "1".to_owned()),
            ("SANDBOX_POOL_MAX_ALLOCATED", pool.ceiling.to_string()),
            (
                "SANDBOX_MAX_CONCURRENT_PER_MEMBER",
                pool.member_limit.to_string(),
            ),
            (
                "SANDBOX_LEASE_HEARTBEAT_SECONDS",
                pool.heartbeat_seconds.to_string(),
            ),
            (
                "SANDBOX_LEASE_TTL_SECONDS",
                pool.lease_ttl_seconds.to_string(),
            ),
            ("SANDBOX_ACQUIRE_WAIT_SECONDS", "20".to_owned()),
            // A create whose report a Valkey restart swallowed is ambiguous only after this
            // long; the default (120 s) outlasts the harness's wait for recovery after the load.
            ("CORRAL_CREATE_TIMEOUT_SECONDS", "20".to_owned()),
            ("SANDBOX_EGRESS_PROXY_URL", proxy_url.clone()),
            ("SANDBOX_FIELD_KEY_FILE", file("field-key")),
            ("CORRAL_WORKER_TOKEN_FILE", file("worker-token")),
            ("CORRAL_POOL", "default".to_owned()),
            // A session its agent left (a killed replica, a close never answered) is reaped
            // within the harness's wait for recovery after the load.
            (
                "CORRAL_BROWSER_IDLE_SECONDS",
                BROWSER_IDLE_SECONDS.to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain([marker.clone()])
        .chain(extra)
        .collect();

        let mut links = Vec::new();
        let mut apis = Vec::new();
        let mut api_urls = Vec::new();
        let shim = crate::clock::build_shim(dir)
            .inspect_err(|why| println!("chaos: no clock steps: {why}"))
            .ok();
        let mut clock_files = Vec::new();
        for index in 1..=REPLICAS {
            let link = Link::start(valkey_port)?;
            let port = free_port()?;
            let url = format!("http://127.0.0.1:{port}");
            let mut env = settings.clone();
            env.extend(
                [
                    (
                        "CORRAL_VALKEY_URL",
                        format!("redis://127.0.0.1:{}", link.port),
                    ),
                    ("CORRAL_API_LISTEN", format!("127.0.0.1:{port}")),
                    ("CORRAL_WORKER_STATE_DIR", file("workers")),
                    ("CORRAL_API_TOKEN_FILE", file("api-token")),
                    ("CORRAL_ADMIN_TOKEN_FILE", file("admin-token")),
                    ("SANDBOX_PACKAGE_BROKER_URL", url.clone()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .chain(store_env.iter().cloned()),
            );
            if let Some(shim) = &shim {
                let clock = dir.join(format!("clock-api-{index}"));
                crate::clock::step(&clock, 0)?;
                env.push(("LD_PRELOAD".to_owned(), shim.display().to_string()));
                env.push((
                    crate::clock::CLOCK_FILE.to_owned(),
                    clock.display().to_string(),
                ));
                clock_files.push(clock);
            }
            let mut api = Proc {
                name: format!("api-{index}"),
                command: vec![corral.display().to_string(), "api".to_owned()],
                env,
                log: logs.join(format!("api-{index}.log")),
                child: None,
                port: 0,
            };
            api.start()?;
            apis.push(api);
            api_urls.push(url);
            links.push(link);
        }
        for url in &api_urls {
            wait_for(url, Duration::from_secs(60), || {
                request(url, "GET", "/healthz").is_some_and(|(s, _)| s == 200)
            })?;
        }

        // The egress proxy verifies grants with the API's key, read once into a file.
        let key = request(&api_urls[0], "GET", "/v1/egress/verifying_key")
            .filter(|(status, _)| *status == 200)
            .map(|(_, body)| body)
            .ok_or("the API did not give its verifying key")?;
        fs::write(dir.join("verifying-key"), key.trim()).map_err(|e| e.to_string())?;
        let mut proxy = Proc {
            name: "egress-proxy".to_owned(),
            command: vec![corral.display().to_string(), "egress-proxy".to_owned()],
            env: vec![
                (
                    "CORRAL_EGRESS_LISTEN".to_owned(),
                    format!("127.0.0.1:{proxy_port}"),
                ),
                (
                    "CORRAL_EGRESS_VERIFYING_KEY_FILE".to_owned(),
                    file("verifying-key"),
                ),
                marker.clone(),
            ]
            .into_iter()
            .chain(
                far.as_ref()
                    .map(|far| ("SANDBOX_EGRESS_DNS_SERVERS".to_owned(), far.dns_servers())),
            )
            .collect(),
            log: logs.join("egress-proxy.log"),
            child: None,
            port: 0,
        };
        proxy.start()?;

        let mut controller_env = settings.clone();
        controller_env.push(("CORRAL_POOL_MODE".to_owned(), "controller".to_owned()));
        controller_env.push(("SANDBOX_PACKAGE_BROKER_URL".to_owned(), api_urls[0].clone()));
        let mut controller = Proc {
            name: "controller".to_owned(),
            command: vec![
                corral.display().to_string(),
                "controller".to_owned(),
                "--valkey".to_owned(),
                valkey_url.clone(),
                "--backend".to_owned(),
                "local".to_owned(),
                "--state-dir".to_owned(),
                file("workers"),
                "--period-ms".to_owned(),
                "250".to_owned(),
            ],
            env: controller_env,
            log: logs.join("controller.log"),
            child: None,
            port: 0,
        };
        controller.start()?;

        Ok(Self {
            dir: dir.to_owned(),
            corral: corral.to_owned(),
            valkey_port,
            valkey_url,
            valkey,
            apis,
            api_urls,
            links,
            controller,
            proxy,
            caller,
            pool,
            store,
            store_kind,
            s3,
            clock_files,
            coturn: coturn.map(|(proc, _)| proc),
            pypi: pypi.map(|(proc, _)| proc),
            far,
        })
    }

    /// The worker processes the local backend's records name, by worker id.
    #[must_use]
    pub fn workers(&self) -> BTreeMap<String, i32> {
        let mut found = BTreeMap::new();
        let Ok(entries) = fs::read_dir(self.dir.join("workers")) else {
            return found;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".worker") else {
                continue;
            };
            let Ok(text) = fs::read_to_string(entry.path()) else {
                continue;
            };
            if let Some(pid) = text.split_whitespace().next().and_then(|p| p.parse().ok()) {
                found.insert(id.to_owned(), pid);
            }
        }
        found
    }

    /// Restarts Valkey; `empty` deletes its snapshot first.
    ///
    /// # Errors
    /// When it does not answer again.
    pub fn restart_valkey(&mut self, empty: bool) -> Result<(), String> {
        self.valkey.kill();
        if empty {
            let _ = fs::remove_file(self.dir.join("valkey").join("dump.rdb"));
        }
        self.valkey.start()?;
        let port = self.valkey_port;
        wait_for("valkey", Duration::from_secs(10), || {
            corral_store::valkey_server::ping(port)
        })
    }

    /// Restarts coturn (killed or not) and waits until it answers.
    ///
    /// # Errors
    /// When there is none, or it does not answer again.
    pub fn restart_coturn(&mut self) -> Result<(), String> {
        let coturn = self.coturn.as_mut().ok_or("no coturn in this deployment")?;
        coturn.restart()?;
        let port = coturn.port;
        wait_for("coturn", Duration::from_secs(10), || stun_answers(port))
    }

    /// Stops everything it started (SIGKILL), the links too.
    pub fn stop(&mut self) {
        self.controller.kill();
        for api in &mut self.apis {
            api.kill();
        }
        self.proxy.kill();
        self.valkey.kill();
        for other in [&mut self.s3, &mut self.coturn, &mut self.pypi]
            .into_iter()
            .flatten()
        {
            other.kill();
        }
        if let Some(far) = &mut self.far {
            far.stop();
        }
        for link in &self.links {
            link.stop();
        }
    }
}
