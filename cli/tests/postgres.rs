//! The `idempotask` binary against a PostgreSQL server this test starts: `status`, `forget`,
//! `list` and `resolve` on a `PostgresStore`'s table, with the exit codes and the confirmation
//! they have on Redis, a `forget` that deletes only the marker it showed, and a `resolve` that
//! writes only over the lock in doubt it showed.

use idempotask_test_support as support;

use std::process::{Command, Stdio};

use idempotask::Task;
use idempotask::operator::Forgot;
use idempotask::store::UnitOfWork;
use idempotask_postgres::PostgresStore;
use idempotask_postgres::operator::UnitState;
use support::postgres::PostgresServer;

mod common;

use common::{Backend, Postgres, complete_on, json};

/// Runs the binary with `args` against `url`.
fn idempotask(url: &str, args: &[&str]) -> (i32, String, String) {
    common::run("--database-url", url, args)
}

/// The marker bytes stored for `task`/`key`, if it is done.
async fn marker_of(store: &PostgresStore, task: &str, key: &str) -> Option<Vec<u8>> {
    let unit = UnitOfWork::new(task, key).unwrap();
    match store.read_unit(&unit).await.unwrap()?.state {
        UnitState::Done { marker, .. } => Some(marker),
        _ => None,
    }
}

#[test]
fn status_on_postgres_says_done_locked_or_unknown() {
    let pg = Postgres::start();
    pg.complete("charge", &["order-1"]);
    pg.lock("charge", "order-2");
    let (done, locked) = common::status_says_done_locked_or_unknown(&pg);
    assert_eq!(done["table"], "idempotask_units");
    assert_eq!(locked["lock_expires"], true);
    assert!(locked["lock_ttl_ms"].as_u64().unwrap() > 500_000);
    assert!(locked["fencing_token"].as_u64().unwrap() > 0);

    let (code, out, _) = pg.idempotask(&["status", "--task", "nope", "--key", "order-1"]);
    assert_eq!(code, 4);
    assert!(
        out.contains(
            "task `nope` has no keys at all in table `idempotask_units`; check --task and --table"
        ),
        "{out}"
    );
}

#[test]
fn forget_on_postgres_refuses_a_lock_and_deletes_a_confirmed_marker() {
    let pg = Postgres::start();
    pg.complete("charge", &["order-1"]);
    pg.lock("charge", "order-2");
    let forgot = common::forget_refuses_a_lock_and_deletes_a_confirmed_marker(&pg);
    assert_eq!(forgot["forced"], false);
    assert!(forgot["fencing_token"].as_u64().unwrap() > 0);
    let (code, _, err) =
        pg.idempotask(&["forget", "--yes", "--task", "charge", "--key", "order-1"]);
    assert_eq!(code, 4);
    assert!(
        err.contains("nothing to forget: task `charge` has no marker for key `order-1` in table `idempotask_units`"),
        "{err}"
    );

    // The next delivery runs the work again, and the fencing counter went on.
    pg.rt.block_on(async {
        let ran = Task::named("charge")
            .fencing(true)
            .call("order-1")
            .store(pg.store.clone())
            .run(async { Ok::<_, idempotask::Error>(7) })
            .await
            .unwrap();
        assert_eq!(ran, 7);
    });
}

// `forget` shows a marker, asks, then deletes it only if the row still holds those bytes: a
// marker that a newer delivery wrote while the operator read the question stays.
#[test]
fn forget_on_postgres_deletes_only_the_marker_it_showed() {
    let pg = Postgres::start();
    let (rt, store) = (&pg.rt, &pg.store);
    pg.complete("charge", &["order-1"]);
    let newer = rt.block_on(async {
        // A newer marker of the same unit: the same task run in a table of its own.
        let builder = PostgresStore::builder(pg.server.pool(2).await).table("other_units");
        builder.migrate().await.unwrap();
        let other = builder.connect().await.unwrap();
        complete_on(&other, "charge", &["order-1"]).await;
        marker_of(&other, "charge", "order-1").await.unwrap()
    });
    let shown = rt.block_on(marker_of(store, "charge", "order-1"));
    assert_ne!(shown.as_ref(), Some(&newer));

    common::forget_keeps_a_marker_written_while_it_asks(&pg, || {
        rt.block_on(async {
            sqlx::query("UPDATE idempotask_units SET marker = $1 WHERE task = 'charge'")
                .bind(&newer)
                .execute(store.pool())
                .await
                .unwrap();
        });
    });
    assert_eq!(
        rt.block_on(marker_of(store, "charge", "order-1")),
        Some(newer.clone()),
        "the newer marker stays"
    );

    // The store's call itself: the shown bytes are gone, so nothing is deleted; the newer
    // ones are; then the row is gone.
    rt.block_on(async {
        let unit = UnitOfWork::new("charge", "order-1").unwrap();
        let forget = |bytes: Vec<u8>| {
            let store = store.clone();
            let unit = unit.clone();
            async move { store.forget_exact(&unit, &bytes).await.unwrap() }
        };
        assert_eq!(forget(shown.unwrap()).await, Forgot::Changed);
        assert_eq!(forget(newer.clone()).await, Forgot::Deleted);
        assert_eq!(forget(newer).await, Forgot::Gone);
    });
}

