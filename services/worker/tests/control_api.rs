//! The control API end to end (issue 4 item 5): a real `corral-worker serve` on 127.0.0.1 and a
//! small HTTP/1.1 client over `TcpStream` (`common::api`). The runs need root (the jail's
//! supervisor mounts, maps ids and creates cgroups); the tests skip, saying so, without it.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::api::{
    RESPONSE_TIMEOUT, Server, TOKEN, read_response, wait_prepared, wait_prepared_languages,
};
use common::{TempDir, blas_cpus_or_skip, root_or_skip, serial};
use serde_json::{Value, json};

fn assert_clean(json: &Value) {
    assert_eq!(json["reset_evidence"]["verdict"], "clean", "{json}");
    for field in [
        "processes_remaining",
        "workspace_entries",
        "scratch_entries",
        "mounts_remaining",
    ] {
        assert_eq!(json["reset_evidence"][field], 0, "{field}: {json}");
    }
}

/// An execute's answer, which goes out before the run's own reset (decision 0036): no evidence
/// in it, and no reset time; the next `/v1/reset` counts what that reset left (see [`reset`]).
fn assert_answered_before_reset(json: &Value) {
    assert_eq!(json["reset_evidence"], Value::Null, "{json}");
    assert_eq!(json["durations"]["reset_ms"], 0, "{json}");
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, path, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

#[test]
fn api_refuses_to_start_without_a_credential() {
    let output = Command::new(env!("CARGO_BIN_EXE_corral-worker"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("CORRAL_WORKER_TOKEN")
        .env_remove("CORRAL_WORKER_TOKEN_FILE")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty(), "it must not listen");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("CORRAL_WORKER_TOKEN"), "{stderr}");
}

#[test]
fn api_missing_or_wrong_credential_is_401_on_every_endpoint() {
    if !root_or_skip("api_missing_or_wrong_credential_is_401_on_every_endpoint") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let execute =
        json!({ "language": "python", "code": "open('/workspace/ran', 'w')" }).to_string();
    for token in [None, Some("wrong-credential-0123456789abcdef"), Some("")] {
        for (method, path, body) in [
            ("GET", "/health", ""),
            ("POST", "/v1/execute", execute.as_str()),
            ("POST", "/v1/reset", r#"{"token": 1}"#),
            ("GET", "/nowhere", ""),
        ] {
            let (status, json) = server.request(method, path, token, body.as_bytes());
            assert_eq!(status, 401, "{method} {path} with {token:?}: {json}");
            assert_eq!(json["error"], "unauthorized");
        }
    }
    let (status, json) = server.request("GET", "/health", Some(TOKEN), b"");
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["posture"], "full", "{json}");
}

#[test]
fn api_executes_python_and_node_with_a_clean_reset() {
    if !root_or_skip("api_executes_python_and_node_with_a_clean_reset") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let (status, json) =
        server.execute(&json!({ "language": "python", "code": "print(1)", "token": 5 }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["exit_code"], 0, "{json}");
    assert_eq!(json["stdout"]["text"], "1\n", "{json}");
    assert_eq!(json["not_run"], Value::Null);
    assert_answered_before_reset(&json);
    // The reset between leases proves what the run's own reset left: nothing.
    reset(&server, 5);
    let (status, json) =
        server.execute(&json!({ "language": "node", "code": "console.log(2 + 2)" }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["stdout"]["text"], "4\n", "{json}");
    assert_answered_before_reset(&json);
    reset(&server, 6);
    // The language is a type on the contract: one the worker does not run is not a message.
    let (status, json) = server.execute(&json!({ "language": "ruby", "code": "puts 1" }));
    assert_eq!(
        (status, &json["error"]),
        (400, &json!("body_invalid")),
        "{json}"
    );
}

/// Every malformed message gets a typed error with a stable code from the contract, before
/// anything runs, and the worker serves the next request as if nothing had happened.
#[test]
fn contract_malformed_messages_get_typed_codes_and_leave_the_worker_serving() {
    if !root_or_skip("contract_malformed_messages_get_typed_codes_and_leave_the_worker_serving") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let grant_max = corral_contract::limits::GRANT_MAX_BYTES;
    // Route, credential, body, and the status and code expected.
    type Case<'a> = (&'a str, Option<&'a str>, Vec<u8>, u16, &'a str);
    let cases: [Case; 8] = [
        ("/v1/execute", Some(TOKEN), br#"{"language":"python","code":"print(1)","tok"#.to_vec(), 400, "body_truncated"),
        ("/v1/execute", Some(TOKEN), b"not json at all".to_vec(), 400, "body_malformed"),
        ("/v1/execute", Some(TOKEN), br#"{"language":"python","code":"1","token":1,"sudo":true}"#.to_vec(), 400, "body_invalid"),
        ("/v1/execute", Some(TOKEN), br#"{"language":"python","code":"1"}"#.to_vec(), 400, "body_invalid"),
        (
            "/v1/execute",
            Some(TOKEN),
            json!({ "language": "python", "code": "1", "token": 1, "grant": "g".repeat(grant_max + 1) })
                .to_string()
                .into_bytes(),
            400,
            "grant_too_long",
        ),
        ("/v1/execute", Some("wrong-credential-0123456789abcdef"), br#"{"language":"python","code":"1","token":1}"#.to_vec(), 401, "unauthorized"),
        ("/v1/reset", Some(TOKEN), br#"{"token":"one"}"#.to_vec(), 400, "body_invalid"),
        ("/v1/reset", Some(TOKEN), b"{".to_vec(), 400, "body_truncated"),
    ];
    for (path, token, body, status, code) in cases {
        let (got, json) = server.request("POST", path, token, &body);
        assert_eq!(
            (got, &json["error"]),
            (status, &json!(code)),
            "{path}: {json}"
        );
    }
    // A grant at the contract's limit (corral-core's) is accepted, and the worker runs on.
    let (status, json) = server.execute(&json!({
        "language": "python",
        "code": "print(1)",
        "token": 9,
        "grant": "g".repeat(grant_max),
    }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["stdout"]["text"], "1\n", "{json}");
    assert_answered_before_reset(&json);
    reset(&server, 10);
}

#[test]
fn api_workspace_archive_in_and_out() {
    if !root_or_skip("api_workspace_archive_in_and_out") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let archive = tar_of(&[("data/input.txt", b"hello")]);
    let code = "text = open('data/input.txt').read()\nopen('data/output.txt', 'w').write(text + ' world')\nprint(text)\n";
    let (status, json) = server.execute(&json!({
        "language": "python",
        "code": code,
        "workspace": BASE64.encode(&archive),
    }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["stdout"]["text"], "hello\n", "{json}");
    assert_eq!(json["workspace"]["state"], "packed", "{json}");
    assert_answered_before_reset(&json);
    reset(&server, 11);
    let packed = BASE64
        .decode(json["workspace"]["archive"].as_str().expect("an archive"))
        .unwrap();
    let out = TempDir::new("api-out");
    let target = out.path().join("workspace");
    corral_worker::archive::unpack(&packed, &target, 8 << 20).unwrap();
    assert_eq!(
        std::fs::read(target.join("data/output.txt")).unwrap(),
        b"hello world"
    );
    assert_eq!(
        std::fs::read(target.join("data/input.txt")).unwrap(),
        b"hello"
    );
}

#[test]
fn ws_05_api_refused_archive_is_not_run() {
    if !root_or_skip("ws_05_api_refused_archive_is_not_run") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let mut header = tar::Header::new_gnu();
    header.as_gnu_mut().unwrap().name[..8].copy_from_slice(b"../x.txt");
    header.set_size(1);
    header.set_mode(0o644);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, &b"x"[..]).unwrap();
    let archive = builder.into_inner().unwrap();
    let (status, json) = server.execute(&json!({
        "language": "python",
        "code": "print('ran')",
        "workspace": BASE64.encode(&archive),
    }));
    assert_eq!(status, 422, "{json}");
    assert_eq!(json["error"], "workspace_archive_refused");
    assert_eq!(json["detail"]["reason"], "archive_path_parent", "{json}");
    // Nothing of it is left for the next request.
    let (status, json) = server.request("POST", "/v1/reset", Some(TOKEN), br#"{"token": 9}"#);
    assert_eq!(status, 200, "{json}");
    assert_clean(&json);
}

#[test]
fn pool_04_api_reset_returns_clean_evidence_with_the_token() {
    if !root_or_skip("pool_04_api_reset_returns_clean_evidence_with_the_token") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let (status, _) = server.execute(&json!({
        "language": "python",
        "code": "open('left.txt', 'w').write('x')\nopen('/tmp/left', 'w').write('x')",
    }));
    assert_eq!(status, 200);
    let (status, json) = server.request("POST", "/v1/reset", Some(TOKEN), br#"{"token": 42}"#);
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["reset_evidence"]["token"], 42, "{json}");
    assert_clean(&json);
}

#[test]
fn api_concurrent_execute_gets_409() {
    if !root_or_skip("api_concurrent_execute_gets_409") {
        return;
    }
    let _serial = serial();
    let server = std::sync::Arc::new(Server::start(&[]));
    let first = {
        let server = server.clone();
        std::thread::spawn(move || {
            server.execute(&json!({
                "language": "python",
                "code": "import time\ntime.sleep(60)",
                "bounds": { "wall_seconds": 4 },
            }))
        })
    };
    // Wait until the server says the first run holds the worker: a check of its state, repeated
    // until a deadline that only a hung server reaches, not a sleep.
    let deadline = std::time::Instant::now() + RESPONSE_TIMEOUT;
    let mut busy = false;
    while std::time::Instant::now() < deadline {
        let (_, health) = server.request("GET", "/health", Some(TOKEN), b"");
        if health["busy"] == true {
            busy = true;
            break;
        }
    }
    assert!(busy, "the first run never started");
    let (status, json) = server.execute(&json!({ "language": "python", "code": "print(2)" }));
    assert_eq!(status, 409, "{json}");
    assert_eq!(json["error"], "busy");
    let (status, _) = server.request("POST", "/v1/reset", Some(TOKEN), br#"{"token": 1}"#);
    assert_eq!(status, 409);
    let (status, json) = first.join().unwrap();
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["bound"], "SANDBOX_MAX_WALL_SECONDS", "{json}");
    assert_answered_before_reset(&json);
    // And the worker is free again.
    let (status, json) = server.execute(&json!({ "language": "python", "code": "print(3)" }));
    assert_eq!(
        (status, json["stdout"]["text"].clone()),
        (200, json!("3\n"))
    );
    reset(&server, 12);
}

#[test]
fn a_health_probe_never_turns_an_execute_away() {
    if !root_or_skip("a_health_probe_never_turns_an_execute_away") {
        return;
    }
    let _serial = serial();
    // Cold runs, so that many are quick; the probe runs as fast as the server answers.
    let server = std::sync::Arc::new(Server::start(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "")]));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let (server, stop) = (server.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut probes = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (status, _) = server.request("GET", "/health", Some(TOKEN), b"");
                assert_eq!(status, 200);
                probes += 1;
            }
            probes
        })
    };
    let statuses: Vec<(u16, Value)> = (0..24)
        .map(|n| server.execute(&json!({ "language": "python", "code": format!("print({n})") })))
        .collect();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let probes = probe.join().unwrap();
    assert!(probes > 0, "the probe never ran");
    let refused: Vec<&Value> = statuses
        .iter()
        .filter(|(status, _)| *status != 200)
        .map(|(_, json)| json)
        .collect();
    assert!(
        refused.is_empty(),
        "executes refused beside {probes} probes: {refused:?}"
    );
}

#[test]
fn bound_1_api_oversized_body_and_raised_bounds_are_refused() {
    if !root_or_skip("bound_1_api_oversized_body_and_raised_bounds_are_refused") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[("SANDBOX_WORKSPACE_MAX_BYTES", "1MiB")]);
    let (_, health) = server.request("GET", "/health", Some(TOKEN), b"");
    let body_max = health["body_max_bytes"].as_u64().unwrap();
    // The contract's bound for this workspace bound, not a default.
    assert_eq!(
        body_max,
        corral_contract::limits::execute_body_max_bytes(1 << 20),
        "{health}"
    );
    // A declared length over the bound is refused before any of the body is sent.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(RESPONSE_TIMEOUT)).unwrap();
    write!(
        stream,
        "POST /v1/execute HTTP/1.1\r\nHost: worker\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body_max + 1
    )
    .unwrap();
    let (status, json) = read_response(&mut stream);
    assert_eq!(status, 413, "{json}");
    assert_eq!(json["error"], "body_too_large");
    // A bound above the configured one is refused, naming it.
    let (status, json) = server.execute(&json!({
        "language": "python",
        "code": "print(1)",
        "bounds": { "wall_seconds": 31 },
    }));
    assert_eq!(status, 422, "{json}");
    assert_eq!(
        json["detail"]["setting"], "SANDBOX_MAX_WALL_SECONDS",
        "{json}"
    );
}

#[test]
fn api_reads_the_credential_from_its_file_first() {
    if !root_or_skip("api_reads_the_credential_from_its_file_first") {
        return;
    }
    let _serial = serial();
    let dir = TempDir::new("token-file");
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let other = "other-credential-0123456789abcdef";
    let server = Server::start(&[
        ("CORRAL_WORKER_TOKEN_FILE", file.to_str().unwrap()),
        ("CORRAL_WORKER_TOKEN", other),
    ]);
    assert_eq!(server.request("GET", "/health", Some(TOKEN), b"").0, 200);
    assert_eq!(server.request("GET", "/health", Some(other), b"").0, 401);
}

#[test]
fn warm_execute_runs_in_a_prepared_jail_fresh_after_every_reset() {
    if !root_or_skip("warm_execute_runs_in_a_prepared_jail_fresh_after_every_reset") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let code = "import os\nprint(sorted(os.listdir('/tmp')), int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19]))\nopen('/tmp/left-by-first', 'w').write('x')\nimport sys\nprint(repr(sys.stdin.read()), sys.argv[0], __name__)\n";
    wait_prepared(&server);
    let (status, first) =
        server.execute(&json!({ "language": "python", "code": code, "token": 1 }));
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["warm"], true, "{first}");
    assert_eq!(first["exit_code"], 0, "{first}");
    assert_answered_before_reset(&first);
    let first_lines: Vec<String> = first["stdout"]["text"]
        .as_str()
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    // Nothing but what this jail's own preparation made (the pre-imported matplotlib's config
    // directory): no tenant's file.
    let fresh = |line: &str| line.starts_with("[] ") || line.starts_with("['matplotlib'] ");
    assert!(fresh(&first_lines[0]), "{first}");
    // The code reads end of input, as in a cold run, and runs as the main program.
    assert_eq!(first_lines[1], "'' /run/corral/main.py __main__", "{first}");
    // A process's start time counts clock ticks (10 ms): let one pass, so that an interpreter
    // started after this run cannot show the first one's start time.
    std::thread::sleep(Duration::from_millis(50));
    // The prepared jail served one run: the next one, without a reset, is built for it.
    let (_, again) = server.execute(&json!({ "language": "python", "code": "print(1)" }));
    assert_eq!(again["warm"], false, "{again}");
    assert_eq!(again["stdout"]["text"], "1\n", "{again}");
    let (status, reset) = server.request("POST", "/v1/reset", Some(TOKEN), br#"{"token": 2}"#);
    assert_eq!(status, 200, "{reset}");
    assert_clean(&reset);
    wait_prepared(&server);
    let (status, second) =
        server.execute(&json!({ "language": "python", "code": code, "token": 3 }));
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["warm"], true, "{second}");
    assert_answered_before_reset(&second);
    let second_first_line = second["stdout"]["text"]
        .as_str()
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned();
    // Nothing the first tenant left in /tmp, and another pid namespace: a fresh jail.
    assert!(fresh(&second_first_line), "{second}");
    // And another interpreter: the second one started after the first had run. (A namespace's
    // inode number is no witness: the kernel reuses a freed one at once.)
    let started = |line: &str| -> u64 { line.rsplit(' ').next().unwrap().parse().unwrap() };
    assert!(
        started(&second_first_line) > started(&first_lines[0]),
        "{first} {second}"
    );
    let (status, last) = server.request("POST", "/v1/reset", Some(TOKEN), br#"{"token": 4}"#);
    assert_eq!(status, 200, "{last}");
    assert_clean(&last);
}

#[test]
fn bound_1_warm_infinite_loop_is_killed_at_the_wall_limit() {
    if !root_or_skip("bound_1_warm_infinite_loop_is_killed_at_the_wall_limit") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    wait_prepared(&server);
    let (status, json) = server.execute(&json!({
        "language": "python",
        "code": "while True:\n    pass\n",
        "bounds": { "wall_seconds": 2 },
    }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["bound"], "SANDBOX_MAX_WALL_SECONDS", "{json}");
    assert_eq!(json["exit_code"], Value::Null, "{json}");
    assert_answered_before_reset(&json);
    let (status, reset) = server.request("POST", "/v1/reset", Some(TOKEN), br#"{"token": 4}"#);
    assert_eq!(status, 200, "{reset}");
    assert_clean(&reset);
}

/// The parent of process `pid`, from /proc.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The processes descended from `ancestor` running `program` with `needle` in their arguments
/// (the jail's stages carry the interpreter's arguments in their plan, but run another program).
fn descendants_running(ancestor: u32, program: &str, needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        // The interpreter by the end of its path: Python is the baked stack's when there is one.
        let first = cmdline.split('\0').next().unwrap_or_default();
        if !(first.ends_with(program) && cmdline.contains(needle)) {
            continue;
        }
        let mut at = pid;
        // Bounded: a chain of parents ends at pid 1 well before this.
        for _ in 0..64 {
            match parent_of(at) {
                Some(parent) if parent == ancestor => {
                    found.push(pid);
                    break;
                }
                Some(parent) if parent > 1 => at = parent,
                _ => break,
            }
        }
    }
    found
}

#[test]
fn a_prepared_jail_that_died_before_the_lease_means_a_cold_run_that_says_so() {
    if !root_or_skip("a_prepared_jail_that_died_before_the_lease_means_a_cold_run_that_says_so") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    wait_prepared(&server);
    // The waiting bootstrap of this server's prepared jail (and only this server's).
    let waiting = descendants_running(server.child.id(), "/python3", "_corral()");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert!(
        Command::new("kill")
            .args(["-KILL", &waiting[0].to_string()])
            .status()
            .expect("kill runs")
            .success(),
        "the waiting interpreter could not be killed"
    );
    // Only until the interpreter is dead (a zombie or gone), not the jail: the worker must see
    // an ending jail as ended too. Checked until a deadline only a hung kernel reaches.
    let deadline = std::time::Instant::now() + RESPONSE_TIMEOUT;
    while std::fs::read_to_string(format!("/proc/{}/stat", waiting[0])).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the interpreter outlived SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (status, json) = server.execute(&json!({ "language": "python", "code": "print(5)" }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], false, "{json}");
    assert_eq!(json["stdout"]["text"], "5\n", "{json}");
    assert!(
        json["diagnostics"]
            .to_string()
            .contains("the prepared jail had ended"),
        "{json}"
    );
    assert_answered_before_reset(&json);
    let (status, reset) = server.request("POST", "/v1/reset", Some(TOKEN), br#"{"token": 6}"#);
    assert_eq!(status, 200, "{reset}");
    assert_clean(&reset);
}

#[test]
fn bound_1_warm_memory_and_fork_bombs_hit_their_bounds() {
    if !root_or_skip("bound_1_warm_memory_and_fork_bombs_hit_their_bounds") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[
        ("SANDBOX_MAX_MEMORY_BYTES", "134217728"),
        ("SANDBOX_MAX_PROCESSES", "16"),
    ]);
    for (token, code, setting) in [
        (
            7,
            "x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n",
            "SANDBOX_MAX_MEMORY_BYTES",
        ),
        (
            8,
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            "SANDBOX_MAX_PROCESSES",
        ),
    ] {
        wait_prepared(&server);
        let (status, json) = server.execute(&json!({
            "language": "python",
            "code": code,
            "bounds": { "wall_seconds": 3 },
        }));
        assert_eq!(status, 200, "{json}");
        assert_eq!(json["warm"], true, "{json}");
        assert!(
            json["bounds"]
                .as_array()
                .unwrap()
                .contains(&Value::from(setting)),
            "{json}"
        );
        assert_answered_before_reset(&json);
        let body = format!(r#"{{"token": {token}}}"#);
        let (status, reset) = server.request("POST", "/v1/reset", Some(TOKEN), body.as_bytes());
        assert_eq!(status, 200, "{reset}");
        assert_clean(&reset);
    }
}

/// The pids of the waiting bootstraps of `server`'s prepared jails: Python's and Node's.
fn waiting_bootstraps(server: &Server) -> (Vec<u32>, Vec<u32>) {
    (
        descendants_running(server.child.id(), "/python3", "_corral()"),
        descendants_running(server.child.id(), "/node", "m._compile(src, f)"),
    )
}

/// Whether process `pid` is gone or a zombie.
fn ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn reset(server: &Server, token: u64) -> Value {
    let body = format!(r#"{{"token": {token}}}"#);
    let (status, json) = server.request("POST", "/v1/reset", Some(TOKEN), body.as_bytes());
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["reset_evidence"]["token"], token, "{json}");
    assert_clean(&json);
    json
}

#[test]
fn warm_node_and_python_each_have_a_prepared_jail_and_a_reset_replaces_the_one_a_run_took() {
    if !root_or_skip(
        "warm_node_and_python_each_have_a_prepared_jail_and_a_reset_replaces_the_one_a_run_took",
    ) {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "python,node")]);
    let node_code = "const fs = require('fs');\nconsole.log(6 * 7, require.main === module, __filename, JSON.stringify(fs.readFileSync(0, 'utf8')));\n";
    let node_expected = "42 true /run/corral/main.js \"\"\n";
    // Both jails are prepared from the start, each with its interpreter waiting.
    let health = wait_prepared_languages(&server, &["python", "node"]);
    assert_eq!(health["prepared"], true, "{health}");
    let (python, node) = waiting_bootstraps(&server);
    assert_eq!((python.len(), node.len()), (1, 1), "{python:?} {node:?}");
    let (status, json) =
        server.execute(&json!({ "language": "node", "code": node_code, "token": 1 }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["exit_code"], 0, "{json}");
    assert_eq!(json["stdout"]["text"], node_expected, "{json}");
    assert_answered_before_reset(&json);
    // The Python jail still waits, untouched, until the reset.
    let health = wait_prepared_languages(&server, &["python"]);
    assert_eq!(health["prepared"], true, "{health}");
    assert!(!ended(python[0]), "the Python jail went with the Node run");
    // The reset, clean, keeps the Python jail no run took (decision 0060) and ends the Node
    // run's jail.
    reset(&server, 2);
    assert!(
        !ended(python[0]),
        "the untaken Python jail went with the reset"
    );
    assert!(ended(node[0]));
    // After the reset, both again: the same Python interpreter, and Node warm again in a new one.
    wait_prepared_languages(&server, &["python", "node"]);
    let (python_again, node_again) = waiting_bootstraps(&server);
    assert_eq!((python_again.len(), node_again.len()), (1, 1));
    assert_eq!(python_again, python, "the kept Python jail was replaced");
    assert_ne!(node_again, node);
    // The kept jail serves the next tenant, warm.
    let (status, json) = server.execute(&json!({ "language": "python", "code": "print(6 * 7)" }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], "42\n", "{json}");
    assert!(
        ended(python[0]),
        "the kept jail served the run and ended with it"
    );
    reset(&server, 10);
    wait_prepared_languages(&server, &["python", "node"]);
    let (status, json) =
        server.execute(&json!({ "language": "node", "code": node_code, "token": 3 }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], node_expected, "{json}");
    assert_answered_before_reset(&json);
    // A second Node run without a reset is built for the request.
    let (_, json) = server.execute(&json!({ "language": "node", "code": "console.log(1)" }));
    assert_eq!(json["warm"], false, "{json}");
    assert_eq!(json["stdout"]["text"], "1\n", "{json}");
    reset(&server, 4);
    // Successive leases, Python then Node, each warm, each reset clean with two jails prepared.
    for (token, language, code, expected) in [
        (5, "python", "print(6 * 7)", "42\n"),
        (7, "node", "console.log(6 * 7)", "42\n"),
    ] {
        wait_prepared_languages(&server, &["python", "node"]);
        let (status, json) =
            server.execute(&json!({ "language": language, "code": code, "token": token }));
        assert_eq!(status, 200, "{json}");
        assert_eq!(json["warm"], true, "{language}: {json}");
        assert_eq!(json["stdout"]["text"], expected, "{json}");
        assert_answered_before_reset(&json);
        reset(&server, token + 1);
    }
    // A reset with both jails prepared and untaken is clean, and keeps both.
    wait_prepared_languages(&server, &["python", "node"]);
    let (python, node) = waiting_bootstraps(&server);
    assert_eq!((python.len(), node.len()), (1, 1));
    reset(&server, 9);
    assert!(!ended(python[0]) && !ended(node[0]), "{python:?} {node:?}");
    assert_eq!(waiting_bootstraps(&server), (python, node));
}

#[test]
fn prepare_languages_python_only_runs_node_cold() {
    if !root_or_skip("prepare_languages_python_only_runs_node_cold") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "python")]);
    wait_prepared_languages(&server, &["python"]);
    let (python, node) = waiting_bootstraps(&server);
    assert_eq!((python.len(), node.len()), (1, 0), "{python:?} {node:?}");
    let (status, json) =
        server.execute(&json!({ "language": "node", "code": "console.log(6 * 7)" }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], false, "{json}");
    assert_eq!(json["exit_code"], 0, "{json}");
    assert_eq!(json["stdout"]["text"], "42\n", "{json}");
    assert_answered_before_reset(&json);
    // Python's jail is still there for its run.
    let (_, json) = server.execute(&json!({ "language": "python", "code": "print(1)" }));
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], "1\n", "{json}");
    // Both runs' own resets, counted by the reset between leases.
    reset(&server, 1);
    wait_prepared_languages(&server, &["python"]);
}

