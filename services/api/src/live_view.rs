//! The live view's TURN side of an open (BROW-9, ISO-5): the one configured authority, its shared
//! secret, and an answer from it before a session is allowed, then the credential the session's
//! worker and its viewers share.
//!
//! Nothing here comes from a request: the authority is `CORRAL_TURN_URL`, the secret is read from
//! `CORRAL_TURN_SECRET_FILE` at each open (so that a rotated secret applies to the next session),
//! and an authority that does not answer a STUN Binding request over UDP within
//! [`PROBE_TIMEOUT`] (three tries) refuses the open as `turn_unreachable`, as does one the API
//! cannot resolve. Every rule is `corral_core::browser::turn`'s.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use corral_core::browser::turn::{
    self, TurnAuthority, TurnCredential, TurnHost, TurnRefusal, binding_request, is_binding_success,
};
use corral_core::time::UnixMillis;
use tokio::net::UdpSocket;

use crate::AppState;

/// How long one STUN Binding request waits for its answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// How many Binding requests the probe sends before it gives up.
const PROBE_TRIES: u32 = 3;

/// The credential for `session`, minted at `now`, or why the open is refused.
///
/// # Errors
/// [`TurnRefusal`]: not configured, not usable, or not answering.
pub async fn credential(
    state: &AppState,
    session: &str,
    now: UnixMillis,
) -> Result<(TurnCredential, SocketAddr), TurnRefusal> {
    let settings = &state.settings.turn;
    let authority = TurnAuthority::parse(settings.url.as_deref())?;
    let secret =
        match &settings.secret_file {
            None => None,
            Some(path) => Some(tokio::fs::read(path).await.map_err(|e| {
                TurnRefusal::Invalid(format!("CORRAL_TURN_SECRET_FILE {path}: {e}"))
            })?),
        };
    let secret = turn::secret(secret.as_deref())?;
    let address = probe(&authority).await?;
    let credential = turn::mint(
        &authority,
        secret,
        session,
        now,
        settings.credential_ttl_seconds,
    );
    Ok((credential, address))
}

/// The authority's address: its literal, or the first address its name resolves to.
async fn address(authority: &TurnAuthority) -> Result<SocketAddr, TurnRefusal> {
    match &authority.host {
        TurnHost::Ip(ip) => Ok(SocketAddr::new(*ip, authority.port)),
        TurnHost::Name(name) => {
            // Asked fully qualified, as the proxy asks every name (BROW-4): the member's browser must
            // reach the same authority, so a cluster-relative name would not do.
            let fqdn = format!("{name}.");
            tokio::net::lookup_host((fqdn.as_str(), authority.port))
                .await
                .ok()
                .and_then(|mut found| found.next())
                .ok_or_else(|| {
                    TurnRefusal::Unreachable(format!(
                        "the TURN server {authority} does not resolve"
                    ))
                })
        }
    }
}

/// One STUN Binding exchange with the authority over UDP, retried [`PROBE_TRIES`] times; the
/// address that answered.
async fn probe(authority: &TurnAuthority) -> Result<SocketAddr, TurnRefusal> {
    let target = address(authority).await?;
    let local: IpAddr = if target.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let unreachable = |why: String| {
        TurnRefusal::Unreachable(format!("the TURN server {authority} ({target}) {why}"))
    };
    let socket = UdpSocket::bind((local, 0))
        .await
        .map_err(|e| unreachable(format!("cannot be asked: {e}")))?;
    socket
        .connect(target)
        .await
        .map_err(|e| unreachable(format!("cannot be reached: {e}")))?;
    let mut transaction = [0u8; 12];
    transaction.copy_from_slice(&corral_contract::credential::random_bytes()[..12]);
    let request = binding_request(transaction);
    let mut reply = [0u8; 576];
    for _ in 0..PROBE_TRIES {
        // A send refused by the network (ICMP unreachable) shows as an error on the next call.
        let _ = socket.send(&request).await;
        if let Ok(Ok(n)) = tokio::time::timeout(PROBE_TIMEOUT, socket.recv(&mut reply)).await
            && is_binding_success(&reply[..n], &transaction)
        {
            return Ok(target);
        }
    }
    Err(unreachable(format!(
        "did not answer a STUN Binding request over UDP ({PROBE_TRIES} tries, {} ms each)",
        PROBE_TIMEOUT.as_millis()
    )))
}
