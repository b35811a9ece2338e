// A step's value that cannot be recorded: the runtime's bounds (`Serialize + DeserializeOwned`)
// refuse it, and the error names the type and the missing derive.
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
