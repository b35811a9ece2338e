//! Units in doubt: tables of earlier versions migrated under load, a unit in doubt through purge,
//! takeover and renewal, the least privileged user, and the operator's exact resolutions.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The table and sequence as versions before units in doubt created them.
pub(super) const EARLIER_SCHEMA: &str = "
CREATE TABLE idempotask_units (
    task       text        NOT NULL,
    key        bytea       NOT NULL,
    state      text        NOT NULL CHECK (state IN ('locked', 'done')),
    token      text,
    fence      bigint,
    marker     bytea,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (task, key)
);

CREATE SEQUENCE idempotask_units_fence;
";

/// A lock row as an earlier version writes it (no `doubt_memory`), expiring `expires_in` from
/// now on the server's clock (negative: already lapsed).
async fn earlier_lock(pool: &PgPool, key: &str, expires_in: &str) {
    sqlx::query(
        "INSERT INTO idempotask_units (task, key, state, token, fence, marker, expires_at)
         VALUES ('pg_doubt', $1, 'locked', md5($1), NULL, NULL, now() + $2::interval)",
    )
    .bind(key.as_bytes())
    .bind(expires_in)
    .execute(pool)
    .await
    .unwrap();
}

/// A token that asks for its lock to be remembered a minute after it ran out.
pub(super) fn remembered() -> LockToken {
    LockToken::generate().with_doubt_memory(Duration::from_secs(60))
}

/// What `begin` answers for `key` of `pg_doubt` to a token that would take a unit in doubt over:
/// whether it was acquired, and what it knew of a doubt.
pub(super) async fn begin_doubt(store: &PostgresStore, key: &str) -> (bool, Option<Doubt>) {
    let unit = UnitOfWork::new("pg_doubt", key).unwrap();
    match store
        .begin(&unit, &remembered(), Duration::from_secs(30), Fencing::Off)
        .await
        .unwrap()
    {
        Begin::Acquired { in_doubt, .. } => (true, in_doubt.map(|doubt| *doubt)),
        _ => (false, None),
    }
}

/// The columns that versions after the first added to the table.
pub(super) const ADDED_COLUMNS: [&str; 3] =
    ["doubt_memory", "doubt_earlier_fence", "doubt_expired_for"];

/// This version refuses a table of an earlier one until it is migrated, and says how.
pub(super) async fn refused_until_migrated(pool: &PgPool) {
    let err = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    assert!(err.to_string().contains("PostgresStore::migrate"), "{err}");
}

/// Six replicas migrate the table at once: each migration succeeds, and the table ends with
/// each column of this version once.
pub(super) async fn migrate_at_once(pool: &PgPool) {
    let migrations: Vec<_> = (0..6)
        .map(|_| {
            let builder = PostgresStore::builder(pool.clone());
            tokio::spawn(async move { builder.migrate().await })
        })
        .collect();
    for migration in migrations {
        migration.await.unwrap().unwrap();
    }
    for column in ADDED_COLUMNS {
        let columns: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_attribute
             WHERE attrelid = 'idempotask_units'::regclass AND attname = $1
               AND NOT attisdropped",
        )
        .bind(column)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(columns, 1, "{column}");
    }
}

