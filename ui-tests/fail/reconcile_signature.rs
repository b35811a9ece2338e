// `reconcile` names an async function of the task's context that answers
// `Result<Reconciled<T>, E>` with the task's own `T` and `E`; one that does not fit is blamed
// at the path, as is a call instead of a path, and `reconcile` next to `in_doubt = "hold"`.
use idempotask::{Error, Reconciled, TaskContext, idempotent_task};

async fn answers_another_type(_: TaskContext) -> Result<Reconciled<String>, Error> {
    Ok(Reconciled::NotDone)
}

#[idempotent_task(key = "a-{id}", reconcile = answers_another_type)]
async fn wrong_type(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", reconcile = answers_another_type(ctx))]
async fn called(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "c-{id}", in_doubt = "hold", reconcile = answers_another_type)]
async fn held(id: u64) -> Result<String, Error> {
    Ok(id.to_string())
}

fn main() {}
