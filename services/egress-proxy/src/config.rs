//! The proxy's own settings, read once at start-up. Unlike the egress policy (which comes from
//! each grant), these are operational: a malformed value refuses to start rather than guess.
//!
//! | setting | default | what |
//! |---|---|---|
//! | `CORRAL_EGRESS_LISTEN` | `127.0.0.1:3128` | where the proxy listens |
//! | `CORRAL_EGRESS_VERIFYING_KEY_FILE` | (one of file or URL required) | the grant verifying key, text form |
//! | `CORRAL_EGRESS_VERIFYING_KEY_URL` | | the API's key endpoint, plain `http://` |
//! | `SANDBOX_EGRESS_DNS_SERVERS` | the system's | name servers, `IP[:port]`, comma-separated |
//! | `CORRAL_EGRESS_HEADER_MAX_BYTES` | 32768 | request head bound (at least 17408: a grant is up to 16 KiB) |
//! | `CORRAL_EGRESS_HEADER_TIMEOUT_MS` | 10000 | time to receive the request head |
//! | `CORRAL_EGRESS_DNS_TIMEOUT_MS` | 5000 | time for one whole lookup |
//! | `CORRAL_EGRESS_CONNECT_TIMEOUT_MS` | 10000 | time to connect upstream |
//! | `CORRAL_EGRESS_IDLE_TIMEOUT_MS` | 300000 | a tunnel with no bytes either way this long is closed |
//! | `CORRAL_EGRESS_CONNECTIONS_MAX` | 4096 | concurrent client connections (more wait in the backlog) |
//! | `CORRAL_EGRESS_KEY_REFRESH_MS` | 5000 | URL key source: how old a fetched key may be |
//! | `CORRAL_EGRESS_METRICS_LISTEN` | (off) | where counters are served as text |

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use corral_core::egress::grant::GRANT_TOKEN_MAX_BYTES;

use crate::dns::parse_dns_servers;
use crate::key::{KeySource, KeyUrl};

/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3128";
/// The smallest header bound allowed: the largest grant plus room for the rest of the head.
pub const HEADER_MAX_BYTES_FLOOR: usize = GRANT_TOKEN_MAX_BYTES + 1024;
/// The largest header bound allowed.
pub const HEADER_MAX_BYTES_CEILING: usize = 1024 * 1024;

/// Bounds on one client connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The longest request head read.
    pub header_max_bytes: usize,
    /// Time to receive the whole request head.
    pub header_timeout: Duration,
    /// Time for one whole DNS lookup.
    pub dns_timeout: Duration,
    /// Time to connect to the pinned upstream.
    pub connect_timeout: Duration,
    /// A tunnel or relay idle (no bytes either way) this long is closed.
    pub idle_timeout: Duration,
    /// The most client connections served at once.
    pub connections_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_max_bytes: 32 * 1024,
            header_timeout: Duration::from_secs(10),
            dns_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            connections_max: 4096,
        }
    }
}

/// Everything the proxy reads at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where the verifying key comes from.
    pub key_source: KeySource,
    /// Name servers, or `None` for the system's.
    pub dns_servers: Option<Vec<SocketAddr>>,
    /// Per-connection bounds.
    pub limits: Limits,
    /// Where to serve counters, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
}

impl ProxyConfig {
    /// Reads the settings through `lookup` (the process environment in production). Empty
    /// values count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<ProxyConfig, String> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let listen = get("CORRAL_EGRESS_LISTEN").unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = parse_socket_addr("CORRAL_EGRESS_LISTEN", &listen)?;
        let key_source = key_source(&get)?;
        let dns_servers =
            parse_dns_servers(&get("SANDBOX_EGRESS_DNS_SERVERS").unwrap_or_default())?;
        let limits = limits(&get)?;
        let metrics_listen = get("CORRAL_EGRESS_METRICS_LISTEN")
            .map(|text| parse_socket_addr("CORRAL_EGRESS_METRICS_LISTEN", &text))
            .transpose()?;
        Ok(ProxyConfig {
            listen,
            key_source,
            dns_servers,
            limits,
            metrics_listen,
        })
    }
}

