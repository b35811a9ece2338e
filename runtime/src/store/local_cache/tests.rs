use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::{Error, MemoryStore, Task};

const TTL: Duration = Duration::from_secs(30);

/// A `MemoryStore` shared between "processes" (caches), counting what reaches it; with a
/// pause, its `finish` or `inspect` stops after the store answered until told to go on.
#[derive(Debug, Clone, Default)]
struct Counting {
    store: MemoryStore,
    calls: Arc<Calls>,
    pause: Option<Arc<Pause>>,
}

/// The window between the store's answer and the cache's bookkeeping, in which a forget lands.
#[derive(Debug)]
struct Pause {
    call: &'static str,
    answered: tokio::sync::Notify,
    go_on: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Calls {
    begins: AtomicUsize,
    inspects: AtomicUsize,
    finishes: AtomicUsize,
}

impl Counting {
    fn begins(&self) -> usize {
        self.calls.begins.load(Ordering::SeqCst)
    }

    fn inspects(&self) -> usize {
        self.calls.inspects.load(Ordering::SeqCst)
    }

    /// The same store, its `call` ("finish" or "inspect") paused.
    fn paused(&self, call: &'static str) -> Self {
        let pause = Pause {
            call,
            answered: tokio::sync::Notify::new(),
            go_on: tokio::sync::Notify::new(),
        };
        Self {
            pause: Some(Arc::new(pause)),
            ..self.clone()
        }
    }

    async fn hold(&self, call: &str) {
        if let Some(pause) = self.pause.as_ref().filter(|pause| pause.call == call) {
            pause.answered.notify_one();
            pause.go_on.notified().await;
        }
    }
}

impl Store for Counting {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.calls.begins.fetch_add(1, Ordering::SeqCst);
        self.store.begin(unit, token, lock_ttl, fencing).await
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.calls.finishes.fetch_add(1, Ordering::SeqCst);
        let answer = self.store.finish(unit, token, marker, result_ttl).await;
        self.hold("finish").await;
        answer
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.store.release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.store.renew(unit, token, lock_ttl).await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.calls.inspects.fetch_add(1, Ordering::SeqCst);
        let answer = self.store.inspect(unit).await;
        self.hold("inspect").await;
        answer
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.store.forget(unit).await
    }
}

fn cache(store: &Counting, capacity: usize) -> LocalResultCache<Counting> {
    LocalResultCache::new(store.clone(), NonZeroUsize::new(capacity).unwrap())
}

fn unit(key: &str) -> UnitOfWork {
    UnitOfWork::new("charge", key).unwrap()
}

/// Runs `key` through `store`, the body answering `value` and counting its runs in `ran`.
async fn run(
    store: &LocalResultCache<Counting>,
    key: &str,
    value: u32,
    ran: &AtomicUsize,
) -> Result<u32, Error> {
    static TASK: Task = Task::new("charge");
    TASK.call(key)
        .store(store.clone())
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(value)
        })
        .await
}

/// Completes `unit` with `marker` through `store`, directly.
async fn complete(store: &LocalResultCache<Counting>, unit: &UnitOfWork, marker: &[u8]) {
    let token = LockToken::generate();
    let begun = store.begin(unit, &token, TTL, Fencing::Off).await.unwrap();
    assert!(matches!(begun, Begin::Acquired { .. }), "{begun:?}");
    let finished = store.finish(unit, &token, marker, TTL).await.unwrap();
    assert_eq!(finished, Finish::Completed);
}

#[tokio::test]
async fn a_duplicate_of_a_unit_this_process_completed_never_reaches_the_store() {
    let store = Counting::default();
    let cached = cache(&store, 16);
    let ran = AtomicUsize::new(0);
    assert_eq!(run(&cached, "order-1", 1, &ran).await.unwrap(), 1);
    let begins = store.begins();
    for _ in 0..5 {
        assert_eq!(run(&cached, "order-1", 2, &ran).await.unwrap(), 1);
    }
    assert_eq!(store.begins(), begins, "no begin reached the store");
    assert_eq!(store.inspects(), 0);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(cached.hits(), 5);
}