#[test]
fn list_on_postgres_counts_and_filters_with_plain_keys() {
    let pg = Postgres::start();
    let url = pg.url();
    pg.complete("charge", &["order-1", "order-3"]);
    pg.lock("charge", "order-2");
    pg.complete("refund", &["order-1"]);

    let (code, out, _) = idempotask(&url, &["list", "--task", "charge"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("charge in table idempotask_units: 2 done, 1 locked"),
        "{out}"
    );
    assert!(out.contains("done    \"order-1\""), "{out}");
    assert!(out.contains("locked  \"order-2\""), "{out}");

    let listed = json(&idempotask(&url, &["list", "--json", "--task", "charge"]).1);
    assert_eq!(listed["table"], "idempotask_units");
    assert_eq!(
        (listed["done"].as_u64(), listed["locked"].as_u64()),
        (Some(2), Some(1))
    );
    let entries = listed["entries"].as_array().unwrap();
    let keys: Vec<&str> = entries.iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(keys.len(), 3);
    for key in ["order-1", "order-2", "order-3"] {
        assert!(keys.contains(&key), "{keys:?}");
    }
    let done = entries.iter().find(|e| e["key"] == "order-3").unwrap();
    assert_eq!(done["result"]["charge"], "ch_order-3");

    let locked = json(&idempotask(&url, &["list", "--json", "--locked", "--task", "charge"]).1);
    let entries = locked["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["key"], "order-2");
    assert_eq!(locked["done"], 2, "the counts are the task's");

    let (code, _, err) = idempotask(&url, &["list", "--task", "nope"]);
    assert_eq!(code, 4);
    assert!(
        err.contains(
            "unknown task: `nope` has no keys in table `idempotask_units`; check --task and --table"
        ),
        "{err}"
    );
}

#[test]
fn list_pages_through_more_units_than_one_page_and_table_selects_the_table() {
    let server = PostgresServer::start();
    let url = server.url();
    common::runtime().block_on(async {
        let builder = PostgresStore::builder(server.pool(4).await).table("jobs.units");
        builder.migrate().await.unwrap();
        let store = builder.connect().await.unwrap();
        // Rows written directly: a page is 1000 rows.
        let marker = {
            complete_on(&store, "charge", &["seed"]).await;
            marker_of(&store, "charge", "seed").await.unwrap()
        };
        sqlx::query(
            "INSERT INTO jobs.units (task, key, state, marker, expires_at)
             SELECT 'bulk', convert_to('k' || i, 'UTF8'), 'done', $1, now() + interval '1 hour'
             FROM generate_series(1, 2500) i",
        )
        .bind(&marker)
        .execute(store.pool())
        .await
        .unwrap();
    });
    let (code, out, _) = idempotask(
        &url,
        &["list", "--json", "--table", "jobs.units", "--task", "bulk"],
    );
    assert_eq!(code, 0);
    let listed = json(&out);
    // The markers name the key `seed`, not the rows' keys: every one is flagged, and counted.
    assert_eq!(listed["done"], 2500);
    assert_eq!(listed["flagged"], 2500);
    assert_eq!(listed["entries"].as_array().unwrap().len(), 2500);
    // The default table has no such task.
    let (code, _, err) = idempotask(&url, &["list", "--task", "bulk"]);
    assert_eq!(code, 1, "the default table was never created: {err}");
    assert!(err.contains("PostgresStore::migrate"), "{err}");
}

// An application's environment often has `REDIS_URL` and `DATABASE_URL` both: the flag typed
// decides, and with neither typed the command refuses to guess which store to inspect.
#[test]
fn database_url_selects_postgres_and_a_typed_flag_wins_over_the_environment() {
    let pg = Postgres::start();
    let url = pg.url();
    pg.complete("charge", &["order-1"]);
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_idempotask"));
        command
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .args(args)
            .stdin(Stdio::null());
        for (name, value) in env {
            command.env(name, value);
        }
        let output = command.output().unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        (output.status.code().unwrap(), stderr)
    };
    let status = ["status", "--task", "charge", "--key", "order-1"];
    assert_eq!(run(&[("DATABASE_URL", &url)], &status).0, 0);

    let unreachable_redis = "redis://127.0.0.1:1";
    let both = [
        ("DATABASE_URL", url.as_str()),
        ("REDIS_URL", unreachable_redis),
    ];
    let (code, err) = run(&both, &status);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("both REDIS_URL and DATABASE_URL are set"),
        "{err}"
    );

    let mut typed = vec!["--database-url", url.as_str()];
    typed.extend(status);
    assert_eq!(run(&both, &typed).0, 0, "the typed flag decides");
    let mut typed = vec!["--redis-url", unreachable_redis];
    typed.extend(status);
    let (code, err) = run(&[("DATABASE_URL", &url)], &typed);
    assert_eq!(code, 1, "Redis was asked: {err}");
    assert!(err.contains("nothing answers at redis://"), "{err}");
}

