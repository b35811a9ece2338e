// A placeholder that names no parameter, with a suggestion for the near miss.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-charge-{orderid}")]
async fn charge_customer(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = "order-charge-{customer}")]
async fn charge_again(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
