//! The proxy: one task per client connection, a thin shell around the core's decision.
//!
//! Per connection, in order (each step's refusal answers and closes):
//! 1. read one request head within the header bound and the header read time;
//! 2. verify the grant in `Proxy-Authorization: Bearer <grant>` with the current verifying key
//!    (407 when missing, malformed, expired or untrusted);
//! 3. parse the target with the core (CONNECT authority, or absolute-form URL and its `Host`);
//! 4. judge it under the grant's policy ([`crate::judge::judge`]): the core decides, resolving
//!    the name fresh for this connection when the core asks (403 policy, 502 DNS, 504 timeout);
//! 5. dial exactly the pinned address within the connect time (502 refused, 504 timeout);
//! 6. CONNECT: answer 200 and tunnel; plain HTTP: forward the head in origin-form with
//!    `Connection: close`, exactly one body, and the response.
//!
//! One request per client connection: every request is verified and judged on its own.
//! Every outcome is one JSON log line and one counter ([`Observer`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use corral_core::egress::{GrantClaims, Reason, parse_proxy_authorization};
use corral_core::time::UnixMillis;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::config::Limits;
use crate::dns::Resolve;
use crate::grants::GrantCache;
use crate::http::{
    BodyFraming, CONNECT_ESTABLISHED, HeadError, RequestHead, body_framing, read_head,
    refusal_response, send_and_close, upstream_head,
};
use crate::json::JsonObject;
use crate::judge::{Lookup, ParsedTarget, Verdict, Via, judge, parse_request_target};
use crate::key::KeyStore;
use crate::observe::{Observer, bounded_text, unix_now_ms};
use crate::refusal::{Refusal, ShellReason};
use crate::tunnel::{Moved, relay_http, tunnel};

/// How much of an unread request is drained after a refusal, so that closing does not reset
/// the connection before the client reads the answer.
pub const REFUSAL_DRAIN_BYTES_MAX: u64 = 64 * 1024;
/// How long that drain may take.
pub const REFUSAL_DRAIN_TIME: std::time::Duration = std::time::Duration::from_millis(500);

/// Opens the upstream connection to an address the core pinned.
pub trait Dialer: Send + Sync + 'static {
    /// Connects to exactly `pinned`.
    fn dial(&self, pinned: SocketAddr) -> impl Future<Output = io::Result<TcpStream>> + Send;
}

/// The production dialer: a TCP connection to exactly the pinned address.
#[derive(Clone, Copy, Debug, Default)]
pub struct DirectDialer;

impl Dialer for DirectDialer {
    fn dial(&self, pinned: SocketAddr) -> impl Future<Output = io::Result<TcpStream>> + Send {
        TcpStream::connect(pinned)
    }
}

struct Shared<R, D> {
    limits: Limits,
    keys: KeyStore,
    grants: GrantCache,
    resolver: R,
    dialer: D,
    observer: Arc<Observer>,
}

/// The egress proxy.
pub struct Proxy<R, D> {
    shared: Arc<Shared<R, D>>,
}

impl<R: Resolve + 'static, D: Dialer> Proxy<R, D> {
    /// A proxy with these bounds, key, resolver, dialer and observer.
    pub fn new(
        limits: Limits,
        keys: KeyStore,
        resolver: R,
        dialer: D,
        observer: Arc<Observer>,
    ) -> Proxy<R, D> {
        Proxy {
            shared: Arc::new(Shared {
                limits,
                keys,
                grants: GrantCache::new(),
                resolver,
                dialer,
                observer,
            }),
        }
    }

    /// Serves connections from `listener` until `shutdown` resolves. At most
    /// `limits.connections_max` are served at once; the rest wait in the listen backlog.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let permits = Arc::new(Semaphore::new(self.shared.limits.connections_max));
        self.serve_sharing(listener, permits, shutdown).await;
    }

    /// [`Self::serve`] with the bound on connections served at once held in `permits`, which
    /// other proxies (the other serving threads) share.
    pub async fn serve_sharing(
        self,
        listener: TcpListener,
        permits: Arc<Semaphore>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                biased;
                () = &mut shutdown => return,
                permit = Arc::clone(&permits).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            let accepted = tokio::select! {
                biased;
                () = &mut shutdown => return,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, client)) => {
                    let shared = Arc::clone(&self.shared);
                    tokio::spawn(async move {
                        handle(&shared, stream, client).await;
                        drop(permit);
                    });
                }
                // Out of descriptors or a connection reset before accept: wait briefly, retry.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }
}

