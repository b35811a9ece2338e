//! `reconcile = path` names an async function of the task's context that answers what the
//! downstream system knows: on a unit in doubt its result is stored and the body does not run;
//! on a free unit it is never called.
#![deny(warnings, clippy::pedantic)]

use std::time::Duration;

use idempotask::store::{Fencing, LockToken, Store, UnitOfWork};
use idempotask::{Error, MemoryStore, Reconciled, TaskContext, idempotent_task};

/// The payment provider's lookup by idempotency key: it has every charge.
async fn charge_known_to_provider(ctx: TaskContext) -> Result<Reconciled<String>, Error> {
    tokio::task::yield_now().await; // the provider's HTTP round trip
    Ok(Reconciled::Done(format!("found-{}", ctx.key())))
}

#[idempotent_task(
    key = "order-charge-{order_id}",
    reconcile = charge_known_to_provider,
    store = *store
)]
async fn charge_customer(store: &MemoryStore, order_id: u64) -> Result<String, Error> {
    Ok(format!("charged-{order_id}"))
}

#[tokio::main]
async fn main() {
    let store = MemoryStore::new();
    // A delivery took order 1 and died after its charge: its lock runs out, remembered.
    let unit = UnitOfWork::new("charge_customer", "order-charge-1").unwrap();
    let dead = LockToken::generate().with_doubt_memory(Duration::from_secs(60));
    store
        .begin(&unit, &dead, Duration::from_millis(100), Fencing::Off)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;

    assert_eq!(
        charge_customer(&store, 1).await.unwrap(),
        "found-order-charge-1"
    );
    assert_eq!(charge_customer(&store, 2).await.unwrap(), "charged-2");
}
