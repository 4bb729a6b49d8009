//! `corral controller network-policy`: the workers' NetworkPolicies (decision 0031), printed for
//! `kubectl apply -f -`, or, with `--check FILE`, any NetworkPolicies judged as Kubernetes reads
//! them over the conformance table for the same flags.
//!
//! `--check` prints one line per finding, `NetworkPolicy/<name> <field>: <problem>`, and exits 1
//! when there is any (0 when none, 2 when FILE cannot be read as JSON):
//! - a policy the API server would refuse, naming its field;
//! - every row of the table the policies get wrong, naming the policy and rule to blame: the
//!   rule that admitted what must be denied; for what must be admitted and is not, the rule of
//!   the policies these flags render that would have admitted it; for a pod that must be
//!   isolated and is not, the rendered policy that isolates it (`spec.podSelector`).
//!
//! `kind-cluster/check` runs it on every overlay's rendered policies with the overlay's flags.

use std::path::Path;
use std::process::ExitCode;

use corral::cli::NetworkPolicyArgs;
use corral_controller::network_policy::conformance::{self, Expect, Mismatch, Model};
use corral_controller::network_policy::eval::{Endpoint, PolicySet, Side, network_policies_in};
use corral_controller::network_policy::{
    Deployment, Reach, WORKERS_POLICY, WorkerEgress, WorkerPeers, network_policies, policy_list,
};

/// The table's peers with `--isolated`, where none is configured: every row of a worker's egress
/// must then be denied wherever its peer would be, so the system's pods at their usual ports.
const ISOLATED_MODEL_PEERS: WorkerPeers = WorkerPeers {
    proxy: Reach::Pods(3128),
    turn: Reach::Pods(corral_core::browser::turn::DEFAULT_PORT),
    broker: Reach::Pods(8000),
};

/// `corral controller network-policy`.
pub fn run(args: &NetworkPolicyArgs) -> ExitCode {
    let deployment = match deployment(args) {
        Ok(deployment) => deployment,
        Err(error) => {
            eprintln!("corral controller network-policy: {error}");
            return ExitCode::from(2);
        }
    };
    match &args.check {
        Some(file) => check_file(&deployment, file),
        None => print(&deployment),
    }
}

/// The deployment the flags describe. The parser has required the three peers unless
/// `--isolated` (and refused them with it); this keeps that true for any caller.
fn deployment(args: &NetworkPolicyArgs) -> Result<Deployment, String> {
    let egress = if args.isolated {
        WorkerEgress::Denied
    } else {
        let (Some(proxy), Some(turn), Some(broker)) = (args.proxy, args.turn, args.broker) else {
            return Err("--proxy, --turn and --broker are required unless --isolated".to_owned());
        };
        WorkerEgress::Admitted(WorkerPeers {
            proxy,
            turn,
            broker,
        })
    };
    let deployment = Deployment {
        workers_namespace: args.workers.namespace.clone(),
        system_namespace: args.system_namespace.clone(),
        egress,
    };
    deployment.validate()?;
    Ok(deployment)
}

fn print(deployment: &Deployment) -> ExitCode {
    let rendered = network_policies(deployment)
        .map(|policies| policy_list(&policies))
        .and_then(|list| serde_json::to_string_pretty(&list).map_err(|e| e.to_string()));
    match rendered {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("corral controller network-policy: {error}");
            ExitCode::from(1)
        }
    }
}

fn check_file(deployment: &Deployment, file: &Path) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) => {
            eprintln!(
                "corral controller network-policy: {}: {error}",
                file.display()
            );
            return ExitCode::from(2);
        }
    };
    match findings(deployment, &text) {
        Ok(lines) if lines.is_empty() => ExitCode::SUCCESS,
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::from(1)
        }
        Err(error) => {
            eprintln!(
                "corral controller network-policy: {}: {error}",
                file.display()
            );
            ExitCode::from(2)
        }
    }
}

/// What is wrong with the NetworkPolicies in `json` for `deployment`: one line each, none when
/// they pass the whole table.
///
/// # Errors
/// `json` is not JSON, or holds an object of kind NetworkPolicy that does not read as one.
pub fn findings(deployment: &Deployment, json: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let policies = network_policies_in(&value)?;
    let set = match PolicySet::new(&policies) {
        Ok(set) => set,
        Err(invalid) => {
            return Ok(vec![format!(
                "NetworkPolicy/{} {}: {} (the API server refuses it)",
                name_of(&invalid.policy),
                invalid.field,
                invalid.reason
            )]);
        }
    };
    let (peers, admitted) = match deployment.egress {
        WorkerEgress::Admitted(peers) => (peers, true),
        WorkerEgress::Denied => (ISOLATED_MODEL_PEERS, false),
    };
    let model = Model::new(
        &deployment.workers_namespace,
        &deployment.system_namespace,
        &peers,
    )?;
    let reference = network_policies(deployment)?;
    let blame = Blame {
        model: &model,
        reference: PolicySet::new(&reference).map_err(|e| e.to_string())?,
        each: reference
            .iter()
            .map(|policy| {
                let name = policy.metadata.name.clone().unwrap_or_default();
                PolicySet::new(std::slice::from_ref(policy)).map(|set| (name, set))
            })
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?,
    };
    Ok(conformance::check(&set, &model, admitted)
        .iter()
        .map(|mismatch| {
            let (policy, field) = blame.of(mismatch);
            format!("NetworkPolicy/{} {field}: {mismatch}", name_of(&policy))
        })
        .collect())
}

