//! A name bound inside the body's expressions hides the outer local of that name, as it does for
//! rustc: a closure's parameter, a block's `let`, a `match` arm's or an `if let`'s pattern named
//! like a generated local carries the clean value it is bound to, not the generated one.
//! Regression: `|id| format!("receipt-{id}")` next to a generated `id` was refused as a key
//! generated inside the task.
#![deny(warnings, clippy::pedantic)]

use idempotask::{Error, MemoryStore, Task, idempotent_task};
use uuid::Uuid;

static SEND_RECEIPT: Task = Task::new("send_receipt");

#[idempotent_task(key = "order-charge-{order_id}")]
async fn charge_customer(order_id: u64, line_ids: &[u64]) -> Result<u64, Error> {
    // A trace id of the body's own, which every binding below hides.
    let id = Uuid::new_v4();
    tracing::debug!(%id, "charging");
    // A closure's parameter.
    let receipt_key = |id: u64| format!("receipt-{id}");
    let mut sent = SEND_RECEIPT
        .call(receipt_key(order_id))
        .run(async { Ok::<_, Error>(1) })
        .await?;
    // A tuple parameter and a block's `let` in a closure's body.
    let line_key = |(id, line): (u64, u64)| {
        let id = id * 1000 + line;
        format!("line-{id}")
    };
    sent += SEND_RECEIPT
        .call(line_key((order_id, 1)))
        .run(async { Ok::<_, Error>(1) })
        .await?;
    // A closure walked where it stands, whose body makes the nested call.
    for key in line_ids.iter().map(|id| format!("line-{order_id}-{id}")) {
        sent += SEND_RECEIPT
            .call(key)
            .run(async { Ok::<_, Error>(1) })
            .await?;
    }
    let send = |id: u64| async move {
        SEND_RECEIPT
            .call(format!("item-{id}"))
            .run(async { Ok::<_, Error>(1) })
            .await
    };
    sent += send(order_id).await?;
    // A `match` arm's and an `if let`'s pattern.
    let by_match = match line_ids.first() {
        Some(id) => format!("first-{id}"),
        None => format!("first-{order_id}"),
    };
    sent += SEND_RECEIPT
        .call(by_match)
        .run(async { Ok::<_, Error>(1) })
        .await?;
    let by_if_let = if let Some(id) = line_ids.last() {
        format!("last-{id}")
    } else {
        format!("last-{order_id}")
    };
    sent += SEND_RECEIPT
        .call(by_if_let)
        .run(async { Ok::<_, Error>(1) })
        .await?;
    Ok(sent)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert_eq!(charge_customer(7, &[1, 2]).await.unwrap(), 7);
}
