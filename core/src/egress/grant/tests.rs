//! Tests of minting, verifying, the claims' encoding and the header, each named for what it proves.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::*;
use crate::egress::address::Cidr;
use crate::egress::decide::{Decision, decide_answer};
use crate::egress::mode::TokenTtl;
use crate::egress::policy::{
    ALLOWED_HOSTS_MAX, AllowedHosts, AllowedPorts, Mode, Policy, PrivateCidrs,
    SETTING_LIST_MAX_BYTES,
};
use crate::egress::reason::Reason;
use crate::egress::target::parse_connect_authority;
use crate::ids::ActorId;
use crate::time::UnixMillis;

pub(crate) const FIELD_KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

pub(crate) fn signer() -> GrantSigner {
    GrantSigner::from_field_key(FIELD_KEY).unwrap()
}

fn allowlist() -> Policy {
    Policy::HostAllowlist {
        ports: AllowedPorts::web_default(),
        hosts: AllowedHosts::parse_list("pypi.org,files.pythonhosted.org,registry.npmjs.org")
            .unwrap(),
        cidrs: PrivateCidrs::parse_list("10.9.0.0/16").unwrap(),
    }
}

fn public() -> Policy {
    Policy::PublicInternet {
        ports: AllowedPorts::web_default(),
    }
}

pub(crate) fn request<'a>(policy: &'a Policy, actor: &'a ActorId) -> GrantRequest<'a> {
    GrantRequest {
        policy,
        provider_hint: None,
        run: "run-42",
        actor,
        execution_id: ExecutionId([7; 16]),
        policy_revision: 9,
        now: UnixMillis(1_000_000),
        ttl: TokenTtl::DEFAULT,
    }
}

fn actor() -> ActorId {
    ActorId("member:alice".to_owned())
}

/// Rewrites the claims part of a token with `edit`, keeping the original signature.
fn tamper(token: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims = URL_SAFE_NO_PAD.decode(parts[1]).unwrap();
    edit(&mut claims);
    format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(&claims),
        parts[2]
    )
}

#[test]
fn egr_02_grant_round_trip_binds_every_claim() {
    let actor = actor();
    for policy in [
        public(),
        allowlist(),
        Policy::PrivateNetwork {
            ports: AllowedPorts::new([5432]).unwrap(),
            cidrs: PrivateCidrs::parse_list("10.0.0.0/8,fd00::/8").unwrap(),
        },
    ] {
        let minted = signer().mint(&request(&policy, &actor)).unwrap();
        assert!(minted.token.starts_with("cg1."));
        let claims = signer()
            .verifier()
            .verify(&minted.token, UnixMillis(1_000_001))
            .unwrap();
        assert_eq!(claims, minted.claims);
        assert_eq!(claims.policy, policy);
        assert_eq!(claims.run, "run-42");
        assert_eq!(claims.actor, actor);
        assert_eq!(claims.execution_id, ExecutionId([7; 16]));
        assert_eq!(claims.policy_revision, 9);
        assert_eq!(claims.issued_at, UnixMillis(1_000_000));
        assert_eq!(claims.expires_at, UnixMillis(1_000_000 + 600_000));
    }
}

#[test]
fn the_proxy_judges_by_the_grant_policy() {
    let actor = actor();
    let policy = allowlist();
    let minted = signer().mint(&request(&policy, &actor)).unwrap();
    let claims = signer()
        .verifier()
        .verify(&minted.token, UnixMillis(1_000_001))
        .unwrap();
    let target = parse_connect_authority("pypi.org:443").unwrap();
    let answer = ["151.101.0.223".parse().unwrap()];
    assert!(matches!(
        decide_answer(&claims.policy, &target, &answer),
        Decision::Allow { .. }
    ));
    let other = parse_connect_authority("example.com:443").unwrap();
    assert_eq!(
        decide_answer(&claims.policy, &other, &answer).reason(),
        Some(Reason::HostNotAllowlisted)
    );
}

