//! End-to-end tests of the real proxy on real sockets: a stub DNS server on loopback, grants
//! in every refused shape, and upstream servers in network namespaces the test creates.
//!
//! Only loopback and the test's own namespaces are ever dialed: every allowed address is inside
//! a namespace's 10.213.K.0/24, and every other answer is refused before any connection.

mod support;

use std::io::Write as _;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use corral_egress_proxy::dns::HickoryResolve;
use corral_egress_proxy::proxy::DirectDialer;
use support::dns_stub::{Behaviour, StubDns};
use support::netns::netns_or_skip;
use support::*;

/// A private_network policy on ports 80, 443 and 8080 over `cidr`.
fn private(cidr: &str) -> corral_core::egress::Policy {
    policy("private_network", "80,443,8080", cidr, "")
}

fn assert_refused(response: &Response, status: u16, reason: &str) {
    assert_eq!(response.status, status, "{}", response.head);
    assert_eq!(
        response.reason.as_deref(),
        Some(reason),
        "{}",
        response.head
    );
    assert!(
        response.head.contains("Connection: close"),
        "{}",
        response.head
    );
}

#[test]
fn egr_02_dns_failures_and_refused_answers_each_get_their_status_and_reason() {
    let rt = runtime();
    let dns = StubDns::start();
    let proxy = start_proxy(&rt, dns.addr, test_limits());
    let grant = mint(&private("10.213.0.0/16"));
    let cases: [(&str, Behaviour, u16, &str); 8] = [
        ("nx.test", Behaviour::NxDomain, 502, "dns_empty_answer"),
        (
            "empty.test",
            Behaviour::Answer(vec![]),
            502,
            "dns_empty_answer",
        ),
        ("fail.test", Behaviour::ServFail, 502, "dns_lookup_failed"),
        ("slow.test", Behaviour::Silent, 504, "dns_timeout"),
        (
            "mixed.test",
            Behaviour::Answer(vec![ip("10.213.9.9"), ip("127.0.0.1")]),
            403,
            "dns_mixed_answer",
        ),
        (
            "loop.test",
            Behaviour::Answer(vec![ip("127.0.0.1")]),
            403,
            "address_always_denied",
        ),
        (
            "meta.test",
            Behaviour::Answer(vec![ip("169.254.169.254")]),
            403,
            "address_always_denied",
        ),
        (
            "public.test",
            Behaviour::Answer(vec![ip("8.8.8.8")]),
            403,
            "address_public_not_allowed",
        ),
    ];
    for (name, behaviour, status, reason) in cases {
        dns.set(name, behaviour);
        let target = format!("{name}:443");
        let response = exchange(proxy.addr, &connect_request(&target, Some(&grant)));
        assert_refused(&response, status, reason);
        let url = format!("http://{name}/x");
        let response = exchange(proxy.addr, &get_request(&url, name, &grant));
        assert_refused(&response, status, reason);
    }
    let six = Behaviour::Answer(vec![ip("fd00::1"), ip("::ffff:10.213.9.9")]);
    dns.set("six.test", six);
    let response = exchange(proxy.addr, &connect_request("six.test:443", Some(&grant)));
    assert_refused(&response, 403, "address_private_not_configured");
    assert_eq!(proxy.observer.count("dns_timeout"), 2);
}

#[test]
fn brow_04_names_are_asked_fully_qualified_as_given() {
    let rt = runtime();
    let dns = StubDns::start();
    let proxy = start_proxy(&rt, dns.addr, test_limits());
    let grant = mint(&private("10.213.0.0/16"));
    dns.set("db", Behaviour::Answer(vec![ip("127.0.0.1")]));
    let response = exchange(proxy.addr, &connect_request("DB.:443", Some(&grant)));
    assert_refused(&response, 403, "address_always_denied");
    let asked = dns.asked();
    assert!(!asked.is_empty());
    for (name, _) in &asked {
        assert_eq!(name.to_ascii_lowercase(), "db", "asked {asked:?}");
    }
}

