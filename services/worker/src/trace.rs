//! The run's one trace on the worker's side (issue 31): an execute's span continues the API's,
//! whose W3C `traceparent` the request carries (`ExecuteRequest::traceparent`).

use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Makes `span` a child of the span `traceparent` names; nothing without one (or without an
/// exporter, when the span has no OpenTelemetry context to take a parent).
pub fn continue_from(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    let carrier =
        std::collections::HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let parent =
        opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&carrier));
    let _ = span.set_parent(parent);
}
