//! ISO-5, BROW-7 and EGR-8 on Kubernetes: the NetworkPolicies that bound worker pods (decision
//! 0031), how Kubernetes reads any set of NetworkPolicies ([`eval`]), and the table of
//! connections they must admit and deny ([`conformance`]).
//!
//! [`network_policies`] renders two policies for the workers' namespace:
//! - [`NAMESPACE_DENY_POLICY`] selects every pod there and admits nothing, so a pod that is not a
//!   labelled worker (a claim template without the labels, anything else put there) has no
//!   network at all instead of an unbounded one;
//! - [`WORKERS_POLICY`] selects every Corral worker of every pool. Ingress: the API's pods on the
//!   control and browser ports, the controller's pods on the control port, both selected by name
//!   in this system's namespace; never another worker (BROW-7). Egress: the egress proxy, the TURN
//!   authority over UDP and plain TCP, and the API's package broker, and nothing else (ISO-5) —
//!   or nothing at all when egress is [`WorkerEgress::Denied`] (`isolated`, no field key, no
//!   proxy: EGR-8). Both forms have the same name, so applying one replaces the other: a second,
//!   deny-all policy beside an admitting one would deny nothing, policies being a union.
//!
//! No DNS: a worker is given addresses, not names. `corral controller network-policy` prints the
//! set for the operator to apply.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::kube::{
    API_NAME, BROWSER_PORT, CONTROL_PORT, CONTROLLER_NAME, EGRESS_PROXY_NAME, LABEL_NAME,
    LABEL_NAMESPACE_NAME, LABEL_PART_OF, PART_OF, TURN_NAME, WORKER_NAME,
};

pub mod conformance;
pub mod eval;

/// The policy that isolates every pod of the workers' namespace and admits nothing.
pub const NAMESPACE_DENY_POLICY: &str = "corral-workers-namespace-deny";
/// The policy that admits the workers' own traffic (one for every pool).
pub const WORKERS_POLICY: &str = "corral-workers";

/// Where a worker reaches one of its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// This system's own pods of that role, in its namespace, at this port of the pods. A Service
    /// in front of them changes nothing: policies judge the pods after the Service's address
    /// translation, so the port is the pods' (the Service's target port).
    Pods(u16),
    /// One address outside the cluster, exactly (a /32 or /128), at this port.
    Address(SocketAddr),
    /// Both: the pods, and one address, at the address's port. For an in-cluster server behind
    /// a load balancer whose address workers dial: kube-proxy usually translates that address to
    /// the pods inside the cluster, but not when the load balancer proxies itself (`ipMode:
    /// Proxy`), and then the policy sees the address.
    PodsAnd(SocketAddr),
}

impl Reach {
    /// The port.
    #[must_use]
    pub fn port(self) -> u16 {
        match self {
            Self::Pods(port) => port,
            Self::Address(address) | Self::PodsAnd(address) => address.port(),
        }
    }
}

/// `pods:PORT` ([`Reach::Pods`]), `IP:PORT` / `[IPv6]:PORT` ([`Reach::Address`]), or
/// `pods+IP:PORT` ([`Reach::PodsAnd`]).
impl FromStr for Reach {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let address = |rest: &str| {
            rest.parse::<SocketAddr>().map_err(|_| {
                format!(
                    "{text:?}: expected pods:PORT, IP:PORT or pods+IP:PORT (an address, not a name)"
                )
            })
        };
        let reach =
            if let Some(port) = text.strip_prefix("pods:") {
                Self::Pods(port.parse().map_err(|_| {
                    format!("{text:?}: expected pods:PORT with a port from 1 to 65535")
                })?)
            } else if let Some(rest) = text.strip_prefix("pods+") {
                Self::PodsAnd(address(rest)?)
            } else {
                Self::Address(address(text)?)
            };
        if reach.port() == 0 {
            return Err(format!("{text:?}: port 0"));
        }
        Ok(reach)
    }
}

impl fmt::Display for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pods(port) => write!(f, "pods:{port}"),
            Self::Address(address) => write!(f, "{address}"),
            Self::PodsAnd(address) => write!(f, "pods+{address}"),
        }
    }
}

