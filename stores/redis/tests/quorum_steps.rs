//! Steps on `RedlockStore` when servers fail: a record is confirmed by a majority, a journal
//! entry counts where a majority of the servers hold it, and what a failed record left on a
//! minority is neither replayed nor kept. Three redis-servers the tests start, killed with
//! `SIGKILL` or partitioned with `SIGSTOP`; each server's journal is read directly.

use idempotask_test_support as support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::store::{Begin, Fencing, LockToken, StepEntry, Store, UnitOfWork};
use idempotask::{Error, RetryPolicy, StepErrorKind, Task};
use support::proxy::Proxy;
use support::quorum::Quorum;

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn task(lock_ttl: Duration) -> Task {
    Task::new("quorum-steps")
        .lock_ttl(lock_ttl)
        .retry(RetryPolicy::no_wait())
}

fn unit(key: &str) -> UnitOfWork {
    UnitOfWork::new("quorum-steps", key).unwrap()
}

/// The journal of `unit` as server `index` holds it.
async fn journal_on(quorum: &Quorum, index: usize, unit: &UnitOfWork) -> Vec<Vec<u8>> {
    let server = quorum.servers[index].store().await;
    server.read_journal(unit).await.unwrap().into_entries()
}

/// Leaves `entry` as the first of `unit`'s journal on server `index` alone, as a holder that
/// recorded it there, then released, leaves it.
async fn recorded_on(quorum: &Quorum, index: usize, unit: &UnitOfWork, entry: &[u8]) {
    let server = quorum.servers[index].store().await;
    let holder = LockToken::generate();
    let ttl = Duration::from_secs(30);
    server
        .begin(unit, &holder, ttl, Fencing::Off)
        .await
        .unwrap();
    let recorded = server.record_step(unit, &holder, StepEntry::new(0, entry, DAY), ttl);
    assert!(recorded.await.unwrap());
    assert!(server.release(unit, &holder).await.unwrap());
}

/// A quorum store on `quorum` and a token that holds `unit`'s lock on it.
async fn acquired(
    quorum: &Quorum,
    unit: &UnitOfWork,
    ttl: Duration,
) -> (idempotask_redis::RedlockStore, LockToken) {
    let store = quorum.store_timed(Duration::from_secs(1)).await;
    let holder = LockToken::generate();
    let begun = store.begin(unit, &holder, ttl, Fencing::Off).await.unwrap();
    assert!(matches!(begun, Begin::Acquired { .. }), "{begun:?}");
    (store, holder)
}

/// A server killed between a step's effect and its record: the two others confirm it, and the
/// rerun (with that server still down) replays the step instead of running it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_with_one_server_down_is_confirmed_and_replayed() {
    let quorum = Quorum::start(3);
    let store = quorum.store_timed(Duration::from_millis(500)).await;
    let task = task(Duration::from_secs(30));
    let counted = AtomicU32::new(0);
    let (charges, servers) = (&counted, &quorum);
    let run = |fail: bool| {
        task.call("order-1").store(store.clone()).run(async move {
            let ctx = idempotask::context().unwrap();
            let charge: u32 = ctx
                .step("charge", async {
                    if charges.fetch_add(1, Ordering::SeqCst) == 0 {
                        servers.signal(2, "KILL");
                    }
                    Ok::<_, Error>(42)
                })
                .await?;
            if fail {
                return Err(Error::NotConfigured);
            }
            Ok(charge)
        })
    };
    assert!(matches!(run(true).await, Err(Error::NotConfigured)));
    for index in [0, 1] {
        assert_eq!(journal_on(&quorum, index, &unit("order-1")).await.len(), 1);
    }
    assert_eq!(run(false).await.unwrap(), 42);
    assert_eq!(
        counted.load(Ordering::SeqCst),
        1,
        "a confirmed step ran again"
    );
}

