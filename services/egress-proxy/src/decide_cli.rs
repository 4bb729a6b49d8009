//! `corral egress decide`: the proxy's decision, offline, for an operator asking "why was this
//! refused?" (issue 3, item 4).
//!
//! The flags are [`DecideArgs`] (`corral egress decide --help` prints them):
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
//!   flag, missing value, bad `--via`, malformed `--answer`, no or several TARGETs), with
//!   `{"error":"usage","message":…}` on stdout (the message carries the parser's suggestion) and
//!   the parser's full refusal on stderr. A malformed TARGET is a deny, even one that begins
//!   with `-`. `--help` prints the help and exits 0.

use std::net::IpAddr;

use corral_core::egress::{EgressSettings, Resolution, resolve};

use crate::dns::{AnswerTable, DnsOutcome, HickoryResolve, Resolve};
use crate::json::JsonObject;
use crate::judge::{Judgment, Lookup, Verdict, Via, judge, parse_request_target};
use crate::refusal::{Refusal, ShellReason};

/// How long an online lookup may take.
pub const ONLINE_DNS_TIMEOUT_MS: u64 = 5_000;

/// What `corral egress decide` does, in one line of its help.
pub const ABOUT: &str =
    "Judge one egress target offline, as the proxy would (one JSON object on stdout)";

/// What `corral egress decide` does, in its long help.
pub const LONG_ABOUT: &str = "Judge one egress target offline, as the proxy would (one JSON \
object on stdout)

Judges TARGET (a CONNECT authority, or with --via http an absolute URL) exactly as the egress \
proxy would, and prints one JSON object. Exit 0 allow, 1 deny, 2 unusable arguments (the object \
is then {\"error\":\"usage\",\"message\":...}). A malformed TARGET is a deny.";

/// The arguments of `corral egress decide`: one definition, parsed by [`run`] and shown in the
/// `corral` binary's help.
#[derive(clap::Args, Debug)]
pub struct DecideArgs {
    /// The configured mode (default public_internet; an unknown spelling is isolated)
    #[arg(long, value_name = "M", allow_hyphen_values = true)]
    mode: Option<String>,
    /// An allowed port; repeat for more (default 80 and 443)
    #[arg(long = "allowed-port", value_name = "P", allow_hyphen_values = true)]
    ports: Vec<String>,
    /// A configured private CIDR; repeat for more
    #[arg(long = "private-cidr", value_name = "C", allow_hyphen_values = true)]
    cidrs: Vec<String>,
    /// An exact allowlisted host (host_allowlist); repeat for more
    #[arg(long = "allowed-host", value_name = "H", allow_hyphen_values = true)]
    hosts: Vec<String>,
    /// The DNS answer for NAME (`NAME=` is an empty one, a repeat adds to it); names not given
    /// are NXDOMAIN; implies --offline
    #[arg(
        long = "answer",
        value_name = "NAME=IP[,IP...]",
        value_parser = parse_answer,
        allow_hyphen_values = true
    )]
    answers: Vec<Answer>,
    /// Resolve only from --answer; no query leaves the process
    #[arg(long, overrides_with = "offline")]
    offline: bool,
    /// How the client asks
    #[arg(long, value_enum, value_name = "VIA", default_value_t = ViaFlag::Connect)]
    via: ViaFlag,
    /// The request's Host header (http only; repeat for a repeated header); without it the Host
    /// check is skipped
    #[arg(long = "host-header", value_name = "H", allow_hyphen_values = true)]
    host_headers: Vec<String>,
    /// A CONNECT authority, or with --via http an absolute URL; a malformed one is denied
    #[arg(value_name = "TARGET")]
    target: String,
}

/// `corral egress decide` on its own, as [`run`] parses it.
#[derive(clap::Parser)]
#[command(name = "decide", bin_name = "corral egress decide", version)]
#[command(about = ABOUT, long_about = LONG_ABOUT)]
struct DecideCli {
    #[command(flatten)]
    args: DecideArgs,
}