/// Where the verifying key comes from: a file or the API's URL, exactly one.
fn key_source(get: &impl Fn(&str) -> Option<String>) -> Result<KeySource, String> {
    match (
        get("CORRAL_EGRESS_VERIFYING_KEY_FILE"),
        get("CORRAL_EGRESS_VERIFYING_KEY_URL"),
    ) {
        (Some(path), None) => Ok(KeySource::File(PathBuf::from(path))),
        (None, Some(url)) => {
            let refresh_ms = number(get, "CORRAL_EGRESS_KEY_REFRESH_MS", 5_000, 100, 3_600_000)?;
            Ok(KeySource::Url {
                url: KeyUrl::parse(&url)?,
                refresh: Duration::from_millis(refresh_ms),
            })
        }
        (Some(_), Some(_)) => Err("set one of CORRAL_EGRESS_VERIFYING_KEY_FILE and \
                                   CORRAL_EGRESS_VERIFYING_KEY_URL, not both"
            .to_owned()),
        (None, None) => Err("no verifying key: set CORRAL_EGRESS_VERIFYING_KEY_FILE or \
                             CORRAL_EGRESS_VERIFYING_KEY_URL (EGR-7)"
            .to_owned()),
    }
}

/// The per-connection bounds, each within its range, or its default when unset.
fn limits(get: &impl Fn(&str) -> Option<String>) -> Result<Limits, String> {
    let defaults = Limits::default();
    let ms = |name: &str, default: Duration, min: u64, max: u64| {
        let default_ms = u64::try_from(default.as_millis()).unwrap_or(u64::MAX);
        number(get, name, default_ms, min, max).map(Duration::from_millis)
    };
    let header_max_bytes = number(
        get,
        "CORRAL_EGRESS_HEADER_MAX_BYTES",
        defaults.header_max_bytes as u64,
        HEADER_MAX_BYTES_FLOOR as u64,
        HEADER_MAX_BYTES_CEILING as u64,
    )?;
    Ok(Limits {
        header_max_bytes: usize::try_from(header_max_bytes).map_err(|e| e.to_string())?,
        header_timeout: ms(
            "CORRAL_EGRESS_HEADER_TIMEOUT_MS",
            defaults.header_timeout,
            10,
            600_000,
        )?,
        dns_timeout: ms(
            "CORRAL_EGRESS_DNS_TIMEOUT_MS",
            defaults.dns_timeout,
            10,
            60_000,
        )?,
        connect_timeout: ms(
            "CORRAL_EGRESS_CONNECT_TIMEOUT_MS",
            defaults.connect_timeout,
            10,
            600_000,
        )?,
        idle_timeout: ms(
            "CORRAL_EGRESS_IDLE_TIMEOUT_MS",
            defaults.idle_timeout,
            10,
            86_400_000,
        )?,
        connections_max: usize::try_from(number(
            get,
            "CORRAL_EGRESS_CONNECTIONS_MAX",
            defaults.connections_max as u64,
            1,
            1_000_000,
        )?)
        .map_err(|e| e.to_string())?,
    })
}

fn parse_socket_addr(name: &str, text: &str) -> Result<SocketAddr, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{name}: {text:?} is not IP:port"))
}

/// A plain decimal setting within `min..=max`, or `default` when unset.
fn number(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, String> {
    let Some(text) = get(name) else {
        return Ok(default);
    };
    let text = text.trim();
    let value: u64 = text
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| text.parse().ok())
        .flatten()
        .ok_or_else(|| format!("{name}: {text:?} is not a number"))?;
    if !(min..=max).contains(&value) {
        return Err(format!("{name}: {value} is outside {min}..={max}"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn config(pairs: &[(&str, &str)]) -> Result<ProxyConfig, String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ProxyConfig::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_need_only_a_key() {
        let c = config(&[("CORRAL_EGRESS_VERIFYING_KEY_FILE", "/k")]).unwrap();
        assert_eq!(c.listen, "127.0.0.1:3128".parse().unwrap());
        assert_eq!(c.key_source, KeySource::File("/k".into()));
        assert_eq!(c.dns_servers, None);
        assert_eq!(c.limits, Limits::default());
        assert!(c.limits.header_max_bytes >= HEADER_MAX_BYTES_FLOOR);
        assert!(config(&[]).is_err());
    }

    #[test]
    fn bad_values_refuse_to_start() {
        for (name, value) in [
            ("CORRAL_EGRESS_LISTEN", "localhost:3128"),
            ("CORRAL_EGRESS_HEADER_MAX_BYTES", "8192"),
            ("CORRAL_EGRESS_HEADER_TIMEOUT_MS", "-1"),
            ("CORRAL_EGRESS_IDLE_TIMEOUT_MS", "10s"),
            ("SANDBOX_EGRESS_DNS_SERVERS", "dns.example"),
            ("CORRAL_EGRESS_VERIFYING_KEY_URL", "http://127.0.0.1:8000/k"),
        ] {
            assert!(
                config(&[("CORRAL_EGRESS_VERIFYING_KEY_FILE", "/k"), (name, value)]).is_err(),
                "{name}={value}"
            );
        }
    }
}
