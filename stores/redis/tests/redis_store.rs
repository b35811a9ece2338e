//! What is particular to `RedisStore`: commands per task on Redis and Valkey, memory per unit,
//! key layout, scripts, auth, failing closed.

use idempotask_test_support as support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::store::{StoreErrorKind, UnitOfWork};
use idempotask::{Error, Task};
use idempotask_redis::RedisStore;
use support::commandstats::{commands_run, reset_stats, stats};
use support::{RedisServer, scan_keys};

/// Input: a server and the command mix it must show for a fresh and a fenced fresh task.
/// Output: asserts them, that a duplicate is one `SET`, and that an invalid key never reaches
/// the server.
async fn assert_command_mix(
    server: &RedisServer,
    fresh_mix: &[(&str, u64)],
    fenced_mix: &[(&str, u64)],
) {
    static TASK: Task = Task::new("count_round_trips");
    static FENCED: Task = Task::new("count_round_trips").fencing(true);
    let store = server.store().await;
    let mut conn = server.connection().await;
    let run = |task: &'static Task, key: &'static str| {
        task.call(key)
            .store(store.clone())
            .run(async { Ok::<_, Error>(()) })
    };

    reset_stats(&mut conn).await;
    run(&TASK, "fresh").await.unwrap();
    assert_eq!(
        commands_run(&mut conn).await,
        stats(fresh_mix),
        "a fresh task"
    );

    // A duplicate is one plain SET NX GET, which writes nothing and answers the marker.
    reset_stats(&mut conn).await;
    run(&TASK, "fresh").await.unwrap();
    assert_eq!(
        commands_run(&mut conn).await,
        stats(&[("set", 1)]),
        "a duplicate"
    );

    reset_stats(&mut conn).await;
    run(&FENCED, "fenced").await.unwrap();
    assert_eq!(
        commands_run(&mut conn).await,
        stats(fenced_mix),
        "a fenced fresh task"
    );

    // An invalid key is refused before the server hears of it.
    reset_stats(&mut conn).await;
    assert!(matches!(run(&TASK, "").await, Err(Error::InvalidKey(_))));
    assert_eq!(commands_run(&mut conn).await, HashMap::new());
}

#[tokio::test]
async fn on_redis_7_a_fresh_task_is_a_set_and_one_script_and_a_duplicate_one_set() {
    // Client: SET NX GET, then EVALSHA of `finish` (which runs one GET and one SET).
    // Fenced: EVALSHA of `begin_fenced` (GET, TIME, SET) and of `finish` (GET, SET).
    assert_command_mix(
        &RedisServer::start(),
        &[("set", 2), ("evalsha", 1), ("get", 1)],
        &[("evalsha", 2), ("get", 2), ("time", 1), ("set", 2)],
    )
    .await;
}

#[tokio::test]
async fn on_valkey_8_1_a_fresh_task_is_two_plain_sets_and_no_script() {
    // Client: SET NX GET, then SET IFEQ. Fenced: the `begin_fenced` script, then SET IFEQ.
    assert_command_mix(
        &RedisServer::start_valkey(),
        &[("set", 2)],
        &[("evalsha", 1), ("get", 1), ("time", 1), ("set", 2)],
    )
    .await;
}

/// The whole Redis memory a completed unit leaves behind: `MEMORY USAGE` summed over every key.
async fn memory_of_a_completed_unit(server: &RedisServer) -> u64 {
    // A 29-character key and a `()` result, as a charge or an e-mail task stores them.
    let key = "order-charge-2026-11-30-00042";
    assert_eq!(key.len(), 29);
    let store = server.store().await;
    Task::new("charge_customer")
        .call(key)
        .store(store)
        .run(async { Ok::<_, Error>(()) })
        .await
        .unwrap();
    let mut conn = server.connection().await;
    let keys = scan_keys(&mut conn, "*").await;
    assert_eq!(keys.len(), 1, "one key per unit: {keys:?}");
    let mut total = 0;
    for key in &keys {
        let bytes: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
        total += bytes;
    }
    total
}

#[tokio::test]
async fn a_completed_unit_costs_at_most_160_bytes_on_redis_and_valkey() {
    for (name, server) in [
        ("Redis 7.0", RedisServer::start()),
        ("Valkey 8.1", RedisServer::start_valkey()),
    ] {
        let bytes = memory_of_a_completed_unit(&server).await;
        println!("{name}: a completed () unit takes {bytes} bytes");
        assert!(
            bytes <= 160,
            "{name}: a completed () unit takes {bytes} bytes"
        );
    }
}

#[tokio::test]
async fn one_key_per_unit_holds_no_caller_text_and_reads_as_text() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .namespace("billing")
        .connect()
        .await
        .unwrap();
    let key = "order:{42}\nsecret";
    let unit = UnitOfWork::new("charge", key).unwrap();
    Task::new("charge")
        .call(key)
        .store(store.clone())
        .run(async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let mut conn = server.connection().await;
    let keys = scan_keys(&mut conn, "*").await;
    let name = format!("idempotask:v2:billing:charge:{}", unit.digest());
    assert_eq!(keys, std::slice::from_ref(&name));
    assert_eq!(store.key(&unit), name);
    // An operator reads the caller key and the result with a plain GET.
    let marker: Vec<u8> = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    let text = String::from_utf8(marker.clone()).unwrap();
    let prefix = format!("D{},d", key.len());
    assert!(text.starts_with(&prefix), "{text:?}");
    assert!(text.ends_with(&format!("|{key}|1")), "{text:?}");
    let marker = idempotask::operator::Marker::decode(&marker).unwrap();
    assert_eq!(marker.key(), key);
    assert_eq!(marker.delivery().map(str::len), Some(4));
}

