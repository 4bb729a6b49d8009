//! The NetworkPolicy evaluator against Kubernetes' documented semantics, one part at a time, on
//! a small cluster: namespaces `a` (team=red), `b` (team=blue) and `c`; pods `a/web` (app=web,
//! tier=front, a named port `http` 8080/TCP), `a/db`, `a/client`, `b/web`, `b/client`,
//! `c/client`. Every expectation is written by hand from the API's documentation.

use std::net::IpAddr;

use corral_controller::network_policy::eval::{
    Cluster, Endpoint, Invalid, PolicySet, Protocol, Side, network_policies_in,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

use Protocol::{Sctp, Tcp, Udp};

fn cluster() -> Cluster {
    let mut cluster = Cluster::new();
    cluster.add_namespace("a", &[("team", "red")]);
    cluster.add_namespace("b", &[("team", "blue")]);
    cluster.add_namespace("c", &[]);
    let pods = [
        (
            "a",
            "web",
            json!({"app": "web", "tier": "front"}),
            "10.0.1.1",
        ),
        ("a", "db", json!({"app": "db"}), "10.0.1.2"),
        ("a", "client", json!({"app": "client"}), "10.0.1.3"),
        ("b", "web", json!({"app": "web"}), "10.0.2.1"),
        ("b", "client", json!({"app": "client"}), "10.0.2.3"),
        ("c", "client", json!({"app": "client"}), "10.0.3.3"),
    ];
    for (namespace, name, labels, ip) in pods {
        let ports = if (namespace, name) == ("a", "web") {
            json!([{"name": "http", "containerPort": 8080, "protocol": "TCP"}])
        } else {
            json!([])
        };
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": namespace, "name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "ports": ports}]}
        }))
        .unwrap();
        cluster.add_pod(&pod, ip.parse().unwrap()).unwrap();
    }
    cluster
}

/// A NetworkPolicy named `name` in `namespace` with `spec`.
fn np(namespace: &str, name: &str, spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec
    }))
    .unwrap()
}

fn set(policies: &[NetworkPolicy]) -> PolicySet {
    PolicySet::new(policies).unwrap()
}

/// Where a named party is: `ns/pod`, `node:IP`, or an address.
fn at<'c>(cluster: &'c Cluster, who: &str) -> Endpoint<'c> {
    if let Some(ip) = who.strip_prefix("node:") {
        return Endpoint::Node(ip.parse().unwrap());
    }
    match who.split_once('/') {
        Some((namespace, name)) => Endpoint::Pod(cluster.pod(namespace, name).unwrap()),
        None => Endpoint::Address(who.parse::<IpAddr>().unwrap()),
    }
}

/// Asserts each (from, to, port, protocol, allowed) row.
fn assert_rows(policies: &PolicySet, rows: &[(&str, &str, u16, Protocol, bool)]) {
    let cluster = cluster();
    for (from, to, port, protocol, allowed) in rows {
        let verdict = policies.evaluate(
            &cluster,
            at(&cluster, from),
            at(&cluster, to),
            *port,
            *protocol,
        );
        assert_eq!(
            verdict.allowed(),
            *allowed,
            "{from} -> {to}:{port}/{protocol}: {verdict}"
        );
    }
}

#[test]
fn without_policies_everything_is_admitted_and_a_policy_selecting_nothing_isolates_nothing() {
    assert_rows(
        &set(&[]),
        &[
            ("a/client", "a/web", 80, Tcp, true),
            ("192.0.2.10", "b/web", 22, Udp, true),
            ("a/web", "192.0.2.10", 443, Tcp, true),
        ],
    );
    let nothing = np(
        "a",
        "nothing",
        json!({"podSelector": {"matchLabels": {"app": "absent"}}, "policyTypes": ["Ingress", "Egress"]}),
    );
    // A deny-all in namespace b selects b's web only, never a's.
    let b_web = np(
        "b",
        "deny-web",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress", "Egress"]}),
    );
    assert_rows(
        &set(&[nothing, b_web]),
        &[
            ("a/client", "a/web", 80, Tcp, true),
            ("a/web", "a/db", 5432, Tcp, true),
            ("a/client", "b/web", 80, Tcp, false),
            ("b/web", "a/db", 5432, Tcp, false),
            ("b/client", "a/web", 80, Tcp, true),
        ],
    );
}

