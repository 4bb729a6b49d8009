//! `corral controller`: the reconciler that keeps the warm pool.
//!
//! `corral controller --valkey URL [OPTIONS]` (the flags are [`corral::cli::ReconcileArgs`]).
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
//!
//! `--health-listen ADDR` serves `GET /healthz` and `GET /readyz` there ([`crate::health`]):
//! ready once a pass has reached the store, and while the last one did. Off by default; `corral
//! up` runs its own controller loop without it.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use corral::cli::{
    BackendKind, ControllerArgs, ControllerCommand, ReconcileArgs, WorkerPodArgs, WorkerPodOptions,
    WorkersNamespace,
};
use corral_contract::{Locator, WorkerClient, credential};
use corral_controller::claim::{AgentSandbox, AgentSandboxBackend, ClaimSettings};
use corral_controller::kube::{Bound, KubeBackend, KubeSettings, worker_pod_template};
use corral_controller::local::LocalBackend;
use corral_controller::{Backend, Reconciler, WorkerControl};
use corral_core::config::{PoolModeSetting, Settings};
use corral_core::ids::ImageId;
use corral_store::ValkeyStore;

use crate::health::{self, Readiness};

struct Args {
    valkey: String,
    pool: String,
    state_dir: PathBuf,
    period: Duration,
    backend: BackendArgs,
    worker_url_template: Option<String>,
    health_listen: Option<SocketAddr>,
}

/// Which backend, with what only it needs.
#[derive(Debug, PartialEq, Eq)]
enum BackendArgs {
    Local,
    Kube {
        namespace: String,
        image: String,
        pod: WorkerPodOptions,
    },
    AgentSandbox {
        namespace: String,
        template: String,
        warm_pool: Option<String>,
    },
}

impl Args {
    /// What the parsed flags ask for. The parser has refused a missing `--valkey` and a backend
    /// without what it needs already; these checks only keep that true for any caller.
    fn from_flags(flags: ReconcileArgs) -> Result<Self, String> {
        let ReconcileArgs {
            valkey,
            pool,
            workers: WorkersNamespace { namespace },
            period_ms,
            backend,
            state_dir,
            image,
            pod,
            sandbox_template,
            warm_pool,
            worker_url_template,
            health_listen,
        } = flags;
        let valkey = valkey
            .filter(|url| !url.is_empty())
            .ok_or("--valkey URL is required (dynamic controller mode requires Valkey, POOL-11)")?;
        let backend = match backend {
            BackendKind::Local => BackendArgs::Local,
            BackendKind::Kube => BackendArgs::Kube {
                namespace,
                image: image
                    .ok_or("--backend kube needs --image REF (the worker image, by digest)")?,
                pod,
            },
            BackendKind::AgentSandbox => {
                if worker_url_template.is_none() {
                    return Err(String::from(
                        "--backend agent-sandbox needs --worker-url-template http://HOST:PORT with {id}",
                    ));
                }
                BackendArgs::AgentSandbox {
                    namespace,
                    template: sandbox_template
                        .ok_or("--backend agent-sandbox needs --sandbox-template NAME")?,
                    warm_pool,
                }
            }
        };
        Ok(Self {
            valkey,
            pool,
            state_dir,
            period: Duration::from_millis(period_ms.clamp(50, 60_000)),
            backend,
            worker_url_template,
            health_listen,
        })
    }
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

/// How the kube backend makes worker pods, from its flags and the controller's own settings:
/// the pods reach the egress proxy this controller was configured with, and accept a weaker jail
/// exactly when the controller was told to (decision 0032).
fn kube_settings(
    namespace: &str,
    pool: &str,
    image: &str,
    pod: &WorkerPodOptions,
    settings: &Settings,
) -> Result<KubeSettings, String> {
    let mut kube = KubeSettings::new(namespace, pool, ImageId(image.to_owned()));
    kube.runtime_class.clone_from(&pod.runtime_class);
    if let Some(secret) = &pod.credential_secret {
        kube.credential_secret.clone_from(secret);
    }
    if let Some(cpu) = &pod.worker_cpu {
        kube.resources.cpu = Bound::parse(cpu).map_err(|e| format!("--worker-cpu: {e}"))?;
    }
    if let Some(memory) = &pod.worker_memory {
        kube.resources.memory =
            Bound::parse(memory).map_err(|e| format!("--worker-memory: {e}"))?;
    }
    kube.worker_env.extend(
        settings
            .worker_env()
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value)),
    );
    kube.validate()?;
    Ok(kube)
}

