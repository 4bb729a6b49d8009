//! Where the proxy's grant verifying key comes from, and picking up a new one (EGR-7, EGR-9).
//!
//! The proxy holds only the public half ([`GrantVerifier`]); it can verify and never mint.
//! - [`KeySource::File`]: the key's text form (base64url, 43 characters; surrounding whitespace
//!   ignored) or its 32 raw bytes. Checked at every verification: when the file's modification
//!   time, size or inode changes it is read again, so a rotated key applies to the very next
//!   request. A missing or unreadable file means no key: every grant is refused (407).
//! - [`KeySource::Url`]: a plain `http://` GET of the API's key endpoint, whose body is the key
//!   text. Fetched when older than the refresh interval, and again (at most once a second) when a
//!   grant fails its signature, so a rotation is picked up at the next verification after it.
//!   When a fetch fails the last key fetched stays in use; with none, every grant is refused.

use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use corral_core::egress::{GrantVerifier, Host, HttpRequestTarget, parse_absolute_url};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

/// The largest key file or key response read.
pub const KEY_BYTES_MAX: usize = 4096;
/// How long one fetch from the key URL may take.
pub const KEY_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest interval between two fetches forced by a failed signature.
pub const KEY_FORCED_REFRESH_MIN: Duration = Duration::from_secs(1);

/// Where the verifying key is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// A file holding the key.
    File(PathBuf),
    /// The API's key endpoint.
    Url {
        /// The endpoint.
        url: KeyUrl,
        /// How old a fetched key may be before it is fetched again.
        refresh: Duration,
    },
}

/// A plain-HTTP key endpoint, parsed by the core's strict URL grammar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyUrl {
    target: HttpRequestTarget,
}

impl KeyUrl {
    /// Parses `http://host[:port]/path`.
    pub fn parse(text: &str) -> Result<KeyUrl, String> {
        parse_absolute_url(text)
            .map(|target| KeyUrl { target })
            .map_err(|reason| format!("CORRAL_EGRESS_VERIFYING_KEY_URL {text:?}: {reason}"))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    mtime_s: i64,
    mtime_ns: i64,
    len: u64,
    ino: u64,
    dev: u64,
}

#[derive(Debug, Default)]
struct KeyState {
    verifier: Option<GrantVerifier>,
    error: Option<String>,
    stamp: Option<FileStamp>,
    fetched_at: Option<Instant>,
}

/// The current verifying key, re-read as its source changes.
#[derive(Debug)]
pub struct KeyStore {
    source: KeySource,
    state: Mutex<KeyState>,
}

impl KeyStore {
    /// A store reading from `source`; nothing is read until the first verification.
    #[must_use]
    pub fn new(source: KeySource) -> KeyStore {
        KeyStore {
            source,
            state: Mutex::new(KeyState::default()),
        }
    }

    /// The key to verify with now, or why there is none.
    pub async fn current(&self) -> Result<GrantVerifier, String> {
        let mut state = self.state.lock().await;
        match &self.source {
            KeySource::File(path) => refresh_file(path, &mut state),
            KeySource::Url { url, refresh } => {
                let stale = state.fetched_at.is_none_or(|at| at.elapsed() >= *refresh);
                if stale {
                    refresh_url(url, &mut state).await;
                }
            }
        }
        state
            .verifier
            .clone()
            .ok_or_else(|| state.error.clone().unwrap_or_else(|| "no key".to_owned()))
    }

    /// After a grant failed its signature: fetch a URL key again (rate-limited) and return it if
    /// it changed. A file key is already current, so this returns `None` for it.
    pub async fn refreshed_after_bad_signature(
        &self,
        used: &GrantVerifier,
    ) -> Option<GrantVerifier> {
        let KeySource::Url { url, .. } = &self.source else {
            return None;
        };
        let mut state = self.state.lock().await;
        let recent = state
            .fetched_at
            .is_some_and(|at| at.elapsed() < KEY_FORCED_REFRESH_MIN);
        if !recent {
            refresh_url(url, &mut state).await;
        }
        state.verifier.clone().filter(|fresh| fresh != used)
    }
}

fn refresh_file(path: &PathBuf, state: &mut KeyState) {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) => {
            *state = KeyState {
                error: Some(format!("key file {}: {e}", path.display())),
                ..KeyState::default()
            };
            return;
        }
    };
    let stamp = FileStamp {
        mtime_s: metadata.mtime(),
        mtime_ns: metadata.mtime_nsec(),
        len: metadata.len(),
        ino: metadata.ino(),
        dev: metadata.dev(),
    };
    if state.stamp == Some(stamp) {
        return;
    }
    let parsed = read_bounded_file(path).and_then(|bytes| parse_key(&bytes));
    *state = match parsed {
        Ok(verifier) => KeyState {
            verifier: Some(verifier),
            stamp: Some(stamp),
            ..KeyState::default()
        },
        Err(e) => KeyState {
            error: Some(format!("key file {}: {e}", path.display())),
            stamp: Some(stamp),
            ..KeyState::default()
        },
    };
}

fn read_bounded_file(path: &PathBuf) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(KEY_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() > KEY_BYTES_MAX {
        return Err(format!("longer than {KEY_BYTES_MAX} bytes"));
    }
    Ok(bytes)
}

