//! `corral up`: the embedded default, everything on this machine in one command.
//!
//! Valkey (started unless `--valkey URL` or `CORRAL_VALKEY_URL` names one), a field key (generated
//! into the state directory unless `SANDBOX_FIELD_KEY[_FILE]` gives one), the API, the controller
//! with the `local` backend and its warm pool, and the egress proxy; workspaces on the local
//! filesystem under the state directory. It shows progress while coming up, prints one ready line
//! with the API's URL and where the caller credential is stored, optionally makes a sample run
//! (`--sample`), and serves until SIGINT or SIGTERM, when it stops everything it started: the API,
//! the controller, every worker, the proxy and Valkey.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::cli::UpArgs;
use corral_api::client::Client;
use corral_contract::{Locator, WorkerClient};
use corral_controller::Backend as _;
use corral_controller::Reconciler;
use corral_core::config::Settings;
use corral_core::store::Loaded;
use corral_store::valkey_server::ValkeyServer;

use crate::stack::{ApiParts, build, field_key_bytes, secret_file, stop_signal};

/// The sample `--sample` runs.
const SAMPLE: &str = r#"import os, platform
import pandas as pd
print("hello from a Corral worker, Python", platform.python_version(), "pandas", pd.__version__)
frame = pd.DataFrame({"city": ["Lisbon", "Osaka", "Quito"], "rain_mm": [690, 1470, 1010]})
print(frame.sort_values("rain_mm").to_string(index=False))
with open("hello.txt", "w") as f:
    f.write("kept in this actor's workspace for this conversation\n")
print("workspace:", sorted(os.listdir(".")))
"#;

/// How long the warm pool may take to come up.
const WARM_TIMEOUT: Duration = Duration::from_secs(240);

fn say(line: &str) {
    eprintln!("corral up: {line}");
}

/// `corral up`.
pub fn run(mut args: UpArgs) -> ExitCode {
    if args.valkey.is_none() {
        args.valkey = std::env::var("CORRAL_VALKEY_URL")
            .ok()
            .filter(|v| !v.is_empty());
    }
    let settings = match Settings::from_lookup(|name| std::env::var(name).ok()) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("corral up: {error} ({})", error.code());
            return ExitCode::from(1);
        }
    };
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        eprintln!("corral up: no runtime");
        return ExitCode::from(1);
    };
    let mut started = Started::default();
    let code = runtime.block_on(up(args, settings, &mut started));
    runtime.block_on(started.stop());
    say("stopped everything it started");
    code
}

/// What `corral up` started, stopped in reverse.
#[derive(Default)]
struct Started {
    valkey: Option<ValkeyServer>,
    proxy: Option<Child>,
    turn: Option<crate::turn_server::TurnServer>,
    backend: Option<Arc<corral_controller::local::LocalBackend>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
}

impl Started {
    async fn stop(&mut self) {
        if let Some(stop) = &self.stop {
            let _ = stop.send(true);
        }
        for task in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        if let Some(backend) = self.backend.take()
            && let Ok(workers) = backend.list().await
        {
            for worker in workers {
                let _ = backend.delete(worker).await;
            }
        }
        if let Some(mut proxy) = self.proxy.take() {
            let _ = proxy.kill();
            let _ = proxy.wait();
        }
        drop(self.turn.take());
        if let Some(mut valkey) = self.valkey.take() {
            valkey.kill();
        }
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

async fn up(args: UpArgs, mut settings: Settings, started: &mut Started) -> ExitCode {
    match try_up(args, &mut settings, started).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("corral up: {error}");
            ExitCode::from(1)
        }
    }
}

