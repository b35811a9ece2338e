//! Journals of steps in the steps table: records racing a takeover, a record sent again, and a
//! purge, each made to interleave by a transaction of the test that holds a row until the
//! store's statement waits on it; what `inspect`, `forget`, resolutions and `purge_expired` do
//! with a journal; and a table of the previous version migrated by replicas at once.

#[allow(clippy::wildcard_imports)]
use super::*;

use idempotask::store::{Journal, StepEntry};

use super::doubt::{free, migrate_at_once, refused_until_migrated, remembered};

const DAY: Duration = Duration::from_secs(86_400);

/// The store, with a response timeout that outlasts the row locks the tests hold (a statement
/// waits on a row lock for four fifths of it).
async fn patient_store(server: &PostgresServer) -> (PostgresStore, PgPool) {
    let pool = server.pool(8).await;
    let builder = PostgresStore::builder(pool.clone()).response_timeout(Duration::from_secs(30));
    builder.migrate().await.unwrap();
    (builder.connect().await.unwrap(), pool)
}

/// Takes `unit` for `token` (fencing off) for 30 s.
async fn take(store: &PostgresStore, unit: &UnitOfWork, token: &LockToken) {
    let ttl = Duration::from_secs(30);
    let begun = store.begin(unit, token, ttl, Fencing::Off).await.unwrap();
    assert!(matches!(begun, Begin::Acquired { .. }), "{begun:?}");
}

/// The unit `key` of `pg_steps`, taken by a new token, with `entries` recorded from the first
/// position.
async fn holding(store: &PostgresStore, key: &str, entries: &[&[u8]]) -> (UnitOfWork, LockToken) {
    let unit = UnitOfWork::new("pg_steps", key).unwrap();
    let holder = LockToken::generate();
    take(store, &unit, &holder).await;
    for (position, entry) in (0..).zip(entries) {
        assert!(record(store, &unit, &holder, position, entry).await);
    }
    (unit, holder)
}

/// Records `bytes` at `position` for `token`, kept for a day.
async fn record(
    store: &PostgresStore,
    unit: &UnitOfWork,
    token: &LockToken,
    at: u32,
    bytes: &[u8],
) -> bool {
    store
        .record_step(
            unit,
            token,
            StepEntry::new(at, bytes, DAY),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
}

fn journal(entries: &[&[u8]]) -> Journal {
    Journal::from_entries(entries.iter().map(|entry| entry.to_vec()).collect())
}

/// How many of the store's `record_step` statements wait on a row lock now.
async fn records_waiting(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE wait_event_type = 'Lock' AND query LIKE 'WITH holder AS%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits until `count` records wait on a row lock, or `done` says that none will.
async fn until_records_wait(pool: &PgPool, count: i64, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while records_waiting(pool).await < count && !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "the records never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Locks the unit's row in a transaction of the test's own, as a statement of the store would.
async fn hold_unit_row(
    pool: &PgPool,
    unit: &UnitOfWork,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut held = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idempotask_units WHERE task = $1 AND key = $2 FOR UPDATE")
        .bind(unit.task())
        .bind(unit.key().as_bytes())
        .fetch_one(&mut *held)
        .await
        .unwrap();
    held
}

/// The race a stale holder runs: its record starts while its lock still reads as held, and a
/// takeover commits while the record waits for the unit's row. The record must be decided on
/// the row as the takeover left it, not as the statement's snapshot showed it: it records
/// nothing and renews nothing, and the new holder appends at the position the stale one tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_stale_holder_whose_record_waits_behind_a_takeover_records_nothing() {
    let server = PostgresServer::start();
    let (store, pool) = patient_store(&server).await;
    let (unit, stale) = holding(&store, "stale", &[b"zero"]).await;

    let mut takeover = hold_unit_row(&pool, &unit).await;
    let late = {
        let (store, unit, stale) = (store.clone(), unit.clone(), stale.clone());
        tokio::spawn(async move { record(&store, &unit, &stale, 1, b"stale").await })
    };
    until_records_wait(&pool, 1, || late.is_finished()).await;
    let successor = LockToken::generate();
    let taken: f64 = sqlx::query_scalar(
        "UPDATE idempotask_units SET token = $3, expires_at = now() + interval '1 minute'
         WHERE task = $1 AND key = $2 RETURNING extract(epoch FROM expires_at)::float8",
    )
    .bind(unit.task())
    .bind(unit.key().as_bytes())
    .bind(successor.as_str())
    .fetch_one(&mut *takeover)
    .await
    .unwrap();
    takeover.commit().await.unwrap();

    assert!(!late.await.unwrap(), "a stale holder recorded a step");
    assert_eq!(
        store.read_journal(&unit).await.unwrap(),
        journal(&[b"zero"])
    );
    let now: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM expires_at)::float8 FROM idempotask_units
         WHERE task = 'pg_steps' AND key = 'stale'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        (now - taken).abs() < f64::EPSILON,
        "the stale holder renewed the new lock"
    );
    assert!(record(&store, &unit, &successor, 1, b"own").await);
    assert_eq!(
        store.read_journal(&unit).await.unwrap(),
        journal(&[b"zero", b"own"])
    );
}