#[test]
fn brow_04_a_search_list_and_high_ndots_never_expand_a_name() {
    let rt = runtime();
    let dns = StubDns::start();
    // A cluster's resolver configuration: a long search list, and every name of fewer than five
    // dots tried with each suffix first.
    let conf = b"search corp.example svc.cluster.local cluster.local\noptions ndots:5\nnameserver 127.0.0.1\n";
    let limits = test_limits();
    let resolver =
        HickoryResolve::from_resolv_conf(conf, Some(dns.addr.port()), limits.dns_timeout)
            .expect("resolver");
    let proxy = start_proxy_resolving(&rt, resolver, limits, DirectDialer);
    let grant = mint(&private("10.213.0.0/16"));
    // Were a suffix tried first, each name would find the private address and be dialed.
    dns.set("db", Behaviour::Answer(vec![ip("127.0.0.1")]));
    dns.set("db.corp.example", Behaviour::Answer(vec![ip("10.213.7.7")]));
    dns.set(
        "web.internal.corp.example",
        Behaviour::Answer(vec![ip("10.213.7.7")]),
    );
    // A bare name: "db" itself, whose loopback answer is refused.
    let response = exchange(proxy.addr, &connect_request("db:443", Some(&grant)));
    assert_refused(&response, 403, "address_always_denied");
    // A dotted name under ndots: asked as given, which does not exist.
    let response = exchange(
        proxy.addr,
        &connect_request("web.internal:443", Some(&grant)),
    );
    assert_refused(&response, 502, "dns_empty_answer");
    let asked: Vec<String> = dns
        .asked()
        .into_iter()
        .map(|(name, _)| name.to_ascii_lowercase())
        .collect();
    assert!(asked.iter().any(|n| n == "db"), "asked {asked:?}");
    assert!(asked.iter().any(|n| n == "web.internal"), "asked {asked:?}");
    for name in &asked {
        assert!(
            name == "db" || name == "web.internal",
            "a search suffix was tried: asked {asked:?}"
        );
    }
}

#[test]
fn egr_02_every_connection_resolves_again() {
    let rt = runtime();
    let dns = StubDns::start();
    let proxy = start_proxy(&rt, dns.addr, test_limits());
    let grant = mint(&private("10.213.0.0/16"));
    dns.set(
        "rebind.test",
        Behaviour::Changing(vec![
            vec![ip("10.99.0.1")],
            vec![ip("127.0.0.1")],
            vec![ip("8.8.4.4")],
        ]),
    );
    let expected = [
        "address_private_not_configured",
        "address_always_denied",
        "address_public_not_allowed",
    ];
    for reason in expected {
        let response = exchange(
            proxy.addr,
            &connect_request("rebind.test:443", Some(&grant)),
        );
        assert_refused(&response, 403, reason);
    }
    let a_queries = dns.asked().iter().filter(|(_, t)| *t == 1).count();
    assert_eq!(a_queries, 3);
}

