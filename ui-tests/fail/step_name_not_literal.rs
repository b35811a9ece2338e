// A step named by anything but a string literal (a variable, a const, a const before a key
// part): the attribute cannot tell that the name is the same on every run and unique in the body.
use idempotask::{Error, idempotent_task};

const CHARGE: &str = "charge";

#[idempotent_task(key = "order-{order_id}")]
async fn checkout(order_id: u64, step: &'static str) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let a = ctx.step(step, async { Ok::<_, Error>(1_u64) }).await?;
    let b = ctx.step(CHARGE, async { Ok::<_, Error>(2_u64) }).await?;
    let c = ctx.step((CHARGE, order_id), async { Ok::<_, Error>(3_u64) }).await?;
    Ok(a + b + c)
}

fn main() {}
