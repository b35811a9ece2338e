// Independent mistakes are reported together, and the function is still emitted: the call in
// `main` type-checks, so no "cannot find function" error follows.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{ordr_id}", lock_ttl = 0, colour = "blue", in_doubt = "held")]
fn charge_customer(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {
    let _ = charge_customer(1);
}