#[tokio::test]
async fn a_flushed_script_cache_heals_itself() {
    let server = RedisServer::start();
    let store = server.store().await;
    let mut conn = server.connection().await;
    let task = Task::new("flushed");
    let _: String = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let value: u32 = task
        .call("k")
        .store(store.clone())
        .run(async { Ok::<_, Error>(9) })
        .await
        .unwrap();
    let _: String = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let replayed: u32 = task
        .call("k")
        .store(store)
        .run(async { Ok::<_, Error>(10) })
        .await
        .unwrap();
    assert_eq!((value, replayed), (9, 9));
}

#[tokio::test]
async fn acl_users_authenticate_and_bad_credentials_are_a_configuration_error() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    // Only its own keys, and only reading, writing, scripts and the clock: no `@dangerous`
    // `INFO`.
    let _: String = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "worker",
                "on",
                ">s3cret",
                "~idempotask:*",
                "+@read",
                "+@write",
                "+@scripting",
                "+@connection",
                "+time",
            ][..],
        )
        .query_async(&mut conn)
        .await
        .unwrap();
    let url = format!("redis://worker:s3cret@127.0.0.1:{}", server.port());
    let store = RedisStore::connect(&url).await.unwrap();
    let value: u8 = Task::new("acl")
        .call("k")
        .store(store)
        .run(async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(value, 1);

    let wrong = format!("redis://worker:wrong@127.0.0.1:{}", server.port());
    let err = RedisStore::connect(&wrong).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    let err = RedisStore::builder(server.url())
        .namespace("bad:namespace")
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
}

#[tokio::test]
async fn an_unreachable_redis_fails_closed() {
    let server = RedisServer::start();
    let url = server.url();
    let store = RedisStore::builder(&url)
        .connection_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    drop(server);

    let ran = AtomicUsize::new(0);
    let result = Task::new("closed")
        .call("k")
        .store(store)
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u8, Error>(1)
        })
        .await;
    match result {
        Err(Error::Store(err)) => assert!(err.is_retryable(), "{err}"),
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the body ran without a confirmed lock"
    );

    let err = RedisStore::builder(&url)
        .connection_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unreachable, "{err}");
}

#[tokio::test]
async fn no_lock_keys_remain_after_many_calls() {
    let server = RedisServer::start();
    let store = Arc::new(server.store().await);
    let task = Arc::new(Task::new("cleanup"));
    let mut calls = Vec::new();
    for i in 0..200 {
        let (store, task) = (store.clone(), task.clone());
        calls.push(tokio::spawn(async move {
            let key = format!("k{}", i % 50);
            let result: Result<u32, Error> = task
                .call(key)
                .store(store)
                .run(async move {
                    if i % 7 == 0 {
                        Err(Error::NotConfigured)
                    } else {
                        Ok(i)
                    }
                })
                .await;
            result.is_ok()
        }));
    }
    for call in calls {
        call.await.unwrap();
    }
    let mut conn = server.connection().await;
    let mut locks = Vec::new();
    for key in scan_keys(&mut conn, "idempotask:*").await {
        let value: Vec<u8> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if value.first() == Some(&b'L') {
            locks.push(key);
        }
    }
    assert_eq!(locks, Vec::<String>::new());
}

/// A Valkey replaced by a Redis 7.0 at the same address and back again: the store falls back
/// to the scripts while Redis answers, and returns to the native compare-and-set once Valkey is
/// back, instead of staying on the scripts for its whole life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_compare_and_set_comes_back_after_a_fallback() {
    let mut server = RedisServer::start_valkey();
    let store = server.store().await;
    assert!(store.native_compare_and_set());
    let task =
        Task::new("swapped").retry(idempotask::RetryPolicy::new().max_wait(Duration::from_secs(5)));
    let deliver = |key: String| {
        let (task, store) = (task.clone(), store.clone());
        async move {
            task.call(key)
                .store(store)
                .run(async { Ok::<_, Error>(1_u8) })
                .await
        }
    };
    server.restart_as(support::Flavor::Redis);
    let mut key = 0;
    // The first finish on Redis 7.0 finds no `SET … IFEQ` and falls back; the work is done
    // either way (a call may fail while the connection comes back).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.native_compare_and_set() {
        assert!(
            std::time::Instant::now() < deadline,
            "the store never fell back to the scripts on Redis 7.0"
        );
        key += 1;
        let _ = deliver(format!("redis-{key}")).await;
    }
    assert_eq!(deliver("on-redis".to_owned()).await.unwrap(), 1);
    server.restart_as(support::Flavor::Valkey);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !store.native_compare_and_set() {
        assert!(
            std::time::Instant::now() < deadline,
            "the store never tried SET … IFEQ again after Valkey came back"
        );
        key += 1;
        let _ = deliver(format!("valkey-{key}")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(deliver("on-valkey".to_owned()).await.unwrap(), 1);
}
