//! `corral egress decide`: the proxy's decision, offline, for an operator asking "why was this
//! refused?" (issue 3, item 4).
//!
//! ```text
//! corral egress decide [--mode M] [--allowed-port P]… [--private-cidr C]… [--allowed-host H]…
//!                      [--answer NAME=IP[,IP…]]… [--offline] [--via connect|http]
//!                      [--host-header H]… TARGET
//! ```
//!
//! - The policy is resolved by the core exactly as the deployment's would be
//!   ([`corral_core::egress::resolve`]), as if the proxy address and the field key were in place.
//!   Defaults: mode `public_internet`, ports 80 and 443. Values resolve fail-closed: an unknown
//!   mode spelling, an unusable port list, a non-private CIDR or a bad host make the effective
//!   mode `isolated` (the `notes` field says why); they are not usage errors.
//! - Repeated `--allowed-port`, `--private-cidr` and `--allowed-host` are joined into one list,
//!   as the comma-separated settings would be.
//! - With any `--answer` or `--offline`, names resolve only from the table: matched like
//!   hostnames (case-insensitive, one trailing dot ignored); a name not in it is NXDOMAIN; `NAME=`
//!   is an empty answer; repeated `--answer` for one name add to its answer. No query leaves the
//!   process. Otherwise names are resolved with the system's resolver configuration, fully
//!   qualified, uncached, as the proxy does.
//! - TARGET is exactly what the client would send: a CONNECT authority, or with `--via http` an
//!   absolute URL. `--host-header` gives the request's `Host` header (repeat it for a repeated
//!   header); without it the `Host` check is skipped. It is not judged for CONNECT.
//! - Output: exactly one JSON object on stdout, with `decision` (`allow`/`deny`), `reason` (the
//!   stable code, `null` on allow), `configured_mode`, `effective_mode`, and on allow the pinned
//!   `address` (the IP) with `port` and `pinned` (`ip:port`); plus `status` (the HTTP status the
//!   proxy would answer a denial with), `refused_address`, `target`, `via`, `dns`, `answer` and
//!   `notes` where they apply.
//! - Exit status: 0 allow, 1 deny, 2 only when the arguments themselves are unusable (unknown
//!   flag, missing value, bad `--via`, malformed `--answer`, no or several TARGETs). A malformed
//!   TARGET is a deny.

use std::net::IpAddr;

use corral_core::egress::{EgressSettings, Resolution, resolve};

use crate::dns::{AnswerTable, DnsOutcome, HickoryResolve, Resolve};
use crate::json::JsonObject;
use crate::judge::{Judgment, Lookup, Verdict, Via, judge, parse_request_target};
use crate::refusal::{Refusal, ShellReason};

/// How long an online lookup may take.
pub const ONLINE_DNS_TIMEOUT_MS: u64 = 5_000;

/// The usage text.
pub const USAGE: &str =
    "usage: corral egress decide [--mode M] [--allowed-port P]... [--private-cidr C]...
                            [--allowed-host H]... [--answer NAME=IP[,IP...]]... [--offline]
                            [--via connect|http] [--host-header H]... TARGET

Judges TARGET (a CONNECT authority, or with --via http an absolute URL) exactly as the egress
proxy would, and prints one JSON object. Exit 0 allow, 1 deny, 2 unusable arguments.
  --mode M            configured mode (default public_internet; unknown spellings are isolated)
  --allowed-port P    an allowed port (default 80 and 443)
  --private-cidr C    a configured private CIDR
  --allowed-host H    an exact allowlisted host (host_allowlist)
  --answer NAME=IPS   the DNS answer for NAME; names not given are NXDOMAIN; implies --offline
  --offline           resolve only from --answer; no query leaves the process
  --via connect|http  how the client asks (default connect)
  --host-header H     the request's Host header (http only; repeat for a repeated header)
";

