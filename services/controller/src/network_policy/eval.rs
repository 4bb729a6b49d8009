//! How Kubernetes reads a set of NetworkPolicies: whether one connection, from a pod or an
//! address to a pod or an address, on a port and protocol, is admitted. Any policies can be
//! judged (rendered here, or parsed from a manifest), against a modelled [`Cluster`].
//!
//! [`PolicySet::new`] first refuses what the API server would refuse (naming the object and the
//! field), so that a policy the cluster would never hold is never judged. Then, as the API's
//! documentation says:
//! - a pod is isolated for a direction iff some policy in its namespace selects it and has that
//!   direction in its `policyTypes`; absent or empty `policyTypes` mean `Ingress`, plus `Egress`
//!   when the policy has any egress rule;
//! - an isolated pod's traffic in that direction is admitted iff some rule of some selecting
//!   policy admits it (the union of policies; a policy with no rules only isolates);
//! - a connection between two pods needs the source's egress and the destination's ingress;
//! - ingress from the destination pod's own node is always admitted (kubelet probes); egress to
//!   a node is judged like any address;
//! - a peer with only `podSelector` selects pods in the policy's own namespace; with only
//!   `namespaceSelector`, every pod of the selected namespaces; with both, their intersection;
//!   neither ever matches an address outside the cluster;
//! - `ipBlock` matches by address, `except` removed. It matches pod addresses too, as Calico does
//!   (Cilium does not; the API leaves it open): the widest reading, so a CNI that reads it
//!   narrowly can only deny more than this says, never admit more. Admissions of pods should
//!   come from selectors, which every CNI reads alike;
//! - empty or absent `from`/`to` mean every peer, empty or absent `ports` every port; a port's
//!   protocol defaults to TCP; `endPort` makes an inclusive range; a named port matches a
//!   destination pod's container port of that name and protocol (never an address);
//! - label selectors: `matchLabels` and `matchExpressions` (`In`, `NotIn`, `Exists`,
//!   `DoesNotExist`) all hold; an empty selector matches everything.
//!
//! A connection is judged after any Service's address translation: a Service's ClusterIP is not
//! an endpoint here, the pods behind it are (decision 0031). Reply traffic is not judged (every
//! implementation admits it with the connection).

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::kube::LABEL_NAMESPACE_NAME;

/// A transport protocol a NetworkPolicy port names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    /// `TCP` (the default).
    Tcp,
    /// `UDP`.
    Udp,
    /// `SCTP`.
    Sctp,
}

impl Protocol {
    /// The API's spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }

    /// The protocol the API spells `text` (exactly, as the API server accepts it).
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Labels, by key.
pub type Labels = BTreeMap<String, String>;

/// A pod of the modelled cluster: what a policy can see of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: Labels,
    /// Its address.
    pub ip: IpAddr,
    /// Its containers' named ports: name, number, protocol.
    pub named_ports: Vec<(String, u16, Protocol)>,
}

impl fmt::Display for ModelPod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Namespaces (with their labels) and pods (with their labels and addresses).
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    namespaces: BTreeMap<String, Labels>,
    pods: BTreeMap<(String, String), ModelPod>,
}

impl Cluster {
    /// An empty cluster.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds namespace `name` with `labels`, and the [`LABEL_NAMESPACE_NAME`] label the API
    /// server sets on every namespace.
    pub fn add_namespace(&mut self, name: &str, labels: &[(&str, &str)]) {
        let mut all: Labels = labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        all.insert(LABEL_NAMESPACE_NAME.to_owned(), name.to_owned());
        self.namespaces.insert(name.to_owned(), all);
    }