/// Replicas of the new version deploy onto a table of the previous one that holds locks its
/// replicas wrote, and all migrate at once: every migration succeeds, the column is added once,
/// the replicas of the previous version go on writing, and a lock that ran out with no memory
/// (`NULL`: every row from before) is free, not in doubt, whether it ran out before the
/// migration or after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn replicas_migrating_an_earlier_table_at_once_leave_its_lapsed_locks_free_not_in_doubt()
 {
    let server = PostgresServer::start();
    let pool = server.pool(12).await;
    sqlx::raw_sql(EARLIER_SCHEMA).execute(&pool).await.unwrap();
    earlier_lock(&pool, "lapsed-before", "-1 second").await;
    earlier_lock(&pool, "held-across", "2 seconds").await;
    refused_until_migrated(&pool).await;

    migrate_at_once(&pool).await;
    // A replica of the previous version names only the columns it knows.
    earlier_lock(&pool, "lapsed-after", "-1 second").await;

    let store = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap();
    for key in ["lapsed-before", "lapsed-after"] {
        let seen = store
            .inspect(&UnitOfWork::new("pg_doubt", key).unwrap())
            .await
            .unwrap();
        assert_eq!(seen, idempotask::store::Inspection::empty(), "{key}");
        assert_eq!(begin_doubt(&store, key).await, (true, None), "{key}");
    }
    let held = UnitOfWork::new("pg_doubt", "held-across").unwrap();
    assert!(store.inspect(&held).await.unwrap().is_locked());
    assert_eq!(begin_doubt(&store, "held-across").await, (false, None));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.inspect(&held).await.unwrap().is_locked() {
        assert!(std::time::Instant::now() < deadline, "never ran out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.inspect(&held).await.unwrap().in_doubt.is_none());
    assert_eq!(begin_doubt(&store, "held-across").await, (true, None));
}

/// A table as the version before takeovers kept their doubt created it: `doubt_memory`, and
/// not the doubt a takeover found.
pub(super) const DOUBT_MEMORY_SCHEMA: &str = "
CREATE TABLE idempotask_units (
    task       text        NOT NULL,
    key        bytea       NOT NULL,
    state      text        NOT NULL CHECK (state IN ('locked', 'done')),
    token      text,
    fence      bigint,
    marker     bytea,
    expires_at timestamptz NOT NULL,
    doubt_memory interval,
    PRIMARY KEY (task, key)
);

CREATE SEQUENCE idempotask_units_fence;
SELECT setval('idempotask_units_fence', 1000);
";

/// Replicas deploy onto a table of the version before takeovers kept their doubt, which holds
/// a unit in doubt, and all migrate at once: the table is refused until then, every migration
/// succeeds and adds the columns once, the unit is still in doubt, a replica of that version
/// still writes, and the delivery that takes the unit over carries its doubt: asked again, it
/// answers it, and released, it leaves the unit in doubt for the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_migrating_a_table_of_the_previous_version_keep_its_units_in_doubt() {
    let server = PostgresServer::start();
    let pool = server.pool(12).await;
    sqlx::raw_sql(DOUBT_MEMORY_SCHEMA)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO idempotask_units
             (task, key, state, token, fence, marker, expires_at, doubt_memory)
         VALUES ('pg_doubt', 'lapsed-before', 'locked', 'before', 17, NULL,
                 now() - interval '1 second', interval '1 minute')",
    )
    .execute(&pool)
    .await
    .unwrap();
    refused_until_migrated(&pool).await;

    migrate_at_once(&pool).await;
    // A replica of the previous version names only the columns it knows.
    sqlx::query(
        "INSERT INTO idempotask_units
             (task, key, state, token, fence, marker, expires_at, doubt_memory)
         VALUES ('pg_doubt', 'written-after', 'locked', 'after', NULL, NULL,
                 now() + interval '1 minute', interval '1 minute')",
    )
    .execute(&pool)
    .await
    .unwrap();

    let store = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap();
    let unit = UnitOfWork::new("pg_doubt", "lapsed-before").unwrap();
    let seen = store.inspect(&unit).await.unwrap();
    assert_eq!(
        seen.in_doubt.and_then(|doubt| doubt.fencing_token),
        Some(17)
    );
    let token = remembered();
    let takeover = store
        .begin(&unit, &token, Duration::from_secs(30), Fencing::On)
        .await
        .unwrap();
    let Begin::Acquired {
        fencing_token: Some(granted),
        in_doubt: Some(doubt),
        ..
    } = takeover.clone()
    else {
        panic!("expected the unit taken over in doubt, got {takeover:?}");
    };
    assert_eq!(doubt.fencing_token, Some(17));
    assert!(granted > 17);
    let again = store
        .begin(&unit, &token, Duration::from_secs(30), Fencing::On)
        .await
        .unwrap();
    assert_eq!(
        again, takeover,
        "a repeated begin answers the doubt taken over"
    );
    assert!(
        store
            .release(&unit, &token.clone().granted(Some(granted)))
            .await
            .unwrap()
    );
    let seen = store.inspect(&unit).await.unwrap();
    assert!(!seen.is_locked(), "{seen:?}");
    assert_eq!(
        seen.in_doubt.and_then(|doubt| doubt.fencing_token),
        Some(granted)
    );
    let after = UnitOfWork::new("pg_doubt", "written-after").unwrap();
    assert!(store.inspect(&after).await.unwrap().is_locked());
}