async fn try_up(
    args: UpArgs,
    settings: &mut Settings,
    started: &mut Started,
) -> Result<(), String> {
    std::fs::create_dir_all(&args.state_dir)
        .map_err(|e| format!("{}: {e}", args.state_dir.display()))?;
    let state_dir = args
        .state_dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", args.state_dir.display()))?;
    // Coordination.
    let valkey = coordination(args.valkey, started).await?;
    say(&format!("coordination: {valkey}"));
    // Keys and credentials.
    let field_key = field_key(settings, args.no_field_key, &state_dir)?;
    let caller = secret_file(&state_dir.join("api-token"))?;
    let admin = secret_file(&state_dir.join("admin-token"))?;
    let worker_token = secret_file(&state_dir.join("worker-token"))?;
    // The API's socket first: the proxy reads the verifying key from it.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("{}: {e} (pass --listen ADDR to use another)", args.listen))?;
    let api_addr = listener.local_addr().map_err(|e| e.to_string())?;
    let api_url = format!("http://{api_addr}");
    // The egress proxy.
    let proxy_url = start_egress_proxy(&state_dir, &api_url, started)?;
    let proxy_url = apply_packaged_defaults(settings, proxy_url, &api_url, &state_dir);
    say(&format!(
        "egress proxy: {proxy_url} (log in {})",
        state_dir.join("egress-proxy.log").display()
    ));
    // The live view's TURN authority (BROW-9): a coturn on loopback unless the operator names one.
    if settings.turn.url.is_none() {
        start_turn(settings, &state_dir, started);
    }
    // The API.
    let workers_dir = state_dir.join("workers");
    let parts = ApiParts {
        valkey: valkey.clone(),
        pool: String::from("default"),
        workspace_url: std::env::var("CORRAL_WORKSPACE_URL")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| format!("file://{}", state_dir.join("workspaces").display())),
        locator: Locator::StateDir(workers_dir.clone()),
        caller: caller.clone(),
        admin,
        worker: worker_token,
        field_key,
        sample_tools: true,
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    started.stop = Some(stop);
    let listeners = bind_replicas(listener, args.listen, args.api_replicas).await?;
    let replica_urls = serve_replicas(listeners, settings, &parts, &stopped, started).await?;
    // The controller and its warm pool.
    start_controller(
        settings,
        &parts,
        &workers_dir,
        &proxy_url,
        &api_url,
        &stopped,
        started,
    )
    .await?;
    wait_warm(&valkey, settings.warm_pool_min).await?;
    announce_ready(&state_dir, &api_url, &replica_urls);
    if args.sample {
        sample(&api_url, &caller).await;
    }
    say("serving until Ctrl-C");
    stop_signal().await;
    say("stopping");
    Ok(())
}

/// The coordination store's URL: the one named, or a Valkey started here.
async fn coordination(named: Option<String>, started: &mut Started) -> Result<String, String> {
    Ok(match named {
        Some(url) => url,
        None => {
            say("starting Valkey");
            let server = tokio::task::spawn_blocking(ValkeyServer::start)
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("{e} (the README's first command installs it)"))?;
            let url = server.url();
            started.valkey = Some(server);
            url
        }
    })
}

/// The field key: none with `--no-field-key`, the configured one, or one generated into the state
/// directory.
fn field_key(
    settings: &Settings,
    no_field_key: bool,
    state_dir: &Path,
) -> Result<Option<Vec<u8>>, String> {
    Ok(match field_key_bytes(settings)? {
        _ if no_field_key => {
            say("no field key (--no-field-key): runs proceed with the network denied");
            None
        }
        Some(key) => Some(key),
        None => {
            let path = state_dir.join("field-key");
            let key = secret_file(&path)?;
            say(&format!("generated a field key in {}", path.display()));
            Some(key.into_bytes())
        }
    })
}

