//! The conformance suite on `RedisStore`, each check against a redis-server of its own.

mod support;

use std::sync::Arc;

use support::RedisServer;

crate::conformance_tests!({
    let server = RedisServer::start();
    let store: Arc<dyn idempotask::Store> = Arc::new(server.store().await);
    (server, store)
});
