//! Decisions per second of `corral-core::egress`: the work the proxy does per connection besides
//! I/O. Run with `cargo bench -p corral-benches --bench egress`.

use std::hint::black_box;
use std::net::IpAddr;

use corral_core::egress::{
    EgressSettings, ExecutionId, GrantRequest, GrantSigner, TokenTtl, classify, decide_answer,
    parse_absolute_url, parse_connect_authority, resolve,
};
use corral_core::ids::ActorId;
use corral_core::time::UnixMillis;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn policy(mode: &str) -> corral_core::egress::Policy {
    resolve(&EgressSettings {
        enabled: None,
        mode: Some(mode),
        allowed_ports: None,
        private_cidrs: Some("10.0.0.0/8,fd00::/8"),
        allowed_hosts: Some("pypi.org,files.pythonhosted.org,registry.npmjs.org"),
        token_ttl_seconds: None,
        proxy_address_present: true,
        field_key_present: true,
    })
    .policy
}

fn decisions(c: &mut Criterion) {
    let public = policy("public_internet");
    let allowlist = policy("host_allowlist");
    let answer: Vec<IpAddr> = vec![
        "93.184.216.34".parse().unwrap(),
        "2606:2800:220:1::1".parse().unwrap(),
    ];
    let mut group = c.benchmark_group("egress");
    group.throughput(Throughput::Elements(1));
    group.bench_function("parse_connect_authority", |b| {
        b.iter(|| parse_connect_authority(black_box("Files.PythonHosted.org.:443")))
    });
    group.bench_function("parse_absolute_url", |b| {
        b.iter(|| parse_absolute_url(black_box("http://example.com:8080/simple/pandas/?x=1")))
    });
    group.bench_function("classify_v6", |b| {
        let ip: IpAddr = "2606:2800:220:1::1".parse().unwrap();
        b.iter(|| classify(black_box(ip)))
    });
    group.bench_function("decide_name_public_2_answers", |b| {
        b.iter(|| {
            let target = parse_connect_authority(black_box("example.com:443")).unwrap();
            decide_answer(&public, &target, black_box(&answer))
        })
    });
    group.bench_function("decide_name_allowlist_2_answers", |b| {
        b.iter(|| {
            let target = parse_connect_authority(black_box("pypi.org:443")).unwrap();
            decide_answer(&allowlist, &target, black_box(&answer))
        })
    });
    let signer = GrantSigner::from_field_key(b"bench-field-key-0123456789abcdef").unwrap();
    let actor = ActorId("actor".into());
    let token = signer
        .mint(&GrantRequest {
            policy: &allowlist,
            provider_hint: None,
            run: "run-1",
            actor: &actor,
            execution_id: ExecutionId([1; 16]),
            policy_revision: 1,
            now: UnixMillis(1_000_000),
            ttl: TokenTtl::DEFAULT,
        })
        .unwrap()
        .token;
    let verifier = signer.verifier();
    group.bench_function("grant_verify", |b| {
        b.iter(|| verifier.verify(black_box(&token), UnixMillis(1_000_001)))
    });
    group.bench_function("grant_verify_then_decide", |b| {
        b.iter(|| {
            let claims = verifier
                .verify(black_box(&token), UnixMillis(1_000_001))
                .unwrap();
            let target = parse_connect_authority(black_box("pypi.org:443")).unwrap();
            decide_answer(&claims.policy, &target, black_box(&answer))
        })
    });
    group.finish();
}

criterion_group!(benches, decisions);
criterion_main!(benches);