#[test]
fn egr_06_verified_claims_expire_by_the_same_rule() {
    let actor = actor();
    let policy = public();
    let minted = signer().mint(&request(&policy, &actor)).unwrap();
    let claims = signer()
        .verifier()
        .verify(&minted.token, UnixMillis(1_000_000))
        .unwrap();
    for now in [
        0,
        1_000_000,
        1_000_000 + 600_000 - 1,
        1_000_000 + 600_000,
        u64::MAX,
    ] {
        assert_eq!(
            claims.check_time(UnixMillis(now)),
            signer()
                .verifier()
                .verify(&minted.token, UnixMillis(now))
                .map(|_| ()),
            "{now}"
        );
    }
    assert_eq!(
        claims.check_time(UnixMillis(1_000_000 + 600_000)),
        Err(Reason::GrantExpired)
    );
}

#[test]
fn egr_06_grant_expires_after_its_lifetime() {
    let actor = actor();
    let policy = public();
    let minted = signer().mint(&request(&policy, &actor)).unwrap();
    let verifier = signer().verifier();
    assert!(
        verifier
            .verify(&minted.token, UnixMillis(1_000_000 + 600_000 - 1))
            .is_ok()
    );
    assert_eq!(
        verifier.verify(&minted.token, UnixMillis(1_000_000 + 600_000)),
        Err(Reason::GrantExpired)
    );
    assert_eq!(
        verifier.verify(&minted.token, UnixMillis(u64::MAX)),
        Err(Reason::GrantExpired)
    );
}

#[test]
fn grant_from_the_future_is_not_yet_valid() {
    let actor = actor();
    let policy = public();
    let minted = signer().mint(&request(&policy, &actor)).unwrap();
    let verifier = signer().verifier();
    assert!(
        verifier
            .verify(
                &minted.token,
                UnixMillis(1_000_000 - GRANT_CLOCK_SKEW_MAX_MS)
            )
            .is_ok()
    );
    assert_eq!(
        verifier.verify(
            &minted.token,
            UnixMillis(1_000_000 - GRANT_CLOCK_SKEW_MAX_MS - 1)
        ),
        Err(Reason::GrantNotYetValid)
    );
}

#[test]
fn egr_06_lifetime_above_the_ceiling_is_refused_even_if_signed() {
    let actor = actor();
    let policy = public();
    let mut claims = signer().mint(&request(&policy, &actor)).unwrap().claims;
    claims.expires_at = claims
        .issued_at
        .plus_ms(TokenTtl::CEILING_SECONDS * 1000 + 1);
    let token = signer().sign_claims(&claims);
    assert_eq!(
        signer().verifier().verify(&token, claims.issued_at),
        Err(Reason::GrantLifetimeTooLong)
    );
    claims.expires_at = claims.issued_at.plus_ms(TokenTtl::CEILING_SECONDS * 1000);
    let token = signer().sign_claims(&claims);
    assert!(signer().verifier().verify(&token, claims.issued_at).is_ok());
}

#[test]
fn egr_02_tampered_claims_fail_the_signature() {
    let actor = actor();
    let policy = public();
    let token = signer().mint(&request(&policy, &actor)).unwrap().token;
    let verifier = signer().verifier();
    // Flip a bit in the expiry.
    let longer = tamper(&token, |c| {
        let n = c.len();
        c[n - 9] ^= 0x01;
    });
    assert_eq!(
        verifier.verify(&longer, UnixMillis(1_000_001)),
        Err(Reason::GrantBadSignature)
    );
    // Add a port.
    let more_ports = tamper(&token, |c| {
        c[2] = 3;
        c.splice(3..3, [0u8, 22]);
    });
    assert_eq!(
        verifier.verify(&more_ports, UnixMillis(1_000_001)),
        Err(Reason::GrantBadSignature)
    );
}

#[test]
fn egr_02_mode_rewritten_fails_the_signature() {
    let actor = actor();
    let policy = Policy::PrivateNetwork {
        ports: AllowedPorts::web_default(),
        cidrs: PrivateCidrs::parse_list("10.0.0.0/8").unwrap(),
    };
    let token = signer().mint(&request(&policy, &actor)).unwrap().token;
    // private_network (2) rewritten to host_allowlist (3): still a well-formed encoding.
    let rewritten = tamper(&token, |c| c[1] = 3);
    assert_eq!(
        signer()
            .verifier()
            .verify(&rewritten, UnixMillis(1_000_001)),
        Err(Reason::GrantBadSignature)
    );
}

