//! Release qualification against a deployed cluster (`kind-cluster/qualify`): the same API an
//! agent platform calls, reached through a port-forward, and `kubectl` for what only the cluster
//! can show (pods, their runtime class, their network). Every test is `#[ignore]`d: a plain
//! `cargo test` has no cluster. `kind-cluster/qualify` runs them with `--ignored` and
//! `CORRAL_QUALIFY_API_URL`, `CORRAL_QUALIFY_API_TOKEN`, `CORRAL_QUALIFY_KUBECTL` set, and prints
//! their pass table; without those variables each test fails at once, saying which is missing.

use std::process::Command;
use std::time::{Duration, Instant};

use corral_api::client::Client;
use serde_json::{Value, json};

/// The workers' namespace and the services' (kind-cluster/base/namespaces.yaml).
const WORKERS_NS: &str = "corral";
const SYSTEM_NS: &str = "corral-system";
/// The label every worker pod carries (services/controller/src/kube.rs).
const WORKER_SELECTOR: &str = "app.kubernetes.io/name=corral-worker";

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run this suite through kind-cluster/qualify")
    })
}

fn caller() -> Client {
    Client::new(
        &var("CORRAL_QUALIFY_API_URL"),
        &var("CORRAL_QUALIFY_API_TOKEN"),
    )
    .expect("client")
}

