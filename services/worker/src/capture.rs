//! Reading a jail's stdout and stderr: the stages' protocol lines first, then the code's output,
//! each stream capped, with reading bounded by the wall limit. A streamed run's output also goes
//! to its [`Tap`] as it is read: exactly the bytes the cap keeps, as whole characters.

use std::io::Write;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{ChildStderr, ChildStdin, ChildStdout};
use std::time::{Duration, Instant};

use corral_contract::limits::OUTPUT_READ_BYTES;
use corral_contract::messages::ExecuteFrame;
use corral_core::bounds::CappedOutput;
use corral_core::run::progress::{Stream as Which, TextChunker};
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use corral_stages::plan::{LINE_MAX_BYTES, LINES_MAX};

/// The size of one read (a streamed chunk at most).
const CHUNK_BYTES: usize = OUTPUT_READ_BYTES;

/// Where a streamed run's output frames go, in order, as they are read.
#[derive(Clone)]
pub struct Tap(pub std::sync::Arc<dyn Fn(ExecuteFrame) + Send + Sync>);

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tap")
    }
}

/// A tap and each stream's text so far: chunks of whole characters, and each stream's bound
/// told once.
pub struct Tapper {
    tap: Tap,
    text: [TextChunker; 2],
    bound_told: [bool; 2],
}

impl Tapper {
    /// Streams to `tap`.
    pub fn new(tap: Tap) -> Self {
        Self {
            tap,
            text: [TextChunker::default(), TextChunker::default()],
            bound_told: [false; 2],
        }
    }

    fn index(which: Which) -> usize {
        match which {
            Which::Stdout => 0,
            Which::Stderr => 1,
        }
    }

    /// `kept`, the bytes the cap kept of a read, then the bound if this read reached it.
    fn read(&mut self, which: Which, kept: &[u8], truncated: bool) {
        let index = Self::index(which);
        let text = self.text[index].push(kept);
        if !text.is_empty() {
            (self.tap.0)(ExecuteFrame::Output {
                stream: which,
                text,
            });
        }
        if truncated && !self.bound_told[index] {
            self.bound_told[index] = true;
            (self.tap.0)(ExecuteFrame::Bound { stream: which });
        }
    }

    /// The end of both streams: an incomplete last character is sent as the answer shows it.
    pub fn finish(&mut self) {
        for which in [Which::Stdout, Which::Stderr] {
            let text = self.text[Self::index(which)].finish();
            if !text.is_empty() {
                (self.tap.0)(ExecuteFrame::Output {
                    stream: which,
                    text,
                });
            }
        }
    }
}
/// Poll no longer than this at a time, so that the deadline is checked even if nothing happens.
const POLL_SLICE: Duration = Duration::from_millis(250);

fn nonblocking(fd: impl AsFd) -> std::io::Result<()> {
    let flags = fcntl(fd.as_fd(), FcntlArg::F_GETFL)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags))?;
    Ok(())
}

fn timeout_until(deadline: Instant) -> PollTimeout {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .min(POLL_SLICE);
    // At most POLL_SLICE, which fits.
    PollTimeout::try_from(left).unwrap_or(PollTimeout::ZERO)
}

/// Reads one protocol line from `stdout`, a byte at a time so that nothing after it is consumed.
/// `Ok(None)` at end of stream; an error past `deadline` or for an over-long line.
pub fn read_line(stdout: &mut ChildStdout, deadline: Instant) -> Result<Option<String>, String> {
    let mut line = Vec::new();
    loop {
        let mut byte = [0u8; 1];
        match stdout.read(&mut byte) {
            Ok(0) => {
                return Ok(if line.is_empty() {
                    None
                } else {
                    Some(String::from_utf8_lossy(&line).into_owned())
                });
            }
            Ok(_) if byte[0] == b'\n' => {
                return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
            }
            Ok(_) => {
                line.push(byte[0]);
                if line.len() > LINE_MAX_BYTES {
                    return Err("protocol line too long".to_owned());
                }
            }
            Err(error) if error.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err("the jail did not answer in time".to_owned());
                }
                let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, timeout_until(deadline));
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(format!("read the jail's stdout: {error}")),
        }
    }
}