/// Where a worker may connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerPeers {
    /// The egress proxy (TCP): [`EGRESS_PROXY_NAME`]'s pods or an address.
    pub proxy: Reach,
    /// The TURN authority (UDP and TCP): [`TURN_NAME`]'s pods or an address.
    pub turn: Reach,
    /// The API's package broker (TCP): [`API_NAME`]'s pods or an address.
    pub broker: Reach,
}

/// What a worker's egress is at the deployment layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerEgress {
    /// Nothing: egress is `isolated`, or has no field key or no proxy (EGR-8).
    Denied,
    /// The proxy, the TURN authority and the broker, and nothing else (ISO-5).
    Admitted(WorkerPeers),
}

/// What the policies need to know about a deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployment {
    /// The namespace of the worker pods (and of the policies); nothing else runs there
    /// (decision 0007).
    pub workers_namespace: String,
    /// The namespace of the API, the controller, the egress proxy and an in-cluster TURN server.
    pub system_namespace: String,
    /// The workers' egress.
    pub egress: WorkerEgress,
}

impl Deployment {
    /// Checks what would make the policies wrong or refused.
    ///
    /// # Errors
    /// A namespace that is not a DNS label, the same namespace for workers and the system (the
    /// namespace's deny-all would cut the system off), or a port 0.
    pub fn validate(&self) -> Result<(), String> {
        for (what, name) in [
            ("workers'", &self.workers_namespace),
            ("system's", &self.system_namespace),
        ] {
            if !is_dns_label(name) {
                return Err(format!("the {what} namespace {name:?} is not a DNS label"));
            }
        }
        if self.workers_namespace == self.system_namespace {
            return Err(format!(
                "workers and the system share namespace {:?}: workers need a namespace of their own (decision 0007), which the policies deny everything by default",
                self.workers_namespace
            ));
        }
        if let WorkerEgress::Admitted(peers) = &self.egress {
            for (what, reach) in [
                ("proxy", peers.proxy),
                ("TURN", peers.turn),
                ("broker", peers.broker),
            ] {
                if reach.port() == 0 {
                    return Err(format!("the {what}'s port is 0"));
                }
            }
        }
        Ok(())
    }
}

/// True for a DNS-1123 label: 1 to 63 lowercase letters, digits and inner hyphens.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Every policy the deployment needs, in the order to apply them.
///
/// # Errors
/// As [`Deployment::validate`].
pub fn network_policies(deployment: &Deployment) -> Result<Vec<NetworkPolicy>, String> {
    deployment.validate()?;
    Ok(vec![
        namespace_deny_policy(&deployment.workers_namespace),
        workers_policy(deployment),
    ])
}

/// `policies` as one `List` object, for `kubectl apply -f -`.
#[must_use]
pub fn policy_list(policies: &[NetworkPolicy]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": policies,
    })
}

fn metadata(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(BTreeMap::from([(
            LABEL_PART_OF.to_owned(),
            PART_OF.to_owned(),
        )])),
        ..ObjectMeta::default()
    }
}

fn labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect(),
        ),
        match_expressions: None,
    }
}

/// [`NAMESPACE_DENY_POLICY`]: every pod of `workers_namespace` isolated both ways, nothing
/// admitted.
#[must_use]
pub fn namespace_deny_policy(workers_namespace: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: metadata(workers_namespace, NAMESPACE_DENY_POLICY),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: None,
            egress: None,
        }),
    }
}

/// The pods named `name` (by [`LABEL_NAME`]) of this system, in `system_namespace`.
fn system_pods(system_namespace: &str, name: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(labels(&[(LABEL_NAMESPACE_NAME, system_namespace)])),
        pod_selector: Some(labels(&[(LABEL_NAME, name), (LABEL_PART_OF, PART_OF)])),
        ip_block: None,
    }
}

fn port(protocol: &str, number: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.to_owned()),
        port: Some(IntOrString::Int(i32::from(number))),
        end_port: None,
    }
}

/// One address exactly.
fn host(address: SocketAddr) -> String {
    match address {
        SocketAddr::V4(v4) => format!("{}/32", v4.ip()),
        SocketAddr::V6(v6) => format!("{}/128", v6.ip()),
    }
}

