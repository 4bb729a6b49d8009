//! The connections a deployment's NetworkPolicies must admit and deny (ISO-5, BROW-7, EGR-8), as
//! a table over a modelled cluster with every kind of peer a worker meets.
//!
//! Every row's two expectations — with the workers' egress admitted, and with it denied (EGR-8)
//! — are written by hand from the requirements, never computed. [`check`] judges any policies
//! (rendered, or read from a manifest) with [`super::eval`] and lists every row they get wrong,
//! with the policy and rule that admitted what should be denied.
//!
//! The model: this system's namespace (API, controller, egress proxy, Valkey, coturn), the
//! workers' namespace (two workers of pool `p1`, one of a gVisor pool, made by
//! [`crate::kube::worker_pod`], and a stray unlabelled pod), `kube-system` (DNS), a tenant's
//! namespace with an impostor pod labelled as the API, the worker's node, the cloud metadata
//! address, an internet address, and the TURN authority (coturn's pod or an outside address, as
//! configured) with an address beside it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use corral_core::ids::{ImageId, WorkerId};

use super::eval::{Cluster, Endpoint, PolicySet, Protocol, Verdict};
use super::{Reach, WorkerPeers};
use crate::kube::{
    API_NAME, BROWSER_PORT, CONTROL_PORT, CONTROLLER_NAME, EGRESS_PROXY_NAME, KubeSettings,
    LABEL_NAME, LABEL_PART_OF, PART_OF, TURN_NAME, VALKEY_NAME, worker_pod,
};

/// A party in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// The API's pod.
    Api,
    /// The controller's pod.
    Controller,
    /// The egress proxy, as configured: its pod, or an outside address.
    EgressProxy,
    /// The package broker, as configured: the API's pod, or an outside address.
    Broker,
    /// Valkey's pod.
    Valkey,
    /// The TURN authority, as configured: coturn's pod, or an outside address.
    Turn,
    /// An address next to the TURN authority's (outside the cluster).
    TurnNeighbour,
    /// A worker of pool `p1`.
    WorkerA,
    /// Another worker of pool `p1`.
    WorkerB,
    /// A worker of a gVisor pool (runtime class `gvisor`).
    WorkerGvisor,
    /// An unlabelled pod in the workers' namespace.
    Stray,
    /// A pod in a tenant's namespace carrying the API's labels.
    Impostor,
    /// The cluster's DNS pod in `kube-system`.
    Dns,
    /// The workers' node (its kubelet).
    Node,
    /// The cloud metadata address, 169.254.169.254.
    Metadata,
    /// An address on the internet.
    Internet,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::Api => "api",
            Self::Controller => "controller",
            Self::EgressProxy => "egress-proxy",
            Self::Broker => "broker",
            Self::Valkey => "valkey",
            Self::Turn => "turn",
            Self::TurnNeighbour => "turn-neighbour",
            Self::WorkerA => "worker-a",
            Self::WorkerB => "worker-b",
            Self::WorkerGvisor => "worker-gvisor",
            Self::Stray => "stray",
            Self::Impostor => "impostor",
            Self::Dns => "dns",
            Self::Node => "node",
            Self::Metadata => "metadata",
            Self::Internet => "internet",
        };
        f.write_str(name)
    }
}

/// A port of a case: a configured one, or a fixed number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortOf {
    /// The egress proxy's.
    Proxy,
    /// The broker's.
    Broker,
    /// The TURN authority's.
    Turn,
    /// One above the TURN authority's.
    AfterTurn,
    /// One above the egress proxy's.
    AfterProxy,
    /// The worker's control port (8091).
    Control,
    /// The worker's browser port (8080).
    Browser,
    /// This number.
    Number(u16),
}

/// What a case must come to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Admitted.
    Allow,
    /// Refused.
    Deny,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The source.
    pub from: Role,
    /// The destination.
    pub to: Role,
    /// The destination port.
    pub port: PortOf,
    /// The protocol.
    pub protocol: Protocol,
    /// With the workers' egress admitted (ISO-5).
    pub admitted: Expect,
    /// With the workers' egress denied (`isolated`, no field key, no proxy: EGR-8).
    pub denied: Expect,
    /// Why, with the requirement.
    pub why: &'static str,
}

const fn row(
    from: Role,
    to: Role,
    port: PortOf,
    protocol: Protocol,
    admitted: Expect,
    denied: Expect,
    why: &'static str,
) -> Case {
    Case {
        from,
        to,
        port,
        protocol,
        admitted,
        denied,
        why,
    }
}

