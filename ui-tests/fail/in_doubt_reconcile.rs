// Reconciling a unit in doubt takes a function, so it is kept for an option of its own,
// `reconcile = path`; `in_doubt = "reconcile"` says so instead of calling it unknown.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", in_doubt = "reconcile")]
async fn charge(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
