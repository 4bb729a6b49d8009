//! Packages through the whole stack (PKG-1 to PKG-7): `corral up` with real registries started
//! here (pypiserver serving wheels this test builds, verdaccio with no uplink serving packages
//! this test publishes, a port that accepts and never answers, one that refuses), driven through
//! `POST /v1/run_code` as an agent platform would. No test reaches a public registry. Needs root,
//! Valkey, pypiserver and verdaccio (`scripts/setup-services --tests`) and the baked stack
//! (`scripts/build-python-stack`); without them each test skips through `corral_testkit::skip`,
//! which CI forbids.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::stack::{Stack, python, stdout};
use corral_core::packages::stack::baked;
use corral_testkit::registries::{
    PyPiServer, SilentPort, TempDir, Verdaccio, build_wheel, pypiserver_missing, refused_port,
    verdaccio_missing,
};
use corral_testkit::{Need, skip};
use serde_json::{Value, json};

/// Where `scripts/build-python-stack` puts the stack (`CORRAL_JAIL_PYTHON_STACK`'s default).
const STACK: &str = "/opt/corral/python";

/// The baked stack, pypiserver and verdaccio, or `false` after skipping `test`.
fn needs_or_skip(test: &str, registries: bool) -> bool {
    if !Path::new(STACK).join("corral-stack.tsv").exists() {
        skip(
            test,
            Need::Tools,
            "no baked stack: run scripts/build-python-stack",
        );
        return false;
    }
    if registries && let Some(why) = pypiserver_missing().or_else(verdaccio_missing) {
        skip(test, Need::Services, &why);
        return false;
    }
    true
}

fn with_packages(mut body: Value, packages: &[&str]) -> Value {
    body["packages"] = json!(packages);
    body
}

fn node(actor: &str, code: &str, packages: &[&str]) -> Value {
    json!({ "actor": actor, "conversation": "c", "member": actor, "language": "node",
            "code": code, "packages": packages })
}

fn baked_version(name: &str) -> String {
    baked()
        .distribution(name)
        .unwrap_or_else(|| panic!("{name} is baked"))
        .version
        .clone()
}