    /// Adds `pod` (its namespace, name, labels and containers' named ports) at address `ip`.
    ///
    /// # Errors
    /// When the pod has no name or namespace, or its namespace was not added.
    pub fn add_pod(&mut self, pod: &Pod, ip: IpAddr) -> Result<(), String> {
        let name = pod.metadata.name.clone().ok_or("a pod without a name")?;
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .ok_or_else(|| format!("pod {name} has no namespace"))?;
        if !self.namespaces.contains_key(&namespace) {
            return Err(format!("pod {name}: namespace {namespace} was not added"));
        }
        let named_ports = pod
            .spec
            .iter()
            .flat_map(|spec| &spec.containers)
            .flat_map(|container| container.ports.iter().flatten())
            .filter_map(|port| {
                let number = u16::try_from(port.container_port).ok()?;
                let protocol = Protocol::parse(port.protocol.as_deref().unwrap_or("TCP"))?;
                Some((port.name.clone()?, number, protocol))
            })
            .collect();
        let model = ModelPod {
            namespace: namespace.clone(),
            name: name.clone(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ip,
            named_ports,
        };
        self.pods.insert((namespace, name), model);
        Ok(())
    }

    /// The pod `name` of `namespace`.
    #[must_use]
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&ModelPod> {
        self.pods.get(&(namespace.to_owned(), name.to_owned()))
    }

    fn namespace_labels(&self, namespace: &str) -> Option<&Labels> {
        self.namespaces.get(namespace)
    }
}

/// One end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint<'c> {
    /// A pod of the cluster.
    Pod(&'c ModelPod),
    /// The node the destination pod runs on (its kubelet), at this address.
    Node(IpAddr),
    /// Any other address: outside the cluster, or a node's other than the pod's own.
    Address(IpAddr),
}

impl Endpoint<'_> {
    fn ip(&self) -> IpAddr {
        match self {
            Self::Pod(pod) => pod.ip,
            Self::Node(ip) | Self::Address(ip) => *ip,
        }
    }
}

impl fmt::Display for Endpoint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pod(pod) => write!(f, "pod {pod}"),
            Self::Node(ip) => write!(f, "node {ip}"),
            Self::Address(ip) => write!(f, "address {ip}"),
        }
    }
}

/// What one side of a connection (the source's egress, the destination's ingress) says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Side {
    /// That end is not a pod: no NetworkPolicy governs it.
    NotAPod,
    /// No policy selects the pod for this direction.
    NotIsolated,
    /// Ingress from the pod's own node, which is always admitted.
    LocalNode,
    /// Admitted by the rule at `rule` (for example `spec.egress[2]`) of `policy`
    /// (`namespace/name`); the first such rule, in the order the policies were given.
    Admitted {
        /// `namespace/name` of the policy.
        policy: String,
        /// The rule's path in that policy.
        rule: String,
    },
    /// The pod is isolated for this direction and no rule admits the connection.
    Denied,
}

/// Whether a connection is admitted, and by what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The source's egress.
    pub egress: Side,
    /// The destination's ingress.
    pub ingress: Side,
}

impl Verdict {
    /// True when both sides admit the connection.
    #[must_use]
    pub fn allowed(&self) -> bool {
        self.egress != Side::Denied && self.ingress != Side::Denied
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |side: &Side| match side {
            Side::NotAPod => "not a pod".to_owned(),
            Side::NotIsolated => "not isolated".to_owned(),
            Side::LocalNode => "from its own node".to_owned(),
            Side::Admitted { policy, rule } => format!("admitted by {policy} {rule}"),
            Side::Denied => "denied".to_owned(),
        };
        write!(
            f,
            "{} (egress: {}; ingress: {})",
            if self.allowed() { "allowed" } else { "denied" },
            side(&self.egress),
            side(&self.ingress)
        )
    }
}

/// A policy the API server would refuse, with the object and the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// `namespace/name` of the policy.
    pub policy: String,
    /// The field, as a path (`spec.egress[0].to[1].ipBlock.except[0]`).
    pub field: String,
    /// Why.
    pub reason: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NetworkPolicy {}: {}: {}",
            self.policy, self.field, self.reason
        )
    }
}

impl std::error::Error for Invalid {}

/// One requirement of a label selector.
#[derive(Clone, Debug)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn holds(&self, labels: &Labels) -> bool {
        match self {
            Self::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            // A missing key is not in the set.
            Self::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Self::Exists(key) => labels.contains_key(key),
            Self::DoesNotExist(key) => !labels.contains_key(key),
        }
    }
}

/// A label selector: every requirement holds (none: everything matches).
#[derive(Clone, Debug)]
struct Selector(Vec<Requirement>);

impl Selector {
    fn matches(&self, labels: &Labels) -> bool {
        self.0.iter().all(|requirement| requirement.holds(labels))
    }
}

