// Lock TTLs below `idempotask::MIN_TTL` (100 ms): a 1 ms lock with `renew` ran several
// deliveries' bodies on MemoryStore and none on Redis. Refused at the value, like a zero TTL.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", lock_ttl = "1ms", renew = true)]
async fn one_millisecond(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", lock_ttl = "99ms", result_ttl = "1s")]
async fn just_below(id: u64) -> Result<u64, Error> {
    Ok(id)
}

// `Task` refuses it too: in a `static`, at compile time.
static SHORT: idempotask::Task =
    idempotask::Task::new("short").lock_ttl(std::time::Duration::from_millis(50));

fn main() {
    let _ = &SHORT;
}
