//! `corral controller`: the reconciler that keeps the warm pool.
//!
//! `corral controller --valkey URL [--pool NAME] [--period-ms N] [--backend local|kube|agent-sandbox] …`
//!
//! - `local` (the default): worker processes on this machine, each `corral worker serve`
//!   (`--state-dir DIR` holds their records). The workers' credential is read from
//!   `CORRAL_WORKER_TOKEN_FILE`, or generated into `<state-dir>/worker-token` (mode 0600) for the
//!   API to read. The workers it started keep running after it stops, and a restarted controller
//!   finds them again from their records.
//! - `kube`: one pod and one Service per worker in `--namespace NS` (default `corral`), running
//!   `--image REF` (a digest reference; `corral` on its `PATH`), under `--runtime-class NAME` when
//!   given; the workers' credential is the Secret `--credential-secret NAME` (default
//!   `corral-worker-credential`, key `worker-token`), which the controller also reads from
//!   `CORRAL_WORKER_TOKEN[_FILE]`; the pods get this controller's `SANDBOX_EGRESS_PROXY_URL`. The cluster comes from the kubeconfig or the pod's service
//!   account. Needs `CORRAL_POOL_MODE=controller`.
//! - `agent-sandbox`: `SandboxClaim`s naming `--sandbox-template NAME` (and `--warm-pool NAME`)
//!   in `--namespace NS`, with fixed deadlines; needs `CORRAL_POOL_MODE=platform_operator` and
//!   `--worker-url-template` (how a claimed sandbox's control API is reached).
//!
//! `--worker-url-template http://HOST:PORT` with `{id}` overrides how workers are reached (the
//! `kube` default is each worker's Service, `http://{id}.NS.svc:8091`). Pool settings come from
//! the environment (`corral config check` shows them). It runs until SIGINT or SIGTERM.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use corral_contract::{Locator, WorkerClient, credential};
use corral_controller::claim::{AgentSandbox, AgentSandboxBackend, ClaimSettings};
use corral_controller::kube::{KubeBackend, KubeSettings};
use corral_controller::local::LocalBackend;
use corral_controller::{Backend, Reconciler};
use corral_core::config::{PoolModeSetting, Settings};
use corral_core::ids::ImageId;
use corral_store::ValkeyStore;

struct Args {
    valkey: String,
    pool: String,
    state_dir: PathBuf,
    period: Duration,
    backend: BackendArgs,
    worker_url_template: Option<String>,
}

/// Which backend, with what only it needs.
#[derive(Debug, PartialEq, Eq)]
enum BackendArgs {
    Local,
    Kube {
        namespace: String,
        image: String,
        runtime_class: Option<String>,
        credential_secret: Option<String>,
    },
    AgentSandbox {
        namespace: String,
        template: String,
        warm_pool: Option<String>,
    },
}

const USAGE: &str = "usage: corral controller --valkey URL [--pool NAME] [--period-ms N] \
[--backend local|kube|agent-sandbox] [--state-dir DIR] [--namespace NS] [--image REF] \
[--runtime-class NAME] [--credential-secret NAME] [--sandbox-template NAME] [--warm-pool NAME] \
[--worker-url-template http://HOST:PORT]";

const POLICY_USAGE: &str = "usage: corral controller network-policy --proxy IP:PORT --turn IP:PORT \
--broker IP:PORT [--namespace NS] [--pool NAME]";

