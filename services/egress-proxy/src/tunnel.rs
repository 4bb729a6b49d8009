//! Moving bytes once a connection is allowed: the CONNECT tunnel and the plain-HTTP relay, both
//! closed after the idle timeout with no byte either way.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rustix::fd::OwnedFd;
use rustix::net::{Shutdown, shutdown};
use rustix::pipe::{PipeFlags, SpliceFlags, fcntl_setpipe_size, pipe_with, splice};
use tokio::io::Interest;
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufReader,
    ReadBuf,
};
use tokio::net::TcpStream;

use crate::http::BodyFraming;

/// The copy buffer per direction: large enough that a bulk transfer is not syscall-bound.
pub const COPY_BUFFER_BYTES: usize = 64 * 1024;
/// The longest chunk-size or trailer line of a chunked request body.
pub const CHUNK_LINE_MAX_BYTES: usize = 4096;
/// The most trailer fields after the last chunk.
pub const CHUNK_TRAILERS_MAX: usize = 64;

/// How a tunnel or relay ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Both sides finished (or the upstream finished its response).
    Closed,
    /// No byte moved for the idle timeout.
    Idle,
    /// A socket failed, or the request body was malformed.
    Error,
}

impl End {
    /// A stable code for logs.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::Idle => "idle_timeout",
            End::Error => "error",
        }
    }
}

/// What moved through a tunnel or relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moved {
    /// Bytes from the client to the upstream (not counting the request head).
    pub up_bytes: u64,
    /// Bytes from the upstream to the client.
    pub down_bytes: u64,
    /// How it ended.
    pub end: End,
}

/// The time of the last byte read on either side.
struct Activity {
    origin: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once no byte has been read for `idle`.
    async fn idle(&self, idle: Duration) {
        loop {
            let last = self.last_ms.load(Ordering::Relaxed);
            let deadline = self.origin + Duration::from_millis(last) + idle;
            tokio::time::sleep_until(deadline.into()).await;
            if self.last_ms.load(Ordering::Relaxed) == last {
                return;
            }
        }
    }
}

/// A stream that records activity and counts the bytes read from it.
struct Tracked<'a, S> {
    inner: S,
    activity: &'a Activity,
    read_bytes: u64,
}

