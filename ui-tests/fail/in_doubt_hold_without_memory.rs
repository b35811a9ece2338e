// `in_doubt = "hold"` holds units that the store remembers in doubt; with `doubt_memory = 0`
// it remembers none, so the task would silently run every unit again. `"rerun"` with zero is
// fine (see `pass/in_doubt.rs`).
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", in_doubt = "hold", doubt_memory = 0)]
async fn transfer(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", doubt_memory = "0ms", in_doubt = "hold")]
async fn transfer_ms(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