/// A record must carry the fencing token the lock was granted with, as a renewal must: the
/// holder's token without it (a grant whose reply was lost), or with another, records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_record_needs_the_fencing_token_of_the_grant() {
    let server = PostgresServer::start();
    let (store, _pool) = patient_store(&server).await;
    let unit = UnitOfWork::new("pg_steps", "fenced").unwrap();
    let token = LockToken::generate();
    let Begin::Acquired {
        fencing_token: Some(fence),
        ..
    } = store
        .begin(&unit, &token, Duration::from_secs(30), Fencing::On)
        .await
        .unwrap()
    else {
        panic!("expected a fenced lock");
    };
    for wrong in [None, Some(fence - 1), Some(fence + 1)] {
        let claimed = token.clone().granted(wrong);
        assert!(
            !record(&store, &unit, &claimed, 0, b"zero").await,
            "{wrong:?}"
        );
    }
    assert_eq!(store.read_journal(&unit).await.unwrap(), Journal::default());
    assert!(record(&store, &unit, &token.granted(Some(fence)), 0, b"zero").await);
}

/// A record whose reply was lost is sent again while the first is still in the server: both
/// statements started before either committed, so the second's snapshot never shows the
/// first's entry. It must still answer recorded for the same bytes, once, and a different
/// entry racing for the same position must be refused, whichever comes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_record_sent_again_while_the_first_waits_is_recorded_once() {
    let server = PostgresServer::start();
    let (store, pool) = patient_store(&server).await;
    let (unit, holder) = holding(&store, "resent", &[]).await;

    let send = |position: u32, bytes: &'static [u8]| {
        let (store, unit, holder) = (store.clone(), unit.clone(), holder.clone());
        tokio::spawn(async move { record(&store, &unit, &holder, position, bytes).await })
    };
    let held = hold_unit_row(&pool, &unit).await;
    let first = send(0, b"zero");
    until_records_wait(&pool, 1, || false).await;
    let again = send(0, b"zero");
    until_records_wait(&pool, 2, || false).await;
    held.commit().await.unwrap();
    assert!(first.await.unwrap(), "the first send was refused");
    assert!(
        again.await.unwrap(),
        "the same entry sent again was refused"
    );
    assert_eq!(
        store.read_journal(&unit).await.unwrap(),
        journal(&[b"zero"])
    );

    let held = hold_unit_row(&pool, &unit).await;
    let one = send(1, b"one");
    until_records_wait(&pool, 1, || false).await;
    let other = send(1, b"other");
    until_records_wait(&pool, 2, || false).await;
    held.commit().await.unwrap();
    let (one, other) = (one.await.unwrap(), other.await.unwrap());
    assert!(
        one != other,
        "one entry, exactly, takes the position: {one} {other}"
    );
    let winner: &[u8] = if one { b"one" } else { b"other" };
    assert_eq!(
        store.read_journal(&unit).await.unwrap(),
        journal(&[b"zero", winner])
    );
}

