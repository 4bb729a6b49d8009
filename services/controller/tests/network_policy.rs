//! The rendered NetworkPolicies, judged as Kubernetes reads them, over the hand-written table of
//! `corral_controller::network_policy::conformance` (ISO-2, ISO-3, ISO-5, BROW-7, EGR-8).
//!
//! No cluster runs here: the evaluator (`network_policy::eval`) implements the API's documented
//! semantics, and its own tests (`network_policy_eval.rs`) pin each part of them.

use std::net::SocketAddr;

use corral_controller::kube::{
    API_NAME, CONTROL_PORT, KubeSettings, LABEL_NAME, LABEL_POOL, WORKER_NAME, worker_pod,
};
use corral_controller::network_policy::conformance::{
    CASES, Expect, GVISOR, Model, POOL, Role, check,
};
use corral_controller::network_policy::eval::{
    Cluster, Endpoint, PolicySet, Protocol, Side, network_policies_in,
};
use corral_controller::network_policy::{
    Deployment, NAMESPACE_DENY_POLICY, Reach, WORKERS_POLICY, WorkerEgress, WorkerPeers,
    namespace_deny_policy, network_policies, policy_list, workers_policy,
};
use corral_core::ids::{ImageId, WorkerId};
use k8s_openapi::api::networking::v1::NetworkPolicy;

/// The namespaces of kind-cluster's manifests (decision 0030).
const WORKERS: &str = "corral";
const SYSTEM: &str = "corral-system";

fn address(text: &str) -> Reach {
    Reach::Address(text.parse::<SocketAddr>().unwrap())
}

/// The usual placement: proxy and broker are this system's pods, TURN an outside address.
fn peers() -> WorkerPeers {
    WorkerPeers {
        proxy: Reach::Pods(3128),
        turn: address("203.0.113.10:3478"),
        broker: Reach::Pods(8000),
    }
}

/// Every placement the table is judged in.
fn placements() -> Vec<(&'static str, WorkerPeers)> {
    vec![
        ("proxy and broker pods, TURN outside", peers()),
        (
            "coturn in the cluster",
            WorkerPeers {
                turn: Reach::Pods(3478),
                ..peers()
            },
        ),
        (
            "coturn in the cluster behind a load balancer's address",
            WorkerPeers {
                turn: "pods+192.0.2.30:3478".parse().unwrap(),
                ..peers()
            },
        ),
        (
            "every peer an outside address, TURN over IPv6",
            WorkerPeers {
                proxy: address("198.51.100.20:3128"),
                turn: address("[2001:db8::10]:3478"),
                broker: address("198.51.100.30:8000"),
            },
        ),
    ]
}

fn deployment(egress: WorkerEgress) -> Deployment {
    Deployment {
        workers_namespace: WORKERS.to_owned(),
        system_namespace: SYSTEM.to_owned(),
        egress,
    }
}

fn rendered(egress: WorkerEgress) -> PolicySet {
    PolicySet::new(&network_policies(&deployment(egress)).unwrap()).unwrap()
}

fn model(peers: &WorkerPeers) -> Model {
    Model::new(WORKERS, SYSTEM, peers).unwrap()
}

/// Panics with every mismatch, one a line.
fn assert_no_mismatch(what: &str, mismatches: &[impl std::fmt::Display]) {
    let lines: Vec<String> = mismatches.iter().map(ToString::to_string).collect();
    assert!(lines.is_empty(), "{what}:\n{}", lines.join("\n"));
}

#[test]
fn iso_05_the_rendered_policies_admit_exactly_the_table() {
    assert!(CASES.len() >= 40, "the table has {} rows", CASES.len());
    let denies = CASES.iter().filter(|c| c.admitted == Expect::Deny).count();
    let allows = CASES.len() - denies;
    assert!(
        denies >= 20 && allows >= 10,
        "{allows} allows, {denies} denies"
    );
    for (name, peers) in placements() {
        let policies = rendered(WorkerEgress::Admitted(peers));
        assert_no_mismatch(name, &check(&policies, &model(&peers), true));
    }
}

#[test]
fn iso_05_the_table_fails_policies_that_are_missing_or_deny_everything() {
    // The table is not satisfied by anything: without policies every denial of a worker's
    // traffic fails; with only the namespace's deny-all every admission of it fails.
    let model = model(&peers());
    let none = PolicySet::new(&[]).unwrap();
    let wrong = check(&none, &model, true);
    let expected_wrong = CASES.iter().filter(|c| c.admitted == Expect::Deny).count();
    assert_eq!(
        wrong.len(),
        expected_wrong,
        "every deny row is about a worker or the stray pod"
    );
    assert!(wrong.iter().all(|m| m.expected == Expect::Deny));
    let deny_all = PolicySet::new(&[namespace_deny_policy(WORKERS)]).unwrap();
    let wrong = check(&deny_all, &model, true);
    assert!(!wrong.is_empty());
    assert!(
        wrong.iter().all(|m| m.expected == Expect::Allow),
        "{wrong:?}"
    );
    // Exactly the 13 allow rows where a worker sends or receives (7 egress: proxy, broker, TURN
    // twice, worker-b's broker, the gVisor worker's proxy and TURN; 6 ingress: the API thrice on
    // worker-a and worker-b, once on the gVisor worker, the controller twice). The kubelet's
    // probe stays admitted: ingress from the pod's own node always is.
    assert_eq!(wrong.len(), 13, "{wrong:#?}");
}

