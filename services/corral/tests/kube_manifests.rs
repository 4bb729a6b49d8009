//! The Kubernetes manifests' static checks (issue 26): `kind-cluster/check` renders each overlay
//! with the pinned `kubectl kustomize`, validates every object against Kubernetes 1.37.0's strict
//! schemas offline, and lints it. The real overlays pass; each deliberately broken overlay under
//! `kind-cluster/testdata/broken/` fails with exactly the object and field it broke named.
//!
//! The workers' NetworkPolicies are judged by this package's own binary (`corral controller
//! network-policy --check`, decision 0031), which the check is given as `CORRAL`; the committed
//! policies under `kind-cluster/base/network-policy` are what that binary renders.
//!
//! Needs python3 and the pinned tools (`scripts/setup-services --tests`); without them the tests
//! skip for `Need::Tools`, which CI turns into a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use corral_testkit::{Need, skip};

/// The check's exit status when its pinned tools are not installed.
const TOOLS_MISSING: i32 = 3;

fn kind_cluster() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kind-cluster")
}

/// Runs `python3 kind-cluster/check ARGS` with this build's `corral`, or skips `test` when python3
/// or the tools are missing.
fn check(test: &str, args: &[&str]) -> Option<Output> {
    let dir = kind_cluster();
    let output = match Command::new("python3")
        .arg(dir.join("check"))
        .args(args)
        .current_dir(&dir)
        .env("CORRAL", env!("CARGO_BIN_EXE_corral"))
        .output()
    {
        Ok(output) => output,
        Err(error) => {
            skip(test, Need::Tools, &format!("python3 does not run: {error}"));
            return None;
        }
    };
    if output.status.code() == Some(TOOLS_MISSING) {
        let why = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        skip(test, Need::Tools, &why);
        return None;
    }
    Some(output)
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn kube_manifests_the_overlays_and_optional_components_validate_and_lint_clean() {
    let test = "kube_manifests_the_overlays_and_optional_components_validate_and_lint_clean";
    // The overlays, and the kind overlay with the optional components (gVisor, agent-sandbox).
    let dirs = [
        "overlays/kind",
        "overlays/production",
        "testdata/ok/kind-with-components",
    ];
    let Some(output) = check(test, &dirs) else {
        return;
    };
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}{stderr}");
    // No container goes unprobed: the controller serves /healthz and /readyz too.
    assert!(!stdout.contains("no probes"), "a probe waiver: {stdout}");
    for overlay in dirs {
        let clean = stdout.lines().any(|line| {
            line.starts_with(&format!("check: {overlay}: ok, "))
                && line.ends_with(
                    " objects valid against Kubernetes 1.37.0's strict schemas, lint clean",
                )
        });
        assert!(clean, "{overlay} was not checked clean:\n{stdout}{stderr}");
    }
}

