//! Packages (PKG-1 to PKG-7): what a run may ask to install, the baked stack, which imports name
//! which distributions, the one decision of what a run needs, and the registries the broker
//! fronts.
//!
//! - [`requirement`]: a requested package, parsed strictly (PKG-4).
//! - [`stack`]: the baked Python stack's table (PKG-1).
//! - [`imports`]: import names to distributions (PKG-4).
//! - [`resolve`]: what is satisfied locally, what comes through the broker, what refuses the run.
//! - [`registries`]: `SANDBOX_PACKAGE_REGISTRIES` and the broker's rules (PKG-3, PKG-5).

pub mod imports;
pub mod registries;
pub mod requirement;
pub mod resolve;
pub mod stack;