/// Every replica migrates at each deploy. On a table that is up to date, the migration takes
/// no lock on the table, so it neither waits for a long transaction that touched the table nor
/// makes the store's statements queue behind it (`ALTER TABLE … ADD COLUMN IF NOT EXISTS`
/// takes `ACCESS EXCLUSIVE` even when the column is there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn migrating_an_up_to_date_table_does_not_wait_for_open_transactions() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let mut open = pool.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM idempotask_units)
              + (SELECT count(*) FROM idempotask_units_steps)",
    )
    .fetch_one(&mut *open)
    .await
    .unwrap();
    let migrated = tokio::time::timeout(
        Duration::from_secs(20),
        PostgresStore::builder(pool.clone()).migrate(),
    )
    .await;
    assert!(
        matches!(migrated, Ok(Ok(()))),
        "the migration waited for an open transaction: {migrated:?}"
    );
    let ran: u8 = Task::new("pg_migrated_twice")
        .call("k")
        .store(store)
        .run(async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(ran, 1);
    open.rollback().await.unwrap();
}

/// Waits until `unit`'s lock has run out on the server's clock.
pub(super) async fn until_lapsed(store: &PostgresStore, unit: &UnitOfWork) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.inspect(unit).await.unwrap().is_locked() {
        assert!(
            std::time::Instant::now() < deadline,
            "the lock never ran out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A unit in doubt is kept by `purge_expired` (a lock that ran out with no memory is not),
/// shows in the operator's reads, and survives a transactional takeover that rolled back: the
/// body saw the doubt, its write is gone, and the next delivery is told again. A `Hold` task
/// inside a transaction leaves it alone; a delivery that commits settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_unit_in_doubt_survives_purge_and_a_rolled_back_takeover_and_shows_to_operators()
 {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let short = Duration::from_millis(200);
    let unit = UnitOfWork::new("pg_write", "doubt-tx").unwrap();
    let forgotten = UnitOfWork::new("pg_write", "no-memory").unwrap();
    let fence = match store
        .begin(&unit, &remembered(), short, Fencing::On)
        .await
        .unwrap()
    {
        Begin::Acquired {
            fencing_token: Some(fence),
            in_doubt: None,
            ..
        } => fence,
        other => panic!("expected a fresh fenced lock, got {other:?}"),
    };
    store
        .begin(&forgotten, &LockToken::generate(), short, Fencing::Off)
        .await
        .unwrap();
    until_lapsed(&store, &unit).await;
    until_lapsed(&store, &forgotten).await;

    assert_eq!(store.purge_expired().await.unwrap(), 1);
    let seen = store.inspect(&unit).await.unwrap();
    assert_eq!(
        seen.in_doubt.and_then(|doubt| doubt.fencing_token),
        Some(fence)
    );
    match store.read_unit(&unit).await.unwrap().map(|row| row.state) {
        Some(UnitState::InDoubt {
            fencing_token,
            expired_for,
            ..
        }) => {
            assert_eq!(fencing_token, Some(fence));
            assert!(expired_for < Duration::from_secs(60), "{expired_for:?}");
        }
        other => panic!("expected the unit in doubt, got {other:?}"),
    }
    let listed = store.list_task("pg_write", None, 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(matches!(listed[0].state, UnitState::InDoubt { .. }));

    // Taken over inside a transaction that rolls back: the unit is in doubt again.
    let seen_by_body = Arc::new(std::sync::Mutex::new(None));
    let failed: Result<i64, BoxError> = WRITE
        .call("doubt-tx")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), {
            let seen_by_body = Arc::clone(&seen_by_body);
            async move |db| {
                *seen_by_body.lock().unwrap() = idempotask::context().and_then(|c| c.in_doubt());
                write_effect(db, "doubt-tx", 1).await?;
                Err("the ledger said no".into())
            }
        })
        .await;
    assert!(failed.is_err());
    let told = seen_by_body.lock().unwrap().take();
    assert_eq!(told.and_then(|doubt| doubt.fencing_token), Some(fence));
    assert_eq!(effects(&pool, "doubt-tx").await, 0);
    let again = store.inspect(&unit).await.unwrap().in_doubt;
    assert_eq!(again.and_then(|doubt| doubt.fencing_token), Some(fence));

    // A `Hold` task writes nothing, inside a transaction too.
    let held: Result<i64, BoxError> = Task::new("pg_write")
        .in_doubt(InDoubt::Hold)
        .call("doubt-tx")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), async |db| {
            write_effect(db, "doubt-tx", 2).await
        })
        .await;
    let err = held.unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::InDoubt { .. })),
        "{err}"
    );
    assert!(store.inspect(&unit).await.unwrap().in_doubt.is_some());

    // A delivery that commits settles it, told of the doubt.
    let report = WRITE
        .call("doubt-tx")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), async |db| {
            let told = idempotask::context().and_then(|c| c.in_doubt()).is_some();
            write_effect(db, "doubt-tx", i64::from(told)).await
        })
        .await;
    assert_eq!(report.unwrap(), 1, "the committing body was not told");
    assert!(store.inspect(&unit).await.unwrap().is_done());
    assert_eq!(effects(&pool, "doubt-tx").await, 1);
}

