//! `RedlockStore` never answers a duplicate with a result that no majority stored: a stale
//! holder's marker on a minority of servers, next to a majority locked by its successor, is
//! neither kept nor replayed. Three redis-servers the tests start; one is partitioned with
//! `SIGSTOP` while another client sees it stall.

use idempotask_test_support as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::operator::{Marker, StoredResult};
use idempotask::store::{Begin, Fencing, LockToken, Store, UnitOfWork};
use idempotask::{Error, Outcome, RetryPolicy, Task};
use idempotask_redis::RedlockStore;
use support::quorum::Quorum;

const LOCK_TTL: Duration = Duration::from_secs(1);

fn task() -> Task {
    Task::new("stale-results")
        .lock_ttl(LOCK_TTL)
        .retry(RetryPolicy::no_wait())
}

fn stored_value(marker: &[u8]) -> String {
    match Marker::decode(marker).unwrap().result() {
        StoredResult::Json(json) => serde_json::from_str(json.get()).unwrap(),
        other => panic!("not a stored value: {other:?}"),
    }
}

/// A marker on one server and another delivery's lock on the other two: the unit is busy, not
/// done, whatever order the servers answer in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_marker_next_to_a_majority_lock_is_busy_not_done() {
    let quorum = Quorum::start(3);
    let unit = UnitOfWork::new("stale-results", "order-1").unwrap();
    // Each server on its own, as the quorum's rounds would have left them.
    let stale = LockToken::generate();
    let first = quorum.servers[0].store().await;
    first
        .begin(&unit, &stale, LOCK_TTL, Fencing::Off)
        .await
        .unwrap();
    first
        .finish(
            &unit,
            &stale,
            br#"D7|order-1|"stale""#,
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let successor = LockToken::generate();
    for server in &quorum.servers[1..] {
        let store = server.store().await;
        let granted = store
            .begin(&unit, &successor, Duration::from_secs(30), Fencing::Off)
            .await
            .unwrap();
        assert_eq!(granted, Begin::acquired(None));
    }
    let store = quorum.store_timed(Duration::from_secs(1)).await;
    let ran = AtomicU32::new(0);
    let duplicate: Result<String, Error> = task()
        .call("order-1")
        .store(store.clone())
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok("ran".to_owned())
        })
        .await;
    assert!(
        matches!(duplicate, Err(Error::Contended { .. })),
        "the minority's marker was taken for the unit's result: {duplicate:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// The reviewed interleaving: A's locks expire while it runs; B's client sees one server stall
/// for a moment and B takes the unit; A finishes. A must not leave its marker on any server,
/// and no duplicate may replay A's result while B runs, nor after B stored its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_leaves_no_result_behind_a_successor_on_a_majority() {
    let quorum = Quorum::start(3);
    // Three clients, as three workers would have: B's sees server 0 stall.
    let (store_a, store_b, store_c) = (
        quorum.store_timed(Duration::from_secs(1)).await,
        quorum.store_timed(Duration::from_millis(150)).await,
        quorum.store_timed(Duration::from_secs(1)).await,
    );
    let ran = Arc::new(AtomicU32::new(0));
    let hold = |store: RedlockStore, value: &'static str| {
        let ran = Arc::clone(&ran);
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
        let report = tokio::spawn(async move {
            task()
                .call("order-2")
                .store(store)
                .run_reported(async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    started_tx.send(()).unwrap();
                    release_rx.await.unwrap();
                    Ok::<_, Error>(value.to_owned())
                })
                .await
        });
        (started_rx, release, report)
    };
    let (a_started, a_release, a_report) = hold(store_a.clone(), "A");
    a_started.await.unwrap();
    tokio::time::sleep(LOCK_TTL + Duration::from_millis(100)).await;
    // Server 0 stalls once for B's client (a slow server, which is not left out: B's `begin`
    // takes the expired unit on every server).
    quorum.signal(0, "STOP");
    let other = UnitOfWork::new("stale-results", "elsewhere").unwrap();
    store_b.inspect(&other).await.unwrap();
    quorum.signal(0, "CONT");
    let (b_started, b_release, b_report) = hold(store_b.clone(), "B");
    b_started.await.unwrap();

    a_release.send(()).unwrap();
    let a = a_report.await.unwrap().unwrap();
    assert!(
        matches!(
            a.outcome,
            Outcome::LockLost {
                marker_written: false,
                ..
            }
        ),
        "{a:?}"
    );
    // A's marker must not have stayed on server 0.
    let unit = UnitOfWork::new("stale-results", "order-2").unwrap();
    let on_server_0 = quorum.servers[0]
        .store()
        .await
        .inspect(&unit)
        .await
        .unwrap();
    assert!(
        !on_server_0.is_done(),
        "A's marker stayed on the server B could not reach: {:?}",
        on_server_0
            .marker
            .map(|m| String::from_utf8_lossy(&m).into_owned())
    );
    // A duplicate while B still runs waits; it does not get A's result.
    let during: Result<String, Error> = task()
        .call("order-2")
        .store(store_c.clone())
        .run(async { Ok("C".to_owned()) })
        .await;
    assert!(matches!(during, Err(Error::Contended { .. })), "{during:?}");

    b_release.send(()).unwrap();
    let b = b_report.await.unwrap().unwrap();
    assert_eq!((b.value.as_str(), b.outcome), ("B", Outcome::Executed));
    // Every reader gets B's result from now on.
    for store in [&store_a, &store_c] {
        let replayed: String = task()
            .call("order-2")
            .store(store.clone())
            .run(async { Ok::<_, Error>("again".to_owned()) })
            .await
            .unwrap();
        assert_eq!(replayed, "B");
        let seen = store.inspect(&unit).await.unwrap();
        assert_eq!(stored_value(&seen.marker.unwrap()), "B");
    }
    assert_eq!(ran.load(Ordering::SeqCst), 2, "A and B each ran once");
}

/// What `inspect` says a marker has left is the shortest time of its copies: a reader that keeps
/// the answer (`LocalResultCache`) must not outlive the first copy to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_has_the_time_left_of_its_shortest_copy() {
    let quorum = Quorum::start(3);
    let store = quorum.store_timed(Duration::from_secs(2)).await;
    let value: String = task()
        .result_ttl(Duration::from_secs(3600))
        .call("order-ttl")
        .store(store.clone())
        .run(async { Ok::<_, Error>("ch_1".to_owned()) })
        .await
        .unwrap();
    assert_eq!(value, "ch_1");
    let unit = UnitOfWork::new("stale-results", "order-ttl").unwrap();
    let key = idempotask_redis::RedisKeys::new("default")
        .unwrap()
        .unit(&unit);
    let mut conns = Vec::new();
    for url in quorum.urls() {
        let client = redis::Client::open(url.as_str()).unwrap();
        conns.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    // Each server in turn holds the shortest copy, whichever answers first.
    for shortest in 0..conns.len() {
        for (server, conn) in conns.iter_mut().enumerate() {
            let ttl_ms = if server == shortest {
                20_000
            } else {
                3_600_000
            };
            let set: bool = redis::cmd("PEXPIRE")
                .arg(&key)
                .arg(ttl_ms)
                .query_async(conn)
                .await
                .unwrap();
            assert!(set, "server {server} holds the marker");
        }
        let seen = store.inspect(&unit).await.unwrap();
        assert!(seen.marker.is_some());
        let left = seen.marker_ttl.unwrap();
        assert!(
            left <= Duration::from_secs(20) && left > Duration::from_secs(10),
            "shortest on server {shortest}: {left:?}"
        );
    }
}