#[test]
fn policy_types_default_to_ingress_and_to_egress_only_with_egress_rules() {
    // No types, no rules: ingress isolated, egress untouched.
    let bare = np(
        "a",
        "bare",
        json!({"podSelector": {"matchLabels": {"app": "web"}}}),
    );
    assert_rows(
        &set(&[bare]),
        &[
            ("a/client", "a/web", 80, Tcp, false),
            ("a/web", "a/db", 5432, Tcp, true),
            ("a/web", "192.0.2.10", 443, Tcp, true),
        ],
    );
    // Egress only: ingress untouched.
    let egress_only = np(
        "a",
        "egress-only",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"]}),
    );
    assert_rows(
        &set(&[egress_only]),
        &[
            ("a/client", "a/web", 80, Tcp, true),
            ("a/web", "a/db", 5432, Tcp, false),
        ],
    );
    // Egress rules without types: both directions isolated, egress to db only.
    let to_db = np(
        "a",
        "to-db",
        json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}]}]
        }),
    );
    assert_rows(
        &set(&[to_db]),
        &[
            ("a/web", "a/db", 5432, Tcp, true),
            ("a/web", "a/client", 80, Tcp, false),
            ("a/client", "a/web", 80, Tcp, false),
        ],
    );
    // An explicitly empty types list is the default too, and `egress: []` is no rule.
    let empty = np(
        "a",
        "empty",
        json!({"podSelector": {}, "policyTypes": [], "egress": []}),
    );
    assert_rows(
        &set(&[empty]),
        &[
            ("a/web", "a/db", 5432, Tcp, false),
            ("a/web", "192.0.2.10", 443, Tcp, true),
        ],
    );
}

#[test]
fn policies_are_a_union_and_a_deny_all_beside_an_admission_denies_nothing() {
    let from_client = np(
        "a",
        "from-client",
        json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                         "ports": [{"port": 80}]}]
        }),
    );
    let from_db = np(
        "a",
        "from-db",
        json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}],
                         "ports": [{"port": 5432}]}]
        }),
    );
    let deny_all = np(
        "a",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    );
    assert_rows(
        &set(&[from_client.clone(), from_db.clone()]),
        &[
            ("a/client", "a/web", 80, Tcp, true),
            ("a/client", "a/web", 5432, Tcp, false),
            ("a/db", "a/web", 5432, Tcp, true),
            ("a/db", "a/web", 80, Tcp, false),
        ],
    );
    // With the deny-all too, a/client's and a/db's egress is now isolated (and admits nothing),
    // but a/web's ingress still admits what either policy admits.
    let cluster = cluster();
    let policies = set(&[deny_all, from_db, from_client]);
    let verdict = policies.evaluate(
        &cluster,
        Endpoint::Address("10.0.1.3".parse().unwrap()),
        at(&cluster, "a/web"),
        80,
        Tcp,
    );
    assert_eq!(
        verdict.ingress,
        Side::Denied,
        "an address is not a pod: {verdict}"
    );
    let verdict = policies.evaluate(
        &cluster,
        at(&cluster, "a/db"),
        at(&cluster, "a/web"),
        5432,
        Tcp,
    );
    assert_eq!(verdict.egress, Side::Denied);
    assert_eq!(
        verdict.ingress,
        Side::Admitted {
            policy: "a/from-db".to_owned(),
            rule: "spec.ingress[0]".to_owned()
        }
    );
}

#[test]
fn a_connection_between_pods_needs_the_sources_egress_and_the_destinations_ingress() {
    let client_to_db = np(
        "a",
        "client-egress",
        json!({
            "podSelector": {"matchLabels": {"app": "client"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}]}]
        }),
    );
    let web_from_client = np(
        "a",
        "web-ingress",
        json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}]
        }),
    );
    let db_closed = np(
        "a",
        "db-closed",
        json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]}),
    );
    // Egress admits client -> db, db's ingress refuses; web's ingress admits client, client's
    // egress refuses.
    assert_rows(
        &set(&[client_to_db.clone(), web_from_client.clone(), db_closed]),
        &[
            ("a/client", "a/db", 5432, Tcp, false),
            ("a/client", "a/web", 80, Tcp, false),
        ],
    );
    // Without db's closing, client -> db is admitted by both sides.
    let cluster = cluster();
    let both = set(&[client_to_db, web_from_client]);
    let verdict = both.evaluate(
        &cluster,
        at(&cluster, "a/client"),
        at(&cluster, "a/db"),
        5432,
        Tcp,
    );
    assert!(verdict.allowed());
    assert!(matches!(verdict.egress, Side::Admitted { .. }));
    assert_eq!(verdict.ingress, Side::NotIsolated);
}

