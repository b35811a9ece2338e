// The body calls the runtime API with a key it generated: the same misuse, one level down.
use idempotask::{Error, Task, idempotent_task};
use uuid::Uuid;

static INNER: Task = Task::new("inner");

#[idempotent_task(key = "order-{order_id}")]
async fn charge_customer(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(Uuid::new_v4().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

fn main() {}
