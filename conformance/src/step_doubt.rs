//! The step in doubt: the first step that the journal of a unit taken over in doubt lacks, which
//! its dead holder may have started, and the policy each step gives it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::store::{LockToken, SharedStore, Store, UnitOfWork};
use idempotask::{Error, Reconciled, Task};

use super::steps::entry;
use super::{DAY, LONG, acquire, outlive};

/// Leaves `key` of task `task` in doubt with its first step, `a` = 1, recorded: a holder that
/// recorded it, then died while its second step may have run.
pub(crate) async fn died_after_the_first_step(store: &SharedStore, task: &str, key: &str) {
    let unit = UnitOfWork::new(task, key).unwrap();
    let token = LockToken::generate().with_doubt_memory(DAY);
    let ttl = Duration::from_millis(300);
    acquire(store, &unit, &token, ttl).await;
    let first = br#"{"step":"a","ok":1}"#;
    assert!(
        store
            .record_step(&unit, &token, entry(0, first), ttl)
            .await
            .unwrap()
    );
    outlive(ttl).await;
}

/// Checks that the step in doubt (the first one the journal of a unit taken over in doubt
/// lacks) gets its own policy: `step_or_hold` holds the unit without running, `step_or_reconcile`
/// records what its reconcile function found without running, `step` runs again; and that a
/// step not in doubt never calls its reconcile function.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(the_step_in_doubt_gets_its_own_policy)]
pub async fn the_step_in_doubt_gets_its_own_policy(store: SharedStore) {
    let task = Task::new("doubtful-steps").lock_ttl(LONG);
    let effects = Arc::new(AtomicU32::new(0));
    let effect = || {
        let effects = Arc::clone(&effects);
        async move { Ok::<u32, Error>(effects.fetch_add(1, Ordering::SeqCst) + 100) }
    };
    for key in ["hold", "reconcile", "rerun"] {
        died_after_the_first_step(&store, "doubtful-steps", key).await;
    }
    let held = || {
        task.call("hold").store(store.clone()).run(async {
            let ctx = idempotask::context().unwrap();
            let first: u32 = ctx.step("a", effect()).await?;
            assert_eq!(first, 1, "the first step was not replayed");
            ctx.step_or_hold("b", effect()).await
        })
    };
    for delivery in 0..2 {
        let answer = held().await;
        assert!(
            matches!(answer, Err(Error::InDoubt { .. })),
            "delivery {delivery}: {answer:?}"
        );
    }
    let reconciled = task
        .call("reconcile")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().unwrap();
            ctx.step("a", effect()).await?;
            let found = || async { Ok::<_, Error>(Reconciled::Done(7)) };
            ctx.step_or_reconcile("b", found, effect()).await
        })
        .await
        .unwrap();
    assert_eq!(reconciled, 7);
    assert_eq!(
        effects.load(Ordering::SeqCst),
        0,
        "a step in doubt ran under hold or reconcile"
    );
    let replayed: u32 = task
        .call("reconcile")
        .store(store.clone())
        .run(async { Ok::<u32, Error>(0) })
        .await
        .unwrap();
    assert_eq!(replayed, 7, "the reconciled value is not the unit's result");

    let rerun = task
        .call("rerun")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().unwrap();
            assert!(ctx.in_doubt().is_some());
            ctx.step("a", effect()).await?;
            let never = || async { panic!("a step not in doubt called its reconcile function") };
            let second = ctx.step("b", effect()).await?;
            let third = ctx.step_or_reconcile("c", never, effect()).await?;
            Ok::<_, Error>((second, third))
        })
        .await
        .unwrap();
    assert_eq!(
        rerun,
        (100, 101),
        "under rerun the step in doubt runs again, and the next too"
    );
}