/// Two servers of three partitioned after a step's effect: the record reaches one server only,
/// the step is unrecorded, and the call keeps its lock (it lapses: the unit is in doubt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_on_a_minority_is_unrecorded_and_keeps_the_lock() {
    let quorum = Quorum::start(3);
    let store = quorum.store_timed(Duration::from_millis(100)).await;
    let answer = task(Duration::from_secs(30))
        .call("order-2")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().unwrap();
            ctx.step("charge", async {
                quorum.signal(0, "STOP");
                quorum.signal(1, "STOP");
                Ok::<_, Error>(7)
            })
            .await
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(Error::Step {
                kind: StepErrorKind::Unrecorded,
                ..
            })
        ),
        "{answer:?}"
    );
    let unit = unit("order-2");
    let reachable = quorum.servers[2].store().await;
    let seen = reachable.inspect(&unit).await.unwrap();
    assert!(seen.lock_ttl.is_some(), "the lock was released: {seen:?}");
    assert_eq!(journal_on(&quorum, 2, &unit).await.len(), 1);
    quorum.signal(0, "CONT");
    quorum.signal(1, "CONT");
}

/// What a failed record left on one server is not the journal's: the next run runs the step,
/// and its record replaces that entry on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_entry_is_not_replayed_and_is_replaced() {
    let quorum = Quorum::start(3);
    let unit = unit("order-3");
    let stale_entry = br#"{"step":"charge","ok":999}"#;
    // A holder that recorded its step on server 2 only, then released.
    recorded_on(&quorum, 2, &unit, stale_entry).await;
    let store = quorum.store_timed(Duration::from_secs(1)).await;
    assert!(store.read_journal(&unit).await.unwrap().is_empty());
    let charges = AtomicU32::new(0);
    let result: u32 = task(Duration::from_secs(30))
        .call("order-3")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().unwrap();
            ctx.step("charge", async {
                Ok::<_, Error>(charges.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .await
        })
        .await
        .unwrap();
    assert_eq!(
        (result, charges.load(Ordering::SeqCst)),
        (1, 1),
        "a minority's entry was replayed"
    );
    let journals = [
        journal_on(&quorum, 0, &unit).await,
        journal_on(&quorum, 1, &unit).await,
        journal_on(&quorum, 2, &unit).await,
    ];
    assert_eq!(journals[0].len(), 1);
    assert!(
        journals.iter().all(|journal| journal == &journals[0]),
        "the failed attempt's entry was kept: {journals:?}"
    );
}

/// An entry on two servers of three is confirmed; with one of those two partitioned, the read
/// cannot tell it from a failed attempt's and fails rather than drop it, and reads it again
/// once that server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_missing_servers_could_decide_fails_instead_of_guessing() {
    let quorum = Quorum::start(3);
    let unit = unit("order-4");
    let entry_bytes = br#"{"step":"charge","ok":1}"#;
    for index in [0, 1] {
        recorded_on(&quorum, index, &unit, entry_bytes).await;
    }
    let store = quorum.store_timed(Duration::from_millis(100)).await;
    quorum.signal(0, "STOP");
    let read = store.read_journal(&unit).await;
    quorum.signal(0, "CONT");
    let err = read.expect_err("a read without the confirmed entry's majority guessed");
    assert!(err.is_retryable(), "{err}");
    let journal = store.read_journal(&unit).await.unwrap();
    assert_eq!(journal.entries(), [entry_bytes.to_vec()]);
}

/// A server that missed a record (its journal shorter than the next record's position) is
/// given the majority's journal when the next record is confirmed, so that the journal is
/// read with another server down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_missed_a_record_catches_up_with_the_next() {
    let quorum = Quorum::start(3);
    let store = quorum.store_timed(Duration::from_millis(100)).await;
    let unit = unit("order-5");
    let (holder, ttl) = (LockToken::generate(), Duration::from_secs(30));
    store
        .begin(&unit, &holder, ttl, Fencing::Off)
        .await
        .unwrap();
    let (first, second) = (br#"{"step":"a","ok":1}"#, br#"{"step":"b","ok":2}"#);
    for index in [0, 1] {
        let server = quorum.servers[index].store().await;
        let missed = server.record_step(&unit, &holder, StepEntry::new(0, first, DAY), ttl);
        assert!(missed.await.unwrap(), "server {index}");
    }
    let next = store.record_step(&unit, &holder, StepEntry::new(1, second, DAY), ttl);
    assert!(next.await.unwrap());
    let expected = vec![first.to_vec(), second.to_vec()];
    assert_eq!(journal_on(&quorum, 2, &unit).await, expected);
    quorum.signal(0, "STOP");
    let read = store.read_journal(&unit).await;
    quorum.signal(0, "CONT");
    assert_eq!(read.unwrap().into_entries(), expected);
}