/// Each broken overlay and every line the check must print for it, exactly (`<overlay>
/// <Kind>/<name> <field path>: <problem>`, the problem's words after the first colon included).
const BROKEN: &[(&str, &[&str])] = &[
    (
        "widened-network-policy",
        &[
            "NetworkPolicy/corral-workers spec.egress[3]: a rule the flags in base/network-policy/network-policy.flags do not render (to ipBlock 0.0.0.0/0 on TCP 443)",
            "NetworkPolicy/corral-workers spec.egress[3]: case 17 (worker-a [pod corral/w-1-1] -> internet [address 93.184.216.34] :443/TCP; ISO-5: never the internet directly): expected deny, got allowed (egress: admitted by corral/corral-workers spec.egress[3]; ingress: not a pod)",
            "NetworkPolicy/corral-workers spec.egress[3]: case 32 (worker-gvisor [pod corral/w-1-3] -> internet [address 93.184.216.34] :443/TCP; ISO-3: a gVisor worker's egress is the same): expected deny, got allowed (egress: admitted by corral/corral-workers spec.egress[3]; ingress: not a pod)",
        ],
    ),
    (
        "widened-network-policy-cidr",
        &[
            "NetworkPolicy/corral-workers spec.egress[1].to[1]: ipBlock 192.0.2.0/24: a peer the flags in overlays/production/network-policy.flags do not render in this rule (they render pods app.kubernetes.io/name=corral-turn,app.kubernetes.io/part-of=corral in corral-system, ipBlock 192.0.2.30/32)",
            "NetworkPolicy/corral-workers spec.egress[1]: case 16 (worker-a [pod corral/w-1-1] -> turn-neighbour [address 192.0.2.31] :3478/UDP; ISO-5: the authority's exact address): expected deny, got allowed (egress: admitted by corral/corral-workers spec.egress[1]; ingress: not a pod)",
        ],
    ),
    (
        "removed-network-policy",
        &[
            "NetworkPolicy/corral-workers spec: missing: the flags in base/network-policy/network-policy.flags render it in corral (decision 0031)",
            "NetworkPolicy/corral-workers spec.egress[0]: case 0 (worker-a [pod corral/w-1-1] -> egress-proxy [pod corral-system/egress-proxy] :3128/TCP; ISO-5: the egress proxy): expected allow, got denied (egress: denied; ingress: not isolated)",
            "NetworkPolicy/corral-workers spec.egress[2]: case 4 (worker-a [pod corral/w-1-1] -> broker [pod corral-system/api] :8000/TCP; ISO-5: the API's package broker): expected allow, got denied (egress: denied; ingress: not isolated)",
            "NetworkPolicy/corral-workers spec.egress[1]: case 9 (worker-a [pod corral/w-1-1] -> turn [pod corral-system/coturn] :3478/UDP; ISO-5: the TURN authority over UDP): expected allow, got denied (egress: denied; ingress: not isolated)",
            "NetworkPolicy/corral-workers spec.egress[1]: case 10 (worker-a [pod corral/w-1-1] -> turn [pod corral-system/coturn] :3478/TCP; ISO-5: the TURN authority over plain TCP): expected allow, got denied (egress: denied; ingress: not isolated)",
            "NetworkPolicy/corral-workers spec.egress[2]: case 29 (worker-b [pod corral/w-1-2] -> broker [pod corral-system/api] :8000/TCP; ISO-5: every worker of the pool): expected allow, got denied (egress: denied; ingress: not isolated)",
            "NetworkPolicy/corral-workers spec.egress[0]: case 30 (worker-gvisor [pod corral/w-1-3] -> egress-proxy [pod corral-system/egress-proxy] :3128/TCP; ISO-3: a gVisor worker's egress is the same): expected allow, got denied (egress: denied; ingress: not isolated)",
            "NetworkPolicy/corral-workers spec.egress[1]: case 31 (worker-gvisor [pod corral/w-1-3] -> turn [pod corral-system/coturn] :3478/UDP; ISO-3: a gVisor worker's egress is the same): expected allow, got denied (egress: denied; ingress: not isolated)",
            "NetworkPolicy/corral-workers spec.ingress[0]: case 33 (api [pod corral-system/api] -> worker-a [pod corral/w-1-1] :8091/TCP; BROW-7: the API on the control port): expected allow, got denied (egress: not isolated; ingress: denied)",
            "NetworkPolicy/corral-workers spec.ingress[0]: case 34 (api [pod corral-system/api] -> worker-a [pod corral/w-1-1] :8080/TCP; BROW-7: the API on the browser port): expected allow, got denied (egress: not isolated; ingress: denied)",
            "NetworkPolicy/corral-workers spec.ingress[0]: case 37 (api [pod corral-system/api] -> worker-b [pod corral/w-1-2] :8080/TCP; BROW-7: the API reaches every worker): expected allow, got denied (egress: not isolated; ingress: denied)",
            "NetworkPolicy/corral-workers spec.ingress[0]: case 38 (api [pod corral-system/api] -> worker-gvisor [pod corral/w-1-3] :8091/TCP; ISO-3: a gVisor worker is reached the same): expected allow, got denied (egress: not isolated; ingress: denied)",
            "NetworkPolicy/corral-workers spec.ingress[1]: case 39 (controller [pod corral-system/controller] -> worker-a [pod corral/w-1-1] :8091/TCP; ISO-2: the controller resets workers): expected allow, got denied (egress: not isolated; ingress: denied)",
            "NetworkPolicy/corral-workers spec.ingress[1]: case 40 (controller [pod corral-system/controller] -> worker-gvisor [pod corral/w-1-3] :8091/TCP; ISO-3: a gVisor worker is reset the same): expected allow, got denied (egress: not isolated; ingress: denied)",
        ],
    ),
    (
        "removed-namespace-deny",
        &[
            "NetworkPolicy/corral-workers-namespace-deny spec: missing: the flags in base/network-policy/network-policy.flags render it in corral (decision 0031)",
            "NetworkPolicy/corral-workers-namespace-deny spec.podSelector: case 54 (stray [pod corral/stray] -> internet [address 93.184.216.34] :443/TCP; 0007: nothing else runs beside workers): expected deny, got allowed (egress: not isolated; ingress: not a pod)",
            "NetworkPolicy/corral-workers-namespace-deny spec.podSelector: case 55 (stray [pod corral/stray] -> egress-proxy [pod corral-system/egress-proxy] :3128/TCP; 0007: nothing else runs beside workers): expected deny, got allowed (egress: not isolated; ingress: not isolated)",
            "NetworkPolicy/corral-workers-namespace-deny spec.podSelector: case 56 (api [pod corral-system/api] -> stray [pod corral/stray] :8091/TCP; 0007: nothing else runs beside workers): expected deny, got allowed (egress: not isolated; ingress: not isolated)",
        ],
    ),
    (
        "extra-network-policy",
        &[
            "NetworkPolicy/workers-allow-dns spec.egress: admits egress in the workers' namespace corral: policies add up, so it widens the workers' own (decision 0031)",
            "NetworkPolicy/workers-allow-dns spec.egress[0]: case 21 (worker-a [pod corral/w-1-1] -> dns [pod kube-system/coredns] :53/UDP; ISO-5: no DNS; workers are given addresses): expected deny, got allowed (egress: admitted by corral/workers-allow-dns spec.egress[0]; ingress: not isolated)",
            "NetworkPolicy/workers-allow-dns spec.egress[0]: case 22 (worker-a [pod corral/w-1-1] -> dns [pod kube-system/coredns] :53/TCP; ISO-5: no DNS; workers are given addresses): expected deny, got allowed (egress: admitted by corral/workers-allow-dns spec.egress[0]; ingress: not isolated)",
        ],
    ),
    (
        "dropped-limit",
        &[
            "Deployment/corral-api spec.template.spec.containers[api].resources.limits.memory: missing: every container needs a memory limit",
        ],
    ),
    (
        "host-path",
        &[
            "Deployment/corral-egress-proxy spec.template.spec.volumes[node-logs].hostPath: a host path (/var/log)",
        ],
    ),
    (
        "host-network",
        &[
            "Deployment/corral-valkey spec.template.spec.hostNetwork: the host's namespaces are never shared",
        ],
    ),
    (
        "host-pid",
        &[
            "Deployment/corral-turn spec.template.spec.hostPID: the host's namespaces are never shared",
        ],
    ),
    (
        "privileged-container",
        &[
            "PodTemplate/corral-worker template.spec.containers[worker].securityContext.privileged: a privileged container (decision 0007 refuses it, the worker included)",
            "PodTemplate/corral-worker template.spec.containers[worker].securityContext.privileged: true where the controller (Deployment/corral-controller's flags) creates false (decision 0032)",
        ],
    ),
    (
        "worker-extra-capability",
        &[
            "PodTemplate/corral-worker template.spec.containers[worker].securityContext.capabilities.add: NET_ADMIN: beyond decision 0007's worker capabilities",
            "PodTemplate/corral-worker template.spec.containers[worker].securityContext.capabilities.add: [\"SYS_ADMIN\", \"SETUID\", \"SETGID\", \"CHOWN\", \"FOWNER\", \"DAC_OVERRIDE\", \"KILL\", \"NET_ADMIN\"] where the controller (Deployment/corral-controller's flags) creates [\"SYS_ADMIN\", \"SETUID\", \"SETGID\", \"CHOWN\", \"FOWNER\", \"DAC_OVERRIDE\", \"KILL\"] (decision 0032)",
        ],
    ),
    (
        "capability-outside-worker",
        &[
            "Deployment/corral-controller spec.template.spec.containers[controller].securityContext.capabilities.add: SYS_ADMIN: only decision 0007's worker adds capabilities",
        ],
    ),
    (
        "privileged-namespace",
        &[
            "Namespace/corral-system metadata.labels.pod-security.kubernetes.io/enforce: privileged is for the workers' namespace alone (decision 0007)",
        ],
    ),
    (
        "latest-tag",
        &[
            "Deployment/corral-api spec.template.spec.containers[api].image: corral/api:latest: the `latest` tag (pin the image by digest)",
            "Deployment/corral-api spec.template.spec.containers[api].image: corral/api:latest: no digest (an image is pinned by @sha256:...)",
        ],
    ),
    (
        "image-without-digest",
        &[
            "Deployment/corral-egress-proxy spec.template.spec.containers[egress-proxy].image: corral/egress-proxy:0.1.0: no digest (an image is pinned by @sha256:...)",
        ],
    ),
    (
        "missing-probe",
        &[
            "Deployment/corral-api spec.template.spec.containers[api].readinessProbe: missing: every serving container is probed",
        ],
    ),
    (
        "inlined-secret",
        &[
            "Deployment/corral-api spec.template.spec.containers[api].env[SANDBOX_FIELD_KEY].value: a credential's value inlined: take it from a Secret (valueFrom.secretKeyRef, or a mounted file and *_FILE)",
        ],
    ),
    (
        "schema-unknown-field",
        &[
            "Deployment/corral-controller spec.template.spec.containers[controller].imagePullPolicyy: unknown field (not in Kubernetes 1.37.0's schema)",
        ],
    ),
    (
        "worker-pod-drift",
        &[
            "PodTemplate/corral-worker template.spec.containers[worker].resources.limits.memory: \"3Gi\" where the controller (Deployment/corral-controller's flags) creates \"8Gi\" (decision 0032)",
        ],
    ),
    (
        "schema-wrong-type",
        &[
            "Deployment/corral-egress-proxy spec.replicas: schema: 'two' is not of type 'integer', 'null'",
        ],
    ),
];

