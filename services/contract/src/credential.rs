//! Credentials: how one is read from the environment, made, and compared. One rule for every
//! credential Corral holds (the workers' control credential, the caller and admin credentials).

use std::io::Read as _;

use subtle::ConstantTimeEq as _;

use crate::limits::{CREDENTIAL_MAX_BYTES, CREDENTIAL_MIN_BYTES};

/// Reads the credential named `name`: the file named by `<name>_FILE`, else the value of `name`;
/// `None` when neither is set. Surrounding whitespace (a file's final newline) is not part of it.
///
/// # Errors
/// An unreadable file, or a credential outside [`CREDENTIAL_MIN_BYTES`] to
/// [`CREDENTIAL_MAX_BYTES`] or with a byte that is not visible ASCII.
pub fn from_env(
    lookup: impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<String>, String> {
    let raw = match lookup(&format!("{name}_FILE")).filter(|p| !p.is_empty()) {
        Some(path) => {
            let shown = |e: std::io::Error| format!("{name}_FILE {path}: {e}");
            let file = std::fs::File::open(&path).map_err(shown)?;
            // One byte past the bound, so that an oversized file is seen as such unread.
            let mut raw = Vec::new();
            file.take(CREDENTIAL_MAX_BYTES as u64 + 1)
                .read_to_end(&mut raw)
                .map_err(shown)?;
            raw
        }
        None => match lookup(name).filter(|v| !v.is_empty()) {
            Some(value) => value.into_bytes(),
            None => return Ok(None),
        },
    };
    let credential = raw.trim_ascii();
    if !(CREDENTIAL_MIN_BYTES..=CREDENTIAL_MAX_BYTES).contains(&credential.len()) {
        return Err(format!(
            "{name}: a credential is {CREDENTIAL_MIN_BYTES} to {CREDENTIAL_MAX_BYTES} bytes"
        ));
    }
    if !credential.iter().all(u8::is_ascii_graphic) {
        return Err(format!(
            "{name}: a credential is printable ASCII without spaces"
        ));
    }
    Ok(Some(String::from_utf8_lossy(credential).into_owned()))
}

/// 16 bytes from the system's randomness.
///
/// # Panics
/// When the system has no randomness: without it no id is unique and no credential secret, and
/// nothing falls back to something guessable.
#[must_use]
pub fn random_bytes() -> [u8; 16] {
    #[cfg(feature = "sim-mutations")]
    if let Some(bytes) = simulated::draw() {
        return bytes;
    }
    let mut bytes = [0u8; 16];
    if let Err(e) = getrandom::fill(&mut bytes) {
        panic!("the system has no randomness: {e}");
    }
    bytes
}

/// A fresh credential: 32 random bytes in hex.
#[must_use]
pub fn fresh() -> String {
    let mut bytes = random_bytes().to_vec();
    bytes.extend(random_bytes());
    corral_core::ids::hex(&bytes)
}

/// Whether `presented` is `expected`, compared in constant time (the length is not the secret).
#[must_use]
pub fn matches(presented: &[u8], expected: &[u8]) -> bool {
    bool::from(presented.ct_eq(expected))
}

/// The credential in an `Authorization: Bearer <credential>` value.
#[must_use]
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    value.strip_prefix(b"Bearer ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_read_from_its_file_first_and_checked() {
        let dir = std::env::temp_dir().join(format!("corral-credential-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-the-file-0123456789\n").unwrap();
        let path = file.display().to_string();
        let env = |name: &str| match name {
            "X_FILE" => Some(path.clone()),
            "X" => Some("from-the-value-0123456789".to_owned()),
            _ => None,
        };
        assert_eq!(
            from_env(env, "X").unwrap().as_deref(),
            Some("from-the-file-0123456789")
        );
        let value_only = |name: &str| (name == "X").then(|| "from-the-value-0123456789".to_owned());
        assert_eq!(
            from_env(value_only, "X").unwrap().as_deref(),
            Some("from-the-value-0123456789")
        );
        assert_eq!(from_env(|_| None, "X").unwrap(), None);
        for bad in [
            "short",
            "has a space in it 0123",
            &"x".repeat(CREDENTIAL_MAX_BYTES + 1),
        ] {
            let bad = bad.to_owned();
            assert!(from_env(|n| (n == "X").then(|| bad.clone()), "X").is_err());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fresh_credentials_differ_and_are_accepted() {
        let (a, b) = (fresh(), fresh());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        let a2 = a.clone();
        assert_eq!(
            from_env(|n| (n == "X").then(|| a2.clone()), "X").unwrap(),
            Some(a.clone())
        );
        assert!(matches(a.as_bytes(), a.as_bytes()));
        assert!(!matches(a.as_bytes(), b.as_bytes()));
        assert!(!matches(b"", a.as_bytes()));
    }
}

/// The shell simulation's randomness (issue 28): a world that seeds it on its thread draws every
/// id and secret from its seed, so that one seed replays exactly. Compiled only with the
/// `sim-mutations` feature, which no shipped build enables.
#[cfg(feature = "sim-mutations")]
pub mod simulated {
    use std::cell::Cell;

    thread_local! {
        static STATE: Cell<Option<u64>> = const { Cell::new(None) };
    }

    /// Draws this thread's randomness from `seed` from now on (`None`: the system's again).
    pub fn seed(seed: Option<u64>) {
        STATE.with(|state| state.set(seed.map(|s| s | 1)));
    }

    /// 16 bytes from this thread's seeded generator (xorshift64*), if it is seeded.
    pub(crate) fn draw() -> Option<[u8; 16]> {
        STATE.with(|state| {
            let mut x = state.get()?;
            let mut bytes = [0u8; 16];
            for half in bytes.chunks_mut(8) {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                half.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
            }
            state.set(Some(x));
            Some(bytes)
        })
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn a_seeded_thread_draws_the_same_bytes_again_and_the_system_after() {
            super::seed(Some(7));
            let first = [
                crate::credential::random_bytes(),
                crate::credential::random_bytes(),
            ];
            super::seed(Some(7));
            let again = [
                crate::credential::random_bytes(),
                crate::credential::random_bytes(),
            ];
            assert_eq!(first, again);
            assert_ne!(first[0], first[1]);
            super::seed(None);
            assert_ne!(crate::credential::random_bytes(), first[0]);
            assert!(super::draw().is_none());
        }
    }
}