#[tokio::test]
async fn a_unit_another_process_completed_costs_one_read_then_nothing() {
    let store = Counting::default();
    let (here, there) = (cache(&store, 16), cache(&store, 16));
    let ran = AtomicUsize::new(0);
    run(&there, "order-1", 1, &ran).await.unwrap();
    let (begins, inspects) = (store.begins(), store.inspects());
    assert_eq!(run(&here, "order-1", 2, &ran).await.unwrap(), 1);
    assert_eq!(
        (store.begins(), store.inspects()),
        (begins + 1, inspects + 1)
    );
    assert_eq!(run(&here, "order-1", 3, &ran).await.unwrap(), 1);
    assert_eq!(
        (store.begins(), store.inspects()),
        (begins + 1, inspects + 1)
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn locks_and_units_in_progress_are_never_kept() {
    let store = Counting::default();
    let (here, there) = (cache(&store, 16), cache(&store, 16));
    let unit = unit("order-1");
    let holder = LockToken::generate();
    let begun = here.begin(&unit, &holder, TTL, Fencing::Off).await.unwrap();
    assert!(matches!(begun, Begin::Acquired { .. }));
    // A second delivery, in this process or another, meets the lock at the store.
    for cache in [&here, &there] {
        let busy = cache
            .begin(&unit, &LockToken::generate(), TTL, Fencing::Off)
            .await
            .unwrap();
        assert!(matches!(busy, Begin::Busy { .. }), "{busy:?}");
    }
    assert!(here.release(&unit, &holder).await.unwrap());
    assert!(here.is_empty() && there.is_empty());
    let again = there
        .begin(&unit, &LockToken::generate(), TTL, Fencing::Off)
        .await
        .unwrap();
    assert!(matches!(again, Begin::Acquired { .. }), "{again:?}");
}

#[tokio::test]
async fn a_changed_fingerprint_is_refused_from_the_cache_too() {
    static TASK: Task = Task::new("refund");
    let cached = cache(&Counting::default(), 16);
    let first: u32 = TASK
        .call("refund-1")
        .fingerprint_of(&(&500_u32,))
        .unwrap()
        .store(cached.clone())
        .run(async { Ok::<_, Error>(500) })
        .await
        .unwrap();
    assert_eq!(first, 500);
    let changed = TASK
        .call("refund-1")
        .fingerprint_of(&(&600_u32,))
        .unwrap()
        .store(cached.clone())
        .run(async { Ok::<_, Error>(600_u32) })
        .await;
    assert!(
        matches!(changed, Err(Error::KeyReuse { .. })),
        "{changed:?}"
    );
    assert_eq!(cached.hits(), 1, "the refusal came from the cached marker");
}

#[tokio::test]
async fn the_least_recently_used_entry_is_evicted_beyond_capacity() {
    let cached = cache(&Counting::default(), 2);
    let (a, b, c) = (unit("a"), unit("b"), unit("c"));
    complete(&cached, &a, b"D1,dAAAA|a|1").await;
    complete(&cached, &b, b"D1,dAAAA|b|2").await;
    assert!(
        cached.lookup(&a).is_some(),
        "a is now the most recently used"
    );
    complete(&cached, &c, b"D1,dAAAA|c|3").await;
    assert_eq!(cached.len(), 2);
    assert!(cached.lookup(&b).is_none(), "b was the least recently used");
    assert!(cached.lookup(&a).is_some() && cached.lookup(&c).is_some());
}

#[tokio::test]
async fn an_entry_expires_no_later_than_its_marker() {
    let cached = cache(&Counting::default(), 16);
    let unit = unit("order-1");
    let token = LockToken::generate();
    cached
        .begin(&unit, &token, TTL, Fencing::Off)
        .await
        .unwrap();
    let before = Instant::now();
    cached
        .finish(&unit, &token, b"D7,dAAAA|order-1|1", TTL)
        .await
        .unwrap();
    let expires = cached.entries().by_unit[&unit].expires.unwrap();
    assert!(expires <= Instant::now() + TTL && expires >= before + TTL);
    // A marker the store reports with little time left is kept for no longer.
    let there = cache(cached.store(), 16);
    let marker = b"D7,dAAAA|order-1|1";
    let since = Instant::now();
    there.learn(&unit, marker).await;
    let learnt = there.entries().by_unit[&unit].expires.unwrap();
    assert!(learnt <= since + TTL, "counted from before the read");
}

#[tokio::test]
async fn an_expired_entry_is_dropped_and_the_store_asked() {
    let store = Counting::default();
    let cached = cache(&store, 16).max_age(Duration::from_millis(20));
    let unit = unit("order-1");
    complete(&cached, &unit, b"D7,dAAAA|order-1|1").await;
    assert!(!cached.is_empty());
    // The entry's life is the thing under test: waiting it out is the signal.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let begins = store.begins();
    let answer = cached
        .begin(&unit, &LockToken::generate(), TTL, Fencing::Off)
        .await
        .unwrap();
    assert!(matches!(answer, Begin::Done(_)));
    assert_eq!(store.begins(), begins + 1, "the store was asked");
}

#[tokio::test]
async fn forget_drops_this_process_entry_and_not_another_one() {
    let store = Counting::default();
    let (here, there) = (cache(&store, 16), cache(&store, 16));
    let ran = AtomicUsize::new(0);
    run(&here, "order-1", 1, &ran).await.unwrap();
    run(&there, "order-1", 2, &ran).await.unwrap();
    assert_eq!(there.len(), 1);
    assert!(here.forget(&unit("order-1")).await.unwrap());
    assert!(here.is_empty());
    // Documented: the other process still answers from its entry until it expires.
    assert_eq!(run(&there, "order-1", 3, &ran).await.unwrap(), 1);
    // This process asks the store, which forgot: the body runs again.
    assert_eq!(run(&here, "order-1", 4, &ran).await.unwrap(), 4);
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_marker_over_the_size_bound_or_a_zero_age_is_not_kept() {
    let store = Counting::default();
    let small = cache(&store, 16).max_marker_bytes(8);
    complete(&small, &unit("big"), b"D3,dAAAA|big|12345").await;
    assert!(small.is_empty());
    let ageless = cache(&store, 16).max_age(Duration::ZERO);
    complete(&ageless, &unit("old"), b"D3,dAAAA|old|1").await;
    assert!(ageless.is_empty());
}

#[tokio::test]
async fn a_batch_is_answered_from_the_cache_where_it_can_in_order() {
    let store = Counting::default();
    let cached = cache(&store, 16);
    let (done, fresh) = (unit("done"), unit("fresh"));
    complete(&cached, &done, b"D4,dAAAA|done|1").await;
    let begins = store.begins();
    let tokens = [LockToken::generate(), LockToken::generate()];
    let claims = [
        Claim::new(&fresh, &tokens[0]),
        Claim::new(&done, &tokens[1]),
    ];
    let answers = cached.begin_batch(&claims, TTL, Fencing::Off).await;
    assert!(matches!(answers[0], Ok(Begin::Acquired { .. })));
    assert!(matches!(&answers[1], Ok(Begin::Done(marker)) if marker == b"D4,dAAAA|done|1"));
    assert_eq!(store.begins(), begins + 1, "only the fresh unit was sent");
    let marker = b"D5,dAAAA|fresh|2";
    let finished = cached
        .finish_batch(&[Completion::new(&fresh, &tokens[0], marker)], TTL)
        .await;
    assert!(matches!(finished[0], Ok(Finish::Completed)));
    assert_eq!(cached.lookup(&fresh).as_deref(), Some(&marker[..]));
}

#[tokio::test]
async fn a_finish_after_the_lock_was_lost_is_left_to_the_store() {
    let cached = cache(&Counting::default(), 16);
    let unit = unit("order-1");
    // Nobody held the unit: the store keeps the marker, as a lock lost.
    let finished = cached
        .finish(&unit, &LockToken::generate(), b"D7,dAAAA|order-1|1", TTL)
        .await
        .unwrap();
    assert!(matches!(
        finished,
        Finish::LockLost {
            marker_written: true,
            ..
        }
    ));
    assert!(cached.is_empty());
}

/// Forgets `unit` through `cached` once the paused call has its answer, then lets it go on.
async fn forget_in_the_window(cached: &LocalResultCache<Counting>, unit: &UnitOfWork) {
    let pause = cached.store().pause.as_ref().unwrap();
    pause.answered.notified().await;
    assert!(cached.forget(unit).await.unwrap(), "the marker was there");
    pause.go_on.notify_one();
}

#[tokio::test]
async fn a_forget_that_lands_while_a_finish_is_answered_is_not_undone() {
    let cached = cache(&Counting::default().paused("finish"), 1);
    let unit = unit("order-1");
    let token = LockToken::generate();
    let begun = cached
        .begin(&unit, &token, TTL, Fencing::Off)
        .await
        .unwrap();
    assert!(matches!(begun, Begin::Acquired { .. }), "{begun:?}");
    let (finished, ()) = tokio::join!(
        cached.finish(&unit, &token, b"D7,dAAAA|order-1|1", TTL),
        forget_in_the_window(&cached, &unit),
    );
    assert_eq!(finished.unwrap(), Finish::Completed);
    assert!(
        cached
            .store()
            .store
            .inspect(&unit)
            .await
            .unwrap()
            .marker
            .is_none()
    );
    assert!(
        cached.is_empty(),
        "the forgotten marker is not served from memory"
    );
}

#[tokio::test]
async fn a_forget_that_lands_while_a_marker_is_learnt_is_not_undone() {
    let there = cache(&Counting::default(), 1);
    let unit = unit("order-1");
    let token = LockToken::generate();
    there.begin(&unit, &token, TTL, Fencing::Off).await.unwrap();
    there
        .finish(&unit, &token, b"D7,dAAAA|order-1|1", TTL)
        .await
        .unwrap();
    let here = cache(&there.store().paused("inspect"), 1);
    let duplicate = LockToken::generate();
    let (begun, ()) = tokio::join!(
        here.begin(&unit, &duplicate, TTL, Fencing::Off),
        forget_in_the_window(&here, &unit),
    );
    assert!(matches!(begun.unwrap(), Begin::Done(_)));
    assert!(
        here.is_empty(),
        "the forgotten marker is not served from memory"
    );
}

#[tokio::test]
async fn a_clone_set_up_afterwards_shares_the_entries_and_keeps_its_own_bounds() {
    let store = Counting::default();
    let base = cache(&store, 16);
    let worker = base.clone();
    let aged = base.max_age(Duration::from_millis(20)).max_marker_bytes(64);
    let ran = AtomicUsize::new(0);
    run(&worker, "order-1", 1, &ran).await.unwrap();
    assert_eq!(
        aged.len(),
        1,
        "one cache, whichever handle learnt the entry"
    );
    assert!(aged.forget(&unit("order-1")).await.unwrap());
    // A forget through one handle reaches the others in this process.
    assert_eq!(run(&worker, "order-1", 2, &ran).await.unwrap(), 2);
    // The entry's age is the thing under test: waiting it out is the signal.
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(
        aged.lookup(&unit("order-1")).is_none(),
        "too old for this handle"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_marker_too_large_to_keep_costs_no_read_of_its_time() {
    let store = Counting::default();
    let there = cache(&store, 16);
    let unit = unit("big");
    complete(&there, &unit, b"D3,dAAAA|big|12345").await;
    let here = cache(&store, 16).max_marker_bytes(8);
    let inspects = store.inspects();
    for _ in 0..3 {
        let answer = here
            .begin(&unit, &LockToken::generate(), TTL, Fencing::Off)
            .await
            .unwrap();
        assert!(matches!(answer, Begin::Done(_)));
    }
    assert!(here.is_empty());
    assert_eq!(
        store.inspects(),
        inspects,
        "one round trip per duplicate, as without a cache"
    );
}
