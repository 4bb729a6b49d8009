//! Where a worker's control API is: one answer for the API (execute, reset after a lease) and the
//! controller (resets the pool orders).

use std::path::PathBuf;

use corral_core::ids::WorkerId;

use crate::local::LocalBackend;

/// Where a worker's control API is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Locator {
    /// The `local` backend's records: `<dir>/<worker>.worker` holds its port on 127.0.0.1.
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
        Self::Template(format!(
            "http://{{id}}.{namespace}.svc:{}",
            crate::kube::CONTROL_PORT
        ))
    }

    /// Checks a template: plain HTTP to a host and port, with `{id}`, and no path.
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn template(template: &str) -> Result<Self, String> {
        let locator = Self::Template(template.to_owned());
        if !template.contains("{id}") {
            return Err(format!("worker URL template {template:?} has no {{id}}"));
        }
        if locator.address_of(template).is_none() {
            return Err(format!(
                "worker URL template {template:?} is not http://HOST:PORT"
            ));
        }
        Ok(locator)
    }

    /// The base URL of `worker`'s control API (`http://HOST:PORT`), if it can be found.
    #[must_use]
    pub fn base_url(&self, worker: WorkerId) -> Option<String> {
        match self {
            Self::StateDir(dir) => LocalBackend::read_record(dir, worker)
                .map(|record| format!("http://127.0.0.1:{}", record.port)),
            Self::Template(template) => Some(template.replace("{id}", &worker.to_string())),
        }
    }

    /// The host and port of `worker`'s control API, if it can be found.
    #[must_use]
    pub fn address(&self, worker: WorkerId) -> Option<(String, u16)> {
        self.address_of(&self.base_url(worker)?)
    }

    fn address_of(&self, url: &str) -> Option<(String, u16)> {
        let authority = url.strip_prefix("http://")?;
        let (host, port) = authority.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        (!host.is_empty() && !host.contains('/')).then(|| (host.to_owned(), port))
    }
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
}
