//! One structured log line per decision (JSON on stderr) and a counter per outcome.
//!
//! Lines are queued (bounded) and written in batches by one writer thread every
//! [`LOG_BATCH_INTERVAL`], so a connection never waits on stderr and never wakes another thread
//! per line; when the queue is full the line is dropped and counted. Counters are keyed by the
//! stable outcome code (`allow` or the refusal code) in an ordered map, and can be served as
//! text (`CORRAL_EGRESS_METRICS_LISTEN`). Tokens are never logged.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::json::JsonObject;

/// The most log lines queued for the writer.
pub const LOG_QUEUE_MAX: usize = 4096;
/// How often the writer thread writes the queued lines.
pub const LOG_BATCH_INTERVAL: Duration = Duration::from_millis(20);
/// The longest client-supplied text (a request target) copied into a log line.
pub const LOGGED_TEXT_MAX_BYTES: usize = 512;

/// Counters and the log queue, shared by every connection.
#[derive(Debug)]
pub struct Observer {
    counts: Mutex<BTreeMap<&'static str, u64>>,
    active: AtomicU64,
    dropped_lines: AtomicU64,
    queue: Option<LogQueue>,
}

/// Lines waiting for the writer; `writing` keeps batches in order between the writer thread
/// and [`Observer::flush`].
#[derive(Debug, Default)]
struct LogQueue {
    lines: Mutex<Vec<String>>,
    writing: Mutex<()>,
}

impl LogQueue {
    /// Writes every queued line to stderr, in order, in one write.
    fn write_batch(&self) {
        let Ok(_writing) = self.writing.lock() else {
            return;
        };
        let lines = match self.lines.lock() {
            Ok(mut lines) => std::mem::take(&mut *lines),
            Err(_) => return,
        };
        if lines.is_empty() {
            return;
        }
        let mut batch = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for line in lines {
            batch.push_str(&line);
            batch.push('\n');
        }
        let _ = std::io::stderr().lock().write_all(batch.as_bytes());
    }
}

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
        let observer = Arc::new(Observer {
            counts: Mutex::new(BTreeMap::new()),
            active: AtomicU64::new(0),
            dropped_lines: AtomicU64::new(0),
            queue: match sink {
                LogSink::Discard => None,
                LogSink::Stderr => Some(LogQueue::default()),
            },
        });
        if observer.queue.is_some() {
            // The writer holds only a weak reference: it ends when the observer is dropped.
            let weak = Arc::downgrade(&observer);
            let _ = std::thread::Builder::new()
                .name("egress-log".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(LOG_BATCH_INTERVAL);
                        let Some(observer) = weak.upgrade() else {
                            return;
                        };
                        if let Some(queue) = &observer.queue {
                            queue.write_batch();
                        }
                    }
                });
        }
        observer
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
        let Some(queue) = &self.queue else {
            return;
        };
        let queued = queue.lines.lock().is_ok_and(|mut lines| {
            if lines.len() >= LOG_QUEUE_MAX {
                return false;
            }
            lines.push(line.finish());
            true
        });
        if !queued {
            self.dropped_lines.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes every queued line now, before exit.
    pub fn flush(&self) {
        if let Some(queue) = &self.queue {
            queue.write_batch();
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
