// Tasks are async functions. The error says it saw a plain `fn` and gives both ways out: the
// source may say `async fn` that an attribute expanded earlier rewrote, so it must not only say
// "write `async fn`".
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{order_id}")]
fn charge_customer(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
