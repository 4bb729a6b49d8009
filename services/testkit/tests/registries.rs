//! The test registries as their users meet them: pip installs from a pypiserver the test fills
//! with wheels it built, npm installs from a verdaccio it published to, and neither finds a
//! package nobody put there. Plus the dead ports.

use std::io::Read as _;
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use corral_testkit::registries::{
    PyPiServer, SYSTEM_PYTHON, SilentPort, TempDir, Verdaccio, build_wheel, http_status,
    pypiserver_missing, refused_port, verdaccio_missing,
};
use corral_testkit::{Need, skip};

fn run(mut command: Command) -> Output {
    let output = command.output().expect("the command starts");
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("readable")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Two versions of a base package and an app that needs the older one: pip resolves the app's
/// requirement against this index alone and installs both, at the versions asked for.
#[test]
fn pip_installs_a_package_and_its_dependency_from_pypiserver() {
    const TEST: &str = "registries::pip_installs_a_package_and_its_dependency_from_pypiserver";
    if let Some(why) = pypiserver_missing() {
        return skip(TEST, Need::Services, &why);
    }
    if !Path::new(SYSTEM_PYTHON).is_file() {
        return skip(TEST, Need::Tools, &format!("no {SYSTEM_PYTHON}"));
    }
    let packages = TempDir::new("wheels");
    for version in ["1.0", "2.0"] {
        build_wheel(
            packages.path(),
            "Corral.Fixture-Base",
            version,
            &[],
            &[(
                "corral_fixture_base/__init__.py",
                &format!("VERSION = {version:?}\n"),
            )],
        );
    }
    let app = build_wheel(
        packages.path(),
        "corral-fixture-app",
        "1.0",
        &["corral-fixture-base<2"],
        &[(
            "corral_fixture_app.py",
            "from corral_fixture_base import VERSION as BASE\n",
        )],
    );
    assert_eq!(
        app.file_name().and_then(|name| name.to_str()),
        Some("corral_fixture_app-1.0-py3-none-any.whl")
    );
    assert_eq!(
        names(packages.path()),
        [
            "corral_fixture_app-1.0-py3-none-any.whl",
            "corral_fixture_base-1.0-py3-none-any.whl",
            "corral_fixture_base-2.0-py3-none-any.whl",
        ]
    );

    let server = PyPiServer::start(packages.path()).expect("pypiserver starts");
    eprintln!("pypiserver ready after {:?}", server.ready_after());
    assert_eq!(
        http_status(server.port(), "/simple/corral-fixture-base/"),
        Some(200)
    );
    // No fallback: a name this index lacks is a 404, not a redirect to another index.
    for missing in ["/simple/six/", "/simple/corral-fixture-missing/"] {
        assert_eq!(http_status(server.port(), missing), Some(404), "{missing}");
    }

    let downloads = TempDir::new("pip-download");
    let mut download = server.pip("download");
    download
        .args(["--dest"])
        .arg(downloads.path())
        .arg("corral-fixture-app");
    run(download);
    assert_eq!(
        names(downloads.path()),
        [
            "corral_fixture_app-1.0-py3-none-any.whl",
            "corral_fixture_base-1.0-py3-none-any.whl",
        ]
    );

    let target = TempDir::new("pip-target");
    let mut install = server.pip("install");
    install
        .args(["--no-compile", "--target"])
        .arg(target.path())
        .arg("corral-fixture-app==1.0");
    run(install);
    let installed = names(target.path());
    for expected in [
        "corral_fixture_app-1.0.dist-info",
        "corral_fixture_base-1.0.dist-info",
    ] {
        assert!(
            installed.iter().any(|name| name == expected),
            "{installed:?}"
        );
    }
    let mut import = Command::new(SYSTEM_PYTHON);
    import
        .args(["-I", "-c"])
        .arg("import sys; sys.path.insert(0, sys.argv[1]); import corral_fixture_app as a; print(a.BASE)")
        .arg(target.path());
    assert_eq!(String::from_utf8_lossy(&run(import).stdout), "1.0\n");

    // A package nobody served cannot be installed: pip sees only this index.
    let mut missing = server.pip("download");
    missing
        .args(["--dest"])
        .arg(downloads.path())
        .arg("corral-fixture-missing");
    let output = missing.output().expect("pip starts");
    assert!(!output.status.success(), "{output:?}");
}

/// A left package in two versions and a right one that needs `^1`: npm installs right and the
/// older left from this registry alone, and node loads both.
#[test]
fn npm_installs_a_package_and_its_dependency_from_verdaccio() {
    const TEST: &str = "registries::npm_installs_a_package_and_its_dependency_from_verdaccio";
    if let Some(why) = verdaccio_missing() {
        return skip(TEST, Need::Services, &why);
    }
    let registry = Verdaccio::start().expect("verdaccio starts");
    eprintln!("verdaccio ready after {:?}", registry.ready_after());
    // No uplinks: a name this registry lacks is a 404, whether or not it exists elsewhere.
    for missing in ["/left-pad", "/corral-fixture-missing"] {
        assert_eq!(
            http_status(registry.port(), missing),
            Some(404),
            "{missing}"
        );
    }

    let published = Instant::now();
    for version in ["1.0.0", "2.0.0"] {
        registry
            .publish("corral-fixture-left", version, &[], &[])
            .expect("left publishes");
    }
    registry
        .publish(
            "corral-fixture-right",
            "1.0.0",
            &[("corral-fixture-left", "^1.0.0")],
            &[(
                "index.js",
                "module.exports = { left: require('corral-fixture-left').version };\n",
            )],
        )
        .expect("right publishes");
    eprintln!("three packages published in {:?}", published.elapsed());
    assert_eq!(
        http_status(registry.port(), "/corral-fixture-left"),
        Some(200)
    );

    let project = TempDir::new("npm-project");
    std::fs::write(
        project.path().join("package.json"),
        "{ \"name\": \"corral-fixture-project\", \"version\": \"0.0.0\", \"private\": true }\n",
    )
    .expect("package.json");
    let mut install = registry.npm("install");
    install
        .arg("corral-fixture-right@1.0.0")
        .current_dir(project.path());
    run(install);
    let modules = project.path().join("node_modules");
    for (name, version) in [
        ("corral-fixture-left", "1.0.0"),
        ("corral-fixture-right", "1.0.0"),
    ] {
        let manifest = std::fs::read_to_string(modules.join(name).join("package.json"))
            .unwrap_or_else(|error| panic!("{name} is not in node_modules: {error}"));
        assert!(
            manifest.contains(&format!("\"version\": \"{version}\"")),
            "{name}: {manifest}"
        );
    }
    let mut load = Command::new("node");
    load.args(["-e", "console.log(require('corral-fixture-right').left)"])
        .current_dir(project.path());
    assert_eq!(String::from_utf8_lossy(&run(load).stdout), "1.0.0\n");

    // A package nobody published cannot be installed.
    let mut missing = registry.npm("install");
    missing
        .arg("corral-fixture-missing")
        .current_dir(project.path());
    let output = missing.output().expect("npm starts");
    assert!(!output.status.success(), "{output:?}");
}

/// A silent port counts each dial and sends nothing back; a refused port refuses.
#[test]
fn a_silent_port_counts_dials_and_never_answers_and_a_refused_port_refuses() {
    let silent = SilentPort::start();
    let address = silent.address();
    let mut first = TcpStream::connect(address).expect("accepted");
    assert_eq!(silent.wait_accepted(1, Duration::from_secs(5)), 1);
    first
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let error = first
        .read(&mut [0u8; 1])
        .expect_err("no byte and no close: the read times out");
    assert!(
        matches!(
            error.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{error}"
    );
    let _second = TcpStream::connect(address).expect("accepted");
    assert_eq!(silent.wait_accepted(2, Duration::from_secs(5)), 2);
    drop(silent);
    // Dropped: what it held is closed.
    assert_eq!(first.read(&mut [0u8; 1]).expect("closed"), 0);

    let refused = TcpStream::connect((Ipv4Addr::LOCALHOST, refused_port()));
    assert_eq!(
        refused.map_err(|error| error.kind()).err(),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
}