use Expect::{Allow, Deny};
use PortOf::{AfterProxy, AfterTurn, Browser, Control, Number};
use Protocol::{Sctp, Tcp, Udp};
use Role::{
    Api, Broker, Controller, Dns, EgressProxy, Impostor, Internet, Metadata, Node, Stray, Turn,
    TurnNeighbour, Valkey, WorkerA, WorkerB, WorkerGvisor,
};

/// The table. Columns: source, destination, port, protocol, with egress admitted, with egress
/// denied, why.
#[rustfmt::skip]
pub const CASES: &[Case] = &[
    // A worker's egress (ISO-5; EGR-8 in the second column).
    row(WorkerA, EgressProxy, PortOf::Proxy, Tcp, Allow, Deny, "ISO-5: the egress proxy"),
    row(WorkerA, EgressProxy, PortOf::Proxy, Udp, Deny, Deny, "ISO-5: the proxy over TCP only"),
    row(WorkerA, EgressProxy, AfterProxy, Tcp, Deny, Deny, "ISO-5: the proxy's port only"),
    row(WorkerA, EgressProxy, Number(80), Tcp, Deny, Deny, "ISO-5: the proxy's port only"),
    row(WorkerA, Broker, PortOf::Broker, Tcp, Allow, Deny, "ISO-5: the API's package broker"),
    row(WorkerA, Broker, PortOf::Broker, Udp, Deny, Deny, "ISO-5: the broker over TCP only"),
    row(WorkerA, Api, Control, Tcp, Deny, Deny, "ISO-5: the API's broker port only"),
    row(WorkerA, Controller, Browser, Tcp, Deny, Deny, "ISO-5: not the controller"),
    row(WorkerA, Valkey, Number(6379), Tcp, Deny, Deny, "ISO-5: not Valkey, which holds every lease"),
    row(WorkerA, Turn, PortOf::Turn, Udp, Allow, Deny, "ISO-5: the TURN authority over UDP"),
    row(WorkerA, Turn, PortOf::Turn, Tcp, Allow, Deny, "ISO-5: the TURN authority over plain TCP"),
    row(WorkerA, Turn, PortOf::Turn, Sctp, Deny, Deny, "ISO-5: TURN over UDP and TCP only"),
    row(WorkerA, Turn, AfterTurn, Udp, Deny, Deny, "ISO-5: the authority's exact port"),
    row(WorkerA, Turn, AfterTurn, Tcp, Deny, Deny, "ISO-5: the authority's exact port"),
    row(WorkerA, Turn, Number(5349), Tcp, Deny, Deny, "ISO-5: not the TURN server's TLS port"),
    row(WorkerA, Turn, Number(49152), Udp, Deny, Deny, "ISO-5: relay ports are the viewers'"),
    row(WorkerA, TurnNeighbour, PortOf::Turn, Udp, Deny, Deny, "ISO-5: the authority's exact address"),
    row(WorkerA, Internet, Number(443), Tcp, Deny, Deny, "ISO-5: never the internet directly"),
    row(WorkerA, Internet, Number(80), Tcp, Deny, Deny, "ISO-5: never the internet directly"),
    row(WorkerA, Internet, Number(53), Udp, Deny, Deny, "ISO-5: no outside resolver"),
    row(WorkerA, Metadata, Number(80), Tcp, Deny, Deny, "ISO-5: never the cloud's metadata service"),
    row(WorkerA, Dns, Number(53), Udp, Deny, Deny, "ISO-5: no DNS; workers are given addresses"),
    row(WorkerA, Dns, Number(53), Tcp, Deny, Deny, "ISO-5: no DNS; workers are given addresses"),
    row(WorkerA, WorkerB, Control, Tcp, Deny, Deny, "BROW-7: never another worker"),
    row(WorkerA, WorkerB, Browser, Tcp, Deny, Deny, "BROW-7: never another worker"),
    row(WorkerA, WorkerGvisor, Control, Tcp, Deny, Deny, "BROW-7: never another pool's worker"),
    row(WorkerA, Node, Number(10250), Tcp, Deny, Deny, "ISO-5: not the kubelet"),
    row(WorkerA, Impostor, PortOf::Broker, Tcp, Deny, Deny, "ISO-5: API labels elsewhere are not the broker"),
    row(WorkerA, Stray, Number(80), Tcp, Deny, Deny, "ISO-5: nothing else in the namespace"),
    row(WorkerB, Broker, PortOf::Broker, Tcp, Allow, Deny, "ISO-5: every worker of the pool"),
    row(WorkerGvisor, EgressProxy, PortOf::Proxy, Tcp, Allow, Deny, "ISO-3: a gVisor worker's egress is the same"),
    row(WorkerGvisor, Turn, PortOf::Turn, Udp, Allow, Deny, "ISO-3: a gVisor worker's egress is the same"),
    row(WorkerGvisor, Internet, Number(443), Tcp, Deny, Deny, "ISO-3: a gVisor worker's egress is the same"),
    // A worker's ingress (BROW-7).
    row(Api, WorkerA, Control, Tcp, Allow, Allow, "BROW-7: the API on the control port"),
    row(Api, WorkerA, Browser, Tcp, Allow, Allow, "BROW-7: the API on the browser port"),
    row(Api, WorkerA, Control, Udp, Deny, Deny, "BROW-7: over TCP only"),
    row(Api, WorkerA, Number(22), Tcp, Deny, Deny, "BROW-7: the two worker ports only"),
    row(Api, WorkerB, Browser, Tcp, Allow, Allow, "BROW-7: the API reaches every worker"),
    row(Api, WorkerGvisor, Control, Tcp, Allow, Allow, "ISO-3: a gVisor worker is reached the same"),
    row(Controller, WorkerA, Control, Tcp, Allow, Allow, "ISO-2: the controller resets workers"),
    row(Controller, WorkerGvisor, Control, Tcp, Allow, Allow, "ISO-3: a gVisor worker is reset the same"),
    row(Controller, WorkerA, Browser, Tcp, Deny, Deny, "BROW-7: the controller needs the control port only"),
    row(EgressProxy, WorkerA, Control, Tcp, Deny, Deny, "BROW-7: the API and the controller only"),
    row(Valkey, WorkerA, Control, Tcp, Deny, Deny, "BROW-7: the API and the controller only"),
    row(Turn, WorkerA, Browser, Tcp, Deny, Deny, "BROW-7: TURN answers, never calls"),
    row(WorkerB, WorkerA, Control, Tcp, Deny, Deny, "BROW-7: never from another worker"),
    row(WorkerB, WorkerA, Browser, Tcp, Deny, Deny, "BROW-7: never from another worker"),
    row(WorkerGvisor, WorkerA, Control, Tcp, Deny, Deny, "BROW-7: never from another pool's worker"),
    row(Internet, WorkerA, Browser, Tcp, Deny, Deny, "BROW-7: never from outside"),
    row(Internet, WorkerA, Control, Tcp, Deny, Deny, "BROW-7: never from outside"),
    row(Impostor, WorkerA, Control, Tcp, Deny, Deny, "BROW-7: only this system's namespace"),
    row(Dns, WorkerA, Control, Tcp, Deny, Deny, "BROW-7: the API and the controller only"),
    row(Stray, WorkerA, Control, Tcp, Deny, Deny, "BROW-7: the API and the controller only"),
    row(Node, WorkerA, Control, Tcp, Allow, Allow, "the kubelet's readiness probe (own node)"),
    // Anything else in the workers' namespace has no network.
    row(Stray, Internet, Number(443), Tcp, Deny, Deny, "0007: nothing else runs beside workers"),
    row(Stray, EgressProxy, PortOf::Proxy, Tcp, Deny, Deny, "0007: nothing else runs beside workers"),
    row(Api, Stray, Control, Tcp, Deny, Deny, "0007: nothing else runs beside workers"),
    // The system's own pods are not these policies' business (ISO-2).
    row(Api, Valkey, Number(6379), Tcp, Allow, Allow, "ISO-2: the API reaches Valkey"),
    row(Controller, Valkey, Number(6379), Tcp, Allow, Allow, "ISO-2: the controller reaches Valkey"),
    row(EgressProxy, Internet, Number(443), Tcp, Allow, Allow, "ISO-2: the proxy mediates outbound"),
    row(Internet, Api, Number(443), Tcp, Allow, Allow, "ISO-2: the API is served"),
];