/// The holder of a lock that ran out, which nobody took over, renews it: the lock and its
/// memory are set again from the token, and its finish completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn the_holder_of_a_lapsed_lock_renews_it_with_its_memory_and_finishes() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let unit = UnitOfWork::new("pg_doubt", "renewed").unwrap();
    let token = LockToken::generate().with_doubt_memory(Duration::from_secs(30));
    store
        .begin(&unit, &token, Duration::from_millis(200), Fencing::Off)
        .await
        .unwrap();
    until_lapsed(&store, &unit).await;
    assert!(store.inspect(&unit).await.unwrap().in_doubt.is_some());
    let renewed = token.clone().with_doubt_memory(Duration::from_secs(90));
    assert!(
        store
            .renew(&unit, &renewed, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let memory: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM doubt_memory)::float8 FROM idempotask_units WHERE task = 'pg_doubt'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!((memory - 90.0).abs() < f64::EPSILON, "{memory}");
    let seen = store.inspect(&unit).await.unwrap();
    assert!(seen.is_locked() && seen.in_doubt.is_none(), "{seen:?}");
    // A store sees a marker as bytes; these are laid out as a real one is.
    let marker = format!(r#"D{}|{}|"1""#, unit.key().len(), unit.key()).into_bytes();
    assert_eq!(
        store
            .finish(&unit, &token, &marker, Duration::from_secs(60))
            .await
            .unwrap(),
        Finish::Completed
    );
}

/// Grants the store's user `app` its rights on the steps table, then on the attempts table
/// right by right: `connect` refuses it, naming what is missing, until it has them all.
async fn refused_until_granted(owner: &PgPool, url: &str) {
    for (grant, refused) in [
        (
            "GRANT SELECT, INSERT, UPDATE, DELETE ON idempotask_units_steps TO app;",
            Some("permission denied for table idempotask_units_runs"),
        ),
        (
            "GRANT SELECT ON idempotask_units_runs TO app;",
            Some("attempts table `idempotask_units_runs`"),
        ),
        (
            "GRANT SELECT, INSERT, UPDATE ON idempotask_units_runs TO app;",
            Some("grant it SELECT, INSERT, UPDATE, DELETE"),
        ),
        ("GRANT DELETE ON idempotask_units_runs TO app;", None),
    ] {
        sqlx::raw_sql(grant).execute(owner).await.unwrap();
        let connected = PostgresStore::connect(url).await;
        match (connected, refused) {
            (Err(err), Some(why)) => {
                assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
                assert!(err.to_string().contains(why), "{grant}: {err}");
            }
            (Ok(_), None) => {}
            (connected, _) => panic!("after {grant}: {:?}", connected.map(|_| ())),
        }
    }
}

/// The rights the deployment notes give the store's user, and no more: it connects (not
/// before it may read the steps table, nor before it may read and write the attempts
/// table, which only a transactional call's first step writes), takes a unit in doubt over with a new fencing token,
/// records a step, forgets a unit with its journal, and purges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn the_least_privileged_user_takes_units_in_doubt_over() {
    let server = PostgresServer::start();
    let owner = server.pool(2).await;
    PostgresStore::builder(owner.clone())
        .migrate()
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE ROLE app LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE ON idempotask_units TO app;
         GRANT USAGE, SELECT ON SEQUENCE idempotask_units_fence TO app;",
    )
    .execute(&owner)
    .await
    .unwrap();
    let url = server
        .url()
        .replace("postgres://postgres@", "postgres://app@");
    let refused = PostgresStore::connect(&url).await.unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Configuration, "{refused}");
    refused_until_granted(&owner, &url).await;
    let store = PostgresStore::connect(&url).await.unwrap();
    let unit = UnitOfWork::new("pg_doubt", "least-privilege").unwrap();
    let first = store
        .begin(
            &unit,
            &remembered(),
            Duration::from_millis(200),
            Fencing::On,
        )
        .await
        .unwrap();
    let Begin::Acquired {
        fencing_token: Some(first),
        ..
    } = first
    else {
        panic!("expected a fenced lock, got {first:?}");
    };
    until_lapsed(&store, &unit).await;
    let token = remembered();
    let next = match store
        .begin(&unit, &token, Duration::from_secs(30), Fencing::On)
        .await
        .unwrap()
    {
        Begin::Acquired {
            fencing_token: Some(next),
            in_doubt: Some(doubt),
            ..
        } => {
            assert_eq!(doubt.fencing_token, Some(first));
            assert!(next > first);
            next
        }
        other => panic!("expected the unit taken over in doubt, got {other:?}"),
    };
    // Released, the takeover leaves the unit in doubt: an `UPDATE`, no more rights.
    assert!(store.release(&unit, &token).await.unwrap());
    let seen = store.inspect(&unit).await.unwrap().in_doubt;
    assert_eq!(seen.and_then(|doubt| doubt.fencing_token), Some(next));
    // The operator's resolution needs no more rights than the store's statements.
    let freed = UnitOfWork::new("pg_doubt", "least-privilege-freed").unwrap();
    let holder = in_doubt(&store, &freed, Fencing::On).await;
    assert_eq!(free(&store, &freed, &holder).await, Resolved::Freed);
    // Steps: a record (an `INSERT … ON CONFLICT DO UPDATE` under row locks), and a forget
    // that deletes the journal with the marker.
    let stepped = UnitOfWork::new("pg_doubt", "least-privilege-steps").unwrap();
    let token = LockToken::generate();
    store
        .begin(&stepped, &token, Duration::from_secs(30), Fencing::Off)
        .await
        .unwrap();
    let entry = idempotask::store::StepEntry::new(0, b"step", Duration::from_secs(60));
    let recorded = store.record_step(&stepped, &token, entry, Duration::from_secs(30));
    assert!(recorded.await.unwrap());
    let marker = format!(r#"D{}|{}|"1""#, stepped.key().len(), stepped.key()).into_bytes();
    let finished = store.finish(&stepped, &token, &marker, Duration::from_secs(60));
    assert_eq!(finished.await.unwrap(), Finish::Completed);
    assert!(store.forget(&stepped).await.unwrap());
    assert!(store.read_journal(&stepped).await.unwrap().is_empty());
    store.purge_expired().await.unwrap();
}

