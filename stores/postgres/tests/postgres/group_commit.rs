//! The group commit of `PostgresStore` (on by default; `group_commit(false)` turns it off): the
//! `begin`s and `finish`es of calls in flight together go as batches, and nothing a call is
//! promised changes for it.

use futures_util::future::join_all;

use super::*;

/// The store with its group commit on, as by default, said here so that these tests keep
/// testing the grouping store whatever the default, on the pool of [`setup`].
async fn grouped(pool: &PgPool) -> PostgresStore {
    PostgresStore::builder(pool.clone())
        .group_commit(true)
        .connect()
        .await
        .unwrap()
}

/// [`setup`], and `pg_stat_statements` created on a `server` that preloads it.
async fn setup_with_statement_stats(server: &PostgresServer) -> (PostgresStore, PgPool) {
    let (store, pool) = setup(server).await;
    sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pool)
        .await
        .unwrap();
    (store, pool)
}

/// Forgets what `pg_stat_statements` counted so far.
async fn reset_statement_stats(pool: &PgPool) {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(pool)
        .await
        .unwrap();
}

/// How many times the server ran a batch statement (`unnest` of the units' arrays), from
/// `pg_stat_statements`.
async fn batch_statements(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE '%unnest(%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits until a statement of the server waits on a row lock held by another transaction.
async fn until_a_statement_waits_on_a_lock(pool: &PgPool) {
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// `deliveries` calls of each of `keys`, all in flight at once through `store`, each body
/// writing its key's effect; answers how many bodies ran.
async fn deliver_keys(
    store: &PostgresStore,
    pool: &PgPool,
    prefix: &str,
    keys: usize,
    deliveries: usize,
) -> usize {
    let runs = Arc::new(AtomicUsize::new(0));
    let done = deliver_concurrently(keys * deliveries, |at| {
        let key = format!("{prefix}-{}", at % keys);
        deliver_plain(store.clone(), pool.clone(), key, Arc::clone(&runs))
    })
    .await;
    for result in done {
        let _: i64 = result.unwrap();
    }
    runs.load(Ordering::SeqCst)
}

/// By default, calls in flight together are sent as batch statements, and each key still runs
/// once; with `group_commit(false)` no batch statement is ever sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn calls_in_flight_together_are_batched_when_grouped_and_each_key_runs_once() {
    let server = PostgresServer::start_with(&["shared_preload_libraries=pg_stat_statements"]);
    let (store, pool) = setup_with_statement_stats(&server).await;

    assert_eq!(deliver_keys(&store, &pool, "grouped", 64, 1).await, 64);
    assert!(
        batch_statements(&pool).await > 0,
        "64 calls in flight at once sent no batch statement"
    );

    let ungrouped = PostgresStore::builder(pool.clone())
        .group_commit(false)
        .connect()
        .await
        .unwrap();
    reset_statement_stats(&pool).await;
    assert_eq!(deliver_keys(&ungrouped, &pool, "alone", 64, 1).await, 64);
    assert_eq!(batch_statements(&pool).await, 0);
    assert_each_key_written_once(&pool, 128).await;
}

/// Many calls of one key and of distinct keys, all in flight at once through a grouping
/// store: each key's body runs exactly once, whatever batch its calls went in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn many_calls_of_one_key_and_of_many_keys_run_each_key_once() {
    let server = PostgresServer::start();
    let (_, pool) = setup(&server).await;
    let store = grouped(&pool).await;
    assert_eq!(deliver_keys(&store, &pool, "one", 1, 64).await, 1);
    assert_eq!(deliver_keys(&store, &pool, "many", 32, 4).await, 32);
    assert_each_key_written_once(&pool, 33).await;
}