#[test]
fn prepare_languages_set_but_empty_prepares_nothing() {
    if !root_or_skip("prepare_languages_set_but_empty_prepares_nothing") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "")]);
    // The execute waits on the jail thread behind the (empty) preparation at start.
    let (status, json) = server.execute(&json!({ "language": "python", "code": "print(1)" }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], false, "{json}");
    assert_eq!(json["stdout"]["text"], "1\n", "{json}");
    let (_, health) = server.request("GET", "/health", Some(TOKEN), b"");
    assert_eq!(health["prepared"], false, "{health}");
    assert_eq!(health["prepared_languages"], json!([]), "{health}");
    assert_eq!(waiting_bootstraps(&server), (vec![], vec![]));
    reset(&server, 1);
}

#[test]
fn api_refuses_to_start_with_an_unknown_prepare_language_or_module_name() {
    for (setting, value) in [
        ("CORRAL_WORKER_PREPARE_LANGUAGES", "python,ruby"),
        ("CORRAL_WORKER_PYTHON_PREIMPORT", "json,os;import x"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_corral-worker"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("CORRAL_WORKER_TOKEN", TOKEN)
            .env(setting, value)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{setting}={value}");
        assert!(output.stdout.is_empty(), "it must not listen");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(setting), "{stderr}");
    }
}