/// Which port(s) of a protocol a policy port admits.
#[derive(Clone, Debug)]
enum PortSpec {
    Every,
    Range(u16, u16),
    Named(String),
}

#[derive(Clone, Debug)]
struct PortMatch {
    protocol: Protocol,
    port: PortSpec,
}

#[derive(Clone, Debug)]
enum Peer {
    /// Pods matching `pods` in the namespaces `namespaces` selects (`None`: the policy's own).
    Pods {
        namespaces: Option<Selector>,
        pods: Selector,
    },
    /// Addresses in `cidr` and in none of `except`.
    Block { cidr: IpNet, except: Vec<IpNet> },
}

#[derive(Clone, Debug)]
struct Rule {
    /// The rule's path, for the verdict.
    field: String,
    /// Empty: every peer.
    peers: Vec<Peer>,
    /// Empty: every port of every protocol.
    ports: Vec<PortMatch>,
}

#[derive(Clone, Debug)]
struct Compiled {
    id: String,
    namespace: String,
    selector: Selector,
    /// `None`: the policy does not affect ingress.
    ingress: Option<Vec<Rule>>,
    /// `None`: the policy does not affect egress.
    egress: Option<Vec<Rule>>,
}

/// Which way a rule looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

/// A set of NetworkPolicies, checked as the API server would and ready to judge connections.
#[derive(Clone, Debug)]
pub struct PolicySet {
    policies: Vec<Compiled>,
}

impl PolicySet {
    /// Checks and reads `policies`.
    ///
    /// # Errors
    /// The first field the API server would refuse, or a policy without a namespace (whose
    /// selectors could not be read).
    pub fn new(policies: &[NetworkPolicy]) -> Result<Self, Invalid> {
        let policies = policies
            .iter()
            .map(compile)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { policies })
    }

    /// Whether a connection from `from` to `to` on `port`/`protocol` is admitted in `cluster`.
    #[must_use]
    pub fn evaluate(
        &self,
        cluster: &Cluster,
        from: Endpoint<'_>,
        to: Endpoint<'_>,
        port: u16,
        protocol: Protocol,
    ) -> Verdict {
        let connection = Connection {
            from,
            to,
            port,
            protocol,
        };
        let egress = match from {
            Endpoint::Pod(pod) => self.side(cluster, Direction::Egress, pod, connection),
            Endpoint::Node(_) | Endpoint::Address(_) => Side::NotAPod,
        };
        let ingress = match (to, from) {
            (Endpoint::Node(_) | Endpoint::Address(_), _) => Side::NotAPod,
            (Endpoint::Pod(_), Endpoint::Node(_)) => Side::LocalNode,
            (Endpoint::Pod(pod), _) => self.side(cluster, Direction::Ingress, pod, connection),
        };
        Verdict { egress, ingress }
    }

    /// What `subject`'s policies say about `connection` in `direction` (`subject` is its source
    /// for egress, its destination for ingress).
    fn side(
        &self,
        cluster: &Cluster,
        direction: Direction,
        subject: &ModelPod,
        connection: Connection<'_>,
    ) -> Side {
        let mut isolated = false;
        for policy in &self.policies {
            if policy.namespace != subject.namespace || !policy.selector.matches(&subject.labels) {
                continue;
            }
            let rules = match direction {
                Direction::Ingress => &policy.ingress,
                Direction::Egress => &policy.egress,
            };
            let Some(rules) = rules else {
                continue;
            };
            isolated = true;
            let admitting = rules
                .iter()
                .find(|rule| rule_admits(rule, cluster, &policy.namespace, direction, connection));
            if let Some(rule) = admitting {
                return Side::Admitted {
                    policy: policy.id.clone(),
                    rule: rule.field.clone(),
                };
            }
        }
        if isolated {
            Side::Denied
        } else {
            Side::NotIsolated
        }
    }
}

/// Reads and judges `policies` at once (see [`PolicySet`]).
///
/// # Errors
/// As [`PolicySet::new`].
pub fn evaluate(
    policies: &[NetworkPolicy],
    cluster: &Cluster,
    from: Endpoint<'_>,
    to: Endpoint<'_>,
    port: u16,
    protocol: Protocol,
) -> Result<Verdict, Invalid> {
    Ok(PolicySet::new(policies)?.evaluate(cluster, from, to, port, protocol))
}

