//! The services' logs and traces (issue 31). Every service logs through `tracing`, as text
//! lines, or as JSON lines with `CORRAL_LOG_FORMAT=json`, on stderr, at the levels `RUST_LOG`
//! names (default `info`). A run's lines carry its run id, and its lease and worker once granted
//! (`corral_api::run`); no line carries code, output or a credential.
//!
//! With the standard `OTEL_EXPORTER_OTLP_ENDPOINT` set, the same spans are exported over OTLP
//! (HTTP; `OTEL_EXPORTER_OTLP_PROTOCOL` `http/json` or the default `http/protobuf`), batched
//! off the request path: one trace per run, from the API's span through the lease, the worker
//! (whose span continues the API's by the W3C `traceparent` on the worker contract) and the save,
//! with attributes under `corral.*`. An endpoint that is down costs the runs nothing: a batch that
//! cannot be sent is dropped and counted (`corral_otlp_spans_dropped_total` on `/metrics`).
//! Without the variable nothing is exported.

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The setting that chooses the log format: `text` (the default) or `json`.
pub const LOG_FORMAT: &str = "CORRAL_LOG_FORMAT";
/// The standard setting that turns the OTLP export on.
pub const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The OTLP exporter, counting what it could not send (`corral_otlp_spans_dropped_total`).
#[derive(Debug)]
struct Counted<E>(E);

impl<E: opentelemetry_sdk::trace::SpanExporter> opentelemetry_sdk::trace::SpanExporter
    for Counted<E>
{
    fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        let spans = batch.len() as u64;
        let exported = self.0.export(batch);
        async move {
            let result = exported.await;
            if result.is_err() {
                corral_api::metrics::OTLP_SPANS_DROPPED
                    .fetch_add(spans, std::sync::atomic::Ordering::Relaxed);
            }
            result
        }
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.0.set_resource(resource);
    }
}

/// The OTLP trace exporter's provider for `service`, when `OTEL_EXPORTER_OTLP_ENDPOINT` asks
/// for one.
fn provider(service: &str) -> Result<Option<SdkTracerProvider>, String> {
    if std::env::var(OTLP_ENDPOINT).map_or(true, |v| v.trim().is_empty()) {
        return Ok(None);
    }
    corral_contract::ensure_crypto_provider();
    let protocol = match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref() {
        Ok("http/json") => Protocol::HttpJson,
        Ok("http/protobuf") | Err(_) => Protocol::HttpBinary,
        Ok(other) => {
            return Err(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL is http/protobuf or http/json here, not {other:?}"
            ));
        }
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .build()
        .map_err(|e| format!("the OTLP exporter: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service.to_owned())
        .build();
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(Counted(exporter))
            .with_resource(resource)
            .build(),
    ))
}

/// Installs the subscriber for this process (`service` names it in exported traces), or says
/// why a setting is refused.
pub fn init(service: &str) -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match std::env::var(LOG_FORMAT).unwrap_or_default().as_str() {
        "json" => true,
        "" | "text" => false,
        other => return Err(format!("{LOG_FORMAT} is text or json, not {other:?}")),
    };
    let traces = provider(service)?.map(|provider| {
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        let tracer = provider.tracer("corral");
        let _ = PROVIDER.set(provider);
        tracing_opentelemetry::layer().with_tracer(tracer)
    });
    let text = (!json).then(|| {
        tracing_subscriber::fmt::layer()
            .compact()
            .with_writer(std::io::stderr)
    });
    let json = json.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
    });
    // Installed already (a test's process): the first one stands.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(traces)
        .try_init();
    Ok(())
}

/// Sends what the exporter still holds, before the process ends.
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get() {
        let _ = provider.shutdown();
    }
}
