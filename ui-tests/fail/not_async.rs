// Tasks are async functions.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{order_id}")]
fn charge_customer(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