/// Every NetworkPolicy in `value`: one object, an array, or a `List`, nested (other kinds are
/// skipped), as `kubectl` or kustomize print them in JSON.
///
/// # Errors
/// An object of kind NetworkPolicy that does not read as one.
pub fn network_policies_in(value: &serde_json::Value) -> Result<Vec<NetworkPolicy>, String> {
    let mut found = Vec::new();
    collect(value, &mut found, 0)?;
    Ok(found)
}

/// How deep lists may nest in [`network_policies_in`].
const LIST_DEPTH_MAX: u32 = 8;

fn collect(
    value: &serde_json::Value,
    found: &mut Vec<NetworkPolicy>,
    depth: u32,
) -> Result<(), String> {
    if depth > LIST_DEPTH_MAX {
        return Err(format!("lists nested deeper than {LIST_DEPTH_MAX}"));
    }
    match value {
        serde_json::Value::Array(items) => {
            for item in items {
                collect(item, found, depth + 1)?;
            }
        }
        serde_json::Value::Object(object) => match object.get("kind").and_then(|k| k.as_str()) {
            Some("NetworkPolicy") => {
                let policy = serde_json::from_value(value.clone()).map_err(|e| {
                    let name = value["metadata"]["name"].as_str().unwrap_or("(unnamed)");
                    format!("NetworkPolicy {name}: {e}")
                })?;
                found.push(policy);
            }
            Some(kind) if kind.ends_with("List") => {
                if let Some(items) = object.get("items") {
                    collect(items, found, depth + 1)?;
                }
            }
            _ => {}
        },
        _ => {}
    }
    Ok(())
}

/// One connection: its ends, the destination port and the protocol.
#[derive(Clone, Copy, Debug)]
struct Connection<'c> {
    from: Endpoint<'c>,
    to: Endpoint<'c>,
    port: u16,
    protocol: Protocol,
}

/// Whether `rule`, of a policy in `policy_namespace` looking in `direction`, admits `connection`:
/// its peer is the far end (the destination for egress, the source for ingress), its ports are
/// always the destination's.
fn rule_admits(
    rule: &Rule,
    cluster: &Cluster,
    policy_namespace: &str,
    direction: Direction,
    connection: Connection<'_>,
) -> bool {
    let peer = match direction {
        Direction::Egress => connection.to,
        Direction::Ingress => connection.from,
    };
    let peer_ok = rule.peers.is_empty()
        || rule
            .peers
            .iter()
            .any(|p| peer_admits(p, cluster, policy_namespace, peer));
    let port_ok = rule.ports.is_empty()
        || rule
            .ports
            .iter()
            .any(|p| port_admits(p, connection.to, connection.port, connection.protocol));
    peer_ok && port_ok
}

fn peer_admits(
    peer: &Peer,
    cluster: &Cluster,
    policy_namespace: &str,
    endpoint: Endpoint<'_>,
) -> bool {
    match peer {
        Peer::Pods { namespaces, pods } => {
            let Endpoint::Pod(pod) = endpoint else {
                // Selectors select pods; an address outside the cluster is never one.
                return false;
            };
            let namespace_ok = match namespaces {
                None => pod.namespace == policy_namespace,
                Some(selector) => cluster
                    .namespace_labels(&pod.namespace)
                    .is_some_and(|labels| selector.matches(labels)),
            };
            namespace_ok && pods.matches(&pod.labels)
        }
        Peer::Block { cidr, except } => {
            let ip = endpoint.ip();
            cidr.contains(&ip) && !except.iter().any(|e| e.contains(&ip))
        }
    }
}

fn port_admits(rule: &PortMatch, destination: Endpoint<'_>, port: u16, protocol: Protocol) -> bool {
    if rule.protocol != protocol {
        return false;
    }
    match &rule.port {
        PortSpec::Every => true,
        PortSpec::Range(low, high) => (*low..=*high).contains(&port),
        PortSpec::Named(name) => match destination {
            Endpoint::Pod(pod) => pod
                .named_ports
                .iter()
                .any(|(n, number, p)| n == name && *number == port && *p == protocol),
            Endpoint::Node(_) | Endpoint::Address(_) => false,
        },
    }
}