/// `kubectl ARGS`, its stdout; panics naming the command when it fails.
fn kubectl(args: &[&str]) -> String {
    let out = Command::new(var("CORRAL_QUALIFY_KUBECTL"))
        .args(args)
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run(actor: &str, conversation: &str, language: &str, code: &str) -> Value {
    json!({ "actor": actor, "conversation": conversation, "member": actor,
            "language": language, "code": code })
}

fn stdout(body: &Value) -> &str {
    body["model"]["stdout"]["text"].as_str().unwrap_or_default()
}

/// The worker pods' names and whether each is ready.
fn worker_pods() -> Vec<(String, bool)> {
    let list: Value = serde_json::from_str(&kubectl(&[
        "-n",
        WORKERS_NS,
        "get",
        "pods",
        "-l",
        WORKER_SELECTOR,
        "-o",
        "json",
    ]))
    .expect("pod list JSON");
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|pod| {
            let ready = pod["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            (
                pod["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                ready,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "runs against a deployed cluster: kind-cluster/qualify"]
async fn qualify_iso_01_runs_from_several_actors_are_isolated_from_each_other() {
    let api = caller();
    let mut runs = Vec::new();
    for i in 0..6 {
        let api = api.clone();
        let (language, code) = if i % 2 == 0 {
            (
                "python",
                format!("open('mine.txt','w').write('a{i}')\nprint('a{i}')"),
            )
        } else {
            (
                "node",
                format!("require('fs').writeFileSync('mine.txt','a{i}');console.log('a{i}')"),
            )
        };
        runs.push(tokio::spawn(async move {
            api.run_code(&run(&format!("actor-{i}"), "q", language, &code))
                .await
        }));
    }
    for (i, handle) in runs.into_iter().enumerate() {
        let (status, body) = handle.await.expect("joined").expect("the API answers");
        assert_eq!(
            (status, stdout(&body)),
            (200, format!("a{i}\n").as_str()),
            "{body}"
        );
    }
    // Each actor sees its own file and never another's.
    let (_, body) = api
        .run_code(&run(
            "actor-0",
            "q",
            "python",
            "import os\nprint(open('mine.txt').read(), sorted(os.listdir('.')))",
        ))
        .await
        .expect("the API answers");
    assert_eq!(stdout(&body), "a0 ['mine.txt']\n", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs against a deployed cluster: kind-cluster/qualify"]
async fn qualify_ker_01_a_persistent_kernel_keeps_its_state_across_worker_pods() {
    let api = caller();
    let mut workers = Vec::new();
    let cells = ["x = [41]", "x.append(x[0] + 1)", "print(x)"];
    for code in cells {
        let mut cell = run("kerry", "kernel", "python", code);
        cell["kernel"] = json!("persistent");
        let (status, body) = api.run_code(&cell).await.expect("the API answers");
        assert_eq!(
            (status, body["outcome"].as_str()),
            (200, Some("succeeded")),
            "{body}"
        );
        workers.push(body["model"]["worker"].clone());
    }
    assert_eq!(workers.len(), 3);
    let (_, last) = {
        let mut cell = run("kerry", "kernel", "python", "print(x)");
        cell["kernel"] = json!("persistent");
        api.run_code(&cell).await.expect("the API answers")
    };
    assert_eq!(stdout(&last), "[41, 42]\n", "{last}");
    println!("qualify: the kernel's cells ran on {workers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs against a deployed cluster: kind-cluster/qualify"]
async fn qualify_pkg_03_an_install_goes_through_the_broker() {
    let package = std::env::var("CORRAL_QUALIFY_PACKAGE").unwrap_or_else(|_| "humanize".into());
    let mut body = run(
        "pat",
        "pkg",
        "python",
        &format!("import importlib.metadata as m\nprint(m.version({package:?}) != '')"),
    );
    body["packages"] = json!([package]);
    let (status, answer) = caller().run_code(&body).await.expect("the API answers");
    assert_eq!((status, stdout(&answer)), (200, "True\n"), "{answer}");
    assert!(answer["model"]["dependencies"].is_object(), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs against a deployed cluster: kind-cluster/qualify"]
async fn qualify_brow_09_a_browser_session_is_watched_through_the_clusters_turn() {
    let api = caller();
    let who = json!({ "actor": "bea", "conversation": "web", "member": "bea" });
    let (status, opened) = api
        .post("/v1/browser_sessions", &who)
        .await
        .expect("answer");
    assert_eq!(status, 200, "{opened}");
    let session = opened["session"].as_str().expect("session id").to_owned();
    let (status, viewer) = api
        .post(&format!("/v1/browser_sessions/{session}/viewers"), &who)
        .await
        .expect("answer");
    assert_eq!(status, 200, "{viewer}");
    let viewport = viewer["viewport"].as_str().expect("viewport");
    let (status, page) = api.get(viewport).await.expect("answer");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&page));
    // The live view's TURN authority is the cluster's coturn Service.
    let turn = opened["live_view"].to_string();
    assert!(
        turn.contains("corral-turn") || turn.contains("turn:"),
        "{opened}"
    );
    let (status, closed) = api
        .post(
            &format!("/v1/browser_sessions/{session}/close"),
            &json!({ "actor": "bea", "conversation": "web" }),
        )
        .await
        .expect("answer");
    assert_eq!(
        (status, &closed["confirmed"]),
        (200, &json!(true)),
        "{closed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs against a deployed cluster: kind-cluster/qualify"]
async fn qualify_iso_05_egress_is_denied_from_inside_a_worker_pod() {
    // Through the jail: the proxy answers each with its reason (proof the request reached it).
    let code = r#"import urllib.request, urllib.error
for url in ["http://10.96.0.1:443/", "http://169.254.169.254/", "http://corral-valkey.corral-system.svc:6379/"]:
    try:
        urllib.request.urlopen(url, timeout=10)
        print("reached", url)
    except urllib.error.HTTPError as e:
        print("status", e.code, e.headers.get("X-Corral-Egress-Reason"))
    except Exception as e:
        print("error", type(e).__name__)
"#;
    let (_, body) = caller()
        .run_code(&run("eve", "net", "python", code))
        .await
        .expect("answer");
    let lines: Vec<&str> = stdout(&body).lines().collect();
    assert_eq!(lines.len(), 3, "{body}");
    assert!(lines.iter().all(|l| l.starts_with("status 403 ")), "{body}");
    // Beside the jail, in the worker's own container: the NetworkPolicy refuses Valkey and the
    // Kubernetes API outright, while the egress proxy's port answers (the positive control).
    let pods = worker_pods();
    let (pod, _) = pods.first().expect("a worker pod");
    let probe = r#"import socket, sys
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "open"
    except Exception as e:
        return type(e).__name__
print(reach("corral-valkey.corral-system.svc", 6379), reach("kubernetes.default.svc", 443), reach("corral-egress-proxy.corral-system.svc", 3128))
"#;
    let out = kubectl(&["-n", WORKERS_NS, "exec", pod, "--", "python3", "-c", probe]);
    let verdicts: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(verdicts.len(), 3, "{out}");
    assert_ne!(verdicts[0], "open", "a worker reached Valkey: {out}");
    assert_ne!(
        verdicts[1], "open",
        "a worker reached the Kubernetes API: {out}"
    );
    assert_eq!(
        verdicts[2], "open",
        "a worker cannot reach the egress proxy: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "runs against a deployed cluster: kind-cluster/qualify"]
async fn qualify_pool_02_a_killed_worker_pod_mid_run_ends_the_run_and_is_replaced() {
    let api = caller();
    let before: Vec<String> = worker_pods().into_iter().map(|(name, _)| name).collect();
    let long = {
        let api = api.clone();
        tokio::spawn(async move {
            api.run_code(&run(
                "kim",
                "kill",
                "python",
                "import time\nprint('started', flush=True)\ntime.sleep(60)",
            ))
            .await
        })
    };
    // The leased worker is the one whose pod now runs the program.
    let deadline = Instant::now() + Duration::from_secs(60);
    let victim = loop {
        let found = before.iter().find(|pod| {
            Command::new(var("CORRAL_QUALIFY_KUBECTL"))
                .args([
                    "-n",
                    WORKERS_NS,
                    "exec",
                    pod,
                    "--",
                    "pgrep",
                    "-f",
                    "time.sleep\\(60\\)",
                ])
                .status()
                .is_ok_and(|s| s.success())
        });
        if let Some(pod) = found {
            break pod.clone();
        }
        assert!(Instant::now() < deadline, "no worker pod runs the program");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    kubectl(&["-n", WORKERS_NS, "delete", "pod", &victim, "--wait=false"]);
    let (status, body) = long.await.expect("joined").expect("the API answers");
    assert_ne!(body["outcome"], "succeeded", "{status} {body}");
    // The pool replaces it: a new worker pod becomes ready and runs code.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let now = worker_pods();
        if now
            .iter()
            .any(|(name, ready)| *ready && !before.contains(name))
        {
            break;
        }
        assert!(Instant::now() < deadline, "no replacement worker: {now:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (_, after) = api
        .run_code(&run("kim", "after", "python", "print(2)"))
        .await
        .expect("answer");
    assert_eq!(stdout(&after), "2\n", "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "runs against a deployed cluster: kind-cluster/qualify"]
async fn qualify_iso_02_a_killed_api_replica_loses_no_run_and_no_lease() {
    let api = caller();
    let pods: Value = serde_json::from_str(&kubectl(&[
        "-n",
        SYSTEM_NS,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=corral-api",
        "-o",
        "json",
    ]))
    .expect("JSON");
    let names: Vec<String> = pods["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(names.len() >= 2, "the API runs {} replicas", names.len());
    // Runs in flight while one replica is deleted: each is answered (by whichever replica held
    // it, or refused cleanly), and the pool then serves every actor again.
    let mut inflight = Vec::new();
    for i in 0..4 {
        let api = api.clone();
        inflight.push(tokio::spawn(async move {
            api.run_code(&run(
                &format!("rep-{i}"),
                "kill",
                "python",
                "import time\ntime.sleep(3)\nprint('done')",
            ))
            .await
        }));
    }
    kubectl(&[
        "-n",
        SYSTEM_NS,
        "delete",
        "pod",
        &names[names.len() - 1],
        "--wait=false",
    ]);
    for handle in inflight {
        // A run on the deleted replica ends with the connection; never a hang.
        let _answered = tokio::time::timeout(Duration::from_secs(120), handle)
            .await
            .expect("a run in flight was answered or cut, never left hanging");
    }
    kubectl(&[
        "-n",
        SYSTEM_NS,
        "rollout",
        "status",
        "deployment/corral-api",
        "--timeout=180s",
    ]);
    for i in 0..4 {
        let (status, body) = api
            .run_code(&run(
                &format!("rep-{i}"),
                "after",
                "python",
                "print('again')",
            ))
            .await
            .expect("the API answers");
        assert_eq!((status, stdout(&body)), (200, "again\n"), "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs against a deployed cluster: kind-cluster/qualify"]
async fn qualify_iso_03_a_gvisor_pool_runs_code_under_runsc() {
    if std::env::var("CORRAL_QUALIFY_PHASE").as_deref() != Ok("gvisor") {
        panic!(
            "run with CORRAL_QUALIFY_PHASE=gvisor after the pool moved onto gVisor (kind-cluster/qualify does)"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    let pod = loop {
        let list: Value = serde_json::from_str(&kubectl(&[
            "-n",
            WORKERS_NS,
            "get",
            "pods",
            "-l",
            WORKER_SELECTOR,
            "-o",
            "json",
        ]))
        .expect("JSON");
        let gvisor = list["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .find(|p| {
                p["spec"]["runtimeClassName"] == "gvisor"
                    && p["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
            });
        if let Some(pod) = gvisor {
            break pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no ready worker pod under gVisor"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    // gVisor's own kernel log says so: the pod runs on runsc, not the node's kernel.
    let dmesg = kubectl(&["-n", WORKERS_NS, "exec", &pod, "--", "dmesg"]);
    assert!(dmesg.contains("gVisor"), "{dmesg}");
    let (status, body) = caller()
        .run_code(&run("gia", "gvisor", "python", "print(6 * 7)"))
        .await
        .expect("answer");
    assert_eq!((status, stdout(&body)), (200, "42\n"), "{body}");
}
