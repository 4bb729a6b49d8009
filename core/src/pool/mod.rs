//! The allocation rules. (Being written.)
mod config;
pub use config::*;
