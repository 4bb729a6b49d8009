//! A run's progress as a server-sent event stream (WS-7): what `POST /v1/run_code` sends, with
//! `Accept: text/event-stream`, beside the plain JSON answer. The event names are contracts.
//!
//! `run.queued` once the request is admitted (it waits for a worker), `run.running` once its code
//! is dispatched, `run.output` for the code's stdout and stderr as it writes them, `run.bound`
//! once a stream reaches the output bound, then exactly one `run.result` whose data is
//! `{status, body}`: the HTTP status and the JSON answer the plain request would have had. The
//! first two list the run's declared outputs as transient progress, never downloadable: a
//! declaration grants nothing, and only the answer's validated references replace them.
//!
//! The chunks are the bytes the answer keeps, in order, as text ([`TextChunker`]): the
//! concatenation of a stream's `run.output` texts is the answer's `stdout.text` (or `stderr`),
//! byte for byte, and what the bound dropped is never sent, only counted in the answer.
//!
//! Every event is numbered: its id is `<run id>-<n>` ([`event_id`]), from 1 in order. The events
//! are kept deployment-wide for [`EVENTS_KEEP_SECONDS`] after the last one, so that a caller that
//! lost its connection resumes from any replica with `Last-Event-ID` ([`resume_after`]) and gets
//! the rest, nothing twice.

use serde::{Deserialize, Serialize};

/// The request was admitted and waits for a worker.
pub const QUEUED: &str = "run.queued";
/// The code was dispatched to a leased worker.
pub const RUNNING: &str = "run.running";
/// A chunk of the code's output: `{stream, text}`.
pub const OUTPUT: &str = "run.output";
/// A stream reached the output bound (`{stream, bound}`): what follows is counted, not kept.
pub const BOUND: &str = "run.bound";
/// The run's answer: `{status, body}`; the last event.
pub const RESULT: &str = "run.result";

/// How long a run's events stay readable after its last one, for a resumed stream.
pub const EVENTS_KEEP_SECONDS: u64 = 600;

/// How long a run's events are kept after each one: [`EVENTS_KEEP_SECONDS`] past the longest a
/// run can still take (its wait for a worker and its wall bound), so that a silent run's events
/// do not expire before its answer.
#[must_use]
pub fn keep_seconds(max_wall_seconds: u64, acquire_wait_ms: u64) -> u64 {
    EVENTS_KEEP_SECONDS
        .saturating_add(max_wall_seconds)
        .saturating_add(acquire_wait_ms.div_ceil(1_000))
}

/// How many events a resumed stream reads at once.
pub const RESUME_BATCH: u64 = 256;

/// The shortest time between two `run.output` events of one run: chunks that arrive sooner are
/// sent together, which bounds the number of events a run can make (the first chunk goes at
/// once).
pub const OUTPUT_EVENT_INTERVAL_MS: u64 = 25;

/// How often a resumed stream looks for a running run's next events.
pub const FOLLOW_POLL_MS: u64 = 50;

/// Which of the code's streams a chunk is from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Bytes of a stream turned into text as they arrive, each chunk only whole characters: an
/// incomplete character at a chunk's end waits for the next. Every chunk's text and then
/// [`TextChunker::finish`] concatenate to `String::from_utf8_lossy` of all the bytes, exactly,
/// so a streamed run's chunks add up to its answer's text.
#[derive(Clone, Debug, Default)]
pub struct TextChunker {
    held: Vec<u8>,
}

impl TextChunker {
    /// The text of `bytes` (after what was held back), up to an incomplete last character.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.held.extend_from_slice(bytes);
        let mut text = String::new();
        let mut rest: &[u8] = &self.held;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(error) => {
                    let (valid, after) = rest.split_at(error.valid_up_to());
                    text.push_str(&String::from_utf8_lossy(valid));
                    match error.error_len() {
                        // One replacement per invalid sequence, as `from_utf8_lossy` gives.
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[invalid..];
                        }
                        // An incomplete character at the end: the next bytes may complete it.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.held = rest.to_vec();
        text
    }

    /// What is still held back (an incomplete character at the end of the stream).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.held).into_owned();
        self.held.clear();
        text
    }
}

/// The id of run `run_id`'s `seq`th event (from 1).
#[must_use]
pub fn event_id(run_id: &str, seq: u64) -> String {
    format!("{run_id}-{seq}")
}

/// Why a stream cannot resume from a `Last-Event-ID`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeRefused {
    /// Not an event id.
    Invalid,
    /// Another run's event.
    Foreign,
    /// An event this run has not had.
    Future,
}