impl<'a, S> Tracked<'a, S> {
    fn new(inner: S, activity: &'a Activity) -> Self {
        Tracked {
            inner,
            activity,
            read_bytes: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        if read > 0 {
            self.read_bytes += read as u64;
            self.activity.touch();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Tunnels bytes both ways until both sides finish, one fails, or nothing moves for `idle`:
/// zero-copy through a kernel pipe per direction (splice(2)), or by copying through
/// user-space buffers when a pipe cannot be had.
pub async fn tunnel(client: &mut TcpStream, upstream: &mut TcpStream, idle: Duration) -> Moved {
    match (new_pipe(), new_pipe()) {
        (Ok(up), Ok(down)) => splice_tunnel(client, upstream, &up, &down, idle).await,
        (Err(_), _) | (_, Err(_)) => copy_tunnel(client, upstream, idle).await,
    }
}

/// The capacity a tunnel's pipe grows to once its direction has carried
/// [`PIPE_GROW_AFTER_BYTES`]: a larger pipe moves a bulk transfer in fewer, larger splices
/// (about a third less of the proxy's CPU per byte than 256 KiB, issue 29). A pipe starts at
/// the kernel's default (64 KiB) and grows only then, because every pipe's capacity counts
/// against its user's pipe allowance (`fs.pipe-user-pages-soft`) from creation: an unprivileged
/// proxy with many idle tunnels would otherwise reach it and get two-page pipes for every new
/// tunnel. The kernel may refuse the growth (that allowance, `fs.pipe-max-size`); the pipe then
/// keeps its size.
pub const PIPE_BYTES: usize = 1024 * 1024;
/// What one direction of a tunnel moves before its pipe grows to [`PIPE_BYTES`].
pub const PIPE_GROW_AFTER_BYTES: u64 = 256 * 1024;

/// A non-blocking pipe: (read end, write end).
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

fn new_pipe() -> io::Result<Pipe> {
    let (read, write) = pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC)?;
    Ok(Pipe { read, write })
}

impl Pipe {
    /// Grows the pipe to [`PIPE_BYTES`], returning its capacity; a refusal leaves it as it was.
    fn grow(&self) -> io::Result<usize> {
        Ok(fcntl_setpipe_size(&self.write, PIPE_BYTES)?)
    }
}

/// Tunnels with splice(2): socket to pipe to socket in each direction, never through user space.
async fn splice_tunnel(
    client: &TcpStream,
    upstream: &TcpStream,
    up: &Pipe,
    down: &Pipe,
    idle: Duration,
) -> Moved {
    let activity = Activity::new();
    let (up_bytes, down_bytes) = (AtomicU64::new(0), AtomicU64::new(0));
    let both = async {
        tokio::try_join!(
            pump(client, upstream, up, &activity, &up_bytes),
            pump(upstream, client, down, &activity, &down_bytes)
        )
    };
    let end = tokio::select! {
        biased;
        result = both => if result.is_ok() { End::Closed } else { End::Error },
        () = activity.idle(idle) => End::Idle,
    };
    Moved {
        up_bytes: up_bytes.into_inner(),
        down_bytes: down_bytes.into_inner(),
        end,
    }
}

/// Moves one direction until `src` ends, then half-closes `dst`, counting into `moved`.
async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    pipe: &Pipe,
    activity: &Activity,
    moved: &AtomicU64,
) -> io::Result<()> {
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    let mut grown = false;
    loop {
        if !grown && moved.load(Ordering::Relaxed) >= PIPE_GROW_AFTER_BYTES {
            grown = true;
            let _ = pipe.grow();
        }
        let filled = loop {
            src.readable().await?;
            let result = src.try_io(Interest::READABLE, || {
                Ok(splice(src, None, &pipe.write, None, PIPE_BYTES, flags)?)
            });
            match result {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if filled == 0 {
            let _ = shutdown(dst, Shutdown::Write);
            return Ok(());
        }
        activity.touch();
        let mut left = filled;
        while left > 0 {
            dst.writable().await?;
            let result = dst.try_io(Interest::WRITABLE, || {
                Ok(splice(&pipe.read, None, dst, None, left, flags)?)
            });
            match result {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    left -= n;
                    moved.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Tunnels by copying through user-space buffers (the fallback).
async fn copy_tunnel(client: &mut TcpStream, upstream: &mut TcpStream, idle: Duration) -> Moved {
    let activity = Activity::new();
    let mut client = Tracked::new(client, &activity);
    let mut upstream = Tracked::new(upstream, &activity);
    let end = tokio::select! {
        biased;
        result = tokio::io::copy_bidirectional_with_sizes(
            &mut client,
            &mut upstream,
            COPY_BUFFER_BYTES,
            COPY_BUFFER_BYTES,
        ) => if result.is_ok() { End::Closed } else { End::Error },
        () = activity.idle(idle) => End::Idle,
    };
    Moved {
        up_bytes: client.read_bytes,
        down_bytes: upstream.read_bytes,
        end,
    }
}

/// Relays one plain-HTTP request whose head was already sent upstream: forwards exactly the
/// body `framing` describes (starting with `leftover`, the bytes read past the head), and the
/// upstream's response until it closes. Nothing after the body is read from the client, so a
/// pipelined second request never reaches the upstream unjudged.
pub async fn relay_http(
    client: &mut TcpStream,
    leftover: &[u8],
    upstream: &mut TcpStream,
    framing: BodyFraming,
    idle: Duration,
) -> Moved {
    let activity = Activity::new();
    let (client_read, mut client_write) = client.split();
    let (upstream_read, mut upstream_write) = upstream.split();
    let mut client_read = Tracked::new(client_read, &activity);
    let mut upstream_read = Tracked::new(upstream_read, &activity);
    let end = {
        let mut body_source = leftover.chain(&mut client_read);
        let body = forward_body(&mut body_source, &mut upstream_write, framing);
        let mut response_source = BufReader::with_capacity(COPY_BUFFER_BYTES, &mut upstream_read);
        let response = tokio::io::copy_buf(&mut response_source, &mut client_write);
        tokio::pin!(body, response);
        let mut body_done = false;
        loop {
            tokio::select! {
                biased;
                result = &mut response => break if result.is_ok() { End::Closed } else { End::Error },
                result = &mut body, if !body_done => {
                    body_done = true;
                    if result.is_err() {
                        break End::Error;
                    }
                }
                () = activity.idle(idle) => break End::Idle,
            }
        }
    };
    let _ = client_write.shutdown().await;
    Moved {
        up_bytes: client_read.read_bytes,
        down_bytes: upstream_read.read_bytes,
        end,
    }
}

fn framing_error(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// Forwards exactly one body of the given framing.
async fn forward_body<R, W>(source: &mut R, sink: &mut W, framing: BodyFraming) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match framing {
        BodyFraming::None => Ok(()),
        BodyFraming::Length(length) => {
            let copied = tokio::io::copy(&mut source.take(length), sink).await?;
            if copied == length {
                Ok(())
            } else {
                Err(framing_error("request body ended early"))
            }
        }
        BodyFraming::Chunked => forward_chunked(&mut BufReader::new(source), sink).await,
    }
}

/// Reads one line of at most [`CHUNK_LINE_MAX_BYTES`], ending in LF.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(source: &mut R) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    (&mut *source)
        .take(CHUNK_LINE_MAX_BYTES as u64)
        .read_until(b'\n', &mut line)
        .await?;
    if line.last() != Some(&b'\n') {
        return Err(framing_error("chunk line too long or body ended early"));
    }
    Ok(line)
}

/// Forwards a chunked body as sent, checking its framing so that exactly one body is forwarded.
async fn forward_chunked<R, W>(source: &mut R, sink: &mut W) -> io::Result<()>
where
    R: tokio::io::AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let line = read_line(source).await?;
        let size_text = line
            .split(|b| *b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        let size_ok = !size_text.is_empty()
            && size_text.len() <= 15
            && size_text.iter().all(u8::is_ascii_hexdigit);
        if !size_ok {
            return Err(framing_error("bad chunk size"));
        }
        let size = u64::from_str_radix(&String::from_utf8_lossy(size_text), 16)
            .map_err(|_| framing_error("bad chunk size"))?;
        sink.write_all(&line).await?;
        if size == 0 {
            for _ in 0..=CHUNK_TRAILERS_MAX {
                let trailer = read_line(source).await?;
                sink.write_all(&trailer).await?;
                if trailer == b"\r\n" || trailer == b"\n" {
                    return Ok(());
                }
            }
            return Err(framing_error("too many trailer fields"));
        }
        let copied = tokio::io::copy(&mut (&mut *source).take(size), sink).await?;
        if copied != size {
            return Err(framing_error("chunk ended early"));
        }
        let end = read_line(source).await?;
        if end != b"\r\n" && end != b"\n" {
            return Err(framing_error("chunk not followed by CRLF"));
        }
        sink.write_all(&end).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn chunked(input: &[u8]) -> io::Result<Vec<u8>> {
        let mut source = BufReader::new(input);
        let mut out = Vec::new();
        forward_chunked(&mut source, &mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn chunked_bodies_are_forwarded_exactly_once() {
        let body = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-T: 1\r\n\r\n";
        let mut input = body.to_vec();
        input.extend_from_slice(b"GET http://pipelined/ HTTP/1.1\r\n\r\n");
        assert_eq!(chunked(&input).await.unwrap(), body.to_vec());
        for bad in [
            &b"x\r\n"[..],
            b"4\r\nWik",
            b"4\r\nWikiX\r\n0\r\n\r\n",
            b"-1\r\n",
            b"ffffffffffffffff\r\n",
        ] {
            assert!(
                chunked(bad).await.is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (far, _) = listener.accept().await.unwrap();
        (near, far)
    }

    /// Runs `tunnel_fn` between two pairs and checks bytes both ways, half-close and counts.
    async fn moves_both_ways_and_half_closes(splice: bool) {
        let (mut client, mut client_side) = pair().await;
        let (mut upstream_side, mut upstream) = pair().await;
        let idle = Duration::from_secs(5);
        let running = tokio::spawn(async move {
            if splice {
                let (up, down) = (new_pipe().unwrap(), new_pipe().unwrap());
                splice_tunnel(&client_side, &upstream_side, &up, &down, idle).await
            } else {
                copy_tunnel(&mut client_side, &mut upstream_side, idle).await
            }
        });
        let big = vec![7u8; 3 * 1024 * 1024];
        client.write_all(b"ping").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ping");
        upstream.write_all(&big).await.unwrap();
        upstream.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back.len(), big.len());
        let moved = running.await.unwrap();
        assert_eq!(moved.end, End::Closed);
        assert_eq!((moved.up_bytes, moved.down_bytes), (4, big.len() as u64));
    }

    #[tokio::test]
    async fn splice_tunnel_moves_both_ways_and_half_closes() {
        moves_both_ways_and_half_closes(true).await;
    }

    #[tokio::test]
    async fn copy_tunnel_moves_both_ways_and_half_closes() {
        moves_both_ways_and_half_closes(false).await;
    }

    #[test]
    fn a_pipe_starts_at_the_default_size_and_grows_to_the_bulk_size() {
        let pipe = new_pipe().unwrap();
        let start = rustix::pipe::fcntl_getpipe_size(&pipe.write).unwrap();
        assert!(start < PIPE_BYTES, "a new pipe holds {start} bytes");
        assert_eq!(pipe.grow().unwrap(), PIPE_BYTES);
        assert_eq!(
            rustix::pipe::fcntl_getpipe_size(&pipe.write).unwrap(),
            PIPE_BYTES
        );
    }

    #[tokio::test]
    async fn idle_tunnels_are_closed() {
        let (_client, client_side) = pair().await;
        let (upstream_side, _upstream) = pair().await;
        let (up, down) = (new_pipe().unwrap(), new_pipe().unwrap());
        let started = std::time::Instant::now();
        let moved = splice_tunnel(
            &client_side,
            &upstream_side,
            &up,
            &down,
            Duration::from_millis(200),
        )
        .await;
        assert_eq!(moved.end, End::Idle);
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    #[tokio::test]
    async fn length_bodies_stop_at_their_length() {
        let mut out = Vec::new();
        let mut source: &[u8] = b"helloGET /next";
        forward_body(&mut source, &mut out, BodyFraming::Length(5))
            .await
            .unwrap();
        assert_eq!(out, b"hello");
        let mut short: &[u8] = b"hel";
        assert!(
            forward_body(&mut short, &mut Vec::new(), BodyFraming::Length(5))
                .await
                .is_err()
        );
    }
}
