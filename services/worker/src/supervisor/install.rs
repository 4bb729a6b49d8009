//! A run's dependencies, installed before its code (PKG-2, PKG-3, PKG-5, PKG-6): the installer
//! runs in the run's own jail as untrusted code, bounded by
//! `SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS`, and reaches nothing but the broker, through a
//! plain relay that exists only while it runs. A failure is a structured `not_run` record; the
//! code never starts, and the workspace the run was given is what the parent keeps.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use corral_contract::messages::{InstallOrder, InstallReport};
use corral_core::jail::{Language, NotRun, Posture};
use corral_core::packages::registries::{
    JAIL_BROKER_PORT, NPM_FETCH_RETRIES, NPM_FETCH_RETRY_MAX_MS, NPM_FETCH_RETRY_MIN_MS,
    PIP_RETRIES, PIP_TIMEOUT_SECONDS,
};
use corral_core::packages::resolve::{Cause, DependencyFailure};

use super::command::PYTHON_PREFIX;
use super::supervise::millis;
use super::{ActiveRun, Worker};
use crate::relay::ProxyAddress;
use crate::result::{RunResult, note};
use crate::workspace::RunDirs;

/// How much of the installer's output goes into the diagnostics.
const OUTPUT_TAIL_CHARS: usize = 1_500;
/// How long asking the broker whether the registry was unreachable may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

impl Worker {
    /// Installs what `order` asks for `language` in the jail of `run`, before the code. On
    /// failure, the reply's `dependencies` says which packages and why, and the reason is
    /// returned.
    pub(super) fn install(
        &self,
        order: &InstallOrder,
        language: Language,
        run: &mut ActiveRun,
        dirs: &RunDirs,
        posture: &Posture,
        result: &mut RunResult,
    ) -> Result<(), NotRun> {
        let started = Instant::now();
        let specs = specs_to_install(order, dirs);
        if specs.is_empty() {
            return Ok(());
        }
        let fail = |result: &mut RunResult, cause: Cause, why: Option<String>| {
            if let Some(why) = why {
                note(&mut result.reply.diagnostics, why);
            }
            result.reply.dependencies = Some(InstallReport {
                installed: Vec::new(),
                failure: Some(DependencyFailure::of_install(cause, specs.clone())),
                install_ms: millis(started.elapsed()),
            });
            NotRun::DependencyInstallFailed
        };
        let broker = match self.broker() {
            Ok(broker) => broker,
            Err(why) => return Err(fail(result, Cause::InstallFailed, Some(why))),
        };
        let argv = match self.installer(language, order, &specs, dirs, run.uids[1]) {
            Ok(argv) => argv,
            Err(why) => return Err(fail(result, Cause::InstallFailed, Some(why))),
        };
        let timeout = self.settings.bounds.dependency_install_timeout_seconds;
        let mut plan = self.plan(language, run, posture, timeout, None);
        plan.argv = argv;
        plan.env = install_environment(language);
        let (jail, _) = self.start_jail(
            &plan,
            run,
            None,
            Some(broker.clone()),
            &mut result.reply.diagnostics,
            false,
        )?;
        let mut installer = RunResult::default();
        let (observed, _) = self.supervise(jail, run, &mut installer, timeout, None);
        // The broker's route closes with the install: the code never reaches it.
        drop(run.broker_relay.take());
        if observed.wall_expired {
            return Err(fail(result, Cause::TimedOut, None));
        }
        if installer.reply.exit_code != Some(0) {
            let (cause, said) = installer_failure(&installer, order, &broker);
            return Err(fail(result, cause, Some(said)));
        }
        result.reply.dependencies = Some(InstallReport {
            installed: specs,
            failure: None,
            install_ms: millis(started.elapsed()),
        });
        Ok(())
    }

