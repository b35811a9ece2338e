//! What is particular to `RedisStore`: round trips, key layout, scripts, auth, failing closed.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::{Error, RedisStore, StoreErrorKind, Task, UnitOfWork};
use support::{RedisServer, scan_keys};

/// Calls per command since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
async fn command_calls(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Commands the client sent between two `CONFIG RESETSTAT`s, leaving out the measuring
/// connection's own `INFO`/`CONFIG` and the commands that scripts run inside their one call
/// (commandstats counts those too; they cost no round trip).
fn client_commands(calls: &HashMap<String, u64>) -> HashMap<String, u64> {
    const INSIDE_SCRIPTS: [&str; 7] = ["get", "set", "incr", "del", "pttl", "pexpire", "time"];
    calls
        .iter()
        .filter(|(name, _)| !name.starts_with("config") && *name != "info")
        .filter(|(name, _)| !INSIDE_SCRIPTS.contains(&name.as_str()))
        .map(|(name, calls)| (name.clone(), *calls))
        .collect()
}

#[tokio::test]
async fn a_fresh_execution_costs_two_commands_and_a_duplicate_one() {
    static TASK: Task = Task::new("count_round_trips");
    let server = RedisServer::start();
    let store = server.store().await;
    let mut conn = server.connection().await;
    let run = |key: &'static str| {
        TASK.call(key)
            .store(store.clone())
            .run(async { Ok::<_, Error>(()) })
    };

    let _: String = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    run("fresh").await.unwrap();
    let fresh = command_calls(&mut conn).await;
    assert_eq!(
        client_commands(&fresh),
        HashMap::from([("evalsha".to_owned(), 2)]),
        "{fresh:?}"
    );
    // The two scripts' own commands: GET, SET NX, TIME, GET, SET (begin); GET, SET, DEL (finish).
    assert_eq!(fresh.get("set"), Some(&3), "{fresh:?}");

    let _: String = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    run("fresh").await.unwrap();
    let duplicate = command_calls(&mut conn).await;
    assert_eq!(
        client_commands(&duplicate),
        HashMap::from([("evalsha".to_owned(), 1)]),
        "{duplicate:?}"
    );
    assert_eq!(
        duplicate.get("set"),
        None,
        "a duplicate must not write: {duplicate:?}"
    );

    // An invalid key is refused before Redis hears of it.
    let _: String = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(matches!(run("").await, Err(Error::InvalidKey(_))));
    assert_eq!(
        client_commands(&command_calls(&mut conn).await),
        HashMap::new()
    );
}

#[tokio::test]
async fn redis_keys_share_a_slot_and_hold_no_caller_text() {
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
    let mut keys = scan_keys(&mut conn, "*").await;
    keys.sort();
    let tag = format!("idempotask:v1:{{billing:charge:{}}}", unit.digest());
    assert_eq!(keys, [format!("{tag}:done"), format!("{tag}:fence")]);
    assert_eq!(store.keys(&unit)[1], format!("{tag}:done"));
    // Redis Cluster hashes only what stands between the first `{` and the next `}`.
    let hash_tag = |key: &str| {
        let open = key.find('{').unwrap();
        let close = open + key[open..].find('}').unwrap();
        key[open + 1..close].to_owned()
    };
    let tags: Vec<String> = store.keys(&unit).iter().map(|k| hash_tag(k)).collect();
    assert!(
        tags.iter()
            .all(|t| *t == format!("billing:charge:{}", unit.digest())),
        "{tags:?}"
    );
    // The plain key is readable inside the marker, for operators.
    let marker: Vec<u8> = redis::cmd("GET")
        .arg(format!("{tag}:done"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let marker = idempotask::Marker::decode(&marker).unwrap();
    assert_eq!(marker.key(), key);
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
    let _: String = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "worker",
                "on",
                ">s3cret",
                "~idempotask:*",
                "+@all",
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
                .store_shared(store)
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
    assert_eq!(scan_keys(&mut conn, "*:lock").await, Vec::<String>::new());
}