/// Starts the egress proxy on a free loopback port, reading its verifying key from the API;
/// returns its URL.
fn start_egress_proxy(
    state_dir: &Path,
    api_url: &str,
    started: &mut Started,
) -> Result<String, String> {
    let proxy_port = free_port()?;
    let proxy_url = format!("http://127.0.0.1:{proxy_port}");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let log =
        std::fs::File::create(state_dir.join("egress-proxy.log")).map_err(|e| e.to_string())?;
    let proxy = std::process::Command::new(&exe)
        .arg("egress-proxy")
        .env("CORRAL_EGRESS_LISTEN", format!("127.0.0.1:{proxy_port}"))
        .env(
            "CORRAL_EGRESS_VERIFYING_KEY_URL",
            format!("{api_url}/v1/egress/verifying_key"),
        )
        .env_remove("CORRAL_EGRESS_VERIFYING_KEY_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("start the egress proxy: {e}"))?;
    started.proxy = Some(proxy);
    Ok(proxy_url)
}

/// Fills the settings the operator left unset with the package's defaults; returns the egress
/// proxy's URL in force.
fn apply_packaged_defaults(
    settings: &mut Settings,
    proxy_url: String,
    api_url: &str,
    state_dir: &Path,
) -> String {
    // `corral up` is the package: it writes the packaged default mode (ISO-4) explicitly, since the
    // core resolves a missing mode to `isolated` (EGR-5). An operator's own value wins.
    if settings.egress.mode.is_none() {
        settings.egress.mode = Some(corral_core::config::EgressSettings::DEFAULT_MODE.to_owned());
    }
    if settings.egress.proxy_url.is_none() {
        settings.egress.proxy_url = Some(proxy_url.clone());
    }
    let proxy_url = settings.egress.proxy_url.clone().unwrap_or(proxy_url);
    // Workers reach this API for packages and tool calls (PKG-3, KER-5), unless the operator
    // names another address; the tools are the built-in sample platform's unless one is named.
    if settings.packages.broker_url.is_none() {
        settings.packages.broker_url = Some(api_url.to_owned());
    }
    if settings.tool_endpoint_url.is_none() {
        settings.tool_endpoint_url = Some(format!("{api_url}/v1/sample_tools"));
    }
    // Rooms and documents: the embedded authority `corral resources` administers (PROJ-1).
    if settings.resource_authority_url.is_none() {
        settings.resource_authority_url = Some(format!(
            "sqlite://{}",
            state_dir.join("resources.db").display()
        ));
    }
    proxy_url
}

/// Starts a coturn on loopback and points the settings at it, or says why browser sessions will
/// be refused.
fn start_turn(settings: &mut Settings, state_dir: &Path, started: &mut Started) {
    match crate::turn_server::TurnServer::start(state_dir) {
        Ok(server) => {
            say(&format!(
                "TURN server: {} (coturn, shared secret in {})",
                server.url,
                server.secret_file.display()
            ));
            settings.turn.url = Some(server.url.clone());
            settings.turn.secret_file = Some(server.secret_file.display().to_string());
            started.turn = Some(server);
        }
        Err(why) => say(&format!(
            "no TURN server ({why}): browser sessions will be refused with turn_not_configured"
        )),
    }
}

/// The first API listener followed by one bound for each further replica.
async fn bind_replicas(
    listener: tokio::net::TcpListener,
    listen: SocketAddr,
    api_replicas: u16,
) -> Result<Vec<tokio::net::TcpListener>, String> {
    let mut listeners = vec![listener];
    for replica in 1..api_replicas {
        // Port 0 picks a free one for each; a fixed port is followed by the next ones.
        let mut addr = listen;
        if addr.port() != 0 {
            addr.set_port(addr.port().saturating_add(replica));
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("{addr}: {e} (API replica {})", replica + 1))?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// Serves one API replica on each listener until stopped; returns the URLs of those after the
/// first.
async fn serve_replicas(
    listeners: Vec<tokio::net::TcpListener>,
    settings: &Settings,
    parts: &ApiParts,
    stopped: &tokio::sync::watch::Receiver<bool>,
    started: &mut Started,
) -> Result<Vec<String>, String> {
    let mut replica_urls = Vec::new();
    for (replica, listener) in listeners.into_iter().enumerate() {
        let url = format!(
            "http://{}",
            listener.local_addr().map_err(|e| e.to_string())?
        );
        let state = build(settings.clone(), parts.clone()).await?;
        let mut api_stopped = stopped.clone();
        started.tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = api_stopped.changed().await;
            };
            if let Err(e) = corral_api::serve(state, listener, shutdown).await {
                say(&format!("API: {e}"));
            }
        }));
        if replica == 0 {
            say(&format!("API: {url}"));
        } else {
            say(&format!("API replica {}: {url}", replica + 1));
            replica_urls.push(url);
        }
    }
    Ok(replica_urls)
}

