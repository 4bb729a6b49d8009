//! The world's name service. Every connection a shell opens in the deployment world resolves its
//! host's name here first (as fred resolves Valkey's name, and the worker client's connector a
//! worker's), so the world can make a name fail to resolve or resolve only after the resolver's
//! timeout, for a while, without touching the network between the hosts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long a lookup that gets no answer takes to fail (glibc's default resolver timeout).
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a name's lookups fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Answered at once: no such name (NXDOMAIN or SERVFAIL).
    NotFound,
    /// Never answered: the lookup fails after [`RESOLVE_TIMEOUT`].
    Timeout,
}

/// The names whose lookups fail now, shared by every host of one world.
#[derive(Clone, Default)]
pub struct Dns(Arc<Mutex<BTreeMap<String, Failure>>>);

impl Dns {
    /// Lookups of `name` fail this way until [`Dns::heal`].
    pub fn fail(&self, name: &str, failure: Failure) {
        self.names().insert(name.to_owned(), failure);
    }

    /// Lookups of `name` answer again.
    pub fn heal(&self, name: &str) {
        self.names().remove(name);
    }

    fn names(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Failure>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves `name`, then connects to it on `port` over the world's network.
    ///
    /// # Errors
    /// The lookup's failure, or the connection's.
    pub async fn connect(&self, name: &str, port: u16) -> std::io::Result<turmoil::net::TcpStream> {
        let failure = self.names().get(name).copied();
        match failure {
            None => turmoil::net::TcpStream::connect((name, port)).await,
            Some(Failure::NotFound) => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{name}: no such host"),
            )),
            Some(Failure::Timeout) => {
                tokio::time::sleep(RESOLVE_TIMEOUT).await;
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{name}: the lookup timed out"),
                ))
            }
        }
    }
}