/// The workers' pool in the model, and the gVisor pool's.
pub const POOL: &str = "p1";
/// The gVisor pool's name and runtime class in the model.
pub const GVISOR: &str = "gvisor";

/// The modelled cluster, for one placement of the workers' peers.
#[derive(Clone, Debug)]
pub struct Model {
    cluster: Cluster,
    peers: WorkerPeers,
    pods: BTreeMap<Role, Pod>,
}

/// Where each pod of the model is: namespace, name, labels, address.
fn plain_pod(namespace: &str, name: &str, labels: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// The ports the table names itself, which a configured port must not be.
fn fixed_ports() -> Vec<u16> {
    let mut ports: Vec<u16> = CASES
        .iter()
        .filter_map(|case| match case.port {
            Number(n) => Some(n),
            _ => None,
        })
        .collect();
    ports.extend([CONTROL_PORT, BROWSER_PORT]);
    ports
}

/// The model's pods, each with its role and address: this system's, three workers (one in the
/// gVisor pool), a stray pod beside them, an impostor of the API in `tenant`, and the DNS.
fn model_pods(workers_namespace: &str, system_namespace: &str) -> [(Role, Pod, IpAddr); 11] {
    let own = |name| [(LABEL_NAME, name), (LABEL_PART_OF, PART_OF)];
    let worker = |pool: &str, runtime_class: Option<&str>, seq| {
        let mut settings = KubeSettings::new(
            workers_namespace,
            pool,
            ImageId("registry.invalid/corral-worker@sha256:00".to_owned()),
        );
        settings.runtime_class = runtime_class.map(str::to_owned);
        worker_pod(&settings, WorkerId { epoch: 1, seq }, &settings.image)
    };
    [
        (
            Api,
            plain_pod(system_namespace, "api", &own(API_NAME)),
            v4(10, 244, 1, 10),
        ),
        (
            Controller,
            plain_pod(system_namespace, "controller", &own(CONTROLLER_NAME)),
            v4(10, 244, 1, 11),
        ),
        (
            EgressProxy,
            plain_pod(system_namespace, "egress-proxy", &own(EGRESS_PROXY_NAME)),
            v4(10, 244, 1, 12),
        ),
        (
            Valkey,
            plain_pod(system_namespace, "valkey", &own(VALKEY_NAME)),
            v4(10, 244, 1, 13),
        ),
        (
            Turn,
            plain_pod(system_namespace, "coturn", &own(TURN_NAME)),
            v4(10, 244, 1, 14),
        ),
        (WorkerA, worker(POOL, None, 1), v4(10, 244, 2, 20)),
        (WorkerB, worker(POOL, None, 2), v4(10, 244, 2, 21)),
        (
            WorkerGvisor,
            worker(GVISOR, Some(GVISOR), 3),
            v4(10, 244, 2, 22),
        ),
        (
            Stray,
            plain_pod(workers_namespace, "stray", &[]),
            v4(10, 244, 2, 30),
        ),
        (
            Impostor,
            plain_pod("tenant", "impostor", &own(API_NAME)),
            v4(10, 244, 3, 10),
        ),
        (
            Dns,
            plain_pod("kube-system", "coredns", &[("k8s-app", "kube-dns")]),
            v4(10, 244, 0, 10),
        ),
    ]
}

impl Model {
    /// The model with the workers in `workers_namespace`, this system in `system_namespace` and
    /// the peers where `peers` says.
    ///
    /// # Errors
    /// Namespaces that are equal or are the model's own (`kube-system`, `tenant`), or a configured
    /// port that the table uses for something else (or 65535, which has no port above it).
    pub fn new(
        workers_namespace: &str,
        system_namespace: &str,
        peers: &WorkerPeers,
    ) -> Result<Self, String> {
        let taken = ["kube-system", "tenant"];
        if workers_namespace == system_namespace
            || taken.contains(&workers_namespace)
            || taken.contains(&system_namespace)
        {
            return Err("the model needs two namespaces of its own".to_owned());
        }
        let fixed = fixed_ports();
        for reach in [peers.proxy, peers.turn, peers.broker] {
            if fixed.contains(&reach.port()) || reach.port() == u16::MAX {
                return Err(format!(
                    "port {} is one the table uses itself",
                    reach.port()
                ));
            }
        }
        let mut cluster = Cluster::new();
        cluster.add_namespace(system_namespace, &[]);
        cluster.add_namespace(
            workers_namespace,
            &[("pod-security.kubernetes.io/enforce", "privileged")],
        );
        cluster.add_namespace("kube-system", &[]);
        cluster.add_namespace("tenant", &[]);
        let pods = model_pods(workers_namespace, system_namespace);
        let mut by_role = BTreeMap::new();
        for (role, pod, ip) in pods {
            cluster.add_pod(&pod, ip)?;
            by_role.insert(role, pod);
        }
        Ok(Self {
            cluster,
            peers: *peers,
            pods: by_role,
        })
    }

    /// The cluster.
    #[must_use]
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The pod object a role's pod was made from (`Turn` is coturn's pod, whether or not it is
    /// the configured authority); `None` for an address.
    #[must_use]
    pub fn pod_object(&self, role: Role) -> Option<&Pod> {
        self.pods.get(&role)
    }

    fn pod(&self, role: Role) -> Endpoint<'_> {
        let pod = &self.pods[&role];
        let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            unreachable!("every model pod has a namespace and a name");
        };
        match self.cluster.pod(namespace, name) {
            Some(model) => Endpoint::Pod(model),
            None => unreachable!("every model pod was added"),
        }
    }

    fn configured(&self, reach: Reach, pods_of: Role) -> Vec<Endpoint<'_>> {
        match reach {
            Reach::Pods(_) => vec![self.pod(pods_of)],
            Reach::Address(address) => vec![Endpoint::Address(address.ip())],
            Reach::PodsAnd(address) => vec![self.pod(pods_of), Endpoint::Address(address.ip())],
        }
    }

    /// Every way `role` is reached: a peer configured as pods and an address is both.
    #[must_use]
    pub fn endpoints(&self, role: Role) -> Vec<Endpoint<'_>> {
        match role {
            EgressProxy => self.configured(self.peers.proxy, EgressProxy),
            Broker => self.configured(self.peers.broker, Api),
            Turn => self.configured(self.peers.turn, Turn),
            TurnNeighbour => vec![Endpoint::Address(match self.peers.turn {
                Reach::Address(address) | Reach::PodsAnd(address) => neighbour(address.ip()),
                Reach::Pods(_) => v4(198, 51, 100, 7),
            })],
            Node => vec![Endpoint::Node(v4(172, 18, 0, 2))],
            Metadata => vec![Endpoint::Address(v4(169, 254, 169, 254))],
            Internet => vec![Endpoint::Address(v4(93, 184, 216, 34))],
            Api | Controller | Valkey | WorkerA | WorkerB | WorkerGvisor | Stray | Impostor
            | Dns => vec![self.pod(role)],
        }
    }

    /// The first of [`Model::endpoints`] (a role's pod, when it has one).
    #[must_use]
    pub fn endpoint(&self, role: Role) -> Endpoint<'_> {
        self.endpoints(role)[0]
    }

    /// The number of `port`.
    #[must_use]
    pub fn port(&self, port: PortOf) -> u16 {
        match port {
            PortOf::Proxy => self.peers.proxy.port(),
            PortOf::Broker => self.peers.broker.port(),
            PortOf::Turn => self.peers.turn.port(),
            // `new` refused 65535.
            AfterTurn => self.peers.turn.port() + 1,
            AfterProxy => self.peers.proxy.port() + 1,
            Control => CONTROL_PORT,
            Browser => BROWSER_PORT,
            Number(n) => n,
        }
    }
}