#[test]
fn egr_07_another_key_fails_the_signature() {
    let actor = actor();
    let policy = public();
    let token = signer().mint(&request(&policy, &actor)).unwrap().token;
    let other = GrantSigner::from_field_key(b"another field key, 32 bytes long").unwrap();
    assert_eq!(
        other.verifier().verify(&token, UnixMillis(1_000_001)),
        Err(Reason::GrantBadSignature)
    );
}

#[test]
fn egr_07_signing_key_derives_from_the_field_key_and_the_verifier_from_its_public_half() {
    let a = GrantSigner::from_field_key(FIELD_KEY).unwrap().verifier();
    let b = GrantSigner::from_field_key(FIELD_KEY).unwrap().verifier();
    assert_eq!(a, b, "deterministic: the proxy follows the field key");
    let c = GrantSigner::from_field_key(b"0123456789abcdef0123456789abcdeF")
        .unwrap()
        .verifier();
    assert_ne!(a, c);
    let published = a.public_key_text();
    assert_eq!(published.len(), 43);
    let proxy = GrantVerifier::from_public_key_text(&published).unwrap();
    assert_eq!(proxy, a);
    assert_eq!(
        GrantVerifier::from_public_key_bytes(&a.public_key_bytes()).unwrap(),
        a
    );
    // The public key is not the field key or the seed spelled otherwise.
    assert_ne!(&a.public_key_bytes()[..], &FIELD_KEY[..32]);
    assert_eq!(
        GrantSigner::from_field_key(b"short").unwrap_err(),
        KeyError::FieldKeyTooShort
    );
    assert_eq!(
        GrantSigner::from_field_key(b"").unwrap_err(),
        KeyError::FieldKeyTooShort
    );
}

#[test]
fn weak_or_malformed_public_keys_are_refused() {
    let mut identity = [0u8; 32];
    identity[0] = 1;
    assert_eq!(
        GrantVerifier::from_public_key_bytes(&identity),
        Err(KeyError::PublicKeyWeak)
    );
    assert_eq!(
        GrantVerifier::from_public_key_bytes(&[1u8; 31]),
        Err(KeyError::PublicKeyMalformed)
    );
    assert_eq!(
        GrantVerifier::from_public_key_text("not-a-key"),
        Err(KeyError::PublicKeyMalformed)
    );
    assert_eq!(
        GrantVerifier::from_public_key_text(&"A".repeat(44)),
        Err(KeyError::PublicKeyMalformed)
    );
}

#[test]
fn malformed_tokens_are_refused() {
    let actor = actor();
    let policy = public();
    let token = signer().mint(&request(&policy, &actor)).unwrap().token;
    let v = signer().verifier();
    let now = UnixMillis(1_000_001);
    assert_eq!(v.verify("", now), Err(Reason::GrantMissing));
    assert_eq!(v.verify("garbage", now), Err(Reason::GrantMalformed));
    assert_eq!(
        v.verify(&format!("{token}.x"), now),
        Err(Reason::GrantMalformed)
    );
    assert_eq!(
        v.verify(&token.replacen("cg1", "cg2", 1), now),
        Err(Reason::GrantUnsupportedVersion)
    );
    assert_eq!(
        v.verify(&token.replacen("cg1", "xx1", 1), now),
        Err(Reason::GrantMalformed)
    );
    let truncated = &token[..token.len() - 2];
    assert!(matches!(
        v.verify(truncated, now),
        Err(Reason::GrantMalformed | Reason::GrantBadSignature)
    ));
    assert_eq!(
        v.verify(&"a".repeat(GRANT_TOKEN_MAX_BYTES + 1), now),
        Err(Reason::GrantTooLarge)
    );
    let padded = token.replacen('.', "=.", 2);
    assert_eq!(v.verify(&padded, now), Err(Reason::GrantMalformed));
}

