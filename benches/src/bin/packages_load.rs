//! The packages benchmark (PKG-1, PKG-3): through `POST /v1/run_code` of a `corral up` it starts,
//! beside baselines measured in the same run:
//! - `import pandas, numpy, matplotlib; print(1)` against the baked stack's own interpreter doing
//!   the same (`<stack>/bin/python3 -c ...`): the goal is a ratio under 0.2;
//! - `print(1)` against a bare `python3 -c 'print(1)'`, to show what the pre-import costs others;
//! - a run that installs a small wheel through the broker against `pip install` of the same wheel
//!   straight from the same pypiserver (into an empty directory, no cache).
//!
//! Runs are sequential (concurrency 1). `--pause-ms` waits between runs, the time an agent
//! thinks; without it the runs come back to back and every worker's re-preparation competes with
//! them. `scripts/bench-packages` builds and runs it.
//!
//! `packages_load --corral PATH [--runs N] [--pause-ms MS] [--stack DIR]`

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use corral_benches::up::{Up, ms, p50, through_api};
use corral_testkit::registries::{PyPiServer, TempDir, build_wheel};
use serde_json::json;

struct Args {
    corral: String,
    runs: usize,
    pause: Duration,
    stack: String,
}

fn args() -> Args {
    let mut stack = String::from("/opt/corral/python");
    let common = corral_benches::up::Args::parse(20, Duration::ZERO, |flag, value| {
        let ours = flag == "--stack";
        if ours {
            stack = value.to_owned();
        }
        ours
    });
    Args {
        corral: common.corral,
        runs: common.runs,
        pause: common.pause,
        stack,
    }
}

/// `command` run `runs` times, one after another; each must exit 0.
fn spawned(command: &[&str], runs: usize, env: &[(&str, &str)]) -> Vec<Duration> {
    (0..runs)
        .map(|_| {
            let started = Instant::now();
            let status = Command::new(command[0])
                .args(&command[1..])
                .envs(env.iter().copied())
                .stdout(Stdio::null())
                .status()
                .expect("spawned");
            assert!(status.success(), "{command:?} failed");
            started.elapsed()
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let wheels = TempDir::new("bench-wheels");
    build_wheel(
        wheels.path(),
        "corral-bench-small",
        "1.0",
        &[],
        &[("corral_bench_small.py", "VALUE = 1\n")],
    );
    let pypi =
        PyPiServer::start(wheels.path()).expect("pypiserver (scripts/setup-services --tests)");
    let state = TempDir::new("bench-packages");
    let registries = json!({ "pypi": pypi.simple_url() }).to_string();
    let up = Up::start(
        &args.corral,
        state.path(),
        &[("SANDBOX_PACKAGE_REGISTRIES", &registries)],
    );
    let client = &up.client;
    let python = format!("{}/bin/python3", args.stack);
    let request = |code: &str, packages: &[&str]| {
        json!({ "actor": "bench", "conversation": "packages", "member": "bench",
                "language": "python", "code": code, "packages": packages })
    };
    println!(
        "runs: {}, pause between runs: {} ms",
        args.runs,
        args.pause.as_millis()
    );

    let bare_print = p50(spawned(
        &["/usr/bin/python3", "-c", "print(1)"],
        args.runs,
        &[],
    ));
    let (latencies, warm, _) =
        through_api(client, &request("print(1)", &[]), args.runs, args.pause).await;
    let api_print = p50(latencies);
    println!(
        "print(1): API p50 {:.1} ms ({warm}/{} warm) vs bare python3 -c {:.1} ms: ratio {:.2}",
        ms(api_print),
        args.runs,
        ms(bare_print),
        ms(api_print) / ms(bare_print)
    );

    let heavy = "import pandas, numpy, matplotlib; print(1)";
    let bare_heavy = p50(spawned(
        &[&python, "-c", heavy],
        args.runs,
        &[("MPLCONFIGDIR", "/tmp/corral-bench-mpl")],
    ));
    let (latencies, warm, _) =
        through_api(client, &request(heavy, &[]), args.runs, args.pause).await;
    let api_heavy = p50(latencies);
    println!(
        "import pandas, numpy, matplotlib; print(1): API p50 {:.1} ms ({warm}/{} warm) vs the stack's python3 -c {:.1} ms: ratio {:.3} (goal < 0.2)",
        ms(api_heavy),
        args.runs,
        ms(bare_heavy),
        ms(api_heavy) / ms(bare_heavy)
    );

    let pip_runs: Vec<Duration> = (0..args.runs)
        .map(|_| {
            let target = TempDir::new("bench-pip-target");
            let simple = pypi.simple_url();
            let target_path = target.path().to_string_lossy().into_owned();
            spawned(
                &[
                    "/usr/bin/python3",
                    "-m",
                    "pip",
                    "install",
                    "--no-cache-dir",
                    "--no-deps",
                    "--disable-pip-version-check",
                    "--index-url",
                    &simple,
                    "--target",
                    &target_path,
                    "corral-bench-small",
                ],
                1,
                &[("PIP_CONFIG_FILE", "/dev/null"), ("PIP_FIND_LINKS", "")],
            )[0]
        })
        .collect();
    let pip = p50(pip_runs);
    let (latencies, _, model) = through_api(
        client,
        &request(
            "import corral_bench_small; print(corral_bench_small.VALUE)",
            &["corral-bench-small"],
        ),
        args.runs,
        args.pause,
    )
    .await;
    let api_install = p50(latencies);
    println!(
        "install of a small wheel: API run p50 {:.1} ms (its install {} ms) vs pip install from the same pypiserver {:.1} ms: ratio {:.2}",
        ms(api_install),
        model["dependencies"]["install_ms"],
        ms(pip),
        ms(api_install) / ms(pip)
    );
}