/// A unit whose row a transaction holds, asked with others in flight: its own answer is the
/// bounded wait's timeout (nothing taken), and every other call is granted within a bound of
/// the same order, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_held_row_fails_no_other_call_grouped_with_it() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let timeout = Duration::from_secs(2);
    let bounded = PostgresStore::builder(pool.clone())
        .group_commit(true)
        .response_timeout(timeout)
        .connect()
        .await
        .unwrap();
    let held = HeldDelivery::start(&store, "grouped-held").await;
    let units: Vec<UnitOfWork> = std::iter::once("grouped-held".to_owned())
        .chain((0..16).map(|n| format!("grouped-free-{n}")))
        .map(|key| UnitOfWork::new("pg_write", key).unwrap())
        .collect();
    let tokens: Vec<LockToken> = units.iter().map(|_| LockToken::generate()).collect();

    let answers = join_all(units.iter().zip(&tokens).map(|(unit, token)| {
        let bounded = &bounded;
        async move {
            let started = tokio::time::Instant::now();
            let answer = bounded
                .begin(unit, token, Duration::from_secs(30), Fencing::On)
                .await;
            (answer, started.elapsed())
        }
    }))
    .await;

    match &answers[0].0 {
        Err(err) => {
            assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
            assert!(!err.is_ambiguous(), "{err}");
        }
        other => panic!("the held unit: expected its own timeout, got {other:?}"),
    }
    for (at, (answer, took)) in answers.iter().enumerate().skip(1) {
        assert!(
            matches!(answer, Ok(Begin::Acquired { .. })),
            "unit {at}: {answer:?}"
        );
        assert!(*took < timeout * 2, "unit {at} waited {took:?}");
    }
    assert_eq!(held.resume(Ok(1)).await.unwrap(), 1);
    assert_eq!(effects(&pool, "grouped-held").await, 1);
}

/// A call dropped while its batch is in flight: the batch still answers the others, and the
/// runner's release of the dropped call's unit waits for that batch, so that it cannot reach
/// the server before the lock it releases: the unit is free afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_call_dropped_mid_batch_is_released_after_its_batch() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let bounded = PostgresStore::builder(pool.clone())
        .group_commit(true)
        .response_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let held = HeldDelivery::start(&store, "dropped-held").await;
    let unit = |key: &str| UnitOfWork::new("pg_write", key).unwrap();
    let (held_unit, dropped_unit, kept_unit) = (
        unit("dropped-held"),
        unit("dropped-mid"),
        unit("dropped-kept"),
    );
    let tokens: [LockToken; 4] = std::array::from_fn(|_| LockToken::generate());
    let ttl = Duration::from_secs(30);

    // The first begin is in flight, alone, waiting on the held row.
    let first = {
        let (bounded, held_unit, token) = (bounded.clone(), held_unit.clone(), tokens[0].clone());
        tokio::spawn(async move { bounded.begin(&held_unit, &token, ttl, Fencing::Off).await })
    };
    until_a_statement_waits_on_a_lock(&pool).await;

    // These wait for it, then go together: the held unit again keeps their batch in flight.
    let mut dropped = Box::pin(bounded.begin(&dropped_unit, &tokens[1], ttl, Fencing::Off));
    tokio::select! {
        biased;
        answer = &mut dropped => panic!("answered before the batch ahead of it: {answer:?}"),
        () = std::future::ready(()) => {}
    }
    let kept = {
        let (bounded, unit, token) = (bounded.clone(), kept_unit.clone(), tokens[2].clone());
        tokio::spawn(async move { bounded.begin(&unit, &token, ttl, Fencing::Off).await })
    };
    let again = {
        let (bounded, unit, token) = (bounded.clone(), held_unit.clone(), tokens[3].clone());
        tokio::spawn(async move { bounded.begin(&unit, &token, ttl, Fencing::Off).await })
    };
    let first = first.await.unwrap();
    assert!(
        first.as_ref().is_err_and(|err| !err.is_ambiguous()),
        "{first:?}"
    );
    until_a_statement_waits_on_a_lock(&pool).await;
    drop(dropped);

    // The release goes after the dropped call's batch, whatever that batch did with it.
    bounded.release(&dropped_unit, &tokens[1]).await.unwrap();
    let kept = kept.await.unwrap();
    assert!(matches!(kept, Ok(Begin::Acquired { .. })), "{kept:?}");
    let again = again.await.unwrap();
    assert!(
        again.as_ref().is_err_and(|err| !err.is_ambiguous()),
        "{again:?}"
    );
    let left = bounded.inspect(&dropped_unit).await.unwrap();
    assert!(
        !left.is_locked(),
        "the dropped call's lock outlived its release: {left:?}"
    );
    assert_eq!(held.resume(Ok(1)).await.unwrap(), 1);
}

