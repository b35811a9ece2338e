//! The process-wide store: none installed is an error, never a silent fallback.

use idempotask::{Error, MemoryStore, Task};

static GREET: Task = Task::new("greet");

#[tokio::test]
async fn tasks_fail_until_a_store_is_installed_then_use_it() {
    let ran = std::sync::atomic::AtomicBool::new(false);
    let result: Result<u8, Error> = GREET
        .call("user-1")
        .run(async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(1)
        })
        .await;
    assert!(matches!(result, Err(Error::NotConfigured)), "{result:?}");
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));

    let store = MemoryStore::new();
    assert!(idempotask::install(store.clone()).is_none());
    let first: u8 = GREET
        .call("user-1")
        .run(async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let again: u8 = GREET
        .call("user-1")
        .run(async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!((first, again), (1, 1));
    // The installed store is the one that holds the marker.
    let unit = idempotask::store::UnitOfWork::new("greet", "user-1").unwrap();
    assert!(
        idempotask::store::Store::inspect(&store, &unit)
            .await
            .unwrap()
            .is_done()
    );
    // A task's own store wins over the installed one.
    let own: u8 = GREET
        .call("user-1")
        .store(MemoryStore::new())
        .run(async { Ok::<_, Error>(3) })
        .await
        .unwrap();
    assert_eq!(own, 3);
}
