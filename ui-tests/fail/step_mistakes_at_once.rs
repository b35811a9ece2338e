// The steps' mistakes are reported with the attribute's own, all at once, and the function is
// still emitted: `main` calls it without a "cannot find function" error.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{ordr_id}")]
async fn checkout(order_id: u64, lines: Vec<u64>) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let mut total = ctx.step("charge", async { Ok::<_, Error>(order_id) }).await?;
    for line in lines {
        total += ctx.step("ship", async { Ok::<_, Error>(line) }).await?;
    }
    total += ctx.step("charge", async { Ok::<_, Error>(1_u64) }).await?;
    Ok(total)
}

fn main() {
    drop(checkout(1, vec![2]));
}
