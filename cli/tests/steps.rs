//! `status` of a unit with steps, through the `idempotask` binary against a redis-server this
//! test starts: a unit that has not finished shows each step it recorded (position, name with
//! its key part, its value cut short or why it could not be stored) and where its next step
//! stands (running, in doubt, or waiting for the next delivery), in text and in `--json`; a
//! finished unit shows none, though Redis keeps its journal until it expires. `resolve --step`
//! records the step a unit in doubt is held at and frees it.

use std::time::Duration;

use idempotask_test_support as support;

use idempotask::Task;
use idempotask::store::{Begin, Fencing, LockToken, StepEntry, Store, UnitOfWork};
use serde_json::json as value;
use support::RedisServer;

mod common;

use common::{Backend, DOUBT_MEMORY, LONG, Redis};

/// How long a planted journal is kept.
const DAY: Duration = Duration::from_secs(86_400);

/// Takes `checkout`/`key`'s lock for `ttl` and records `entries` as its steps; answers the
/// token.
async fn plant(store: &impl Store, key: &str, ttl: Duration, entries: &[&str]) -> LockToken {
    let unit = UnitOfWork::new("checkout", key).unwrap();
    let token = LockToken::generate().with_doubt_memory(DOUBT_MEMORY);
    let Begin::Acquired { .. } = store.begin(&unit, &token, ttl, Fencing::Off).await.unwrap()
    else {
        panic!("{key} is not free");
    };
    for (position, entry) in (0..).zip(entries) {
        let entry = StepEntry::new(position, entry.as_bytes(), DAY);
        assert!(store.record_step(&unit, &token, entry, ttl).await.unwrap());
    }
    token
}

#[test]
fn a_failed_delivery_leaves_steps_that_the_next_one_replays() {
    let server = RedisServer::start();
    let redis = Redis(&server);
    // The receipt's value is over the task's limit: recorded as unstorable.
    let checkout = Task::named("checkout").max_step_bytes(200);
    let failed = redis.with_store(async |store| {
        checkout
            .call("order-1")
            .store(store)
            .run(async {
                let ctx = idempotask::context().expect("inside a task");
                ctx.step("reserve", async {
                    Ok::<_, idempotask::Error>(value!({"sku": "A-1"}))
                })
                .await?;
                ctx.step(("mail", "ada@example.com"), async {
                    Ok::<_, idempotask::Error>("x".repeat(100))
                })
                .await?;
                ctx.step("receipt", async {
                    Ok::<_, idempotask::Error>("r".repeat(300))
                })
                .await?;
                Err::<(), _>(idempotask::Error::NotConfigured)
            })
            .await
    });
    assert!(failed.is_err());

    let (code, out, _) = redis.idempotask(&["status", "--task", "checkout", "--key", "order-1"]);
    assert_eq!(code, 4, "released, the unit holds nothing: {out}");
    assert!(!out.contains("note:"), "the task has steps stored: {out}");
    assert!(
        out.contains(
            "\n  steps          3 recorded; the next delivery replays them and runs from step 3"
        ),
        "{out}"
    );
    assert!(
        out.contains("\n      0  reserve                {\"sku\":\"A-1\"}\n"),
        "{out}"
    );
    let cut = format!("\n      1  mail[ada@example.com]  \"{}…\n", "x".repeat(59));
    assert!(out.contains(&cut), "values are cut short: {out}");
    assert!(
        out.contains("\n      2  receipt                unstorable: "),
        "{out}"
    );

    let status = redis.status_json("checkout", "order-1");
    assert_eq!(status["state"], "unknown");
    assert_eq!(
        status["steps"][0],
        value!({"position": 0, "step": "reserve", "part": null, "ok": {"sku": "A-1"}})
    );
    assert_eq!(status["steps"][1]["part"], "ada@example.com");
    assert_eq!(status["steps"][1]["ok"], "x".repeat(100), "whole in JSON");
    assert!(status["steps"][2]["unstorable"].is_string(), "{status}");
    assert_eq!(
        status["next_step"],
        value!({"position": 3, "state": "waiting"})
    );
}

#[test]
fn a_locked_unit_runs_its_next_step_and_a_lapsed_one_has_it_in_doubt() {
    let server = RedisServer::start();
    let redis = Redis(&server);
    redis.with_store(async |store| {
        plant(&store, "order-2", LONG, &[r#"{"step":"charge","ok":null}"#]).await;
        let short = Duration::from_millis(100);
        plant(
            &store,
            "order-3",
            short,
            &[
                r#"{"step":"charge","ok":"ch_3"}"#,
                r#"{"step":"ledger","ok":7}"#,
            ],
        )
        .await;
        tokio::time::sleep(short + Duration::from_millis(50)).await;
    });

    let (code, out, _) = redis.idempotask(&["status", "--task", "checkout", "--key", "order-2"]);
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("\n  steps          1 recorded; step 1 is running now (unless the body is past its last step)\n      0  charge  null"),
        "{out}"
    );
    let status = redis.status_json("checkout", "order-2");
    assert_eq!(
        status["steps"],
        value!([{"position": 0, "step": "charge", "part": null, "ok": null}])
    );
    assert_eq!(
        status["next_step"],
        value!({"position": 1, "state": "running"})
    );

    let (code, out, _) = redis.idempotask(&["status", "--task", "checkout", "--key", "order-3"]);
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains("\n  steps          2 recorded; step 2 is the one in doubt: its effect may have happened without its record"),
        "{out}"
    );
    assert!(
        out.contains("\n      1  ledger  7\n  resolve it"),
        "the steps come before the advice: {out}"
    );
    let status = redis.status_json("checkout", "order-3");
    assert_eq!(
        status["next_step"],
        value!({"position": 2, "state": "in_doubt"})
    );
    assert_eq!(status["steps"][0]["ok"], "ch_3");
}

