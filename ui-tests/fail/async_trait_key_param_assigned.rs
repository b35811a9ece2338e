// The key parameter assigned or borrowed mutably inside an `#[async_trait]` method.
use async_trait::async_trait;
use idempotask::{Error, idempotent_task};

#[async_trait]
trait Job {
    async fn run(&self, order_id: u64, amount: u64) -> Result<u64, Error>;
}

struct Charge;

#[async_trait]
impl Job for Charge {
    #[idempotent_task(key = "order-{order_id}")]
    async fn run(&self, order_id: u64, amount: u64) -> Result<u64, Error> {
        order_id = amount;
        order_id += 1;
        let bump = &mut order_id;
        Ok(*bump)
    }
}

fn main() {}
