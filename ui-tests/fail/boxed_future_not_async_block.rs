// A plain `fn` returning a boxed future whose body is not `Box::pin(async move { .. })`: the
// error says what was seen and does not ask for an `async fn` that may already be written.
use std::future::Future;
use std::pin::Pin;

use idempotask::{Error, idempotent_task};

struct Charge;

impl Charge {
    async fn later(&self, order_id: u64) -> Result<u64, Error> {
        Ok(order_id)
    }

    #[idempotent_task(key = "order-{order_id}")]
    fn run(&self, order_id: u64) -> Pin<Box<dyn Future<Output = Result<u64, Error>> + Send + '_>> {
        Box::pin(self.later(order_id))
    }
}

fn main() {}
