//! ISO-5 on Kubernetes: the NetworkPolicy that bounds a pool's worker pods. A worker reaches the
//! egress proxy, the one TURN authority's exact address over UDP and plain TCP (the live view's
//! relay, BROW-9), and the API's package broker, and nothing else; ingress reaches its control
//! port and its browser port only from this system's own pods, never from another worker.
//!
//! The specification leaves the policy to the platform's operator, who confirms it rather than
//! inheriting it; `corral controller network-policy` prints this one for them to apply.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::kube::{
    BROWSER_PORT, CONTROL_PORT, LABEL_NAME, LABEL_PART_OF, LABEL_POOL, PART_OF, WORKER_NAME,
};

/// Where a pool's workers may connect (addresses, not names: a policy admits addresses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerNetwork {
    /// The egress proxy (TCP).
    pub proxy: SocketAddr,
    /// The TURN authority (UDP and TCP).
    pub turn: SocketAddr,
    /// The API's package broker (TCP).
    pub broker: SocketAddr,
}

fn host(address: SocketAddr) -> String {
    match address {
        SocketAddr::V4(v4) => format!("{}/32", v4.ip()),
        SocketAddr::V6(v6) => format!("{}/128", v6.ip()),
    }
}

fn port(protocol: &str, number: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.to_owned()),
        port: Some(IntOrString::Int(i32::from(number))),
        end_port: None,
    }
}

fn to(address: SocketAddr, protocols: &[&str]) -> NetworkPolicyEgressRule {
    NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: host(address),
                except: None,
            }),
            ..NetworkPolicyPeer::default()
        }]),
        ports: Some(
            protocols
                .iter()
                .map(|protocol| port(protocol, address.port()))
                .collect(),
        ),
    }
}

/// The policy for `pool`'s workers in `namespace`.
#[must_use]
pub fn worker_network_policy(
    namespace: &str,
    pool: &str,
    network: &WorkerNetwork,
) -> NetworkPolicy {
    let workers = BTreeMap::from([
        (LABEL_NAME.to_owned(), WORKER_NAME.to_owned()),
        (LABEL_POOL.to_owned(), pool.to_owned()),
    ]);
    // This system's own pods (the API, the controller), which are not workers.
    let own = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            LABEL_PART_OF.to_owned(),
            PART_OF.to_owned(),
        )])),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: LABEL_NAME.to_owned(),
            operator: "NotIn".to_owned(),
            values: Some(vec![WORKER_NAME.to_owned()]),
        }]),
    };
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(format!("corral-workers-{pool}")),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                LABEL_PART_OF.to_owned(),
                PART_OF.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(workers),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(own),
                    ..NetworkPolicyPeer::default()
                }]),
                ports: Some(vec![port("TCP", CONTROL_PORT), port("TCP", BROWSER_PORT)]),
            }]),
            egress: Some(vec![
                to(network.proxy, &["TCP"]),
                to(network.turn, &["UDP", "TCP"]),
                to(network.broker, &["TCP"]),
            ]),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_05_brow_09_a_worker_reaches_the_proxy_the_turn_authority_over_udp_and_tcp_and_the_broker_only()
     {
        let network = WorkerNetwork {
            proxy: "10.0.0.10:3128".parse().unwrap(),
            turn: "10.0.0.20:3478".parse().unwrap(),
            broker: "10.0.0.30:8000".parse().unwrap(),
        };
        let policy = worker_network_policy("corral", "default", &network);
        let value = serde_json::to_value(&policy).unwrap();
        let spec = &value["spec"];
        assert_eq!(
            spec["policyTypes"],
            serde_json::json!(["Ingress", "Egress"])
        );
        assert_eq!(spec["podSelector"]["matchLabels"][LABEL_NAME], WORKER_NAME);
        assert_eq!(spec["podSelector"]["matchLabels"][LABEL_POOL], "default");
        // Egress: exactly three destinations, each one address, with its protocols.
        let egress: Vec<(String, Vec<(String, i64)>)> = spec["egress"]
            .as_array()
            .unwrap()
            .iter()
            .map(|rule| {
                let to = rule["to"].as_array().unwrap();
                assert_eq!(to.len(), 1, "{rule}");
                let ports = rule["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        (
                            p["protocol"].as_str().unwrap().to_owned(),
                            p["port"].as_i64().unwrap(),
                        )
                    })
                    .collect();
                (to[0]["ipBlock"]["cidr"].as_str().unwrap().to_owned(), ports)
            })
            .collect();
        assert_eq!(
            egress,
            [
                ("10.0.0.10/32".to_owned(), vec![("TCP".to_owned(), 3128)]),
                (
                    "10.0.0.20/32".to_owned(),
                    vec![("UDP".to_owned(), 3478), ("TCP".to_owned(), 3478)]
                ),
                ("10.0.0.30/32".to_owned(), vec![("TCP".to_owned(), 8000)]),
            ]
        );
        assert!(
            value.to_string().matches("ipBlock").count() == 3,
            "no other destination"
        );
        // Ingress: only this system's pods that are not workers, on the two worker ports.
        let ingress = spec["ingress"].as_array().unwrap();
        assert_eq!(ingress.len(), 1);
        let from = &ingress[0]["from"][0]["podSelector"];
        assert_eq!(from["matchLabels"][LABEL_PART_OF], PART_OF);
        assert_eq!(from["matchExpressions"][0]["operator"], "NotIn");
        assert_eq!(
            from["matchExpressions"][0]["values"],
            serde_json::json!([WORKER_NAME])
        );
        let ports: Vec<i64> = ingress[0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["port"].as_i64().unwrap())
            .collect();
        assert_eq!(ports, [i64::from(CONTROL_PORT), i64::from(BROWSER_PORT)]);
        // An IPv6 authority is one address too.
        let v6 = WorkerNetwork {
            turn: "[2001:db8::5]:3478".parse().unwrap(),
            ..network
        };
        let value = serde_json::to_value(worker_network_policy("corral", "default", &v6)).unwrap();
        assert_eq!(
            value["spec"]["egress"][1]["to"][0]["ipBlock"]["cidr"],
            "2001:db8::5/128"
        );
    }
}
