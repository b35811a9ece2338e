//! Bad input: random keys, and values under a unit's key that idempotask did not write.

use super::*;

// 11. Bad input: random keys, corrupted and forged markers.
#[test]
fn s11_random_keys_never_collide_and_never_reach_the_key_name() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    let keys = "(?s)[a-z:{}\\n\\r\\t \\x00-\\x7f\\u{80}-\\u{10ffff}]{1,300}";
    let layout = idempotask_redis::RedisKeys::new("ns").unwrap();
    let redis_key = |key: &str| layout.unit(&UnitOfWork::new("task", key).unwrap());
    runner
        .run(&(keys, keys), |(a, b)| {
            let key = redis_key(&a);
            // One key per unit: no hash tag, and nothing of the caller's text in the name.
            prop_assert!(!key.contains(['{', '}']), "a hash tag in {}", key);
            prop_assert!(!key.contains(a.as_str()) || a.len() < 3);
            if a != b {
                prop_assert_ne!(&key, &redis_key(&b));
            }
            Ok(())
        })
        .unwrap();
    let too_long = "k".repeat(1025);
    assert!(UnitOfWork::new("task", too_long).is_err());
    assert!(UnitOfWork::new("task", "").is_err());
}

on_both_servers!(s11_corrupted_or_forged_markers_are_typed_errors_never_reruns);
async fn s11_corrupted_or_forged_markers_are_typed_errors_never_reruns(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let store = server.store().await;
    let mut conn = server.connection().await;
    // Markers that start like one (`D`) but are damaged, for the key they are stored under.
    let forged_for = |what: &str, key: &str| -> Vec<u8> {
        let len = key.len();
        match what {
            "bad header" => format!("Dxx|{key}|1").into_bytes(),
            "short key" => format!("D{}|{key}|1", len + 40).into_bytes(),
            "not json" => format!("D{len}|{key}|OK").into_bytes(),
            "not utf-8" => [format!("D{len}|{key}|").as_bytes(), b"\xff\xfe"].concat(),
            "wrong type" => format!("D{len}|{key}|\"text\"").into_bytes(),
            "8 MiB" => format!("D{len}|{key}|\"{}\"", "x".repeat(8 << 20)).into_bytes(),
            other => unreachable!("{other}"),
        }
    };
    let forged: Vec<&str> = vec![
        "bad header",
        "short key",
        "not json",
        "not utf-8",
        "wrong type",
        "8 MiB",
    ];
    let runs = AtomicU64::new(0);
    for what in &forged {
        let task = Task::new("s11");
        let key = format!("forged-{}", what.replace(' ', "-"));
        let bytes = &forged_for(what, &key);
        let unit = UnitOfWork::new("s11", key.as_str()).unwrap();
        let done = &store.key(&unit);
        let _: () = redis::cmd("SET")
            .arg(done)
            .arg(bytes.as_slice())
            .query_async(&mut conn)
            .await
            .unwrap();
        let result = task
            .call(key.as_str())
            .store(store.clone())
            .run(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Error>(1)
            })
            .await;
        assert!(
            matches!(result, Err(Error::Codec { .. })),
            "{what}: {result:?}"
        );
        let kept: Vec<u8> = redis::cmd("GET")
            .arg(done)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(&kept, bytes, "{what}: the marker was touched");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a forged marker made the body run"
    );
    record_on(
        server_flavor,
        "11. bad input",
        &format!(
            "2,000 random keys (unicode, `:`, `{{}}`, control characters, up to 300 chars): 0 collisions, no caller text in a key name; {} damaged markers (bad header, short key, not JSON, not UTF-8, wrong type, 8 MiB): typed `Codec` errors, 0 re-runs, 0 panics; a foreign value and a hash under a unit's key: typed errors naming the key",
            forged.len()
        ),
    );
}

on_both_servers!(s11_foreign_values_under_a_unit_key_are_typed_errors);
async fn s11_foreign_values_under_a_unit_key_are_typed_errors(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let store = server.store().await;
    let mut conn = server.connection().await;
    // A value that is neither a lock nor a marker is a typed error naming the key.
    let unit = UnitOfWork::new("s11", "foreign-value").unwrap();
    let _: () = redis::cmd("SET")
        .arg(store.key(&unit))
        .arg("\u{0}not-ours")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let foreign: Result<u64, Error> = Task::new("s11")
        .call("foreign-value")
        .store(store.clone())
        .run(async { Ok(1) })
        .await;
    assert!(
        matches!(&foreign, Err(Error::Store(err)) if err.to_string().contains(&store.key(&unit))),
        "{foreign:?}"
    );
    // A value of another type under the key: the same.
    let unit = UnitOfWork::new("s11", "wrong-type").unwrap();
    let _: () = redis::cmd("HSET")
        .arg(store.key(&unit))
        .arg("field")
        .arg("value")
        .query_async(&mut conn)
        .await
        .unwrap();
    let wrong_type: Result<u64, Error> = Task::new("s11")
        .call("wrong-type")
        .store(store.clone())
        .run(async { Ok(1) })
        .await;
    assert!(
        matches!(&wrong_type, Err(Error::Store(err))
            if err.kind() == idempotask::store::StoreErrorKind::Protocol
                && err.to_string().contains(&store.key(&unit))),
        "{wrong_type:?}"
    );
    // Someone else's lock, even with a token of another shape, is just busy.
    let unit = UnitOfWork::new("s11", "foreign-lock").unwrap();
    let _: () = redis::cmd("SET")
        .arg(store.key(&unit))
        .arg("Lnot-a-token")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let busy: Result<u64, Error> = Task::new("s11")
        .retry(RetryPolicy::no_wait())
        .call("foreign-lock")
        .store(store.clone())
        .run(async { Ok(1) })
        .await;
    assert!(matches!(busy, Err(Error::Contended { .. })), "{busy:?}");
}
