// A key parameter declared `mut` or `&mut`.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = idempotency_key)]
async fn by_mut(mut idempotency_key: String) -> Result<usize, Error> {
    Ok(idempotency_key.len())
}

#[idempotent_task(key = "order-{order_id}")]
async fn by_mut_ref(order_id: &mut u64) -> Result<u64, Error> {
    Ok(*order_id)
}

fn main() {}