/// Leaves `unit` in doubt: a lock of 100 ms, remembered for a minute, left to run out.
/// Answers its holder's token, as granted.
pub(super) async fn in_doubt(
    store: &PostgresStore,
    unit: &UnitOfWork,
    fencing: Fencing,
) -> LockToken {
    let token = remembered();
    let Begin::Acquired {
        fencing_token,
        in_doubt: None,
        ..
    } = store
        .begin(unit, &token, Duration::from_millis(100), fencing)
        .await
        .unwrap()
    else {
        panic!("{unit:?} was not free");
    };
    until_lapsed(store, unit).await;
    token.granted(fencing_token)
}

/// Resolves `unit` if it is still in doubt with the lock of the token `shown`; answers what
/// that did.
pub(super) async fn resolve(
    store: &PostgresStore,
    unit: &UnitOfWork,
    shown: &LockToken,
    resolution: &Resolution,
) -> Resolved {
    let resolved = store.resolve_exact(unit, shown.as_str(), resolution);
    resolved.await.unwrap()
}

/// Frees `unit` if it is still in doubt with `holder`'s lock; answers what that did.
pub(super) async fn free(store: &PostgresStore, unit: &UnitOfWork, holder: &LockToken) -> Resolved {
    resolve(store, unit, holder, &Resolution::Free).await
}