    /// The installer's command line, after writing what it reads into the run's scratch space.
    fn installer(
        &self,
        language: Language,
        order: &InstallOrder,
        specs: &[String],
        dirs: &RunDirs,
        owner: u32,
    ) -> Result<Vec<String>, String> {
        let index = format!(
            "http://127.0.0.1:{JAIL_BROKER_PORT}/v1/packages/{}",
            order.token
        );
        let scratch = dirs.scratch().join("tmp").join(".corral");
        let write = |name: &str, text: &str| {
            std::fs::write(scratch.join(name), text)
                .map_err(|e| format!("install: write {name}: {e}"))
        };
        std::fs::create_dir_all(&scratch).map_err(|e| format!("install: {e}"))?;
        match language {
            Language::Python => {
                let stack = self
                    .python_stack()
                    .map_err(|why| format!("no baked stack to install with: {why}"))?;
                // An empty environment of its own, so that pip sees the stack's distributions as
                // installed but outside it: it fetches none of them again, and never tries to
                // remove one from the read-only stack when the run pins another version.
                let installer = scratch.join("installer");
                std::fs::create_dir_all(installer.join("bin"))
                    .map_err(|e| format!("install: {e}"))?;
                std::fs::write(
                    installer.join("pyvenv.cfg"),
                    "home = /usr/bin\ninclude-system-site-packages = false\n",
                )
                .map_err(|e| format!("install: {e}"))?;
                let python = installer.join("bin/python3");
                if !python.exists() {
                    std::os::unix::fs::symlink("/usr/bin/python3", &python)
                        .map_err(|e| format!("install: {e}"))?;
                }
                write("constraints.txt", &(order.constraints.join("\n") + "\n"))?;
                let site = stack.join("lib/python3.11/site-packages");
                let mut argv = vec![
                    "/tmp/.corral/installer/bin/python3".to_owned(),
                    "-c".to_owned(),
                    pip_runner(&site.to_string_lossy()),
                    "install".to_owned(),
                    "--prefix".to_owned(),
                    PYTHON_PREFIX.to_owned(),
                    "--no-cache-dir".to_owned(),
                    "--no-input".to_owned(),
                    "--disable-pip-version-check".to_owned(),
                    "--no-warn-script-location".to_owned(),
                    "--retries".to_owned(),
                    PIP_RETRIES.to_string(),
                    "--timeout".to_owned(),
                    PIP_TIMEOUT_SECONDS.to_string(),
                    "--index-url".to_owned(),
                    format!("{index}/pypi/simple/"),
                    "--constraint".to_owned(),
                    "/tmp/.corral/constraints.txt".to_owned(),
                    "--".to_owned(),
                ];
                argv.extend(specs.iter().cloned());
                give(&scratch, owner)?;
                Ok(argv)
            }
            Language::Node => {
                let mut argv = npm_install(&order.token);
                argv.push("--".to_owned());
                argv.extend(specs.iter().cloned());
                give(&scratch, owner)?;
                Ok(argv)
            }
        }
    }

    /// The broker's address, from `SANDBOX_PACKAGE_BROKER_URL`.
    pub(super) fn broker(&self) -> Result<ProxyAddress, String> {
        let url = self
            .settings
            .packages
            .broker_url
            .as_deref()
            .ok_or("SANDBOX_PACKAGE_BROKER_URL is unset: no package broker to install from")?;
        let origin = url.trim().split('/').take(3).collect::<Vec<_>>().join("/");
        ProxyAddress::parse(&origin)
            .map_err(|e| e.replace("SANDBOX_EGRESS_PROXY_URL", "SANDBOX_PACKAGE_BROKER_URL"))
    }
}

/// The specs `order` installs: all but an inferred import that the workspace itself provides.
fn specs_to_install(order: &InstallOrder, dirs: &RunDirs) -> Vec<String> {
    order
        .install
        .iter()
        .filter(|item| {
            // An inferred import that the workspace itself provides is not installed.
            item.inferred_from.as_deref().is_none_or(|module| {
                let workspace = dirs.workspace();
                !workspace.join(format!("{module}.py")).exists() && !workspace.join(module).is_dir()
            })
        })
        .map(|item| item.spec.clone())
        .collect()
}

/// Why an installer that exited nonzero failed, and what it said (its output's tails).
fn installer_failure(
    installer: &RunResult,
    order: &InstallOrder,
    broker: &ProxyAddress,
) -> (Cause, String) {
    // The token is the run's alone and dies with it; it is not repeated to the model.
    let said = format!(
        "the installer exited {:?}: {}{}",
        installer.reply.exit_code,
        output_tail(&installer.reply.stderr),
        output_tail(&installer.reply.stdout)
    )
    .replace(&order.token, "<token>");
    let cause = if registry_was_unreachable(broker, &order.token) {
        Cause::RegistryUnreachable
    } else {
        Cause::InstallFailed
    };
    (cause, said)
}

