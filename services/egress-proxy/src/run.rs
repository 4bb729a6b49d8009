//! `corral egress-proxy`: read the settings, bind, serve until SIGINT or SIGTERM.
//!
//! One thread per core, each a single-threaded runtime with its own listening socket on the one
//! address (`SO_REUSEPORT`: the kernel spreads new connections over them), so that a connection
//! is accepted, judged and tunnelled on one thread and never handed to another. On a
//! work-stealing runtime every accepted connection woke a second thread and every tunnel's wake-up
//! could land on either, which added about 50 µs to a CONNECT's setup (issue 29). The threads
//! share the connection bound and the log; each has its own key store, verified grants and
//! resolver.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Semaphore, watch};

use crate::config::ProxyConfig;
use crate::dns::HickoryResolve;
use crate::json::JsonObject;
use crate::key::{KeySource, KeyStore};
use crate::observe::{LogSink, Observer, unix_now_ms};
use crate::proxy::{DirectDialer, Proxy, serve_metrics};

/// The variable that sets how many threads serve connections (tokio's own name for it); one per
/// core when unset.
pub const THREADS_VARIABLE: &str = "TOKIO_WORKER_THREADS";

/// Runs the proxy with settings from the process environment. Exit 2 when a setting is
/// unusable, 1 when the listen address cannot be bound, 0 after a signal.
#[must_use]
pub fn main_from_env() -> ExitCode {
    let config = match ProxyConfig::from_lookup(|name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("corral egress-proxy: {message}");
            return ExitCode::from(2);
        }
    };
    let threads = serving_threads(std::env::var(THREADS_VARIABLE).ok().as_deref());
    match single_threaded() {
        Ok(runtime) => runtime.block_on(serve(config, threads)),
        Err(e) => {
            eprintln!("corral egress-proxy: cannot start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}

fn single_threaded() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// How many threads serve: `setting` when it is a positive number, else one per core.
fn serving_threads(setting: Option<&str>) -> usize {
    setting
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// A listening socket on `address` that the other serving threads' sockets share.
fn listen_shared(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(address)?;
    socket.listen(1024)
}

/// One proxy of a serving thread: its own key store, grants and resolver, the shared log.
fn proxy(
    config: &ProxyConfig,
    observer: &Arc<Observer>,
) -> Result<Proxy<HickoryResolve, DirectDialer>, String> {
    let resolver = HickoryResolve::new(config.dns_servers.as_deref(), config.limits.dns_timeout)?;
    Ok(Proxy::new(
        config.limits,
        KeyStore::new(config.key_source.clone()),
        resolver,
        DirectDialer,
        Arc::clone(observer),
    ))
}

/// Starts the serving threads after the first (this one): each binds its own socket to
/// `address` and serves until `stop` turns true.
fn start_threads(
    config: &ProxyConfig,
    address: SocketAddr,
    threads: usize,
    observer: &Arc<Observer>,
    permits: &Arc<Semaphore>,
    stop: &watch::Receiver<bool>,
) -> Result<Vec<std::thread::JoinHandle<()>>, String> {
    let mut handles = Vec::new();
    for index in 1..threads {
        let proxy = proxy(config, observer)?;
        let (permits, mut stop) = (Arc::clone(permits), stop.clone());
        let (bound, bound_rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name(format!("egress-{index}"))
            .spawn(move || {
                let runtime = match single_threaded() {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = bound.send(Err(format!("cannot start a runtime: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match listen_shared(address) {
                        Ok(listener) => listener,
                        Err(e) => {
                            let _ = bound.send(Err(format!("cannot listen on {address}: {e}")));
                            return;
                        }
                    };
                    let _ = bound.send(Ok(()));
                    let stopped = async move {
                        let _ = stop.wait_for(|stopped| *stopped).await;
                    };
                    proxy.serve_sharing(listener, permits, stopped).await;
                });
            })
            .map_err(|e| format!("cannot start a serving thread: {e}"))?;
        bound_rx
            .recv()
            .map_err(|_| "a serving thread ended before it listened".to_owned())??;
        handles.push(handle);
    }
    Ok(handles)
}

async fn serve(config: ProxyConfig, threads: usize) -> ExitCode {
    let observer = Observer::new(LogSink::Stderr);
    let first = match proxy(&config, &observer) {
        Ok(proxy) => proxy,
        Err(message) => {
            eprintln!("corral egress-proxy: {message}");
            return ExitCode::from(2);
        }
    };
    let listener = match listen_shared(config.listen) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!(
                "corral egress-proxy: cannot listen on {}: {e}",
                config.listen
            );
            return ExitCode::from(1);
        }
    };
    let address = listener.local_addr().unwrap_or(config.listen);
    let permits = Arc::new(Semaphore::new(config.limits.connections_max));
    let (stop, stopped) = watch::channel(false);
    let others = match start_threads(&config, address, threads, &observer, &permits, &stopped) {
        Ok(others) => others,
        Err(message) => {
            let _ = stop.send(true);
            eprintln!("corral egress-proxy: {message}");
            return ExitCode::from(1);
        }
    };
    observer.line(started_line(&config, &listener, threads));
    if let Some(address) = config.metrics_listen {
        match TcpListener::bind(address).await {
            Ok(metrics) => {
                tokio::spawn(serve_metrics(
                    metrics,
                    Arc::clone(&observer),
                    std::future::pending(),
                ));
            }
            Err(e) => {
                let _ = stop.send(true);
                eprintln!("corral egress-proxy: cannot serve metrics on {address}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    first
        .serve_sharing(listener, permits, shutdown_signal())
        .await;
    let _ = stop.send(true);
    for other in others {
        let _ = other.join();
    }
    let mut stopped = JsonObject::new();
    stopped
        .number("ts_ms", unix_now_ms())
        .string("event", "egress_proxy_stopped");
    observer.line(stopped);
    observer.flush();
    eprintln!("{}", observer.render_metrics().trim_end());
    ExitCode::SUCCESS
}

/// The log line saying the proxy started: where it listens, where its key comes from, and its
/// name servers.
fn started_line(config: &ProxyConfig, listener: &TcpListener, threads: usize) -> JsonObject {
    let mut started = JsonObject::new();
    started
        .number("ts_ms", unix_now_ms())
        .string("event", "egress_proxy_started")
        .string(
            "listen",
            &listener
                .local_addr()
                .map_or_else(|_| config.listen.to_string(), |a| a.to_string()),
        )
        .number("threads", threads as u64)
        .string(
            "key_source",
            &match &config.key_source {
                KeySource::File(path) => format!("file:{}", path.display()),
                KeySource::Url { .. } => "url".to_owned(),
            },
        )
        .string(
            "dns",
            &config.dns_servers.as_ref().map_or_else(
                || "system".to_owned(),
                |servers| {
                    servers
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                },
            ),
        );
    started
}

/// Resolves on SIGINT or SIGTERM (every long-running `corral` service stops on either).
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_names_how_many_threads_serve_and_anything_else_means_one_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(serving_threads(Some("3")), 3);
        assert_eq!(serving_threads(Some(" 5 ")), 5);
        for unusable in [None, Some("0"), Some("-1"), Some("many"), Some("")] {
            assert_eq!(serving_threads(unusable), cores, "{unusable:?}");
        }
    }
}
