//! The core's `Operator` on `PostgresStore`: the operator's contract
//! (`idempotask_conformance::check_operator`), and rows a delivery never writes (a key that is
//! not UTF-8, a done row without a marker) read back without a panic.

use idempotask_test_support as support;

use idempotask::operator::{Cursor, Held, Operator};
use idempotask::store::StoreErrorKind;
use support::postgres::PostgresServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_operator_contract() {
    let server = PostgresServer::start();
    idempotask_conformance::check_operator(server.store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_no_delivery_wrote_never_panic() {
    let server = PostgresServer::start();
    let store = server.store().await;
    let pool = server.pool(1).await;
    // A key that is not UTF-8: counted, listed under its lossy text, and read back as done.
    sqlx::query(
        "INSERT INTO idempotask_units (task, key, state, marker, expires_at)
         VALUES ('charge', '\\xff01'::bytea, 'done', 'Dgarbage'::bytea, now() + interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let page = store.list("charge", None, 10).await.unwrap();
    assert_eq!((page.keys_seen, page.units.len()), (1, 1), "{page:?}");
    assert!(matches!(
        &page.units[0].held,
        Held::Marker { marker: Err(_), .. }
    ));
    let stats = store.stats("charge").await.unwrap();
    assert_eq!((stats.unreadable, stats.done), (1, 0));

    // A done row without a marker is no unit at all: a typed error, not a panic.
    sqlx::query(
        "INSERT INTO idempotask_units (task, key, state, expires_at)
         VALUES ('refund', 'order-1'::bytea, 'done', now() + interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let refused = store.list("refund", None, 10).await.unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Protocol, "{refused}");

    let refused = store
        .list("charge", Some(&Cursor::new("1792/7001/h")), 10)
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Configuration, "{refused}");
}
