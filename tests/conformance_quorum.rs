//! The conformance suite on `RedlockStore` over five independent servers, three Redis 7.0
//! (`finish` and `renew` as scripts) and two Valkey 8.1 (`SET … IFEQ`), each check with servers
//! of its own.

use idempotask_test_support as support;

use support::Flavor;
use support::quorum::Quorum;

idempotask_conformance::conformance_tests!({
    let quorum = Quorum::start_mixed(&[
        Flavor::Redis,
        Flavor::Valkey,
        Flavor::Redis,
        Flavor::Valkey,
        Flavor::Redis,
    ]);
    let store = quorum.store().await;
    assert_eq!((store.servers(), store.quorum()), (5, 3));
    (quorum, store)
});

mod in_doubt {
    use super::*;

    idempotask_conformance::doubt_conformance_tests!({
        let quorum = Quorum::start_mixed(&[
            Flavor::Redis,
            Flavor::Valkey,
            Flavor::Redis,
            Flavor::Valkey,
            Flavor::Redis,
        ]);
        let store = quorum.store().await;
        (quorum, store)
    });
}