/// `corral controller network-policy`: prints the ISO-5 NetworkPolicy of a pool's worker pods
/// (JSON, for `kubectl apply -f -`): egress to the proxy, the TURN authority over UDP and TCP
/// and the broker only; ingress from this system's own pods only.
fn network_policy(args: &[String]) -> ExitCode {
    use corral_controller::network_policy::{WorkerNetwork, worker_network_policy};
    let (mut namespace, mut pool) = (String::from("corral"), String::from("default"));
    let (mut proxy, mut turn, mut broker) = (None, None, None);
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest.next();
        let address =
            |value: Option<&String>| value.and_then(|v| v.parse::<std::net::SocketAddr>().ok());
        match flag.as_str() {
            "--namespace" if value.is_some() => namespace = value.cloned().unwrap_or_default(),
            "--pool" if value.is_some() => pool = value.cloned().unwrap_or_default(),
            "--proxy" => proxy = address(value),
            "--turn" => turn = address(value),
            "--broker" => broker = address(value),
            _ => {
                eprintln!(
                    "corral controller network-policy: unknown or incomplete flag {flag}\n{POLICY_USAGE}"
                );
                return ExitCode::from(2);
            }
        }
    }
    let (Some(proxy), Some(turn), Some(broker)) = (proxy, turn, broker) else {
        eprintln!(
            "corral controller network-policy: --proxy, --turn and --broker are each one IP:PORT\n{POLICY_USAGE}"
        );
        return ExitCode::from(2);
    };
    let policy = worker_network_policy(
        &namespace,
        &pool,
        &WorkerNetwork {
            proxy,
            turn,
            broker,
        },
    );
    match serde_json::to_string_pretty(&policy) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("corral controller network-policy: {error}");
            ExitCode::from(1)
        }
    }
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        valkey: String::new(),
        pool: String::from("default"),
        state_dir: PathBuf::from("/var/lib/corral/workers"),
        period: Duration::from_millis(500),
        backend: BackendArgs::Local,
        worker_url_template: None,
    };
    let mut backend = String::from("local");
    let (mut namespace, mut image, mut runtime_class, mut credential_secret) =
        (String::from("corral"), None, None, None);
    let (mut template, mut warm_pool) = (None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--valkey" => parsed.valkey = value()?,
            "--pool" => parsed.pool = value()?,
            "--state-dir" => parsed.state_dir = PathBuf::from(value()?),
            "--period-ms" => {
                let ms: u64 = value()?
                    .parse()
                    .map_err(|_| String::from("--period-ms: not a number"))?;
                parsed.period = Duration::from_millis(ms.clamp(50, 60_000));
            }
            "--backend" => backend = value()?,
            "--namespace" => namespace = value()?,
            "--image" => image = Some(value()?),
            "--runtime-class" => runtime_class = Some(value()?),
            "--credential-secret" => credential_secret = Some(value()?),
            "--sandbox-template" => template = Some(value()?),
            "--warm-pool" => warm_pool = Some(value()?),
            "--worker-url-template" => parsed.worker_url_template = Some(value()?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if parsed.valkey.is_empty() {
        return Err(String::from(
            "--valkey URL is required (dynamic controller mode requires Valkey, POOL-11)",
        ));
    }
    parsed.backend = match backend.as_str() {
        "local" => BackendArgs::Local,
        "kube" => BackendArgs::Kube {
            namespace,
            image: image.ok_or("--backend kube needs --image REF (the worker image, by digest)")?,
            runtime_class,
            credential_secret,
        },
        "agent-sandbox" => {
            if parsed.worker_url_template.is_none() {
                return Err(String::from(
                    "--backend agent-sandbox needs --worker-url-template http://HOST:PORT with {id}",
                ));
            }
            BackendArgs::AgentSandbox {
                namespace,
                template: template
                    .ok_or("--backend agent-sandbox needs --sandbox-template NAME")?,
                warm_pool,
            }
        }
        other => {
            return Err(format!(
                "--backend {other:?}: one of local, kube, agent-sandbox"
            ));
        }
    };
    Ok(parsed)
}

/// The `local` backend: one `corral worker serve` process per worker on a loopback port, each
/// given the workers' credential and `env`; its image is this binary and the Python runtime.
pub fn local_backend(
    state_dir: &Path,
    token: &str,
    env: &[(&str, &str)],
) -> Result<LocalBackend, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find its own binary: {e}"))?;
    let runtime: Vec<&Path> = [Path::new("/usr/bin/python3")]
        .into_iter()
        .filter(|p| p.exists())
        .collect();
    let backend = LocalBackend::new(
        state_dir,
        &exe,
        &["worker", "serve", "--listen", "127.0.0.1:{port}"],
        &runtime,
    )
    .map_err(|e| format!("{}: {e}", state_dir.display()))?;
    Ok(env.iter().fold(
        backend.with_env("CORRAL_WORKER_TOKEN", token),
        |backend, (name, value)| backend.with_env(name, value),
    ))
}

/// The workers' credential: from `CORRAL_WORKER_TOKEN[_FILE]`, or generated once into the state
/// dir (mode 0600) and read from there after.
pub fn worker_credential(state_dir: &Path) -> Result<String, String> {
    if let Some(token) =
        credential::from_env(|name| std::env::var(name).ok(), "CORRAL_WORKER_TOKEN")?
    {
        return Ok(token);
    }
    crate::stack::secret_file(&state_dir.join("worker-token"))
}