#[test]
fn iso_05_kube_manifests_each_broken_overlay_fails_naming_the_object_and_field() {
    let test = "iso_05_kube_manifests_each_broken_overlay_fails_naming_the_object_and_field";
    let dirs: Vec<String> = BROKEN
        .iter()
        .map(|(case, _)| format!("testdata/broken/{case}"))
        .collect();
    // Every broken case on disk is in the table, so none goes unasserted.
    let mut on_disk: Vec<String> = std::fs::read_dir(kind_cluster().join("testdata/broken"))
        .expect("kind-cluster/testdata/broken")
        .flatten()
        .map(|entry| format!("testdata/broken/{}", entry.file_name().to_string_lossy()))
        .collect();
    on_disk.sort();
    let mut listed = dirs.clone();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "a broken overlay without expectations, or the reverse"
    );

    let args: Vec<&str> = dirs.iter().map(String::as_str).collect();
    let Some(output) = check(test, &args) else {
        return;
    };
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    for ((case, expected), dir) in BROKEN.iter().zip(&dirs) {
        // The findings of this case alone: lines that start with its directory.
        let found: Vec<&str> = stdout
            .lines()
            .filter_map(|line| line.strip_prefix(&format!("{dir} ")))
            .collect();
        assert_eq!(
            found,
            expected.to_vec(),
            "{case}: the check's findings differ\n{stdout}{stderr}"
        );
        assert!(
            stdout.contains(&format!("check: {dir}: {} problem(s)", expected.len())),
            "{case}: not counted as failing\n{stdout}"
        );
    }
}

