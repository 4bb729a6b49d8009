//! Persistent kernels (KER-1 to KER-5): what a checkpoint is, where it lives, and how the worker
//! knows that the one it is about to restore was written by a persistent cell of the same actor
//! and conversation.
//!
//! A persistent cell runs in a fresh interpreter on whichever clean worker the pool gives: a
//! driver restores the previous cell's variables, runs the cell, and checkpoints them into
//! [`CHECKPOINT_DIR`] inside the workspace, which the ordinary workspace snapshot carries to the
//! next cell (decision 0016). A checkpoint file is one header line and a payload:
//!
//! ```text
//! CORRAL-KERNEL 1\n
//! {"language":"python","runtime":"…","nonce":"…","payload_bytes":N,"payload_sha256":"…",
//!  "kept":[…],"not_kept":[{"name":"…","reason":"…"}]}\n
//! <N bytes of payload: one pickle (Python) or one v8 serialization (Node)>
//! ```
//!
//! The workspace is the code's to write, so a checkpoint is restored only under a seal beside it
//! that the worker's supervisor wrote after a persistent cell: an HMAC over the file under a key
//! derived from the deployment's field key and the workspace's identity, which the code never
//! holds. A file written by an ephemeral run, carried in an uploaded workspace, or copied from
//! another actor's workspace does not verify, and is refused before anything of it is read
//! ([`Refusal::Untrusted`]). What a persistent cell itself writes is that tenant's own state: the
//! seal proves where a checkpoint came from, not what a tenant's code did in its own cell.
//!
//! Pure: the worker reads and writes the files; this module judges bytes.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::ids::{hex, hmac_sha256};
use crate::jail::Language;

/// Where a kernel's files live, relative to the workspace root: hidden, and carried by the
/// workspace snapshot like any file.
pub const CHECKPOINT_DIR: &str = ".corral/kernel";
/// The first line of every checkpoint.
pub const MAGIC: &str = "CORRAL-KERNEL 1";
/// The longest header line a checkpoint may have: names and reasons are bounded by the driver.
pub const HEADER_MAX_BYTES: usize = 1 << 20;
/// The longest reason a not-kept entry carries.
pub const REASON_MAX_CHARS: usize = 200;

/// The kernel a run asked for (KER-1): ephemeral unless the model selects a persistent one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// A fresh interpreter whose variables end with the run.
    #[default]
    Ephemeral,
    /// Variables carried from cell to cell through checkpoints in the workspace.
    Persistent,
}

impl Kernel {
    /// The request's spelling: `ephemeral` or `persistent`.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "ephemeral" => Some(Self::Ephemeral),
            "persistent" => Some(Self::Persistent),
            _ => None,
        }
    }

    /// The stable name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ephemeral => "ephemeral",
            Self::Persistent => "persistent",
        }
    }
}

/// The checkpoint's path, relative to the workspace root.
#[must_use]
pub fn checkpoint_path(language: Language) -> String {
    format!("{CHECKPOINT_DIR}/{}.ckpt", language.as_str())
}

/// Whether `path` (relative, normalized) is one of a kernel's own files: never an output.
#[must_use]
pub fn is_kernel_path(path: &str) -> bool {
    path.strip_prefix(CHECKPOINT_DIR)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The seal's path, relative to the workspace root.
#[must_use]
pub fn seal_path(language: Language) -> String {
    format!("{CHECKPOINT_DIR}/{}.seal", language.as_str())
}

/// How long an affinity-mode kernel's lease is held without a cell (KER-4, decision 0016): the
/// idle reap a browser session has, after which the lease is released and the state with it.
pub const AFFINITY_IDLE_SECONDS: u64 = 15 * 60;

/// The note a persistent cell's egress report carries: it has no egress, whatever the policy
/// (KER-5).
pub const EGRESS_NOTE: &str = "persistent_kernel";

/// The environment names through which code asks for the turn's shared resources (the
/// shared-resource contract, PROJ-1): a run "asks for files" by naming one.
pub const RESOURCE_CONTRACT: [&str; 2] =
    [crate::projection::ENV_MANIFEST, crate::projection::ENV_DIR];

/// Whether `code` names the shared-resource contract. A persistent kernel mounts no resources,
/// so such a cell is told `resource_persistent_kernel` rather than that no file is attached
/// (KER-5).
#[must_use]
pub fn names_resource_contract(code: &str) -> bool {
    RESOURCE_CONTRACT.iter().any(|name| code.contains(name))
}

/// One variable a cell had that its checkpoint does not carry, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotKept {
    /// The variable's name.
    pub name: String,
    /// Why: `an open file`, `a socket`, `a thread`, `holds a socket`, `unpicklable: …`.
    pub reason: String,
}

