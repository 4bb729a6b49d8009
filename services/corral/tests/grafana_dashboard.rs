//! The Grafana dashboard (`docs/grafana/corral.json`, issue 31) against the metrics the services
//! expose: every metric a panel queries is one the API's `/metrics` or the egress proxy's metrics
//! listener declares, and every family they declare has a panel. No services needed.

use std::collections::BTreeSet;
use std::path::Path;

use corral_core::pool::StateCounts;
use corral_egress_proxy::observe::{LogSink, Observer};
use corral_store::WriteCounts;
use serde_json::Value;

/// The metric families the services declare (`# TYPE name kind`).
fn declared() -> BTreeSet<String> {
    let api = corral_api::metrics::Metrics::default()
        .render(Some((StateCounts::default(), 0)), &WriteCounts::default());
    let proxy = Observer::new(LogSink::Discard).render_metrics();
    format!("{api}\n{proxy}")
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The metric families the dashboard's queries name (a histogram's `_bucket` is its family's).
fn queried(dashboard: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let mut rest = expr;
            while let Some(at) = rest.find("corral_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                rest = &rest[at + name.len()..];
                names.insert(name.trim_end_matches("_bucket").to_owned());
            }
        }
    }
    names
}

#[test]
fn the_grafana_dashboard_queries_exactly_the_metrics_the_services_expose() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/grafana/corral.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard"))
            .expect("JSON");
    let declared = declared();
    let queried = queried(&dashboard);
    assert!(declared.len() >= 12, "{declared:?}");
    let unknown: Vec<_> = queried.difference(&declared).collect();
    assert!(unknown.is_empty(), "queried but never exposed: {unknown:?}");
    let unshown: Vec<_> = declared.difference(&queried).collect();
    assert!(unshown.is_empty(), "exposed but on no panel: {unshown:?}");
    // Every panel reads the dashboard's one Prometheus data source.
    for panel in dashboard["panels"].as_array().unwrap() {
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
    }
}