/// The row of `key` of `pg_doubt` as it is stored: `(state, token, fence)`.
pub(super) async fn raw_row(
    pool: &PgPool,
    key: &str,
) -> Option<(String, Option<String>, Option<i64>)> {
    sqlx::query_as(
        "SELECT state, token, fence FROM idempotask_units WHERE task = 'pg_doubt' AND key = $1",
    )
    .bind(key.as_bytes())
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// How long the markers of the resolution tests are kept.
pub(super) const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Records `{"charge":"ch_1"}` as `unit`'s result, with the fencing token `fence`, for a day.
pub(super) fn record(unit: &UnitOfWork, fence: Option<u64>) -> Resolution {
    let result =
        serde_json::value::RawValue::from_string(r#"{"charge":"ch_1"}"#.to_owned()).unwrap();
    Resolution::record(Marker::encode_resolution(unit, fence, &result), DAY)
}

/// `resolve_exact` records a result only over the lock in doubt it was shown: a marker written
/// for another key, or a token that is not the row's, writes nothing. The marker keeps the
/// row's fencing counter, as a finish does, and a second resolution finds it changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn resolve_exact_records_only_over_the_lock_in_doubt_it_was_shown() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let unit = UnitOfWork::new("pg_doubt", "recorded").unwrap();

    // What the operator is shown: the holder's token, the lapse and the memory left.
    let holder = in_doubt(&store, &unit, Fencing::On).await;
    let fence = holder.fencing_token();
    let Some(UnitState::InDoubt {
        token,
        fencing_token,
        expired_for,
        forgotten_in,
        ..
    }) = store.read_unit(&unit).await.unwrap().map(|row| row.state)
    else {
        panic!("expected the unit in doubt");
    };
    assert_eq!((token.as_str(), fencing_token), (holder.as_str(), fence));
    assert!(expired_for < Duration::from_secs(30), "{expired_for:?}");
    assert!(
        forgotten_in > Duration::from_secs(30) && forgotten_in <= Duration::from_secs(60),
        "remembered a minute after it ran out: {forgotten_in:?}"
    );

    let other = UnitOfWork::new("pg_doubt", "other").unwrap();
    let refused = store
        .resolve_exact(&unit, &token, &record(&other, fence))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Configuration, "{refused}");
    let not_the_holder = remembered();
    let changed = resolve(&store, &unit, &not_the_holder, &record(&unit, fence)).await;
    assert_eq!(changed, Resolved::Changed);
    assert!(store.inspect(&unit).await.unwrap().in_doubt.is_some());

    let resolution = record(&unit, fence);
    // The token shown, as read.
    let record_shown = || store.resolve_exact(&unit, &token, &resolution);
    assert_eq!(record_shown().await.unwrap(), Resolved::Recorded);
    match store.read_unit(&unit).await.unwrap().map(|row| row.state) {
        Some(UnitState::Done { marker, ttl, .. }) => {
            assert_eq!(Marker::decode(&marker).unwrap().fencing_token(), fence);
            assert!(ttl > DAY / 2 && ttl <= DAY, "{ttl:?}");
        }
        other => panic!("expected the marker, got {other:?}"),
    }
    let kept = raw_row(&pool, "recorded").await.and_then(|row| row.2);
    assert_eq!(kept.map(i64::unsigned_abs), fence);
    assert_eq!(
        record_shown().await.unwrap(),
        Resolved::Changed,
        "the row holds the marker now"
    );
}

