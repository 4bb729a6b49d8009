//! What the binary's service tests share: whether they can run here. They skip only through
//! `corral_testkit::skip`, which fails them under CI's `CORRAL_REQUIRE_*`.
#![allow(dead_code)]

use corral_store::valkey_server::ValkeyServer;

pub mod stack;
pub mod turn_client;
pub mod viewer;

/// Root (the worker's jail needs it) and a started Valkey server, or `None` after skipping the
/// test `test`.
pub fn root_and_valkey_or_skip(test: &str) -> Option<ValkeyServer> {
    if !corral_testkit::is_root() {
        corral_testkit::skip(
            test,
            corral_testkit::Need::Root,
            "the worker's jail needs root",
        );
        return None;
    }
    ValkeyServer::start_or_skip(test)
}