#[test]
fn egr_08_isolated_or_keyless_denies_worker_egress_at_the_deployment_layer() {
    // `isolated`, no field key, or no proxy: the workers' policy admits no egress at all, while
    // ingress from the API and the controller stays.
    let denied = rendered(WorkerEgress::Denied);
    for (name, peers) in placements() {
        assert_no_mismatch(name, &check(&denied, &model(&peers), false));
    }
    // The admitted set does not pass the denied column (the columns differ where EGR-8 bites).
    let admitted = rendered(WorkerEgress::Admitted(peers()));
    let wrong = check(&admitted, &model(&peers()), false);
    let bites = CASES.iter().filter(|c| c.admitted != c.denied).count();
    assert_eq!(wrong.len(), bites);
    assert!(bites >= 7, "{bites}");
    let model = model(&peers());
    let verdict = denied.evaluate(
        model.cluster(),
        model.endpoint(Role::WorkerA),
        model.endpoint(Role::EgressProxy),
        3128,
        Protocol::Tcp,
    );
    assert_eq!(verdict.egress, Side::Denied, "{verdict}");
    // Denial replaces admission: both are the one object, so applying the denied form leaves no
    // admitting policy behind. A deny-all *added* beside the admitting policy would deny nothing.
    let admitted_set = network_policies(&deployment(WorkerEgress::Admitted(peers()))).unwrap();
    let denied_set = network_policies(&deployment(WorkerEgress::Denied)).unwrap();
    let names =
        |set: &[NetworkPolicy]| -> Vec<_> { set.iter().map(|p| p.metadata.name.clone()).collect() };
    assert_eq!(names(&admitted_set), names(&denied_set));
    let mut both = admitted_set;
    both.extend(denied_set);
    for policy in &mut both[2..] {
        policy.metadata.name = Some("corral-workers-isolated".to_owned());
    }
    let union = PolicySet::new(&both).unwrap();
    let verdict = union.evaluate(
        model.cluster(),
        model.endpoint(Role::WorkerA),
        model.endpoint(Role::EgressProxy),
        3128,
        Protocol::Tcp,
    );
    assert!(verdict.allowed(), "a union: {verdict}");
}

#[test]
fn iso_02_three_services_cooperate_through_the_policies() {
    // The controller reaches a worker to reset it; the API reaches it to run and to serve a
    // browser session; the worker reaches the egress proxy and the broker; the proxy reaches the
    // internet. Each written here from ISO-2's design, judged over the rendered policies.
    let policies = rendered(WorkerEgress::Admitted(peers()));
    let model = model(&peers());
    let cooperation = [
        (
            Role::Controller,
            Role::WorkerA,
            CONTROL_PORT,
            "the controller resets",
        ),
        (Role::Api, Role::WorkerA, CONTROL_PORT, "the API runs code"),
        (
            Role::WorkerA,
            Role::EgressProxy,
            3128,
            "the worker's egress",
        ),
        (Role::WorkerA, Role::Broker, 8000, "the worker's installs"),
        (Role::EgressProxy, Role::Internet, 443, "the proxy goes out"),
        (
            Role::Controller,
            Role::Valkey,
            6379,
            "the controller keeps the pool",
        ),
    ];
    for (from, to, port, why) in cooperation {
        let verdict = policies.evaluate(
            model.cluster(),
            model.endpoint(from),
            model.endpoint(to),
            port,
            Protocol::Tcp,
        );
        assert!(verdict.allowed(), "{why}: {from} -> {to}:{port}: {verdict}");
    }
    // And the worker's side of each is a rule of the workers' policy, not an absence of policy.
    let verdict = policies.evaluate(
        model.cluster(),
        model.endpoint(Role::Controller),
        model.endpoint(Role::WorkerA),
        CONTROL_PORT,
        Protocol::Tcp,
    );
    assert_eq!(
        verdict.ingress,
        Side::Admitted {
            policy: format!("{WORKERS}/{WORKERS_POLICY}"),
            rule: "spec.ingress[1]".to_owned()
        }
    );
    assert_eq!(verdict.egress, Side::NotIsolated);
    let verdict = policies.evaluate(
        model.cluster(),
        model.endpoint(Role::WorkerA),
        model.endpoint(Role::EgressProxy),
        3128,
        Protocol::Tcp,
    );
    assert_eq!(
        verdict.egress,
        Side::Admitted {
            policy: format!("{WORKERS}/{WORKERS_POLICY}"),
            rule: "spec.egress[0]".to_owned()
        }
    );
}