/// A checkpoint's header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// `python` or `node`.
    pub language: String,
    /// The interpreter and stack that wrote it ([`runtime_tag`]); another one's is refused.
    pub runtime: String,
    /// The nonce of the cell that wrote it: a checkpoint with another cell's nonce after a run
    /// was not written by that run (it was killed or ended before its checkpoint).
    pub nonce: String,
    /// The payload's length.
    pub payload_bytes: u64,
    /// The payload's SHA-256, hex.
    pub payload_sha256: String,
    /// The names it carries, in order.
    pub kept: Vec<String>,
    /// The names the cell had and it does not carry.
    pub not_kept: Vec<NotKept>,
    /// The top-level modules restoring it imports (Python: `pandas` for a DataFrame), so that
    /// the next cell's worker can have them imported before it (a hint, never trusted for more).
    #[serde(default)]
    pub imports: Vec<String>,
}

/// Why a checkpoint was not restored. Every code is a `not_run` reason: the cell did not run,
/// nothing was restored, and the workspace stays as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The file is not a checkpoint, or is truncated, or its payload does not match its header.
    Corrupt,
    /// No valid seal: not written by a persistent cell of this actor and conversation.
    Untrusted,
    /// Written by another interpreter or stack than this worker's.
    Incompatible,
}

impl Refusal {
    /// The `not_run` reason it is recorded as.
    #[must_use]
    pub fn not_run(self) -> crate::jail::NotRun {
        use crate::jail::NotRun;
        match self {
            Self::Corrupt => NotRun::KernelCheckpointCorrupt,
            Self::Untrusted => NotRun::KernelCheckpointUntrusted,
            Self::Incompatible => NotRun::KernelCheckpointIncompatible,
        }
    }

    /// The stable code: its `not_run` reason's.
    #[must_use]
    pub fn code(self) -> &'static str {
        self.not_run().code()
    }
}

/// Parses a checkpoint: the magic line, a header within [`HEADER_MAX_BYTES`], a payload of
/// exactly the header's length and digest.
///
/// # Errors
/// [`Refusal::Corrupt`], with what is wrong.
pub fn parse(bytes: &[u8]) -> Result<Header, (Refusal, String)> {
    let corrupt = |why: String| (Refusal::Corrupt, why);
    let magic = format!("{MAGIC}\n");
    let Some(rest) = bytes.strip_prefix(magic.as_bytes()) else {
        return Err(corrupt(
            "it does not start with the kernel's magic line".into(),
        ));
    };
    let window = &rest[..rest.len().min(HEADER_MAX_BYTES)];
    let Some(end) = window.iter().position(|b| *b == b'\n') else {
        return Err(corrupt(
            "its header line is missing, truncated or too long".into(),
        ));
    };
    let header: Header = serde_json::from_slice(&rest[..end])
        .map_err(|e| corrupt(format!("its header is not valid: {e}")))?;
    let payload = &rest[end + 1..];
    if u64::try_from(payload.len()).ok() != Some(header.payload_bytes) {
        return Err(corrupt(format!(
            "its payload is {} bytes where the header says {} (truncated or extended)",
            payload.len(),
            header.payload_bytes
        )));
    }
    if hex(&Sha256::digest(payload)) != header.payload_sha256 {
        return Err(corrupt(
            "its payload does not match the digest in its header".into(),
        ));
    }
    Ok(header)
}

const SEAL_ROOT_SALT: &[u8] = b"corral kernel seal root v1";
const SEAL_CONTEXT: &[u8] = b"corral kernel seal v1\0";

