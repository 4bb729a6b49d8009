//! Package registries and dead ports that tests start on loopback and fill themselves: a PyPI
//! index (pypiserver) that serves a directory of wheels, an npm registry (verdaccio) that takes
//! `npm publish`, a port that accepts and never answers, and a port that refuses.
//!
//! Neither registry ever reaches past itself: pypiserver runs with its fallback redirect disabled,
//! and verdaccio's configuration has no uplinks, so a package the test did not provide is a 404.
//! `scripts/setup-services --tests` installs both. A test first asks [`pypiserver_missing`] or
//! [`verdaccio_missing`] and calls [`crate::skip`] with [`crate::Need::Services`] when either says
//! why not; a server that is installed but fails to start is an `Err` from `start`, and fails the
//! test.
//!
//! Each server gets a free port, a temporary directory for its configuration, storage and log,
//! and is ready when its health endpoint answers 200, polled under a deadline. Dropping it kills
//! and reaps the process and removes the directory.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The Python that builds wheels and runs pip in tests: Debian's, which always has `zipfile`.
pub const SYSTEM_PYTHON: &str = "/usr/bin/python3";
/// The Python that runs pypiserver: the one on `PATH`, as `scripts/setup-services` installs it.
pub const PYPISERVER_PYTHON: &str = "python3";
/// Names the verdaccio executable, overriding [`VERDACCIO_DEFAULT`].
pub const VERDACCIO_VAR: &str = "CORRAL_VERDACCIO";
/// Where `scripts/setup-services --tests` installs verdaccio.
pub const VERDACCIO_DEFAULT: &str = "/opt/corral/test-tools/verdaccio/node_modules/.bin/verdaccio";

/// How long a server may take from spawn to its first 200 (node under a loaded CI takes seconds).
const SERVER_READY_TIMEOUT_MS: u64 = 60_000;
/// The pause between two readiness probes.
const READY_POLL_INTERVAL_MS: u64 = 50;
/// How long one HTTP probe may take to connect, send and read its status line.
const PROBE_TIMEOUT_MS: u64 = 2_000;
/// Starts tried when a server exits before it is ready (another process took its port).
const START_ATTEMPTS_MAX: usize = 3;
/// Connections a [`SilentPort`] holds open; later ones are counted, then closed.
pub const SILENT_CONNECTIONS_MAX: usize = 1024;

/// A fresh directory under the system's temporary directory, removed with its contents on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `corral-<label>-<pid>-<n>`, unique within this process.
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("corral-{label}-{}-{n}", std::process::id()));
        // A leftover of an earlier process that had this pid.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|error| panic!("cannot create {}: {error}", path.display()));
        TempDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Writes a pure-Python wheel, `{name}-{version}-py3-none-any.whl` with the name normalized as