#[test]
fn python_preimport_is_in_sys_modules_before_the_code_imports_it() {
    if !root_or_skip("python_preimport_is_in_sys_modules_before_the_code_imports_it") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[
        ("CORRAL_WORKER_PYTHON_PREIMPORT", "json,no_such_module_xyz"),
        ("CORRAL_WORKER_PREIMPORT_IDLE_SECONDS", "1"),
    ]);
    let code = "import sys\n\
        print('json' in sys.modules, 'no_such_module_xyz' in sys.modules)\n\
        print(sorted(k for k in globals() if k not in ('__name__', '__doc__', '__builtins__', '__spec__', '__loader__', '__package__', '__file__')))\n\
        import json, mymod\n\
        print(json.dumps([mymod.X]))\n";
    // A module of the tenant's workspace is still found, though the import system looked at the
    // (then empty) workspace while preparing.
    let workspace = BASE64.encode(tar_of(&[("mymod.py", b"X = 5\n")]));
    // A new worker prepares the stack once it has been idle a moment (decision 0037).
    wait_preimported(&server);
    let (status, json) = server.execute(&json!({
        "language": "python",
        "code": code,
        "workspace": workspace,
        "token": 1,
    }));
    assert_eq!(status, 200, "{json}");
    // The missing module did not break the preparation: the run is warm.
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["exit_code"], 0, "{json}");
    assert_eq!(
        json["stdout"]["text"], "True False\n['sys']\n[5]\n",
        "{json}"
    );
    assert_answered_before_reset(&json);
    // The jail prepared without the stack, which waited beside it (decision 0046), has imported
    // nothing: the check above can fail.
    let (_, json) =
        server.execute(&json!({ "language": "python", "code": code, "workspace": workspace }));
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(
        json["stdout"]["text"], "False False\n['sys']\n[5]\n",
        "{json}"
    );
    reset(&server, 2);
}