#[test]
fn units_without_steps_and_finished_units_show_none() {
    let server = RedisServer::start();
    let redis = Redis(&server);
    redis.lock("checkout", "plain");
    redis.with_store(async |store| {
        // Finished after a step: Redis keeps the journal until it expires, unread.
        let token = plant(&store, "done", LONG, &[r#"{"step":"charge","ok":1}"#]).await;
        let unit = UnitOfWork::new("checkout", "done").unwrap();
        let result = serde_json::value::to_raw_value(&1).unwrap();
        let marker = idempotask::operator::Marker::encode_resolution(&unit, None, &result);
        store.finish(&unit, &token, &marker, DAY).await.unwrap();
        assert_eq!(store.read_journal(&unit).await.unwrap().len(), 1);
    });

    let (code, out, _) = redis.idempotask(&["status", "--task", "checkout", "--key", "plain"]);
    assert_eq!(code, 3);
    assert!(!out.contains("steps"), "{out}");
    let status = redis.status_json("checkout", "plain");
    assert_eq!(
        (&status["steps"], &status["next_step"]),
        (&value!([]), &value!(null))
    );

    let (code, out, _) = redis.idempotask(&["status", "--task", "checkout", "--key", "done"]);
    assert_eq!(code, 0);
    assert!(!out.contains("steps"), "{out}");
    let status = redis.status_json("checkout", "done");
    assert!(status.get("steps").is_none(), "{status}");
}

#[test]
fn resolve_records_the_held_step_and_frees_the_unit() {
    let server = RedisServer::start();
    let redis = Redis(&server);
    let short = Duration::from_millis(100);
    redis.with_store(async |store| {
        plant(
            &store,
            "order-5",
            short,
            &[r#"{"step":"charge","ok":"ch_5"}"#],
        )
        .await;
        plant(
            &store,
            "order-6",
            LONG,
            &[r#"{"step":"charge","ok":"ch_6"}"#],
        )
        .await;
        tokio::time::sleep(short + Duration::from_millis(50)).await;
    });

    let resolve = |key: &str, extra: &[&str]| {
        let mut args = vec!["resolve", "--task", "checkout", "--key", key, "--yes"];
        args.extend_from_slice(extra);
        redis.idempotask(&args)
    };
    let (code, _, err) = resolve("order-5", &["--step-result", "7"]);
    assert_eq!(code, 2, "the step must be named: {err}");
    let (code, out, err) = resolve("order-6", &["--step", "ledger", "--step-result", "7"]);
    assert_eq!(code, 3, "a live lock is not in doubt: {out}{err}");

    let (code, out, err) = resolve(
        "order-5",
        &[
            "--step",
            "mail",
            "--part",
            "ada@example.com",
            "--step-result",
            r#"{"id":1}"#,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            r#"recorded step mail[ada@example.com] = {"id":1} of checkout "order-5" at position 1"#
        ),
        "{out}"
    );
    let status = redis.status_json("checkout", "order-5");
    assert_eq!(status["state"], "unknown", "freed: {status}");
    assert_eq!(
        status["steps"][1],
        value!({"position": 1, "step": "mail", "part": "ada@example.com", "ok": {"id": 1}})
    );
    assert_eq!(
        status["next_step"],
        value!({"position": 2, "state": "waiting"})
    );
    let (code, _, err) = resolve("order-5", &["--step", "mail", "--step-result", "7"]);
    assert_eq!(code, 4, "nothing is in doubt any more: {err}");
}

#[test]
fn free_keeps_the_journal_and_discard_steps_deletes_it() {
    let server = RedisServer::start();
    let redis = Redis(&server);
    let short = Duration::from_millis(100);
    redis.with_store(async |store| {
        for key in ["order-7", "order-8"] {
            plant(&store, key, short, &[r#"{"step":"charge","ok":"ch"}"#]).await;
        }
        tokio::time::sleep(short + Duration::from_millis(50)).await;
    });
    let free = |key: &str, extra: &[&str]| {
        let mut args = vec!["resolve", "--task", "checkout", "--key", key, "--yes"];
        args.extend_from_slice(extra);
        redis.idempotask(&args)
    };
    let (code, _, err) = free("order-7", &["--discard-steps", "--result", "1"]);
    assert_eq!(code, 2, "--discard-steps goes with --free alone: {err}");
    let (code, _, err) = free("order-7", &["--discard-steps"]);
    assert_eq!(code, 2, "{err}");

    // A plain free keeps the journal, and says what that means for a changed order.
    let (code, out, err) = free("order-7", &["--free"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("keeping its journal"), "{out}");
    assert!(out.contains("--discard-steps"), "{out}");
    assert_eq!(
        redis.status_json("checkout", "order-7")["steps"][0]["ok"],
        "ch"
    );

    let (code, out, err) = free("order-8", &["--free", "--discard-steps"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("deleted its journal of steps"), "{out}");
    let status = redis.status_json("checkout", "order-8");
    assert_eq!(
        (&status["state"], &status["steps"]),
        (&value!("unknown"), &value!([])),
        "{status}"
    );
}
