// Random number generators seeded by the operating system, or from a generated seed, stay
// generators now that one seeded from the task's arguments is not.
use idempotask::{Error, Task, idempotent_task};
use rand::rngs::{OsRng, StdRng};
use rand::{Rng as _, SeedableRng as _, TryRngCore as _};

static INNER: Task = Task::new("send_prize");

#[path = "../standins/entropy.rs"]
mod entropy;

#[idempotent_task(key = "order-os_seeded-{order_id}")]
async fn os_seeded(order_id: u64) -> Result<u64, Error> {
    let mut rng = StdRng::from_os_rng();
    let ticket: u64 = rng.random();
    let nested: u64 = INNER.call(ticket.to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-entropy_seeded-{order_id}")]
async fn entropy_seeded(order_id: u64) -> Result<u64, Error> {
    let mut rng = entropy::StdRng::from_entropy();
    let nested: u64 = INNER.call(rng.next_u64().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-os_rng-{order_id}")]
async fn os_rng(order_id: u64) -> Result<u64, Error> {
    let ticket = OsRng.try_next_u64().unwrap_or_default();
    let nested: u64 = INNER.call(format!("ticket-{ticket}")).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-from_thread_rng-{order_id}")]
async fn from_thread_rng(order_id: u64) -> Result<u64, Error> {
    let mut rng = StdRng::from_rng(&mut rand::rng());
    let ticket: u64 = rng.random();
    let nested: u64 = INNER.call(format!("ticket-{ticket}")).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-random_seed-{order_id}")]
async fn random_seed(order_id: u64) -> Result<u64, Error> {
    let mut rng = StdRng::seed_from_u64(rand::random());
    let ticket: u64 = rng.random();
    let nested: u64 = INNER.call(format!("ticket-{ticket}")).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-uuid_seed-{order_id}")]
async fn uuid_seed(order_id: u64) -> Result<u64, Error> {
    let seed = uuid::Uuid::new_v4().as_u64_pair().0;
    let mut rng = StdRng::seed_from_u64(seed);
    let nested: u64 = INNER.call(rng.random::<u64>().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

fn main() {}