/// `--via`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ViaFlag {
    /// `CONNECT host:port`
    Connect,
    /// A plain-HTTP request with an absolute-form URL
    Http,
}

impl From<ViaFlag> for Via {
    fn from(flag: ViaFlag) -> Self {
        match flag {
            ViaFlag::Connect => Via::Connect,
            ViaFlag::Http => Via::Http,
        }
    }
}

/// One `--answer NAME=IP[,IP…]`.
#[derive(Clone, Debug)]
struct Answer {
    name: String,
    addresses: Vec<IpAddr>,
}

/// What the command prints and returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecideOutput {
    /// The process exit status: 0 allow, 1 deny, 2 usage.
    pub exit_code: u8,
    /// Exactly one JSON object and a newline (or the help text for `--help`).
    pub stdout: String,
    /// Messages for a person.
    pub stderr: String,
}

/// Runs `corral egress decide` with the arguments after `decide`.
#[must_use]
pub fn run(args: &[String]) -> DecideOutput {
    use clap::Parser as _;
    let argv = std::iter::once("decide".to_owned()).chain(hyphen_targets_last(args));
    let parsed = match DecideCli::try_parse_from(argv) {
        Ok(cli) => cli.args,
        Err(error) => return refused(&error),
    };
    run_parsed(&parsed)
}

/// Runs `corral egress decide` with arguments already parsed (by the `corral` binary's parser).
#[must_use]
pub fn run_parsed(parsed: &DecideArgs) -> DecideOutput {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return usage_error(&format!("cannot start the runtime: {e}")),
    };
    let mut answers = AnswerTable::default();
    for answer in &parsed.answers {
        answers.add(&answer.name, &answer.addresses);
    }
    let resolver = if parsed.offline || !parsed.answers.is_empty() {
        CliResolver::Table(&answers)
    } else {
        CliResolver::Online(runtime.block_on(async {
            HickoryResolve::new(
                None,
                std::time::Duration::from_millis(ONLINE_DNS_TIMEOUT_MS),
            )
            .map(Box::new)
        }))
    };
    runtime.block_on(decide(parsed, &resolver))
}

/// Moves every argument that begins with a single `-` and stands where TARGET may (such as
/// `-x.example:443`, a malformed TARGET) behind `--`, so that it is judged and denied, as it
/// always was, rather than refused as an unknown short flag. `-h` and `-V` stay flags.
fn hyphen_targets_last(args: &[String]) -> Vec<String> {
    use clap::CommandFactory as _;
    let command = DecideCli::command();
    let takes_value = |arg: &str| {
        arg.strip_prefix("--").is_some_and(|long| {
            command
                .get_arguments()
                .any(|a| a.get_long() == Some(long) && a.get_action().takes_values())
        })
    };
    let (mut kept, mut targets) = (Vec::with_capacity(args.len() + 1), Vec::new());
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            targets.extend(rest.by_ref().cloned());
            break;
        }
        let single_dash = arg.len() > 1 && arg.starts_with('-') && !arg.starts_with("--");
        if single_dash && arg != "-h" && arg != "-V" {
            targets.push(arg.clone());
            continue;
        }
        kept.push(arg.clone());
        if takes_value(arg)
            && let Some(value) = rest.next()
        {
            kept.push(value.clone());
        }
    }
    if !targets.is_empty() {
        kept.push("--".to_owned());
        kept.extend(targets);
    }
    kept
}

