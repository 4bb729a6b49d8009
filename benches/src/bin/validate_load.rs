//! The package validation benchmark (PI-1): a small extension package (one tool, one command,
//! one hook, one dependency, one test file) validated through `POST /v1/validate_package` of a
//! `corral up` it starts, with verdaccio (no uplink) behind the broker; the time split into the
//! static checks, the tests (with the test tree's install), the reinstall and the loader. Beside
//! it, measured in the same run on the host with no jail: the same `node --test`, the same
//! `npm install` from the same verdaccio, and the same loader child (`observe.mjs`), so that the
//! split reads as the jail's and the pool's cost over doing each step bare.
//!
//! `validate_load --corral PATH [--runs N] [--pause-ms MS] [--runtime DIR]`;
//! `scripts/bench-validate` builds and runs it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use corral_benches::up::{Up, ms, p50};
use corral_testkit::registries::{TempDir, Verdaccio};
use serde_json::{Value, json};

const DEPENDENCY: &str = "corral-bench-case";

const EXTENSION: &str = r#"import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";
import { Type } from "typebox";
import { createRequire } from "node:module";
const upper = createRequire(import.meta.url)("corral-bench-case");
export default function (pi: ExtensionAPI) {
  pi.registerTool({ name: "upper", label: "Upper", description: "Upper-cases text",
    parameters: Type.Object({ text: Type.String() }),
    async execute(_id, p) { return { content: [{ type: "text", text: upper(p.text) }], details: {} }; } });
  pi.registerCommand("upper", { description: "Upper-case the selection", handler: async () => {} });
  pi.on("turn_end", async () => undefined);
}
"#;

const TEST: &str = "import test from 'node:test';\nimport assert from 'node:assert';\n\
                    import { createRequire } from 'node:module';\n\
                    test('upper', () => { assert.strictEqual(createRequire(import.meta.url)('corral-bench-case')('a'), 'A'); });\n";

fn files() -> Vec<(&'static str, String)> {
    let manifest = json!({
        "name": "bench-upper", "version": "1.0.0", "pi": { "extensions": ["./extensions"] },
        "dependencies": { DEPENDENCY: "1.0.0" },
        "peerDependencies": { "@mariozechner/pi-coding-agent": "*", "typebox": "*" },
    });
    vec![
        ("package.json", manifest.to_string()),
        ("extensions/index.ts", EXTENSION.to_owned()),
        ("test/upper.test.mjs", TEST.to_owned()),
    ]
}

fn request() -> Value {
    json!({
        "actor": "bench", "conversation": "validate", "member": "bench",
        "files": files().into_iter().map(|(path, text)| json!({ "path": path, "text": text })).collect::<Vec<_>>(),
        "manifest": { "name": "bench-upper", "version": "1.0.0", "tools": ["upper"],
                      "commands": ["upper"], "hooks": ["turn_end"] },
    })
}

/// Runs `program` with `args` in `dir`; it must exit 0. Returns how long it took.
fn timed(dir: &Path, program: &str, args: &[&str], env: &[(&str, &str)]) -> Duration {
    let started = Instant::now();
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawned");
    assert!(status.success(), "{program} {args:?} failed");
    started.elapsed()
}