impl ResumeRefused {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Invalid => "last_event_id_invalid",
            Self::Foreign => "last_event_id_foreign",
            Self::Future => "last_event_id_future",
        }
    }
}

/// The number of the last event the caller has, from its `Last-Event-ID` (none: 0, from the
/// start), for run `run_id` that has had `published` events so far.
///
/// # Errors
/// [`ResumeRefused`]: an id that is not `<run id>-<n>` with `n` from 1, another run's, or one
/// past `published`.
pub fn resume_after(
    run_id: &str,
    last_event_id: Option<&str>,
    published: u64,
) -> Result<u64, ResumeRefused> {
    let Some(id) = last_event_id else {
        return Ok(0);
    };
    let (run, digits) = id.trim().rsplit_once('-').ok_or(ResumeRefused::Invalid)?;
    if digits.starts_with(['+', '0']) {
        return Err(ResumeRefused::Invalid);
    }
    let seq: u64 = digits.parse().map_err(|_| ResumeRefused::Invalid)?;
    if run.is_empty() || !run.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ResumeRefused::Invalid);
    }
    if run != run_id {
        return Err(ResumeRefused::Foreign);
    }
    if seq > published {
        return Err(ResumeRefused::Future);
    }
    Ok(seq)
}

/// The state of a declared output while the run runs.
pub const DECLARED_STATE: &str = "in_progress";

/// A declared output as progress: its name, that it is in progress, and that it cannot be
/// downloaded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pending {
    /// The declared relative path.
    pub path: String,
    /// [`DECLARED_STATE`].
    pub state: &'static str,
    /// Always false: progress is not an attachment.
    pub downloadable: bool,
}

/// The declared outputs as progress.
#[must_use]
pub fn pending(declared: &[String]) -> Vec<Pending> {
    declared
        .iter()
        .map(|path| Pending {
            path: path.clone(),
            state: DECLARED_STATE,
            downloadable: false,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chunked(bytes: &[u8], cuts: &[usize]) -> String {
        let mut chunker = TextChunker::default();
        let mut text = String::new();
        let mut from = 0;
        for &cut in cuts {
            let cut = cut.min(bytes.len()).max(from);
            text.push_str(&chunker.push(&bytes[from..cut]));
            from = cut;
        }
        text.push_str(&chunker.push(&bytes[from..]));
        text + &chunker.finish()
    }

    #[test]
    fn a_character_split_across_chunks_is_sent_whole() {
        let bytes = "é€😀".as_bytes();
        let mut chunker = TextChunker::default();
        assert_eq!(chunker.push(&bytes[..1]), "");
        assert_eq!(chunker.push(&bytes[1..4]), "é");
        assert_eq!(chunker.push(&bytes[4..]), "€😀");
        assert_eq!(chunker.finish(), "");
    }

    #[test]
    fn invalid_bytes_and_a_truncated_end_are_replaced_as_the_answer_replaces_them() {
        let bytes = b"a\xffb\xe2\x82";
        assert_eq!(chunked(bytes, &[1, 2, 4]), String::from_utf8_lossy(bytes));
    }

    proptest! {
        #[test]
        fn the_chunks_add_up_to_the_answers_text(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            mut cuts in proptest::collection::vec(0usize..64, 0..8),
            utf8 in ".{0,16}",
        ) {
            cuts.sort_unstable();
            let mut all = utf8.into_bytes();
            all.extend_from_slice(&bytes);
            prop_assert_eq!(chunked(&all, &cuts), String::from_utf8_lossy(&all));
        }
    }

    #[test]
    fn a_stream_resumes_after_the_callers_last_event_of_this_run() {
        assert_eq!(resume_after("ab12", None, 0), Ok(0));
        assert_eq!(resume_after("ab12", Some(&event_id("ab12", 3)), 5), Ok(3));
        assert_eq!(resume_after("ab12", Some("ab12-5"), 5), Ok(5));
    }

    #[test]
    fn an_unknown_foreign_or_future_event_id_is_refused_with_its_code() {
        for bad in [
            "", "ab12", "ab12-", "ab12-0", "ab12-01", "ab12-+1", "-3", "ab 12-1", "ab12-x",
        ] {
            assert_eq!(
                resume_after("ab12", Some(bad), 5),
                Err(ResumeRefused::Invalid),
                "{bad:?}"
            );
        }
        assert_eq!(
            resume_after("ab12", Some("cd34-1"), 5).map_err(ResumeRefused::code),
            Err("last_event_id_foreign")
        );
        assert_eq!(
            resume_after("ab12", Some("ab12-6"), 5).map_err(ResumeRefused::code),
            Err("last_event_id_future")
        );
    }
}
