//! Name resolution for the egress decision: the proxy's resolver and the decide tool's table.
//!
//! Both answer the same question, "what is the complete answer for this name right now?", as a
//! [`DnsOutcome`]. The proxy asks [`HickoryResolve`] fresh for every new connection: its cache
//! is disabled, names are queried fully qualified (trailing dot, no search list, BROW-4), the
//! hosts file is not read, and A and AAAA are asked together so that the decision sees the
//! whole answer set (EGR-2). `corral egress decide --answer/--offline` asks an [`AnswerTable`]
//! instead, and no query leaves the process.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use corral_core::egress::DnsName;
use corral_core::egress::decide::DNS_ANSWERS_MAX;
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::RecordType;

use crate::refusal::ShellReason;

/// The most name servers `SANDBOX_EGRESS_DNS_SERVERS` may list.
pub const DNS_SERVERS_MAX: usize = 8;
/// The longest `SANDBOX_EGRESS_DNS_SERVERS` text read.
pub const DNS_SERVERS_TEXT_MAX_BYTES: usize = 1024;

/// What one lookup of a name found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsOutcome {
    /// The answer: A addresses, then AAAA addresses, in the order received; possibly empty
    /// (the name exists but has no address). Never more than [`DNS_ANSWERS_MAX`] + 1 entries,
    /// so an oversized answer is still refused by the decision, never truncated into an allow.
    Answer(Vec<IpAddr>),
    /// The name does not exist (NXDOMAIN).
    NxDomain,
    /// The lookup failed: [`ShellReason::DnsLookupFailed`] or [`ShellReason::DnsTimeout`].
    Failed(ShellReason),
}

impl DnsOutcome {
    /// A short code for logs and the decide tool: `answer`, `empty`, `nxdomain`, or the failure.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            DnsOutcome::Answer(addresses) if addresses.is_empty() => "empty",
            DnsOutcome::Answer(_) => "answer",
            DnsOutcome::NxDomain => "nxdomain",
            DnsOutcome::Failed(reason) => reason.code(),
        }
    }
}

/// Something that resolves a name to its complete answer.
pub trait Resolve: Send + Sync {
    /// Resolves `name` (queried fully qualified), fresh: never from a cache.
    fn resolve(&self, name: &DnsName) -> impl Future<Output = DnsOutcome> + Send;
}

/// A fixed table of answers: `corral egress decide --answer NAME=IP[,IP…]`. A name not in the
/// table is NXDOMAIN. Names match like hostnames: ASCII case-insensitive, one trailing dot
/// ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnswerTable {
    answers: BTreeMap<String, Vec<IpAddr>>,
}

impl AnswerTable {
    /// An empty table: every name is NXDOMAIN.
    #[must_use]
    pub fn new() -> AnswerTable {
        AnswerTable::default()
    }

    /// The table key for a name: ASCII lower case, one trailing dot dropped.
    #[must_use]
    pub fn key(name: &str) -> String {
        name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
    }

    /// Adds addresses for `name` (after any already given for it); an empty list records that
    /// the name exists with an empty answer.
    pub fn add(&mut self, name: &str, addresses: &[IpAddr]) {
        self.answers
            .entry(AnswerTable::key(name))
            .or_default()
            .extend_from_slice(addresses);
    }

    /// The outcome for a name, without any I/O.
    #[must_use]
    pub fn lookup(&self, name: &str) -> DnsOutcome {
        match self.answers.get(&AnswerTable::key(name)) {
            Some(addresses) => DnsOutcome::Answer(addresses.clone()),
            None => DnsOutcome::NxDomain,
        }
    }
}

impl Resolve for AnswerTable {
    fn resolve(&self, name: &DnsName) -> impl Future<Output = DnsOutcome> + Send {
        std::future::ready(self.lookup(name.as_str()))
    }
}

/// Parses `SANDBOX_EGRESS_DNS_SERVERS`: comma-separated `IP`, `IP:port` or `[IPv6]:port`
/// (port 53 when absent). Empty text means "use the system's configuration" (`Ok(None)`).
pub fn parse_dns_servers(text: &str) -> Result<Option<Vec<SocketAddr>>, String> {
    if text.len() > DNS_SERVERS_TEXT_MAX_BYTES {
        return Err(format!(
            "SANDBOX_EGRESS_DNS_SERVERS is longer than {DNS_SERVERS_TEXT_MAX_BYTES} bytes"
        ));
    }
    if text.trim().is_empty() {
        return Ok(None);
    }
    let mut servers = Vec::new();
    for item in text.split(',').map(str::trim) {
        let server = match (item.parse::<SocketAddr>(), item.parse::<IpAddr>()) {
            (Ok(addr), _) if addr.port() != 0 => addr,
            (Err(_), Ok(ip)) => SocketAddr::new(ip, 53),
            (Ok(_) | Err(_), _) => {
                return Err(format!(
                    "SANDBOX_EGRESS_DNS_SERVERS: {item:?} is not IP, IP:port or [IPv6]:port"
                ));
            }
        };
        servers.push(server);
        if servers.len() > DNS_SERVERS_MAX {
            return Err(format!(
                "SANDBOX_EGRESS_DNS_SERVERS lists more than {DNS_SERVERS_MAX} servers"
            ));
        }
    }
    Ok(Some(servers))
}

/// The proxy's resolver: hickory, no cache, no hosts file, names fully qualified.
#[derive(Clone)]
pub struct HickoryResolve {
    resolver: TokioResolver,
    timeout: Duration,
}

