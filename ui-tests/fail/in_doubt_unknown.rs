// `in_doubt` takes "rerun" or "hold"; another word is refused at the literal, with the closest
// policy when there is one.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", in_doubt = "held")]
async fn misspelt(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", in_doubt = "at_most_once")]
async fn other_word(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
