//! The result of one run: the contract's reply ([`ExecuteReply`], what `corral jail run` prints
//! and the control API returns), and the workspace packed beside it, which the control API
//! encodes into the reply and `corral jail run` never asks for.

pub use corral_contract::messages::{ExecuteReply, note};

use crate::archive::ArchiveError;

/// One run's result.
#[derive(Debug, Default)]
pub struct RunResult {
    /// The reply.
    pub reply: ExecuteReply,
    /// The workspace packed after the run, when the request asked for it.
    pub workspace_archive: Option<Result<Vec<u8>, ArchiveError>>,
}
