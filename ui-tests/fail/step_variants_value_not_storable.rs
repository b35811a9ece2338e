// `step_or_hold` and `step_or_reconcile` record their values as `step` does: a value that cannot
// be stored is one error each, at the step's effect.
use idempotask::{Error, Reconciled, idempotent_task};

struct Charge {
    id: u64,
}

#[idempotent_task(key = "order-{order_id}")]
async fn checkout(order_id: u64) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let held = ctx.step_or_hold("hold", async { Ok::<_, Error>(Charge { id: order_id }) }).await?;
    let reconciled = ctx
        .step_or_reconcile(
            "charge",
            || async { Ok::<_, Error>(Reconciled::NotDone) },
            async { Ok::<_, Error>(Charge { id: order_id }) },
        )
        .await?;
    Ok(held.id + reconciled.id)
}

fn main() {}