/// Egress to `reach` (pods named `name` in `system_namespace`, or an address) over `protocols`.
fn egress_to(
    system_namespace: &str,
    name: &str,
    reach: Reach,
    protocols: &[&str],
) -> NetworkPolicyEgressRule {
    let address = |address| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: host(address),
            except: None,
        }),
        ..NetworkPolicyPeer::default()
    };
    let peers = match reach {
        Reach::Pods(_) => vec![system_pods(system_namespace, name)],
        Reach::Address(at) => vec![address(at)],
        Reach::PodsAnd(at) => vec![system_pods(system_namespace, name), address(at)],
    };
    NetworkPolicyEgressRule {
        to: Some(peers),
        ports: Some(
            protocols
                .iter()
                .map(|protocol| port(protocol, reach.port()))
                .collect(),
        ),
    }
}

/// [`WORKERS_POLICY`]: what every worker of `deployment` may receive and send.
#[must_use]
pub fn workers_policy(deployment: &Deployment) -> NetworkPolicy {
    let system = deployment.system_namespace.as_str();
    let ingress = vec![
        // The API: runs, resets and sessions on the control port; the browser adapter's port.
        NetworkPolicyIngressRule {
            from: Some(vec![system_pods(system, API_NAME)]),
            ports: Some(vec![port("TCP", CONTROL_PORT), port("TCP", BROWSER_PORT)]),
        },
        // The controller: resets, on the control port only.
        NetworkPolicyIngressRule {
            from: Some(vec![system_pods(system, CONTROLLER_NAME)]),
            ports: Some(vec![port("TCP", CONTROL_PORT)]),
        },
    ];
    let egress = match &deployment.egress {
        // No rule, with Egress in the policy's types: nothing leaves a worker.
        WorkerEgress::Denied => None,
        WorkerEgress::Admitted(peers) => Some(vec![
            egress_to(system, EGRESS_PROXY_NAME, peers.proxy, &["TCP"]),
            egress_to(system, TURN_NAME, peers.turn, &["UDP", "TCP"]),
            egress_to(system, API_NAME, peers.broker, &["TCP"]),
        ]),
    };
    NetworkPolicy {
        metadata: metadata(&deployment.workers_namespace, WORKERS_POLICY),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(labels(&[
                (LABEL_NAME, WORKER_NAME),
                (LABEL_PART_OF, PART_OF),
            ])),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: Some(ingress),
            egress,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(egress: WorkerEgress) -> Deployment {
        Deployment {
            workers_namespace: "corral".to_owned(),
            system_namespace: "corral-system".to_owned(),
            egress,
        }
    }

    const PEERS: WorkerPeers = WorkerPeers {
        proxy: Reach::Pods(3128),
        turn: Reach::Address(SocketAddr::V4(std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::new(203, 0, 113, 10),
            3478,
        ))),
        broker: Reach::Pods(8000),
    };

    #[test]
    fn iso_05_reach_reads_pods_or_one_address_and_refuses_names() {
        assert_eq!("pods:3128".parse::<Reach>(), Ok(Reach::Pods(3128)));
        assert_eq!(
            "10.0.0.1:3478".parse::<Reach>(),
            Ok(Reach::Address("10.0.0.1:3478".parse().unwrap()))
        );
        assert_eq!(
            "[2001:db8::5]:3478".parse::<Reach>(),
            Ok(Reach::Address("[2001:db8::5]:3478".parse().unwrap()))
        );
        assert_eq!(
            "pods+192.0.2.30:3478".parse::<Reach>(),
            Ok(Reach::PodsAnd("192.0.2.30:3478".parse().unwrap()))
        );
        for bad in [
            "proxy:3128",
            "pods:",
            "pods:0",
            "10.0.0.1:0",
            "3128",
            "pods:70000",
            "pods+3478",
            "pods+turn.example:3478",
        ] {
            assert!(bad.parse::<Reach>().is_err(), "{bad}");
        }
        for reach in [
            Reach::Pods(8000),
            PEERS.turn,
            Reach::PodsAnd("[2001:db8::5]:3478".parse().unwrap()),
        ] {
            assert_eq!(reach.to_string().parse::<Reach>(), Ok(reach));
        }
    }

    #[test]
    fn iso_05_an_address_is_one_host_and_pods_are_selected_in_the_system_namespace() {
        let policy = workers_policy(&deployment(WorkerEgress::Admitted(PEERS)));
        let value = serde_json::to_value(&policy).unwrap();
        assert_eq!(value["kind"], "NetworkPolicy");
        assert_eq!(value["metadata"]["namespace"], "corral");
        let egress = &value["spec"]["egress"];
        assert_eq!(egress.as_array().unwrap().len(), 3);
        let proxy = &egress[0]["to"][0];
        assert_eq!(
            proxy["namespaceSelector"]["matchLabels"][LABEL_NAMESPACE_NAME],
            "corral-system"
        );
        assert_eq!(
            proxy["podSelector"]["matchLabels"][LABEL_NAME],
            EGRESS_PROXY_NAME
        );
        assert_eq!(egress[1]["to"][0]["ipBlock"]["cidr"], "203.0.113.10/32");
        assert_eq!(
            egress[1]["ports"],
            serde_json::json!([
                {"protocol": "UDP", "port": 3478},
                {"protocol": "TCP", "port": 3478}
            ])
        );
        let both = WorkerPeers {
            turn: "pods+192.0.2.30:3478".parse().unwrap(),
            ..PEERS
        };
        let value = serde_json::to_value(workers_policy(&deployment(WorkerEgress::Admitted(both))))
            .unwrap();
        let to = &value["spec"]["egress"][1]["to"];
        assert_eq!(to[0]["podSelector"]["matchLabels"][LABEL_NAME], TURN_NAME);
        assert_eq!(to[1]["ipBlock"]["cidr"], "192.0.2.30/32");
        assert_eq!(to.as_array().unwrap().len(), 2);
        let v6 = WorkerPeers {
            turn: "[2001:db8::5]:3478".parse().unwrap(),
            ..PEERS
        };
        let value =
            serde_json::to_value(workers_policy(&deployment(WorkerEgress::Admitted(v6)))).unwrap();
        assert_eq!(
            value["spec"]["egress"][1]["to"][0]["ipBlock"]["cidr"],
            "2001:db8::5/128"
        );
    }

    #[test]
    fn egr_08_denied_egress_is_the_same_object_with_egress_typed_and_no_rule() {
        let admitted = workers_policy(&deployment(WorkerEgress::Admitted(PEERS)));
        let denied = workers_policy(&deployment(WorkerEgress::Denied));
        // Same name and namespace: applying one replaces the other.
        assert_eq!(admitted.metadata, denied.metadata);
        let spec = denied.spec.unwrap();
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_owned(), "Egress".to_owned()])
        );
        assert_eq!(spec.egress, None);
        assert_eq!(spec.ingress, admitted.spec.unwrap().ingress);
    }

    #[test]
    fn iso_05_a_deployment_that_would_break_or_be_refused_is_refused() {
        let mut shared = deployment(WorkerEgress::Denied);
        shared.system_namespace = shared.workers_namespace.clone();
        assert!(
            network_policies(&shared)
                .unwrap_err()
                .contains("share namespace")
        );
        for bad in ["", "Corral", "-corral", "corral_", &"a".repeat(64)] {
            let mut d = deployment(WorkerEgress::Denied);
            d.workers_namespace = bad.to_owned();
            assert!(d.validate().is_err(), "{bad:?}");
        }
        let zero = deployment(WorkerEgress::Admitted(WorkerPeers {
            broker: Reach::Pods(0),
            ..PEERS
        }));
        assert!(zero.validate().unwrap_err().contains("broker"));
        let set = network_policies(&deployment(WorkerEgress::Admitted(PEERS))).unwrap();
        let names: Vec<_> = set
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, [NAMESPACE_DENY_POLICY, WORKERS_POLICY]);
        let list = policy_list(&set);
        assert_eq!(list["kind"], "List");
        assert_eq!(list["items"][1]["metadata"]["name"], WORKERS_POLICY);
    }
}