#[test]
fn a_prepared_jail_waits_at_low_priority_and_its_run_gets_the_normal_one() {
    if !root_or_skip("a_prepared_jail_waits_at_low_priority_and_its_run_gets_the_normal_one") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    wait_prepared(&server);
    // While it waits, the prepared interpreter runs at preparation's priority.
    let (python, _) = waiting_bootstraps(&server);
    let nice = nice_of;
    assert!(!python.is_empty(), "a prepared Python bootstrap waits");
    assert!(
        python.iter().all(|pid| nice(*pid) == Some(10)),
        "{:?}",
        python.iter().map(|p| nice(*p)).collect::<Vec<_>>()
    );
    // The run that takes it, and what the run starts, get the normal priority back.
    let code = "import os, subprocess\nprint(os.nice(0), subprocess.run(['/usr/bin/python3', '-c', 'import os; print(os.nice(0))'], capture_output=True, text=True).stdout.strip())\n";
    let (status, json) = server.execute(&json!({ "language": "python", "code": code, "token": 1 }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], "0 0\n", "{json}");
    assert_answered_before_reset(&json);
    reset(&server, 2);
}

#[test]
fn a_request_naming_another_worker_is_refused_and_nothing_runs() {
    if !root_or_skip("a_request_naming_another_worker_is_refused_and_nothing_runs") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[("CORRAL_WORKER_ID", "w-test-7")]);
    let send = |named: Option<&str>| {
        let body =
            json!({ "language": "python", "code": "open('ran', 'w').write('x')\nprint('ran')", "token": 1 })
                .to_string();
        let mut head = format!(
            "POST /v1/execute HTTP/1.1\r\nHost: worker\r\nConnection: close\r\nContent-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(named) = named {
            head.push_str(&format!("X-Corral-Worker-Id: {named}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        std::io::Write::write_all(&mut stream, head.as_bytes()).unwrap();
        std::io::Write::write_all(&mut stream, body.as_bytes()).unwrap();
        read_response(&mut stream)
    };
    for named in [None, Some("w-test-8"), Some("w-test-77")] {
        let (status, json) = send(named);
        assert_eq!(
            (status, json["error"].as_str()),
            (421, Some("wrong_worker")),
            "{named:?}: {json}"
        );
    }
    let (status, json) = send(Some("w-test-7"));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["stdout"]["text"], "ran\n", "{json}");
}

#[test]
fn a_request_waiting_for_the_worker_hastens_what_it_prepared() {
    if !root_or_skip("a_request_waiting_for_the_worker_hastens_what_it_prepared") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "python")]);
    wait_prepared(&server);
    let (python, _) = waiting_bootstraps(&server);
    assert_eq!(python.len(), 1, "{python:?}");
    assert_eq!(nice_of(python[0]), Some(10), "prepared at low priority");
    // A Node run goes cold and leaves the Python jail prepared; the request that waited for the
    // worker's thread gave what the thread had started the normal priority (decision 0036).
    let (status, json) = server.execute(&json!({ "language": "node", "code": "console.log(1)" }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], false, "{json}");
    let (still, _) = waiting_bootstraps(&server);
    assert_eq!(
        still, python,
        "the prepared Python jail is untouched by the Node run"
    );
    assert_eq!(nice_of(python[0]), Some(0), "hastened");
    reset(&server, 1);
}

