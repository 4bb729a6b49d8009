//! The limits of the worker contract. Each is derived from corral-core's definition of what it
//! bounds, so that a message the API builds from an admitted request always fits what the worker
//! accepts.

use corral_core::bounds::ExecutionBounds;
use corral_core::downloads::RELATIVE_PATH_MAX_BYTES;
pub use corral_core::egress::grant::GRANT_TOKEN_MAX_BYTES as GRANT_MAX_BYTES;
pub use corral_core::run::admission::DECLARED_MAX;

/// Shortest credential accepted: shorter ones are guessable.
pub const CREDENTIAL_MIN_BYTES: usize = 16;
/// Longest credential (and credential file) read.
pub const CREDENTIAL_MAX_BYTES: usize = 4_096;

/// The worst JSON expansion of a string: a control byte becomes `\u00XX`.
const JSON_ESCAPE_FACTOR: u64 = 6;
/// Room for the JSON around the fields that are bounded one by one.
const ENVELOPE_BYTES: u64 = 64 * 1024;
/// The most diagnostics a reply carries, and the longest one, in characters.
pub const DIAGNOSTICS_MAX: usize = 32;
/// See [`DIAGNOSTICS_MAX`].
pub const DIAGNOSTIC_MAX_CHARS: usize = 512;
/// The largest reset or health reply read.
pub const SMALL_REPLY_MAX_BYTES: u64 = 64 * 1024;

fn base64_len(bytes: u64) -> u64 {
    bytes.div_ceil(3).saturating_mul(4)
}

/// The largest execute request body for a workspace bound of `workspace_max_bytes`: the archive
/// in base64, the code (no larger than a workspace, `corral_core::bounds::code_fits`) escaped at
/// worst, the grant, the declared names escaped at worst, the projection, and the envelope.
#[must_use]
pub fn execute_body_max_bytes(workspace_max_bytes: u64) -> u64 {
    let declared = (DECLARED_MAX as u64)
        .saturating_mul(RELATIVE_PATH_MAX_BYTES as u64)
        .saturating_mul(JSON_ESCAPE_FACTOR);
    // The projection: its bytes in base64, and its manifest (names and media types escaped at
    // worst), PROJ-1.
    let projection = base64_len(corral_core::projection::BYTES_MAX).saturating_add(
        (corral_core::projection::FILES_MAX as u64).saturating_mul(1024 * JSON_ESCAPE_FACTOR),
    );
    base64_len(workspace_max_bytes)
        .saturating_add(projection)
        .saturating_add(workspace_max_bytes.saturating_mul(JSON_ESCAPE_FACTOR))
        .saturating_add(GRANT_MAX_BYTES as u64)
        .saturating_add(declared)
        .saturating_add(ENVELOPE_BYTES)
}

/// The largest execute reply for a run under `bounds`: two output streams escaped at worst, the
/// workspace archive in base64, the download list and the diagnostics, and the envelope.
#[must_use]
pub fn execute_reply_max_bytes(bounds: &ExecutionBounds) -> u64 {
    let streams = bounds
        .max_output_bytes
        .saturating_mul(2)
        .saturating_mul(JSON_ESCAPE_FACTOR);
    let diagnostics = (DIAGNOSTICS_MAX as u64)
        .saturating_mul(DIAGNOSTIC_MAX_CHARS as u64)
        .saturating_mul(4 * JSON_ESCAPE_FACTOR);
    // A download names a path: at most one per 512 bytes of workspace is a generous ceiling.
    let listings = bounds
        .workspace_max_bytes
        .saturating_mul(JSON_ESCAPE_FACTOR);
    streams
        .saturating_add(base64_len(bounds.workspace_max_bytes))
        .saturating_add(listings)
        .saturating_add(diagnostics)
        .saturating_add(ENVELOPE_BYTES)
}

/// The most bytes the worker reads from a run's stream at once: one streamed output chunk.
pub const OUTPUT_READ_BYTES: usize = 64 * 1024;

/// The longest line of a streamed execute answer but its last: one chunk of [`OUTPUT_READ_BYTES`]
/// (and an incomplete character held back), every byte replaced at worst (3 bytes of U+FFFD) and
/// escaped, in its envelope.
#[must_use]
pub fn output_frame_max_bytes() -> u64 {
    ((OUTPUT_READ_BYTES as u64) + 4)
        .saturating_mul(3 * JSON_ESCAPE_FACTOR)
        .saturating_add(1024)
}

/// The most text the output chunks of one streamed run may carry: both streams' kept bytes, every
/// byte replaced at worst.
#[must_use]
pub fn streamed_output_max_bytes(bounds: &ExecutionBounds) -> u64 {
    bounds.max_output_bytes.saturating_mul(2 * 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_bound_covers_a_full_workspace_in_base64_the_code_and_the_grant() {
        let eight_mib: u64 = 8 * 1024 * 1024;
        let bound = execute_body_max_bytes(eight_mib);
        assert!(bound >= eight_mib / 3 * 4 + eight_mib * 6 + GRANT_MAX_BYTES as u64);
        assert!(bound < 16 * eight_mib);
    }
}
