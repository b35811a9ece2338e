//! The conformance suite on `PostgresStore`, each check against a PostgreSQL server of its own.

use idempotask_test_support as support;

use support::postgres::PostgresServer;

idempotask::conformance_tests!({
    let server = PostgresServer::start();
    let store = server.store().await;
    (server, store)
});
