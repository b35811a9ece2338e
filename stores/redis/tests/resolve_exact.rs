//! `resolve_exact`, the operator's compare-and-set for units in doubt, on Redis 7 and Valkey 8.1:
//! it records a result or frees the unit only while the key holds exactly the lock that was
//! read, still run out; whatever happened meanwhile (the holder came back, the memory ran out,
//! another resolve) is left as it is.

use idempotask_test_support as support;

use std::time::Duration;

use idempotask::operator::{Marker, Resolution, Resolved, Status};
use idempotask::store::{Begin, Fencing, LockToken, Store, StoreErrorKind, UnitOfWork};
use idempotask::{Outcome, Task};
use idempotask_redis::RedisStore;
use idempotask_redis::operator::Stored;
use serde_json::value::RawValue;
use support::RedisServer;

const LOCK_TTL: Duration = Duration::from_millis(100);

/// Leaves `key` of `task` in doubt, remembered for `memory`; answers the token of the delivery
/// that abandoned it, with the fencing token it was granted.
async fn abandon(store: &RedisStore, key: &str, memory: Duration) -> LockToken {
    let unit = UnitOfWork::new("charge", key).unwrap();
    let token = LockToken::generate().with_doubt_memory(memory);
    let Begin::Acquired { fencing_token, .. } = store
        .begin(&unit, &token, LOCK_TTL, Fencing::On)
        .await
        .unwrap()
    else {
        panic!("{key} was free");
    };
    tokio::time::sleep(LOCK_TTL + Duration::from_millis(50)).await;
    token.with_fencing_token(fencing_token.unwrap())
}

/// The bytes of `key`'s lock in doubt, as an operator is shown them.
async fn shown(store: &RedisStore, key: &str) -> Vec<u8> {
    let unit = UnitOfWork::new("charge", key).unwrap();
    match store.read_unit(&unit).await.unwrap().into_stored() {
        Stored::InDoubt { bytes, .. } => bytes,
        other => panic!("{key} is not in doubt: {other:?}"),
    }
}

/// `resolve_exact` of `key` against `lock`.
async fn resolve(store: &RedisStore, key: &str, lock: &[u8], resolution: &Resolution) -> Resolved {
    let unit = UnitOfWork::new("charge", key).unwrap();
    store.resolve_exact(&unit, lock, resolution).await.unwrap()
}

fn record(unit: &UnitOfWork, fencing_token: Option<u64>, json: &str) -> Resolution {
    let result = RawValue::from_string(json.to_owned()).unwrap();
    let marker = Marker::encode_resolution(unit, fencing_token, &result);
    Resolution::record(marker, Duration::from_secs(3600))
}

async fn resolve_exact_acts_only_on_the_lock_shown(server: &RedisServer) {
    let store = server.store().await;
    let memory = Duration::from_secs(60);
    let unit = |key: &str| UnitOfWork::new("charge", key).unwrap();

    // Recorded: every delivery gets the result back; the same resolve again changes nothing.
    let abandoned = abandon(&store, "recorded", memory).await;
    let lock = shown(&store, "recorded").await;
    let resolution = record(&unit("recorded"), abandoned.fencing_token(), r#""ch_1""#);
    for expected in [Resolved::Recorded, Resolved::Changed] {
        assert_eq!(
            resolve(&store, "recorded", &lock, &resolution).await,
            expected
        );
    }
    let report = Task::named("charge")
        .call("recorded")
        .store(store.clone())
        .run_reported(async { Ok::<String, idempotask::Error>("ran again".into()) })
        .await
        .unwrap();
    assert_eq!(
        (report.outcome, report.value.as_str()),
        (Outcome::Replayed, "ch_1")
    );
    assert_eq!(report.fencing_token, abandoned.fencing_token());

    // Freed: a fenced lock leaves its counter, and a second free finds the unit free.
    abandon(&store, "freed", memory).await;
    let lock = shown(&store, "freed").await;
    let free = Resolution::Free;
    assert_eq!(
        resolve(&store, "freed", &lock, &free).await,
        Resolved::Freed
    );
    let counter = store.read_unit(&unit("freed")).await.unwrap();
    assert!(
        matches!(counter.stored(), Stored::Released { .. }),
        "{counter:?}"
    );
    assert_eq!(resolve(&store, "freed", &lock, &free).await, Resolved::Gone);

    // The holder came back and renewed its lock: the same bytes, live again.
    let holder = abandon(&store, "renewed", memory).await;
    let lock = shown(&store, "renewed").await;
    assert!(
        store
            .renew(&unit("renewed"), &holder, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let resolved = resolve(&store, "renewed", &lock, &Resolution::Free).await;
    assert_eq!(resolved, Resolved::Changed);
    assert!(matches!(
        Task::named("charge")
            .status("renewed", &store)
            .await
            .unwrap(),
        Status::Locked { .. }
    ));

    // The store's memory ran out before the operator answered.
    abandon(&store, "forgotten", Duration::from_millis(200)).await;
    let lock = shown(&store, "forgotten").await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let resolution = record(&unit("forgotten"), None, "1");
    let resolved = resolve(&store, "forgotten", &lock, &resolution).await;
    assert_eq!(resolved, Resolved::Gone);

    // A marker a delivery of this unit could not read is refused before Redis hears of it.
    abandon(&store, "refused", memory).await;
    let lock = shown(&store, "refused").await;
    for resolution in [
        record(&unit("another-key"), None, "1"),
        Resolution::record(b"Dnot a marker".to_vec(), Duration::from_secs(60)),
    ] {
        let err = store
            .resolve_exact(&unit("refused"), &lock, &resolution)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    }
    assert_eq!(shown(&store, "refused").await, lock, "still in doubt");

    // A lock that never ran out is no unit in doubt, whatever bytes are given.
    let held = LockToken::generate().with_doubt_memory(memory);
    store
        .begin(&unit("held"), &held, Duration::from_secs(30), Fencing::Off)
        .await
        .unwrap();
    let Stored::Lock { .. } = store.read_unit(&unit("held")).await.unwrap().into_stored() else {
        panic!("held");
    };
    let value = format!("L{}~60000", held.as_str());
    let resolved = resolve(&store, "held", value.as_bytes(), &Resolution::Free).await;
    assert_eq!(resolved, Resolved::Changed);
}

#[tokio::test]
async fn on_redis_7_resolve_exact_acts_only_on_the_lock_shown() {
    resolve_exact_acts_only_on_the_lock_shown(&RedisServer::start()).await;
}

#[tokio::test]
async fn on_valkey_8_1_resolve_exact_acts_only_on_the_lock_shown() {
    resolve_exact_acts_only_on_the_lock_shown(&RedisServer::start_valkey()).await;
}