/// `name` of `namespace/name`.
fn name_of(policy: &str) -> &str {
    policy.rsplit_once('/').map_or(policy, |(_, name)| name)
}

/// Which policy and field a wrong row is laid at.
struct Blame<'m> {
    model: &'m Model,
    /// The policies the flags render: the reading the table was written for.
    reference: PolicySet,
    /// Each of them alone, by name.
    each: Vec<(String, PolicySet)>,
}

/// Which side of a connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Egress,
    Ingress,
}

impl Blame<'_> {
    /// `(policy, field)`: see the module's documentation.
    fn of(&self, mismatch: &Mismatch) -> (String, String) {
        let verdict = &mismatch.verdict;
        let sides = [
            (Way::Egress, &verdict.egress),
            (Way::Ingress, &verdict.ingress),
        ];
        if mismatch.expected == Expect::Deny {
            // What admitted it.
            if let Some((policy, rule)) = sides.iter().find_map(|(_, side)| admitted(side)) {
                return (policy, rule);
            }
            // Nothing admitted it: a pod that must be isolated is not.
            for (way, side) in sides {
                if *side == Side::NotIsolated
                    && let Some(found) = self.isolating(mismatch, way)
                {
                    return found;
                }
            }
        } else {
            // What would have admitted the side that refused it.
            for (way, side) in sides {
                if *side == Side::Denied
                    && let Some(found) = self.admitting(mismatch, way)
                {
                    return found;
                }
            }
        }
        (WORKERS_POLICY.to_owned(), "spec".to_owned())
    }

    /// The mismatch's two ends, found again in the model.
    fn ends(&self, mismatch: &Mismatch) -> Option<(Endpoint<'_>, Endpoint<'_>)> {
        let from = self
            .model
            .endpoints(mismatch.case.from)
            .into_iter()
            .find(|e| e.to_string() == mismatch.from)?;
        let to = self
            .model
            .endpoints(mismatch.case.to)
            .into_iter()
            .find(|e| e.to_string() == mismatch.to)?;
        Some((from, to))
    }

    fn judge(&self, set: &PolicySet, mismatch: &Mismatch, way: Way) -> Option<Side> {
        let (from, to) = self.ends(mismatch)?;
        let verdict = set.evaluate(
            self.model.cluster(),
            from,
            to,
            mismatch.port,
            mismatch.case.protocol,
        );
        Some(match way {
            Way::Egress => verdict.egress,
            Way::Ingress => verdict.ingress,
        })
    }

    /// The reference rule that admits the connection on `way`.
    fn admitting(&self, mismatch: &Mismatch, way: Way) -> Option<(String, String)> {
        admitted(&self.judge(&self.reference, mismatch, way)?)
    }

    /// The reference policy that, alone, isolates the connection's pod on `way`.
    fn isolating(&self, mismatch: &Mismatch, way: Way) -> Option<(String, String)> {
        self.each.iter().find_map(|(name, set)| {
            (self.judge(set, mismatch, way)? == Side::Denied)
                .then(|| (name.clone(), "spec.podSelector".to_owned()))
        })
    }
}