/// Builds [`Invalid`] for the policy being read.
struct Reader {
    policy: String,
}

impl Reader {
    fn invalid(&self, field: &str, reason: impl Into<String>) -> Invalid {
        Invalid {
            policy: self.policy.clone(),
            field: field.to_owned(),
            reason: reason.into(),
        }
    }

    fn selector(&self, field: &str, selector: &LabelSelector) -> Result<Selector, Invalid> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            if key.is_empty() {
                return Err(self.invalid(&format!("{field}.matchLabels"), "an empty key"));
            }
            requirements.push(Requirement::In(key.clone(), vec![value.clone()]));
        }
        for (i, expression) in selector.match_expressions.iter().flatten().enumerate() {
            let here = format!("{field}.matchExpressions[{i}]");
            if expression.key.is_empty() {
                return Err(self.invalid(&format!("{here}.key"), "an empty key"));
            }
            let key = expression.key.clone();
            let values = expression.values.clone().unwrap_or_default();
            let requirement = match expression.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(self.invalid(
                        &format!("{here}.values"),
                        "must be non-empty for In and NotIn",
                    ));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(self.invalid(
                        &format!("{here}.values"),
                        "must be empty for Exists and DoesNotExist",
                    ));
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(self.invalid(
                        &format!("{here}.operator"),
                        format!("{other:?} is not In, NotIn, Exists or DoesNotExist"),
                    ));
                }
            };
            requirements.push(requirement);
        }
        Ok(Selector(requirements))
    }

    fn cidr(&self, field: &str, text: &str) -> Result<IpNet, Invalid> {
        text.parse::<IpNet>()
            // The API reads `10.0.0.1/24` as 10.0.0.0/24.
            .map(|net| net.trunc())
            .map_err(|_| self.invalid(field, format!("{text:?} is not a CIDR")))
    }

    fn block(&self, field: &str, block: &IPBlock) -> Result<Peer, Invalid> {
        let cidr = self.cidr(&format!("{field}.cidr"), &block.cidr)?;
        let mut except = Vec::new();
        for (i, text) in block.except.iter().flatten().enumerate() {
            let here = format!("{field}.except[{i}]");
            let net = self.cidr(&here, text)?;
            // The API refuses an except that is not a strict subset of the cidr.
            if !cidr.contains(&net) || net.prefix_len() <= cidr.prefix_len() {
                return Err(self.invalid(&here, "must be a strict subset of `cidr`"));
            }
            except.push(net);
        }
        Ok(Peer::Block { cidr, except })
    }

    fn peer(&self, field: &str, peer: &NetworkPolicyPeer) -> Result<Peer, Invalid> {
        match (&peer.ip_block, &peer.namespace_selector, &peer.pod_selector) {
            (Some(block), None, None) => self.block(&format!("{field}.ipBlock"), block),
            (Some(_), _, _) => Err(self.invalid(
                field,
                "ipBlock may not be combined with podSelector or namespaceSelector",
            )),
            (None, None, None) => Err(self.invalid(field, "must specify a peer")),
            (None, namespaces, pods) => Ok(Peer::Pods {
                namespaces: namespaces
                    .as_ref()
                    .map(|s| self.selector(&format!("{field}.namespaceSelector"), s))
                    .transpose()?,
                pods: match pods {
                    Some(s) => self.selector(&format!("{field}.podSelector"), s)?,
                    None => Selector(Vec::new()),
                },
            }),
        }
    }

    fn port(&self, field: &str, port: &NetworkPolicyPort) -> Result<PortMatch, Invalid> {
        let protocol = match port.protocol.as_deref() {
            None => Protocol::Tcp,
            Some(text) => Protocol::parse(text).ok_or_else(|| {
                self.invalid(
                    &format!("{field}.protocol"),
                    format!("{text:?} is not TCP, UDP or SCTP"),
                )
            })?,
        };
        let number = |value: i32, at: &str| {
            u16::try_from(value)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| self.invalid(at, format!("{value} is not a port from 1 to 65535")))
        };
        let spec = match (&port.port, port.end_port) {
            (None, None) => PortSpec::Every,
            (None | Some(IntOrString::String(_)), Some(_)) => {
                return Err(self.invalid(
                    &format!("{field}.endPort"),
                    "may only be set with a numeric port",
                ));
            }
            (Some(IntOrString::Int(low)), end) => {
                let low = number(*low, &format!("{field}.port"))?;
                let high = match end {
                    None => low,
                    Some(end) => number(end, &format!("{field}.endPort"))?,
                };
                if high < low {
                    return Err(self.invalid(
                        &format!("{field}.endPort"),
                        "must be greater than or equal to port",
                    ));
                }
                PortSpec::Range(low, high)
            }
            (Some(IntOrString::String(name)), None) => {
                if !is_port_name(name) {
                    return Err(self.invalid(
                        &format!("{field}.port"),
                        format!("{name:?} is not a port name"),
                    ));
                }
                PortSpec::Named(name.clone())
            }
        };
        Ok(PortMatch {
            protocol,
            port: spec,
        })
    }

    fn rule(
        &self,
        field: String,
        peers_field: &str,
        peers: Option<&Vec<NetworkPolicyPeer>>,
        ports: Option<&Vec<NetworkPolicyPort>>,
    ) -> Result<Rule, Invalid> {
        let peers = peers
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, p)| self.peer(&format!("{field}.{peers_field}[{i}]"), p))
            .collect::<Result<_, _>>()?;
        let ports = ports
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, p)| self.port(&format!("{field}.ports[{i}]"), p))
            .collect::<Result<_, _>>()?;
        Ok(Rule {
            field,
            peers,
            ports,
        })
    }
}

