//! The canonical binary encoding of claims, and its decoder, which accepts nothing else.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::claims::{ExecutionId, GrantClaims, actor_is_valid, run_is_valid};
use crate::egress::address::Cidr;
use crate::egress::policy::{ALLOWED_HOSTS_MAX, AllowedHosts, AllowedPorts, Policy, PrivateCidrs};
use crate::egress::target::{DnsName, Host};
use crate::ids::ActorId;
use crate::time::UnixMillis;

const CLAIMS_VERSION: u8 = 1;

pub(super) fn encode_claims(claims: &GrantClaims) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.push(CLAIMS_VERSION);
    let empty_cidrs = PrivateCidrs::empty();
    let empty_hosts = AllowedHosts::default();
    let (mode, ports, cidrs, hosts) = match &claims.policy {
        Policy::Isolated => (0u8, None, &empty_cidrs, &empty_hosts),
        Policy::PublicInternet { ports } => (1, Some(ports), &empty_cidrs, &empty_hosts),
        Policy::PrivateNetwork { ports, cidrs } => (2, Some(ports), cidrs, &empty_hosts),
        Policy::HostAllowlist {
            ports,
            hosts,
            cidrs,
        } => (3, Some(ports), cidrs, hosts),
    };
    out.push(mode);
    let ports: Vec<u16> = ports.map(|p| p.iter().collect()).unwrap_or_default();
    push_count(&mut out, ports.len());
    for port in ports {
        out.extend_from_slice(&port.to_be_bytes());
    }
    push_count(&mut out, cidrs.iter().count());
    for cidr in cidrs.iter() {
        match cidr.addr() {
            IpAddr::V4(v4) => {
                out.push(4);
                out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out.push(6);
                out.extend_from_slice(&v6.octets());
            }
        }
        out.push(cidr.prefix_len());
    }
    push_count(&mut out, hosts.iter().count());
    for host in hosts.iter() {
        match host {
            Host::Name(name) => {
                out.push(1);
                push_count(&mut out, name.as_str().len());
                out.extend_from_slice(name.as_str().as_bytes());
            }
            Host::Ipv4(v4) => {
                out.push(4);
                out.extend_from_slice(&v4.octets());
            }
            Host::Ipv6(v6) => {
                out.push(6);
                out.extend_from_slice(&v6.octets());
            }
        }
    }
    push_count(&mut out, claims.run.len());
    out.extend_from_slice(claims.run.as_bytes());
    let actor = claims.actor.0.as_bytes();
    out.extend_from_slice(&u16::try_from(actor.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(actor);
    out.extend_from_slice(&claims.execution_id.0);
    out.extend_from_slice(&claims.issued_at.0.to_be_bytes());
    out.extend_from_slice(&claims.expires_at.0.to_be_bytes());
    out.extend_from_slice(&claims.policy_revision.to_be_bytes());
    out
}

/// Writes a one-byte count. Every counted part is bounded far below 256 by its constructor; a
/// count that does not fit is written as 255, and such claims then fail to decode.
fn push_count(out: &mut Vec<u8>, count: usize) {
    out.push(u8::try_from(count).unwrap_or(u8::MAX));
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }

    fn addr(&mut self, family: u8) -> Option<IpAddr> {
        match family {
            4 => self.array::<4>().map(|b| IpAddr::V4(Ipv4Addr::from(b))),
            6 => self.array::<16>().map(|b| IpAddr::V6(Ipv6Addr::from(b))),
            _ => None,
        }
    }
}

pub(super) fn decode_claims(bytes: &[u8]) -> Option<GrantClaims> {
    let mut r = Reader { bytes };
    if r.u8()? != CLAIMS_VERSION {
        return None;
    }
    let mode = r.u8()?;
    let port_count = usize::from(r.u8()?);
    let mut ports = Vec::with_capacity(port_count);
    for _ in 0..port_count {
        ports.push(r.u16()?);
    }
    let cidr_count = usize::from(r.u8()?);
    let mut cidrs = Vec::with_capacity(cidr_count);
    for _ in 0..cidr_count {
        let family = r.u8()?;
        let addr = r.addr(family)?;
        cidrs.push(Cidr::new(addr, r.u8()?).ok()?);
    }
    let host_count = usize::from(r.u8()?);
    if host_count > ALLOWED_HOSTS_MAX {
        return None;
    }
    let mut hosts = Vec::with_capacity(host_count);
    for _ in 0..host_count {
        hosts.push(match r.u8()? {
            1 => {
                let len = usize::from(r.u8()?);
                let text = std::str::from_utf8(r.take(len)?).ok()?;
                Host::Name(DnsName::parse(text).ok()?)
            }
            4 => match r.addr(4)? {
                IpAddr::V4(v4) => Host::Ipv4(v4),
                IpAddr::V6(_) => return None,
            },
            6 => match r.addr(6)? {
                IpAddr::V6(v6) => Host::Ipv6(v6),
                IpAddr::V4(_) => return None,
            },
            _ => return None,
        });
    }
    let run_len = usize::from(r.u8()?);
    let run = std::str::from_utf8(r.take(run_len)?).ok()?.to_owned();
    let actor_len = usize::from(r.u16()?);
    let actor = ActorId(std::str::from_utf8(r.take(actor_len)?).ok()?.to_owned());
    let execution_id = ExecutionId(r.array()?);
    let issued_at = UnixMillis(r.u64()?);
    let expires_at = UnixMillis(r.u64()?);
    let policy_revision = r.u64()?;
    if !r.bytes.is_empty() || !run_is_valid(&run) || !actor_is_valid(&actor.0) {
        return None;
    }
    let policy = decode_policy(mode, ports, cidrs, hosts)?;
    let claims = GrantClaims {
        policy,
        run,
        actor,
        execution_id,
        issued_at,
        expires_at,
        policy_revision,
    };
    // Only the canonical encoding is accepted: sets ascending without duplicates, names canonical.
    (encode_claims(&claims) == bytes).then_some(claims)
}

fn decode_policy(mode: u8, ports: Vec<u16>, cidrs: Vec<Cidr>, hosts: Vec<Host>) -> Option<Policy> {
    let ports = AllowedPorts::new(ports).ok()?;
    let cidrs = PrivateCidrs::new(cidrs).ok()?;
    let hosts = AllowedHosts::new(hosts).ok()?;
    match mode {
        1 if cidrs.is_empty() && hosts.is_empty() => Some(Policy::PublicInternet { ports }),
        2 if hosts.is_empty() => Some(Policy::PrivateNetwork { ports, cidrs }),
        3 => Some(Policy::HostAllowlist {
            ports,
            hosts,
            cidrs,
        }),
        _ => None,
    }
}