#[test]
fn egr_07_grants_missing_expired_tampered_rewritten_or_foreign_are_refused_with_407() {
    let rt = runtime();
    let dns = StubDns::start();
    let proxy = start_proxy(&rt, dns.addr, test_limits());
    let policy = private("10.213.0.0/16");
    let good = mint(&policy);
    let two_hours_ago = corral_egress_proxy::observe::unix_now_ms() - 2 * 3600 * 1000;
    let expired = mint_at(FIELD_KEY, &policy, two_hours_ago);
    let tampered = tamper(&good, |claims| {
        let last = claims.len() - 1;
        claims[last] ^= 1;
    });
    // Byte 1 of the claims is the mode: private_network (2) rewritten to public_internet (1).
    let rewritten = tamper(&good, |claims| claims[1] = 1);
    let foreign = mint_at(
        OTHER_FIELD_KEY,
        &policy,
        corral_egress_proxy::observe::unix_now_ms(),
    );
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (connect_request("10.213.1.2:443", None), "grant_missing"),
        (b"CONNECT 10.213.1.2:443 HTTP/1.1\r\nProxy-Authorization: Basic dXNlcjpwdw==\r\n\r\n".to_vec(), "grant_wrong_scheme"),
        (b"CONNECT 10.213.1.2:443 HTTP/1.1\r\nProxy-Authorization: Bearer \r\n\r\n".to_vec(), "grant_missing"),
        (connect_request("10.213.1.2:443", Some("cg1.not-base64!.x")), "grant_malformed"),
        (connect_request("10.213.1.2:443", Some("cg9.AAAA.AAAA")), "grant_unsupported_version"),
        (connect_request("10.213.1.2:443", Some(&expired)), "grant_expired"),
        (connect_request("10.213.1.2:443", Some(&tampered)), "grant_bad_signature"),
        (connect_request("10.213.1.2:443", Some(&rewritten)), "grant_bad_signature"),
        (connect_request("10.213.1.2:443", Some(&foreign)), "grant_bad_signature"),
        (
            format!("CONNECT 10.213.1.2:443 HTTP/1.1\r\nProxy-Authorization: Bearer {good}\r\nProxy-Authorization: Bearer {good}\r\n\r\n").into_bytes(),
            "grant_malformed",
        ),
    ];
    for (request, reason) in cases {
        let response = exchange(proxy.addr, &request);
        assert_refused(&response, 407, reason);
        assert!(
            response.head.contains("Proxy-Authenticate: Bearer"),
            "{}",
            response.head
        );
    }
    // The grant is checked before anything else: a malformed target with no grant is a 407.
    let response = exchange(proxy.addr, &connect_request("user@10.213.1.2:443", None));
    assert_refused(&response, 407, "grant_missing");
    // A good grant reaches the policy (loopback is refused, so nothing is dialed).
    let response = exchange(proxy.addr, &connect_request("127.0.0.1:443", Some(&good)));
    assert_refused(&response, 403, "address_always_denied");
}

#[test]
fn egr_09_a_new_verifying_key_applies_at_the_next_request() {
    let rt = runtime();
    let dns = StubDns::start();
    let proxy = start_proxy(&rt, dns.addr, test_limits());
    let policy = private("10.213.0.0/16");
    let old = mint_at(
        FIELD_KEY,
        &policy,
        corral_egress_proxy::observe::unix_now_ms(),
    );
    let new = mint_at(
        OTHER_FIELD_KEY,
        &policy,
        corral_egress_proxy::observe::unix_now_ms(),
    );
    let probe = |grant: &str| exchange(proxy.addr, &connect_request("127.0.0.1:443", Some(grant)));
    assert_refused(&probe(&old), 403, "address_always_denied");
    assert_refused(&probe(&new), 407, "grant_bad_signature");
    write_key_file(&proxy.key_file, OTHER_FIELD_KEY);
    assert_refused(&probe(&old), 407, "grant_bad_signature");
    assert_refused(&probe(&new), 403, "address_always_denied");
    std::fs::remove_file(&proxy.key_file).unwrap();
    assert_refused(&probe(&new), 407, "verifying_key_unavailable");
}