#[test]
fn every_thread_a_prepared_jail_started_runs_the_code_at_the_normal_priority() {
    const TEST: &str = "every_thread_a_prepared_jail_started_runs_the_code_at_the_normal_priority";
    if !root_or_skip(TEST) {
        return;
    }
    if blas_cpus_or_skip(TEST).is_none() {
        return;
    }
    let _serial = serial();
    // A new worker's first jail skips the stack; left idle, it prepares one that imports it, at
    // the idle re-preparation's priority (decision 0037).
    let server = Server::start(&[
        ("CORRAL_WORKER_PREPARE_LANGUAGES", "python"),
        ("CORRAL_WORKER_PYTHON_PREIMPORT", "numpy"),
        ("CORRAL_WORKER_PREIMPORT_IDLE_SECONDS", "1"),
    ]);
    wait_preimported(&server);
    let stack = descendants_running(server.child.id(), "/python3", "_corral_preimport");
    assert_eq!(stack.len(), 1, "{stack:?}");
    let prepared = thread_nices(stack[0]);
    assert!(
        prepared.len() > 1,
        "numpy's import started threads in the prepared jail: {prepared:?}"
    );
    assert!(
        prepared.iter().all(|nice| *nice == 19),
        "prepared at the idle priority: {prepared:?}"
    );
    // The run's code (which uses numpy, so it takes the jail that imported it) reads the nice
    // value of every thread of its own interpreter: the ones the import started too, not only
    // the main thread (the last thread to exit frees the address space, and the answer waits
    // for it).
    let code = "import os, numpy\nprint(sorted({int(open(f'/proc/self/task/{t}/stat').read().rsplit(')', 1)[1].split()[16]) for t in os.listdir('/proc/self/task')}), len(os.listdir('/proc/self/task')) > 1)\n";
    let (status, json) = server.execute(&json!({ "language": "python", "code": code }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], "[0] True\n", "{json}");
    reset(&server, 1);
}