/// Reads protocol lines until `G`, returning the lines before it (`W` and `E` lines), or the
/// lines read when the stream ended without `G`.
pub fn read_until_go(
    stdout: &mut ChildStdout,
    deadline: Instant,
) -> Result<(bool, Vec<String>), String> {
    let mut lines = Vec::new();
    for _ in 0..LINES_MAX {
        match read_line(stdout, deadline)? {
            None => return Ok((false, lines)),
            Some(line) if line == corral_stages::plan::LINE_GO => return Ok((true, lines)),
            Some(line) => lines.push(line),
        }
    }
    Err("too many protocol lines".to_owned())
}

/// What `stderr` holds now, at most `max_bytes` (for diagnosing a jail that failed to start).
pub fn read_available(stderr: &mut ChildStderr, max_bytes: usize, wait: Duration) -> String {
    let deadline = Instant::now() + wait;
    let mut kept = Vec::new();
    let mut buffer = [0u8; 1024];
    while kept.len() < max_bytes {
        match stderr.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => kept.extend_from_slice(&buffer[..read.min(max_bytes - kept.len())]),
            Err(error) if error.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                let mut fds = [PollFd::new(stderr.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, timeout_until(deadline));
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&kept).trim().to_owned()
}

/// Makes the jail's pipes non-blocking (before any protocol line is read).
pub fn prepare(stdout: &ChildStdout, stderr: &ChildStderr) -> Result<(), String> {
    nonblocking(stdout)
        .and_then(|()| nonblocking(stderr))
        .map_err(|e| format!("pipes: {e}"))
}

/// What the capture loop saw.
pub struct Captured {
    /// The code's stdout.
    pub stdout: CappedOutput,
    /// The code's stderr.
    pub stderr: CappedOutput,
    /// The deadline passed before the jail finished.
    pub deadline_hit: bool,
}

/// One stream being drained.
struct Stream<R> {
    which: Which,
    reader: Option<R>,
    output: CappedOutput,
}

impl<R: Read + AsFd> Stream<R> {
    /// Reads what is available; closes the stream at its end or on an error.
    fn drain(&mut self, buffer: &mut [u8], mut tap: Option<&mut Tapper>) {
        let Some(reader) = self.reader.as_mut() else {
            return;
        };
        loop {
            match reader.read(buffer) {
                Ok(0) => {
                    self.reader = None;
                    return;
                }
                Ok(read) => {
                    let before = self.output.kept().len();
                    self.output.accept(&buffer[..read]);
                    if let Some(tap) = tap.as_deref_mut() {
                        tap.read(
                            self.which,
                            &self.output.kept()[before..],
                            self.output.truncated(),
                        );
                    }
                }
                Err(error) if error.kind() == ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.reader = None;
                    return;
                }
            }
        }
    }
}

