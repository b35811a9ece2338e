//! The least-privilege ACL users docs/operations.md recommends, exactly as written there, against every
//! operation of the store: fenced tasks, releases, `forget`, a plain task on a unit that keeps a
//! fencing counter, a unit left in doubt; and a user missing one right is refused at `connect`, by name.

use idempotask_test_support as support;

use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use idempotask::store::{
    BatchingStore, Begin, Claim, Completion, Fencing, Finish, LockToken, Store, StoreErrorKind,
    UnitOfWork,
};
use idempotask::{Error, InDoubt, LockRenewal, Outcome, Task};
use idempotask_redis::{RedisClusterStore, RedisStore};
use support::cluster::RedisCluster;
use support::{Flavor, RedisServer};

/// The rights in docs/operations.md for `RedisStore` (and each server of `RedlockStore`).
const SERVER_RIGHTS: &[&str] = &[
    "~idempotask:*",
    "+@read",
    "+@write",
    "+@scripting",
    "+@connection",
    "+time",
];

/// The rights in docs/operations.md for `RedisClusterStore`: the server's, and the slot map.
const CLUSTER_RIGHTS: &[&str] = &[
    "~idempotask:*",
    "+@read",
    "+@write",
    "+@scripting",
    "+@connection",
    "+time",
    "+cluster|slots",
];

fn set_user(connection: &mut redis::Connection, rights: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg("worker")
        .arg("reset")
        .arg("on")
        .arg(">s3cret");
    for right in rights {
        cmd.arg(*right);
    }
    let _: () = cmd.query(connection).unwrap();
}

/// Every path of a task through the store, with whatever rights the store was connected with.
async fn every_operation(store: impl Store + Clone) {
    let fenced = Task::new("acl-fenced").fencing(true);
    let first = fenced
        .call("k")
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>(1_u8) })
        .await
        .unwrap();
    assert_eq!(first.outcome, Outcome::Executed);
    assert!(first.fencing_token.is_some());
    let replay = fenced
        .call("k")
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>(2_u8) })
        .await
        .unwrap();
    assert_eq!((replay.value, replay.outcome), (1, Outcome::Replayed));

    // A failing fenced body releases its lock (the release keeps the counter), so the next
    // delivery runs at once; so does a task without fencing on the unit that keeps it.
    let runs = AtomicUsize::new(0);
    let failed: Result<u8, Error> = fenced
        .call("released")
        .store(store.clone())
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err(Error::NotConfigured)
        })
        .await;
    assert!(matches!(failed, Err(Error::NotConfigured)), "{failed:?}");
    let plain: u8 = Task::new("acl-fenced")
        .call("released")
        .store(store.clone())
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(3)
        })
        .await
        .unwrap();
    assert_eq!((plain, runs.load(Ordering::SeqCst)), (3, 2));

    // `forget` of a fenced marker keeps its counter, and the unit runs again.
    let unit = UnitOfWork::new("acl-fenced", "k").unwrap();
    assert!(store.forget(&unit).await.unwrap());
    let again: u8 = fenced
        .call("k")
        .store(store.clone())
        .run(async { Ok::<_, Error>(4) })
        .await
        .unwrap();
    assert_eq!(again, 4);
    assert!(matches!(
        fenced.status("k", &store).await.unwrap(),
        idempotask::operator::Status::Done(_)
    ));

    // A unit left in doubt (a lock that ran out, still remembered): read, left alone by a
    // task that holds such units, taken over by one that reruns them.
    let unit = UnitOfWork::new("acl-doubt", "k").unwrap();
    let abandoned = LockToken::generate().with_doubt_memory(Duration::from_secs(60));
    let short = Duration::from_millis(100);
    store
        .begin(&unit, &abandoned, short, Fencing::On)
        .await
        .unwrap();
    tokio::time::sleep(short + Duration::from_millis(50)).await;
    let doubtful = Task::new("acl-doubt");
    assert!(matches!(
        doubtful.status("k", &store).await.unwrap(),
        idempotask::operator::Status::InDoubt(_)
    ));
    let held: Result<u8, Error> = doubtful
        .clone()
        .in_doubt(InDoubt::Hold)
        .call("k")
        .store(store.clone())
        .run(async { Ok(5) })
        .await;
    assert!(matches!(held, Err(Error::InDoubt { .. })), "{held:?}");
    let rerun = doubtful
        .call("k")
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>(6_u8) })
        .await
        .unwrap();
    assert!(
        rerun
            .in_doubt
            .is_some_and(|doubt| doubt.fencing_token.is_some())
    );
    fences_and_renewals(store.clone()).await;
    batches(store).await;
}

