// `const` and `extern` functions cannot be tasks.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{order_id}")]
const fn by_const(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = "order-{order_id}")]
async extern "C" fn by_extern(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