/// The nice value of every thread of process `pid`.
fn thread_nices(pid: u32) -> Vec<i64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|tid| nice_in(&format!("/proc/{pid}/task/{tid}/stat")))
                .collect()
        })
        .unwrap_or_default()
}

/// A process's nice value: field 19 of /proc/PID/stat, counted after the command's closing
/// parenthesis.
fn nice_of(pid: u32) -> Option<i64> {
    nice_in(&format!("/proc/{pid}/stat"))
}

/// The nice value in the stat file at `path` (a process's or one thread's).
fn nice_in(path: &str) -> Option<i64> {
    let stat = std::fs::read_to_string(path).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(16)?
        .parse()
        .ok()
}

#[test]
fn pkg_1_an_idle_worker_prepares_its_python_jail_again_with_the_stack() {
    if !root_or_skip("pkg_1_an_idle_worker_prepares_its_python_jail_again_with_the_stack") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[
        ("CORRAL_WORKER_PREPARE_LANGUAGES", "python"),
        ("CORRAL_WORKER_PYTHON_PREIMPORT", "json"),
        ("CORRAL_WORKER_PREIMPORT_IDLE_SECONDS", "3"),
    ]);
    // A run that imports none of it: the jail prepared after its reset does not pre-import.
    wait_prepared(&server);
    let (status, json) = server.execute(&json!({ "language": "python", "code": "print(1)" }));
    assert_eq!(status, 200, "{json}");
    reset(&server, 1);
    wait_prepared(&server);
    assert_eq!(preimporting(&server), 0, "prepared without the stack first");
    // Left idle, the worker prepares a second jail with the stack, which waits beside the first
    // (decision 0046): a run that does not use the stack takes the first, whose exit frees
    // little; one that does takes the second.
    wait_preimported(&server);
    let code = "import sys\nprint('json' in sys.modules)\n";
    let (status, json) = server.execute(&json!({ "language": "python", "code": code }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], "False\n", "{json}");
    reset(&server, 2);
    wait_preimported(&server);
    // Imported before the code's own import: the jail that pre-imported it.
    let code = "import sys\nhad = 'json' in sys.modules\nimport json\nprint(had)\n";
    let (status, json) = server.execute(&json!({ "language": "python", "code": code }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], "True\n", "{json}");
    reset(&server, 3);
}

