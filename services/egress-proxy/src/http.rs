//! The HTTP/1.x the proxy reads and writes: a bounded request head, refusals, and the head it
//! forwards for plain-HTTP requests.
//!
//! Reading is strict where framing is at stake (request line of exactly three parts, header
//! names of token characters, no obsolete line folding, no bare CR, no NUL) and lenient where
//! the core judges anyway: the request target and header values are handed to the core as text
//! (bytes that are not UTF-8 become U+FFFD, which the core refuses as non-ASCII).

use corral_core::egress::reason::REASON_HEADER;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::refusal::{Refusal, ShellReason, status_text};

/// The most header fields a request head may hold.
pub const HEADER_FIELDS_MAX: usize = 128;
/// How much is read from the socket at a time while looking for the end of the head.
const READ_CHUNK_BYTES: usize = 8 * 1024;

/// A parsed request head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// The method, as sent (token characters).
    pub method: String,
    /// The request target, as sent.
    pub target: String,
    /// `HTTP/1.0` or `HTTP/1.1`.
    pub version: &'static str,
    /// Header fields in order: name as sent, value without surrounding spaces.
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    /// Every value of the header `name` (case-insensitive), in order.
    #[must_use]
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// Why no request head was read.
#[derive(Debug, PartialEq, Eq)]
pub enum HeadError {
    /// The client closed or failed before sending anything.
    Closed,
    /// The head exceeds the bound.
    TooLarge,
    /// The head is not HTTP/1.x as this proxy reads it (or ended early).
    Malformed,
}

/// Reads one request head of at most `max_bytes`; returns it and the bytes read past its end.
pub async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    max_bytes: usize,
) -> Result<(RequestHead, Vec<u8>), HeadError> {
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES.min(max_bytes));
    let mut chunk = [0u8; READ_CHUNK_BYTES];
    loop {
        let searched_from = buf.len().saturating_sub(3);
        let room = max_bytes.saturating_sub(buf.len()).min(READ_CHUNK_BYTES);
        if room == 0 {
            return Err(HeadError::TooLarge);
        }
        let n = match stream.read(&mut chunk[..room]).await {
            Ok(0) | Err(_) if buf.is_empty() => return Err(HeadError::Closed),
            Ok(0) | Err(_) => return Err(HeadError::Malformed),
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_head_end(&buf, searched_from) {
            let head = parse_head(&buf[..end])?;
            return Ok((head, buf[end..].to_vec()));
        }
    }
}

/// The index just past the empty line that ends the head, searching from `from`.
fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < buf.len() {
        if buf[i] == b'\n' {
            match buf.get(i + 1..) {
                Some([b'\n', ..]) => return Some(i + 2),
                Some([b'\r', b'\n', ..]) => return Some(i + 3),
                _ => {}
            }
        }
        i += 1;
    }
    None
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses the head (request line and fields, up to and including the empty line).
fn parse_head(bytes: &[u8]) -> Result<RequestHead, HeadError> {
    let mut lines = bytes
        .split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let request_line = lines.next().ok_or(HeadError::Malformed)?;
    let mut parts = request_line.split(|b| *b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::Malformed);
    };
    if method.is_empty() || !method.iter().all(|b| is_token_byte(*b)) {
        return Err(HeadError::Malformed);
    }
    if target.contains(&b'\r') {
        return Err(HeadError::Malformed);
    }
    let version = match version {
        b"HTTP/1.1" => "HTTP/1.1",
        b"HTTP/1.0" => "HTTP/1.0",
        _ => return Err(HeadError::Malformed),
    };
    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            return Err(HeadError::Malformed);
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|b| is_token_byte(*b)) {
            return Err(HeadError::Malformed);
        }
        if value.iter().any(|b| matches!(b, b'\r' | b'\0')) {
            return Err(HeadError::Malformed);
        }
        let value = value.trim_ascii();
        headers.push((
            String::from_utf8_lossy(name).into_owned(),
            String::from_utf8_lossy(value).into_owned(),
        ));
        if headers.len() > HEADER_FIELDS_MAX {
            return Err(HeadError::Malformed);
        }
    }
    Ok(RequestHead {
        method: String::from_utf8_lossy(method).into_owned(),
        target: String::from_utf8_lossy(target).into_owned(),
        version,
        headers,
    })
}

/// The refusal response: status, `X-Corral-Egress-Reason`, a one-line body, connection closed.
#[must_use]
pub fn refusal_response(refusal: Refusal) -> Vec<u8> {
    let status = refusal.status();
    let body = format!("egress refused: {}\n", refusal.code());
    let authenticate = if status == 407 {
        "Proxy-Authenticate: Bearer realm=\"corral-egress\"\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {status} {}\r\n{REASON_HEADER}: {}\r\n{authenticate}\
         Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        status_text(status),
        refusal.code(),
        body.len()
    )
    .into_bytes()
}

/// The answer to an allowed CONNECT, sent once the upstream connection is open.
pub const CONNECT_ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// Writes `bytes` and closes the write side, ignoring a client that already left.
pub async fn send_and_close<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) {
    if stream.write_all(bytes).await.is_ok() {
        let _ = stream.flush().await;
        let _ = stream.shutdown().await;
    }
}

