//! What the binary's service tests share: whether they can run here, and how they skip.
#![allow(dead_code)]

/// Whether this process runs as root (the worker's jail needs it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    })
}

/// Says why a test skips; where CI requires services (`CORRAL_REQUIRE_SERVICES`), fails instead.
pub fn skip(why: &str) {
    assert!(
        std::env::var_os("CORRAL_REQUIRE_SERVICES").is_none(),
        "CORRAL_REQUIRE_SERVICES is set: {why}"
    );
    eprintln!("skipping: {why}");
}
