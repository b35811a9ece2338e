//! [`LocalResultCache`]: a bounded, per-process cache of completed units' markers in front of
//! a store, so that a duplicate of a unit this process already saw done costs no round trip.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Begin, Claim, Completion, Fencing, Finish, Inspection, Journal, StepEntry, Store};
use crate::error::{StoreError, StoreErrorKind};
use crate::unit::{LockToken, UnitOfWork};

/// The largest marker a cache keeps unless told otherwise
/// ([`LocalResultCache::max_marker_bytes`]): 64 KiB.
pub const DEFAULT_MAX_MARKER_BYTES: usize = 64 * 1024;

/// A store that remembers, in this process, the completion markers of the units it saw done,
/// and answers a later `begin` of such a unit from memory: a duplicate delivered to this
/// process costs no store command.
///
/// Only completed units are kept, never a lock, a unit in progress or a unit in doubt: a
/// `begin` the cache cannot answer goes to the wrapped store unchanged, so two concurrent
/// deliveries of a fresh unit still meet at the store's lock. An entry comes from this
/// process's own `finish` that completed (the marker it wrote, its time counted from before
/// the write was sent; a marker written after the lock was lost is left to the store), or
/// from a `begin` the store answered with a marker, whose remaining time the cache then reads
/// once with [`inspect`](Store::inspect): the first duplicate of a unit that another process
/// completed costs that one read more, the later ones nothing. Each entry expires no later than
/// its marker in the store; a marker the store keeps forever is kept until it is evicted. The
/// least recently used entry is evicted beyond `capacity`, and a marker longer than
/// [`max_marker_bytes`](Self::max_marker_bytes) is not kept (nor its remaining time read: its
/// duplicates cost what they cost without the cache).
///
/// **What `forget` cannot reach.** [`forget`](Store::forget) through this cache drops its own
/// entry, but not the entries of other processes' caches (another replica, a worker, the CLI's
/// `idempotask forget`): until their entries expire, those processes keep answering duplicates
/// with the forgotten result. Turn the cache on only for tasks whose results are not forgotten
/// or resolved by hand while their duplicates may still arrive, or keep its entries short
/// ([`max_age`](Self::max_age)). `release`, `renew` and `inspect` go straight through; an
/// operator's `inspect` sees the store, not the cache. A batched `begin` is answered from the
/// cache where it can; the units it sends on are not learnt from when they come back done
/// (only a single `begin`'s are), and a batched `finish` is learnt from as a single one is.
///
/// ```
/// use std::num::NonZeroUsize;
/// use idempotask::store::LocalResultCache;
/// use idempotask::{MemoryStore, Task};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
/// let store = LocalResultCache::new(MemoryStore::new(), NonZeroUsize::new(10_000).unwrap());
/// let task = Task::new("charge");
/// let first: u8 = task.call("order-1").store(store.clone()).run(async { Ok::<_, idempotask::Error>(1) }).await?;
/// // Answered from this process's memory: the store is not asked.
/// let again: u8 = task.call("order-1").store(store.clone()).run(async { Ok::<_, idempotask::Error>(2) }).await?;
/// assert_eq!((first, again), (1, 1));
/// assert_eq!(store.hits(), 1);
/// # Ok(()) }
/// ```
pub struct LocalResultCache<S> {
    store: S,
    shared: Arc<Shared>,
    /// This handle's bounds: its clones share the entries, each keeps its own settings.
    max_marker_bytes: usize,
    max_age: Option<Duration>,
}

struct Shared {
    capacity: NonZeroUsize,
    entries: Mutex<Entries>,
}

/// The entries, and their order of use: `order` maps a use stamp to the unit last used then.
#[derive(Default)]
struct Entries {
    by_unit: HashMap<UnitOfWork, Entry>,
    order: BTreeMap<u64, UnitOfWork>,
    next_stamp: u64,
    hits: u64,
    /// How many forgets through the cache have ended: a marker whose store call was sent
    /// before one of them ended may have been forgotten after it was written or read, and is
    /// not kept.
    forgets: u64,
}

struct Entry {
    marker: Arc<[u8]>,
    /// When its marker expires in the store at the latest (`None`: never).
    expires: Option<Instant>,
    /// When the store call it was learnt from was sent: `max_age` counts from here.
    since: Instant,
    stamp: u64,
}

impl<S: Clone> Clone for LocalResultCache<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            shared: Arc::clone(&self.shared),
            max_marker_bytes: self.max_marker_bytes,
            max_age: self.max_age,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for LocalResultCache<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalResultCache")
            .field("store", &self.store)
            .field("capacity", &self.shared.capacity)
            .field("entries", &self.len())
            .finish_non_exhaustive()
    }
}