/// A journal runs out while a record waits for its entries (a purge holds them): the record
/// must not append past the entries that are gone, which would leave a journal with a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_journal_that_runs_out_while_a_record_waits_is_not_extended() {
    let server = PostgresServer::start();
    let (store, pool) = patient_store(&server).await;
    let (unit, holder) = holding(&store, "purged", &[]).await;
    let brief = StepEntry::new(0, b"zero", Duration::from_millis(1500));
    assert!(
        store
            .record_step(&unit, &holder, brief, Duration::from_secs(30))
            .await
            .unwrap()
    );

    let mut purge = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idempotask_units_steps WHERE task = $1 AND key = $2 FOR UPDATE")
        .bind(unit.task())
        .bind(unit.key().as_bytes())
        .fetch_one(&mut *purge)
        .await
        .unwrap();
    let late = {
        let (store, unit, holder) = (store.clone(), unit.clone(), holder.clone());
        tokio::spawn(async move { record(&store, &unit, &holder, 1, b"one").await })
    };
    until_records_wait(&pool, 1, || late.is_finished()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let expired: bool = sqlx::query_scalar(
            "SELECT bool_and(expires_at <= now()) FROM idempotask_units_steps WHERE task = 'pg_steps'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if expired {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the entry never ran out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sqlx::query(
        "DELETE FROM idempotask_units_steps
         WHERE task = $1 AND key = $2 AND expires_at <= clock_timestamp()",
    )
    .bind(unit.task())
    .bind(unit.key().as_bytes())
    .execute(&mut *purge)
    .await
    .unwrap();
    purge.commit().await.unwrap();

    assert!(
        !late.await.unwrap(),
        "a step was appended to a journal that ran out"
    );
    assert_eq!(store.read_journal(&unit).await.unwrap(), Journal::default());
    // The journal starts again from its first position.
    assert!(record(&store, &unit, &holder, 0, b"again").await);
    assert_eq!(
        store.read_journal(&unit).await.unwrap(),
        journal(&[b"again"])
    );
}