/// `resolve_exact` frees only a lock still in doubt: a fenced unit's row keeps its counter, as
/// a release leaves it, and an unfenced unit's row goes; a lock its holder renewed is left
/// alone (and its finish completes), and a unit whose memory ran out is free already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn resolve_exact_frees_only_a_lock_still_in_doubt() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let unit = |key: &str| UnitOfWork::new("pg_doubt", key).unwrap();

    for (key, fencing) in [("freed-fenced", Fencing::On), ("freed", Fencing::Off)] {
        let freed = unit(key);
        let holder = in_doubt(&store, &freed, fencing).await;
        assert_eq!(
            free(&store, &freed, &holder).await,
            Resolved::Freed,
            "{key}"
        );
        assert_eq!(store.read_unit(&freed).await.unwrap(), None, "{key}");
        let row = raw_row(&pool, key).await;
        match fencing {
            Fencing::On => assert!(
                matches!(&row, Some((locked, None, Some(counter)))
                    if locked == "locked" && Some(counter.unsigned_abs()) == holder.fencing_token()),
                "{row:?}"
            ),
            _ => assert_eq!(row, None),
        }
        assert_eq!(free(&store, &freed, &holder).await, Resolved::Gone, "{key}");
    }

    let renewed = unit("renewed");
    let holder = in_doubt(&store, &renewed, Fencing::On).await;
    assert!(store.renew(&renewed, &holder, DAY).await.unwrap());
    assert_eq!(free(&store, &renewed, &holder).await, Resolved::Changed);
    let Resolution::Record { marker, .. } = record(&renewed, holder.fencing_token()) else {
        unreachable!()
    };
    assert_eq!(
        store.finish(&renewed, &holder, &marker, DAY).await.unwrap(),
        Finish::Completed
    );

    let lapsed = unit("lapsed");
    let short_memory = LockToken::generate().with_doubt_memory(Duration::from_millis(100));
    store
        .begin(
            &lapsed,
            &short_memory,
            Duration::from_millis(100),
            Fencing::Off,
        )
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.read_unit(&lapsed).await.unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "never forgotten");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone = resolve(&store, &lapsed, &short_memory, &record(&lapsed, None)).await;
    assert_eq!(gone, Resolved::Gone);
    assert_eq!(
        raw_row(&pool, "lapsed").await.map(|row| row.0),
        Some("locked".to_owned()),
        "the lapsed row, untouched until the purge"
    );
}

/// Operators resolving a unit in doubt while deliveries take it over, all at once, several
/// times over: exactly one of them settles it. A recording wins once, and the deliveries that
/// follow find its marker; or a delivery takes it over, and every resolution finds it changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(super) async fn resolutions_racing_takeovers_settle_the_unit_once() {
    let server = PostgresServer::start();
    let (store, _pool) = setup(&server).await;
    for round in 0..20 {
        let unit = UnitOfWork::new("pg_doubt", format!("race-{round}")).unwrap();
        let holder = in_doubt(&store, &unit, Fencing::On).await;
        let mut racing = tokio::task::JoinSet::new();
        for racer in 0..8 {
            let (store, unit, holder) = (store.clone(), unit.clone(), holder.clone());
            racing.spawn(async move {
                if racer % 2 == 0 {
                    let resolution = record(&unit, holder.fencing_token());
                    let resolved = store.resolve_exact(&unit, holder.as_str(), &resolution);
                    resolved.await.unwrap() == Resolved::Recorded
                } else {
                    let token = remembered();
                    let begun = store.begin(&unit, &token, DAY, Fencing::On).await.unwrap();
                    matches!(
                        begun,
                        Begin::Acquired {
                            in_doubt: Some(_),
                            ..
                        }
                    )
                }
            });
        }
        let winners = racing
            .join_all()
            .await
            .into_iter()
            .filter(|won| *won)
            .count();
        assert_eq!(winners, 1, "round {round}");
    }
}