#[test]
fn egr_06_each_grant_binds_its_execution_id() {
    let actor = actor();
    let policy = public();
    let mut first = request(&policy, &actor);
    first.execution_id = ExecutionId([1; 16]);
    let mut second = first;
    second.execution_id = ExecutionId([2; 16]);
    let a = signer().mint(&first).unwrap();
    let b = signer().mint(&second).unwrap();
    assert_ne!(a.token, b.token);
    assert_eq!(
        signer()
            .verifier()
            .verify(&b.token, UnixMillis(1_000_001))
            .unwrap()
            .execution_id,
        ExecutionId([2; 16])
    );
    assert_eq!(ExecutionId([0xab; 16]).to_string(), "ab".repeat(16));
}

#[test]
fn egr_08_isolated_gets_no_credential() {
    let actor = actor();
    assert_eq!(
        signer()
            .mint(&request(&Policy::Isolated, &actor))
            .unwrap_err(),
        MintError::ModeIsolated
    );
}

#[test]
fn egr_04_hint_narrows_host_allowlist_to_the_intersection() {
    let actor = actor();
    let policy = allowlist();
    let hint = [
        "PyPI.org.",
        "evil.example",
        "files.pythonhosted.org",
        "*bad*",
    ];
    let mut req = request(&policy, &actor);
    req.provider_hint = Some(&hint);
    let claims = signer().mint(&req).unwrap().claims;
    let Policy::HostAllowlist { hosts, .. } = &claims.policy else {
        panic!("host_allowlist")
    };
    let names: Vec<String> = hosts.iter().map(ToString::to_string).collect();
    assert_eq!(names, vec!["files.pythonhosted.org", "pypi.org"]);
}

#[test]
fn egr_04_hint_cannot_broaden() {
    let actor = actor();
    let policy = allowlist();
    let hint = ["evil.example"];
    let mut req = request(&policy, &actor);
    req.provider_hint = Some(&hint);
    assert_eq!(
        signer().mint(&req).unwrap_err(),
        MintError::HintMatchesNoHost
    );
    let empty: [&str; 0] = [];
    req.provider_hint = Some(&empty);
    assert_eq!(
        signer().mint(&req).unwrap_err(),
        MintError::HintMatchesNoHost
    );
}

#[test]
fn egr_04_hint_is_ignored_outside_host_allowlist() {
    let hint = ["pypi.org"];
    for policy in [
        public(),
        Policy::PrivateNetwork {
            ports: AllowedPorts::web_default(),
            cidrs: PrivateCidrs::parse_list("10.0.0.0/8").unwrap(),
        },
        Policy::Isolated,
    ] {
        assert_eq!(narrow_by_hint(&policy, Some(&hint)), policy);
    }
    assert_eq!(narrow_by_hint(&allowlist(), None), allowlist());
    assert_eq!(
        narrow_by_hint(&allowlist(), Some(&hint)).mode(),
        Mode::HostAllowlist
    );
}

#[test]
fn mint_refuses_bad_run_and_actor_ids() {
    let actor = actor();
    let policy = public();
    let mut req = request(&policy, &actor);
    let too_long = "r".repeat(RUN_ID_MAX_BYTES + 1);
    for run in ["", "has space", too_long.as_str()] {
        req.run = run;
        assert_eq!(
            signer().mint(&req).unwrap_err(),
            MintError::RunInvalid,
            "{run:?}"
        );
    }
    req.run = "run-1";
    let bad_actor = ActorId("a\nb".to_owned());
    req.actor = &bad_actor;
    assert_eq!(signer().mint(&req).unwrap_err(), MintError::ActorInvalid);
}

