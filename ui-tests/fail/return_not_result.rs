// The return type must be a `Result`: its `Ok` is stored, its errors never are.
use idempotask::idempotent_task;

#[idempotent_task(key = "a-{id}")]
async fn plain(id: u64) -> u64 {
    id
}

#[idempotent_task(key = "b-{id}")]
async fn nothing(id: u64) {
    let _ = id;
}

fn main() {}