fn admitted(side: &Side) -> Option<(String, String)> {
    match side {
        Side::Admitted { policy, rule } => Some((policy.clone(), rule.clone())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser as _;
    use corral::cli::{Cli, Command, ControllerArgs, ControllerCommand};

    fn parse(args: &[&str]) -> Result<NetworkPolicyArgs, clap::Error> {
        let argv = ["corral", "controller", "network-policy"]
            .iter()
            .chain(args);
        match Cli::try_parse_from(argv).map(|cli| cli.command) {
            Ok(Command::Controller(ControllerArgs {
                command: Some(ControllerCommand::NetworkPolicy(policy)),
                ..
            })) => Ok(*policy),
            Ok(_) => panic!("parsed as another command"),
            Err(error) => Err(error),
        }
    }

    const KIND: [&str; 6] = [
        "--proxy",
        "pods:3128",
        "--turn",
        "pods:3478",
        "--broker",
        "pods:8000",
    ];

    fn kind() -> Deployment {
        deployment(&parse(&KIND).expect("parses")).expect("valid")
    }

    fn rendered(deployment: &Deployment) -> serde_json::Value {
        policy_list(&network_policies(deployment).expect("renders"))
    }

    #[test]
    fn iso_05_network_policy_takes_three_peers_or_isolated_and_two_namespaces() {
        let parsed = parse(&KIND).expect("parses");
        assert_eq!(parsed.workers.namespace, "corral");
        assert_eq!(parsed.system_namespace, "corral-system");
        assert_eq!(parsed.turn, Some(Reach::Pods(3478)));
        assert!(!parsed.isolated);
        let both = parse(&[
            "--proxy",
            "pods:3128",
            "--turn",
            "pods+192.0.2.30:3478",
            "--broker",
            "10.0.0.3:8000",
        ])
        .expect("parses");
        assert_eq!(
            both.turn,
            Some(Reach::PodsAnd("192.0.2.30:3478".parse().unwrap()))
        );
        assert!(parse(&KIND[..4]).is_err(), "--broker is required");
        assert!(parse(&["--proxy", "proxy.example:3128"]).is_err(), "a name");
        let isolated = parse(&["--isolated", "--namespace", "sandboxes"]).expect("parses");
        assert_eq!(
            deployment(&isolated).expect("valid").egress,
            WorkerEgress::Denied
        );
        let error = parse(&["--isolated", "--proxy", "pods:3128"])
            .err()
            .expect("refused");
        assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
        assert!(
            parse(&["--pool", "default", "--isolated"]).is_err(),
            "no pool"
        );
        let shared = parse(&["--isolated", "--system-namespace", "corral"]).expect("parses");
        assert!(deployment(&shared).unwrap_err().contains("share namespace"));
        let argv = [
            "corral",
            "controller",
            "--valkey",
            "redis://x",
            "network-policy",
        ];
        assert!(
            Cli::try_parse_from(argv).is_err(),
            "flags or a tool, not both"
        );
    }

    #[test]
    fn iso_05_the_rendered_policies_pass_their_own_check_and_not_another_deployments() {
        let kind = kind();
        let text = rendered(&kind).to_string();
        assert_eq!(findings(&kind, &text).expect("reads"), Vec::<String>::new());
        // An array, or a List of Lists, reads the same.
        let items = rendered(&kind)["items"].clone();
        assert_eq!(
            findings(&kind, &items.to_string()).expect("reads"),
            Vec::<String>::new()
        );
        // EGR-8: the admitting form is not the isolated deployment's.
        let isolated = deployment(&parse(&["--isolated"]).expect("parses")).expect("valid");
        let wrong = findings(&isolated, &text).expect("reads");
        assert!(!wrong.is_empty());
        assert!(
            wrong.iter().all(|line| line.starts_with(
                "NetworkPolicy/corral-workers spec.egress[" // what admitted it
            ) && line.contains("expected deny, got allowed")),
            "{wrong:#?}"
        );
        let denied = rendered(&isolated).to_string();
        assert_eq!(
            findings(&isolated, &denied).expect("reads"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn iso_05_a_widened_or_missing_policy_is_laid_at_the_policy_and_rule_to_blame() {
        let kind = kind();
        let mut list = rendered(&kind);
        // Egress to anywhere on 443.
        list["items"][1]["spec"]["egress"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
                "ports": [{"port": 443, "protocol": "TCP"}]
            }));
        let wrong = findings(&kind, &list.to_string()).expect("reads");
        assert!(!wrong.is_empty());
        for line in &wrong {
            assert!(
                line.starts_with("NetworkPolicy/corral-workers spec.egress[3]: case "),
                "{line}"
            );
            assert!(line.contains(":443/TCP"), "{line}");
        }
        // The namespace's deny dropped: the stray pod is not isolated.
        let mut list = rendered(&kind);
        list["items"].as_array_mut().unwrap().remove(0);
        let wrong = findings(&kind, &list.to_string()).expect("reads");
        assert!(!wrong.is_empty());
        assert!(
            wrong.iter().all(|line| line.starts_with(
                "NetworkPolicy/corral-workers-namespace-deny spec.podSelector: case "
            ) && line.contains("stray")),
            "{wrong:#?}"
        );
        // The workers' policy dropped: what it admits is laid at its rules.
        let mut list = rendered(&kind);
        list["items"].as_array_mut().unwrap().remove(1);
        let wrong = findings(&kind, &list.to_string()).expect("reads");
        assert!(
            wrong.iter().any(|line| line
                .starts_with("NetworkPolicy/corral-workers spec.egress[0]: case 0 ")
                && line.contains("expected allow, got denied")),
            "{wrong:#?}"
        );
        assert!(
            wrong
                .iter()
                .any(|line| line.starts_with("NetworkPolicy/corral-workers spec.ingress[1]: ")),
            "{wrong:#?}"
        );
    }

    #[test]
    fn iso_05_a_policy_the_api_server_refuses_is_named_with_its_field() {
        let kind = kind();
        let mut list = rendered(&kind);
        list["items"][1]["spec"]["egress"][0]["to"][0]["ipBlock"] =
            serde_json::json!({"cidr": "10.0.0.0/33"});
        assert_eq!(
            findings(&kind, &list.to_string()).expect("reads"),
            [
                "NetworkPolicy/corral-workers spec.egress[0].to[0]: ipBlock may not be combined with podSelector or namespaceSelector (the API server refuses it)"
            ]
        );
        assert!(findings(&kind, "{").is_err());
        let mut list = rendered(&kind);
        list["items"][0]["spec"] = serde_json::json!("nothing");
        assert!(findings(&kind, &list.to_string()).is_err());
    }
}