#[test]
fn iso_03_a_gvisor_pool_gets_the_same_policy_and_runtime_class_is_never_required() {
    let model = model(&peers());
    let plain = model.pod_object(Role::WorkerA).unwrap();
    let gvisor = model.pod_object(Role::WorkerGvisor).unwrap();
    // Without a configured class the pod names none; with one, it names it.
    let class = |pod: &k8s_openapi::api::core::v1::Pod| {
        pod.spec.as_ref().unwrap().runtime_class_name.clone()
    };
    assert_eq!(class(plain), None);
    assert_eq!(class(gvisor), Some(GVISOR.to_owned()));
    let labels = |pod: &k8s_openapi::api::core::v1::Pod| pod.metadata.labels.clone().unwrap();
    assert_eq!(labels(plain)[LABEL_POOL], POOL);
    assert_eq!(labels(gvisor)[LABEL_POOL], GVISOR);
    // The policies never mention a runtime class or a pool: one policy for every pool.
    let set = network_policies(&deployment(WorkerEgress::Admitted(peers()))).unwrap();
    let text = serde_json::to_string(&set).unwrap();
    assert!(
        !text.contains("runtimeClass") && !text.contains(LABEL_POOL),
        "{text}"
    );
    // Every row about worker-a comes out the same for the gVisor worker, in both columns.
    for egress in [WorkerEgress::Admitted(peers()), WorkerEgress::Denied] {
        let policies = rendered(egress);
        let mut compared = 0;
        for case in CASES {
            let swap = |role| match role {
                Role::WorkerA => Role::WorkerGvisor,
                Role::WorkerGvisor => Role::WorkerA,
                other => other,
            };
            if case.from != Role::WorkerA && case.to != Role::WorkerA {
                continue;
            }
            let judge = |from, to| {
                policies
                    .evaluate(
                        model.cluster(),
                        model.endpoint(from),
                        model.endpoint(to),
                        model.port(case.port),
                        case.protocol,
                    )
                    .allowed()
            };
            assert_eq!(
                judge(case.from, case.to),
                judge(swap(case.from), swap(case.to)),
                "{case:?}"
            );
            compared += 1;
        }
        assert!(compared >= 30, "{compared}");
    }
    // A gVisor worker made from the pod template with the class configured is selected by the
    // workers' policy like any other (its labels are the template's).
    let mut settings = KubeSettings::new(
        WORKERS,
        "sandboxed",
        ImageId("registry.invalid/w@sha256:01".to_owned()),
    );
    settings.runtime_class = Some(GVISOR.to_owned());
    let pod = worker_pod(&settings, WorkerId { epoch: 9, seq: 9 }, &settings.image);
    assert_eq!(
        pod.metadata.labels.as_ref().unwrap()[LABEL_NAME],
        WORKER_NAME
    );
    let mut cluster = Cluster::new();
    cluster.add_namespace(WORKERS, &[]);
    cluster
        .add_pod(&pod, "10.244.9.9".parse().unwrap())
        .unwrap();
    let name = pod.metadata.name.clone().unwrap();
    let worker = Endpoint::Pod(cluster.pod(WORKERS, &name).unwrap());
    let verdict = rendered(WorkerEgress::Admitted(peers())).evaluate(
        &cluster,
        worker,
        Endpoint::Address("203.0.113.10".parse().unwrap()),
        3478,
        Protocol::Udp,
    );
    assert!(
        matches!(&verdict.egress, Side::Admitted { rule, .. } if rule == "spec.egress[1]"),
        "{verdict}"
    );
}

#[test]
fn iso_05_the_printed_list_reads_back_and_judges_the_same() {
    let set = network_policies(&deployment(WorkerEgress::Admitted(peers()))).unwrap();
    let text = serde_json::to_string_pretty(&policy_list(&set)).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let read = network_policies_in(&value).unwrap();
    assert_eq!(read, set);
    let policies = PolicySet::new(&read).unwrap();
    assert_no_mismatch("read back", &check(&policies, &model(&peers()), true));
}

/// The rendered set as JSON, changed by `widen`, read back as an overlay would be.
fn overlay(widen: impl FnOnce(&mut serde_json::Value)) -> PolicySet {
    let set = network_policies(&deployment(WorkerEgress::Admitted(peers()))).unwrap();
    let mut value = policy_list(&set);
    widen(&mut value);
    PolicySet::new(&network_policies_in(&value).unwrap()).unwrap()
}

