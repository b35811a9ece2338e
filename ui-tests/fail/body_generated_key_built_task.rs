// The body builds a task and calls it with a key it generated: evidently idempotask's API.
use idempotask::{Error, Task, idempotent_task};
use uuid::Uuid;

#[idempotent_task(key = "order-{order_id}")]
async fn charge_customer(order_id: u64) -> Result<u64, Error> {
    let inner = Task::new("inner").lock_ttl(std::time::Duration::from_secs(5));
    let _pending = inner.call(Uuid::new_v4().to_string());
    let nested: u64 = Task::new("inner2")
        .call(Uuid::new_v4().to_string())
        .run(async { Ok::<_, Error>(1) })
        .await?;
    Ok(order_id + nested)
}

fn main() {}