/// What the command prints and returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecideOutput {
    /// The process exit status: 0 allow, 1 deny, 2 usage.
    pub exit_code: u8,
    /// Exactly one JSON object and a newline (or the usage text for `--help`).
    pub stdout: String,
    /// Messages for a person.
    pub stderr: String,
}

/// The parsed arguments.
#[derive(Debug, Default)]
struct Args {
    mode: Option<String>,
    ports: Vec<String>,
    cidrs: Vec<String>,
    hosts: Vec<String>,
    answers: AnswerTable,
    offline: bool,
    via: Option<Via>,
    host_headers: Vec<String>,
    targets: Vec<String>,
    help: bool,
}

/// Runs `corral egress decide` with the arguments after `decide`.
#[must_use]
pub fn run(args: &[String]) -> DecideOutput {
    let parsed = match parse_args(args) {
        Ok(parsed) => parsed,
        Err(message) => return usage_error(&message),
    };
    if parsed.help {
        return DecideOutput {
            exit_code: 0,
            stdout: USAGE.to_owned(),
            stderr: String::new(),
        };
    }
    let target_text = match parsed.targets.as_slice() {
        [one] => one.clone(),
        [] => return usage_error("TARGET is missing"),
        [_, _, ..] => return usage_error("more than one TARGET"),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return usage_error(&format!("cannot start the runtime: {e}")),
    };
    let resolver = if parsed.offline {
        CliResolver::Table(&parsed.answers)
    } else {
        CliResolver::Online(runtime.block_on(async {
            HickoryResolve::new(
                None,
                std::time::Duration::from_millis(ONLINE_DNS_TIMEOUT_MS),
            )
            .map(Box::new)
        }))
    };
    runtime.block_on(decide(&parsed, &target_text, &resolver))
}

/// The resolver the command uses: the `--answer` table, or the system's name servers.
enum CliResolver<'a> {
    Table(&'a AnswerTable),
    Online(Result<Box<HickoryResolve>, String>),
}

impl Resolve for CliResolver<'_> {
    async fn resolve(&self, name: &corral_core::egress::DnsName) -> DnsOutcome {
        match self {
            CliResolver::Table(table) => table.lookup(name.as_str()),
            CliResolver::Online(Ok(resolver)) => resolver.resolve(name).await,
            CliResolver::Online(Err(_)) => DnsOutcome::Failed(ShellReason::DnsLookupFailed),
        }
    }
}

async fn decide(args: &Args, target_text: &str, resolver: &CliResolver<'_>) -> DecideOutput {
    let joined_ports = (!args.ports.is_empty()).then(|| args.ports.join(","));
    let joined_cidrs = (!args.cidrs.is_empty()).then(|| args.cidrs.join(","));
    let joined_hosts = (!args.hosts.is_empty()).then(|| args.hosts.join(","));
    let resolution = resolve(&EgressSettings {
        enabled: None,
        mode: Some(args.mode.as_deref().unwrap_or("public_internet")),
        allowed_ports: joined_ports.as_deref(),
        private_cidrs: joined_cidrs.as_deref(),
        allowed_hosts: joined_hosts.as_deref(),
        token_ttl_seconds: None,
        proxy_address_present: true,
        field_key_present: true,
    });
    let via = args.via.unwrap_or(Via::Connect);
    let host_values: Vec<&str> = args.host_headers.iter().map(String::as_str).collect();
    let host_check =
        (via == Via::Http && !host_values.is_empty()).then_some(host_values.as_slice());
    let mut stderr = String::new();
    if let CliResolver::Online(Err(message)) = resolver {
        stderr.push_str(message);
        stderr.push('\n');
    }
    let (parsed_target, judgment) = match parse_request_target(via, target_text, host_check) {
        Ok(parsed) => {
            let judgment = judge(&resolution.policy, parsed.target(), resolver).await;
            (Some(parsed), judgment)
        }
        Err(reason) => (
            None,
            Judgment {
                verdict: Verdict::Deny {
                    refusal: Refusal::Decision(reason),
                    address: None,
                },
                lookup: Lookup::NotNeeded,
            },
        ),
    };
    let target = parsed_target.as_ref().map(|p| p.target().to_string());
    let stdout = render(&resolution, via, target.as_deref(), &judgment);
    let exit_code = match judgment.verdict {
        Verdict::Allow { .. } => 0,
        Verdict::Deny { .. } => 1,
    };
    DecideOutput {
        exit_code,
        stdout,
        stderr,
    }
}

