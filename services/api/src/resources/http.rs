//! The resource authority's JSON contract, as a client (`docs/resource-authority.openapi.yaml`):
//! `POST <base>/v1/rooms/{scope,audience,selection,journal,link}` with a JSON body, answered
//! with JSON. 404 means the authority knows no such room; a refused connection, a timeout, a 5xx
//! or a 429 is a tier problem (`resource_authority_unreachable`); any other status, an answer that
//! is not the contract's JSON, or one over [`ANSWER_MAX_BYTES`] is garbage
//! (`resource_authority_invalid`).

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::AuthorityError;

/// The largest answer read.
pub const ANSWER_MAX_BYTES: usize = 4 << 20;
/// How long a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of one platform's authority.
#[derive(Clone, Debug)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// A client of the authority at `base` (`http(s)://host[:port][/prefix]`).
    ///
    /// # Errors
    /// A client that cannot be built.
    pub fn new(base: &str) -> Result<Self, String> {
        crate::ensure_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .no_proxy()
            .build()
            .map_err(|e| format!("the resource authority's client: {e}"))?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            http,
        })
    }

    /// Calls `op` with `body`; `None` on 404.
    pub(super) async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        op: &str,
        body: &B,
    ) -> Result<Option<T>, AuthorityError> {
        let url = format!("{}/v1/rooms/{op}", self.base);
        let mut response = self
            .http
            .post(&url)
            .json(body)
            .send()
            .await
            .map_err(|e| AuthorityError::Unreachable(format!("{op}: {e}")))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(AuthorityError::Unreachable(format!(
                "{op}: answered {status}"
            )));
        }
        if !status.is_success() {
            return Err(AuthorityError::Invalid(format!("{op}: answered {status}")));
        }
        let mut answer = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| AuthorityError::Unreachable(format!("{op}: {e}")))?
        {
            answer.extend_from_slice(&chunk);
            if answer.len() > ANSWER_MAX_BYTES {
                return Err(AuthorityError::Invalid(format!(
                    "{op}: an answer over {ANSWER_MAX_BYTES} bytes"
                )));
            }
        }
        serde_json::from_slice(&answer)
            .map(Some)
            .map_err(|e| AuthorityError::Invalid(format!("{op}: {e}")))
    }
}