/// A fence that passes and one refused after a takeover, and renewals through a body longer
/// than its TTL, in both ways: the renewal script with and without a fencing token.
async fn fences_and_renewals(store: impl Store + Clone) {
    // Renewed every third of it: 670 ms of slack for a late timer on a loaded machine.
    let ttl = Duration::from_secs(1);
    for how in [LockRenewal::Watchdog, LockRenewal::InTask] {
        let renewed = Task::new("acl-renewed")
            .lock_ttl(ttl)
            .fencing(true)
            .lock_renewal(how)
            .call(format!("{how:?}"))
            .store(store.clone())
            .run_reported(async {
                let ctx = idempotask::context().expect("inside the body");
                ctx.fence().await?;
                tokio::time::sleep(ttl * 2).await;
                ctx.fence().await?;
                Ok::<_, Error>(ctx.lock_held())
            })
            .await
            .unwrap();
        assert_eq!(
            (renewed.value, renewed.outcome),
            (true, Outcome::Executed),
            "{how:?}"
        );
    }

    let task = Task::new("acl-fenced-out").lock_ttl(ttl);
    let (taken_tx, taken_rx) = tokio::sync::oneshot::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let stale = {
        let (task, store) = (task.clone(), store.clone());
        tokio::spawn(async move {
            task.call("k")
                .store(store)
                .run(async move {
                    held_tx.send(()).unwrap();
                    taken_rx.await.unwrap();
                    idempotask::context().unwrap().fence().await?;
                    Ok::<u8, Error>(1)
                })
                .await
        })
    };
    held_rx.await.unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(60)).await;
    let successor: u8 = task
        .call("k")
        .store(store.clone())
        .run(async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(successor, 2);
    taken_tx.send(()).unwrap();
    let stale = stale.await.unwrap();
    assert!(matches!(stale, Err(Error::LockNotHeld { .. })), "{stale:?}");
}

/// Batches send the same commands, in one pipeline on one server: the same rights suffice.
async fn batches(store: impl Store + Clone) {
    for fencing in [Fencing::Off, Fencing::On] {
        let units: Vec<UnitOfWork> = (0..3)
            .map(|i| UnitOfWork::new("acl-batch", format!("{fencing:?}-{i}")).unwrap())
            .collect();
        let tokens: Vec<LockToken> = units.iter().map(|_| LockToken::generate()).collect();
        let claims: Vec<Claim<'_>> = units
            .iter()
            .zip(&tokens)
            .map(|(unit, token)| Claim::new(unit, token))
            .collect();
        let mut granted = Vec::new();
        for (answer, token) in store
            .begin_batch(&claims, Duration::from_secs(30), fencing)
            .await
            .into_iter()
            .zip(&tokens)
        {
            match answer.unwrap() {
                Begin::Acquired { fencing_token, .. } => {
                    let token = token.clone();
                    granted.push(match fencing_token {
                        Some(fence) => token.with_fencing_token(fence),
                        None => token,
                    });
                }
                other => panic!("expected the lock, got {other:?}"),
            }
        }
        let markers: Vec<Vec<u8>> = units
            .iter()
            .map(|unit| format!(r#"D{}|{}|"done""#, unit.key().len(), unit.key()).into_bytes())
            .collect();
        let completions: Vec<Completion<'_>> = units
            .iter()
            .zip(&granted)
            .zip(&markers)
            .map(|((unit, token), marker)| Completion::new(unit, token, marker))
            .collect();
        for answer in store
            .finish_batch(&completions, Duration::from_secs(60))
            .await
        {
            assert_eq!(answer.unwrap(), Finish::Completed);
        }
    }
    // And through BatchingStore, as a consumer's calls go.
    let batched: u8 = Task::new("acl-batched")
        .call("k")
        .store(BatchingStore::new(store.clone()))
        .run(async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    assert_eq!(batched, 7);
}

async fn documented_user_runs_everything(flavor: Flavor) {
    let server = RedisServer::start_flavor(flavor, &[]);
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    set_user(&mut admin, SERVER_RIGHTS);
    let url = format!("redis://worker:s3cret@127.0.0.1:{}", server.port());
    every_operation(RedisStore::connect(&url).await.unwrap()).await;

    // Without `TIME` no fenced task could start: `connect` says so instead, once.
    let without_time: Vec<&str> = SERVER_RIGHTS
        .iter()
        .copied()
        .filter(|right| *right != "+time")
        .collect();
    set_user(&mut admin, &without_time);
    let err = RedisStore::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    assert!(err.to_string().contains("+time"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_runs_every_operation_on_redis() {
    documented_user_runs_everything(Flavor::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_runs_every_operation_on_valkey() {
    documented_user_runs_everything(Flavor::Valkey).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_cluster_user_runs_every_operation() {
    let cluster = RedisCluster::start();
    for port in cluster.ports() {
        set_user(&mut support::cluster::node(port), CLUSTER_RIGHTS);
    }
    let urls: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("redis://worker:s3cret@127.0.0.1:{port}"))
        .collect();
    let store = RedisClusterStore::connect(urls).await.unwrap();
    every_operation(store).await;
}

/// The rights tested here are the ones the operations guide gives, word for word: its table's
/// row for each store, and the `ACL SETUSER` line it shows.
#[test]
fn the_tested_rights_are_the_documented_ones() {
    let guide = include_str!("../../../docs/operations.md");
    let table_row = |store: &str| {
        guide
            .lines()
            .find(|line| line.starts_with(&format!("| `{store}`")))
            .unwrap_or_else(|| panic!("docs/operations.md has no rights row for {store}"))
    };
    let server = SERVER_RIGHTS.join(" ");
    assert!(
        table_row("RedisStore").contains(&format!("`{server}`")),
        "{server}"
    );
    assert!(
        guide.contains(&format!("ACL SETUSER worker on >secret {server}\n")),
        "{server}"
    );
    let cluster_only: Vec<_> = CLUSTER_RIGHTS
        .iter()
        .filter(|right| !SERVER_RIGHTS.contains(right))
        .collect();
    assert_eq!(cluster_only, [&"+cluster|slots"]);
    let row = table_row("RedisClusterStore");
    assert!(
        row.contains("the same") && row.contains(r"`+cluster\|slots`"),
        "{row}"
    );
}