pub fn run(args: &[String]) -> ExitCode {
    if args.first().map(String::as_str) == Some("network-policy") {
        return network_policy(&args[1..]);
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse(args) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("corral controller: {error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let settings = match Settings::from_lookup(|name| std::env::var(name).ok()) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("corral controller: {error} ({})", error.code());
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("corral controller: {error}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(serve(args, settings))
}

async fn serve(args: Args, settings: Settings) -> ExitCode {
    match start(&args, &settings).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("corral controller: {error}");
            ExitCode::from(1)
        }
    }
}

/// Builds the backend the arguments name and reconciles with it until asked to stop.
async fn start(args: &Args, settings: &Settings) -> Result<ExitCode, String> {
    let platform = settings.pool_mode == PoolModeSetting::PlatformOperator;
    let template = args
        .worker_url_template
        .as_deref()
        .map(Locator::template)
        .transpose()?;
    match &args.backend {
        BackendArgs::Local => {
            if platform {
                return Err(mode_mismatch("local"));
            }
            std::fs::create_dir_all(&args.state_dir)
                .map_err(|e| format!("{}: {e}", args.state_dir.display()))?;
            let token = worker_credential(&args.state_dir)?;
            let backend = local_backend(&args.state_dir, &token, &[])?;
            let locator = template.unwrap_or_else(|| Locator::StateDir(args.state_dir.clone()));
            reconcile(args, settings, backend, WorkerClient::new(locator, token)?).await
        }
        BackendArgs::Kube {
            namespace,
            image,
            runtime_class,
            credential_secret,
        } => {
            if platform {
                return Err(mode_mismatch("kube"));
            }
            let token = cluster_credential()?;
            let mut kube_settings =
                KubeSettings::new(namespace, &args.pool, ImageId(image.clone()));
            kube_settings.runtime_class.clone_from(runtime_class);
            if let Some(secret) = credential_secret {
                kube_settings.credential_secret.clone_from(secret);
            }
            // The workers reach the egress proxy this controller was configured with.
            if let Some(url) = &settings.egress.proxy_url {
                kube_settings
                    .worker_env
                    .push(("SANDBOX_EGRESS_PROXY_URL".to_owned(), url.clone()));
            }
            let client = cluster_client().await?;
            let backend = KubeBackend::new(client, kube_settings)?;
            let locator = template.unwrap_or_else(|| Locator::kube(namespace));
            reconcile(args, settings, backend, WorkerClient::new(locator, token)?).await
        }
        BackendArgs::AgentSandbox {
            namespace,
            template: sandbox_template,
            warm_pool,
        } => {
            if !platform {
                return Err(String::from(
                    "--backend agent-sandbox claims workers with fixed deadlines: it needs CORRAL_POOL_MODE=platform_operator (POOL-7)",
                ));
            }
            let token = cluster_credential()?;
            let platform = AgentSandbox {
                template: sandbox_template.clone(),
                warm_pool: warm_pool.clone(),
            };
            let image = ImageId(format!("agent-sandbox:{namespace}/{sandbox_template}"));
            let claim_settings = ClaimSettings::new(namespace, &args.pool, image);
            let client = cluster_client().await?;
            let backend = AgentSandboxBackend::new(client, platform, claim_settings);
            let locator = template.ok_or("--backend agent-sandbox needs --worker-url-template")?;
            reconcile(args, settings, backend, WorkerClient::new(locator, token)?).await
        }
    }
}

fn mode_mismatch(backend: &str) -> String {
    format!(
        "--backend {backend} creates workers itself: it needs CORRAL_POOL_MODE=controller (platform_operator is for --backend agent-sandbox)"
    )
}

/// The workers' credential on a cluster: the operator's, never generated (every worker pod reads
/// the same one from its Secret).
fn cluster_credential() -> Result<String, String> {
    credential::from_env(|name| std::env::var(name).ok(), "CORRAL_WORKER_TOKEN")?.ok_or_else(|| {
        String::from(
            "set CORRAL_WORKER_TOKEN_FILE (or CORRAL_WORKER_TOKEN) to the credential in the workers' Secret",
        )
    })
}

/// The cluster, with the one TLS provider of this binary installed first.
async fn cluster_client() -> Result<corral_controller::kube::Client, String> {
    corral_contract::ensure_crypto_provider();
    corral_controller::kube::cluster_client().await
}

/// Reconciles every period until SIGINT or SIGTERM.
async fn reconcile<B: Backend>(
    args: &Args,
    settings: &Settings,
    backend: B,
    control: WorkerClient,
) -> Result<ExitCode, String> {
    let store = ValkeyStore::connect(&args.valkey, &args.pool)
        .await
        .map_err(|e| e.to_string())?;
    let reconciler = Reconciler::new(store, backend, control, settings.pool());
    eprintln!(
        "corral controller: reconciling pool {:?} every {:?}",
        args.pool, args.period
    );
    let mut interval = tokio::time::interval(args.period);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            biased;
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            _ = terminate.recv() => return Ok(ExitCode::SUCCESS),
            _ = interval.tick() => {
                let pass = reconciler.pass().await;
                if !pass.coordinated {
                    eprintln!("corral controller: coordination unavailable; nothing built (fail closed)");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Result<Args, String> {
        let args: Vec<String> = ["--valkey", "redis://127.0.0.1:1"]
            .iter()
            .chain(args)
            .map(|s| (*s).to_owned())
            .collect();
        parse(&args)
    }

    #[test]
    fn local_is_the_default_backend() {
        assert_eq!(parsed(&[]).expect("parses").backend, BackendArgs::Local);
    }

    #[test]
    fn kube_needs_an_image_and_takes_its_options() {
        let error = parsed(&["--backend", "kube"]).err().expect("refused");
        assert!(error.contains("--image"), "{error}");
        let args = parsed(&[
            "--backend",
            "kube",
            "--namespace",
            "sandboxes",
            "--image",
            "example.invalid/corral@sha256:00",
            "--runtime-class",
            "gvisor",
            "--credential-secret",
            "worker-cred",
        ])
        .expect("parses");
        assert_eq!(
            args.backend,
            BackendArgs::Kube {
                namespace: "sandboxes".into(),
                image: "example.invalid/corral@sha256:00".into(),
                runtime_class: Some("gvisor".into()),
                credential_secret: Some("worker-cred".into()),
            }
        );
    }

    #[test]
    fn agent_sandbox_needs_a_template_and_a_way_to_reach_workers() {
        for (args, missing) in [
            (
                vec!["--backend", "agent-sandbox", "--sandbox-template", "t"],
                "--worker-url-template",
            ),
            (
                vec![
                    "--backend",
                    "agent-sandbox",
                    "--worker-url-template",
                    "http://{id}.ns.svc:8091",
                ],
                "--sandbox-template",
            ),
        ] {
            let error = parsed(&args).err().expect("refused");
            assert!(error.contains(missing), "{error}");
        }
        let args = parsed(&[
            "--backend",
            "agent-sandbox",
            "--sandbox-template",
            "python",
            "--warm-pool",
            "hot",
            "--worker-url-template",
            "http://{id}.ns.svc:8091",
        ])
        .expect("parses");
        assert_eq!(
            args.backend,
            BackendArgs::AgentSandbox {
                namespace: "corral".into(),
                template: "python".into(),
                warm_pool: Some("hot".into()),
            }
        );
    }

    #[test]
    fn an_unknown_backend_or_flag_is_refused() {
        assert!(parsed(&["--backend", "nomad"]).is_err());
        assert!(parsed(&["--bogus"]).is_err());
        assert!(parse(&[]).is_err(), "Valkey is required (POOL-11)");
    }

    #[tokio::test]
    async fn a_backend_in_the_wrong_pool_mode_or_a_bad_template_is_refused_before_anything_starts()
    {
        let platform = Settings {
            pool_mode: PoolModeSetting::PlatformOperator,
            ..Settings::default()
        };
        let local = parsed(&[]).expect("parses");
        let error = start(&local, &platform).await.expect_err("refused");
        assert!(error.contains("CORRAL_POOL_MODE=controller"), "{error}");
        let claims = parsed(&[
            "--backend",
            "agent-sandbox",
            "--sandbox-template",
            "python",
            "--worker-url-template",
            "http://{id}.ns.svc:8091",
        ])
        .expect("parses");
        let error = start(&claims, &Settings::default())
            .await
            .expect_err("refused");
        assert!(error.contains("platform_operator"), "{error}");
        let bad = parsed(&["--worker-url-template", "http://nowhere:8091"]).expect("parses");
        let error = start(&bad, &Settings::default())
            .await
            .expect_err("refused");
        assert!(error.contains("{id}"), "{error}");
    }
}