#[test]
fn peers_by_pod_selector_namespace_selector_both_and_either() {
    let ingress = |from: Value| {
        set(&[np(
            "a",
            "web",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": from}]}),
        )])
    };
    // podSelector alone: the policy's own namespace.
    assert_rows(
        &ingress(json!([{"podSelector": {"matchLabels": {"app": "client"}}}])),
        &[
            ("a/client", "a/web", 80, Tcp, true),
            ("b/client", "a/web", 80, Tcp, false),
            ("a/db", "a/web", 80, Tcp, false),
        ],
    );
    // namespaceSelector alone: every pod of the selected namespaces.
    assert_rows(
        &ingress(json!([{"namespaceSelector": {"matchLabels": {"team": "blue"}}}])),
        &[
            ("b/client", "a/web", 80, Tcp, true),
            ("b/web", "a/web", 80, Tcp, true),
            ("a/client", "a/web", 80, Tcp, false),
            ("c/client", "a/web", 80, Tcp, false),
        ],
    );
    // Both in one peer: the intersection.
    assert_rows(
        &ingress(json!([{
            "namespaceSelector": {"matchLabels": {"team": "blue"}},
            "podSelector": {"matchLabels": {"app": "client"}}
        }])),
        &[
            ("b/client", "a/web", 80, Tcp, true),
            ("b/web", "a/web", 80, Tcp, false),
            ("a/client", "a/web", 80, Tcp, false),
        ],
    );
    // Two peers: either.
    assert_rows(
        &ingress(json!([
            {"namespaceSelector": {"matchLabels": {"team": "blue"}}},
            {"podSelector": {"matchLabels": {"app": "client"}}}
        ])),
        &[
            ("b/web", "a/web", 80, Tcp, true),
            ("a/client", "a/web", 80, Tcp, true),
            ("c/client", "a/web", 80, Tcp, false),
            ("a/db", "a/web", 80, Tcp, false),
        ],
    );
    // An empty namespaceSelector: every pod of every namespace, and never an address.
    assert_rows(
        &ingress(json!([{"namespaceSelector": {}}])),
        &[
            ("c/client", "a/web", 80, Tcp, true),
            ("a/db", "a/web", 80, Tcp, true),
            ("192.0.2.10", "a/web", 80, Tcp, false),
            ("10.0.1.3", "a/web", 80, Tcp, false),
        ],
    );
    // The name label the API server puts on every namespace.
    assert_rows(
        &ingress(
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}}]),
        ),
        &[
            ("c/client", "a/web", 80, Tcp, true),
            ("b/client", "a/web", 80, Tcp, false),
        ],
    );
}

#[test]
fn an_ip_block_matches_its_range_minus_the_excepted_and_pod_addresses_too() {
    let policies = set(&[np(
        "a",
        "web-out",
        json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16", "10.9.9.9/32"]}}]}]
        }),
    )]);
    assert_rows(
        &policies,
        &[
            ("a/web", "10.2.0.1", 80, Tcp, true),
            ("a/web", "10.0.255.255", 80, Tcp, true),
            ("a/web", "10.255.255.255", 80, Tcp, true),
            ("a/web", "10.0.0.0", 80, Tcp, true),
            ("a/web", "10.1.0.0", 80, Tcp, false),
            ("a/web", "10.1.2.3", 80, Tcp, false),
            ("a/web", "10.1.255.255", 80, Tcp, false),
            ("a/web", "10.2.0.0", 80, Tcp, true),
            ("a/web", "10.9.9.9", 80, Tcp, false),
            ("a/web", "10.9.9.10", 80, Tcp, true),
            ("a/web", "11.0.0.0", 80, Tcp, false),
            ("a/web", "9.255.255.255", 80, Tcp, false),
            ("a/web", "2001:db8::1", 80, Tcp, false),
            // A pod's address is matched too (the widest reading).
            ("a/web", "b/client", 80, Tcp, true),
            ("a/web", "node:10.0.0.5", 10250, Tcp, true),
            ("a/web", "node:172.18.0.2", 10250, Tcp, false),
        ],
    );
    // Families never mix; a CIDR with host bits reads as its network.
    let v6 = set(&[np(
        "a",
        "v6",
        json!({
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "::/0"}}, {"ipBlock": {"cidr": "192.0.2.77/24"}}]}]
        }),
    )]);
    assert_rows(
        &v6,
        &[
            ("a/web", "2001:db8::1", 443, Tcp, true),
            ("a/web", "192.0.2.200", 443, Tcp, true),
            ("a/web", "192.0.3.1", 443, Tcp, false),
            ("a/web", "198.51.100.1", 443, Tcp, false),
        ],
    );
}