/// What is known about one connection so far, for its log line.
struct Record {
    client: SocketAddr,
    received: Instant,
    method: Option<String>,
    target: Option<String>,
    canonical: Option<String>,
    claims: Option<Arc<GrantClaims>>,
    lookup: Option<Lookup>,
    pinned: Option<SocketAddr>,
    refused_address: Option<std::net::IpAddr>,
}

impl Record {
    fn line(&self, event: &str) -> JsonObject {
        let mut line = JsonObject::new();
        line.number("ts_ms", unix_now_ms())
            .string("event", event)
            .string("client", &self.client.to_string());
        if let Some(method) = &self.method {
            line.string("method", bounded_text(method));
        }
        if let Some(target) = &self.target {
            line.string("target", bounded_text(target));
        }
        if let Some(canonical) = &self.canonical {
            line.string("destination", canonical);
        }
        if let Some(claims) = &self.claims {
            line.string("mode", claims.policy.mode().as_str())
                .string("run", &claims.run)
                .string("actor", bounded_text(&claims.actor.0))
                .string("execution_id", &claims.execution_id.to_string())
                .number("policy_revision", claims.policy_revision);
        }
        if let Some(Lookup::Resolved(outcome)) = &self.lookup {
            line.string("dns", outcome.code());
        }
        if let Some(pinned) = self.pinned {
            line.string("pinned", &pinned.to_string());
        }
        if let Some(address) = self.refused_address {
            line.string("refused_address", &address.to_string());
        }
        line.number(
            "elapsed_us",
            u64::try_from(self.received.elapsed().as_micros()).unwrap_or(u64::MAX),
        );
        line
    }
}

async fn handle<R: Resolve, D: Dialer>(
    shared: &Shared<R, D>,
    mut stream: TcpStream,
    client: SocketAddr,
) {
    let _active = shared.observer.connection();
    let _ = stream.set_nodelay(true);
    let mut record = Record {
        client,
        received: Instant::now(),
        method: None,
        target: None,
        canonical: None,
        claims: None,
        lookup: None,
        pinned: None,
        refused_address: None,
    };
    let limits = shared.limits;
    let read = tokio::time::timeout(
        limits.header_timeout,
        read_head(&mut stream, limits.header_max_bytes),
    )
    .await;
    let (head, leftover) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(HeadError::Closed)) => return,
        Ok(Err(HeadError::TooLarge)) => {
            return refuse(
                shared,
                &mut stream,
                &record,
                ShellReason::RequestHeaderTooLarge.into(),
            )
            .await;
        }
        Ok(Err(HeadError::Malformed)) => {
            return refuse(
                shared,
                &mut stream,
                &record,
                ShellReason::RequestMalformed.into(),
            )
            .await;
        }
        Err(_) => {
            return refuse(
                shared,
                &mut stream,
                &record,
                ShellReason::RequestHeaderTimeout.into(),
            )
            .await;
        }
    };
    record.received = Instant::now();
    record.method = Some(head.method.clone());
    record.target = Some(head.target.clone());
    match decide_request(shared, &head, &mut record).await {
        Ok((parsed, framing, upstream)) => {
            serve_allowed(
                shared, stream, &head, &leftover, parsed, framing, upstream, &record,
            )
            .await;
        }
        Err(refusal) => refuse(shared, &mut stream, &record, refusal).await,
    }
}

/// Steps 2 to 5: grant, target, decision, dial. On success the upstream is connected.
async fn decide_request<R: Resolve, D: Dialer>(
    shared: &Shared<R, D>,
    head: &RequestHead,
    record: &mut Record,
) -> Result<(ParsedTarget, BodyFraming, TcpStream), Refusal> {
    let claims = verify_grant(shared, head).await?;
    let via = if head.method == "CONNECT" {
        Via::Connect
    } else {
        Via::Http
    };
    let host_values = head.values("host");
    let host_check = (via == Via::Http).then_some(host_values.as_slice());
    let policy = &record.claims.insert(claims).policy;
    let parsed = parse_request_target(via, &head.target, host_check)?;
    record.canonical = Some(parsed.target().to_string());
    let framing = match via {
        Via::Connect => BodyFraming::None,
        Via::Http => body_framing(head)?,
    };
    let judgment = judge(policy, parsed.target(), &shared.resolver).await;
    record.lookup = Some(judgment.lookup);
    let pinned = match judgment.verdict {
        Verdict::Allow { pinned } => pinned,
        Verdict::Deny { refusal, address } => {
            record.refused_address = address;
            return Err(refusal);
        }
    };
    record.pinned = Some(pinned);
    let upstream =
        match tokio::time::timeout(shared.limits.connect_timeout, shared.dialer.dial(pinned)).await
        {
            Ok(Ok(upstream)) => upstream,
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(ShellReason::UpstreamConnectRefused.into());
            }
            Ok(Err(_)) => return Err(ShellReason::UpstreamConnectFailed.into()),
            Err(_) => return Err(ShellReason::UpstreamConnectTimeout.into()),
        };
    let _ = upstream.set_nodelay(true);
    Ok((parsed, framing, upstream))
}