/// The deployment's root for kernel seals, derived from its field key (the key every replica
/// shares; egress grants derive from it too, under another label). `None` for a key shorter than
/// a grant's signing key accepts.
#[must_use]
pub fn seal_root(field_key: &[u8]) -> Option<[u8; 32]> {
    if field_key.len() < crate::egress::grant::FIELD_KEY_MIN_BYTES {
        return None;
    }
    let mut root = [0u8; 32];
    hkdf::Hkdf::<Sha256>::new(Some(SEAL_ROOT_SALT), field_key)
        .expand(b"seal", &mut root)
        .ok()?;
    Some(root)
}

/// The key that seals the checkpoints of one workspace (`storage_key`, from
/// [`crate::workspace::storage_key`]): a checkpoint sealed for one actor and conversation does
/// not verify in another's workspace.
#[must_use]
pub fn seal_key(root: &[u8; 32], storage_key: &str) -> [u8; 32] {
    hmac_sha256(root, &[SEAL_CONTEXT, storage_key.as_bytes()])
}

/// The seal of `checkpoint` (the whole file) for `language` under `key`: 64 hex digits.
#[must_use]
pub fn seal(key: &[u8], language: Language, checkpoint: &[u8]) -> String {
    let digest = Sha256::digest(checkpoint);
    hex(&hmac_sha256(
        key,
        &[SEAL_CONTEXT, language.as_str().as_bytes(), b"\0", &digest],
    ))
}

/// The modules a checkpoint says its restore imports, read from its header alone (a hint for
/// preparing the next interpreter: nothing is verified, nothing is trusted beyond that).
#[must_use]
pub fn import_hint(checkpoint_head: &[u8]) -> Vec<String> {
    let magic = format!("{MAGIC}\n");
    let Some(rest) = checkpoint_head.strip_prefix(magic.as_bytes()) else {
        return Vec::new();
    };
    let Some(end) = rest.iter().position(|b| *b == b'\n') else {
        return Vec::new();
    };
    serde_json::from_slice::<Header>(&rest[..end])
        .map(|h| h.imports)
        .unwrap_or_default()
}