/// Three servers where the last holder's record of `first` reached servers 1 and 2 (confirmed)
/// and missed server 0, and a contender's lock is on server 2.
async fn a_server_behind(unit: &UnitOfWork, first: &[u8]) -> Quorum {
    let quorum = Quorum::start(3);
    for index in [1, 2] {
        recorded_on(&quorum, index, unit, first).await;
    }
    let contender = quorum.servers[2].store().await;
    let other = LockToken::generate();
    contender
        .begin(unit, &other, Duration::from_secs(60), Fencing::Off)
        .await
        .unwrap();
    quorum
}

/// `a_server_behind`, and a store and the token of the next holder, granted servers 0 and 1
/// only for `ttl`, which has read the journal.
async fn bare_majority_with_a_server_behind(
    unit: &UnitOfWork,
    first: &[u8],
    ttl: Duration,
) -> (Quorum, idempotask_redis::RedlockStore, LockToken) {
    let quorum = a_server_behind(unit, first).await;
    let store = quorum.store_timed(Duration::from_secs(1)).await;
    let holder = holding(&store, unit, first, ttl).await;
    (quorum, store, holder)
}

/// A token that holds `unit`'s lock on `store` for `ttl`, which read the journal `[first]`.
async fn holding(
    store: &idempotask_redis::RedlockStore,
    unit: &UnitOfWork,
    first: &[u8],
    ttl: Duration,
) -> LockToken {
    let holder = LockToken::generate();
    let begun = store.begin(unit, &holder, ttl, Fencing::Off).await.unwrap();
    assert!(matches!(begun, Begin::Acquired { .. }), "{begun:?}");
    assert_eq!(store.read_journal(unit).await.unwrap().entries(), [first]);
    holder
}

/// A record that came back `stalled` held by one server of three: ambiguous, nothing else.
fn assert_ambiguous(stalled: Result<bool, idempotask::store::StoreError>) {
    match stalled {
        Err(err) => assert!(err.is_ambiguous(), "{err}"),
        Ok(recorded) => panic!("a record held by one server of three answered {recorded}"),
    }
}

/// The journal `entries` on servers 0 and 1, and on server 2 (which refused the last record)
/// the first entry only.
async fn recorded_on_0_and_1_only(quorum: &Quorum, unit: &UnitOfWork, entries: &[&[u8]]) {
    let expected: Vec<Vec<u8>> = entries.iter().map(|entry| entry.to_vec()).collect();
    assert_eq!(journal_on(quorum, 0, unit).await, expected);
    assert_eq!(journal_on(quorum, 1, unit).await, expected);
    assert_eq!(journal_on(quorum, 2, unit).await, expected[..1]);
}

/// A holder granted on a bare majority, one server of which missed the last holder's record:
/// that server's lock is the holder's, so it is given the confirmed journal and the record
/// goes on there. Refusing the record would leave the step's effect done and unrecorded, and
/// the next delivery would run it again (as eight deliveries of one unit did, under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_on_a_bare_majority_with_a_server_behind_is_confirmed() {
    let unit = unit("order-7");
    let (first, second) = (br#"{"step":"a","ok":1}"#, br#"{"step":"b","ok":2}"#);
    let ttl = Duration::from_secs(30);
    let (quorum, store, holder) = bare_majority_with_a_server_behind(&unit, first, ttl).await;
    let next = store.record_step(&unit, &holder, StepEntry::new(1, second, DAY), ttl);
    assert!(next.await.unwrap(), "the holder's record was refused");
    let expected = vec![first.to_vec(), second.to_vec()];
    assert_eq!(journal_on(&quorum, 0, &unit).await, expected);
    assert_eq!(journal_on(&quorum, 1, &unit).await, expected);
    assert_eq!(
        store.read_journal(&unit).await.unwrap().into_entries(),
        expected
    );
}