/// A key from its text form (surrounding whitespace ignored) or its 32 raw bytes.
pub fn parse_key(bytes: &[u8]) -> Result<GrantVerifier, String> {
    let text = std::str::from_utf8(bytes).map(str::trim);
    let from_text = text.map_err(|e| e.to_string()).and_then(|text| {
        GrantVerifier::from_public_key_text(text).map_err(|e| e.code().to_owned())
    });
    match from_text {
        Ok(verifier) => Ok(verifier),
        Err(_) if bytes.len() == 32 => {
            GrantVerifier::from_public_key_bytes(bytes).map_err(|e| e.code().to_owned())
        }
        Err(e) => Err(e),
    }
}

async fn refresh_url(url: &KeyUrl, state: &mut KeyState) {
    state.fetched_at = Some(Instant::now());
    let fetched = tokio::time::timeout(KEY_FETCH_TIMEOUT, fetch(url))
        .await
        .unwrap_or_else(|_| Err("timed out".to_owned()))
        .and_then(|body| parse_key(&body));
    match fetched {
        Ok(verifier) => {
            state.verifier = Some(verifier);
            state.error = None;
        }
        Err(e) => state.error = Some(format!("key URL: {e}")),
    }
}

/// One bounded `GET`, returning the body of a 200 answer.
async fn fetch(url: &KeyUrl) -> Result<Vec<u8>, String> {
    let target = &url.target.target;
    let mut stream = match &target.host {
        Host::Name(name) => TcpStream::connect((name.to_fqdn(), target.port)).await,
        Host::Ipv4(_) | Host::Ipv6(_) => {
            let ip = target.host.ip().ok_or("no address")?;
            TcpStream::connect((ip, target.port)).await
        }
    }
    .map_err(|e| e.to_string())?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n",
        url.target.origin_form, target
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    (&mut stream)
        .take(KEY_BYTES_MAX as u64 * 2)
        .read_to_end(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let head_end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no complete response head")?;
    let head = String::from_utf8_lossy(&response[..head_end]);
    let status_ok = head
        .lines()
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .is_some_and(|code| code == "200");
    if !status_ok {
        return Err(format!(
            "answered {:?}",
            head.lines().next().unwrap_or_default()
        ));
    }
    if head.to_ascii_lowercase().contains("transfer-encoding:") {
        return Err("a transfer-coded key response is not read".to_owned());
    }
    Ok(response[head_end + 4..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::egress::GrantSigner;

    fn verifier(seed: u8) -> GrantVerifier {
        GrantSigner::from_field_key(&[seed; 32]).unwrap().verifier()
    }

    #[test]
    fn keys_parse_from_text_or_raw_bytes() {
        let v = verifier(1);
        let text = format!("  {}\n", v.public_key_text());
        assert_eq!(parse_key(text.as_bytes()), Ok(v.clone()));
        assert_eq!(parse_key(&v.public_key_bytes()), Ok(v));
        assert!(parse_key(b"not a key").is_err());
        assert!(parse_key(&[0u8; 32]).is_err());
    }

    /// Serves the current text of `key` to every GET, as the API's key endpoint would.
    async fn key_endpoint(key: std::sync::Arc<std::sync::Mutex<String>>) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request).await;
                let body = key.lock().unwrap().clone();
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn egr_07_the_key_is_read_from_the_api_and_refetched_after_a_bad_signature() {
        let key = std::sync::Arc::new(std::sync::Mutex::new(verifier(1).public_key_text()));
        let addr = key_endpoint(std::sync::Arc::clone(&key)).await;
        let url = KeyUrl::parse(&format!("http://{addr}/api/egress/verifying-key")).unwrap();
        let store = KeyStore::new(KeySource::Url {
            url,
            refresh: Duration::from_secs(3600),
        });
        let first = store.current().await.unwrap();
        assert_eq!(first, verifier(1));
        *key.lock().unwrap() = verifier(2).public_key_text();
        // Within the refresh interval the old key stays; a failed signature fetches again
        // (at most once a second).
        assert_eq!(store.current().await, Ok(verifier(1)));
        tokio::time::sleep(KEY_FORCED_REFRESH_MIN).await;
        assert_eq!(
            store.refreshed_after_bad_signature(&first).await,
            Some(verifier(2))
        );
        assert_eq!(store.current().await, Ok(verifier(2)));
        assert_eq!(
            store.refreshed_after_bad_signature(&verifier(2)).await,
            None
        );
    }

    #[tokio::test]
    async fn egr_09_a_rewritten_key_file_applies_at_the_next_verification() {
        let dir = std::env::temp_dir().join(format!("corral-key-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        let store = KeyStore::new(KeySource::File(path.clone()));
        assert!(store.current().await.is_err());
        std::fs::write(&path, verifier(1).public_key_text()).unwrap();
        assert_eq!(store.current().await, Ok(verifier(1)));
        // Replace atomically, as an operator or the API would.
        let tmp = dir.join("key.tmp");
        std::fs::write(&tmp, verifier(2).public_key_text()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert_eq!(store.current().await, Ok(verifier(2)));
        std::fs::write(&path, "garbage").unwrap();
        assert!(store.current().await.is_err());
        std::fs::remove_file(&path).unwrap();
        assert!(store.current().await.is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