fn render(resolution: &Resolution, via: Via, target: Option<&str>, judgment: &Judgment) -> String {
    let mut out = JsonObject::new();
    match &judgment.verdict {
        Verdict::Allow { pinned } => {
            out.string("decision", "allow")
                .null("reason")
                .string("configured_mode", resolution.configured.display_text())
                .string("effective_mode", resolution.effective_mode().as_str())
                .string("address", &pinned.ip().to_string())
                .number("port", u64::from(pinned.port()))
                .string("pinned", &pinned.to_string());
        }
        Verdict::Deny { refusal, address } => {
            out.string("decision", "deny")
                .string("reason", refusal.code())
                .string("configured_mode", resolution.configured.display_text())
                .string("effective_mode", resolution.effective_mode().as_str())
                .number("status", u64::from(refusal.status()));
            if let Some(address) = address {
                out.string("refused_address", &address.to_string());
            }
        }
    }
    out.opt_string("target", target).string("via", via.as_str());
    match &judgment.lookup {
        Lookup::NotNeeded => {
            out.string("dns", "not_needed");
        }
        Lookup::Resolved(outcome) => {
            out.string("dns", outcome.code());
            if let DnsOutcome::Answer(addresses) = outcome {
                let texts: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
                out.strings("answer", texts.iter().map(String::as_str));
            }
        }
    }
    out.strings("notes", resolution.notes.iter().map(|note| note.code()));
    let mut text = out.finish();
    text.push('\n');
    text
}

fn usage_error(message: &str) -> DecideOutput {
    let mut out = JsonObject::new();
    out.string("error", "usage").string("message", message);
    let mut stdout = out.finish();
    stdout.push('\n');
    DecideOutput {
        exit_code: 2,
        stdout,
        stderr: format!("corral egress decide: {message}\n\n{USAGE}"),
    }
}

/// Flags that take a value.
const VALUE_FLAGS: [&str; 7] = [
    "--mode",
    "--allowed-port",
    "--private-cidr",
    "--allowed-host",
    "--answer",
    "--via",
    "--host-header",
];

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            parsed.targets.extend(rest.by_ref().cloned());
            break;
        }
        if arg == "--offline" {
            parsed.offline = true;
            continue;
        }
        if arg == "--help" || arg == "-h" {
            parsed.help = true;
            continue;
        }
        if !arg.starts_with("--") {
            parsed.targets.push(arg.clone());
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value.to_owned())),
            None => (arg.as_str(), None),
        };
        if !VALUE_FLAGS.contains(&flag) {
            return Err(format!("unknown flag {flag:?}"));
        }
        let value = match inline {
            Some(value) => value,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))?,
        };
        apply_flag(&mut parsed, flag, value)?;
    }
    Ok(parsed)
}

fn apply_flag(parsed: &mut Args, flag: &str, value: String) -> Result<(), String> {
    match flag {
        "--mode" => {
            if parsed.mode.is_some() {
                return Err("--mode given twice".to_owned());
            }
            parsed.mode = Some(value);
        }
        "--allowed-port" => parsed.ports.push(value),
        "--private-cidr" => parsed.cidrs.push(value),
        "--allowed-host" => parsed.hosts.push(value),
        "--answer" => {
            parse_answer(&mut parsed.answers, &value)?;
            parsed.offline = true;
        }
        "--via" => {
            if parsed.via.is_some() {
                return Err("--via given twice".to_owned());
            }
            parsed.via = Some(match value.as_str() {
                "connect" => Via::Connect,
                "http" => Via::Http,
                other => return Err(format!("--via must be connect or http, not {other:?}")),
            });
        }
        "--host-header" => parsed.host_headers.push(value),
        other => return Err(format!("unknown flag {other:?}")),
    }
    Ok(())
}

