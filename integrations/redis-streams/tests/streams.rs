//! The Redis Streams consumer on a real `redis-server`: every outcome as the group saw it
//! (`XPENDING`, `XLEN` of the dead-letter stream, the failure hash), a consumer dropped between
//! its side effect and its ack, claims and their delivery counts, bad entries, and trimming.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::store::{Store, UnitOfWork};
use idempotask::{Backoff, Outcome, RetryPolicy, Task};
use idempotask_redis::RedisStore;
use idempotask_redis_streams::{
    BadEntry, Entry, EntryId, Field, Handled, Idempotent, Processed, REASON_FIELD, Rejection,
    SOURCE_ID_FIELD, StreamConsumer, StreamError,
};
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

/// Seconds, so that a grant or a finish that a loaded machine delays still lands within it (a
/// grant with under 10 ms of its TTL left does not run its body).
const LOCK_TTL: Duration = Duration::from_secs(2);
/// At least the lock TTL, as the consumer requires; the tests whose consumers die wait this long
/// for the entries to be claimed.
const CLAIM_IDLE: Duration = LOCK_TTL;
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
/// How long a test waits for what must happen; a failure, not a pause.
const WAIT: Duration = Duration::from_secs(10);

static TASK: Task = Task::new("streams_charge")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());

struct Setup {
    redis: RedisServer,
    conn: MultiplexedConnection,
    store: FaultyStore<RedisStore>,
    effects: Arc<AtomicU32>,
}

async fn setup() -> Setup {
    let redis = RedisServer::start();
    let conn = redis.connection().await;
    let store = FaultyStore::new(redis.store().await);
    Setup {
        redis,
        conn,
        store,
        effects: Arc::default(),
    }
}

impl Setup {
    fn idempotent(&self) -> Idempotent<Field> {
        Idempotent::new(TASK.clone(), Field::new("order_id"))
            .store(self.store.clone())
            .claim_idle(CLAIM_IDLE)
            .failure_backoff(BACKOFF)
            .store_backoff(BACKOFF)
            .max_failures(3)
            .block(Duration::from_millis(50))
    }

    async fn consumer(&self, name: &str) -> StreamConsumer<Field> {
        self.idempotent()
            .consume(&self.redis.url(), "orders", "chargers", name)
            .await
            .unwrap()
    }

    async fn add(&mut self, fields: &[(&str, &str)]) -> String {
        let mut add = redis::cmd("XADD");
        add.arg("orders").arg("*");
        for (field, value) in fields {
            add.arg(*field).arg(*value);
        }
        add.query_async(&mut self.conn).await.unwrap()
    }

    async fn pending(&mut self) -> u64 {
        let summary: redis::Value = redis::cmd("XPENDING")
            .arg("orders")
            .arg("chargers")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let redis::Value::Array(parts) = summary else {
            panic!("{summary:?}")
        };
        match parts[0] {
            redis::Value::Int(n) => u64::try_from(n).unwrap(),
            ref other => panic!("{other:?}"),
        }
    }

    async fn dead(&mut self) -> Vec<(String, Vec<(String, String)>)> {
        let reply: redis::Value = redis::cmd("XRANGE")
            .arg("orders:dead")
            .arg("-")
            .arg("+")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        redis::FromRedisValue::from_redis_value(reply).unwrap()
    }

    async fn failure_count(&mut self, id: &str) -> Option<u32> {
        self.conn
            .hget("orders:chargers:failures", id)
            .await
            .unwrap()
    }

    /// A body that counts its side effect and answers the order id.
    fn charge(&self, fail: bool) -> impl FnMut(&Entry) -> Result<Charge, BadEntry> + use<> {
        let effects = Arc::clone(&self.effects);
        move |entry: &Entry| {
            let order: u64 = entry.json("order_id")?;
            let effects = Arc::clone(&effects);
            Ok(Box::pin(async move {
                if fail {
                    return Err(Declined);
                }
                effects.fetch_add(1, Ordering::SeqCst);
                Ok(format!("ch_{order}"))
            }))
        }
    }
}

type Charge = std::pin::Pin<Box<dyn Future<Output = Result<String, Declined>> + Send>>;

#[derive(Debug, thiserror::Error)]
#[error("the card was declined")]
struct Declined;

