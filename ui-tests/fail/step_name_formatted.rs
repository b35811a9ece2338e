// A step named by `format!`: the attribute's error comes first and says where what varies goes;
// rustc's own errors follow, since a `String` is no `StepName`.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "order-{order_id}")]
async fn checkout(order_id: u64) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    ctx.step(format!("mail-{order_id}"), async { Ok::<_, Error>(order_id) }).await
}

fn main() {}