/// A prepared jail that no run took but whose interpreter ended is never handed on: the reset
/// tears it down, counted in its clean evidence, and a new one is prepared (decision 0060).
#[test]
fn a_reset_replaces_an_untaken_prepared_jail_whose_interpreter_ended() {
    if !root_or_skip("a_reset_replaces_an_untaken_prepared_jail_whose_interpreter_ended") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "python")]);
    wait_prepared_languages(&server, &["python"]);
    let (python, _) = waiting_bootstraps(&server);
    assert_eq!(python.len(), 1, "{python:?}");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &python[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Checked until a deadline only a stuck kernel reaches. The answer is the loop's own: read
    // once more, the pid (of a machine whose pid_max is 32768) could already be another process's.
    let deadline = std::time::Instant::now() + RESPONSE_TIMEOUT;
    let mut gone = ended(python[0]);
    while !gone && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        gone = ended(python[0]);
    }
    assert!(gone, "the killed interpreter still runs");
    reset(&server, 1);
    wait_prepared_languages(&server, &["python"]);
    let (again, _) = waiting_bootstraps(&server);
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again, python, "the ended jail was kept");
    let (status, json) = server.execute(&json!({ "language": "python", "code": "print(7)" }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], "7\n", "{json}");
    reset(&server, 2);
}