/// The address one above `ip` (wrapping), to show an exact match.
fn neighbour(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4).wrapping_add(1))),
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6).wrapping_add(1))),
    }
}

/// A row the policies get wrong.
#[derive(Clone, Debug)]
pub struct Mismatch {
    /// The row's index in [`CASES`].
    pub index: usize,
    /// The row.
    pub case: Case,
    /// The source, where it was.
    pub from: String,
    /// The destination, where it was.
    pub to: String,
    /// The port it came to.
    pub port: u16,
    /// What it had to be.
    pub expected: Expect,
    /// What the policies said.
    pub verdict: Verdict,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let case = &self.case;
        write!(
            f,
            "case {} ({} [{}] -> {} [{}] :{}/{}; {}): expected {}, got {}",
            self.index,
            case.from,
            self.from,
            case.to,
            self.to,
            self.port,
            case.protocol,
            case.why,
            match self.expected {
                Allow => "allow",
                Deny => "deny",
            },
            self.verdict
        )
    }
}

/// Every row of [`CASES`] that `policies` get wrong in `model`, judged against the column for
/// the workers' egress being admitted (`egress_admitted`) or denied; a row whose party is reached
/// two ways (pods and an address) is judged for each.
#[must_use]
pub fn check(policies: &PolicySet, model: &Model, egress_admitted: bool) -> Vec<Mismatch> {
    let mut wrong = Vec::new();
    for (index, case) in CASES.iter().enumerate() {
        let port = model.port(case.port);
        let expected = if egress_admitted {
            case.admitted
        } else {
            case.denied
        };
        for from in model.endpoints(case.from) {
            for to in model.endpoints(case.to) {
                let verdict = policies.evaluate(model.cluster(), from, to, port, case.protocol);
                if verdict.allowed() != (expected == Allow) {
                    wrong.push(Mismatch {
                        index,
                        case: *case,
                        from: from.to_string(),
                        to: to.to_string(),
                        port,
                        expected,
                        verdict,
                    });
                }
            }
        }
    }
    wrong
}
