//! Units left in doubt on purpose, for the tests of what each integration makes of a unit its
//! task holds ([`InDoubt::Hold`](idempotask::InDoubt::Hold)).

use std::time::Duration;

use idempotask::store::{Begin, Fencing, LockToken, Store, UnitOfWork};

/// Leaves the unit of `task` and `key` in doubt in `store`, as a delivery that took its lock
/// and was then killed leaves it: a lock of 100 ms, remembered for a minute, that runs out
/// without a release or a result. Answers the unit, once its lock has run out.
pub async fn leave_in_doubt(store: &impl Store, task: &str, key: &str) -> UnitOfWork {
    let unit = UnitOfWork::new(task, key).expect("a usable task name and key");
    let killed = LockToken::generate().with_doubt_memory(Duration::from_secs(60));
    let begun = store
        .begin(&unit, &killed, Duration::from_millis(100), Fencing::Off)
        .await
        .expect("the store takes the lock");
    assert!(
        matches!(begun, Begin::Acquired { in_doubt: None, .. }),
        "the unit was not free: {begun:?}"
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    unit
}
