//! The conformance suite on `RedisStore` against Redis 8.2, what new Redis deployments run: it
//! has no `SET … IFEQ` yet (Redis 8.4 added it), so `finish` and `renew` are the scripts, as on
//! Redis 7. Each check against a redis8-server of its own.

use idempotask_test_support as support;

use support::{Flavor, RedisServer};

idempotask_conformance::conformance_tests!({
    let server = RedisServer::start_flavor(Flavor::Redis8, &[]);
    let store = server.store().await;
    assert!(
        !store.native_compare_and_set(),
        "Redis 8.2 has no SET … IFEQ; the store must use the finish script"
    );
    (server, store)
});

mod in_doubt {
    use super::*;

    idempotask_conformance::doubt_conformance_tests!({
        let server = RedisServer::start_flavor(Flavor::Redis8, &[]);
        let store = server.store().await;
        (server, store)
    });
}

/// Steps: the journal beside the unit's key, in its hash slot.
mod steps {
    use super::*;

    idempotask_conformance::step_conformance_tests!({
        let server = RedisServer::start_flavor(Flavor::Redis8, &[]);
        let store = server.store().await;
        (server, store)
    });
}

/// The same checks on a connection that speaks RESP3 (`?protocol=resp3`): commands' replies
/// arrive as RESP3 types, and scripts' `nil`s as RESP3 nulls, which the store reads as it reads
/// RESP2's.
mod resp3 {
    use super::*;

    /// A store on `server` whose connection speaks RESP3: the server must list it so, or the
    /// checks would run on RESP2 without saying.
    async fn resp3_store(server: &RedisServer) -> idempotask_redis::RedisStore {
        let url = format!("{}/?protocol=resp3", server.url());
        let store = idempotask_redis::RedisStore::connect(&url).await.unwrap();
        assert!(
            support::has_resp3_client(&server.url()).await,
            "the store's connection is not RESP3"
        );
        store
    }

    idempotask_conformance::conformance_tests!({
        let server = RedisServer::start_flavor(Flavor::Redis8, &[]);
        let store = resp3_store(&server).await;
        (server, store)
    });

    mod steps {
        use super::*;

        idempotask_conformance::step_conformance_tests!({
            let server = RedisServer::start_flavor(Flavor::Redis8, &[]);
            let store = resp3_store(&server).await;
            (server, store)
        });
    }
}
