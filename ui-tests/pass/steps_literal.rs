//! Steps named by string literals: the body's first run fails after the charge, and the rerun
//! replays the recorded charge instead of charging again.
#![deny(warnings, clippy::pedantic)]

use std::sync::atomic::{AtomicU64, Ordering};

use idempotask::{Error, MemoryStore, idempotent_task};

static CHARGES: AtomicU64 = AtomicU64::new(0);

#[idempotent_task(key = "order-checkout-{order_id}")]
async fn checkout(order_id: u64, mail_works: bool) -> Result<String, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let charge = ctx
        .step("charge", async {
            Ok::<_, Error>(CHARGES.fetch_add(1, Ordering::SeqCst) + order_id)
        })
        .await?;
    let receipt = ctx
        .step("mail", async {
            if mail_works {
                Ok(format!("receipt for charge {charge}"))
            } else {
                Err(Error::NotConfigured)
            }
        })
        .await?;
    Ok(receipt)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert!(checkout(7, false).await.is_err());
    assert_eq!(checkout(7, true).await.unwrap(), "receipt for charge 7");
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1, "charged once");
}