#[test]
fn bypass_spellings_and_malformed_requests_are_refused() {
    let rt = runtime();
    let dns = StubDns::start();
    let proxy = start_proxy(&rt, dns.addr, test_limits());
    let grant = mint(&policy("public_internet", "80,443", "", ""));
    for (target, reason) in [
        ("2130706433:443", "authority_numeric_spelling"),
        ("0x7f.1:443", "authority_numeric_spelling"),
        ("0177.0.0.1:443", "authority_numeric_spelling"),
        ("[::ffff:127.0.0.1]:443", "address_embedded_ipv4"),
        ("[64:ff9b::7f00:1]:443", "address_embedded_ipv4"),
        ("[2002:7f00:1::1]:443", "address_embedded_ipv4"),
        ("[fe80::1%25eth0]:443", "authority_zone_id"),
        ("[127.0.0.1]:443", "authority_bracketed_non_ipv6"),
        ("user@example.test:443", "authority_userinfo"),
        ("example.test", "authority_missing_port"),
        ("example.test:0443", "authority_bad_port"),
        ("example.test:443/x", "authority_path_or_query"),
        ("[::1]:443", "address_always_denied"),
        ("8.8.8.8:22", "port_not_allowed"),
    ] {
        let response = exchange(proxy.addr, &connect_request(target, Some(&grant)));
        assert_refused(&response, 403, reason);
    }
    let response = exchange(proxy.addr, &get_request("http://a.test/", "b.test", &grant));
    assert_refused(&response, 403, "host_header_mismatch");
    let response = exchange(
        proxy.addr,
        &get_request("https://a.test/", "a.test", &grant),
    );
    assert_refused(&response, 403, "url_scheme_not_http");
    let response = exchange(proxy.addr, &get_request("/relative", "a.test", &grant));
    assert_refused(&response, 403, "url_malformed");
    let response = exchange(
        proxy.addr,
        b"CONNECT a.test:443 HTTP/1.1\r\nBad Header: x\r\n\r\n",
    );
    assert_refused(&response, 400, "request_malformed");
    let big = format!(
        "CONNECT a.test:443 HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40 * 1024)
    );
    let response = exchange(proxy.addr, big.as_bytes());
    assert_refused(&response, 431, "request_header_too_large");
    let framing = format!(
        "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Bearer {grant}\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let response = exchange(proxy.addr, framing.as_bytes());
    assert_refused(&response, 400, "request_body_framing");
    // A grant at the 16 KiB bound still fits the header bound.
    let padded = format!(
        "CONNECT 127.0.0.1:443 HTTP/1.1\r\nProxy-Authorization: Bearer {}\r\n\r\n",
        "A".repeat(16 * 1024)
    );
    let response = exchange(proxy.addr, padded.as_bytes());
    assert_refused(&response, 407, "grant_malformed");
}

#[test]
fn header_read_time_is_bounded() {
    let rt = runtime();
    let dns = StubDns::start();
    let proxy = start_proxy(&rt, dns.addr, test_limits());
    let mut stream = TcpStream::connect(proxy.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"CONNECT a.test:443 HTTP/1.1\r\n")
        .unwrap();
    let started = Instant::now();
    let response = read_response(&mut stream);
    assert_refused(&response, 408, "request_header_timeout");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// The allow path, through namespaces: CONNECT and plain HTTP to a real upstream.
#[test]
fn egr_01_allow_path_connect_and_plain_http_through_a_namespace() {
    let Some(mut ns) =
        netns_or_skip("egr_01_allow_path_connect_and_plain_http_through_a_namespace")
    else {
        return;
    };
    let upstream = ns.start_echo_server(8080).expect("echo server");
    let rt = runtime();
    let dns = StubDns::start();
    let proxy = start_proxy(&rt, dns.addr, test_limits());
    let grant = mint(&private(&ns.cidr));
    dns.set("svc.corral.test", Behaviour::Answer(vec![upstream.ip()]));

    // CONNECT by name and by literal, then HTTP through the tunnel; bytes sent with the
    // CONNECT head reach the upstream too.
    for target in ["svc.corral.test:8080".to_owned(), upstream.to_string()] {
        let mut stream = TcpStream::connect(proxy.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut request = connect_request(&target, Some(&grant));
        request.extend_from_slice(b"GET /through-tunnel HTTP/1.0\r\nHost: svc\r\n\r\n");
        stream.write_all(&request).unwrap();
        let established = read_head_only(&mut stream);
        assert_eq!(established.status, 200, "{}", established.head);
        let response = read_response(&mut stream);
        assert_eq!(response.status, 200, "{}", response.head);
        let body = String::from_utf8_lossy(&response.body);
        assert!(
            body.starts_with("method=GET path=/through-tunnel"),
            "{body}"
        );
    }

    // Plain HTTP: origin-form upstream, grant stripped, one request per connection.
    let url = "http://svc.corral.test:8080/plain?q=1";
    let response = exchange(
        proxy.addr,
        &get_request(url, "svc.corral.test:8080", &grant),
    );
    assert_eq!(response.status, 200, "{}", response.head);
    let body = String::from_utf8_lossy(&response.body);
    assert!(
        body.starts_with(
            "method=GET path=/plain?q=1 host=svc.corral.test:8080 auth=None conn=close body="
        ),
        "{body}"
    );

    // Bodies: Content-Length and chunked, forwarded exactly once.
    let post = format!(
        "POST {url} HTTP/1.1\r\nHost: svc.corral.test:8080\r\nProxy-Authorization: Bearer {grant}\r\nContent-Length: 5\r\n\r\nhello"
    );
    let response = exchange(proxy.addr, post.as_bytes());
    assert!(
        String::from_utf8_lossy(&response.body).ends_with("body=hello"),
        "{response:?}"
    );
    let chunked = format!(
        "POST {url} HTTP/1.1\r\nHost: svc.corral.test:8080\r\nProxy-Authorization: Bearer {grant}\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n"
    );
    let response = exchange(proxy.addr, chunked.as_bytes());
    assert!(
        String::from_utf8_lossy(&response.body).ends_with("body=Wikipedia"),
        "{response:?}"
    );
    assert!(proxy.observer.count("allow") >= 5);
}

#[test]
fn egr_02_allowed_then_rebound_upstream_failures_and_idle_tunnels() {
    let Some(mut ns) =
        netns_or_skip("egr_02_allowed_then_rebound_upstream_failures_and_idle_tunnels")
    else {
        return;
    };
    let upstream = ns.start_echo_server(8080).expect("echo server");
    let rt = runtime();
    let dns = StubDns::start();
    let proxy = start_proxy(&rt, dns.addr, test_limits());
    let grant = mint(&private(&ns.cidr));

    // The answer changes between connections: the first is allowed, the rebound one refused.
    dns.set(
        "rebind.corral.test",
        Behaviour::Changing(vec![vec![upstream.ip()], vec![ip("127.0.0.1")]]),
    );
    let mut first = TcpStream::connect(proxy.addr).unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    first
        .write_all(&connect_request("rebind.corral.test:8080", Some(&grant)))
        .unwrap();
    assert_eq!(read_head_only(&mut first).status, 200);
    let second = exchange(
        proxy.addr,
        &connect_request("rebind.corral.test:8080", Some(&grant)),
    );
    assert_refused(&second, 403, "address_always_denied");
    drop(first);

    // Nothing listens on port 80 in the namespace: the upstream refuses.
    let refused = format!("{}:80", ns.ns_ip);
    let response = exchange(proxy.addr, &connect_request(&refused, Some(&grant)));
    assert_refused(&response, 502, "upstream_connect_refused");

    // No host answers 10.213.K.77: the connect time runs out.
    let [a, b, c, _] = ns.ns_ip.octets();
    let silent = format!("{a}.{b}.{c}.77:8080");
    let response = exchange(proxy.addr, &connect_request(&silent, Some(&grant)));
    assert_refused(&response, 504, "upstream_connect_timeout");

    // An idle tunnel is closed after the idle time.
    let mut idle = TcpStream::connect(proxy.addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    idle.write_all(&connect_request(&upstream.to_string(), Some(&grant)))
        .unwrap();
    assert_eq!(read_head_only(&mut idle).status, 200);
    let started = Instant::now();
    let rest = read_response(&mut idle);
    assert!(rest.head.is_empty() && rest.body.is_empty(), "{rest:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
}