impl<S> LocalResultCache<S> {
    /// Wraps `store` with a cache of at most `capacity` completed units. A capacity is never 0:
    /// no cache is no wrapper.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use idempotask::store::LocalResultCache;
    /// let store = LocalResultCache::new(idempotask::MemoryStore::new(), NonZeroUsize::MIN);
    /// assert_eq!(store.capacity().get(), 1);
    /// ```
    pub fn new(store: S, capacity: NonZeroUsize) -> Self {
        Self {
            store,
            shared: Arc::new(Shared {
                capacity,
                entries: Mutex::new(Entries::default()),
            }),
            max_marker_bytes: DEFAULT_MAX_MARKER_BYTES,
            max_age: None,
        }
    }

    /// Keeps no marker longer than `bytes` ([`DEFAULT_MAX_MARKER_BYTES`] by default): the
    /// cache's memory stays below about `capacity` times this. It bounds what this handle (and
    /// the clones made from it afterwards) keeps; the entries are shared with every clone.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use idempotask::store::LocalResultCache;
    /// let store = LocalResultCache::new(idempotask::MemoryStore::new(), NonZeroUsize::MIN)
    ///     .max_marker_bytes(4096);
    /// # let _ = store;
    /// ```
    #[must_use]
    pub fn max_marker_bytes(mut self, bytes: usize) -> Self {
        self.max_marker_bytes = bytes;
        self
    }

    /// Answers from no entry older than `age`, even when its marker lives longer: the bound on
    /// how long another process's [`forget`](Store::forget) goes unseen here. It bounds this
    /// handle (and the clones made from it afterwards); the entries, and a forget through any
    /// clone, are shared with every clone.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use std::time::Duration;
    /// use idempotask::store::LocalResultCache;
    /// let store = LocalResultCache::new(idempotask::MemoryStore::new(), NonZeroUsize::MIN)
    ///     .max_age(Duration::from_secs(60));
    /// # let _ = store;
    /// ```
    #[must_use]
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }

    /// The most entries the cache keeps.
    pub fn capacity(&self) -> NonZeroUsize {
        self.shared.capacity
    }

    /// How many entries it keeps now, expired ones not yet dropped included.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use idempotask::store::LocalResultCache;
    /// let store = LocalResultCache::new(idempotask::MemoryStore::new(), NonZeroUsize::MIN);
    /// assert_eq!(store.len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.entries().by_unit.len()
    }

    /// Whether it keeps no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many `begin`s it answered without the store, since it was made.
    pub fn hits(&self) -> u64 {
        self.entries().hits
    }

    /// The store it wraps.
    pub fn store(&self) -> &S {
        &self.store
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // The entries are consistent after every statement: a panic elsewhere leaves them usable.
        self.shared
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The unit's marker, when an entry that has not expired holds it.
    fn lookup(&self, unit: &UnitOfWork) -> Option<Vec<u8>> {
        let now = Instant::now();
        let mut entries = self.entries();
        let Entries {
            by_unit,
            order,
            next_stamp,
            hits,
            ..
        } = &mut *entries;
        let entry = by_unit.get_mut(unit)?;
        let too_old = self
            .max_age
            .and_then(|age| entry.since.checked_add(age))
            .is_some_and(|bound| bound <= now);
        if too_old || entry.expires.is_some_and(|expires| expires <= now) {
            order.remove(&entry.stamp);
            by_unit.remove(unit);
            return None;
        }
        order.remove(&entry.stamp);
        entry.stamp = *next_stamp;
        order.insert(*next_stamp, unit.clone());
        *next_stamp += 1;
        *hits += 1;
        Some(entry.marker.to_vec())
    }

    /// How many forgets through the cache have ended: taken before a store call whose answer
    /// may be remembered, and handed to [`remember`](Self::remember).
    fn forgets(&self) -> u64 {
        self.entries().forgets
    }

    /// Keeps `marker` for `unit` for the `ttl` its marker has in the store from `since` (`None`:
    /// no expiry), bounded by [`max_age`](Self::max_age); unless a forget through the cache
    /// ended after `forgets` was taken, before `since`.
    fn remember(
        &self,
        unit: &UnitOfWork,
        marker: &[u8],
        since: Instant,
        ttl: Option<Duration>,
        forgets: u64,
    ) {
        if marker.len() > self.max_marker_bytes {
            return;
        }
        let expires = ttl.and_then(|ttl| since.checked_add(ttl));
        let aged = self.max_age.and_then(|age| since.checked_add(age));
        let now = Instant::now();
        if expires.into_iter().chain(aged).any(|bound| bound <= now) {
            return;
        }
        let mut entries = self.entries();
        if entries.forgets != forgets {
            return;
        }
        let stamp = entries.next_stamp;
        entries.next_stamp += 1;
        let entry = Entry {
            marker: marker.into(),
            expires,
            since,
            stamp,
        };
        if let Some(old) = entries.by_unit.insert(unit.clone(), entry) {
            entries.order.remove(&old.stamp);
        }
        entries.order.insert(stamp, unit.clone());
        while entries.by_unit.len() > self.shared.capacity.get() {
            let Some((_, oldest)) = entries.order.pop_first() else {
                break;
            };
            entries.by_unit.remove(&oldest);
        }
    }

    /// Drops `unit`'s entry; `forgot` counts a forget that ended.
    fn drop_entry(&self, unit: &UnitOfWork, forgot: bool) {
        let mut entries = self.entries();
        if let Some(old) = entries.by_unit.remove(unit) {
            entries.order.remove(&old.stamp);
        }
        if forgot {
            entries.forgets += 1;
        }
    }
}