/// How a plain-HTTP request body is framed (RFC 9112 section 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// The body framing of a request, refusing anything ambiguous: `Transfer-Encoding` other than
/// exactly `chunked`, both `Transfer-Encoding` and `Content-Length`, differing or non-numeric
/// `Content-Length` values.
pub fn body_framing(head: &RequestHead) -> Result<BodyFraming, ShellReason> {
    let codings = head.values("transfer-encoding");
    let lengths = head.values("content-length");
    match (codings.as_slice(), lengths.as_slice()) {
        ([], []) => Ok(BodyFraming::None),
        ([coding], []) if coding.eq_ignore_ascii_case("chunked") => Ok(BodyFraming::Chunked),
        ([], [first, rest @ ..]) => {
            let parse = |text: &str| {
                (!text.is_empty() && text.len() <= 18 && text.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| text.parse::<u64>().ok())
                    .flatten()
            };
            let length = parse(first).ok_or(ShellReason::RequestBodyFraming)?;
            if rest.iter().any(|other| parse(other) != Some(length)) {
                return Err(ShellReason::RequestBodyFraming);
            }
            Ok(BodyFraming::Length(length))
        }
        _ => Err(ShellReason::RequestBodyFraming),
    }
}

/// Header fields never forwarded upstream: hop-by-hop fields (RFC 9110 section 7.6.1), the
/// grant, and `Content-Length`/`Transfer-Encoding`, which are re-added from the checked framing.
const NOT_FORWARDED: [&str; 10] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "transfer-encoding",
];

/// The head sent upstream for a plain-HTTP request: origin-form target, the client's fields
/// minus hop-by-hop ones (and any the `Connection` field names), the checked framing, and
/// `Connection: close` (one request per connection, so every request is judged on its own).
#[must_use]
pub fn upstream_head(head: &RequestHead, origin_form: &str, framing: BodyFraming) -> Vec<u8> {
    let named_by_connection: Vec<String> = head
        .values("connection")
        .iter()
        .flat_map(|v| v.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .collect();
    let mut out = format!("{} {} {}\r\n", head.method, origin_form, head.version);
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if NOT_FORWARDED.contains(&lower.as_str()) || named_by_connection.contains(&lower) {
            continue;
        }
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    match framing {
        BodyFraming::None => {}
        BodyFraming::Length(n) => out.push_str(&format!("Content-Length: {n}\r\n")),
        BodyFraming::Chunked => out.push_str("Transfer-Encoding: chunked\r\n"),
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn head(bytes: &[u8]) -> Result<(RequestHead, Vec<u8>), HeadError> {
        let mut reader = bytes;
        read_head(&mut reader, 32 * 1024).await
    }

    #[tokio::test]
    async fn reads_a_connect_head_and_keeps_what_follows() {
        let (h, rest) = head(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\nProxy-Authorization:  Bearer x \r\n\r\nTLS")
            .await
            .unwrap();
        assert_eq!(h.method, "CONNECT");
        assert_eq!(h.target, "a.example:443");
        assert_eq!(h.values("proxy-authorization"), vec!["Bearer x"]);
        assert_eq!(rest, b"TLS");
        let (h, _) = head(b"GET http://a/ HTTP/1.0\n\n").await.unwrap();
        assert_eq!(h.version, "HTTP/1.0");
    }

    #[tokio::test]
    async fn refuses_ambiguous_heads() {
        for bad in [
            &b"CONNECT a:1  HTTP/1.1\r\n\r\n"[..],
            b"CONNECT a:1 HTTP/2\r\n\r\n",
            b"CONNECT a:1\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1\r\nHost : a\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1\r\nno colon\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1\r\n",
            b"C@NNECT a:1 HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(
                head(bad).await.unwrap_err(),
                HeadError::Malformed,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(head(b"").await.unwrap_err(), HeadError::Closed);
        let big = format!(
            "CONNECT a:1 HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(40 * 1024)
        );
        assert_eq!(head(big.as_bytes()).await.unwrap_err(), HeadError::TooLarge);
    }

    #[test]
    fn body_framing_refuses_smuggling_shapes() {
        let with = |fields: &[(&str, &str)]| RequestHead {
            method: "POST".into(),
            target: "http://a/".into(),
            version: "HTTP/1.1",
            headers: fields
                .iter()
                .map(|(n, v)| ((*n).into(), (*v).into()))
                .collect(),
        };
        assert_eq!(body_framing(&with(&[])), Ok(BodyFraming::None));
        assert_eq!(
            body_framing(&with(&[("Content-Length", "5")])),
            Ok(BodyFraming::Length(5))
        );
        assert_eq!(
            body_framing(&with(&[("Content-Length", "5"), ("content-length", "5")])),
            Ok(BodyFraming::Length(5))
        );
        assert_eq!(
            body_framing(&with(&[("Transfer-Encoding", "Chunked")])),
            Ok(BodyFraming::Chunked)
        );
        for bad in [
            &[("Content-Length", "5"), ("Content-Length", "6")][..],
            &[("Content-Length", "+5")],
            &[("Content-Length", "")],
            &[("Transfer-Encoding", "gzip, chunked")],
            &[("Transfer-Encoding", "chunked"), ("Content-Length", "5")],
            &[
                ("Transfer-Encoding", "chunked"),
                ("Transfer-Encoding", "chunked"),
            ],
        ] {
            assert_eq!(
                body_framing(&with(bad)),
                Err(ShellReason::RequestBodyFraming),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn upstream_head_drops_hop_by_hop_fields_and_the_grant() {
        let h = RequestHead {
            method: "GET".into(),
            target: "http://a.example/x".into(),
            version: "HTTP/1.1",
            headers: vec![
                ("Host".into(), "a.example".into()),
                ("Proxy-Authorization".into(), "Bearer secret".into()),
                ("Connection".into(), "keep-alive, X-Hop".into()),
                ("X-Hop".into(), "1".into()),
                ("Accept".into(), "*/*".into()),
            ],
        };
        let out = String::from_utf8(upstream_head(&h, "/x", BodyFraming::None)).unwrap();
        assert_eq!(
            out,
            "GET /x HTTP/1.1\r\nHost: a.example\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
    }
}
