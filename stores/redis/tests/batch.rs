//! `RedisStore`'s batches: one command per unit in one pipeline, each unit answered as if
//! alone, whatever the other units' keys hold or the server forgot.

use idempotask_test_support as support;

use std::time::Duration;

use idempotask::store::{Begin, Claim, Completion, Fencing, Finish, Store, StoreErrorKind};
use idempotask::store::{LockToken, UnitOfWork};
use idempotask_redis::RedisStore;
use support::RedisServer;
use support::commandstats::{commands_run, reset_stats, stats};

const LOCK_TTL: Duration = Duration::from_secs(30);
const RESULT_TTL: Duration = Duration::from_secs(3600);

/// `n` units of one task, and a token for each.
fn units(n: usize, prefix: &str) -> (Vec<UnitOfWork>, Vec<LockToken>) {
    let units = (0..n)
        .map(|i| UnitOfWork::new("batch", format!("{prefix}-{i}")).unwrap())
        .collect();
    let tokens = (0..n).map(|_| LockToken::generate()).collect();
    (units, tokens)
}

fn claims<'a>(units: &'a [UnitOfWork], tokens: &'a [LockToken]) -> Vec<Claim<'a>> {
    units
        .iter()
        .zip(tokens)
        .map(|(unit, token)| Claim::new(unit, token))
        .collect()
}

fn completions<'a>(
    units: &'a [UnitOfWork],
    tokens: &'a [LockToken],
    markers: &'a [Vec<u8>],
) -> Vec<Completion<'a>> {
    units
        .iter()
        .zip(tokens)
        .zip(markers)
        .map(|((unit, token), marker)| Completion::new(unit, token, marker))
        .collect()
}

fn marker(unit: &UnitOfWork) -> Vec<u8> {
    let key = unit.key();
    format!(r#"D{}|{key}|"done""#, key.len()).into_bytes()
}

/// Input: a server and the commands a batch of ten completions is there. Output: asserts that
/// a batch of ten fresh units is ten `SET`s, its completion that mix, and a batch of their
/// duplicates ten `SET`s answering the markers.
async fn assert_batch_command_mix(server: &RedisServer, finish_mix: &[(&str, u64)]) {
    let store = server.store().await;
    assert!(
        store.batches_natively(),
        "a store of one server pipelines its batches: the queue consumers should batch its calls"
    );
    let mut conn = server.connection().await;
    let (units, tokens) = units(10, "mix");

    reset_stats(&mut conn).await;
    let answers = store
        .begin_batch(&claims(&units, &tokens), LOCK_TTL, Fencing::Off)
        .await;
    assert_eq!(commands_run(&mut conn).await, stats(&[("set", 10)]));
    assert!(
        answers
            .iter()
            .all(|answer| matches!(answer, Ok(Begin::Acquired { .. }))),
        "{answers:?}"
    );

    let markers: Vec<Vec<u8>> = units.iter().map(marker).collect();
    let completions = completions(&units, &tokens, &markers);
    reset_stats(&mut conn).await;
    let answers = store.finish_batch(&completions, RESULT_TTL).await;
    assert_eq!(commands_run(&mut conn).await, stats(finish_mix));
    assert!(
        answers
            .iter()
            .all(|answer| matches!(answer, Ok(Finish::Completed))),
        "{answers:?}"
    );

    let (_, others) = self::units(10, "mix");
    reset_stats(&mut conn).await;
    let answers = store
        .begin_batch(&claims(&units, &others), LOCK_TTL, Fencing::Off)
        .await;
    assert_eq!(commands_run(&mut conn).await, stats(&[("set", 10)]));
    for (answer, marker) in answers.into_iter().zip(&markers) {
        assert_eq!(answer.unwrap(), Begin::Done(marker.clone()));
    }
}

#[tokio::test]
async fn on_redis_7_a_batch_is_one_command_per_unit() {
    // Each completion is an EVALSHA of `finish` (one GET and one SET inside).
    assert_batch_command_mix(
        &RedisServer::start(),
        &[("evalsha", 10), ("get", 10), ("set", 10)],
    )
    .await;
}

#[tokio::test]
async fn on_valkey_8_1_a_batch_is_one_plain_set_per_unit() {
    assert_batch_command_mix(&RedisServer::start_valkey(), &[("set", 10)]).await;
}

/// Input: a store whose units 1 and 2 hold values that are not idempotask's. Output: asserts
/// that a batch answers those two with a protocol error naming their key and every other unit
/// as if alone, for a begin and a finish, and that the foreign values are untouched.
async fn assert_foreign_values_fail_only_their_units(server: &RedisServer) {
    let store = server.store().await;
    let mut conn = server.connection().await;
    let (units, tokens) = units(4, "foreign");
    let key = |i: usize| store.key(&units[i]);
    let _: i64 = redis::cmd("RPUSH")
        .arg(key(1))
        .arg("a list")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(key(2))
        .arg("someone else's value")
        .query_async(&mut conn)
        .await
        .unwrap();

    for fencing in [Fencing::Off, Fencing::On] {
        let answers = store
            .begin_batch(&claims(&units, &tokens), LOCK_TTL, fencing)
            .await;
        assert_eq!(answers.len(), 4);
        for i in [0, 3] {
            assert!(
                matches!(answers[i], Ok(Begin::Acquired { .. })),
                "unit {i} ({fencing:?}): {:?}",
                answers[i]
            );
        }
        for i in [1, 2] {
            let err = answers[i].as_ref().unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Protocol, "unit {i}: {err}");
            assert!(err.to_string().contains(&key(i)), "unit {i}: {err}");
        }
    }

    let markers: Vec<Vec<u8>> = units.iter().map(marker).collect();
    let completions = completions(&units, &tokens, &markers);
    let answers = store.finish_batch(&completions, RESULT_TTL).await;
    assert_eq!(answers.len(), 4);
    for i in [0, 3] {
        assert_eq!(answers[i].as_ref().unwrap(), &Finish::Completed, "unit {i}");
    }
    // Another value at the key: never overwritten, whether the store says so as an error
    // (a list) or as a lock lost with nothing written (a string, as another holder's).
    assert!(answers[1].is_err(), "{:?}", answers[1]);
    assert!(
        matches!(
            answers[2],
            Ok(Finish::LockLost {
                marker_written: false,
                ..
            }) | Err(_)
        ),
        "{:?}",
        answers[2]
    );
    let list: Vec<String> = redis::cmd("LRANGE")
        .arg(key(1))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(list, ["a list"]);
    let value: String = redis::cmd("GET")
        .arg(key(2))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, "someone else's value");
}

