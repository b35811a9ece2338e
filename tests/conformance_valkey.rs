//! The conformance suite on `RedisStore` against Valkey 8.1, where `finish` and `renew` are the
//! native `SET … IFEQ` instead of scripts; each check against a valkey-server of its own.

use idempotask_test_support as support;

use support::RedisServer;

idempotask_conformance::conformance_tests!({
    let server = RedisServer::start_valkey();
    let store = server.store().await;
    assert!(
        store.native_compare_and_set(),
        "Valkey 8.1 has SET … IFEQ; the store did not find it"
    );
    (server, store)
});

mod in_doubt {
    use super::*;

    idempotask_conformance::doubt_conformance_tests!({
        let server = RedisServer::start_valkey();
        let store = server.store().await;
        (server, store)
    });
}

/// Steps: the journal beside the unit's key, in its hash slot.
mod steps {
    use super::*;

    idempotask_conformance::step_conformance_tests!({
        let server = RedisServer::start_valkey();
        let store = server.store().await;
        (server, store)
    });
}