/// The last `OUTPUT_TAIL_CHARS` characters of an installer's output stream.
fn output_tail(stream: &corral_core::bounds::OutputStream) -> String {
    let text = &stream.text;
    let skip = text.chars().count().saturating_sub(OUTPUT_TAIL_CHARS);
    text.chars().skip(skip).collect::<String>()
}

/// `npm install` into `/workspace` through the broker's jail address with `token`: no scripts,
/// no configuration but its arguments, a cache in the run's scratch space, the bounded retries
/// (PKG-5). The caller adds what to install (nothing: the package.json in `/workspace`).
pub(super) fn npm_install(token: &str) -> Vec<String> {
    let index = format!("http://127.0.0.1:{JAIL_BROKER_PORT}/v1/packages/{token}");
    [
        "/usr/bin/npm",
        "install",
        "--prefix",
        "/workspace",
        "--no-audit",
        "--no-fund",
        "--no-update-notifier",
        "--ignore-scripts",
        "--userconfig",
        "/dev/null",
        "--cache",
        "/tmp/.corral/npm",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain([
        "--registry".to_owned(),
        format!("{index}/npm/"),
        "--fetch-retries".to_owned(),
        NPM_FETCH_RETRIES.to_string(),
        "--fetch-retry-mintimeout".to_owned(),
        NPM_FETCH_RETRY_MIN_MS.to_string(),
        "--fetch-retry-maxtimeout".to_owned(),
        NPM_FETCH_RETRY_MAX_MS.to_string(),
    ])
    .collect()
}

/// Gives `dir` and everything in it (never following a link) to the run's uid, which the
/// installer runs as.
pub(super) fn give(dir: &std::path::Path, owner: u32) -> Result<(), String> {
    let own = |path: &std::path::Path| {
        std::os::unix::fs::lchown(path, Some(owner), Some(owner))
            .map_err(|e| format!("install: own {}: {e}", path.display()))
    };
    own(dir)?;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("install: {e}"))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            give(&path, owner)?;
        } else {
            own(&path)?;
        }
    }
    Ok(())
}

/// The installer's source: pip from the stack's site-packages, run by the empty environment's
/// interpreter (`-c`, so that the stack is on its path only for pip).
fn pip_runner(site: &str) -> String {
    format!(
        "import sys; sys.path.insert(0, {site:?}); from pip._internal.cli.main import main; sys.argv[0] = 'pip'; sys.exit(main())"
    )
}

/// The installer's environment: nothing of the supervisor's; pip and npm read no configuration
/// but their arguments.
pub(super) fn install_environment(language: Language) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("TMPDIR", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("TERM", "dumb"),
    ];
    match language {
        Language::Python => env.extend([
            ("PIP_CONFIG_FILE", "/dev/null"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
        ]),
        Language::Node => env.push(("npm_config_update_notifier", "false")),
    }
    env.into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Asks the broker once whether this run's registry was unreachable (pip reports a refused index
/// only as "no matching distribution"). Any failure to ask counts as "not known to be".
pub(super) fn registry_was_unreachable(broker: &ProxyAddress, token: &str) -> bool {
    let ask = || -> std::io::Result<String> {
        let address = (broker.host.as_str(), broker.port);
        let addresses: Vec<_> = std::net::ToSocketAddrs::to_socket_addrs(&address)?.collect();
        let first = addresses.first().ok_or(std::io::ErrorKind::NotFound)?;
        let mut stream = TcpStream::connect_timeout(first, STATUS_TIMEOUT)?;
        stream.set_read_timeout(Some(STATUS_TIMEOUT))?;
        write!(
            stream,
            "GET /v1/packages/{token}/status HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n\r\n",
            broker.host, broker.port
        )?;
        let mut answer = String::new();
        stream.take(64 * 1024).read_to_string(&mut answer)?;
        Ok(answer)
    };
    ask().is_ok_and(|answer| answer.contains("\"registry_unreachable\":true"))
}
