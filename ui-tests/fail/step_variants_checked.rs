// `step_or_hold` and `step_or_reconcile` are steps too: their names are checked as `step`'s.
use idempotask::{Error, Reconciled, idempotent_task};

#[idempotent_task(key = "order-{order_id}")]
async fn checkout(order_id: u64, recipients: Vec<String>) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let name = "charge";
    let charged = ctx
        .step_or_reconcile(
            name,
            || async { Ok::<_, Error>(Reconciled::NotDone) },
            async { Ok::<_, Error>(order_id) },
        )
        .await?;
    for recipient in &recipients {
        ctx.step_or_hold("mail", async { Ok::<_, Error>(recipient.len()) }).await?;
    }
    Ok(charged)
}

fn main() {}
