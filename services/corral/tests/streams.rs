//! Streamed runs through `corral up` (WS-7's stream, issue 31): the code's output as it writes
//! it, numbered events kept in Valkey, and a stream resumed with `Last-Event-ID` on another API
//! replica (a separate `corral api` process) that loses and repeats nothing. Needs root and
//! Valkey; without them each test skips through `corral_testkit::skip`, which CI forbids.

mod common;

use std::time::{Duration, Instant};

use common::stack::{Stack, stdout};
use corral_api::client::{Events, SseEvent};
use serde_json::{Value, json};

fn python(actor: &str, conversation: &str, code: &str) -> Value {
    json!({ "actor": actor, "conversation": conversation, "member": actor, "language": "python",
            "code": code })
}

/// Every event of `events` to its end, each with when it arrived.
async fn drain(events: &mut Events) -> Vec<(Instant, SseEvent)> {
    let mut all = Vec::new();
    while let Some(event) = events.next().await.expect("the stream reads") {
        all.push((Instant::now(), event));
    }
    all
}

/// The concatenated text of `stream`'s `run.output` events.
fn text_of<'a>(events: impl IntoIterator<Item = &'a SseEvent>, stream: &str) -> String {
    events
        .into_iter()
        .filter(|e| e.name == "run.output" && e.data["stream"] == stream)
        .map(|e| e.data["text"].as_str().expect("text").to_owned())
        .collect()
}

