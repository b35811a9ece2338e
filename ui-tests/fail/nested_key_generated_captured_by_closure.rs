// A name bound inside an expression hides the outer local of that name only: a closure, a
// block or a `match` arm that reads a generated local through another name still carries it,
// now that a closure's parameter named like a generated local no longer does.
use idempotask::{Error, Task, idempotent_task};
use uuid::Uuid;

static INNER: Task = Task::new("send_receipt");

#[idempotent_task(key = "order-other_parameter-{order_id}")]
async fn other_parameter(order_id: u64) -> Result<u64, Error> {
    let id = Uuid::new_v4();
    let make_key = |line: u64| format!("receipt-{id}-{line}");
    let nested: u64 = INNER.call(make_key(order_id)).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-other_local-{order_id}")]
async fn other_local(order_id: u64) -> Result<u64, Error> {
    let trace = Uuid::new_v4();
    let make_key = |id: u64| format!("receipt-{id}-{trace}");
    let nested: u64 = INNER.call(make_key(order_id)).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-block_let-{order_id}")]
async fn block_let(order_id: u64) -> Result<u64, Error> {
    let id = Uuid::new_v4();
    let make_key = |line: u64| {
        let line = line + 1;
        format!("receipt-{id}-{line}")
    };
    let nested: u64 = INNER.call(make_key(order_id)).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-match_arm-{order_id}")]
async fn match_arm(order_id: u64) -> Result<u64, Error> {
    let id = Uuid::new_v4();
    let key = match Some(order_id) {
        Some(line) => format!("receipt-{id}-{line}"),
        None => String::new(),
    };
    let nested: u64 = INNER.call(key).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-after_the_closure-{order_id}")]
async fn after_the_closure(order_id: u64) -> Result<u64, Error> {
    let id = Uuid::new_v4();
    let line_of = |id: u64| id + 1;
    let nested: u64 = INNER.call(format!("receipt-{id}-{}", line_of(order_id))).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

fn main() {}