/// The same bare majority with the journal's other holder stalled (`SIGSTOP`): the record is
/// on one server, and its time runs out while the round waits for the stalled one, whose
/// answer could still decide it. It is ambiguous, never refused (the lock is ours on a
/// majority) nor confirmed; sent again once the server runs, the server behind is given the
/// journal and the record is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_needing_a_server_behind_while_another_is_stalled_is_ambiguous() {
    let unit = unit("order-9");
    let (first, second) = (br#"{"step":"a","ok":1}"#, br#"{"step":"b","ok":2}"#);
    // A TTL of a few server timeouts (1 s each), so that the record's patience is 3 s.
    let ttl = Duration::from_secs(6);
    let (quorum, store, holder) = bare_majority_with_a_server_behind(&unit, first, ttl).await;
    let entry = StepEntry::new(1, second, DAY);
    quorum.signal(2, "STOP");
    let stalled = store.record_step(&unit, &holder, entry, ttl).await;
    quorum.signal(2, "CONT");
    assert_ambiguous(stalled);
    assert!(
        store.record_step(&unit, &holder, entry, ttl).await.unwrap(),
        "the record sent again was refused"
    );
    recorded_on_0_and_1_only(&quorum, &unit, &[first, second]).await;
    assert_eq!(
        store.read_journal(&unit).await.unwrap().entries(),
        [first, second]
    );
}

