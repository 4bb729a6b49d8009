//! `corral egress-proxy` serves on one single-threaded runtime per serving thread, each with its
//! own socket on the one address (issue 29): every connection is answered whichever socket the
//! kernel gives it to, and the proxy stops on SIGTERM with every thread. No root, no services.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

const THREADS: usize = 3;
const CONNECTIONS: usize = 300;

#[test]
fn every_serving_thread_answers_and_all_stop_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("corral-egress-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let mut child = Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("egress-proxy")
        .env("CORRAL_EGRESS_LISTEN", "127.0.0.1:0")
        .env("CORRAL_EGRESS_VERIFYING_KEY_FILE", dir.join("no-key-yet"))
        .env_remove("CORRAL_EGRESS_VERIFYING_KEY_URL")
        .env(
            corral_egress_proxy::run::THREADS_VARIABLE,
            THREADS.to_string(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the proxy starts");
    let mut log = BufReader::new(child.stderr.take().expect("stderr"));
    let mut first = String::new();
    log.read_line(&mut first).expect("the started line");
    let started: serde_json::Value = serde_json::from_str(&first).expect(&first);
    assert_eq!(started["event"], "egress_proxy_started", "{first}");
    assert_eq!(started["threads"], THREADS as u64, "{first}");
    let address: std::net::SocketAddr = started["listen"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .expect("a listen address");

    // Named threads beside the first: one per further serving runtime.
    let names: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .expect("the proxy's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect();
    for index in 1..THREADS {
        assert!(
            names.contains(&format!("egress-{index}")),
            "serving thread egress-{index} among {names:?}"
        );
    }

    // Every connection answered: one whose socket no thread served would wait for ever.
    let answers: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                scope.spawn(move || {
                    let mut stream = std::net::TcpStream::connect(address).expect("connects");
                    stream
                        .set_read_timeout(Some(Duration::from_secs(20)))
                        .expect("a timeout");
                    stream
                        .write_all(
                            b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n",
                        )
                        .expect("sent");
                    let mut answer = Vec::new();
                    let _ = stream.read_to_end(&mut answer);
                    String::from_utf8_lossy(&answer).into_owned()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a client"))
            .collect()
    });
    let unanswered = answers
        .iter()
        .filter(|a| !a.starts_with("HTTP/1.1 407"))
        .count();
    assert_eq!(unanswered, 0, "of {CONNECTIONS}: {:?}", answers.first());

    let signalled = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(signalled.success());
    let mut rest = String::new();
    log.read_to_string(&mut rest).expect("the rest of the log");
    let status = child.wait().expect("exits");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{status:?}\n{rest}");
    assert!(rest.contains("\"egress_proxy_stopped\""), "{rest}");
    let denied = rest
        .lines()
        .filter(|l| l.contains("\"egress_decision\"") && l.contains("\"deny\""))
        .count();
    assert_eq!(denied, CONNECTIONS, "one decision line per connection");
}
