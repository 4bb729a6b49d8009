//! `corral controller`: the reconciler that keeps the warm pool, with the `local` backend (worker
//! processes on this machine, each `corral worker serve`).
//!
//! `corral controller --valkey URL [--pool NAME] [--state-dir DIR] [--period-ms N]`
//!
//! Pool settings come from the environment (`corral config check` shows them). The workers'
//! credential is read from `CORRAL_WORKER_TOKEN_FILE`, or generated into `<state-dir>/worker-token`
//! (mode 0600) for the API to read. It runs until SIGINT or SIGTERM; the workers it started keep
//! running and a restarted controller finds them again from their records.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use corral_controller::Reconciler;
use corral_controller::http_control::HttpControl;
use corral_controller::local::LocalBackend;
use corral_core::config::Settings;
use corral_store::ValkeyStore;

struct Args {
    valkey: String,
    pool: String,
    state_dir: PathBuf,
    period: Duration,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        valkey: String::new(),
        pool: String::from("default"),
        state_dir: PathBuf::from("/var/lib/corral/workers"),
        period: Duration::from_millis(500),
    };
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
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if parsed.valkey.is_empty() {
        return Err(String::from(
            "--valkey URL is required (dynamic controller mode requires Valkey, POOL-11)",
        ));
    }
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

/// The workers' credential: from `CORRAL_WORKER_TOKEN_FILE`, or generated once into the state dir.
pub fn credential(state_dir: &Path) -> Result<String, String> {
    if let Some(path) = std::env::var_os("CORRAL_WORKER_TOKEN_FILE") {
        return std::fs::read_to_string(&path)
            .map(|t| t.trim().to_string())
            .map_err(|e| format!("CORRAL_WORKER_TOKEN_FILE: {e}"));
    }
    let path = state_dir.join("worker-token");
    if let Ok(existing) = std::fs::read_to_string(&path) {
        return Ok(existing.trim().to_string());
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| format!("no randomness for a credential: {e}"))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, &token).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| e.to_string())?;
    Ok(token)
}

pub fn run(args: &[String]) -> ExitCode {
    let args = match parse(args) {
        Ok(args) => args,
        Err(error) => {
            eprintln!(
                "corral controller: {error}\nusage: corral controller --valkey URL [--pool NAME] [--state-dir DIR] [--period-ms N]"
            );
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
    if let Err(error) = std::fs::create_dir_all(&args.state_dir) {
        eprintln!("corral controller: {}: {error}", args.state_dir.display());
        return ExitCode::from(1);
    }
    let token = match credential(&args.state_dir) {
        Ok(token) => token,
        Err(error) => {
            eprintln!("corral controller: {error}");
            return ExitCode::from(1);
        }
    };
    let backend = match local_backend(&args.state_dir, &token, &[]) {
        Ok(backend) => backend,
        Err(error) => {
            eprintln!("corral controller: {error}");
            return ExitCode::from(1);
        }
    };
    let store = match ValkeyStore::connect(&args.valkey, &args.pool).await {
        Ok(store) => store,
        Err(error) => {
            eprintln!("corral controller: {error}");
            return ExitCode::from(1);
        }
    };
    let control = HttpControl::new(args.state_dir.clone(), token);
    let reconciler = Reconciler::new(store, backend, control, settings.pool());
    eprintln!(
        "corral controller: reconciling pool {:?} every {:?}",
        args.pool, args.period
    );
    let mut interval = tokio::time::interval(args.period);
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                eprintln!("corral controller: {error}");
                return ExitCode::from(1);
            }
        };
    loop {
        tokio::select! {
            biased;
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
            _ = terminate.recv() => return ExitCode::SUCCESS,
            _ = interval.tick() => {
                let pass = reconciler.pass().await;
                if !pass.coordinated {
                    eprintln!("corral controller: coordination unavailable; nothing built (fail closed)");
                }
            }
        }
    }
}