#[test]
fn iso_05_a_widened_overlay_fails_the_table_naming_the_policy_and_rule() {
    let model = model(&peers());
    // An egress rule to everywhere but the metadata service, added to the workers' policy.
    let widened = overlay(|list| {
        list["items"][1]["spec"]["egress"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}]
            }));
    });
    let wrong = check(&widened, &model, true);
    let internet = wrong
        .iter()
        .find(|m| m.case.from == Role::WorkerA && m.case.to == Role::Internet)
        .expect("worker -> internet must now fail the table");
    assert_eq!(
        internet.verdict.egress,
        Side::Admitted {
            policy: format!("{WORKERS}/{WORKERS_POLICY}"),
            rule: "spec.egress[3]".to_owned()
        }
    );
    let text = internet.to_string();
    assert!(
        text.contains("spec.egress[3]") && text.contains(WORKERS_POLICY),
        "{text}"
    );
    // The except holds.
    assert!(
        !wrong.iter().any(|m| m.case.to == Role::Metadata),
        "{wrong:#?}"
    );
    // ipBlock reaches pod addresses too (the widest reading): DNS's pod is now reachable, and a
    // worker's egress to another worker is admitted, which that worker's ingress still refuses.
    assert!(wrong.iter().any(|m| m.case.to == Role::Dns), "{wrong:#?}");
    let verdict = widened.evaluate(
        model.cluster(),
        model.endpoint(Role::WorkerA),
        model.endpoint(Role::WorkerB),
        CONTROL_PORT,
        Protocol::Tcp,
    );
    assert!(matches!(&verdict.egress, Side::Admitted { rule, .. } if rule == "spec.egress[3]"));
    assert_eq!(verdict.ingress, Side::Denied);
    // A separate policy that admits every egress of the workers: the union widens them.
    let extra = overlay(|list| {
        list["items"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "debug-egress", "namespace": WORKERS},
                "spec": {
                    "podSelector": {"matchLabels": {LABEL_NAME: WORKER_NAME}},
                    "policyTypes": ["Egress"],
                    "egress": [{}]
                }
            }));
    });
    let wrong = check(&extra, &model, true);
    assert!(wrong.len() >= 15, "{}", wrong.len());
    assert!(wrong.iter().all(|m| m.expected == Expect::Deny));
    assert!(wrong.iter().all(|m| matches!(
        &m.verdict.egress,
        Side::Admitted { policy, rule } if policy == &format!("{WORKERS}/debug-egress") && rule == "spec.egress[0]"
    )), "{wrong:#?}");
    // Ingress from every pod of this system's namespace (the API's pod selector dropped).
    let loose = overlay(|list| {
        let from = &mut list["items"][1]["spec"]["ingress"][0]["from"][0];
        from.as_object_mut().unwrap().remove("podSelector");
    });
    let wrong = check(&loose, &model, true);
    let callers: Vec<Role> = wrong.iter().map(|m| m.case.from).collect();
    assert!(callers.contains(&Role::Valkey), "{wrong:#?}");
    assert!(callers.contains(&Role::EgressProxy), "{wrong:#?}");
    // Dropping the namespace selector instead keeps the API's labels but in the workers' own
    // namespace: the real API is cut off (a narrowing the table catches too).
    let narrowed = overlay(|list| {
        let from = &mut list["items"][1]["spec"]["ingress"][0]["from"][0];
        from.as_object_mut().unwrap().remove("namespaceSelector");
    });
    let wrong = check(&narrowed, &model, true);
    assert!(
        wrong
            .iter()
            .any(|m| m.case.from == Role::Api && m.expected == Expect::Allow),
        "{wrong:#?}"
    );
    // The namespace's deny-all removed: the stray pod is no longer isolated.
    let no_floor = overlay(|list| {
        list["items"].as_array_mut().unwrap().remove(0);
    });
    let wrong = check(&no_floor, &model, true);
    assert!(!wrong.is_empty());
    assert!(
        wrong
            .iter()
            .all(|m| m.case.from == Role::Stray || m.case.to == Role::Stray),
        "{wrong:#?}"
    );
}

#[test]
fn iso_05_the_namespace_deny_all_selects_every_pod_and_names_are_stable() {
    let policy = namespace_deny_policy(WORKERS);
    assert_eq!(policy.metadata.name.as_deref(), Some(NAMESPACE_DENY_POLICY));
    let value = serde_json::to_value(&policy).unwrap();
    assert_eq!(value["spec"]["podSelector"], serde_json::json!({}));
    assert_eq!(
        value["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert!(value["spec"].get("ingress").is_none() && value["spec"].get("egress").is_none());
    let workers = serde_json::to_value(workers_policy(&deployment(WorkerEgress::Denied))).unwrap();
    assert_eq!(
        workers["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"][LABEL_NAME],
        API_NAME
    );
}