/// `corral controller worker-pod`: the PodTemplate of the pool's worker pods, as JSON.
fn print_worker_pod(args: &WorkerPodArgs) -> ExitCode {
    let printed = Settings::from_lookup(|name| std::env::var(name).ok())
        .map_err(|error| format!("{error} ({})", error.code()))
        .and_then(|settings| {
            kube_settings(
                &args.workers.namespace,
                &args.pool,
                &args.image,
                &args.pod,
                &settings,
            )
        })
        .and_then(|kube| {
            let template = worker_pod_template(&kube, &kube.image);
            serde_json::to_string_pretty(&template).map_err(|e| e.to_string())
        });
    match printed {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("corral controller worker-pod: {error}");
            ExitCode::from(2)
        }
    }
}

/// `corral controller`.
pub fn run(args: ControllerArgs) -> ExitCode {
    let flags = match args.command {
        Some(ControllerCommand::NetworkPolicy(policy)) => {
            return crate::network_policy_cmd::run(&policy);
        }
        Some(ControllerCommand::WorkerPod(pod)) => return print_worker_pod(&pod),
        None => args.reconcile,
    };
    let args = match Args::from_flags(flags) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("corral controller: {error}");
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
            pod,
        } => {
            if platform {
                return Err(mode_mismatch("kube"));
            }
            let token = cluster_credential()?;
            let kube_settings = kube_settings(namespace, &args.pool, image, pod, settings)?;
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

/// Reconciles every period until SIGINT or SIGTERM, serving the health endpoints first when
/// asked (so that `/healthz` answers while the store is being reached).
async fn reconcile<B: Backend>(
    args: &Args,
    settings: &Settings,
    backend: B,
    control: WorkerClient,
) -> Result<ExitCode, String> {
    let readiness = Readiness::default();
    if let Some(address) = args.health_listen {
        let bound = health::serve(address, readiness.clone()).await?;
        eprintln!("corral controller: /healthz and /readyz on http://{bound}");
    }
    let store = ValkeyStore::connect(&args.valkey, &args.pool)
        .await
        .map_err(|e| e.to_string())?;
    let reconciler = Reconciler::new(store, backend, control, settings.pool());
    eprintln!(
        "corral controller: reconciling pool {:?} every {:?}",
        args.pool, args.period
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    };
    run_passes(&reconciler, args.period, &readiness, stop).await;
    Ok(ExitCode::SUCCESS)
}

/// A pass every `period` until `stop` resolves; `readiness` follows each pass's reach of the
/// store.
async fn run_passes<B: Backend, C: WorkerControl>(
    reconciler: &Reconciler<B, C>,
    period: Duration,
    readiness: &Readiness,
    stop: impl Future<Output = ()>,
) {
    reconciler
        .run(period, stop, |pass| {
            readiness.passed(pass.coordinated);
            if !pass.coordinated {
                eprintln!(
                    "corral controller: coordination unavailable; nothing built (fail closed)"
                );
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser as _;
    use corral::cli::{Cli, Command};

    /// `corral controller ARGS`, as the binary parses it.
    fn parse(args: &[&str]) -> Result<Args, String> {
        let argv = ["corral", "controller"].iter().chain(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        let Command::Controller(controller) = cli.command else {
            panic!("parsed as another command");
        };
        assert!(controller.command.is_none(), "parsed as a tool");
        Args::from_flags(controller.reconcile)
    }

    fn parsed(args: &[&str]) -> Result<Args, String> {
        let args: Vec<&str> = ["--valkey", "redis://127.0.0.1:1"]
            .iter()
            .chain(args)
            .copied()
            .collect();
        parse(&args)
    }

    /// A backend with nothing to do, and a control that never resets: a pool of no worker.
    struct Empty;

    impl Backend for Empty {
        fn image(&self) -> ImageId {
            ImageId("test-image".to_owned())
        }
        async fn create(
            &self,
            _: corral_core::ids::WorkerId,
            _: &ImageId,
            _: Option<corral_core::time::UnixMillis>,
        ) -> corral_core::pool::Outcome {
            corral_core::pool::Outcome::Failed
        }
        async fn delete(&self, _: corral_core::ids::WorkerId) -> corral_core::pool::Outcome {
            corral_core::pool::Outcome::Done
        }
        async fn list(
            &self,
        ) -> Result<
            std::collections::BTreeSet<corral_core::ids::WorkerId>,
            corral_core::store::Unavailable,
        > {
            Ok(std::collections::BTreeSet::new())
        }
    }

    impl WorkerControl for Empty {
        async fn reset(
            &self,
            _: corral_core::ids::WorkerId,
            _: corral_core::ids::OpToken,
        ) -> Option<corral_core::reset::ResetEvidence> {
            None
        }
    }

    /// Polls `GET path` until it answers `want`, for at most `within`.
    async fn answers(port: u16, path: &'static str, want: u16, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if health::status(port, path).await == Some(want) {
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn health_listen_is_alive_at_once_and_ready_while_passes_reach_the_store() {
        let test = "health_listen_is_alive_at_once_and_ready_while_passes_reach_the_store";
        let Some(mut valkey) = corral_store::valkey_server::ValkeyServer::start_or_skip(test)
        else {
            return;
        };
        let readiness = Readiness::default();
        let port = health::serve("127.0.0.1:0".parse().unwrap(), readiness.clone())
            .await
            .expect("binds")
            .port();
        // Before the loop's first pass: alive, not ready.
        assert_eq!(health::status(port, "/healthz").await, Some(200));
        assert_eq!(health::status(port, "/readyz").await, Some(503));
        let store = ValkeyStore::connect(&valkey.url(), "health")
            .await
            .expect("connects");
        let config = corral_core::pool::PoolConfig {
            warm_min: 0,
            target_idle: 0,
            ..corral_core::pool::PoolConfig::default()
        };
        let reconciler = Reconciler::new(store, Empty, Empty, config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let passes = tokio::spawn({
            let readiness = readiness.clone();
            async move {
                let stop = async move {
                    let _ = stopped.await;
                };
                run_passes(&reconciler, Duration::from_millis(50), &readiness, stop).await;
            }
        });
        assert!(
            answers(port, "/readyz", 200, Duration::from_secs(20)).await,
            "ready after a pass that reached the store"
        );
        // The store is lost: the next pass does nothing (POOL-11) and the controller is not ready.
        valkey.kill();
        assert!(
            answers(port, "/readyz", 503, Duration::from_secs(30)).await,
            "not ready while passes cannot reach the store"
        );
        assert_eq!(health::status(port, "/healthz").await, Some(200));
        let _ = stop.send(());
        passes.await.expect("the loop stops when asked");
    }

    #[test]
    fn health_listen_is_off_unless_asked_and_takes_an_address() {
        assert_eq!(parsed(&[]).expect("parses").health_listen, None);
        let args = parsed(&["--health-listen", "0.0.0.0:8081"]).expect("parses");
        assert_eq!(args.health_listen, Some("0.0.0.0:8081".parse().unwrap()));
        assert!(parsed(&["--health-listen", "localhost"]).is_err());
    }

    #[test]
    fn the_period_is_kept_within_its_bounds() {
        let period = |ms: &str| parsed(&["--period-ms", ms]).expect("parses").period;
        assert_eq!(period("1"), Duration::from_millis(50));
        assert_eq!(period("600000"), Duration::from_millis(60_000));
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
            "--worker-cpu",
            "250m:1",
        ])
        .expect("parses");
        assert_eq!(
            args.backend,
            BackendArgs::Kube {
                namespace: "sandboxes".into(),
                image: "example.invalid/corral@sha256:00".into(),
                pod: WorkerPodOptions {
                    runtime_class: Some("gvisor".into()),
                    credential_secret: Some("worker-cred".into()),
                    worker_cpu: Some("250m:1".into()),
                    worker_memory: None,
                },
            }
        );
    }

    /// The kube settings `corral controller --backend kube` would make from `pod` and `env`.
    fn kube_from(pod: &WorkerPodOptions, env: &[(&str, &str)]) -> Result<KubeSettings, String> {
        let settings = Settings::from_lookup(|name| {
            env.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        })
        .map_err(|e| e.to_string())?;
        kube_settings("corral", "default", "img@sha256:00", pod, &settings)
    }

    #[test]
    fn kube_worker_pods_get_the_resources_asked_for_and_refuse_a_bad_quantity() {
        let kube = kube_from(
            &WorkerPodOptions {
                worker_cpu: Some("250m:1".into()),
                worker_memory: Some("4Gi".into()),
                ..WorkerPodOptions::default()
            },
            &[],
        )
        .expect("settings");
        assert_eq!(
            (
                kube.resources.cpu.request.as_str(),
                kube.resources.cpu.limit.as_str()
            ),
            ("250m", "1")
        );
        assert_eq!(
            (
                kube.resources.memory.request.as_str(),
                kube.resources.memory.limit.as_str()
            ),
            ("4Gi", "4Gi")
        );
        for (cpu, memory, flag) in [
            (Some("lots"), None, "--worker-cpu"),
            (Some("1:"), None, "--worker-cpu"),
            (Some("1.5.2"), None, "--worker-cpu"),
            (None, Some("3GB"), "--worker-memory"),
            (None, Some("-1Gi"), "--worker-memory"),
            (None, Some(""), "--worker-memory"),
        ] {
            let error = kube_from(
                &WorkerPodOptions {
                    worker_cpu: cpu.map(str::to_owned),
                    worker_memory: memory.map(str::to_owned),
                    ..WorkerPodOptions::default()
                },
                &[],
            )
            .expect_err("a bad quantity is refused");
            assert!(error.starts_with(flag), "{cpu:?} {memory:?}: {error}");
            assert!(error.contains("not a Kubernetes quantity"), "{error}");
        }
    }

    #[test]
    fn kube_worker_pods_get_the_proxy_and_the_weaker_jail_only_when_the_controller_has_them() {
        let none = kube_from(&WorkerPodOptions::default(), &[]).expect("settings");
        assert!(none.worker_env.is_empty(), "{:?}", none.worker_env);
        let both = kube_from(
            &WorkerPodOptions::default(),
            &[
                ("SANDBOX_EGRESS_PROXY_URL", "http://10.96.100.20:3128"),
                ("CORRAL_JAIL_ALLOW_WEAKER_ISOLATION", "1"),
            ],
        )
        .expect("settings");
        assert_eq!(
            both.worker_env,
            vec![
                (
                    "SANDBOX_EGRESS_PROXY_URL".to_owned(),
                    "http://10.96.100.20:3128".to_owned()
                ),
                (
                    "CORRAL_JAIL_ALLOW_WEAKER_ISOLATION".to_owned(),
                    "true".to_owned()
                ),
            ]
        );
        let off = kube_from(
            &WorkerPodOptions::default(),
            &[("CORRAL_JAIL_ALLOW_WEAKER_ISOLATION", "false")],
        )
        .expect("settings");
        assert!(off.worker_env.is_empty(), "{:?}", off.worker_env);
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
        assert!(parsed(&["--period-ms", "soon"]).is_err());
        assert!(parsed(&["--image"]).is_err(), "a flag without its value");
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
