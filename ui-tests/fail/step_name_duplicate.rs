// Two steps of one body named alike: a rerun would tell them apart by their order alone.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{order_id}")]
async fn checkout(order_id: u64, refund: bool) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let charged = ctx.step("charge", async { Ok::<_, Error>(order_id) }).await?;
    let settled = if refund {
        ctx.step("refund", async { Ok::<_, Error>(0_u64) }).await?
    } else {
        ctx.step("charge", async { Ok::<_, Error>(charged) }).await?
    };
    Ok(settled)
}

fn main() {}
