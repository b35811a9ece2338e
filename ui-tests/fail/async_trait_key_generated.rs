// A generated key inside an `#[async_trait]` method, in the attribute and in the body: the same
// rejection as in a free function, through async-trait's `Box::pin(async move { .. })`.
use async_trait::async_trait;
use idempotask::{Error, Task, idempotent_task};
use uuid::Uuid;

static INNER: Task = Task::new("inner");

#[async_trait]
trait Job {
    async fn run(&self, order_id: u64) -> Result<u64, Error>;
    async fn nested(&self, order_id: u64) -> Result<u64, Error>;
}

struct Charge;

#[async_trait]
impl Job for Charge {
    #[idempotent_task(key = Uuid::new_v4())]
    async fn run(&self, order_id: u64) -> Result<u64, Error> {
        Ok(order_id)
    }

    #[idempotent_task(key = "order-{order_id}")]
    async fn nested(&self, order_id: u64) -> Result<u64, Error> {
        let nested: u64 = INNER.call(Uuid::new_v4().to_string()).run(async { Ok::<_, Error>(1) }).await?;
        Ok(order_id + nested)
    }
}

fn main() {}