#[test]
fn proxy_authorization_header_parsing() {
    assert_eq!(
        parse_proxy_authorization(Some("Bearer cg1.abc.def")),
        Ok("cg1.abc.def")
    );
    assert_eq!(
        parse_proxy_authorization(Some("bearer   cg1.a-b_c.d")),
        Ok("cg1.a-b_c.d")
    );
    assert_eq!(parse_proxy_authorization(None), Err(Reason::GrantMissing));
    assert_eq!(
        parse_proxy_authorization(Some("")),
        Err(Reason::GrantMissing)
    );
    assert_eq!(
        parse_proxy_authorization(Some("Bearer")),
        Err(Reason::GrantMissing)
    );
    assert_eq!(
        parse_proxy_authorization(Some("Bearer ")),
        Err(Reason::GrantMissing)
    );
    assert_eq!(
        parse_proxy_authorization(Some("Basic dXNlcjpwYXNz")),
        Err(Reason::GrantWrongScheme)
    );
    assert_eq!(
        parse_proxy_authorization(Some("Token abc")),
        Err(Reason::GrantWrongScheme)
    );
    assert_eq!(
        parse_proxy_authorization(Some("Bearer a b")),
        Err(Reason::GrantMalformed)
    );
    assert_eq!(
        parse_proxy_authorization(Some("Bearer abc=")),
        Err(Reason::GrantMalformed)
    );
    assert_eq!(
        parse_proxy_authorization(Some("Bearer abc\t")),
        Err(Reason::GrantMalformed)
    );
    let huge = format!("Bearer {}", "a".repeat(GRANT_TOKEN_MAX_BYTES + 100));
    assert_eq!(
        parse_proxy_authorization(Some(&huge)),
        Err(Reason::GrantTooLarge)
    );
}

#[test]
fn debug_output_never_shows_the_token_or_the_key() {
    let actor = actor();
    let policy = public();
    let minted = signer().mint(&request(&policy, &actor)).unwrap();
    let shown = format!("{minted:?} {:?}", signer());
    assert!(!shown.contains(&minted.token));
    assert!(shown.contains("<redacted>"));
}

#[test]
fn the_largest_allowlist_grant_is_refused_not_truncated() {
    let actor = ActorId("a".repeat(ACTOR_MAX_BYTES));
    // As many names as an allowlist holds, as long as its text allows.
    let label = "h".repeat(SETTING_LIST_MAX_BYTES / ALLOWED_HOSTS_MAX - 8);
    let hosts: Vec<String> = (0..ALLOWED_HOSTS_MAX)
        .map(|i| format!("{label}.h{i:03}"))
        .collect();
    let policy = Policy::HostAllowlist {
        ports: AllowedPorts::new(1..=64).unwrap(),
        hosts: AllowedHosts::parse_list(&hosts.join(",")).unwrap(),
        cidrs: PrivateCidrs::new(
            (0..64u8).map(|i| Cidr::parse(&format!("10.{i}.0.0/16")).unwrap()),
        )
        .unwrap(),
    };
    let mut req = request(&policy, &actor);
    let run = "r".repeat(RUN_ID_MAX_BYTES);
    req.run = &run;
    let minted = signer().mint(&req);
    // 16 KiB of names do not fit in one header-sized grant: refused, not truncated.
    assert_eq!(minted.unwrap_err(), MintError::TooLarge);
}

#[test]
fn egr_01_an_allowlist_of_200_hosts_mints_a_grant_within_the_bound() {
    let actor = actor();
    let hosts: Vec<String> = (0..200)
        .map(|i| format!("api-{i:03}.example-provider.com"))
        .collect();
    let policy = Policy::HostAllowlist {
        ports: AllowedPorts::parse_list("80,443").unwrap(),
        hosts: AllowedHosts::parse_list(&hosts.join(",")).unwrap(),
        cidrs: PrivateCidrs::default(),
    };
    let minted = signer().mint(&request(&policy, &actor)).expect("a grant");
    assert!(
        minted.token.len() > 4_096,
        "longer than the old worker limit"
    );
    assert!(minted.token.len() <= GRANT_TOKEN_MAX_BYTES);
    let verified = signer()
        .verifier()
        .verify(&minted.token, UnixMillis(1_000_000))
        .expect("verifies");
    let Policy::HostAllowlist { hosts: granted, .. } = &verified.policy else {
        panic!("an allowlist grant");
    };
    assert_eq!(granted.iter().count(), 200);
}

#[test]
fn a_grant_that_cannot_travel_in_a_header_is_not_sendable() {
    assert!(grant_is_sendable("cg1.bG9n-_x.c2ln"));
    for bad in ["", "a b", "a\r\nX-Evil: 1", "caf\u{e9}"] {
        assert!(!grant_is_sendable(bad), "{bad:?}");
    }
}