/// The number in an event's id, after checking it is run `run_id`'s.
fn seq(run_id: &str, event: &SseEvent) -> u64 {
    let id = event.id.as_deref().expect("every event has an id");
    let (run, n) = id.rsplit_once('-').expect("<run>-<n>");
    assert_eq!(run, run_id, "{id}");
    n.parse().expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_run_sends_its_output_as_the_code_writes_it() {
    let test = "a_streamed_run_sends_its_output_as_the_code_writes_it";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let code = "import sys, time\n\
                print('first', flush=True)\n\
                print('careful', file=sys.stderr, flush=True)\n\
                time.sleep(1.5)\n\
                print('second')\n";
    let mut events = stack
        .caller
        .run_code_stream(&python("ann", "stream", code))
        .await
        .unwrap();
    let events = drain(&mut events).await;
    let (result_at, result) = events.last().expect("events");
    assert_eq!(result.name, "run.result", "{events:?}");
    let body = &result.data["body"];
    assert_eq!(result.data["status"], 200, "{body}");
    let run_id = body["run_id"].as_str().expect("run id");
    // Numbered from 1, in order, each once.
    let numbers: Vec<u64> = events.iter().map(|(_, e)| seq(run_id, e)).collect();
    assert_eq!(numbers, (1..=events.len() as u64).collect::<Vec<_>>());
    // The first chunk arrived while the code still slept: long before the answer.
    let (first_at, first) = events
        .iter()
        .find(|(_, e)| e.name == "run.output")
        .expect("an output event");
    assert_eq!(first.data, json!({ "stream": "stdout", "text": "first\n" }));
    let early = result_at.duration_since(*first_at);
    assert!(
        early >= Duration::from_millis(1_200),
        "{early:?}: {events:?}"
    );
    // The chunks add up to the answer's streams, byte for byte.
    let streamed: Vec<SseEvent> = events.iter().map(|(_, e)| e.clone()).collect();
    assert_eq!(text_of(&streamed, "stdout"), stdout(body));
    assert_eq!(stdout(body), "first\nsecond\n");
    assert_eq!(
        text_of(&streamed, "stderr"),
        body["model"]["stderr"]["text"].as_str().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumed_on_another_replica_loses_and_repeats_nothing() {
    let test = "a_stream_resumed_on_another_replica_loses_and_repeats_nothing";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let replica = stack.second_replica().await;
    let code = "import time\n\
                for i in range(8):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)\n";
    let mut first = stack
        .caller
        .run_code_stream(&python("bea", "resume", code))
        .await
        .unwrap();
    // Read up to the second output chunk, then drop the connection mid-run.
    let mut before = Vec::new();
    while before
        .iter()
        .filter(|e: &&SseEvent| e.name == "run.output")
        .count()
        < 2
    {
        before.push(first.next().await.unwrap().expect("the stream goes on"));
    }
    drop(first);
    let run_id = before[0].data["run_id"]
        .as_str()
        .expect("run id")
        .to_owned();
    let last = before.last().unwrap().id.clone().expect("an id");
    let mut rest = replica
        .caller
        .resume_events(&run_id, "bea", "resume", Some(&last))
        .await
        .unwrap()
        .expect("the other replica resumes the stream");
    let after: Vec<SseEvent> = drain(&mut rest).await.into_iter().map(|(_, e)| e).collect();
    let result = after.last().expect("the rest");
    assert_eq!(result.name, "run.result", "{after:?}");
    let body = &result.data["body"];
    // Nothing lost, nothing twice: the numbers go on from the last one read, and the text adds
    // up to the answer's.
    let numbers: Vec<u64> = before
        .iter()
        .chain(&after)
        .map(|e| seq(&run_id, e))
        .collect();
    assert_eq!(numbers, (1..=numbers.len() as u64).collect::<Vec<_>>());
    let whole = text_of(before.iter().chain(&after), "stdout");
    assert_eq!(whole, stdout(body));
    let expected: String = (0..8).map(|i| format!("line {i}\n")).collect();
    assert_eq!(whole, expected);
    // Without an id, the whole stream again, from either replica.
    let mut again = stack
        .caller
        .resume_events(&run_id, "bea", "resume", None)
        .await
        .unwrap()
        .expect("resumable from the start");
    let again: Vec<SseEvent> = drain(&mut again)
        .await
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    assert_eq!(again, before.into_iter().chain(after).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_with_an_unknown_foreign_future_or_malformed_id_is_refused_with_its_code() {
    let test = "a_resume_with_an_unknown_foreign_future_or_malformed_id_is_refused_with_its_code";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let mut ids = Vec::new();
    for n in 0..2 {
        let mut events = stack
            .caller
            .run_code_stream(&python("cal", "bad", &format!("print({n})")))
            .await
            .unwrap();
        let events: Vec<SseEvent> = drain(&mut events)
            .await
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        ids.push(
            events.last().unwrap().data["body"]["run_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let refused = |status: u16, code: &'static str| {
        move |answer: Result<Events, (u16, Value)>| match answer {
            Err((got, body)) => {
                assert_eq!(
                    (got, body["error"]["code"].as_str()),
                    (status, Some(code)),
                    "{body}"
                );
            }
            Ok(events) => panic!("not refused ({code}): status {}", events.status),
        }
    };
    let resume = |run: String, actor: &'static str, id: Option<String>| {
        let caller = stack.caller.clone();
        async move {
            caller
                .resume_events(&run, actor, "bad", id.as_deref())
                .await
                .unwrap()
        }
    };
    let run = ids[0].clone();
    refused(404, "run_events_unknown")(resume("0123abcd".repeat(4), "cal", None).await);
    // Another actor's run is as unknown as one that never was.
    refused(404, "run_events_unknown")(resume(run.clone(), "dan", None).await);
    refused(400, "last_event_id_foreign")(
        resume(run.clone(), "cal", Some(format!("{}-1", ids[1]))).await,
    );
    refused(400, "last_event_id_future")(
        resume(run.clone(), "cal", Some(format!("{run}-999"))).await,
    );
    for bad in ["", "1", "x y-1", &format!("{run}-0"), &format!("{run}-one")] {
        refused(400, "last_event_id_invalid")(
            resume(run.clone(), "cal", Some(bad.to_owned())).await,
        );
    }
    // From its first event: the rest, to the result.
    let mut none = resume(run.clone(), "cal", Some(format!("{run}-1")))
        .await
        .expect("resumable");
    let rest = drain(&mut none).await;
    assert!(rest.iter().any(|(_, e)| e.name == "run.result"), "{rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chunks_obey_the_output_bound_and_a_caller_that_stops_reading_loses_nothing() {
    let test =
        "streamed_chunks_obey_the_output_bound_and_a_caller_that_stops_reading_loses_nothing";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    // 5000 bytes against a 1000-byte bound: the chunks carry the kept 1000 and say so.
    let mut request = python("eve", "bound", "import sys\nsys.stdout.write('é' * 2500)\n");
    request["bounds"] = json!({ "output_bytes": 1000 });
    let mut events = stack.caller.run_code_stream(&request).await.unwrap();
    let events: Vec<SseEvent> = drain(&mut events)
        .await
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let body = &events.last().unwrap().data["body"];
    let out = &body["model"]["stdout"];
    assert_eq!(out["bytes_dropped"], 4000, "{body}");
    assert_eq!(text_of(&events, "stdout"), stdout(body));
    assert_eq!(text_of(&events, "stdout"), "é".repeat(500));
    let bounds: Vec<&Value> = events
        .iter()
        .filter(|e| e.name == "run.bound")
        .map(|e| &e.data)
        .collect();
    assert_eq!(
        bounds,
        [&json!({ "stream": "stdout", "bound": "SANDBOX_MAX_OUTPUT_BYTES" })]
    );
    // A caller that hangs up at once: the run still ends, saves its workspace, and its events
    // are all there for a resume.
    let mut gone = stack
        .caller
        .run_code_stream(&python(
            "eve",
            "gone",
            "import time\ntime.sleep(0.5)\nopen('kept.txt', 'w').write('saved')\nprint('end')\n",
        ))
        .await
        .unwrap();
    let queued = gone.next().await.unwrap().expect("queued");
    drop(gone);
    let run_id = queued.data["run_id"].as_str().unwrap().to_owned();
    let mut all = stack
        .caller
        .resume_events(&run_id, "eve", "gone", None)
        .await
        .unwrap()
        .expect("resumable");
    let all: Vec<SseEvent> = drain(&mut all).await.into_iter().map(|(_, e)| e).collect();
    let result = all.last().unwrap();
    assert_eq!(result.name, "run.result", "{all:?}");
    assert_eq!(result.data["body"]["outcome"], "succeeded", "{result:?}");
    assert_eq!(text_of(&all, "stdout"), "end\n");
    let (status, saved) = stack.read("eve", "gone", "kept.txt").await;
    assert_eq!((status, saved.as_slice()), (200, b"saved".as_slice()));
}
