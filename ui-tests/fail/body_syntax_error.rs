// A syntax error in the body: only rustc's own error, not a second one from the attribute
// claiming the function is not an `async fn`.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{order_id}")]
async fn total(order_id: u64) -> Result<u64, Error> {
    let total = order_id +;
    Ok(total)
}

fn main() {}