/// Step 2: the grant, verified now with the current key (EGR-9: a new key applies at once).
async fn verify_grant<R, D>(
    shared: &Shared<R, D>,
    head: &RequestHead,
) -> Result<Arc<GrantClaims>, Refusal> {
    let values = head.values("proxy-authorization");
    let token = match values.as_slice() {
        [] => parse_proxy_authorization(None),
        [one] => parse_proxy_authorization(Some(one)),
        [_, _, ..] => Err(Reason::GrantMalformed),
    }?;
    let verifier = shared
        .keys
        .current()
        .await
        .map_err(|_| ShellReason::VerifyingKeyUnavailable)?;
    let now = UnixMillis(unix_now_ms());
    match shared.grants.verify(&verifier, token, now) {
        Err(Reason::GrantBadSignature) => {
            match shared.keys.refreshed_after_bad_signature(&verifier).await {
                Some(fresh) => Ok(shared.grants.verify(&fresh, token, now)?),
                None => Err(Reason::GrantBadSignature.into()),
            }
        }
        verified => Ok(verified?),
    }
}

/// Step 6 for an allowed request.
#[allow(clippy::too_many_arguments)]
async fn serve_allowed<R, D>(
    shared: &Shared<R, D>,
    mut client: TcpStream,
    head: &RequestHead,
    leftover: &[u8],
    parsed: ParsedTarget,
    framing: BodyFraming,
    mut upstream: TcpStream,
    record: &Record,
) {
    shared.observer.decision("allow", {
        let mut line = record.line("egress_decision");
        line.string("decision", "allow").number("status", 200);
        line
    });
    let started = Instant::now();
    let idle = shared.limits.idle_timeout;
    let moved = match parsed {
        ParsedTarget::Connect(_) => {
            let opened = client.write_all(CONNECT_ESTABLISHED).await.is_ok()
                && upstream.write_all(leftover).await.is_ok();
            if opened {
                tunnel(&mut client, &mut upstream, idle).await
            } else {
                Moved {
                    up_bytes: 0,
                    down_bytes: 0,
                    end: crate::tunnel::End::Error,
                }
            }
        }
        ParsedTarget::Http(request) => {
            let head_bytes = upstream_head(head, &request.origin_form, framing);
            if upstream.write_all(&head_bytes).await.is_ok() {
                relay_http(&mut client, leftover, &mut upstream, framing, idle).await
            } else {
                Moved {
                    up_bytes: 0,
                    down_bytes: 0,
                    end: crate::tunnel::End::Error,
                }
            }
        }
    };
    let mut line = record.line("egress_closed");
    line.number("up_bytes", moved.up_bytes)
        .number("down_bytes", moved.down_bytes)
        .string("end", moved.end.code())
        .number(
            "open_ms",
            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        );
    shared.observer.line(line);
}

/// Answers a refusal, logs and counts it, and closes without resetting the connection.
async fn refuse<R, D>(
    shared: &Shared<R, D>,
    stream: &mut TcpStream,
    record: &Record,
    refusal: Refusal,
) {
    let mut line = record.line("egress_decision");
    line.string("decision", "deny")
        .string("reason", refusal.code())
        .number("status", u64::from(refusal.status()));
    shared.observer.decision(refusal.code(), line);
    send_and_close(stream, &refusal_response(refusal)).await;
    let mut sink = tokio::io::sink();
    let mut unread = (&mut *stream).take(REFUSAL_DRAIN_BYTES_MAX);
    let drain = tokio::io::copy(&mut unread, &mut sink);
    let _ = tokio::time::timeout(REFUSAL_DRAIN_TIME, drain).await;
}

/// Serves the counters as text to any request on `listener`, until `shutdown` resolves.
pub async fn serve_metrics(
    listener: TcpListener,
    observer: Arc<Observer>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut stream, _)) = accepted else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let observer = Arc::clone(&observer);
        tokio::spawn(async move {
            let mut request = [0u8; 4096];
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(2), stream.read(&mut request))
                    .await;
            let body = observer.render_metrics();
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            send_and_close(&mut stream, response.as_bytes()).await;
        });
    }
}
