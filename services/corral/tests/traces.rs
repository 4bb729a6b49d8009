//! Traces over OTLP (issue 31) through `corral up`: an OTLP/HTTP receiver run here (JSON
//! encoding), `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at it, and a run whose spans arrive in one
//! trace across the API and the worker (the worker's span continues the API's by the
//! `traceparent` on the worker contract), with `corral.*` attributes and nothing of the run's code
//! or output in any attribute. Then the receiver goes away and runs go on. Needs root and Valkey;
//! without them it skips through `corral_testkit::skip`, which CI forbids.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::stack::{Stack, python, stdout};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// An OTLP/HTTP receiver: every request body it got, answered 200.
async fn receiver() -> (u16, Arc<Mutex<Vec<Value>>>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = bodies.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 65536];
                // Headers, then exactly Content-Length bytes of body.
                let (head_end, length) = loop {
                    let Ok(read) = stream.read(&mut chunk).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..read]);
                    if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (end + 4, length);
                    }
                };
                while buffer.len() < head_end + length {
                    let Ok(read) = stream.read(&mut chunk).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..read]);
                }
                if let Ok(body) = serde_json::from_slice(&buffer[head_end..head_end + length]) {
                    kept.lock().unwrap().push(body);
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
                    .await;
            });
        }
    });
    (port, bodies, task)
}

/// A span as received.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    trace: String,
    name: String,
    attributes: Vec<(String, Value)>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&Value> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// Every span received.
fn spans(bodies: &[Value]) -> Vec<Received> {
    let mut found = Vec::new();
    for body in bodies {
        for resource in body["resourceSpans"].as_array().into_iter().flatten() {
            let service = resource["resource"]["attributes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["key"] == "service.name")
                .and_then(|a| a["value"]["stringValue"].as_str())
                .unwrap_or_default()
                .to_owned();
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    let attributes = span["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|a| {
                            (
                                a["key"].as_str().unwrap_or_default().to_owned(),
                                a["value"].clone(),
                            )
                        })
                        .collect();
                    let text = |key: &str| span[key].as_str().unwrap_or_default().to_owned();
                    found.push(Received {
                        service: service.clone(),
                        trace: text("traceId"),
                        name: text("name"),
                        attributes,
                    });
                }
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_spans_reach_an_otlp_receiver_in_one_trace_across_api_and_worker() {
    let test = "a_runs_spans_reach_an_otlp_receiver_in_one_trace_across_api_and_worker";
    let (port, bodies, task) = receiver().await;
    let endpoint = format!("http://127.0.0.1:{port}");
    let Some(stack) = Stack::start(
        test,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
        &[],
    ) else {
        return;
    };
    let code = "# SECRET-CODE-5d1e\nprint('SECRET-OUTPUT-' + 'c0de')\n";
    let (status, answer) = stack.run(python("tia", "traces", code)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(stdout(&answer), "SECRET-OUTPUT-c0de\n");
    let run_id = answer["run_id"].as_str().unwrap().to_owned();
    // The batches arrive on the exporters' schedule: wait for the run's two spans, or fail.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (run, execute) = loop {
        let received = spans(&bodies.lock().unwrap());
        let run = received.iter().find(|s| {
            s.name == "run"
                && s.attribute("corral.run_id")
                    .is_some_and(|v| v["stringValue"] == run_id.as_str())
        });
        let execute = run.and_then(|run| {
            received
                .iter()
                .find(|s| s.name == "execute" && s.trace == run.trace)
                .cloned()
        });
        if let (Some(run), Some(execute)) = (run.cloned(), execute) {
            break (run, execute);
        }
        assert!(
            Instant::now() < deadline,
            "no run span with its worker's execute span in one trace: {received:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(run.service, "corral", "{run:?}");
    assert_eq!(execute.service, "corral-worker", "{execute:?}");
    assert!(
        !run.trace.is_empty() && execute.trace == run.trace,
        "one trace: {run:?} {execute:?}"
    );
    assert_eq!(
        run.attribute("corral.outcome").unwrap()["stringValue"],
        "succeeded"
    );
    assert!(run.attribute("corral.worker").is_some(), "{run:?}");
    assert!(run.attribute("corral.egress_mode").is_some(), "{run:?}");
    assert!(execute.attribute("corral.lease").is_some(), "{execute:?}");
    // Nothing of the code, the output or a credential in anything exported.
    let everything = serde_json::to_string(&*bodies.lock().unwrap()).unwrap();
    let token = std::fs::read_to_string(stack.state.join("api-token")).unwrap();
    for secret in ["SECRET-CODE-5d1e", "SECRET-OUTPUT-c0de", token.trim()] {
        assert!(
            !everything.contains(secret),
            "an exported attribute holds {secret:?}"
        );
    }
    // The receiver goes away: runs go on, unaffected, and what cannot be sent is counted.
    task.abort();
    let (status, after) = stack.run(python("tia", "traces", "print('still')")).await;
    assert_eq!((status, stdout(&after)), (200, "still\n"), "{after}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, metrics) = stack.caller.get("/metrics").await.unwrap();
        let dropped = String::from_utf8_lossy(&metrics)
            .lines()
            .find_map(|l| l.strip_prefix("corral_otlp_spans_dropped_total "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .expect("the counter is exposed");
        if dropped > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no dropped span counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