/// Calls `next_batch` until it answers entries, at most for [`WAIT`].
async fn next<F, Fut>(
    consumer: &mut StreamConsumer<Field>,
    mut body: F,
) -> Vec<Processed<String, Declined>>
where
    F: FnMut(&Entry) -> Result<Fut, BadEntry>,
    Fut: Future<Output = Result<String, Declined>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let batch = consumer.next_batch(&mut body).await.unwrap();
        if !batch.is_empty() {
            return batch;
        }
        assert!(tokio::time::Instant::now() < deadline, "no entry came");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_runs_once_is_acked_and_a_second_entry_with_its_key_is_replayed() {
    let mut s = setup().await;
    let mut consumer = s.consumer("c1").await;
    let first = s.add(&[("order_id", "7")]).await;
    let batch = next(&mut consumer, s.charge(false)).await;
    assert_eq!(batch.len(), 1);
    assert_eq!(
        (batch[0].id.as_str(), batch[0].deliveries),
        (first.as_str(), 1)
    );
    let Handled::Acked(report) = &batch[0].handled else {
        panic!("{:?}", batch[0])
    };
    assert_eq!(
        (report.value.as_str(), report.outcome),
        ("ch_7", Outcome::Executed)
    );
    s.add(&[("order_id", "7")]).await;
    let batch = next(&mut consumer, s.charge(false)).await;
    let Handled::Acked(report) = &batch[0].handled else {
        panic!("{:?}", batch[0])
    };
    assert_eq!(
        (report.value.as_str(), report.outcome),
        ("ch_7", Outcome::Replayed)
    );
    assert_eq!(s.effects.load(Ordering::SeqCst), 1);
    assert_eq!(s.pending().await, 0, "both entries are acked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_body_stays_pending_with_its_count_and_runs_again_after_its_backoff() {
    let mut s = setup().await;
    let mut consumer = s.consumer("c1").await;
    let id = s.add(&[("order_id", "8")]).await;
    let batch = next(&mut consumer, s.charge(true)).await;
    let Handled::Failed {
        failures, delay, ..
    } = &batch[0].handled
    else {
        panic!("{:?}", batch[0])
    };
    assert_eq!((*failures, *delay), (1, Duration::from_millis(20)));
    assert_eq!(s.pending().await, 1, "a failed entry is not acked");
    assert_eq!(s.failure_count(&id).await, Some(1));
    assert_eq!(consumer.waiting(), 1);
    let batch = next(&mut consumer, s.charge(false)).await;
    assert_eq!(batch[0].id, id);
    assert_eq!(batch[0].deliveries, 1, "a local retry is no delivery");
    assert!(
        matches!(batch[0].handled, Handled::Acked(_)),
        "{:?}",
        batch[0]
    );
    assert_eq!(s.pending().await, 0);
    assert_eq!(
        s.failure_count(&id).await,
        None,
        "the count goes with the ack"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_body_counts_as_a_failure_and_its_max_failures_th_is_dead_lettered() {
    let mut s = setup().await;
    let mut consumer = s.consumer("c1").await;
    let id = s.add(&[("order_id", "9"), ("note", "rush")]).await;
    let panics = |_: &Entry| -> Result<Charge, BadEntry> {
        Ok(Box::pin(async { panic!("the ledger client panicked") }))
    };
    for failure in 1..=2 {
        let batch = next(&mut consumer, panics).await;
        let Handled::Failed { failures, .. } = &batch[0].handled else {
            panic!("{:?}", batch[0])
        };
        assert_eq!(*failures, failure);
    }
    let batch = next(&mut consumer, panics).await;
    let Handled::DeadLettered(Rejection::GaveUp { failures: 3, .. }) = &batch[0].handled else {
        panic!("{:?}", batch[0])
    };
    assert_eq!(s.pending().await, 0, "dead-lettered means acked");
    let dead = s.dead().await;
    assert_eq!(dead.len(), 1);
    let fields = &dead[0].1;
    let field = |name: &str| {
        fields
            .iter()
            .find(|(f, _)| f == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(field("order_id").as_deref(), Some("9"));
    assert_eq!(field("note").as_deref(), Some("rush"));
    assert_eq!(field(SOURCE_ID_FIELD), Some(id.clone()));
    assert_eq!(field(REASON_FIELD).as_deref(), Some("gave-up"));
    assert_eq!(s.failure_count(&id).await, None);
    assert_eq!(consumer.waiting(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_never_gets_an_entry_acked_and_it_runs_once_the_store_is_back() {
    let mut s = setup().await;
    let mut consumer = s.consumer("c1").await;
    s.add(&[("order_id", "10")]).await;
    s.store.down(true);
    for _ in 0..4 {
        let batch = next(&mut consumer, s.charge(false)).await;
        assert!(
            matches!(batch[0].handled, Handled::Deferred { .. }),
            "{:?}",
            batch[0]
        );
        assert_eq!(s.pending().await, 1, "never acked while the store is down");
    }
    assert!(s.dead().await.is_empty());
    s.store.down(false);
    let batch = next(&mut consumer, s.charge(false)).await;
    assert!(
        matches!(batch[0].handled, Handled::Acked(_)),
        "{:?}",
        batch[0]
    );
    assert_eq!(batch[0].deliveries, 1, "deferrals are no deliveries");
    assert_eq!(
        (s.effects.load(Ordering::SeqCst), s.pending().await),
        (1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_key_is_deferred_for_the_holders_lock_and_then_replayed() {
    let mut s = setup().await;
    let mut consumer = s.consumer("c1").await;
    let (held, held_rx) = tokio::sync::oneshot::channel();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let (store, effects) = (s.store.clone(), Arc::clone(&s.effects));
    let holder = tokio::spawn(async move {
        let value: Result<String, idempotask::Error> = TASK
            .clone()
            .renew(true)
            .call("11")
            .store(store)
            .run(async {
                held.send(()).unwrap();
                finish_rx.await.unwrap();
                effects.fetch_add(1, Ordering::SeqCst);
                Ok("ch_11".to_owned())
            })
            .await;
        value.unwrap();
    });
    held_rx.await.unwrap();
    s.add(&[("order_id", "11")]).await;
    let batch = next(&mut consumer, s.charge(false)).await;
    let Handled::Deferred { error, delay, .. } = &batch[0].handled else {
        panic!("{:?}", batch[0])
    };
    assert!(
        matches!(error, idempotask::Error::Contended { .. }),
        "{error}"
    );
    assert!(*delay <= LOCK_TTL, "{delay:?}");
    assert_eq!(s.pending().await, 1);
    finish.send(()).unwrap();
    holder.await.unwrap();
    let batch = next(&mut consumer, s.charge(false)).await;
    let Handled::Acked(report) = &batch[0].handled else {
        panic!("{:?}", batch[0])
    };
    assert_eq!(report.outcome, Outcome::Replayed);
    assert_eq!(
        (s.effects.load(Ordering::SeqCst), s.pending().await),
        (1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_without_a_key_or_a_decodable_payload_are_dead_lettered_with_a_typed_error() {
    let mut s = setup().await;
    let mut consumer = s.consumer("c1").await;
    let unkeyed = s.add(&[("amount", "5")]).await;
    let undecodable = s.add(&[("order_id", "not-a-number")]).await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.extend(next(&mut consumer, s.charge(false)).await);
    }
    let Handled::DeadLettered(Rejection::MissingKey(missing)) = &seen[0].handled else {
        panic!("{:?}", seen[0])
    };
    assert_eq!(missing.entry_id(), unkeyed);
    let Handled::DeadLettered(Rejection::BadEntry(bad)) = &seen[1].handled else {
        panic!("{:?}", seen[1])
    };
    assert_eq!(bad.entry_id(), undecodable);
    assert!(
        bad.to_string()
            .contains("`order_id` field is not the expected JSON"),
        "{bad}"
    );
    let reasons: Vec<String> = s
        .dead()
        .await
        .into_iter()
        .filter_map(|(_, fields)| fields.into_iter().find(|(f, _)| f == REASON_FIELD))
        .map(|(_, reason)| reason)
        .collect();
    assert_eq!(reasons, ["missing-key", "bad-entry"]);
    assert_eq!(
        (s.effects.load(Ordering::SeqCst), s.pending().await),
        (0, 0)
    );
}

/// The kill between the side effect and the ack: the batch's first entry is done (its marker
/// written), the second hangs, and the consumer is dropped before it settles either. Another
/// consumer claims both once they are idle: the first is replayed, the second runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_dropped_between_the_effect_and_the_ack_leaves_entries_that_another_claims_and_replays()
 {
    let mut s = setup().await;
    let mut dying = s.consumer("dying").await;
    let done = s.add(&[("order_id", "20")]).await;
    let hung = s.add(&[("order_id", "21")]).await;
    let effects = Arc::clone(&s.effects);
    let hanging = Arc::new(tokio::sync::Notify::new());
    let hangs = Arc::clone(&hanging);
    let half = move |entry: &Entry| -> Result<Charge, BadEntry> {
        let order: u64 = entry.json("order_id")?;
        let (effects, hangs) = (Arc::clone(&effects), Arc::clone(&hangs));
        Ok(Box::pin(async move {
            if order == 21 {
                hangs.notify_one();
                std::future::pending::<()>().await;
            }
            effects.fetch_add(1, Ordering::SeqCst);
            Ok(format!("ch_{order}"))
        }))
    };
    // Dropped once the hung body runs and the other one's marker is written, however slow
    // the machine is.
    let first_done = async {
        hanging.notified().await;
        let unit = UnitOfWork::new(TASK.name(), "20").unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        while !s.store.inspect(&unit).await.unwrap().is_done() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the first entry's result was never stored"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        () = first_done => {}
        batch = dying.next_batch(half) => panic!("the batch ended with one body hung: {batch:?}"),
    }
    drop(dying);
    assert_eq!(s.effects.load(Ordering::SeqCst), 1);
    assert_eq!(s.pending().await, 2, "nothing of the batch is acked");
    let mut heir = s.consumer("heir").await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.extend(next(&mut heir, s.charge(false)).await);
    }
    seen.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(
        (seen[0].id.as_str(), seen[1].id.as_str()),
        (done.as_str(), hung.as_str())
    );
    let outcomes: Vec<_> = seen
        .iter()
        .map(|p| match &p.handled {
            Handled::Acked(report) => (p.deliveries, report.outcome),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(outcomes, [(2, Outcome::Replayed), (2, Outcome::Executed)]);
    assert_eq!(
        (s.effects.load(Ordering::SeqCst), s.pending().await),
        (2, 0)
    );
}

/// An entry whose consumers keep dying before they settle it: claimed again and again, and
/// dead-lettered without running once its deliveries pass `max_deliveries`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_claimed_past_max_deliveries_is_dead_lettered_without_running() {
    let mut s = setup().await;
    let id = s.add(&[("order_id", "30")]).await;
    let started = Arc::new(tokio::sync::Notify::new());
    for name in ["a", "b", "c"] {
        let mut consumer = s
            .idempotent()
            .max_deliveries(3)
            .consume(&s.redis.url(), "orders", "chargers", name)
            .await
            .unwrap();
        let signal = Arc::clone(&started);
        let hangs = move |_: &Entry| -> Result<Charge, BadEntry> {
            let signal = Arc::clone(&signal);
            Ok(Box::pin(async move {
                signal.notify_one();
                std::future::pending::<()>().await;
                unreachable!()
            }))
        };
        // Until the entry's body runs here: then the consumer is dropped with it, as if killed.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            tokio::select! {
                batch = consumer.next_batch(hangs.clone()) => assert!(batch.unwrap().is_empty()),
                () = started.notified() => break,
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} never got the entry"
            );
        }
    }
    let mut last = s
        .idempotent()
        .max_deliveries(3)
        .consume(&s.redis.url(), "orders", "chargers", "d")
        .await
        .unwrap();
    let batch = next_any(&mut last).await;
    assert_eq!(batch[0].id, id);
    let Handled::DeadLettered(Rejection::TooManyDeliveries { deliveries: 4 }) = &batch[0].handled
    else {
        panic!("{:?}", batch[0])
    };
    assert_eq!(s.pending().await, 0);
    assert_eq!(s.dead().await.len(), 1);
}

async fn next_any(consumer: &mut StreamConsumer<Field>) -> Vec<Processed<String, Declined>> {
    let never = |_: &Entry| -> Result<Charge, BadEntry> { panic!("the body is never made") };
    next(consumer, never).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_idle_shorter_than_the_lock_ttl_is_refused_at_start() {
    let s = setup().await;
    let err = s
        .idempotent()
        .claim_idle(LOCK_TTL / 2)
        .consume(&s.redis.url(), "orders", "chargers", "c1")
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(err, StreamError::ClaimIdleBelowLockTtl { .. }),
        "{err}"
    );
}

/// A body that runs twice `claim_idle` (and its lock TTL) is not claimed by another consumer:
/// its consumer refreshes it while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_body_longer_than_claim_idle_is_not_claimed_by_another_consumer() {
    let mut s = setup().await;
    // The lock is renewed, and the entry refreshed, every third of their times: each has two
    // seconds to spare, so that a stall of a second on a loaded machine breaks neither.
    let (lock_ttl, claim_idle) = (Duration::from_secs(3), Duration::from_secs(3));
    let long_task = Task::new("streams_long")
        .lock_ttl(lock_ttl)
        .renew(true)
        .retry(RetryPolicy::no_wait());
    let url = s.redis.url();
    let idempotent = Idempotent::new(long_task, EntryId)
        .store(s.store.clone())
        .claim_idle(claim_idle)
        .block(Duration::from_millis(50));
    let mut slow = idempotent
        .clone()
        .consume(&url, "orders", "chargers", "slow")
        .await
        .unwrap();
    let mut other = idempotent
        .consume(&url, "orders", "chargers", "other")
        .await
        .unwrap();
    s.add(&[("order_id", "40")]).await;
    let (started, running_now) = tokio::sync::oneshot::channel::<()>();
    let mut started = Some(started);
    let mut long = move |_: &Entry| -> Result<Charge, BadEntry> {
        let started = started.take();
        Ok(Box::pin(async move {
            if let Some(started) = started {
                let _ = started.send(());
            }
            tokio::time::sleep(2 * claim_idle).await;
            Ok("slow".to_owned())
        }))
    };
    let never = |_: &Entry| -> Result<Charge, BadEntry> { panic!("claimed from a live consumer") };
    let running = tokio::spawn(async move {
        let batch = loop {
            let batch = slow.next_batch(&mut long).await.unwrap();
            if !batch.is_empty() {
                break batch;
            }
        };
        assert!(
            matches!(batch[0].handled, Handled::Acked(_)),
            "{:?}",
            batch[0]
        );
    });
    running_now.await.unwrap();
    while !running.is_finished() {
        let batch: Vec<Processed<String, Declined>> = other.next_batch(never).await.unwrap();
        assert!(batch.is_empty(), "{batch:?}");
    }
    running.await.unwrap();
    assert_eq!(s.pending().await, 0);
}

/// Trimming keeps every entry a group has pending or has yet to read, across groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimming_removes_only_what_every_group_acknowledged() {
    let mut s = setup().await;
    let mut ids = Vec::new();
    for order in 50..56 {
        ids.push(s.add(&[("order_id", &order.to_string())]).await);
    }
    // "chargers" reads 50..=53 in one batch, acks 50..=52 and fails 53 (pending); 54 and 55
    // it has yet to read.
    let mut consumer = s
        .idempotent()
        .batch_size(4)
        .consume(&s.redis.url(), "orders", "chargers", "c2")
        .await
        .unwrap();
    let batch = next(&mut consumer, |entry: &Entry| -> Result<Charge, BadEntry> {
        let order: u64 = entry.json("order_id")?;
        Ok(Box::pin(async move {
            if order == 53 {
                Err(Declined)
            } else {
                Ok(format!("ch_{order}"))
            }
        }))
    })
    .await;
    assert_eq!(batch.len(), 4);
    // A second group that has read nothing: nothing may go.
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("orders")
        .arg("audit")
        .arg("0")
        .query_async(&mut s.conn)
        .await
        .unwrap();
    assert_eq!(
        consumer.trim().await.unwrap(),
        0,
        "the audit group has read nothing"
    );
    let _: () = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg("orders")
        .arg("audit")
        .query_async(&mut s.conn)
        .await
        .map(|_: u32| ())
        .unwrap();
    let removed = consumer.trim().await.unwrap();
    assert_eq!(removed, 3, "50, 51 and 52 are acked; 53 is pending");
    let first: redis::Value = redis::cmd("XRANGE")
        .arg("orders")
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut s.conn)
        .await
        .unwrap();
    assert!(format!("{first:?}").contains(&ids[3]), "{first:?}");
    assert_eq!(s.pending().await, 1);
    assert_eq!(consumer.trim().await.unwrap(), 0, "idempotent");
}

/// `run_batch` tells the group nothing: the entries stay pending until `settle`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_run_but_not_settled_leaves_its_entries_pending() {
    let mut s = setup().await;
    let mut consumer = s.consumer("c1").await;
    s.add(&[("order_id", "60")]).await;
    s.add(&[("order_id", "61")]).await;
    let mut body = s.charge(false);
    let mut ran = 0;
    let mut batches = Vec::new();
    while ran < 2 {
        let batch = consumer.run_batch(&mut body).await.unwrap();
        ran += batch.processed().len();
        assert!(
            batch
                .processed()
                .iter()
                .all(|p| matches!(p.handled, Handled::Acked(_)))
        );
        batches.push(batch);
    }
    assert_eq!(s.pending().await, 2, "nothing is acked before settle");
    for batch in batches {
        consumer.settle(batch).await.unwrap();
    }
    assert_eq!(
        (s.effects.load(Ordering::SeqCst), s.pending().await),
        (2, 0)
    );
}

/// Records a batch of `size` units in `sizes`; answers whether it is the first.
fn record_size(sizes: &std::sync::Mutex<Vec<usize>>, size: usize) -> bool {
    let mut sizes = sizes.lock().unwrap();
    sizes.push(size);
    sizes.len() == 1
}

/// Keeps the first batch of its kind in flight for a while, so that the calls made meanwhile
/// queue behind it and go together, as they do when the store takes a round trip: on a
/// machine busy enough, each entry's call could otherwise come back before the next is made,
/// and every batch would be of one. No signal tells when the others are queued; the hold is
/// far longer than spawning a read's entries takes, and far shorter than the lock's TTL.
async fn hold_the_first(first: bool) {
    if first {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A store that records the size of each call it gets: a batch call's units, 1 for a single.
#[derive(Debug, Clone)]
struct Counting {
    inner: RedisStore,
    begins: Arc<std::sync::Mutex<Vec<usize>>>,
    finishes: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl idempotask::store::Store for Counting {
    async fn begin(
        &self,
        unit: &idempotask::store::UnitOfWork,
        token: &idempotask::store::LockToken,
        lock_ttl: Duration,
        fencing: idempotask::store::Fencing,
    ) -> Result<idempotask::store::Begin, idempotask::store::StoreError> {
        self.begins.lock().unwrap().push(1);
        self.inner.begin(unit, token, lock_ttl, fencing).await
    }

    async fn finish(
        &self,
        unit: &idempotask::store::UnitOfWork,
        token: &idempotask::store::LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<idempotask::store::Finish, idempotask::store::StoreError> {
        self.finishes.lock().unwrap().push(1);
        self.inner.finish(unit, token, marker, result_ttl).await
    }

    async fn release(
        &self,
        unit: &idempotask::store::UnitOfWork,
        token: &idempotask::store::LockToken,
    ) -> Result<bool, idempotask::store::StoreError> {
        self.inner.release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &idempotask::store::UnitOfWork,
        token: &idempotask::store::LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, idempotask::store::StoreError> {
        self.inner.renew(unit, token, lock_ttl).await
    }

    async fn inspect(
        &self,
        unit: &idempotask::store::UnitOfWork,
    ) -> Result<idempotask::store::Inspection, idempotask::store::StoreError> {
        self.inner.inspect(unit).await
    }

    async fn forget(
        &self,
        unit: &idempotask::store::UnitOfWork,
    ) -> Result<bool, idempotask::store::StoreError> {
        self.inner.forget(unit).await
    }

    async fn begin_batch(
        &self,
        claims: &[idempotask::store::Claim<'_>],
        lock_ttl: Duration,
        fencing: idempotask::store::Fencing,
    ) -> Vec<Result<idempotask::store::Begin, idempotask::store::StoreError>> {
        let first = record_size(&self.begins, claims.len());
        hold_the_first(first).await;
        self.inner.begin_batch(claims, lock_ttl, fencing).await
    }

    async fn finish_batch(
        &self,
        completions: &[idempotask::store::Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<idempotask::store::Finish, idempotask::store::StoreError>> {
        let first = record_size(&self.finishes, completions.len());
        hold_the_first(first).await;
        self.inner.finish_batch(completions, result_ttl).await
    }
}

/// The entries of one read run at once, so over `BatchingStore` their `begin`s and `finish`es
/// reach the store as a few batches, not one call each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_batch_reaches_a_batching_store_as_batches() {
    let mut s = setup().await;
    let counting = Counting {
        inner: s.redis.store().await,
        begins: Arc::default(),
        finishes: Arc::default(),
    };
    let mut consumer = Idempotent::new(TASK.clone(), Field::new("order_id"))
        .store(idempotask::store::BatchingStore::new(counting.clone()))
        .claim_idle(CLAIM_IDLE)
        .batch_size(8)
        .consume(&s.redis.url(), "orders", "chargers", "c1")
        .await
        .unwrap();
    for order in 70..78 {
        s.add(&[("order_id", &order.to_string())]).await;
    }
    let batch = next(&mut consumer, s.charge(false)).await;
    assert_eq!(batch.len(), 8, "one read takes the eight entries");
    assert!(batch.iter().all(|p| matches!(p.handled, Handled::Acked(_))));
    let begins = counting.begins.lock().unwrap().clone();
    let finishes = counting.finishes.lock().unwrap().clone();
    assert_eq!(begins.iter().sum::<usize>(), 8, "{begins:?}");
    assert_eq!(finishes.iter().sum::<usize>(), 8, "{finishes:?}");
    // The first call finds no batch in flight and goes alone (the store holds it a while);
    // the others wait for it and go together, never one call each.
    assert!(begins.len() < 8, "{begins:?}");
    assert!(finishes.len() < 8, "{finishes:?}");
    assert_eq!(
        (s.effects.load(Ordering::SeqCst), s.pending().await),
        (8, 0)
    );
}

/// The failure count lives in Redis: a consumer that failed an entry once and died leaves the
/// count for the one that claims it, which gives the entry up at `max_failures`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failure_count_outlives_the_consumer_that_recorded_it() {
    let mut s = setup().await;
    let id = s.add(&[("order_id", "80")]).await;
    let mut first = s.consumer("first").await;
    let batch = next(&mut first, s.charge(true)).await;
    assert!(
        matches!(batch[0].handled, Handled::Failed { failures: 1, .. }),
        "{:?}",
        batch[0]
    );
    drop(first);
    assert_eq!(s.failure_count(&id).await, Some(1));
    let mut heir = s
        .idempotent()
        .max_failures(2)
        .consume(&s.redis.url(), "orders", "chargers", "heir")
        .await
        .unwrap();
    let batch = next(&mut heir, s.charge(true)).await;
    assert_eq!(
        (batch[0].id.as_str(), batch[0].deliveries),
        (id.as_str(), 2)
    );
    let Handled::DeadLettered(Rejection::GaveUp { failures: 2, .. }) = &batch[0].handled else {
        panic!("{:?}", batch[0])
    };
    assert_eq!((s.pending().await, s.dead().await.len()), (0, 1));
    assert_eq!(s.failure_count(&id).await, None);
}

/// A group that is gone (the stream deleted, Redis restarted without persistence) is joined
/// again: the consumer reads on instead of failing every read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_group_is_gone_joins_it_again() {
    let mut s = setup().await;
    let mut consumer = s.consumer("c1").await;
    s.add(&[("order_id", "90")]).await;
    next(&mut consumer, s.charge(false)).await;
    // One entry held for a retry, which goes with the group.
    s.add(&[("order_id", "89")]).await;
    let failed = next(&mut consumer, s.charge(true)).await;
    assert!(
        matches!(failed[0].handled, Handled::Failed { .. }),
        "{:?}",
        failed[0]
    );
    let _: u32 = redis::cmd("DEL")
        .arg("orders")
        .query_async(&mut s.conn)
        .await
        .unwrap();
    let empty: Vec<Processed<String, Declined>> =
        consumer.next_batch(s.charge(false)).await.unwrap();
    assert!(empty.is_empty());
    s.add(&[("order_id", "91")]).await;
    let batch = next(&mut consumer, s.charge(false)).await;
    assert!(
        matches!(batch[0].handled, Handled::Acked(_)),
        "{:?}",
        batch[0]
    );
    assert_eq!(
        (s.effects.load(Ordering::SeqCst), s.pending().await),
        (2, 0)
    );
}
