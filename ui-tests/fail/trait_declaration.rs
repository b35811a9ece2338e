// The attribute belongs on the implementation, which has a body; with `#[async_trait]` too,
// whose declaration has none either.
use idempotask::{Error, idempotent_task};

trait Notifier {
    #[idempotent_task(key = "n-{user_id}")]
    async fn notify(&self, user_id: u64) -> Result<bool, Error>;
}

#[async_trait::async_trait]
trait Job {
    #[idempotent_task(key = "order-{order_id}")]
    async fn run(&self, order_id: u64) -> Result<u64, Error>;
}

fn main() {}
