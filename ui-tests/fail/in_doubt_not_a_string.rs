// `in_doubt` is a string: the policy written as code, or a bool, is refused at the value, with
// the string meant when the code names a policy.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", in_doubt = hold)]
async fn bare_word(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", in_doubt = idempotask::InDoubt::Hold)]
async fn runtime_path(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "c-{id}", in_doubt = true)]
async fn boolean(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