#[test]
fn ports_default_to_tcp_and_end_port_is_an_inclusive_range() {
    let policies = set(&[np(
        "a",
        "ports",
        json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"ports": [
                {"port": 32000, "endPort": 32768},
                {"protocol": "UDP", "port": 53},
                {"protocol": "SCTP"}
            ]}]
        }),
    )]);
    assert_rows(
        &policies,
        &[
            ("192.0.2.10", "a/web", 31999, Tcp, false),
            ("192.0.2.10", "a/web", 32000, Tcp, true),
            ("192.0.2.10", "a/web", 32500, Tcp, true),
            ("192.0.2.10", "a/web", 32768, Tcp, true),
            ("192.0.2.10", "a/web", 32769, Tcp, false),
            ("192.0.2.10", "a/web", 32000, Udp, false),
            ("192.0.2.10", "a/web", 53, Udp, true),
            ("192.0.2.10", "a/web", 53, Tcp, false),
            ("192.0.2.10", "a/web", 9999, Sctp, true),
            ("192.0.2.10", "a/web", 9999, Udp, false),
        ],
    );
}

#[test]
fn an_empty_from_or_ports_means_every_peer_or_port() {
    for rule in [json!({}), json!({"from": [], "ports": []})] {
        let policies = set(&[np(
            "a",
            "open",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [rule]}),
        )]);
        assert_rows(
            &policies,
            &[
                ("192.0.2.10", "a/web", 1, Udp, true),
                ("b/client", "a/web", 65535, Tcp, true),
                ("a/client", "a/web", 7, Sctp, true),
            ],
        );
    }
    let port_only = set(&[np(
        "a",
        "port-only",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"ports": [{"port": 80}]}]}),
    )]);
    assert_rows(
        &port_only,
        &[
            ("192.0.2.10", "a/web", 80, Tcp, true),
            ("192.0.2.10", "a/web", 81, Tcp, false),
        ],
    );
}

#[test]
fn a_named_port_is_the_destination_pods_container_port() {
    let policies = set(&[
        np(
            "a",
            "web-http",
            json!({
                "podSelector": {"matchLabels": {"app": "web"}},
                // The container's `http` is TCP: a UDP port of that name matches nothing.
                "ingress": [{"ports": [{"port": "http"}, {"protocol": "UDP", "port": "http"}]}]
            }),
        ),
        np(
            "a",
            "client-http",
            json!({
                "podSelector": {"matchLabels": {"app": "client"}},
                "policyTypes": ["Egress"],
                "egress": [{"ports": [{"port": "http"}]}]
            }),
        ),
    ]);
    assert_rows(
        &policies,
        &[
            ("192.0.2.10", "a/web", 8080, Tcp, true),
            ("192.0.2.10", "a/web", 8081, Tcp, false),
            ("192.0.2.10", "a/web", 8080, Udp, false),
            ("a/client", "a/web", 8080, Tcp, true),
            // b/web has no port of that name; an address never has one.
            ("a/client", "b/web", 8080, Tcp, false),
            ("a/client", "192.0.2.10", 8080, Tcp, false),
        ],
    );
}

#[test]
fn selectors_read_match_labels_and_every_expression_operator() {
    // A policy without rules isolates the pods it selects: a/client's ingress shows which.
    let selecting = |selector: Value| {
        set(&[np(
            "a",
            "sel",
            json!({"podSelector": selector, "policyTypes": ["Ingress"]}),
        )])
    };
    let rows = |web: bool, db: bool| {
        [
            ("a/client", "a/web", 80, Tcp, !web),
            ("a/client", "a/db", 80, Tcp, !db),
        ]
    };
    let expression = |operator: &str, values: Value| json!({"matchExpressions": [{"key": "tier", "operator": operator, "values": values}]});
    assert_rows(
        &selecting(expression("In", json!(["front"]))),
        &rows(true, false),
    );
    assert_rows(
        &selecting(expression("In", json!(["back"]))),
        &rows(false, false),
    );
    // NotIn holds where the key is absent.
    assert_rows(
        &selecting(expression("NotIn", json!(["front"]))),
        &rows(false, true),
    );
    assert_rows(
        &selecting(expression("Exists", json!(null))),
        &rows(true, false),
    );
    assert_rows(
        &selecting(expression("DoesNotExist", json!(null))),
        &rows(false, true),
    );
    // matchLabels and matchExpressions together: both hold.
    assert_rows(
        &selecting(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]
        })),
        &rows(false, false),
    );
    assert_rows(&selecting(json!({})), &rows(true, true));
}