/// Transactional deliveries, many in flight beside plain calls that the store groups: each
/// key runs once, in its transaction or through the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn transactional_deliveries_beside_grouped_calls_run_each_key_once() {
    let server = PostgresServer::start();
    let (_, pool) = setup(&server).await;
    let store = grouped(&pool).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let transactional = deliver_concurrently(32, |at| {
        deliver_write(store.clone(), format!("tx-{}", at % 16), Arc::clone(&runs))
    });
    let (transactional, plain) =
        tokio::join!(transactional, deliver_keys(&store, &pool, "beside", 16, 4));
    for result in transactional {
        assert_eq!(result.unwrap(), 1);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 16);
    assert_eq!(plain, 16);
    assert_each_key_written_once(&pool, 32).await;
}

/// `keys` fresh units of `prefix` begun at once through `store`, then finished at once: with
/// the group commit on, one batch `begin` and one batch `finish` for all but the first of each.
async fn begin_and_finish_together(store: &PostgresStore, prefix: &str, keys: usize) {
    let units: Vec<UnitOfWork> = (0..keys)
        .map(|n| UnitOfWork::new("pg_write", format!("{prefix}-{n}")).unwrap())
        .collect();
    let tokens: Vec<LockToken> = units.iter().map(|_| LockToken::generate()).collect();
    let ttl = Duration::from_secs(30);
    let begun = join_all(
        units
            .iter()
            .zip(&tokens)
            .map(|(unit, token)| store.begin(unit, token, ttl, Fencing::Off)),
    )
    .await;
    for answer in &begun {
        assert!(matches!(answer, Ok(Begin::Acquired { .. })), "{answer:?}");
    }
    let finished = join_all(
        units
            .iter()
            .zip(&tokens)
            .map(|(unit, token)| store.finish(unit, token, b"7", ttl)),
    )
    .await;
    for answer in &finished {
        assert!(matches!(answer, Ok(Finish::Completed)), "{answer:?}");
    }
}

/// A batch statement is planned for the table as it is: a grouping store whose first batches
/// ran while the table was empty (on one connection, which a kept plan would serve from then
/// on) reads, once the table has 300,000 rows, about the rows its units name, not the whole
/// table. With a named prepared statement the server kept the generic plan it made for the
/// empty table after five executions, a sequential scan joined to the units, and a batch read
/// every row of the table (in the bench, a batch `begin` went from 0.4 ms to 16 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn batches_first_run_on_an_empty_table_read_only_their_rows_once_it_is_large() {
    let server = PostgresServer::start_with(&["shared_preload_libraries=pg_stat_statements"]);
    let (_, pool) = setup_with_statement_stats(&server).await;
    let store = PostgresStore::builder(pool.clone())
        .group_commit(true)
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    for round in 0..8 {
        begin_and_finish_together(&store, &format!("small-{round}"), 16).await;
    }
    sqlx::query(
        "INSERT INTO idempotask_units (task, key, state, marker, expires_at)
         SELECT 'filler', convert_to(n::text, 'UTF8'), 'done', '\\x37',
                now() + interval '1 hour'
         FROM generate_series(1, 300000) n",
    )
    .execute(&pool)
    .await
    .unwrap();
    reset_statement_stats(&pool).await;

    begin_and_finish_together(&store, "large", 16).await;

    let (calls, blocks): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(calls), 0)::bigint,
                coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint
         FROM pg_stat_statements WHERE query LIKE '%unnest(%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let table_blocks: i64 = sqlx::query_scalar(
        "SELECT pg_relation_size('idempotask_units') / current_setting('block_size')::bigint",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(calls >= 2, "{calls} batch statements for two batches");
    assert!(
        blocks / calls < table_blocks / 4,
        "a batch statement read {} blocks on average, of a table of {table_blocks}",
        blocks / calls
    );
}
