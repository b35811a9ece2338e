// Generated values hidden in a template placeholder.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{order_id}-{uuid::Uuid::new_v4()}")]
async fn charge_customer(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = "order-{order_id}-{std::time::SystemTime::now().elapsed().unwrap().as_nanos()}")]
async fn charge_by_clock(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
