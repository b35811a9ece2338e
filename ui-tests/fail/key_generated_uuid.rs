// The key is generated inside the task: every delivery would get a new one.
use idempotask::{Error, idempotent_task};
use uuid::Uuid;

#[idempotent_task(key = Uuid::new_v4())]
async fn charge_customer(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = Uuid::now_v7().to_string())]
async fn charge_again(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {
    let _ = Uuid::nil();
}