impl<S: Store> LocalResultCache<S> {
    /// Learns a marker the store answered a `begin` with: its remaining time is read once, and
    /// the entry kept only when the store still holds those same bytes.
    async fn learn(&self, unit: &UnitOfWork, marker: &[u8]) {
        if marker.len() > self.max_marker_bytes || self.max_age == Some(Duration::ZERO) {
            // Never kept: reading its time would add a round trip to every duplicate.
            return;
        }
        let forgets = self.forgets();
        let since = Instant::now();
        if let Ok(Inspection {
            marker: Some(stored),
            marker_ttl,
            ..
        }) = self.store.inspect(unit).await
            && stored == marker
        {
            self.remember(unit, marker, since, marker_ttl, forgets);
        }
    }
}

impl<S: Store> Store for LocalResultCache<S> {
    fn max_key_len(&self) -> usize {
        self.store.max_key_len()
    }

    // Not the wrapped store's answer: a consumer would put this cache behind a `BatchingStore`,
    // and its hits would wait for batches; wrapped around a `BatchingStore` instead, they never do.
    fn batches_natively(&self) -> bool {
        false
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        if let Some(marker) = self.lookup(unit) {
            return Ok(Begin::Done(marker));
        }
        let answer = self.store.begin(unit, token, lock_ttl, fencing).await?;
        if let Begin::Done(marker) = &answer {
            self.learn(unit, marker).await;
        }
        Ok(answer)
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let forgets = self.forgets();
        let since = Instant::now();
        let answer = self.store.finish(unit, token, marker, result_ttl).await?;
        if answer == Finish::Completed {
            self.remember(unit, marker, since, Some(result_ttl), forgets);
        }
        Ok(answer)
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
        self.store.inspect(unit).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.drop_entry(unit, false);
        let forgotten = self.store.forget(unit).await;
        // A finish or a read of this process whose store call was sent before this point may
        // have met the marker before the store forgot it: its entry is dropped, and the count
        // keeps one remembered after this point out.
        self.drop_entry(unit, true);
        forgotten
    }

    fn records_steps(&self) -> bool {
        self.store.records_steps()
    }

    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.store.read_journal(unit).await
    }

    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.store.record_step(unit, token, entry, lock_ttl).await
    }

    async fn begin_batch(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        let mut answers: Vec<Option<Result<Begin, StoreError>>> = claims
            .iter()
            .map(|claim| {
                self.lookup(claim.unit)
                    .map(|marker| Ok(Begin::Done(marker)))
            })
            .collect();
        let missed: Vec<Claim<'_>> = claims
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(claim, _)| *claim)
            .collect();
        if !missed.is_empty() {
            let mut sent = self
                .store
                .begin_batch(&missed, lock_ttl, fencing)
                .await
                .into_iter();
            for answer in answers.iter_mut().filter(|answer| answer.is_none()) {
                *answer = sent.next();
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(StoreError::new(
                        "begin",
                        StoreErrorKind::Protocol,
                        "the wrapped store's begin_batch answered fewer units than it was sent",
                    ))
                })
            })
            .collect()
    }

    async fn finish_batch(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        let forgets = self.forgets();
        let since = Instant::now();
        let answers = self.store.finish_batch(completions, result_ttl).await;
        for (completion, answer) in completions.iter().zip(&answers) {
            if matches!(answer, Ok(Finish::Completed)) {
                self.remember(
                    completion.unit,
                    completion.marker,
                    since,
                    Some(result_ttl),
                    forgets,
                );
            }
        }
        answers
    }
}

#[cfg(test)]
mod tests;
