//! Batches on `PostgresStore`: what one statement for many units must not change.

use idempotask::store::{Claim, Completion};

use super::*;

/// Three units of task `pg_write`, the middle one `held`, with a token each.
fn three_units(held: &str) -> ([UnitOfWork; 3], [LockToken; 3]) {
    let unit = |key: &str| UnitOfWork::new("pg_write", key).unwrap();
    (
        [unit("batched-free-1"), unit(held), unit("batched-free-2")],
        std::array::from_fn(|_| LockToken::generate()),
    )
}

/// A batch with a unit whose row a transaction holds uncommitted: the batch statement's wait
/// on that row runs out in the server, and the other units of the batch are still taken (each
/// asked alone); the held unit's answer is its own timeout, which says nothing was taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn one_units_row_lock_wait_never_fails_the_rest_of_its_batch() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let bounded = PostgresStore::builder(pool.clone())
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let held = HeldDelivery::start(&store, "write-batched").await;
    let (units, tokens) = three_units("write-batched");
    let claims: Vec<_> = units
        .iter()
        .zip(&tokens)
        .map(|(u, t)| Claim::new(u, t))
        .collect();

    let answers = bounded
        .begin_batch(&claims, Duration::from_secs(30), Fencing::On)
        .await;
    assert_eq!(answers.len(), 3);
    let mut granted = tokens.clone();
    for at in [0, 2] {
        match &answers[at] {
            Ok(Begin::Acquired {
                fencing_token: Some(fence),
                ..
            }) => granted[at] = tokens[at].clone().with_fencing_token(*fence),
            other => panic!("unit {at}: expected the lock, got {other:?}"),
        }
    }
    match &answers[1] {
        Err(err) => {
            assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
            assert!(!err.is_ambiguous(), "{err}");
        }
        other => panic!("the held unit: expected its own timeout, got {other:?}"),
    }
    assert_eq!(held.resume(Ok(1)).await.unwrap(), 1);
    assert_eq!(effects(&pool, "write-batched").await, 1);

    // The taken units finish together; the held unit, never granted, is told it holds nothing.
    let markers = [b"one".as_slice(), b"two", b"three"];
    let completions: Vec<_> = (0..3)
        .map(|at| Completion::new(&units[at], &granted[at], markers[at]))
        .collect();
    let finished = bounded
        .finish_batch(&completions, Duration::from_secs(60))
        .await;
    assert!(
        matches!(finished[0], Ok(Finish::Completed)),
        "{:?}",
        finished[0]
    );
    assert!(
        matches!(finished[2], Ok(Finish::Completed)),
        "{:?}",
        finished[2]
    );
    assert!(
        matches!(finished[1], Ok(Finish::LockLost { .. })),
        "{:?}",
        finished[1]
    );
    for at in [0, 2] {
        let seen = store.inspect(&units[at]).await.unwrap();
        assert_eq!(seen.marker.as_deref(), Some(markers[at]), "unit {at}");
    }
}

/// A transaction holding an uncommitted lock row of `key` (task `pg_write`), as a transactional
/// delivery's; returned with its backend's pid.
async fn hold_row(pool: &PgPool, key: &str) -> (sqlx::Transaction<'static, sqlx::Postgres>, i32) {
    let mut transaction = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO idempotask_units (task, key, state, token, expires_at)
         VALUES ('pg_write', $1, 'locked', 'a transaction', now() + interval '1 minute')",
    )
    .bind(key.as_bytes())
    .execute(&mut *transaction)
    .await
    .unwrap();
    let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *transaction)
        .await
        .unwrap();
    (transaction, pid)
}

/// Whether a backend waits on a lock that backend `pid` holds.
async fn blocked_by(pool: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))",
    )
    .bind(pid)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A batch statement waits on each row that another transaction holds, one after another:
/// here on `held-a` until its transaction rolls back, then on `held-b`. The waits together
/// still end within a single statement's bound, before the client stops listening, so the free
/// unit is taken, no answer is ambiguous, and nothing is taken behind the callers' backs once
/// the rows are let go. (With each wait bounded by the whole bound, the two waits outlast the
/// response timeout whenever the rollback comes while the first wait goes on: every unit is
/// then an ambiguous timeout, and the abandoned statement takes all three units.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn the_waits_of_one_batch_end_within_one_statements_bound() {
    let server = PostgresServer::start();
    let (_, pool) = setup(&server).await;
    let store = PostgresStore::builder(pool.clone())
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let (first, first_pid) = hold_row(&pool, "held-a").await;
    let (second, _) = hold_row(&pool, "held-b").await;
    let unit = |key: &str| UnitOfWork::new("pg_write", key).unwrap();
    let units = [unit("held-a"), unit("held-b"), unit("free-c")];
    let tokens: [LockToken; 3] = std::array::from_fn(|_| LockToken::generate());
    let batch = {
        let (store, units, tokens) = (store.clone(), units.clone(), tokens.clone());
        tokio::spawn(async move {
            let claims: Vec<_> = units
                .iter()
                .zip(&tokens)
                .map(|(u, t)| Claim::new(u, t))
                .collect();
            store
                .begin_batch(&claims, Duration::from_secs(30), Fencing::Off)
                .await
        })
    };
    while !blocked_by(&pool, first_pid).await {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    first.rollback().await.unwrap();
    let answers = batch.await.unwrap();

    assert!(
        matches!(answers[2], Ok(Begin::Acquired { .. })),
        "the free unit: {:?}",
        answers[2]
    );
    // `held-a` is free once rolled back: taken alone, or timed out before that.
    for answer in &answers[..2] {
        match answer {
            Ok(Begin::Acquired { .. }) => {}
            Err(err) => {
                assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
                assert!(!err.is_ambiguous(), "{err}");
            }
            other => panic!("a held unit: expected the lock or its own timeout, got {other:?}"),
        }
    }
    assert!(
        answers[1].is_err(),
        "held-b was held throughout: {:?}",
        answers[1]
    );
    second.rollback().await.unwrap();
    // Nothing of the batch's is still running in the server to take `held-b` now.
    while deliveries::statements_in_flight(&pool).await > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = store.inspect(&units[1]).await.unwrap();
    assert!(seen.lock_ttl.is_none() && seen.marker.is_none(), "{seen:?}");
}

/// A batch statement cancelled by the application's `statement_timeout` (inherited by the
/// store's pool) applied nothing: every unit is asked alone, and only the held one fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_statement_timeout_on_one_units_wait_fails_only_that_unit() {
    let server = PostgresServer::start();
    let (_, pool) = setup(&server).await;
    let options: sqlx::postgres::PgConnectOptions = server.url().parse().unwrap();
    let impatient = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.options([("statement_timeout", "300")]))
        .await
        .unwrap();
    let store = PostgresStore::builder(impatient)
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let (held, _) = hold_row(&pool, "held").await;
    let (units, tokens) = three_units("held");
    let claims: Vec<_> = units
        .iter()
        .zip(&tokens)
        .map(|(u, t)| Claim::new(u, t))
        .collect();

    let answers = store
        .begin_batch(&claims, Duration::from_secs(30), Fencing::Off)
        .await;
    for at in [0, 2] {
        assert!(
            matches!(answers[at], Ok(Begin::Acquired { .. })),
            "unit {at}: {:?}",
            answers[at]
        );
    }
    assert!(answers[1].is_err(), "{:?}", answers[1]);
    held.rollback().await.unwrap();
}

/// The least-privileged user (rights on the store's tables and its fencing sequence, nothing
/// else) takes and finishes units in batches: the batch statements need no right that one
/// unit's statements do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn the_least_privileged_user_runs_batches() {
    let server = PostgresServer::start();
    let owner = server.pool(2).await;
    PostgresStore::builder(owner.clone())
        .migrate()
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE ROLE app LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE
             ON idempotask_units, idempotask_units_steps, idempotask_units_runs TO app;
         GRANT USAGE, SELECT ON SEQUENCE idempotask_units_fence TO app;",
    )
    .execute(&owner)
    .await
    .unwrap();
    let url = server
        .url()
        .replace("postgres://postgres@", "postgres://app@");
    let store = PostgresStore::connect(&url).await.unwrap();
    let units: Vec<_> = (0..5)
        .map(|at| UnitOfWork::new("pg_acl", format!("batched-{at}")).unwrap())
        .collect();
    let tokens: Vec<_> = units.iter().map(|_| LockToken::generate()).collect();
    let claims: Vec<_> = units
        .iter()
        .zip(&tokens)
        .map(|(unit, token)| Claim::new(unit, token))
        .collect();
    let answers = store
        .begin_batch(&claims, Duration::from_secs(30), Fencing::On)
        .await;
    let granted: Vec<_> = answers
        .into_iter()
        .zip(&tokens)
        .map(|(answer, token)| match answer {
            Ok(Begin::Acquired {
                fencing_token: Some(fence),
                ..
            }) => token.clone().with_fencing_token(fence),
            other => panic!("expected the lock, got {other:?}"),
        })
        .collect();
    let done: Vec<_> = units
        .iter()
        .zip(&granted)
        .map(|(unit, token)| Completion::new(unit, token, b"m"))
        .collect();
    let finished = store.finish_batch(&done, Duration::from_secs(60)).await;
    assert!(
        finished
            .iter()
            .all(|answer| matches!(answer, Ok(Finish::Completed))),
        "{finished:?}"
    );
    let again = store
        .begin_batch(&claims, Duration::from_secs(30), Fencing::On)
        .await;
    assert!(
        again
            .iter()
            .all(|answer| matches!(answer, Ok(Begin::Done(_)))),
        "{again:?}"
    );
}
