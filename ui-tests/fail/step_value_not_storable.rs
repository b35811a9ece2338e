// A step's value that cannot be recorded: one error at the step's effect that names the type,
// the codec and the missing derive. Pins the defect where serde's two bounds were each reported
// at the method, the call and its `.await`, six errors in all.
use idempotask::{Error, idempotent_task};

struct Charge {
    id: u64,
}

#[idempotent_task(key = "order-{order_id}")]
async fn checkout(order_id: u64) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let charge = ctx.step("charge", async { Ok::<_, Error>(Charge { id: order_id }) }).await?;
    Ok(charge.id)
}

fn main() {}