/// Starts the controller with the `local` backend, reconciling the warm pool until stopped; its
/// workers reach the egress proxy at `proxy_url` and the package broker (PKG-3) at the configured
/// one, else this API.
async fn start_controller(
    settings: &Settings,
    parts: &ApiParts,
    workers_dir: &Path,
    proxy_url: &str,
    api_url: &str,
    stopped: &tokio::sync::watch::Receiver<bool>,
    started: &mut Started,
) -> Result<(), String> {
    let backend = Arc::new(crate::controller_cmd::local_backend(
        workers_dir,
        &parts.worker,
        &[
            ("SANDBOX_EGRESS_PROXY_URL", proxy_url),
            // The package broker is this API (PKG-3), unless the operator names another.
            (
                "SANDBOX_PACKAGE_BROKER_URL",
                settings.packages.broker_url.as_deref().unwrap_or(api_url),
            ),
        ],
    )?);
    started.backend = Some(backend.clone());
    let store = corral_store::ValkeyStore::connect(&parts.valkey, "default")
        .await
        .map_err(|e| e.to_string())?;
    let control = WorkerClient::new(
        Locator::StateDir(workers_dir.to_path_buf()),
        parts.worker.clone(),
    )?;
    let reconciler = Reconciler::new(store, backend, control, settings.pool());
    let mut controller_stopped = stopped.clone();
    started.tasks.push(tokio::spawn(async move {
        let stop = async move {
            let _ = controller_stopped.changed().await;
        };
        reconciler
            .run(Duration::from_millis(250), stop, |_| {})
            .await;
    }));
    Ok(())
}

/// Prints the ready lines: each further replica's URL, then the API's and where the credentials are.
fn announce_ready(state_dir: &Path, api_url: &str, replica_urls: &[String]) {
    let token_path = state_dir.join("api-token");
    for url in replica_urls {
        println!("corral API replica: {url}");
    }
    println!(
        "corral is ready: API {api_url} (caller credential in {}, admin credential in {})",
        token_path.display(),
        state_dir.join("admin-token").display()
    );
}

/// Waits until the warm pool has its minimum, printing progress as it grows.
async fn wait_warm(valkey: &str, minimum: u32) -> Result<(), String> {
    let store = corral_store::ValkeyStore::connect(valkey, "default")
        .await
        .map_err(|e| e.to_string())?;
    let wanted = minimum.max(1);
    let began = Instant::now();
    let mut shown = None;
    let mut watch = store.subscribe().await.ok();
    loop {
        let warm = match store.load().await {
            Ok(Loaded::Found { doc, .. }) => doc.counts().warm,
            _ => 0,
        };
        if shown != Some(warm) {
            say(&format!("warm pool: {warm}/{wanted} workers ready"));
            shown = Some(warm);
        }
        if warm >= wanted {
            return Ok(());
        }
        if began.elapsed() > WARM_TIMEOUT {
            return Err(format!(
                "the warm pool did not come up within {} s; see `corral jail probe`",
                WARM_TIMEOUT.as_secs()
            ));
        }
        match watch.as_mut() {
            Some(watch) => {
                let _ = watch.changed(Duration::from_millis(500)).await;
            }
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn sample(api_url: &str, caller: &str) {
    say("sample run: python, actor \"demo\", conversation \"quickstart\"");
    let request = serde_json::json!({
        "actor": "demo", "conversation": "quickstart", "member": "demo",
        "language": "python", "code": SAMPLE,
    });
    match Client::new(api_url, caller) {
        Ok(client) => match client.run_code(&request).await {
            Ok((status, body)) => print!("{}", corral_api::client::render(status, &body)),
            Err(e) => say(&format!("sample run failed: {e}")),
        },
        Err(e) => say(&format!("sample run failed: {e}")),
    }
}