/// Judges the checkpoint a persistent cell is about to restore: its structure, then its seal,
/// then its runtime. `None` when there is nothing to restore.
///
/// # Errors
/// Why it must not be restored, and a sentence saying so.
pub fn judge(
    language: Language,
    checkpoint: Option<&[u8]>,
    seal_text: Option<&[u8]>,
    key: &[u8],
    runtime: &str,
) -> Result<Option<Header>, (Refusal, String)> {
    let Some(checkpoint) = checkpoint else {
        return Ok(None);
    };
    let header = parse(checkpoint)?;
    let expected = seal(key, language, checkpoint);
    let sealed =
        seal_text.is_some_and(|text| constant_time_eq(text.trim_ascii(), expected.as_bytes()));
    if !sealed {
        return Err((
            Refusal::Untrusted,
            format!(
                "{} was not written by a persistent cell of this workspace (it was changed or \
                 added outside the kernel); nothing was restored. Remove {CHECKPOINT_DIR} to start \
                 a fresh kernel",
                checkpoint_path(language)
            ),
        ));
    }
    if header.language != language.as_str() || header.runtime != runtime {
        return Err((
            Refusal::Incompatible,
            format!(
                "the checkpoint was written by {:?} ({}), and this worker runs {runtime:?}; \
                 nothing was restored. Remove {CHECKPOINT_DIR} to start a fresh kernel",
                header.runtime, header.language
            ),
        ));
    }
    Ok(Some(header))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The runtime tag a checkpoint is written under: the interpreter's own tag (`interpreter`:
/// Python's `sys.implementation.cache_tag`, Node's major version) and, for Python, the stack
/// whose classes the pickles name: the baked stack's table, or the system's site-packages.
#[must_use]
pub fn runtime_tag(language: Language, interpreter: &str, baked_stack: bool) -> String {
    match language {
        Language::Python if baked_stack => format!(
            "{interpreter}+stack-{}",
            &hex(&Sha256::digest(crate::packages::stack::TABLE.as_bytes()))[..16]
        ),
        Language::Python => format!("{interpreter}+system"),
        Language::Node => String::from(interpreter),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(payload: &[u8], runtime: &str) -> Vec<u8> {
        let header = Header {
            language: "python".into(),
            runtime: runtime.into(),
            nonce: "n".into(),
            payload_bytes: payload.len() as u64,
            payload_sha256: hex(&Sha256::digest(payload)),
            kept: vec!["a".into()],
            not_kept: vec![NotKept {
                name: "f".into(),
                reason: "an open file".into(),
            }],
            imports: vec!["pandas".into()],
        };
        let mut bytes = format!("{MAGIC}\n").into_bytes();
        bytes.extend(serde_json::to_vec(&header).unwrap());
        bytes.push(b'\n');
        bytes.extend(payload);
        bytes
    }

    #[test]
    fn ker_02_a_sealed_checkpoint_of_this_runtime_is_restored() {
        let key = seal_key(
            &seal_root(b"0123456789abcdef0123456789abcdef").unwrap(),
            "ws",
        );
        let file = checkpoint(b"\x80\x04payload", "cpython-311");
        let sealed = seal(&key, Language::Python, &file);
        let header = judge(
            Language::Python,
            Some(&file),
            Some(sealed.as_bytes()),
            &key,
            "cpython-311",
        )
        .unwrap()
        .unwrap();
        assert_eq!(header.kept, ["a"]);
        assert_eq!(import_hint(&file), ["pandas"]);
        assert!(import_hint(b"not a checkpoint").is_empty());
        assert_eq!(
            judge(Language::Python, None, None, &key, "x").unwrap(),
            None
        );
    }

    #[test]
    fn ker_02_truncated_extended_or_foreign_checkpoints_are_refused_by_code() {
        let root = seal_root(b"0123456789abcdef0123456789abcdef").unwrap();
        let key = seal_key(&root, "ws");
        let file = checkpoint(b"\x80\x04payload", "cpython-311");
        let sealed = seal(&key, Language::Python, &file);
        let refused = |bytes: &[u8], seal_text: Option<&[u8]>, key: &[u8], runtime: &str| {
            judge(Language::Python, Some(bytes), seal_text, key, runtime)
                .unwrap_err()
                .0
        };
        let s = Some(sealed.as_bytes());
        assert_eq!(
            refused(&file[..file.len() - 1], s, &key, "cpython-311"),
            Refusal::Corrupt
        );
        assert_eq!(
            refused(&[&file[..], b"x"].concat(), s, &key, "cpython-311"),
            Refusal::Corrupt
        );
        assert_eq!(
            refused(&file[4..], s, &key, "cpython-311"),
            Refusal::Corrupt
        );
        assert_eq!(refused(b"", s, &key, "cpython-311"), Refusal::Corrupt);
        let mut flipped = file.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(refused(&flipped, s, &key, "cpython-311"), Refusal::Corrupt);
        // Well formed, but unsealed, or sealed for another workspace, or for another language.
        assert_eq!(
            refused(&file, None, &key, "cpython-311"),
            Refusal::Untrusted
        );
        let other = seal_key(&root, "another workspace");
        assert_eq!(refused(&file, s, &other, "cpython-311"), Refusal::Untrusted);
        let node = seal(&key, Language::Node, &file);
        assert_eq!(
            refused(&file, Some(node.as_bytes()), &key, "cpython-311"),
            Refusal::Untrusted
        );
        // Sealed, but another runtime's.
        assert_eq!(
            refused(&file, s, &key, "cpython-312"),
            Refusal::Incompatible
        );
        // Another deployment's field key seals differently.
        assert_eq!(seal_root(b"short"), None);
        let foreign = seal_key(
            &seal_root(b"another deployment's field key!!").unwrap(),
            "ws",
        );
        assert_ne!(foreign, key);
    }

    #[test]
    fn kernel_names_parse_and_the_resource_contract_is_recognised() {
        assert_eq!(Kernel::parse("persistent"), Some(Kernel::Persistent));
        assert_eq!(Kernel::parse("ephemeral"), Some(Kernel::Ephemeral));
        assert_eq!(Kernel::parse("Persistent"), None);
        assert!(names_resource_contract(
            "import os\nos.environ['KAIZEN_SHARED_RESOURCES_DIR']"
        ));
        assert!(names_resource_contract(
            "process.env.KAIZEN_SHARED_RESOURCES_MANIFEST"
        ));
        assert!(!names_resource_contract("print('shared resources')"));
        assert_eq!(checkpoint_path(Language::Node), ".corral/kernel/node.ckpt");
        assert_eq!(seal_path(Language::Python), ".corral/kernel/python.seal");
    }
}
