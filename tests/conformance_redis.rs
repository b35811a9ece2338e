//! The conformance suite on `RedisStore` against Redis 7.0 (`finish` and `renew` as scripts),
//! each check against a redis-server of its own.

use idempotask_test_support as support;

use support::RedisServer;

idempotask_conformance::conformance_tests!({
    let server = RedisServer::start();
    let store = server.store().await;
    assert!(
        !store.native_compare_and_set(),
        "Redis 7.0 has no SET … IFEQ; the store must use the finish script"
    );
    (server, store)
});

mod in_doubt {
    use super::*;

    idempotask_conformance::doubt_conformance_tests!({
        let server = RedisServer::start();
        let store = server.store().await;
        (server, store)
    });
}

/// Steps: the journal beside the unit's key, in its hash slot.
mod steps {
    use super::*;

    idempotask_conformance::step_conformance_tests!({
        let server = RedisServer::start();
        let store = server.store().await;
        (server, store)
    });
}

/// The suite through `BatchingStore`, whose batches `RedisStore` sends as one pipeline.
mod batching {
    use super::*;

    use idempotask::store::BatchingStore;

    idempotask_conformance::conformance_tests!({
        let server = RedisServer::start();
        let store = BatchingStore::new(server.store().await);
        (server, store)
    });

    idempotask_conformance::doubt_conformance_tests!({
        let server = RedisServer::start();
        let store = BatchingStore::new(server.store().await);
        (server, store)
    });
}