/// A record refused for its position writes nothing, not even the lock's renewal; an expired
/// entry is replaced in place; a recorded step keeps every entry of the journal for its
/// `kept_for`, so that the journal runs out as a whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_journal_is_kept_and_runs_out_as_a_whole() {
    let server = PostgresServer::start();
    let (store, pool) = patient_store(&server).await;
    let (unit, holder) = holding(&store, "whole", &[]).await;
    let expiries = || async {
        sqlx::query_scalar::<_, f64>(
            "SELECT extract(epoch FROM expires_at)::float8 FROM idempotask_units_steps
             WHERE task = 'pg_steps' ORDER BY position",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let lock_expiry = || async {
        sqlx::query_scalar::<_, f64>(
            "SELECT extract(epoch FROM expires_at)::float8 FROM idempotask_units WHERE task = 'pg_steps'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert!(record(&store, &unit, &holder, 0, b"zero").await);
    let before = lock_expiry().await;
    let long = StepEntry::new(5, b"far", DAY);
    assert!(!store.record_step(&unit, &holder, long, DAY).await.unwrap());
    assert!(
        (lock_expiry().await - before).abs() < f64::EPSILON,
        "a refused record renewed the lock"
    );
    let short = StepEntry::new(1, b"one", Duration::from_secs(3600));
    assert!(
        store
            .record_step(&unit, &holder, short, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let kept = expiries().await;
    assert_eq!(kept.len(), 2);
    assert!((kept[0] - kept[1]).abs() < f64::EPSILON, "{kept:?}");

    // A journal that ran out is absent, and its rows are replaced from the first position.
    sqlx::query("UPDATE idempotask_units_steps SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(store.read_journal(&unit).await.unwrap(), Journal::default());
    assert!(!record(&store, &unit, &holder, 2, b"two").await);
    assert!(record(&store, &unit, &holder, 0, b"new").await);
    assert_eq!(store.read_journal(&unit).await.unwrap(), journal(&[b"new"]));
    // The expired row at 1 is still there, and counts as absent until it is replaced or purged.
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert_eq!(expiries().await.len(), 1);
}

/// `inspect` shows the journal of a unit that is not done (locked, released, in doubt) and
/// not that of a finished one; `forget` of a marker deletes it, while a `forget` that finds no
/// marker and an operator's resolution leave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn inspect_forget_and_resolve_treat_the_journal_as_the_unit_needs() {
    let server = PostgresServer::start();
    let (store, _pool) = patient_store(&server).await;
    let (unit, holder) = holding(&store, "seen", &[b"zero"]).await;
    assert_eq!(
        store.inspect(&unit).await.unwrap().journal,
        journal(&[b"zero"])
    );
    assert!(!store.forget(&unit).await.unwrap());
    assert!(store.release(&unit, &holder).await.unwrap());
    let released = store.inspect(&unit).await.unwrap();
    assert!(!released.is_locked() && !released.is_done(), "{released:?}");
    assert_eq!(
        released.journal,
        journal(&[b"zero"]),
        "a forget without a marker took it"
    );

    let marker = format!(r#"D{}|{}|"1""#, unit.key().len(), unit.key()).into_bytes();
    let next = LockToken::generate();
    take(&store, &unit, &next).await;
    assert_eq!(
        store.finish(&unit, &next, &marker, DAY).await.unwrap(),
        Finish::Completed
    );
    let done = store.inspect(&unit).await.unwrap();
    assert!(done.is_done() && done.journal.is_empty(), "{done:?}");
    assert!(store.forget(&unit).await.unwrap());
    assert_eq!(store.read_journal(&unit).await.unwrap(), Journal::default());

    // A unit in doubt that an operator frees keeps its journal: the next delivery replays it.
    let doubted = UnitOfWork::new("pg_steps", "doubted").unwrap();
    let token = remembered();
    take(&store, &doubted, &token).await;
    assert!(record(&store, &doubted, &token, 0, b"charged").await);
    sqlx::query("UPDATE idempotask_units SET expires_at = now() WHERE key = 'doubted'")
        .execute(store.pool())
        .await
        .unwrap();
    let seen = store.inspect(&doubted).await.unwrap();
    assert!(seen.in_doubt.is_some(), "{seen:?}");
    assert_eq!(seen.journal, journal(&[b"charged"]));
    assert_eq!(free(&store, &doubted, &token).await, Resolved::Freed);
    take(&store, &doubted, &LockToken::generate()).await;
    assert_eq!(
        store.read_journal(&doubted).await.unwrap(),
        journal(&[b"charged"])
    );
}

/// Replicas deploy onto a table of the version before steps, which holds a live lock, while a
/// transaction that touched the units table stays open, and all migrate at once: the table is
/// refused until then, every migration succeeds without waiting for that transaction (the
/// units table needs no `ALTER`), the steps table is created once, the lock is still held, and
/// steps are recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_migrating_a_table_of_the_version_before_steps_add_the_steps_table() {
    let server = PostgresServer::start();
    let pool = server.pool(12).await;
    // The version before steps: this version's units table and sequence, no steps table.
    PostgresStore::builder(pool.clone())
        .migrate()
        .await
        .unwrap();
    sqlx::raw_sql("DROP TABLE idempotask_units_steps")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO idempotask_units (task, key, state, token, fence, marker, expires_at)
         VALUES ('pg_steps', 'held-across', 'locked', 'before', NULL, NULL,
                 now() + interval '1 minute')",
    )
    .execute(&pool)
    .await
    .unwrap();
    refused_until_migrated(&pool).await;

    let mut open = pool.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotask_units")
        .fetch_one(&mut *open)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), migrate_at_once(&pool))
        .await
        .expect("the migration waited for a transaction on the units table");
    open.rollback().await.unwrap();
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class WHERE relname = 'idempotask_units_steps' AND relkind = 'r'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 1);

    let store = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap();
    let held = UnitOfWork::new("pg_steps", "held-across").unwrap();
    assert!(store.inspect(&held).await.unwrap().is_locked());
    let (unit, _) = holding(&store, "after", &[b"zero"]).await;
    assert_eq!(
        store.read_journal(&unit).await.unwrap(),
        journal(&[b"zero"])
    );
}
