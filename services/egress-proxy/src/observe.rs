//! One structured log line per decision (JSON on stderr) and a counter per outcome.
//!
//! Lines go through a bounded queue to one writer thread, so a slow stderr never stalls the
//! proxy; when the queue is full the line is dropped and counted. Counters are keyed by the
//! stable outcome code (`allow` or the refusal code) in an ordered map, and can be served as
//! text (`CORRAL_EGRESS_METRICS_LISTEN`). Tokens are never logged.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

use crate::json::JsonObject;

/// The most log lines queued for the writer.
pub const LOG_QUEUE_MAX: usize = 4096;
/// The longest client-supplied text (a request target) copied into a log line.
pub const LOGGED_TEXT_MAX_BYTES: usize = 512;

/// Counters and the log queue, shared by every connection.
#[derive(Debug)]
pub struct Observer {
    counts: Mutex<BTreeMap<&'static str, u64>>,
    active: AtomicU64,
    dropped_lines: AtomicU64,
    sink: Option<SyncSender<LogMessage>>,
}

/// What the writer thread receives.
enum LogMessage {
    /// One line to write.
    Line(String),
    /// Everything before this is written: acknowledge.
    Flush(std::sync::mpsc::Sender<()>),
}

/// How long [`Observer::flush`] waits for the writer.
pub const LOG_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Where log lines go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogSink {
    /// The process's stderr, through a writer thread.
    Stderr,
    /// Nowhere (counters only), for tests and benchmarks that do not read logs.
    Discard,
}

impl Observer {
    /// An observer writing to `sink`.
    #[must_use]
    pub fn new(sink: LogSink) -> Arc<Observer> {
        let sender = match sink {
            LogSink::Discard => None,
            LogSink::Stderr => {
                let (sender, receiver) = sync_channel::<LogMessage>(LOG_QUEUE_MAX);
                let spawned = std::thread::Builder::new()
                    .name("egress-log".into())
                    .spawn(move || write_lines(&receiver));
                spawned.ok().map(|_| sender)
            }
        };
        Arc::new(Observer {
            counts: Mutex::new(BTreeMap::new()),
            active: AtomicU64::new(0),
            dropped_lines: AtomicU64::new(0),
            sink: sender,
        })
    }

    /// Counts one outcome and queues its log line.
    pub fn decision(&self, outcome_code: &'static str, line: JsonObject) {
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry(outcome_code).or_insert(0) += 1;
        }
        self.line(line);
    }

    /// Queues a log line that is not a decision (start-up, a closed tunnel).
    pub fn line(&self, line: JsonObject) {
        let Some(sink) = &self.sink else {
            return;
        };
        match sink.try_send(LogMessage::Line(line.finish())) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped_lines.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits (at most [`LOG_FLUSH_WAIT`]) until every queued line is written, before exit.
    pub fn flush(&self) {
        let Some(sink) = &self.sink else {
            return;
        };
        let (ack, acked) = std::sync::mpsc::channel();
        if sink.send(LogMessage::Flush(ack)).is_ok() {
            let _ = acked.recv_timeout(LOG_FLUSH_WAIT);
        }
    }

    /// The count for one outcome code.
    #[must_use]
    pub fn count(&self, outcome_code: &str) -> u64 {
        self.counts
            .lock()
            .map(|counts| counts.get(outcome_code).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// A client connection started; the guard ends it.
    #[must_use]
    pub fn connection(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard {
            observer: Arc::clone(self),
        }
    }

    /// The counters in the Prometheus text format.
    #[must_use]
    pub fn render_metrics(&self) -> String {
        let mut out = String::from("# TYPE corral_egress_decisions_total counter\n");
        if let Ok(counts) = self.counts.lock() {
            for (code, count) in counts.iter() {
                out.push_str(&format!(
                    "corral_egress_decisions_total{{outcome=\"{code}\"}} {count}\n"
                ));
            }
        }
        out.push_str(&format!(
            "# TYPE corral_egress_connections_active gauge\ncorral_egress_connections_active {}\n\
             # TYPE corral_egress_log_lines_dropped_total counter\ncorral_egress_log_lines_dropped_total {}\n",
            self.active.load(Ordering::Relaxed),
            self.dropped_lines.load(Ordering::Relaxed)
        ));
        out
    }
}

/// Counts one active connection while alive.
#[derive(Debug)]
pub struct ActiveGuard {
    observer: Arc<Observer>,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.observer.active.fetch_sub(1, Ordering::Relaxed);
    }
}

fn write_lines(receiver: &Receiver<LogMessage>) {
    while let Ok(message) = receiver.recv() {
        match message {
            LogMessage::Line(line) => {
                let mut stderr = std::io::stderr().lock();
                let _ = stderr.write_all(line.as_bytes());
                let _ = stderr.write_all(b"\n");
            }
            LogMessage::Flush(ack) => {
                let _ = ack.send(());
            }
        }
    }
}

/// Client-supplied text cut to [`LOGGED_TEXT_MAX_BYTES`] on a character boundary.
#[must_use]
pub fn bounded_text(text: &str) -> &str {
    if text.len() <= LOGGED_TEXT_MAX_BYTES {
        return text;
    }
    let mut end = LOGGED_TEXT_MAX_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Milliseconds since the Unix epoch on this host's clock, for log lines and grant checks.
#[must_use]
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_renders() {
        let o = Observer::new(LogSink::Discard);
        o.decision("allow", JsonObject::new());
        o.decision("allow", JsonObject::new());
        o.decision("grant_missing", JsonObject::new());
        assert_eq!(o.count("allow"), 2);
        let guard = o.connection();
        let text = o.render_metrics();
        assert!(text.contains("corral_egress_decisions_total{outcome=\"allow\"} 2"));
        assert!(text.contains("corral_egress_decisions_total{outcome=\"grant_missing\"} 1"));
        assert!(text.contains("corral_egress_connections_active 1"));
        drop(guard);
        assert!(
            o.render_metrics()
                .contains("corral_egress_connections_active 0")
        );
    }

    #[test]
    fn bounded_text_cuts_on_a_boundary() {
        let long = "é".repeat(400);
        let cut = bounded_text(&long);
        assert!(cut.len() <= LOGGED_TEXT_MAX_BYTES);
        assert!(long.starts_with(cut));
    }
}
