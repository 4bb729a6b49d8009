//! The stage build's identity (decision 0057): a digest of everything the jail's stages are built
//! from, so that the supervisor uses a `corral-stage` beside its binary only when that file was
//! built from the same sources as itself, and never a stale one left by an earlier install.

use std::path::{Path, PathBuf};

/// The sources whose change changes the identity, relative to this package.
const INPUTS: &[&str] = &["src", "Cargo.toml", "../../core/src", "../../Cargo.lock"];

fn files(path: &Path, found: &mut Vec<PathBuf>) {
    match std::fs::read_dir(path) {
        Ok(entries) => {
            for entry in entries.flatten() {
                files(&entry.path(), found);
            }
        }
        Err(_) => found.push(path.to_owned()),
    }
}

fn main() {
    let mut found = Vec::new();
    for input in INPUTS {
        println!("cargo:rerun-if-changed={input}");
        files(Path::new(input), &mut found);
    }
    found.sort();
    // FNV-1a over each file's path and bytes: the same sources give the same identity on any
    // machine (a reproducible build stays reproducible).
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    for path in &found {
        let bytes = std::fs::read(path).unwrap_or_default();
        for byte in path.to_string_lossy().bytes().chain([0]).chain(bytes) {
            digest ^= u64::from(byte);
            digest = digest.wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!(
        "cargo:rustc-env=CORRAL_STAGE_BUILD={}-{digest:016x}",
        env!("CARGO_PKG_VERSION")
    );
}