/// A counter of the API's `/metrics`.
async fn counter(stack: &Stack, name: &str) -> u64 {
    let (status, body) = stack.caller.get("/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    let text = String::from_utf8(body).expect("text");
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .trim()
        .parse()
        .expect("a number")
}

fn assert_outcome(body: &Value, outcome: &str) {
    assert_eq!(body["outcome"], outcome, "{body:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_01_to_pkg_04_pkg_06_dependencies_come_from_the_stack_or_through_the_broker() {
    const TEST: &str =
        "pkg_01_to_pkg_04_pkg_06_dependencies_come_from_the_stack_or_through_the_broker";
    if !needs_or_skip(TEST, true) {
        return;
    }
    let wheels = TempDir::new("pkg-wheels");
    build_wheel(
        wheels.path(),
        "corral-demo",
        "1.0",
        &[],
        &[("corral_demo.py", "VALUE = 'demo 1.0'\n")],
    );
    // The baked tabulate at another version, which a pin must bring in ahead of the baked copy.
    build_wheel(
        wheels.path(),
        "tabulate",
        "0.0.1",
        &[],
        &[("tabulate.py", "__version__ = '0.0.1'\n")],
    );
    // A package whose own dependency would take that other tabulate if it could.
    build_wheel(
        wheels.path(),
        "corral-needs-tab",
        "1.0",
        &["tabulate>=0.0.1"],
        &[(
            "corral_needs_tab.py",
            "import tabulate\nSEEN = tabulate.__version__\n",
        )],
    );
    let pypi = PyPiServer::start(wheels.path()).expect("pypiserver starts");
    let npm = Verdaccio::start().expect("verdaccio starts");
    npm.publish("corral-left", "1.0.0", &[], &[])
        .expect("published");
    npm.publish(
        "corral-right",
        "1.0.0",
        &[("corral-left", "1.0.0")],
        &[(
            "index.js",
            "module.exports = 'right+' + require('corral-left').name;\n",
        )],
    )
    .expect("published");
    let registries = json!({ "pypi": pypi.simple_url(), "npm": npm.url() }).to_string();
    let Some(stack) = Stack::start(TEST, &[("SANDBOX_PACKAGE_REGISTRIES", &registries)], &[])
    else {
        return;
    };

    // PKG-1: the baked stack answers imports with no broker: no token, no registry dial.
    let (tokens, dials) = (
        counter(&stack, "corral_package_tokens_total").await,
        counter(&stack, "corral_package_registry_dials_total").await,
    );
    let (status, body) = stack
        .run(python(
            "baked",
            "c",
            "import docx, pptx, yaml, bs4, PIL, openpyxl, xlsxwriter, pypdf, reportlab, scipy\n\
             import pandas, numpy, matplotlib, requests, lxml, tabulate\n\
             print(pandas.__version__, docx.__name__)",
        ))
        .await;
    assert_eq!(status, 200);
    assert_outcome(&body, "succeeded");
    assert_eq!(stdout(&body), format!("{} docx\n", baked_version("pandas")));
    let satisfied = body["model"]["dependencies"]["satisfied"].to_string();
    assert!(
        satisfied.contains(&format!("python-docx {}", baked_version("python-docx"))),
        "{satisfied}"
    );
    assert_eq!(body["model"]["dependencies"]["installed"], json!([]));
    assert_eq!(counter(&stack, "corral_package_tokens_total").await, tokens);
    assert_eq!(
        counter(&stack, "corral_package_registry_dials_total").await,
        dials
    );

    // PKG-3: a package that is not baked, through pypiserver and the broker.
    let (_, body) = stack
        .run(with_packages(
            python(
                "installs",
                "c",
                "import corral_demo\nprint(corral_demo.VALUE)",
            ),
            &["corral-demo"],
        ))
        .await;
    assert_outcome(&body, "succeeded");
    assert_eq!(stdout(&body), "demo 1.0\n");
    assert_eq!(
        body["model"]["dependencies"]["installed"],
        json!(["corral-demo"])
    );
    assert_eq!(
        counter(&stack, "corral_package_tokens_total").await,
        tokens + 1
    );

    // PKG-2: a pin of a baked package to another version wins over the baked copy.
    let (_, body) = stack
        .run(with_packages(
            python("pins", "c", "import tabulate\nprint(tabulate.__version__)"),
            &["tabulate==0.0.1"],
        ))
        .await;
    assert_outcome(&body, "succeeded");
    assert_eq!(stdout(&body), "0.0.1\n");

    // PKG-2: a transitive dependency cannot shadow a baked distribution.
    let (_, body) = stack
        .run(with_packages(
            python(
                "transitive",
                "c",
                "import corral_needs_tab, tabulate\nprint(corral_needs_tab.SEEN, tabulate.__version__)",
            ),
            &["corral-needs-tab"],
        ))
        .await;
    assert_outcome(&body, "succeeded");
    let tabulate = baked_version("tabulate");
    assert_eq!(stdout(&body), format!("{tabulate} {tabulate}\n"));

    // PKG-3: npm install of a package and its dependency, through verdaccio, into the workspace.
    let (_, body) = stack
        .run(node(
            "npm",
            "console.log(require('corral-right'))",
            &["corral-right"],
        ))
        .await;
    assert_outcome(&body, "succeeded");
    assert_eq!(stdout(&body), "right+corral-left\n");
    let (status, manifest) = stack
        .read("npm", "c", "node_modules/corral-left/package.json")
        .await;
    assert_eq!(
        status, 200,
        "corral-left is in the workspace's node_modules"
    );
    assert!(String::from_utf8_lossy(&manifest).contains("\"1.0.0\""));

    // PKG-4, PKG-6: a URL, a path, an index or an installer flag is refused before anything
    // runs, and the workspace stays as the last run left it.
    let (_, body) = stack
        .run(python("keeps", "c", "open('note.txt', 'w').write('v1')"))
        .await;
    assert_outcome(&body, "succeeded");
    let writes_v2 = "open('note.txt', 'w').write('v2')";
    for bad in [
        "https://packages.invalid/x-1.0-py3-none-any.whl",
        "x @ https://packages.invalid/x.whl",
        "./local-dir",
        "/abs/path",
        "--index-url=http://127.0.0.1:1/simple/",
        "-e",
        "-e .",
        "--extra-index-url",
    ] {
        let (status, body) = stack
            .run(with_packages(python("keeps", "c", writes_v2), &[bad]))
            .await;
        assert_eq!(status, 200, "{bad}");
        assert_outcome(&body, "not_run");
        assert_eq!(
            body["error"]["code"], "dependency_request_invalid",
            "{bad}: {body:#}"
        );
        assert_eq!(body["error"]["packages"], json!([bad]));
        assert_eq!(body["model"]["not_run"], "dependency_request_invalid");
    }
    // A name no registry has: the install fails, the code never runs, the snapshot stands.
    let (_, body) = stack
        .run(with_packages(
            python("keeps", "c", writes_v2),
            &["corral-no-such-distribution"],
        ))
        .await;
    assert_outcome(&body, "not_run");
    assert_eq!(body["error"]["code"], "dependency_install_failed");
    assert_eq!(body["error"]["cause"], "install_failed");
    assert_eq!(
        body["error"]["packages"],
        json!(["corral-no-such-distribution"])
    );
    assert_eq!(body["member"]["outcome"], "not_run");
    let diagnostics = body["model"]["diagnostics"].to_string();
    assert!(
        !diagnostics.contains("pk1."),
        "the broker token is not shown: {diagnostics}"
    );
    let (status, note) = stack.read("keeps", "c", "note.txt").await;
    assert_eq!((status, note.as_slice()), (200, b"v1".as_slice()));
    stack.settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_05_an_unreachable_registry_fails_the_run_within_seconds_and_cools_down() {
    const TEST: &str = "pkg_05_an_unreachable_registry_fails_the_run_within_seconds_and_cools_down";
    if !needs_or_skip(TEST, false) {
        return;
    }
    let silent = SilentPort::start();
    let refused = refused_port();
    let registries = json!({
        "pypi": format!("http://127.0.0.1:{}/simple/", silent.port()),
        "npm": format!("http://127.0.0.1:{refused}/"),
    })
    .to_string();
    let Some(stack) = Stack::start(TEST, &[("SANDBOX_PACKAGE_REGISTRIES", &registries)], &[])
    else {
        return;
    };
    let ask = || with_packages(python("offline", "c", "print('never')"), &["corral-demo"]);
    let started = Instant::now();
    let (_, body) = stack.run(ask()).await;
    let took = started.elapsed();
    assert_outcome(&body, "not_run");
    assert_eq!(body["error"]["code"], "dependency_install_failed");
    assert_eq!(body["error"]["cause"], "registry_unreachable", "{body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("unreachable") && message.contains("baked packages need none"),
        "{message}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the run failed in {took:?}, not within seconds"
    );
    // pip's one retry met the cooldown: the silent registry was dialled once.
    assert_eq!(silent.accepted(), 1, "dials of the silent registry");
    let (_, body) = stack.run(ask()).await;
    assert_eq!(body["error"]["cause"], "registry_unreachable");
    assert_eq!(
        silent.accepted(),
        1,
        "within the cooldown the broker does not dial again"
    );
    // npm against a port that refuses: the same record, as fast.
    let started = Instant::now();
    let (_, body) = stack
        .run(node("offline-npm", "console.log(1)", &["left-pad"]))
        .await;
    assert_eq!(body["error"]["cause"], "registry_unreachable", "{body:#}");
    assert!(started.elapsed() < Duration::from_secs(10));
    stack.settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pkg_07_with_no_registry_nothing_is_installed_and_the_error_names_the_baked_stack() {
    const TEST: &str =
        "pkg_07_with_no_registry_nothing_is_installed_and_the_error_names_the_baked_stack";
    if !needs_or_skip(TEST, false) {
        return;
    }
    let Some(stack) = Stack::start(TEST, &[("SANDBOX_PACKAGE_REGISTRIES", "{}")], &[]) else {
        return;
    };
    // The stack needs no registry at all.
    let (_, body) = stack
        .run(python(
            "air",
            "c",
            "import docx, pandas\nprint(docx.__name__)",
        ))
        .await;
    assert_outcome(&body, "succeeded");
    assert_eq!(stdout(&body), "docx\n");
    let pandas = baked_version("pandas");
    let (_, body) = stack
        .run(with_packages(python("air", "c", "print(1)"), &["humanize"]))
        .await;
    assert_outcome(&body, "not_run");
    assert_eq!(body["error"]["code"], "dependency_install_failed");
    assert_eq!(body["error"]["cause"], "no_registry");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("baked stack") && message.contains(&format!("pandas {pandas}")),
        "{message}"
    );
    // A baked pin to another version fails before the code, naming the version there is.
    let (_, body) = stack
        .run(with_packages(
            python("air", "c", "print(1)"),
            &["pandas==2.2.3"],
        ))
        .await;
    assert_outcome(&body, "not_run");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("the baked stack has pandas {pandas}")),
        "{body:#}"
    );
    // The baked version itself is satisfied.
    let (_, body) = stack
        .run(with_packages(
            python("air", "c", "import pandas\nprint(pandas.__version__)"),
            &[&format!("pandas=={pandas}")],
        ))
        .await;
    assert_outcome(&body, "succeeded");
    stack.settled().await;
}

#[test]
fn pkg_01_the_baked_stack_round_trips_in_a_jail() {
    const TEST: &str = "pkg_01_the_baked_stack_round_trips_in_a_jail";
    if !needs_or_skip(TEST, false) {
        return;
    }
    if !corral_testkit::is_root() {
        skip(TEST, Need::Root, "the jail needs root");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../stack/python/roundtrip.py");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args([
            "jail",
            "run",
            "--language",
            "python",
            "--wall-seconds",
            "300",
        ])
        .arg(&script)
        .env("CORRAL_JAIL_PYTHON_STACK", STACK)
        .output()
        .expect("corral jail run");
    let reply: Value = serde_json::from_slice(&output.stdout).expect("a JSON reply");
    assert_eq!(reply["exit_code"], 0, "{reply:#}");
    let said = reply["stdout"]["text"].as_str().unwrap_or_default();
    assert!(said.contains("stack round trips: ok"), "{said}");
    // The jail's Python is the stack's, never the system's site-packages.
    let probe = TempDir::new("pkg-01-probe");
    let code = probe.path().join("probe.py");
    std::fs::write(
        &code,
        "import sys, pandas\nprint(sys.prefix)\nprint(any('dist-packages' in p for p in sys.path))\nprint(pandas.__file__.startswith(sys.prefix))\n",
    )
    .expect("written");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["jail", "run", "--language", "python"])
        .arg(&code)
        .env("CORRAL_JAIL_PYTHON_STACK", STACK)
        .output()
        .expect("corral jail run");
    let reply: Value = serde_json::from_slice(&output.stdout).expect("a JSON reply");
    assert_eq!(
        reply["stdout"]["text"],
        format!("{STACK}\nFalse\nTrue\n"),
        "{reply:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_1_pkg_06_an_install_past_its_timeout_stops_the_run_before_its_code() {
    const TEST: &str = "bound_1_pkg_06_an_install_past_its_timeout_stops_the_run_before_its_code";
    if !needs_or_skip(TEST, false) {
        return;
    }
    // A registry that accepts and never answers holds pip past a two-second install bound (the
    // broker itself would give up on it only after five).
    let silent = SilentPort::start();
    let registries =
        json!({ "pypi": format!("http://127.0.0.1:{}/simple/", silent.port()) }).to_string();
    let Some(stack) = Stack::start(
        TEST,
        &[
            ("SANDBOX_PACKAGE_REGISTRIES", &registries),
            ("SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS", "2"),
        ],
        &[],
    ) else {
        return;
    };
    let (_, first) = stack
        .run(python("slow", "c", "open('kept.txt', 'w').write('v1')"))
        .await;
    assert_outcome(&first, "succeeded");
    let started = Instant::now();
    let (_, body) = stack
        .run(with_packages(
            python("slow", "c", "open('kept.txt', 'w').write('v2')"),
            &["corral-demo"],
        ))
        .await;
    assert_outcome(&body, "not_run");
    assert_eq!(body["error"]["code"], "dependency_install_failed");
    assert_eq!(body["error"]["cause"], "timed_out", "{body:#}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS")
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let (status, kept) = stack.read("slow", "c", "kept.txt").await;
    assert_eq!((status, kept.as_slice()), (200, b"v1".as_slice()));
    stack.settled().await;
}