impl std::fmt::Debug for HickoryResolve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HickoryResolve")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HickoryResolve {
    /// A resolver asking `servers`, or the system's name servers when `None`. `timeout` bounds
    /// one whole lookup (both record types, every retry).
    pub fn new(
        servers: Option<&[SocketAddr]>,
        timeout: Duration,
    ) -> Result<HickoryResolve, String> {
        match servers {
            Some(servers) => {
                let mut config = ResolverConfig::default();
                for server in servers {
                    let mut name_server = NameServerConfig::udp_and_tcp(server.ip());
                    for connection in &mut name_server.connections {
                        connection.port = server.port();
                    }
                    config.name_servers.push(name_server);
                }
                Self::build(config, ResolverOpts::default(), timeout)
            }
            None => {
                let text = std::fs::read("/etc/resolv.conf")
                    .map_err(|e| format!("reading the system's resolver configuration: {e}"))?;
                Self::from_resolv_conf(&text, None, timeout)
            }
        }
    }

    /// A resolver configured by the resolv.conf `text`, its name servers asked on `port` (53 when
    /// `None`; resolv.conf cannot name one). Its search list and `ndots` never apply: every
    /// name is asked fully qualified (BROW-4).
    pub fn from_resolv_conf(
        text: &[u8],
        port: Option<u16>,
        timeout: Duration,
    ) -> Result<HickoryResolve, String> {
        let (mut config, options) = hickory_resolver::system_conf::parse_resolv_conf(text)
            .map_err(|e| format!("the resolver configuration: {e}"))?;
        if let Some(port) = port {
            for name_server in &mut config.name_servers {
                for connection in &mut name_server.connections {
                    connection.port = port;
                }
            }
        }
        Self::build(config, options, timeout)
    }

    fn build(
        config: ResolverConfig,
        options: ResolverOpts,
        timeout: Duration,
    ) -> Result<HickoryResolve, String> {
        let mut builder =
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
                .with_options(options);
        let options: &mut ResolverOpts = builder.options_mut();
        // Re-resolve for every connection (EGR-2): nothing is cached, positive or negative.
        options.cache_size = 0;
        options.positive_min_ttl = Some(Duration::ZERO);
        options.positive_max_ttl = Some(Duration::ZERO);
        options.negative_min_ttl = Some(Duration::ZERO);
        options.negative_max_ttl = Some(Duration::ZERO);
        // Only DNS decides: a hosts file entry is not an answer the operator configured here.
        options.use_hosts_file = ResolveHosts::Never;
        options.timeout = timeout;
        options.attempts = 1;
        let resolver = builder
            .build()
            .map_err(|e| format!("building the resolver: {e}"))?;
        Ok(HickoryResolve { resolver, timeout })
    }

    async fn lookup_both(&self, fqdn: &str) -> DnsOutcome {
        let (v4, v6) = tokio::join!(
            self.resolver.lookup(fqdn, RecordType::A),
            self.resolver.lookup(fqdn, RecordType::AAAA)
        );
        let mut addresses = Vec::new();
        let mut nxdomain = false;
        for result in [v4, v6] {
            match result {
                Ok(lookup) => {
                    let found = lookup.answers().iter().filter_map(|r| r.data.ip_addr());
                    for ip in found {
                        if addresses.len() > DNS_ANSWERS_MAX {
                            break;
                        }
                        addresses.push(ip);
                    }
                }
                Err(NetError::Dns(DnsError::NoRecordsFound(no_records))) => {
                    nxdomain |= no_records.response_code == ResponseCode::NXDomain;
                }
                Err(NetError::Timeout) => return DnsOutcome::Failed(ShellReason::DnsTimeout),
                Err(_) => return DnsOutcome::Failed(ShellReason::DnsLookupFailed),
            }
        }
        if addresses.is_empty() && nxdomain {
            return DnsOutcome::NxDomain;
        }
        DnsOutcome::Answer(addresses)
    }
}

impl Resolve for HickoryResolve {
    fn resolve(&self, name: &DnsName) -> impl Future<Output = DnsOutcome> + Send {
        let fqdn = name.to_fqdn();
        async move {
            match tokio::time::timeout(self.timeout, self.lookup_both(&fqdn)).await {
                Ok(outcome) => outcome,
                Err(_) => DnsOutcome::Failed(ShellReason::DnsTimeout),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn answer_table_matches_like_hostnames() {
        let mut table = AnswerTable::new();
        table.add("Example.COM.", &[ip("1.2.3.4")]);
        table.add("example.com", &[ip("::1")]);
        table.add("empty.example", &[]);
        assert_eq!(
            table.lookup("EXAMPLE.com"),
            DnsOutcome::Answer(vec![ip("1.2.3.4"), ip("::1")])
        );
        assert_eq!(table.lookup("example.com."), table.lookup("example.com"));
        assert_eq!(table.lookup("example.com.."), DnsOutcome::NxDomain);
        assert_eq!(table.lookup("empty.example"), DnsOutcome::Answer(vec![]));
        assert_eq!(table.lookup("other.example"), DnsOutcome::NxDomain);
    }

    #[test]
    fn dns_servers_setting_is_strict() {
        assert_eq!(parse_dns_servers(""), Ok(None));
        assert_eq!(parse_dns_servers("  "), Ok(None));
        assert_eq!(
            parse_dns_servers("127.0.0.1:5353, 10.0.0.2,[::1]:53,::1"),
            Ok(Some(vec![
                "127.0.0.1:5353".parse().unwrap(),
                "10.0.0.2:53".parse().unwrap(),
                "[::1]:53".parse().unwrap(),
                "[::1]:53".parse().unwrap(),
            ]))
        );
        for bad in [
            "dns.example",
            "1.2.3.4:0",
            "1.2.3.4,",
            "1.2.3.4:99999",
            "01.2.3.4",
        ] {
            assert!(parse_dns_servers(bad).is_err(), "{bad}");
        }
        assert!(parse_dns_servers(&["1.1.1.1"; 9].join(",")).is_err());
    }
}
