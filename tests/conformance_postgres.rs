//! The conformance suite on `PostgresStore`, each check against a PostgreSQL server of its own:
//! the plain checks, those of units left in doubt, those of steps, and the transaction checks
//! on `PostgresTransaction`.

use idempotask::store::SharedStore;
use idempotask_conformance::OpensTransactions;
use idempotask_postgres::{PostgresStore, PostgresTransaction};
use idempotask_test_support as support;

use support::postgres::PostgresServer;

idempotask_conformance::conformance_tests!({
    let server = PostgresServer::start();
    let store = server.store().await;
    (server, store)
});

idempotask_conformance::doubt_conformance_tests!({
    let server = PostgresServer::start();
    let store = server.store().await;
    (server, store)
});

/// Steps: the journals in the steps table beside the units table.
mod steps {
    use super::*;

    idempotask_conformance::step_conformance_tests!({
        let server = PostgresServer::start();
        let store = server.store().await;
        (server, store)
    });
}

/// The suite through `BatchingStore`, whose batches `PostgresStore` sends as one statement.
mod batching {
    use super::*;

    use idempotask::store::BatchingStore;

    idempotask_conformance::conformance_tests!({
        let server = PostgresServer::start();
        let store = BatchingStore::new(server.store().await);
        (server, store)
    });

    idempotask_conformance::doubt_conformance_tests!({
        let server = PostgresServer::start();
        let store = BatchingStore::new(server.store().await);
        (server, store)
    });

    mod steps {
        use super::*;

        idempotask_conformance::step_conformance_tests!({
            let server = PostgresServer::start();
            let store = BatchingStore::new(server.store().await);
            (server, store)
        });
    }
}

mod transactions {
    use super::*;

    /// The store, opening each transaction from its own pool.
    struct Transactions(PostgresStore);

    impl OpensTransactions for Transactions {
        type Transaction<'a> = PostgresTransaction<'a>;

        fn plain(&self) -> SharedStore {
            SharedStore::new(self.0.clone())
        }

        async fn open(&self) -> PostgresTransaction<'_> {
            self.0.transaction(self.0.pool().begin().await.unwrap())
        }
    }

    idempotask_conformance::transaction_conformance_tests!({
        let server = PostgresServer::start();
        let store = server.store().await;
        (server, Transactions(store))
    });
}
