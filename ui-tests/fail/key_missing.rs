// A task without a key: the error points at the attribute.
use idempotask::{Error, idempotent_task};

#[idempotent_task(lock_ttl = 30)]
async fn charge_customer(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