/// Parses `NAME=IP[,IP…]` into the table. `NAME=` is an empty answer.
fn parse_answer(table: &mut AnswerTable, text: &str) -> Result<(), String> {
    let Some((name, list)) = text.split_once('=') else {
        return Err(format!("--answer {text:?} is not NAME=IP[,IP...]"));
    };
    if name.is_empty() {
        return Err(format!("--answer {text:?} has no NAME"));
    }
    let mut addresses = Vec::new();
    if !list.trim().is_empty() {
        for item in list.split(',').map(str::trim) {
            let bare = item
                .strip_prefix('[')
                .and_then(|inner| inner.strip_suffix(']'))
                .unwrap_or(item);
            let ip: IpAddr = bare
                .parse()
                .map_err(|_| format!("--answer {text:?}: {item:?} is not an IP address"))?;
            addresses.push(ip);
        }
    }
    table.add(name, &addresses);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(args: &[&str]) -> DecideOutput {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        run(&args)
    }

    fn field<'a>(out: &'a DecideOutput, key: &str) -> Option<&'a str> {
        let needle = format!("\"{key}\":");
        let start = out.stdout.find(&needle)? + needle.len();
        let rest = &out.stdout[start..];
        if let Some(rest) = rest.strip_prefix('"') {
            return rest.split('"').next();
        }
        rest.split([',', '}']).next()
    }

    #[test]
    fn allow_prints_the_pinned_address() {
        let out = decide(&[
            "--answer",
            "Example.COM.=93.184.216.34,2606:2800:220:1::1",
            "example.com:443",
        ]);
        assert_eq!(out.exit_code, 0, "{out:?}");
        assert_eq!(field(&out, "decision"), Some("allow"));
        assert_eq!(field(&out, "reason"), Some("null"));
        assert_eq!(field(&out, "address"), Some("93.184.216.34"));
        assert_eq!(field(&out, "pinned"), Some("93.184.216.34:443"));
        assert_eq!(field(&out, "configured_mode"), Some("public_internet"));
        assert_eq!(field(&out, "effective_mode"), Some("public_internet"));
        assert_eq!(out.stdout.matches('\n').count(), 1);
    }

    #[test]
    fn names_not_in_the_table_are_nxdomain_and_empty_answers_are_empty() {
        let out = decide(&["--offline", "example.com:443"]);
        assert_eq!(out.exit_code, 1);
        assert_eq!(field(&out, "reason"), Some("dns_empty_answer"));
        assert_eq!(field(&out, "dns"), Some("nxdomain"));
        let out = decide(&["--answer", "example.com=", "example.com:443"]);
        assert_eq!(field(&out, "reason"), Some("dns_empty_answer"));
        assert_eq!(field(&out, "dns"), Some("empty"));
    }

    #[test]
    fn malformed_target_is_a_deny_not_a_usage_error() {
        let out = decide(&["--offline", "user@example.com:443"]);
        assert_eq!(out.exit_code, 1);
        assert_eq!(field(&out, "reason"), Some("authority_userinfo"));
        let out = decide(&["--offline", "--", "-x.example:443"]);
        assert_eq!(out.exit_code, 1);
        assert_eq!(field(&out, "reason"), Some("authority_bad_name"));
        let out = decide(&["--offline", ""]);
        assert_eq!(field(&out, "reason"), Some("target_empty"));
    }

    #[test]
    fn unusable_arguments_exit_2() {
        for args in [
            &["--offline"][..],
            &["--bogus", "a:1"],
            &["--mode"],
            &["--via", "https", "a:1"],
            &["--answer", "a", "a:1"],
            &["--answer", "=1.2.3.4", "a:1"],
            &["--answer", "a=1.2.3.400", "a:1"],
            &["--answer", "a=1.2.3.4,", "a:1"],
            &["a:1", "b:1"],
            &["--mode", "isolated", "--mode", "public_internet", "a:1"],
        ] {
            let out = decide(args);
            assert_eq!(out.exit_code, 2, "{args:?}");
            assert_eq!(field(&out, "error"), Some("usage"));
        }
    }

    #[test]
    fn egr_05_policy_values_resolve_fail_closed() {
        let out = decide(&["--mode", "Public_Internet", "--offline", "8.8.8.8:443"]);
        assert_eq!(out.exit_code, 1);
        assert_eq!(field(&out, "reason"), Some("mode_isolated"));
        assert_eq!(field(&out, "configured_mode"), Some("Public_Internet"));
        assert_eq!(field(&out, "effective_mode"), Some("isolated"));
        let out = decide(&["--allowed-port", "0", "--offline", "8.8.8.8:443"]);
        assert_eq!(field(&out, "reason"), Some("mode_isolated"));
        assert!(out.stdout.contains("ports_unusable"));
        let out = decide(&[
            "--mode",
            "private_network",
            "--private-cidr",
            "8.8.8.0/24",
            "8.8.8.8:443",
        ]);
        assert_eq!(field(&out, "reason"), Some("mode_isolated"));
    }

    #[test]
    fn flags_shape_the_policy() {
        let out = decide(&["--allowed-port", "8443", "--offline", "8.8.8.8:8443"]);
        assert_eq!(out.exit_code, 0);
        let out = decide(&["--allowed-port=8443", "--offline", "8.8.8.8:443"]);
        assert_eq!(field(&out, "reason"), Some("port_not_allowed"));
        let out = decide(&[
            "--mode",
            "private_network",
            "--private-cidr",
            "10.1.0.0/16",
            "--answer",
            "db.internal=10.1.2.3",
            "db.internal:443",
        ]);
        assert_eq!(out.exit_code, 0);
        let out = decide(&[
            "--mode",
            "host_allowlist",
            "--allowed-host",
            "pypi.org",
            "--answer",
            "evil.example=151.101.0.223",
            "evil.example:443",
        ]);
        assert_eq!(field(&out, "reason"), Some("host_not_allowlisted"));
    }

    #[test]
    fn http_via_checks_the_host_header_when_given() {
        let out = decide(&[
            "--via",
            "http",
            "--answer",
            "example.com=93.184.216.34",
            "http://example.com/x",
        ]);
        assert_eq!(out.exit_code, 0);
        assert_eq!(field(&out, "pinned"), Some("93.184.216.34:80"));
        let out = decide(&[
            "--via",
            "http",
            "--host-header",
            "other.example",
            "--answer",
            "example.com=93.184.216.34",
            "http://example.com/x",
        ]);
        assert_eq!(field(&out, "reason"), Some("host_header_mismatch"));
        let out = decide(&[
            "--via",
            "http",
            "--host-header",
            "example.com",
            "--host-header",
            "example.com",
            "--offline",
            "http://example.com/x",
        ]);
        assert_eq!(field(&out, "reason"), Some("host_header_repeated"));
        let out = decide(&["--via", "http", "--offline", "https://example.com/"]);
        assert_eq!(field(&out, "reason"), Some("url_scheme_not_http"));
    }

    #[test]
    fn egr_02_mixed_answers_are_refused_with_the_refused_address() {
        let out = decide(&[
            "--answer",
            "example.com=93.184.216.34,127.0.0.1",
            "example.com:443",
        ]);
        assert_eq!(out.exit_code, 1);
        assert_eq!(field(&out, "reason"), Some("dns_mixed_answer"));
        assert_eq!(field(&out, "refused_address"), Some("127.0.0.1"));
        assert_eq!(field(&out, "status"), Some("403"));
    }
}