/// A server behind the journal that stalls at the catch-up itself (a proxy holds its
/// `catch_up.lua`): the record waits for it no longer than its patience (half the TTL), and is
/// ambiguous, neither refused nor confirmed. The catch-up that lands after that writes the
/// confirmed journal only, and the record sent again is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_whose_catch_up_stalls_is_ambiguous_within_its_patience() {
    let unit = unit("order-10");
    let (first, second) = (br#"{"step":"a","ok":1}"#, br#"{"step":"b","ok":2}"#);
    let quorum = a_server_behind(&unit, first).await;
    let proxy = Proxy::start(quorum.servers[0].addr()).await;
    let catch_up = redis::Script::new(include_str!("../src/quorum/catch_up.lua"));
    // Loaded, so that the held request runs when it lands instead of failing with NOSCRIPT.
    let mut server_0 = quorum.servers[0].connection().await;
    let _: String = catch_up
        .prepare_invoke()
        .load_async(&mut server_0)
        .await
        .unwrap();
    let urls = [
        proxy.url(),
        quorum.servers[1].url(),
        quorum.servers[2].url(),
    ];
    let store = idempotask_redis::RedlockStore::builder(urls)
        .server_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    // Patience 5 s: time for the first round and the journal's read before the catch-up on a
    // loaded machine, and the lock still held when the record is sent again.
    let ttl = Duration::from_secs(10);
    let holder = holding(&store, &unit, first, ttl).await;
    proxy.hold_requests_containing(catch_up.get_hash().as_bytes());
    let entry = StepEntry::new(1, second, DAY);
    let started = std::time::Instant::now();
    let stalled = store.record_step(&unit, &holder, entry, ttl).await;
    let took = started.elapsed();
    assert_eq!(proxy.held(), 1, "the record never reached the catch-up");
    assert_ambiguous(stalled);
    assert!(
        took < ttl,
        "the record waited {took:?}, past its lock's TTL"
    );
    proxy.release();
    // The late catch-up lands: server 0 gets the confirmed journal, nothing of the record.
    let landing = std::time::Instant::now();
    while journal_on(&quorum, 0, &unit).await.is_empty() {
        assert!(landing.elapsed() < ttl, "the held catch-up never landed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(journal_on(&quorum, 0, &unit).await, [first]);
    assert!(
        store.record_step(&unit, &holder, entry, ttl).await.unwrap(),
        "the record sent again was refused"
    );
    recorded_on_0_and_1_only(&quorum, &unit, &[first, second]).await;
}

/// Servers that refuse a record (another lock there) may hold another entry at its position,
/// and with them that entry can be a majority's: they answer what they hold, and the entries
/// the holder's servers hold there are not replaced. Here `y` is on four servers of five, two
/// of which refuse; the fifth either missed the journal (behind) or holds all of it before
/// the position (it records). Replacing `y` on the other two would drop a confirmed entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_never_replaces_an_entry_that_refusing_servers_hold() {
    let quorum = Quorum::start(5);
    let ttl = Duration::from_secs(30);
    let (first, held) = (br#"{"step":"a","ok":1}"#, br#"{"step":"b","ok":"y"}"#);
    for (key, fifth_has_first) in [("order-8-behind", false), ("order-8-level", true)] {
        let unit = unit(key);
        if fifth_has_first {
            recorded_on(&quorum, 0, &unit, first).await;
        }
        for index in 1..5 {
            let server = quorum.servers[index].store().await;
            let earlier = LockToken::generate();
            server
                .begin(&unit, &earlier, ttl, Fencing::Off)
                .await
                .unwrap();
            for (position, bytes) in [(0, &first[..]), (1, &held[..])] {
                let entry = StepEntry::new(position, bytes, DAY);
                let recorded = server.record_step(&unit, &earlier, entry, ttl);
                assert!(recorded.await.unwrap(), "{key}: server {index}");
            }
            if index < 3 {
                assert!(server.release(&unit, &earlier).await.unwrap());
            }
        }
        let (store, holder) = acquired(&quorum, &unit, ttl).await;
        let other = br#"{"step":"b","ok":"x"}"#;
        let record = store.record_step(&unit, &holder, StepEntry::new(1, other, DAY), ttl);
        let answer = record.await;
        assert!(
            !matches!(answer, Ok(true)),
            "{key}: a record over an entry four servers hold was confirmed"
        );
        for index in 1..5 {
            assert_eq!(
                journal_on(&quorum, index, &unit).await,
                vec![first.to_vec(), held.to_vec()],
                "{key}: server {index}"
            );
        }
    }
}

/// A record sent again (its first reply lost) renews the lock as the first send did: the
/// runner counts its lock from the second send, so a lock left at the first send's TTL would
/// lapse before the runner thinks, and a later holder's takeover meet a step still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_sent_again_renews_the_lock() {
    let quorum = Quorum::start(3);
    let single = quorum.servers[0].store().await;
    renewed_by_a_second_send(&single, &unit("order-6-one-server")).await;
    let store = quorum.store_timed(Duration::from_secs(1)).await;
    renewed_by_a_second_send(&store, &unit("order-6-quorum")).await;
}

/// Records one entry twice, the second time with a longer lock TTL, and checks the lock has it.
async fn renewed_by_a_second_send(store: &impl Store, unit: &UnitOfWork) {
    let (short, long) = (Duration::from_secs(30), Duration::from_secs(600));
    let entry = br#"{"step":"charge","ok":1}"#;
    let holder = LockToken::generate();
    store
        .begin(unit, &holder, short, Fencing::Off)
        .await
        .unwrap();
    for ttl in [short, long] {
        let recorded = store.record_step(unit, &holder, StepEntry::new(0, entry, DAY), ttl);
        assert!(recorded.await.unwrap());
    }
    let left = store
        .inspect(unit)
        .await
        .unwrap()
        .lock_ttl
        .expect("the lock is held");
    assert!(
        left > short,
        "the lock was left at the first send's TTL: {left:?}"
    );
}

/// Counts the `WARN` events that name a lock TTL under two server timeouts.
#[derive(Clone, Default)]
struct ShortTtlWarnings(std::sync::Arc<AtomicU32>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ShortTtlWarnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let fields = event.metadata().fields();
        if *event.metadata().level() == tracing::Level::WARN
            && fields.field("lock_ttl_ms").is_some()
            && fields.field("server_timeout_ms").is_some()
        {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The docs ask for a lock TTL of at least two server timeouts: a store given a shorter one
/// says so, once per store (a second store says so again), and says nothing for a TTL that fits.
#[tokio::test(flavor = "current_thread")]
async fn a_lock_ttl_under_two_server_timeouts_is_logged_once_per_store() {
    use tracing_subscriber::layer::SubscriberExt;

    let warnings = ShortTtlWarnings::default();
    let _logged =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let quorum = Quorum::start(3);
    let (first, second) = (
        quorum.store_timed(Duration::from_millis(500)).await,
        quorum.store_timed(Duration::from_millis(500)).await,
    );
    // Whether a begin is granted does not matter here: the TTL is looked at before the round.
    let begin = |store: &idempotask_redis::RedlockStore, key: &'static str, ttl: Duration| {
        let store = store.clone();
        async move {
            let token = LockToken::generate();
            let _ = store.begin(&unit(key), &token, ttl, Fencing::Off).await;
        }
    };
    let logged = || warnings.0.load(Ordering::SeqCst);
    begin(&first, "fits", Duration::from_secs(1)).await;
    assert_eq!(logged(), 0, "a TTL of two server timeouts fits");
    begin(&first, "short-1", Duration::from_millis(999)).await;
    assert_eq!(logged(), 1);
    begin(&first, "short-2", Duration::from_millis(600)).await;
    assert_eq!(logged(), 1, "logged once per store");
    begin(&second, "short-3", Duration::from_millis(600)).await;
    assert_eq!(logged(), 2, "another store logs it too");
}
