//! The run's one trace (issue 31): the W3C `traceparent` of the current span, which the API
//! carries on the worker contract (`ExecuteRequest::traceparent`) so that the worker's spans join
//! the run's trace. Without an exporter (no `OTEL_EXPORTER_OTLP_ENDPOINT`) there is no trace and
//! nothing is carried.

use opentelemetry::trace::TraceContextExt as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The current span's `traceparent`, when it belongs to a sampled trace.
#[must_use]
pub fn traceparent() -> Option<String> {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = std::collections::HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut carrier);
    });
    carrier.remove("traceparent")
}
