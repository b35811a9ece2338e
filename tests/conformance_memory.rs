//! The conformance suite on `MemoryStore`, and the fault harness on a store with a planted bug.

use std::time::Duration;

use idempotask::MemoryStore;
use idempotask::store::{
    Begin, Fencing, Finish, Inspection, LockToken, SharedStore, Store, StoreError, UnitOfWork,
    lock_lost_marker,
};

idempotask_conformance::conformance_tests!(((), idempotask::MemoryStore::new()));
idempotask_conformance::doubt_conformance_tests!(((), idempotask::MemoryStore::new()));
idempotask_conformance::step_conformance_tests!(((), idempotask::MemoryStore::new()));

/// `MemoryStore` with one planted bug: a finish that finds the result it stored after its lock
/// was lost (a client re-sending a finish whose reply was lost) answers `Completed`, as if the
/// lock had been held, where the store must answer `LockLost { marker_written: true }` again.
#[derive(Debug, Default)]
struct ResentFinishBug(MemoryStore);

impl Store for ResentFinishBug {
    fn max_key_len(&self) -> usize {
        self.0.max_key_len()
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.0.begin(unit, token, lock_ttl, fencing).await
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let found = self.0.inspect(unit).await?.marker;
        let answer = self.0.finish(unit, token, marker, result_ttl).await?;
        if found.is_some() && found == lock_lost_marker(marker) {
            return Ok(Finish::Completed); // the planted bug
        }
        Ok(answer)
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.0.release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.0.renew(unit, token, lock_ttl).await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.0.inspect(unit).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.0.forget(unit).await
    }
}

/// The fault harness's outcome oracle catches the planted bug: a finish re-sent after the lock
/// ran out, past the lock TTL, is the case that shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(
    expected = "answered `Completed` on finding its own result written after its lock was lost"
)]
async fn the_fault_harness_catches_a_resent_finish_that_takes_its_own_marker_for_success() {
    idempotask_conformance::every_fault_point(SharedStore::new(ResentFinishBug::default())).await;
}

/// The suite through `BatchingStore`, which sends concurrent calls to the store as batches:
/// every check holds for a unit whose calls go in a batch with others'.
mod batching {
    idempotask_conformance::conformance_tests!((
        (),
        idempotask::store::BatchingStore::new(idempotask::MemoryStore::new())
    ));
    idempotask_conformance::doubt_conformance_tests!((
        (),
        idempotask::store::BatchingStore::new(idempotask::MemoryStore::new())
    ));
    idempotask_conformance::step_conformance_tests!((
        (),
        idempotask::store::BatchingStore::new(idempotask::MemoryStore::new())
    ));
}

/// The suite through `LocalResultCache`, which answers duplicates of completed units from
/// memory: every promise of a store holds with it in front (a unit forgotten through it is
/// forgotten here; locks and units in doubt always reach the store).
mod local_cache {
    fn cached() -> idempotask::store::LocalResultCache<idempotask::MemoryStore> {
        idempotask::store::LocalResultCache::new(
            idempotask::MemoryStore::new(),
            std::num::NonZeroUsize::new(1024).unwrap(),
        )
    }

    idempotask_conformance::conformance_tests!(((), cached()));
    idempotask_conformance::doubt_conformance_tests!(((), cached()));
    idempotask_conformance::step_conformance_tests!(((), cached()));
}