/// After a run that used the stack, the worker prepares the stack's jail beside a plain one
/// (decision 0056): a run that does not use the stack takes the plain one (it pays no teardown of
/// the stack), one that does takes the stack's.
#[test]
fn pkg_1_after_a_run_that_used_the_stack_its_jail_waits_beside_a_plain_one() {
    if !root_or_skip("pkg_1_after_a_run_that_used_the_stack_its_jail_waits_beside_a_plain_one") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[
        ("CORRAL_WORKER_PREPARE_LANGUAGES", "python"),
        ("CORRAL_WORKER_PYTHON_PREIMPORT", "json"),
        ("CORRAL_WORKER_PREIMPORT_IDLE_SECONDS", "0"),
    ]);
    wait_prepared(&server);
    assert_eq!(
        preimporting(&server),
        0,
        "a new worker prepares without the stack"
    );
    let code = "import json\nprint(json.dumps([1]))\n";
    let (status, json) = server.execute(&json!({ "language": "python", "code": code }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["stdout"]["text"], "[1]\n", "{json}");
    reset(&server, 1);
    // No idle wait is set: the reset's own preparation made both.
    wait_preimported(&server);
    let code = "import sys\nprint('json' in sys.modules)\n";
    let (status, json) = server.execute(&json!({ "language": "python", "code": code }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], "False\n", "the plain jail: {json}");
    let stack_jail = descendants_running(server.child.id(), "/python3", "_corral_preimport");
    assert_eq!(stack_jail.len(), 1, "the stack's jail waits, untaken");
    reset(&server, 2);
    // No run took the stack's jail: the reset keeps it (decision 0060), beside a new plain one.
    wait_preimported(&server);
    assert_eq!(
        descendants_running(server.child.id(), "/python3", "_corral_preimport"),
        stack_jail,
        "the untaken stack's jail was replaced"
    );
    let code = "import json\nprint(2)\n";
    let (status, json) = server.execute(&json!({ "language": "python", "code": code }));
    assert_eq!(status, 200, "{json}");
    reset(&server, 3);
    wait_preimported(&server);
    let code = "import sys\nhad = 'json' in sys.modules\nimport json\nprint(had)\n";
    let (status, json) = server.execute(&json!({ "language": "python", "code": code }));
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["warm"], true, "{json}");
    assert_eq!(json["stdout"]["text"], "True\n", "the stack's jail: {json}");
    reset(&server, 4);
}

/// How many of the server's waiting Python bootstraps pre-import.
fn preimporting(server: &Server) -> usize {
    descendants_running(server.child.id(), "/python3", "_corral_preimport").len()
}

/// Waits until the server's Python jail prepared again with the stack waits for the code beside
/// the one prepared without it (a check of their state, repeated until a deadline only a stuck
/// worker reaches): two bootstraps, the one that pre-imports blocked reading its pipe.
fn wait_preimported(server: &Server) {
    let beside = |server: &Server| {
        let (python, _) = waiting_bootstraps(server);
        let stack = descendants_running(server.child.id(), "/python3", "_corral_preimport");
        python.len() == 2 && stack.len() == 1 && waits_on_its_pipe(stack[0])
    };
    // Judged once per look: a look that found the state is the answer (a second look could
    // meet a process of a torn-down jail whose command line is already gone).
    let deadline = std::time::Instant::now() + RESPONSE_TIMEOUT;
    let mut found = beside(server);
    while !found && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        found = beside(server);
    }
    assert!(
        found,
        "a prepared Python jail that pre-imported, beside the plain one: waiting {:?}, pre-importing {:?}",
        waiting_bootstraps(server).0,
        descendants_running(server.child.id(), "/python3", "_corral_preimport")
    );
    wait_prepared(server);
}

/// Whether process `pid` sleeps reading a pipe (its bootstrap waits for the code).
fn waits_on_its_pipe(pid: u32) -> bool {
    // `pipe_read`, or `anon_pipe_read` on later kernels.
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).is_ok_and(|w| w.ends_with("pipe_read"))
}