/// Captures the code's output until the jail has exited and both streams have ended, or until
/// `deadline`. `exited` (a pidfd of stage 1) becomes readable when stage 1 exits; without one, the
/// loop returns when both streams end. After the deadline it returns at once: the caller kills
/// the jail and calls [`drain_after_kill`]. What is kept also goes to `tap`, as it is read.
pub fn capture(
    stdout: ChildStdout,
    stderr: ChildStderr,
    exited: Option<&OwnedFd>,
    cap_bytes: u64,
    deadline: Instant,
    mut tap: Option<&mut Tapper>,
) -> (Captured, Streams) {
    let mut out = Stream {
        which: Which::Stdout,
        reader: Some(stdout),
        output: CappedOutput::new(cap_bytes),
    };
    let mut err = Stream {
        which: Which::Stderr,
        reader: Some(stderr),
        output: CappedOutput::new(cap_bytes),
    };
    let mut buffer = vec![0u8; CHUNK_BYTES];
    let mut stage1_done = exited.is_none();
    let mut deadline_hit = false;
    loop {
        let streams_done = out.reader.is_none() && err.reader.is_none();
        if streams_done && stage1_done {
            break;
        }
        if Instant::now() >= deadline {
            deadline_hit = true;
            break;
        }
        let mut fds = Vec::with_capacity(3);
        if let Some(reader) = out.reader.as_ref() {
            fds.push(PollFd::new(reader.as_fd(), PollFlags::POLLIN));
        }
        if let Some(reader) = err.reader.as_ref() {
            fds.push(PollFd::new(reader.as_fd(), PollFlags::POLLIN));
        }
        if let (Some(pidfd), false) = (exited, stage1_done) {
            fds.push(PollFd::new(pidfd.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, timeout_until(deadline));
        let pidfd_ready = exited.is_some()
            && !stage1_done
            && fds
                .last()
                .and_then(PollFd::revents)
                .is_some_and(|events| !events.is_empty());
        drop(fds);
        out.drain(&mut buffer, tap.as_deref_mut());
        err.drain(&mut buffer, tap.as_deref_mut());
        if pidfd_ready {
            // Stage 1 exits only after pid 1 of the jail, and the kernel has then killed and
            // reaped every process of the jail: no writer is left, so the pipes end shortly.
            stage1_done = true;
        }
    }
    (
        Captured {
            stdout: out.output,
            stderr: err.output,
            deadline_hit,
        },
        Streams {
            stdout: out.reader,
            stderr: err.reader,
        },
    )
}

/// The streams still open when the capture loop returned.
pub struct Streams {
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
}

/// After the kill: reads what the pipes still hold, for at most `grace`, then closes them.
pub fn drain_after_kill(
    streams: Streams,
    captured: &mut Captured,
    grace: Duration,
    mut tap: Option<&mut Tapper>,
) {
    let deadline = Instant::now() + grace;
    let mut out = Stream {
        which: Which::Stdout,
        reader: streams.stdout,
        output: std::mem::replace(&mut captured.stdout, CappedOutput::new(0)),
    };
    let mut err = Stream {
        which: Which::Stderr,
        reader: streams.stderr,
        output: std::mem::replace(&mut captured.stderr, CappedOutput::new(0)),
    };
    let mut buffer = vec![0u8; CHUNK_BYTES];
    while (out.reader.is_some() || err.reader.is_some()) && Instant::now() < deadline {
        let mut fds = Vec::with_capacity(2);
        if let Some(reader) = out.reader.as_ref() {
            fds.push(PollFd::new(reader.as_fd(), PollFlags::POLLIN));
        }
        if let Some(reader) = err.reader.as_ref() {
            fds.push(PollFd::new(reader.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, timeout_until(deadline));
        drop(fds);
        out.drain(&mut buffer, tap.as_deref_mut());
        err.drain(&mut buffer, tap.as_deref_mut());
    }
    captured.stdout = out.output;
    captured.stderr = err.output;
}

/// Writes `code` to a prepared jail's program pipe and closes it (the interpreter's end of
/// input), giving up at `deadline`: an interpreter that stops reading cannot hold the supervisor.
pub fn deliver(mut program: ChildStdin, code: &[u8], deadline: Instant) -> Result<(), String> {
    nonblocking(&program).map_err(|e| format!("pipe: {e}"))?;
    let mut rest = code;
    while !rest.is_empty() {
        match program.write(rest) {
            Ok(0) => return Err("the pipe closed".to_owned()),
            Ok(written) => rest = &rest[written..],
            Err(error) if error.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err("the interpreter did not read the code in time".to_owned());
                }
                let mut fds = [PollFd::new(program.as_fd(), PollFlags::POLLOUT)];
                let _ = poll(&mut fds, timeout_until(deadline));
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(error.to_string()),
        }
    }
    Ok(())
}
