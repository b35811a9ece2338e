// `renew` takes `true`, `false`, "watchdog" or "in_task": another word is refused at the
// literal, with the closest way when there is one, and a value of another kind at the value.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", renew = "in-task")]
async fn misspelt(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", renew = 1)]
async fn a_number(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
