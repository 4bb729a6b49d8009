//! `corral egress decide` through the real binary: exit status and one JSON object on stdout.

use std::process::Command;

fn decide(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("egress")
        .arg("decide")
        .args(args)
        .output()
        .expect("run corral");
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    (out.status.code().unwrap_or(-1), stdout)
}

fn one_json_object(stdout: &str) {
    assert!(
        stdout.starts_with('{') && stdout.ends_with("}\n"),
        "{stdout:?}"
    );
    assert_eq!(stdout.matches('\n').count(), 1, "{stdout:?}");
}

#[test]
fn egr_03_decide_allows_with_the_pinned_address() {
    let (code, out) = decide(&["--answer", "example.com=93.184.216.34", "example.com:443"]);
    assert_eq!(code, 0, "{out}");
    one_json_object(&out);
    assert!(out.contains(r#""decision":"allow""#));
    assert!(out.contains(r#""address":"93.184.216.34""#));
    assert!(out.contains(r#""configured_mode":"public_internet""#));
    assert!(out.contains(r#""effective_mode":"public_internet""#));
}

#[test]
fn egr_03_decide_denies_with_exit_1_and_the_reason() {
    for (args, reason) in [
        (&["--offline", "127.0.0.1:443"][..], "address_always_denied"),
        (&["--offline", "0x7f.1:443"], "authority_numeric_spelling"),
        (
            &["--offline", "[::ffff:127.0.0.1]:443"],
            "address_embedded_ipv4",
        ),
        (&["--offline", "example.com"], "authority_missing_port"),
        (&["--mode", "isolated", "8.8.8.8:443"], "mode_isolated"),
        (
            &["--answer", "a.example=8.8.8.8,10.0.0.1", "a.example:443"],
            "dns_mixed_answer",
        ),
    ] {
        let (code, out) = decide(args);
        assert_eq!(code, 1, "{args:?}: {out}");
        one_json_object(&out);
        assert!(
            out.contains(&format!(r#""reason":"{reason}""#)),
            "{args:?}: {out}"
        );
    }
}

#[test]
fn decide_exits_2_only_for_unusable_arguments() {
    for args in [
        &["--via", "ftp", "a:1"][..],
        &[],
        &["--answer", "nope", "a:1"],
    ] {
        let (code, out) = decide(args);
        assert_eq!(code, 2, "{args:?}");
        one_json_object(&out);
    }
}

#[test]
fn the_config_subcommand_is_still_there() {
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["config", "check"])
        .output()
        .expect("run corral");
    assert!(out.status.success());
}
