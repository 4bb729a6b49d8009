//! `corral egress-proxy`: read the settings, bind, serve until SIGINT or SIGTERM.

use std::process::ExitCode;
use std::sync::Arc;

use crate::config::ProxyConfig;
use crate::dns::HickoryResolve;
use crate::json::JsonObject;
use crate::key::{KeySource, KeyStore};
use crate::observe::{LogSink, Observer, unix_now_ms};
use crate::proxy::{DirectDialer, Proxy, serve_metrics};

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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("corral egress-proxy: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(serve(config))
}

async fn serve(config: ProxyConfig) -> ExitCode {
    let resolver =
        match HickoryResolve::new(config.dns_servers.as_deref(), config.limits.dns_timeout) {
            Ok(resolver) => resolver,
            Err(message) => {
                eprintln!("corral egress-proxy: {message}");
                return ExitCode::from(2);
            }
        };
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!(
                "corral egress-proxy: cannot listen on {}: {e}",
                config.listen
            );
            return ExitCode::from(1);
        }
    };
    let observer = Observer::new(LogSink::Stderr);
    observer.line(started_line(&config, &listener));
    if let Some(address) = config.metrics_listen {
        match tokio::net::TcpListener::bind(address).await {
            Ok(metrics) => {
                tokio::spawn(serve_metrics(
                    metrics,
                    Arc::clone(&observer),
                    std::future::pending(),
                ));
            }
            Err(e) => {
                eprintln!("corral egress-proxy: cannot serve metrics on {address}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let proxy = Proxy::new(
        config.limits,
        KeyStore::new(config.key_source),
        resolver,
        DirectDialer,
        Arc::clone(&observer),
    );
    proxy.serve(listener, shutdown_signal()).await;
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
fn started_line(config: &ProxyConfig, listener: &tokio::net::TcpListener) -> JsonObject {
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