#[test]
fn ingress_from_the_pods_own_node_is_always_admitted_and_egress_to_it_is_judged() {
    let closed = set(&[np(
        "a",
        "closed",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    )]);
    let cluster = cluster();
    let verdict = closed.evaluate(
        &cluster,
        at(&cluster, "node:172.18.0.2"),
        at(&cluster, "a/web"),
        8080,
        Tcp,
    );
    assert_eq!(verdict.ingress, Side::LocalNode);
    assert!(verdict.allowed());
    assert_rows(
        &closed,
        &[
            ("a/web", "node:172.18.0.2", 10250, Tcp, false),
            ("172.18.0.2", "a/web", 8080, Tcp, false),
        ],
    );
}

#[test]
fn what_the_api_server_refuses_is_refused_naming_the_policy_and_field() {
    let cases: [(Value, &str); 15] = [
        (
            json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}),
            "spec.ingress[0].from[0]",
        ),
        (
            json!({"ingress": [{"from": [{}]}]}),
            "spec.ingress[0].from[0]",
        ),
        (
            json!({"ingress": [{"ports": [{"protocol": "tcp", "port": 80}]}]}),
            "spec.ingress[0].ports[0].protocol",
        ),
        (
            json!({"ingress": [{"ports": [{"port": 90, "endPort": 80}]}]}),
            "spec.ingress[0].ports[0].endPort",
        ),
        (
            json!({"ingress": [{"ports": [{"port": "http", "endPort": 80}]}]}),
            "spec.ingress[0].ports[0].endPort",
        ),
        (
            json!({"ingress": [{"ports": [{"endPort": 80}]}]}),
            "spec.ingress[0].ports[0].endPort",
        ),
        (
            json!({"egress": [{"ports": [{"port": 0}]}]}),
            "spec.egress[0].ports[0].port",
        ),
        (
            json!({"egress": [{"ports": [{"port": 65536}]}]}),
            "spec.egress[0].ports[0].port",
        ),
        (
            json!({"egress": [{"ports": [{"port": "HTTP"}]}]}),
            "spec.egress[0].ports[0].port",
        ),
        (
            json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}]}]}),
            "spec.egress[0].to[0].ipBlock.except[0]",
        ),
        (
            json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}]}]}),
            "spec.egress[0].to[0].ipBlock.except[0]",
        ),
        (
            json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}),
            "spec.egress[0].to[0].ipBlock.cidr",
        ),
        (
            json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "in", "values": ["x"]}]}}),
            "spec.podSelector.matchExpressions[0].operator",
        ),
        (
            json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}),
            "spec.podSelector.matchExpressions[0].values",
        ),
        (json!({"policyTypes": ["Ingres"]}), "spec.policyTypes[0]"),
    ];
    for (spec, field) in cases {
        let error: Invalid = PolicySet::new(&[np("a", "bad", spec.clone())]).unwrap_err();
        assert_eq!(error.policy, "a/bad", "{spec}");
        assert_eq!(error.field, field, "{spec}: {error}");
        assert!(error.to_string().contains(field));
    }
    let exists_with_values = json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}});
    assert!(PolicySet::new(&[np("a", "bad", exists_with_values)]).is_err());
    let mut no_namespace = np("a", "nowhere", json!({}));
    no_namespace.metadata.namespace = None;
    let error = PolicySet::new(&[no_namespace]).unwrap_err();
    assert_eq!(error.field, "metadata.namespace");
}

#[test]
fn policies_are_found_in_lists_and_other_kinds_are_skipped() {
    let policy = serde_json::to_value(np("a", "one", json!({}))).unwrap();
    let document = json!([
        {"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}},
            policy.clone()
        ]},
        policy,
        {"apiVersion": "v1", "kind": "ConfigMap"}
    ]);
    let found = network_policies_in(&document).unwrap();
    assert_eq!(found.len(), 2);
    assert!(
        found
            .iter()
            .all(|p| p.metadata.name.as_deref() == Some("one"))
    );
    let broken =
        json!({"kind": "NetworkPolicy", "metadata": {"name": "x"}, "spec": {"podSelector": 3}});
    assert!(
        network_policies_in(&broken)
            .unwrap_err()
            .contains("NetworkPolicy x")
    );
}