fn write_package(dir: &Path, runtime: &str) {
    for (path, text) in files() {
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::write(target, text).expect("write");
    }
    let modules = dir.join("node_modules/@mariozechner");
    std::fs::create_dir_all(&modules).expect("mkdir");
    for name in ["@mariozechner/pi-coding-agent", "typebox"] {
        let link = dir.join("node_modules").join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(Path::new(runtime).join("node_modules").join(name), link)
                .expect("link");
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut runtime = String::from("/opt/corral/pi");
    let args = corral_benches::up::Args::parse(10, Duration::ZERO, |flag, value| {
        let ours = flag == "--runtime";
        if ours {
            value.clone_into(&mut runtime);
        }
        ours
    });
    let npm = Verdaccio::start().expect("verdaccio (scripts/setup-services --tests)");
    npm.publish(
        DEPENDENCY,
        "1.0.0",
        &[],
        &[(
            "index.js",
            "module.exports = (text) => text.toUpperCase();\n",
        )],
    )
    .expect("published");
    let state = TempDir::new("bench-validate");
    let registries = json!({ "npm": npm.url() }).to_string();
    let up = Up::start(
        &args.corral,
        state.path(),
        &[("SANDBOX_PACKAGE_REGISTRIES", &registries)],
    );
    println!(
        "runs: {}, pause between runs: {} ms",
        args.runs,
        args.pause.as_millis()
    );

    let mut total = Vec::new();
    let mut split: [Vec<Duration>; 4] = Default::default();
    for _ in 0..args.runs {
        tokio::time::sleep(args.pause).await;
        let started = Instant::now();
        let (status, body) = up
            .client
            .post("/v1/validate_package", &request())
            .await
            .expect("the API answers");
        total.push(started.elapsed());
        assert_eq!((status, &body["admitted"]), (200, &json!(true)), "{body:#}");
        for (i, step) in ["static_ms", "tests_ms", "reinstall_ms", "loader_ms"]
            .into_iter()
            .enumerate()
        {
            let millis = body["durations"][step].as_u64().expect("a duration");
            split[i].push(Duration::from_millis(millis));
        }
    }

    // The same steps bare, on the host: a fresh tree each time, as the worker builds them.
    let registry = npm.url();
    let mut bare: [Vec<Duration>; 3] = Default::default();
    for _ in 0..args.runs {
        let tree = TempDir::new("bench-validate-bare");
        write_package(tree.path(), &runtime);
        let cache = TempDir::new("bench-validate-cache");
        let cache_path = cache.path().to_string_lossy().into_owned();
        let install = [
            "install",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            "--no-package-lock",
            "--legacy-peer-deps",
            "--userconfig",
            "/dev/null",
            "--cache",
            &cache_path,
            "--registry",
            &registry,
        ];
        bare[1].push(timed(tree.path(), "/usr/bin/npm", &install, &[]));
        // npm prunes links it did not make: made again, as the worker does.
        write_package(tree.path(), &runtime);
        bare[0].push(timed(
            tree.path(),
            "/usr/bin/node",
            &["--test", "test/upper.test.mjs"],
            &[],
        ));
        let home = TempDir::new("bench-validate-home");
        let home_path = home.path().to_string_lossy().into_owned();
        let agent = format!("{home_path}/agent");
        let observe = format!("{runtime}/observe.mjs");
        let package = tree.path().to_string_lossy().into_owned();
        bare[2].push(timed(
            tree.path(),
            "/usr/bin/node",
            &[&observe, "extension", &package],
            &[
                ("HOME", &home_path),
                ("PI_CODING_AGENT_DIR", &agent),
                ("PI_OFFLINE", "1"),
                ("JITI_FS_CACHE", "false"),
            ],
        ));
    }
    let [static_, tests, reinstall, loader] = split.map(p50);
    let [bare_tests, bare_install, bare_loader] = bare.map(p50);
    println!(
        "validation of a small extension package: p50 {:.0} ms end to end",
        ms(p50(total))
    );
    println!(
        "  static {:.0} ms | tests {:.0} ms (bare npm install + node --test {:.0} ms) | reinstall {:.0} ms (bare npm install {:.0} ms) | loader {:.0} ms (bare child {:.0} ms)",
        ms(static_),
        ms(tests),
        ms(bare_install + bare_tests),
        ms(reinstall),
        ms(bare_install),
        ms(loader),
        ms(bare_loader)
    );
    println!(
        "  ratios to bare: tests {:.2}, reinstall {:.2}, loader {:.2}",
        ms(tests) / ms(bare_install + bare_tests),
        ms(reinstall) / ms(bare_install),
        ms(loader) / ms(bare_loader)
    );
}