/// What a refusal by the parser prints: the help or the version on `--help` or `--version`
/// (exit 0), otherwise the usage object with the parser's message and suggestion (exit 2).
fn refused(error: &clap::Error) -> DecideOutput {
    let text = error.render().to_string();
    if error.exit_code() == 0 {
        return DecideOutput {
            exit_code: 0,
            stdout: text,
            stderr: String::new(),
        };
    }
    // The lines before the usage: what is wrong, and the parser's tip when it has one.
    let mut message = String::new();
    for line in text
        .lines()
        .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more"))
        .map(|line| line.trim().trim_start_matches("error: "))
        .filter(|line| !line.is_empty())
    {
        if !message.is_empty() {
            message.push_str(if message.ends_with(':') { " " } else { "; " });
        }
        message.push_str(line);
    }
    DecideOutput {
        stderr: text,
        ..usage_error(&message)
    }
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

async fn decide(args: &DecideArgs, resolver: &CliResolver<'_>) -> DecideOutput {
    let target_text = args.target.as_str();
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
    let via = Via::from(args.via);
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
        stderr: format!("corral egress decide: {message}\n"),
    }
}

/// Parses `NAME=IP[,IP…]`. `NAME=` is an empty answer.
fn parse_answer(text: &str) -> Result<Answer, String> {
    let Some((name, list)) = text.split_once('=') else {
        return Err(format!("{text:?} is not NAME=IP[,IP...]"));
    };
    if name.is_empty() {
        return Err(format!("{text:?} has no NAME"));
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
                .map_err(|_| format!("{item:?} is not an IP address"))?;
            addresses.push(ip);
        }
    }
    Ok(Answer {
        name: name.to_owned(),
        addresses,
    })
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
    fn help_and_version_print_text_and_exit_0() {
        for args in [
            &["--help"][..],
            &["-h"],
            &["--offline", "--help"],
            &["--version"],
        ] {
            let out = decide(args);
            assert_eq!(out.exit_code, 0, "{args:?}: {out:?}");
            assert!(!out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
        }
        let help = decide(&["--help"]).stdout;
        assert!(help.contains("Usage: corral egress decide"), "{help}");
        assert!(help.contains("--allowed-port"), "{help}");
    }

    #[test]
    fn an_unknown_flag_is_refused_with_a_suggestion_in_the_usage_object() {
        let out = decide(&["--allowed-prot", "443", "a:1"]);
        assert_eq!(out.exit_code, 2);
        assert_eq!(out.stdout.matches('\n').count(), 1, "{out:?}");
        assert_eq!(field(&out, "error"), Some("usage"));
        let message = field(&out, "message").unwrap_or_default();
        assert!(message.contains("--allowed-port"), "{message}");
        assert!(out.stderr.contains("--allowed-port"), "{}", out.stderr);
        let out = decide(&["--via"]);
        assert_eq!((out.exit_code, field(&out, "error")), (2, Some("usage")));
    }

    #[test]
    fn values_and_targets_that_begin_with_a_dash_are_taken_as_before() {
        let out = decide(&["--offline", "-x.example:443"]);
        assert_eq!(out.exit_code, 1, "{out:?}");
        assert_eq!(field(&out, "reason"), Some("authority_bad_name"));
        let out = decide(&["-x.example:443", "--offline"]);
        assert_eq!(field(&out, "reason"), Some("authority_bad_name"));
        let out = decide(&["-x.example:443", "a.example:443"]);
        assert_eq!(out.exit_code, 2, "two TARGETs: {out:?}");
        for header in ["-a.example", "--", "--offline"] {
            let out = decide(&[
                "--via",
                "http",
                "--host-header",
                header,
                "--answer",
                "a.example=93.184.216.34",
                "http://a.example/",
            ]);
            // The header is taken as given (and refused as a header), never as a flag.
            assert_eq!(out.exit_code, 1, "{header}: {out:?}");
            let reason = field(&out, "reason").unwrap_or_default();
            assert!(reason.starts_with("host_header_"), "{header}: {out:?}");
        }
        let out = decide(&["--mode", "-x", "--offline", "8.8.8.8:443"]);
        assert_eq!(field(&out, "configured_mode"), Some("-x"), "{out:?}");
        let out = decide(&["--offline", "--offline", "8.8.8.8:443"]);
        assert_eq!(
            out.exit_code, 0,
            "a repeated --offline is still --offline: {out:?}"
        );
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