#[tokio::test]
async fn on_redis_7_a_foreign_value_fails_only_its_unit() {
    assert_foreign_values_fail_only_their_units(&RedisServer::start()).await;
}

#[tokio::test]
async fn on_valkey_8_1_a_foreign_value_fails_only_its_unit() {
    assert_foreign_values_fail_only_their_units(&RedisServer::start_valkey()).await;
}

/// A server that lost its scripts (a restart, a `SCRIPT FLUSH`, a promoted replica) answers
/// `NOSCRIPT` to each unit's `EVALSHA` without running it; each unit is then sent again alone,
/// once the script is loaded.
#[tokio::test]
async fn a_batch_after_the_server_lost_its_scripts_answers_every_unit() {
    let server = RedisServer::start();
    let store = server.store().await;
    let mut conn = server.connection().await;
    let flush = |mut conn: redis::aio::MultiplexedConnection| async move {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
    };
    let (units, tokens) = units(3, "noscript");

    flush(conn.clone()).await;
    let answers = store
        .begin_batch(&claims(&units, &tokens), LOCK_TTL, Fencing::On)
        .await;
    let mut granted = Vec::new();
    for (answer, token) in answers.into_iter().zip(&tokens) {
        match answer.unwrap() {
            Begin::Acquired {
                fencing_token: Some(fence),
                ..
            } => granted.push(token.clone().with_fencing_token(fence)),
            other => panic!("expected a fenced grant, got {other:?}"),
        }
    }

    flush(conn.clone()).await;
    let markers: Vec<Vec<u8>> = units.iter().map(marker).collect();
    let completions = completions(&units, &granted, &markers);
    for answer in store.finish_batch(&completions, RESULT_TTL).await {
        assert_eq!(answer.unwrap(), Finish::Completed);
    }
    for (unit, marker) in units.iter().zip(&markers) {
        let value: Vec<u8> = redis::cmd("GET")
            .arg(store.key(unit))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(&value, marker);
    }
}

/// A server that is gone fails the batch closed: one error per unit, none of them a grant.
#[tokio::test]
async fn a_batch_to_a_server_that_is_gone_answers_an_error_per_unit() {
    let server = RedisServer::start();
    let store: RedisStore = server.store().await;
    drop(server);
    let (units, tokens) = units(5, "gone");
    for fencing in [Fencing::Off, Fencing::On] {
        let answers = store
            .begin_batch(&claims(&units, &tokens), LOCK_TTL, fencing)
            .await;
        assert_eq!(answers.len(), 5);
        for answer in answers {
            assert!(answer.is_err(), "{answer:?}");
        }
    }
}

/// A batch's completions sent as `SET … IFEQ` to a server that turned out not to have it (a
/// failover to an older replica) are refused before anything runs, and each unit is recorded
/// by the script instead; the store then uses the scripts for later batches.
#[tokio::test]
async fn a_batch_finish_on_a_server_without_ifeq_falls_back_per_unit() {
    let mut server = RedisServer::start_valkey();
    let store = server.store().await;
    assert!(store.native_compare_and_set());
    server.restart_as(support::Flavor::Redis);
    let (units, tokens) = units(4, "fallback");
    // The connection comes back on its own after the restart; a begin may fail meanwhile.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let answers = loop {
        let answers = store
            .begin_batch(&claims(&units, &tokens), LOCK_TTL, Fencing::Off)
            .await;
        if answers.iter().all(Result::is_ok) {
            break answers;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Redis never answered after the restart: {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        answers
            .iter()
            .all(|answer| matches!(answer, Ok(Begin::Acquired { .. }))),
        "{answers:?}"
    );
    let markers: Vec<Vec<u8>> = units.iter().map(marker).collect();
    let completions = completions(&units, &tokens, &markers);
    for answer in store.finish_batch(&completions, RESULT_TTL).await {
        assert_eq!(answer.unwrap(), Finish::Completed);
    }
    assert!(
        !store.native_compare_and_set(),
        "the store still believes in SET … IFEQ"
    );
    let mut conn = server.connection().await;
    for (unit, marker) in units.iter().zip(&markers) {
        let value: Vec<u8> = redis::cmd("GET")
            .arg(store.key(unit))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(&value, marker);
    }
}
