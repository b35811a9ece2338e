//! Nested keys the body derives from what the caller decided stay accepted, next to fresh
//! values the body uses for other things: a timer for a timeout or a log line, a request id on
//! an outbound call whose answer then keys a nested call, a generated value rebound away.
#![deny(warnings, clippy::pedantic)]

use std::time::{Duration, Instant};

use idempotask::{Error, MemoryStore, Task, idempotent_task};
use uuid::Uuid;

static SEND_RECEIPT: Task = Task::new("send_receipt");

/// A row as a database query answers it.
struct Row {
    receipt: String,
}

/// Stands in for `sqlx::query(..).fetch_one(..)`.
async fn fetch_row(order_id: u64) -> Row {
    tokio::task::yield_now().await;
    Row {
        receipt: format!("receipt-{order_id}"),
    }
}

/// Stands in for a payment gateway that is sent a fresh request id and answers its own charge.
async fn charge(order_id: u64, request_id: Uuid) -> String {
    tokio::task::yield_now().await;
    format!("ch_{order_id}_{}", request_id.get_version_num())
}

#[idempotent_task(key = "order-charge-{order_id}")]
async fn charge_customer(order_id: u64) -> Result<u64, Error> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(5);
    // From the task's arguments, directly and through a local.
    let mut sent = SEND_RECEIPT
        .call(format!("receipt-{order_id}"))
        .run(async move {
            tokio::time::timeout_at(deadline.into(), tokio::task::yield_now())
                .await
                .ok();
            Ok::<_, Error>(1)
        })
        .await?;
    let by_order = format!("receipt-{order_id}");
    sent += SEND_RECEIPT
        .call(by_order.clone())
        .run(async { Ok::<_, Error>(1) })
        .await?;
    // From a database row.
    let row = fetch_row(order_id).await;
    sent += SEND_RECEIPT
        .call(row.receipt)
        .run(async { Ok::<_, Error>(1) })
        .await?;
    // From an outbound call's answer, though its request carried a fresh id.
    let charge_id = charge(order_id, Uuid::new_v4()).await;
    sent += SEND_RECEIPT
        .call(format!("receipt-{charge_id}"))
        .run(async { Ok::<_, Error>(1) })
        .await?;
    // From the caller's own key, as the running task sees it.
    let parent = idempotask::context().map(|context| context.key().to_owned());
    let parent_receipt = format!("{}-receipt", parent.unwrap_or_default());
    sent += SEND_RECEIPT
        .call(parent_receipt)
        .run(async { Ok::<_, Error>(1) })
        .await?;
    // A generated value rebound away, and one shadowed in a block of its own.
    let key = Uuid::new_v4();
    tracing::debug!(%key, "a trace id of the body's own");
    let key = by_order.clone();
    {
        let key = Uuid::new_v4();
        tracing::debug!(%key, "another");
    }
    sent += SEND_RECEIPT
        .call(key)
        .run(async { Ok::<_, Error>(1) })
        .await?;
    tracing::debug!(elapsed = ?started.elapsed(), "receipts sent");
    Ok(sent)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert_eq!(charge_customer(7).await.unwrap(), 6);
}
