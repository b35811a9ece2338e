//! A random number generator seeded from the task's arguments draws the same values on every
//! delivery, so nested keys drawn from it are accepted: bound to a local, drawn from in the
//! call's argument, seeded on the spot, from a seed of bytes through `SeedableRng`, sampled
//! through a distribution, and seeded from another seeded generator. Regression: every
//! `rand::` path was taken for a generator, `rand::rngs::StdRng::seed_from_u64(order_id)`
//! included, and so was every draw (`rng.random()`) whatever the generator's seed.
#![deny(warnings, clippy::pedantic)]

use idempotask::{Error, MemoryStore, Task, idempotent_task};
use rand::distr::{Distribution as _, Uniform};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};

static SEND_PRIZE: Task = Task::new("send_prize");

#[idempotent_task(key = "order-raffle-{order_id}")]
async fn draw_raffle(order_id: u64) -> Result<u64, Error> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(order_id);
    let ticket: u64 = rng.random();
    let mut sent = SEND_PRIZE
        .call(format!("ticket-{ticket}"))
        .run(async { Ok::<_, Error>(1) })
        .await?;
    sent += SEND_PRIZE
        .call(format!("seat-{}", rng.random_range(0..100_u32)))
        .run(async { Ok::<_, Error>(1) })
        .await?;
    sent += SEND_PRIZE
        .call(StdRng::seed_from_u64(order_id).random::<u64>().to_string())
        .run(async { Ok::<_, Error>(1) })
        .await?;
    let mut seed = [0_u8; 32];
    seed[..8].copy_from_slice(&order_id.to_le_bytes());
    let mut from_bytes: StdRng = SeedableRng::from_seed(seed);
    sent += SEND_PRIZE
        .call(format!("prize-{}", from_bytes.random::<u32>()))
        .run(async { Ok::<_, Error>(1) })
        .await?;
    let die = rand::distr::Uniform::new_inclusive(1, 6).expect("a valid range");
    let roll: u8 = die.sample(&mut rng);
    let mut forked = rand::rngs::SmallRng::from_rng(&mut rng);
    let same_die = Uniform::new(0_u32, 10).expect("a valid range");
    sent += SEND_PRIZE
        .call(format!("roll-{roll}-{}", same_die.sample(&mut forked)))
        .run(async { Ok::<_, Error>(1) })
        .await?;
    Ok(sent)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert_eq!(draw_raffle(7).await.unwrap(), 5);
}
