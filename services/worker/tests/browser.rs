//! Browser sessions at the worker (BROW-1, BROW-3, BROW-10, BROW-13): a real `corral-worker
//! serve`, a real jail, Xvfb, Openbox, PulseAudio and one headed Chromium driven over its pipe.
//! Needs root and Debian's chromium, xvfb and openbox (`scripts/setup-services` installs them);
//! without them each test skips through `corral_testkit::skip`, which CI forbids.

mod common;

use std::path::Path;
use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::api::{Server, TOKEN};
use common::{root_or_skip, serial};
use serde_json::{Value, json};

/// The browser binary, whose processes the test looks for.
const CHROMIUM: &str = corral_worker::RUNTIME_PROGRAMS[0].1;

fn runtime_or_skip(test: &str) -> bool {
    root_or_skip(test) && corral_testkit::programs_or_skip(test, &corral_worker::RUNTIME_PROGRAMS)
}

fn post(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    server.request("POST", path, Some(TOKEN), body.to_string().as_bytes())
}

fn act(server: &Server, action: Value) -> (u16, Value) {
    post(server, "/v1/browser/act", &action)
}

/// The ports listening in the network namespace of process `pid` (TCP, IPv4 and IPv6).
fn listening_ports(pid: i32) -> Vec<u16> {
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // The local address is HEX_IP:HEX_PORT; state 0A is LISTEN.
            if fields.get(3) == Some(&"0A")
                && let Some(port) = fields[1].rsplit(':').next()
            {
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
        .unwrap_or_default()
}

#[test]
fn brow_01_brow_03_brow_10_brow_13_one_headed_chromium_in_the_jail_driven_then_closed_clean() {
    let test =
        "brow_01_brow_03_brow_10_brow_13_one_headed_chromium_in_the_jail_driven_then_closed_clean";
    if !runtime_or_skip(test) {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let (status, opened) = post(&server, "/v1/browser/open", &json!({ "token": 11 }));
    assert_eq!(status, 200, "{opened}");
    assert_eq!(opened["isolation"]["posture"], "full", "{opened}");
    // The session holds the worker: no run and no second session.
    let (status, refused) = server.execute(&json!({ "language": "python", "code": "print(1)" }));
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("browser_session_open")),
        "{refused}"
    );
    let (status, refused) = post(&server, "/v1/browser/open", &json!({ "token": 12 }));
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("browser_session_open"))
    );

    // One headed Chromium, in the jail, owned over a pipe: no debugger port, its vendor calls
    // and QUIC off, and its proxy the relay with loopback subtracted from the bypass.
    let processes = server.jail_processes();
    let chromium: Vec<i32> = processes
        .iter()
        .copied()
        .filter(|pid| cmdline(*pid).starts_with(CHROMIUM) && !cmdline(*pid).contains("--type="))
        .collect();
    assert_eq!(chromium.len(), 1, "one browser process: {processes:?}");
    let line = cmdline(chromium[0]);
    for flag in [
        "--remote-debugging-pipe",
        "--disable-quic",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--proxy-server=http://127.0.0.1:3128",
        "--proxy-bypass-list=<-loopback>",
    ] {
        assert!(line.contains(flag), "{flag} missing: {line}");
    }
    assert!(!line.contains("--headless"), "{line}");
    assert!(!line.contains("--remote-debugging-port"), "{line}");
    for pid in &processes {
        let ports = listening_ports(*pid);
        assert!(
            ports.iter().all(|port| *port == 3128),
            "pid {pid} ({}) listens on {ports:?}",
            cmdline(*pid)
        );
    }
    assert!(
        processes
            .iter()
            .any(|pid| cmdline(*pid).starts_with("/usr/bin/Xvfb")),
        "no X display"
    );
    assert!(
        processes
            .iter()
            .any(|pid| cmdline(*pid).starts_with("/usr/bin/openbox")),
        "no window manager"
    );
    // BROW-1: PulseAudio runs in the jail while the session is open (the close below checks it
    // has stopped), and the profile is fresh in the jail's /tmp.
    let pulseaudio = corral_worker::RUNTIME_PROGRAMS[3].1;
    let bridge: Vec<i32> = processes
        .iter()
        .copied()
        .filter(|pid| cmdline(*pid).starts_with("/usr/bin/python3 /run/corral/bridge.py"))
        .collect();
    assert_eq!(bridge.len(), 1, "{processes:?}");
    assert!(
        processes.iter().any(|pid| {
            cmdline(*pid).starts_with(&format!("{pulseaudio} "))
                && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                        .and_then(|ppid| ppid.parse::<i32>().ok())
                        == Some(bridge[0])
                })
        }),
        "no PulseAudio started by the bridge: {processes:?}"
    );
    assert!(
        Path::new(&format!(
            "/proc/{}/root/tmp/profile/Default/Preferences",
            bridge[0]
        ))
        .is_file(),
        "no profile in the jail"
    );

    // Structured actions on a page.
    let (status, page) = act(
        &server,
        json!({ "action": "navigate", "url": "about:blank" }),
    );
    assert_eq!(status, 200, "{page}");
    let (status, built) = act(
        &server,
        json!({ "action": "evaluate", "expression":
            "document.body.innerHTML = '<h1>Form</h1><input id=\"name\"><button id=\"go\" onclick=\"document.getElementById(\\'out\\').textContent = \\'Hi \\' + document.getElementById(\\'name\\').value\">Go</button><p id=\"out\">nothing yet</p>'; 'built'" }),
    );
    assert_eq!(
        (status, built["result"]["value"].as_str()),
        (200, Some("\"built\"")),
        "{built}"
    );
    let (status, typed) = act(
        &server,
        json!({ "action": "type", "selector": "#name", "text": "Ann" }),
    );
    assert_eq!(status, 200, "{typed}");
    let (status, clicked) = act(&server, json!({ "action": "click", "selector": "#go" }));
    assert_eq!(status, 200, "{clicked}");
    let (_, text) = act(&server, json!({ "action": "text" }));
    assert!(
        text["result"]["text"].as_str().unwrap().contains("Hi Ann"),
        "{text}"
    );
    let (_, tree) = act(&server, json!({ "action": "accessibility" }));
    let nodes = tree["result"]["nodes"].as_array().unwrap();
    assert!(
        nodes
            .iter()
            .any(|n| n["role"] == "button" && n["name"] == "Go"),
        "{tree}"
    );
    let (status, shot) = act(&server, json!({ "action": "screenshot" }));
    assert_eq!(status, 200);
    let png = BASE64
        .decode(shot["result"]["png"].as_str().unwrap())
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join("brow_10_screenshot.png");
    std::fs::write(&saved, &png).unwrap();
    eprintln!("screenshot: {}", saved.display());

    // Bad input, each with its own code within its bound; the session carries on after each.
    let (status, missing) = act(
        &server,
        json!({ "action": "click", "selector": "#nothing" }),
    );
    assert_eq!(
        (status, missing["detail"]["reason"].as_str()),
        (422, Some("selector_not_found"))
    );
    let started = Instant::now();
    let (_, hung) = act(
        &server,
        json!({ "action": "evaluate", "expression": "while (true) {}", "timeout_ms": 1500 }),
    );
    assert_eq!(hung["detail"]["reason"], "action_timed_out", "{hung}");
    assert!(started.elapsed().as_secs() < 10, "the hang was not bounded");
    let (_, thrown) = act(
        &server,
        json!({ "action": "evaluate", "expression": "null.x" }),
    );
    assert_eq!(thrown["detail"]["reason"], "script_error", "{thrown}");
    let (status, invalid) = act(
        &server,
        json!({ "action": "navigate", "url": "file:///etc/passwd" }),
    );
    assert_eq!(
        (status, invalid["detail"]["reason"].as_str()),
        (422, Some("action_invalid"))
    );
    // A page that opens a thousand tabs gets at most the one its last user activation allows,
    // and the bridge closes any page but its own after each action.
    let (_, opened_tabs) = act(
        &server,
        json!({ "action": "evaluate", "expression":
            "let n = 0; for (let i = 0; i < 1000; i++) { if (window.open('about:blank')) n++; } n" }),
    );
    let opened_count: u32 = opened_tabs["result"]["value"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(opened_count <= 1, "{opened_tabs}");
    // A page's request for the worker's own ports goes to the proxy, not to loopback.
    let (_, control) = act(
        &server,
        json!({ "action": "navigate", "url": "http://127.0.0.1:8091/health" }),
    );
    assert_eq!(
        control["detail"]["reason"], "navigation_failed",
        "{control}"
    );
    let (_, still) = act(
        &server,
        json!({ "action": "evaluate", "expression": "6 * 7" }),
    );
    assert_eq!(still["result"]["value"], "42", "{still}");

    // Close: every process stopped, the profile gone, the reset's evidence clean.
    let (status, closed) = post(&server, "/v1/browser/close", &json!({ "token": 13 }));
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["confirmed"], true, "{closed}");
    assert_eq!(closed["reset_evidence"]["verdict"], "clean", "{closed}");
    assert_eq!(closed["reset_evidence"]["token"], 13, "{closed}");
    let left: Vec<String> = server
        .jail_processes()
        .into_iter()
        .map(cmdline)
        .filter(|line| {
            ["chromium", "Xvfb", "openbox", "pulseaudio", "bridge.py"]
                .iter()
                .any(|p| line.contains(p))
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let (status, absent) = act(&server, json!({ "action": "text" }));
    assert_eq!(
        (status, absent["error"].as_str()),
        (409, Some("browser_session_absent"))
    );
    // The worker serves a run again.
    let (status, ran) = server.execute(&json!({ "language": "python", "code": "print('after')" }));
    assert_eq!(
        (status, ran["stdout"]["text"].as_str()),
        (200, Some("after\n")),
        "{ran}"
    );
}