/// the wheel spec says, into `dir` and returns its path. It holds `modules` (path inside the
/// wheel, source), METADATA with one `Requires-Dist` per entry of `requires`, WHEEL and a RECORD
/// of sha256 hashes. Built by [`SYSTEM_PYTHON`]'s `zipfile`; panics where that fails.
pub fn build_wheel(
    dir: &Path,
    name: &str,
    version: &str,
    requires: &[&str],
    modules: &[(&str, &str)],
) -> PathBuf {
    assert!(
        !name.is_empty() && !version.is_empty(),
        "a wheel needs a name and a version"
    );
    for (path, _) in modules {
        assert!(
            is_relative_inside(path),
            "module path {path:?} must stay inside the wheel"
        );
    }
    let mut command = Command::new(SYSTEM_PYTHON);
    command
        .args(["-I", "-c", WHEEL_SCRIPT])
        .arg(dir)
        .args([name, version])
        .arg(requires.len().to_string())
        .args(requires);
    for (path, source) in modules {
        command.args([path, source]);
    }
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("cannot run {SYSTEM_PYTHON}: {error}"));
    assert!(
        output.status.success(),
        "building the wheel {name} {version} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// argv: out_dir name version n_requires requires… (path source)…; prints the wheel's path.
/// Entries carry a fixed date so that the same inputs make the same bytes.
const WHEEL_SCRIPT: &str = r#"
import base64, csv, hashlib, io, os, re, sys, zipfile
out, name, version, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
requires, rest = sys.argv[5:5 + n], sys.argv[5 + n:]
dist = re.sub(r"[-_.]+", "_", name).lower()
ver = version.replace("-", "_")
info = f"{dist}-{ver}.dist-info"
metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
wheel = "Wheel-Version: 1.0\nGenerator: corral-testkit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
files = list(zip(rest[0::2], rest[1::2]))
files += [(f"{info}/METADATA", metadata), (f"{info}/WHEEL", wheel)]
path = os.path.join(out, f"{dist}-{ver}-py3-none-any.whl")
record = io.StringIO()
rows = csv.writer(record, lineterminator="\n")
def put(z, arc, data):
    entry = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
    entry.compress_type = zipfile.ZIP_DEFLATED
    entry.external_attr = 0o644 << 16
    z.writestr(entry, data)
with zipfile.ZipFile(path, "w") as z:
    for arc, text in files:
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.writerow([arc, f"sha256={digest}", len(data)])
        put(z, arc, data)
    rows.writerow([f"{info}/RECORD", "", ""])
    put(z, f"{info}/RECORD", record.getvalue().encode())
print(path)
"#;

/// Why pypiserver cannot run here (naming what installs it), or `None` when
/// `python3 -m pypiserver` runs.
pub fn pypiserver_missing() -> Option<String> {
    let output = match Command::new(PYPISERVER_PYTHON)
        .args(["-m", "pypiserver", "--version"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(output) => output,
        Err(error) => return Some(format!("cannot run {PYPISERVER_PYTHON}: {error}")),
    };
    if output.status.success() {
        return None;
    }
    Some(format!(
        "{PYPISERVER_PYTHON} -m pypiserver does not run ({}); scripts/setup-services --tests installs it: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// Why verdaccio or the npm that publishes to it cannot run here, or `None` when both can.
pub fn verdaccio_missing() -> Option<String> {
    let verdaccio = verdaccio_executable();
    if !verdaccio.is_file() {
        return Some(format!(
            "no verdaccio at {} (scripts/setup-services --tests installs it; {VERDACCIO_VAR} names another)",
            verdaccio.display()
        ));
    }
    match Command::new("npm")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
    {
        Ok(output) if output.status.success() => None,
        Ok(output) => Some(format!("npm --version failed: {}", output.status)),
        Err(error) => Some(format!("cannot run npm: {error}")),
    }
}

fn verdaccio_executable() -> PathBuf {
    std::env::var_os(VERDACCIO_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(VERDACCIO_DEFAULT))
}

/// pypiserver's health endpoint, as [`pypiserver_command`] names it.
pub const PYPISERVER_HEALTH: &str = "/health";

/// The command of a pypiserver on `127.0.0.1:port` serving the wheels in `packages` (read on every
/// request), without authentication and without any fallback to another index: what
/// [`PyPiServer::start`] runs, and the chaos harness beside its deployment.
pub fn pypiserver_command(packages: &Path, port: u16) -> Command {
    let mut command = Command::new(PYPISERVER_PYTHON);
    command
        .args(["-m", "pypiserver", "run", "-p", &port.to_string()])
        .args(["-i", "127.0.0.1"])
        // No authentication for any action, and no redirect to another index.
        .args(["-a", ".", "-P", ".", "--disable-fallback"])
        .args(["--backend", "simple-dir", "--server", "wsgiref"])
        .args(["--health-endpoint", PYPISERVER_HEALTH])
        .arg(packages);
    command
}

/// A pypiserver on 127.0.0.1 serving the wheels in one directory, without authentication and
/// without any fallback to another index. Killed on drop.
#[derive(Debug)]
pub struct PyPiServer {
    server: Server,
}

impl PyPiServer {
    /// Starts serving `packages` (read on every request: wheels added later are served too) and
    /// returns once its health endpoint answers.
    pub fn start(packages: &Path) -> Result<PyPiServer, String> {
        let packages = std::path::absolute(packages)
            .map_err(|error| format!("{}: {error}", packages.display()))?;
        let server = Server::start("pypiserver", PYPISERVER_HEALTH, |dir, port| {
            let mut command = pypiserver_command(&packages, port);
            command.current_dir(dir);
            command
        })?;
        Ok(PyPiServer { server })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The index pip reads, `http://127.0.0.1:PORT/simple/`.
    pub fn simple_url(&self) -> String {
        format!("{}/simple/", self.server.url())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// How long it took from spawn to its first healthy answer.
    pub fn ready_after(&self) -> Duration {
        self.server.ready_after
    }

    /// `/usr/bin/python3 -m pip <subcommand>` reading only this index: no cache, and none of this
    /// machine's pip configuration (its files and `PIP_*` variables, which may name another index
    /// or a find-links directory). The caller adds the rest of the arguments.
    pub fn pip(&self, subcommand: &str) -> Command {
        let mut command = Command::new(SYSTEM_PYTHON);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("PIP_") {
                command.env_remove(key);
            }
        }
        command
            .env("PIP_CONFIG_FILE", "/dev/null")
            .args(["-m", "pip", subcommand, "--index-url"])
            .arg(self.simple_url())
            .args(["--no-cache-dir", "--disable-pip-version-check"])
            .stdin(Stdio::null());
        command
    }
}

/// A verdaccio on 127.0.0.1 with its storage in a temporary directory, no uplinks (a package
/// nobody published here is a 404), and anonymous reads and publishes. Killed on drop.
#[derive(Debug)]
pub struct Verdaccio {
    server: Server,
    userconfig: PathBuf,
}

impl Verdaccio {
    /// Starts an empty registry and returns once `/-/ping` answers.
    pub fn start() -> Result<Verdaccio, String> {
        let executable = verdaccio_executable();
        let server = Server::start("verdaccio", "/-/ping", |dir, port| {
            let config = dir.join("config.yaml");
            // The write is checked by the start itself: verdaccio exits without its config.
            let _ = std::fs::write(&config, verdaccio_config(dir, port));
            let mut command = Command::new(&executable);
            command.arg("--config").arg(&config).current_dir(dir);
            command
        })?;
        // npm will not publish without a token for the registry; verdaccio lets the anonymous
        // user publish (`publish: $all`), so any token does.
        let userconfig = server.dir.path().join("npmrc");
        let npmrc = format!(
            "registry={url}/\n//127.0.0.1:{port}/:_authToken=corral-testkit\n",
            url = server.url(),
            port = server.port
        );
        std::fs::write(&userconfig, npmrc)
            .map_err(|error| format!("{}: {error}", userconfig.display()))?;
        Ok(Verdaccio { server, userconfig })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// How long it took from spawn to its first healthy answer.
    pub fn ready_after(&self) -> Duration {
        self.server.ready_after
    }

    /// The npm user configuration that points at this registry with a token for it.
    pub fn userconfig(&self) -> &Path {
        &self.userconfig
    }

    /// `npm <subcommand>` against this registry only, with [`Verdaccio::userconfig`] in place of
    /// `~/.npmrc` and a cache of its own. The caller adds the rest and the working directory.
    pub fn npm(&self, subcommand: &str) -> Command {
        let mut command = Command::new("npm");
        command
            .arg(subcommand)
            .arg("--registry")
            .arg(format!("{}/", self.url()))
            .arg("--userconfig")
            .arg(&self.userconfig)
            .arg("--cache")
            .arg(self.server.dir.path().join("npm-cache"))
            .args(["--no-audit", "--no-fund", "--no-update-notifier"])
            .arg("--loglevel=warn")
            .stdin(Stdio::null());
        command
    }

    /// Publishes `name@version` with `dependencies` (name, version range) and `files` (path,
    /// contents) beside its package.json; an `index.js` exporting its name and version is added
    /// unless `files` has one.
    pub fn publish(
        &self,
        name: &str,
        version: &str,
        dependencies: &[(&str, &str)],
        files: &[(&str, &str)],
    ) -> Result<(), String> {
        let package = TempDir::new("npm-package");
        let mut all: Vec<(String, String)> = files
            .iter()
            .map(|(path, text)| (path.to_string(), text.to_string()))
            .collect();
        if !files.iter().any(|(path, _)| *path == "index.js") {
            let index = format!(
                "module.exports = {{ name: {}, version: {} }};\n",
                json_string(name),
                json_string(version)
            );
            all.push(("index.js".to_string(), index));
        }
        all.push((
            "package.json".to_string(),
            package_json(name, version, dependencies),
        ));
        for (path, text) in &all {
            if !is_relative_inside(path) {
                return Err(format!("file path {path:?} must stay inside the package"));
            }
            let target = package.path().join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|error| format!("{}: {error}", parent.display()))?;
            }
            std::fs::write(&target, text)
                .map_err(|error| format!("{}: {error}", target.display()))?;
        }
        let output = self
            .npm("publish")
            .current_dir(package.path())
            .output()
            .map_err(|error| format!("cannot run npm: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "npm publish {name}@{version} failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(())
    }
}

/// Verdaccio's configuration: everything under `dir`, no `uplinks`, and no `proxy` on any package.
fn verdaccio_config(dir: &Path, port: u16) -> String {
    format!(
        "storage: '{storage}'\n\
         auth:\n  htpasswd:\n    file: '{htpasswd}'\n    max_users: -1\n\
         uplinks: {{}}\n\
         packages:\n  '**':\n    access: $all\n    publish: $all\n    unpublish: $all\n\
         publish:\n  allow_offline: true\n\
         web:\n  enable: false\n\
         log: {{ type: stdout, format: pretty, level: warn }}\n\
         listen: 127.0.0.1:{port}\n",
        storage = dir.join("storage").display(),
        htpasswd = dir.join("htpasswd").display(),
    )
}

fn package_json(name: &str, version: &str, dependencies: &[(&str, &str)]) -> String {
    let mut text = format!(
        "{{\n  \"name\": {},\n  \"version\": {},\n  \"main\": \"index.js\",\n  \"dependencies\": {{",
        json_string(name),
        json_string(version)
    );
    for (i, (dependency, range)) in dependencies.iter().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        let _ = write!(
            text,
            "{comma}\n    {}: {}",
            json_string(dependency),
            json_string(range)
        );
    }
    text.push_str(if dependencies.is_empty() {
        "}\n}\n"
    } else {
        "\n  }\n}\n"
    });
    text
}

fn json_string(text: &str) -> String {
    let mut quoted = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(quoted, "\\u{:04x}", u32::from(c));
            }
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

fn is_relative_inside(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path)
            .components()
            .all(|component| matches!(component, Component::Normal(_)))
}

/// A server process on a free loopback port, with its temporary directory and log.
#[derive(Debug)]
struct Server {
    child: Child,
    port: u16,
    ready_after: Duration,
    // Dropped after the child is killed (see `Drop`): the server may write here until then.
    dir: TempDir,
}

impl Server {
    /// Spawns `command(dir, port)` with its output in `dir/server.log` until GET `ready_path`
    /// answers 200. Tries a new port when the process exits first (another took the port).
    fn start(
        what: &str,
        ready_path: &str,
        command: impl Fn(&Path, u16) -> Command,
    ) -> Result<Server, String> {
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS_MAX {
            let dir = TempDir::new(what);
            let port = refused_port();
            match Server::spawn_ready(what, ready_path, command(dir.path(), port), dir, port) {
                Ok(server) => return Ok(server),
                Err(Exited(why)) => failures.push(why),
                Err(NotReady(why)) => return Err(why),
            }
        }
        Err(failures.join("\n"))
    }

    fn spawn_ready(
        what: &str,
        ready_path: &str,
        mut command: Command,
        dir: TempDir,
        port: u16,
    ) -> Result<Server, StartFailure> {
        let log_path = dir.path().join("server.log");
        let log = File::create(&log_path)
            .and_then(|log| Ok((log.try_clone()?, log)))
            .map_err(|error| NotReady(format!("{}: {error}", log_path.display())))?;
        let started = Instant::now();
        let child = command
            .stdin(Stdio::null())
            .stdout(log.0)
            .stderr(log.1)
            .spawn()
            .map_err(|error| NotReady(format!("cannot start {what}: {error}")))?;
        let mut server = Server {
            child,
            port,
            ready_after: Duration::ZERO,
            dir,
        };
        let deadline = started + Duration::from_millis(SERVER_READY_TIMEOUT_MS);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(Exited(format!(
                    "{what} on port {port} exited ({status}) before it was ready: {}",
                    log_tail(&log_path)
                )));
            }
            if http_status(port, ready_path) == Some(200) {
                server.ready_after = started.elapsed();
                return Ok(server);
            }
            if Instant::now() >= deadline {
                return Err(NotReady(format!(
                    "{what} on port {port} did not answer GET {ready_path} with 200 within {SERVER_READY_TIMEOUT_MS} ms: {}",
                    log_tail(&log_path)
                )));
            }
            std::thread::sleep(Duration::from_millis(READY_POLL_INTERVAL_MS));
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Why a server did not start: it exited (worth another port), or it is not answering.
enum StartFailure {
    Exited(String),
    NotReady(String),
}
use StartFailure::{Exited, NotReady};

/// The last lines of a server's log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The status code that `GET path` on 127.0.0.1:`port` answers, or `None` when nothing answers
/// an HTTP status line in time.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    let timeout = Duration::from_millis(PROBE_TIMEOUT_MS);
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&address, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    // The status line is well inside the first 64 bytes: "HTTP/1.1 200 OK\r\n".
    let mut head = [0u8; 64];
    let mut filled = 0;
    while filled < head.len() && !head[..filled].contains(&b'\n') {
        match stream.read(&mut head[filled..]).ok()? {
            0 => break,
            n => filled += n,
        }
    }
    let line = std::str::from_utf8(&head[..filled]).ok()?;
    let mut words = line.split_whitespace();
    words
        .next()
        .filter(|version| version.starts_with("HTTP/"))?;
    words.next()?.parse().ok()
}

/// A port on 127.0.0.1 that nothing listens on, so a dial is refused: bound, read, released.
pub fn refused_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("a bound address").port()
}

/// A port on 127.0.0.1 that accepts every connection and never answers: no byte, no close,
/// until it is dropped. Counts what it accepts, so a test can count dials.
#[derive(Debug)]
pub struct SilentPort {
    address: SocketAddr,
    accepted: Arc<AtomicUsize>,
    stopping: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl SilentPort {
    /// Binds a free port and starts accepting on a thread of its own.
    pub fn start() -> SilentPort {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let address = listener.local_addr().expect("a bound address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (accepted, stopping) = (accepted.clone(), stopping.clone());
            std::thread::spawn(move || hold_silently(&listener, &accepted, &stopping))
        };
        SilentPort {
            address,
            accepted,
            stopping,
            acceptor: Some(acceptor),
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Waits until at least `count` connections were accepted or `timeout` passed, and returns
    /// the number accepted (a dial returns before the acceptor thread has counted it).
    pub fn wait_accepted(&self, count: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        while self.accepted() < count && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.accepted()
    }
}

fn hold_silently(listener: &TcpListener, accepted: &AtomicUsize, stopping: &AtomicBool) {
    let mut held = Vec::new();
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        accepted.fetch_add(1, Ordering::SeqCst);
        if held.len() < SILENT_CONNECTIONS_MAX {
            held.push(stream);
        }
    }
}

impl Drop for SilentPort {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the acceptor, which sees `stopping` and returns, closing what it held.
        if TcpStream::connect_timeout(&self.address, Duration::from_secs(1)).is_ok()
            && let Some(acceptor) = self.acceptor.take()
        {
            let _ = acceptor.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_json_lists_dependencies() {
        assert_eq!(
            package_json("a", "1.0.0", &[]),
            "{\n  \"name\": \"a\",\n  \"version\": \"1.0.0\",\n  \"main\": \"index.js\",\n  \"dependencies\": {}\n}\n"
        );
        assert!(
            package_json("b", "2.0.0", &[("a", "^1.0.0"), ("c", "1")])
                .ends_with("{\n    \"a\": \"^1.0.0\",\n    \"c\": \"1\"\n  }\n}\n")
        );
        assert_eq!(json_string("q\"\\\n"), "\"q\\\"\\\\\\u000a\"");
    }

    #[test]
    fn paths_must_stay_inside() {
        assert!(is_relative_inside("pkg/__init__.py"));
        for path in ["", "/etc/passwd", "../up", "a/../../b", "./a"] {
            assert!(!is_relative_inside(path), "{path}");
        }
    }
}