/// An IANA service name, as a named port must be: 1 to 15 lowercase letters, digits and inner
/// single hyphens, with at least one letter.
fn is_port_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=15).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.iter().any(u8::is_ascii_lowercase)
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

fn compile(policy: &NetworkPolicy) -> Result<Compiled, Invalid> {
    let name = policy.metadata.name.as_deref().unwrap_or("(unnamed)");
    let Some(namespace) = policy.metadata.namespace.clone() else {
        return Err(Invalid {
            policy: name.to_owned(),
            field: "metadata.namespace".to_owned(),
            reason: "missing: a policy's selectors are read in its namespace".to_owned(),
        });
    };
    let reader = Reader {
        policy: format!("{namespace}/{name}"),
    };
    let spec = policy.spec.clone().unwrap_or_default();
    let selector = match &spec.pod_selector {
        Some(selector) => reader.selector("spec.podSelector", selector)?,
        None => Selector(Vec::new()),
    };
    let types = spec.policy_types.clone().unwrap_or_default();
    if types.len() > 2 {
        return Err(reader.invalid("spec.policyTypes", "at most Ingress and Egress"));
    }
    for (i, kind) in types.iter().enumerate() {
        if kind != "Ingress" && kind != "Egress" {
            return Err(reader.invalid(
                &format!("spec.policyTypes[{i}]"),
                format!("{kind:?} is not Ingress or Egress"),
            ));
        }
    }
    let egress_rules = spec.egress.as_ref().is_some_and(|rules| !rules.is_empty());
    // The API's defaulting: Ingress always, Egress when there are egress rules.
    let (affects_ingress, affects_egress) = if types.is_empty() {
        (true, egress_rules)
    } else {
        (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        )
    };
    let mut ingress = Vec::new();
    for (i, rule) in spec.ingress.iter().flatten().enumerate() {
        ingress.push(reader.rule(
            format!("spec.ingress[{i}]"),
            "from",
            rule.from.as_ref(),
            rule.ports.as_ref(),
        )?);
    }
    let mut egress = Vec::new();
    for (i, rule) in spec.egress.iter().flatten().enumerate() {
        egress.push(reader.rule(
            format!("spec.egress[{i}]"),
            "to",
            rule.to.as_ref(),
            rule.ports.as_ref(),
        )?);
    }
    Ok(Compiled {
        id: reader.policy,
        namespace,
        selector,
        ingress: affects_ingress.then_some(ingress),
        egress: affects_egress.then_some(egress),
    })
}
