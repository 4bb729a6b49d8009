//! Where a worker's control API is: one answer for the API (execute, and the reset after a lease)
//! and the controller (the resets the pool orders), whatever backend made the worker.

use std::path::{Path, PathBuf};

use corral_core::ids::WorkerId;

/// The control port a worker listens on unless configured otherwise (`CORRAL_WORKER_CONTROL_PORT`).
pub const CONTROL_PORT: u16 = corral_core::config::WorkerPorts::DEFAULT_CONTROL;

/// The `local` backend's record of one worker process: `<dir>/<worker>.worker`, holding
/// `<pid> <port>`, its control API on 127.0.0.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalRecord {
    /// The worker's process id.
    pub pid: i32,
    /// Its control port on 127.0.0.1.
    pub port: u16,
}

impl LocalRecord {
    /// Where `worker`'s record is kept in `dir`.
    #[must_use]
    pub fn path(dir: &Path, worker: WorkerId) -> PathBuf {
        dir.join(format!("{worker}.worker"))
    }

    /// The record's text.
    #[must_use]
    pub fn render(&self) -> String {
        format!("{} {}\n", self.pid, self.port)
    }

    /// A record's text read back.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let (pid, port) = text.trim().split_once(' ')?;
        Some(Self {
            pid: pid.parse().ok()?,
            port: port.parse().ok()?,
        })
    }

    /// `worker`'s record in `dir`, if there is a readable one.
    #[must_use]
    pub fn read(dir: &Path, worker: WorkerId) -> Option<Self> {
        Self::parse(&std::fs::read_to_string(Self::path(dir, worker)).ok()?)
    }
}

/// Where a worker's control API is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Locator {
    /// The `local` backend's records ([`LocalRecord`]).
    StateDir(PathBuf),
    /// A URL template `http://HOST:PORT` with `{id}` for the worker id: the `kube` backend's
    /// per-worker Service, `http://{id}.NAMESPACE.svc:8091` ([`Locator::kube`]).
    Template(String),
}

impl Locator {
    /// The `kube` backend's workers in `namespace`: each is reached through its own Service,
    /// named as the worker, on the control port.
    #[must_use]
    pub fn kube(namespace: &str) -> Self {
        Self::Template(format!("http://{{id}}.{namespace}.svc:{CONTROL_PORT}"))
    }

    /// Checks a template: plain HTTP to a host and port, with `{id}`, and no path.
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn template(template: &str) -> Result<Self, String> {
        if !template.contains("{id}") {
            return Err(format!("worker URL template {template:?} has no {{id}}"));
        }
        if address_of(template).is_none() {
            return Err(format!(
                "worker URL template {template:?} is not http://HOST:PORT"
            ));
        }
        Ok(Self::Template(template.to_owned()))
    }

    /// The base URL of `worker`'s control API (`http://HOST:PORT`), if it can be found.
    #[must_use]
    pub fn base_url(&self, worker: WorkerId) -> Option<String> {
        match self {
            Self::StateDir(dir) => LocalRecord::read(dir, worker)
                .map(|record| format!("http://127.0.0.1:{}", record.port)),
            Self::Template(template) => Some(template.replace("{id}", &worker.to_string())),
        }
    }

    /// The host and port of `worker`'s control API, if it can be found.
    #[must_use]
    pub fn address(&self, worker: WorkerId) -> Option<(String, u16)> {
        address_of(&self.base_url(worker)?)
    }
}

fn address_of(url: &str) -> Option<(String, u16)> {
    let authority = url.strip_prefix("http://")?;
    let (host, port) = authority.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    (!host.is_empty() && !host.contains('/')).then(|| (host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kube_worker_is_its_service_on_the_control_port() {
        let worker = WorkerId {
            epoch: 0xab,
            seq: 7,
        };
        let locator = Locator::kube("corral");
        assert_eq!(
            locator.base_url(worker).as_deref(),
            Some("http://w-ab-7.corral.svc:8091")
        );
        assert_eq!(
            locator.address(worker),
            Some(("w-ab-7.corral.svc".to_owned(), 8091))
        );
    }

    #[test]
    fn templates_are_checked() {
        assert!(Locator::template("http://{id}.ns.svc:8091").is_ok());
        for bad in [
            "http://w.ns.svc:8091",
            "https://{id}.ns.svc:8091",
            "http://{id}.ns.svc",
            "http://{id}.ns.svc:8091/v1",
            "http://{id}:port",
        ] {
            assert!(Locator::template(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_local_record_round_trips_and_a_torn_one_is_none() {
        let record = LocalRecord {
            pid: 41,
            port: 50_001,
        };
        assert_eq!(LocalRecord::parse(&record.render()), Some(record));
        for torn in ["", "41", "41 ", "x 50001", "41 70000"] {
            assert_eq!(LocalRecord::parse(torn), None, "{torn:?}");
        }
    }
}