#[test]
fn kube_manifests_a_real_deployment_refuses_the_placeholder_digests() {
    let test = "kube_manifests_a_real_deployment_refuses_the_placeholder_digests";
    let Some(output) = check(test, &["--require-built-images", "overlays/kind"]) else {
        return;
    };
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    let zeros = "0".repeat(64);
    for (kind_name, container, image) in [
        (
            "Deployment/corral-api",
            "spec.template.spec.containers[api]",
            "api",
        ),
        (
            "PodTemplate/corral-worker",
            "template.spec.containers[worker]",
            "worker",
        ),
    ] {
        let line = format!(
            "overlays/kind {kind_name} {container}.image: corral-{image}@sha256:{zeros}: the placeholder digest (run the image build script)"
        );
        assert!(
            stdout.lines().any(|l| l == line),
            "no {line:?} in\n{stdout}"
        );
    }
}

#[test]
fn iso_05_the_committed_network_policies_are_what_the_code_renders() {
    let test = "iso_05_the_committed_network_policies_are_what_the_code_renders";
    let generate = kind_cluster().join("base/network-policy/generate");
    let output = match Command::new("bash")
        .arg(&generate)
        .arg("--check")
        .env("CORRAL", env!("CARGO_BIN_EXE_corral"))
        .output()
    {
        Ok(output) => output,
        Err(error) => {
            skip(test, Need::Tools, &format!("bash does not run: {error}"));
            return;
        }
    };
    let (stdout, stderr) = text(&output);
    assert!(
        output.status.success(),
        "kind-cluster/base/network-policy/workers.json differs from what `corral controller \
         network-policy` renders with network-policy.flags; run {}\n{stdout}{stderr}",
        generate.display()
    );
    assert!(
        stdout.contains("--proxy pods:3128 --turn pods:3478 --broker pods:8000"),
        "{stdout}"
    );
    let committed =
        std::fs::read_to_string(kind_cluster().join("base/network-policy/workers.json"))
            .expect("workers.json");
    for name in ["corral-workers-namespace-deny", "corral-workers"] {
        assert!(
            committed.contains(&format!("\"name\": \"{name}\"")),
            "{name} is not committed"
        );
    }
}