#[test]
fn forget_force_on_postgres_deletes_an_unreadable_marker_but_never_a_lock() {
    let pg = Postgres::start();
    let url = pg.url();
    pg.complete("charge", &["order-1"]);
    pg.lock("charge", "order-2");
    pg.rt.block_on(async {
        sqlx::query("UPDATE idempotask_units SET marker = 'Dnot a marker' WHERE key = 'order-1'")
            .execute(pg.store.pool())
            .await
            .unwrap();
    });
    let unit = ["--task", "charge", "--key", "order-1"];
    let with = |first: &[&'static str]| {
        let mut args = first.to_vec();
        args.extend(unit);
        args
    };
    let (code, out, err) = idempotask(&url, &with(&["status", "--json"]));
    assert_eq!(code, 1, "{err}");
    assert_eq!(json(&out)["error"]["kind"], "unreadable");
    let (code, _, err) = idempotask(&url, &with(&["forget", "--yes"]));
    assert_eq!(code, 1);
    assert!(err.contains("pass --force"), "{err}");
    let (code, out, _) = idempotask(&url, &with(&["forget", "--yes", "--force", "--json"]));
    assert_eq!(code, 0);
    assert_eq!(json(&out)["forced"], true);
    assert_eq!(idempotask(&url, &with(&["status"])).0, 4);

    let (code, _, _) = idempotask(
        &url,
        &[
            "forget", "--yes", "--force", "--task", "charge", "--key", "order-2",
        ],
    );
    assert_eq!(code, 3, "never a lock");
    assert_eq!(
        idempotask(&url, &["status", "--task", "charge", "--key", "order-2"]).0,
        3
    );
}

#[test]
fn status_list_and_forget_show_a_unit_in_doubt_on_postgres() {
    let pg = Postgres::start();
    let out = common::status_list_and_forget_show_a_unit_in_doubt(&pg);
    // The row names its caller key, a lock in doubt's too.
    assert!(out.contains("\ndoubt   \"order-3\""), "{out}");
}

#[test]
fn a_result_recorded_on_postgres_is_what_the_next_delivery_gets_back() {
    common::a_recorded_result_is_what_the_next_delivery_gets_back(&Postgres::start());
}

// A fenced unit's row keeps its fencing counter when it is freed, as a release leaves it; an
// unfenced unit's row goes.
#[test]
fn a_unit_freed_on_postgres_runs_as_new_and_a_fenced_one_keeps_its_counter() {
    let pg = Postgres::start();
    common::a_freed_unit_runs_as_new_with_no_doubt(&pg, || {
        let rows: Vec<(String, Option<String>, Option<i64>)> = pg.rt.block_on(async {
            sqlx::query_as(
                "SELECT convert_from(key, 'UTF8'), token, fence FROM idempotask_units
                 WHERE task = 'charge' ORDER BY key",
            )
            .fetch_all(pg.store.pool())
            .await
            .unwrap()
        });
        assert!(
            matches!(rows.as_slice(), [(key, None, Some(_))] if key == "order-1"),
            "{rows:?}"
        );
    });
}

#[test]
fn resolve_on_postgres_refuses_a_unit_not_in_doubt() {
    common::resolve_refuses_a_unit_not_in_doubt(&Postgres::start());
}

#[test]
fn resolve_on_postgres_leaves_alone_a_unit_that_changed_while_it_asked() {
    common::resolve_leaves_alone_a_unit_that_changed_while_it_asked(&Postgres::start());
}

/// A unit held at a step inside a transaction has no row in the units table, only its attempt
/// in doubt (a transaction that neither runs nor committed, in doubt for two hours): `list
/// --held --older-than` finds it by that age, `status` shows it in doubt, and `resolve --free`
/// ends its hold.
#[test]
fn a_step_held_in_a_transaction_is_listed_by_age_and_freed() {
    let pg = Postgres::start();
    pg.rt.block_on(async {
        let pool = pg.server.pool(1).await;
        let mut rolled_back = pool.begin().await.unwrap();
        let xid: i64 = sqlx::query_scalar("SELECT pg_current_xact_id()::text::bigint")
            .fetch_one(&mut *rolled_back)
            .await
            .unwrap();
        rolled_back.rollback().await.unwrap();
        sqlx::query(
            "INSERT INTO idempotask_units_runs
                 (task, key, xid, fence, started_at, expires_at, doubt_fence, doubt_since)
             VALUES ('mail', 'order-9'::bytea, $1, NULL, now() - interval '2 hours',
                     now() + interval '1 day', NULL, now() - interval '2 hours')",
        )
        .bind(xid)
        .execute(&pool)
        .await
        .unwrap();
    });
    let held = |older_than| common::held_older_than(&pg, "mail", older_than);
    assert_eq!(held("1h"), 1);
    assert_eq!(held("3h"), 0);
    assert_eq!(pg.status_json("mail", "order-9")["state"], "in_doubt");

    let (code, out, err) = pg.idempotask(&[
        "resolve", "--task", "mail", "--key", "order-9", "--yes", "--free",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(pg.status_json("mail", "order-9")["state"], "unknown");
}
