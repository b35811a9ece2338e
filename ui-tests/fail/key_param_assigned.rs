// The key parameter assigned or borrowed mutably inside the body.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{order_id}")]
async fn charge_customer(order_id: u64, amount: u64) -> Result<u64, Error> {
    order_id = amount;
    order_id += 1;
    let bump = &mut order_id;
    Ok(*bump)
}

fn main() {}
