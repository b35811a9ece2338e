//! The conformance suite on `RedlockStore` over five independent servers, three Redis 7.0
//! (`finish` and `renew` as scripts) and two Valkey 8.1 (`SET … IFEQ`), each check with servers
//! of its own; steps too (each record confirmed by a majority).

use idempotask_test_support as support;

use support::Flavor;
use support::quorum::Quorum;

/// Five servers of their own, mixed.
async fn five_servers() -> (Quorum, idempotask_redis::RedlockStore) {
    five_servers_with("").await
}

/// Five servers of their own, mixed, each URL ending with `query` (`/?protocol=resp3`).
async fn five_servers_with(query: &str) -> (Quorum, idempotask_redis::RedlockStore) {
    let quorum = Quorum::start_mixed(&[
        Flavor::Redis,
        Flavor::Valkey,
        Flavor::Redis,
        Flavor::Valkey,
        Flavor::Redis,
    ]);
    let urls = quorum.urls().into_iter().map(|url| url + query);
    let store = idempotask_redis::RedlockStore::builder(urls)
        .server_timeout(std::time::Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    assert_eq!((store.servers(), store.quorum()), (5, 3));
    if query.contains("protocol=resp3") {
        // The checks would pass on RESP2 too: the servers must list the store's connections as
        // RESP3. A majority, since the store may connect while a server is slow to answer.
        let mut speaking = 0;
        for url in quorum.urls() {
            speaking += usize::from(support::has_resp3_client(&url).await);
        }
        assert!(
            speaking >= store.quorum(),
            "{speaking} servers have a RESP3 client"
        );
    }
    (quorum, store)
}

idempotask_conformance::conformance_tests!(five_servers().await);

mod in_doubt {
    use super::*;

    idempotask_conformance::doubt_conformance_tests!(five_servers().await);
}

/// Steps: each record on every server, each entry counted where a majority hold it.
mod steps {
    use super::*;

    idempotask_conformance::step_conformance_tests!(five_servers().await);
}

/// Steps with every server's connection speaking RESP3 (`?protocol=resp3`): the record's
/// replies (`{0, entry or nil}` among them) arrive as RESP3 types.
mod resp3_steps {
    use super::*;

    idempotask_conformance::step_conformance_tests!(five_servers_with("/?protocol=resp3").await);
}
