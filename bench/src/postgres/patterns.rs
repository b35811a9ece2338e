//! The code each PostgreSQL mode measures besides idempotask's: the hand-written patterns, on
//! their own table and on the store's, and the transactional modes' side effect.

use sqlx::PgPool;

use crate::BenchError;

/// One side effect of a transactional task: a row.
pub(super) async fn effect(db: &mut sqlx::PgConnection, key: &str) -> Result<(), BenchError> {
    sqlx::query("INSERT INTO bench_effects (key) VALUES ($1)")
        .bind(key)
        .execute(db)
        .await?;
    Ok(())
}

/// The hand-written pattern: claim the key, or read what the first delivery stored.
pub(super) async fn handwritten(pool: &PgPool, key: &str) -> Result<(), BenchError> {
    let token = format!("{:032x}", rand::random::<u128>());
    let claimed = sqlx::query(
        "INSERT INTO bench_handwritten (key, token, done, expires_at)
         VALUES ($1, $2, false, now() + interval '30 seconds') ON CONFLICT (key) DO NOTHING",
    )
    .bind(key)
    .bind(&token)
    .execute(pool)
    .await?;
    if claimed.rows_affected() == 1 {
        sqlx::query(
            "UPDATE bench_handwritten SET done = true, result = '7', token = NULL,
                 expires_at = now() + interval '1 day'
             WHERE key = $1 AND token = $2",
        )
        .bind(key)
        .bind(&token)
        .execute(pool)
        .await?;
    } else {
        let (done, _result): (bool, Option<String>) =
            sqlx::query_as("SELECT done, result FROM bench_handwritten WHERE key = $1")
                .bind(key)
                .fetch_one(pool)
                .await?;
        if !done {
            return Err(BenchError(format!("{key} is still locked")));
        }
    }
    Ok(())
}

/// The hand-written pattern inside one transaction with the side effect.
pub(super) async fn handwritten_transactional(pool: &PgPool, key: &str) -> Result<(), BenchError> {
    let mut transaction = pool.begin().await?;
    let claimed = sqlx::query(
        "INSERT INTO bench_handwritten (key, token, done, expires_at)
         VALUES ($1, NULL, false, now() + interval '30 seconds') ON CONFLICT (key) DO NOTHING",
    )
    .bind(key)
    .execute(&mut *transaction)
    .await?;
    if claimed.rows_affected() == 1 {
        effect(&mut transaction, key).await?;
        sqlx::query(
            "UPDATE bench_handwritten SET done = true, result = '7',
                 expires_at = now() + interval '1 day' WHERE key = $1",
        )
        .bind(key)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
    } else {
        let _: Option<String> =
            sqlx::query_scalar("SELECT result FROM bench_handwritten WHERE key = $1")
                .bind(key)
                .fetch_one(&mut *transaction)
                .await?;
        transaction.rollback().await?;
    }
    Ok(())
}

/// The statements of `pg-transactional-table-floor` on the store's table, written once.
pub(super) struct FloorSql {
    claim: String,
    complete: String,
}

impl FloorSql {
    pub(super) fn on(table: &str) -> Self {
        Self {
            claim: format!(
                "INSERT INTO {table} (task, key, state, token, expires_at, doubt_memory)
                 VALUES ($1, $2, 'locked', $3, now() + interval '30 seconds', interval '1 day')
                 ON CONFLICT DO NOTHING"
            ),
            complete: format!(
                "UPDATE {table} SET state = 'done', token = NULL, marker = $3,
                     expires_at = now() + interval '1 day' WHERE task = $1 AND key = $2"
            ),
        }
    }
}

/// The hand-written transactional pattern on the store's own table: a lock row inserted
/// unless the unit has one (with a token and a doubt memory, as the store writes a default
/// task's), the side effect, the row turned into a completion marker of the store's shape, one
/// commit; the unit is `task`'s. No expiry, doubt or fencing is looked at: this is what the
/// table costs, not a store.
pub(super) async fn table_floor(
    pool: &PgPool,
    sql: &FloorSql,
    task: &str,
    key: &str,
) -> Result<(), BenchError> {
    let token = format!("{:032x}", rand::random::<u128>());
    let mut transaction = pool.begin().await?;
    // The table's name is the store's, which checked it.
    let claimed = sqlx::query(sqlx::AssertSqlSafe(sql.claim.as_str()))
        .bind(task)
        .bind(key.as_bytes())
        .bind(&token)
        .execute(&mut *transaction)
        .await?;
    if claimed.rows_affected() != 1 {
        return Err(BenchError(format!("{key} was claimed before")));
    }
    effect(&mut transaction, key).await?;
    let marker = format!("D{},d{}|{key}|7", key.len(), &token[..6]);
    sqlx::query(sqlx::AssertSqlSafe(sql.complete.as_str()))
        .bind(task)
        .bind(key.as_bytes())
        .bind(marker.as_bytes())
        .execute(&mut *transaction)
        .await?;
    transaction.commit().await?;
    Ok(())
}
