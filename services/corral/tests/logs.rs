//! The services' logs (issue 31) through `corral up` with `CORRAL_LOG_FORMAT=json`: JSON lines,
//! a run's lines carrying its run id and, once granted, its lease and worker; and nothing of the
//! run's code, its output or a credential in any line. Needs root and Valkey; without them it
//! skips through `corral_testkit::skip`, which CI forbids.

mod common;

use std::process::Stdio;

use common::stack::{Stack, python, stdout};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_a_runs_id_lease_and_worker_and_never_its_code_output_or_credentials() {
    let test =
        "json_logs_carry_a_runs_id_lease_and_worker_and_never_its_code_output_or_credentials";
    let log_path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("corral-logs-{}.jsonl", std::process::id()));
    let log = std::fs::File::create(&log_path).expect("the log file");
    let Some(stack) = Stack::start_with_stderr(
        test,
        &[("CORRAL_LOG_FORMAT", "json"), ("RUST_LOG", "info")],
        &[],
        Stdio::from(log),
    ) else {
        return;
    };
    let code = "# SECRET-CODE-91b2\nprint('SECRET-OUTPUT-' + '7f3a')\n";
    let (status, answer) = stack.run(python("lia", "logs", code)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(stdout(&answer), "SECRET-OUTPUT-7f3a\n");
    let run_id = answer["run_id"].as_str().expect("run id").to_owned();
    // The run's last line is written (unbuffered) before its answer leaves the API.
    let text = std::fs::read_to_string(&log_path).expect("the log");
    let lines: Vec<Value> = text
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let of_run: Vec<&Value> = lines
        .iter()
        .filter(|line| line["span"]["corral.run_id"] == run_id.as_str())
        .collect();
    let messages: Vec<&str> = of_run
        .iter()
        .filter_map(|line| line["fields"]["message"].as_str())
        .collect();
    for expected in ["admitted", "leased", "run answered"] {
        assert!(
            messages.contains(&expected),
            "{expected} missing: {messages:?}"
        );
    }
    let answered = of_run
        .iter()
        .find(|line| line["fields"]["message"] == "run answered")
        .unwrap();
    assert_eq!(answered["fields"]["outcome"], "succeeded", "{answered}");
    assert!(answered["span"]["corral.worker"].is_string(), "{answered}");
    assert!(answered["span"]["corral.lease"].is_u64(), "{answered}");
    // Nothing of the code, the output or a credential, in any line of any process.
    let everything = std::fs::read_to_string(&log_path).unwrap();
    for secret in [
        "SECRET-CODE-91b2".to_owned(),
        "SECRET-OUTPUT-7f3a".to_owned(),
        std::fs::read_to_string(stack.state.join("api-token"))
            .unwrap()
            .trim()
            .to_owned(),
        std::fs::read_to_string(stack.state.join("worker-token"))
            .unwrap()
            .trim()
            .to_owned(),
    ] {
        assert!(!everything.contains(&secret), "a log line holds {secret:?}");
    }
    let _ = std::fs::remove_file(&log_path);
}
