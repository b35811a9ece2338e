//! A checkout with three side effects (charge the card, write the ledger row, mail the receipt)
//! as three steps of one idempotent task, on Redis: a worker that dies after the charge leaves
//! it recorded, and the delivery after it replays the charge and runs the other two once.
//!
//! Each effect appends a line to the file `EFFECTS` names (default `checkout-effects.txt`), which
//! stands for the payment provider, the ledger and the mailer: what a crash cannot take back.
//! `CRASH_AFTER=charge` aborts the process right after the charge step finished, before the
//! ledger step starts.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 CRASH_AFTER=charge cargo run --example checkout_steps --features redis
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example checkout_steps --features redis
//! cat checkout-effects.txt   # one charge, one ledger row, one receipt
//! ```
//!
//! The second run prints `charge: replayed ch_order-7`, `ledger: ran`, `receipt: ran`; a third
//! run replays the whole checkout (`outcome: Replayed`) and runs nothing.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! serde = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotask::{Error, Task};
use idempotask_redis::RedisStore;

/// Short, so that the delivery after a crash takes the order over within seconds.
static CHECKOUT: Task = Task::new("checkout").lock_ttl(Duration::from_secs(2));

/// Appends `line` to the effects file: a side effect nothing can undo.
fn effect(line: &str) {
    let path = std::env::var("EFFECTS").unwrap_or_else(|_| "checkout-effects.txt".to_owned());
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("the effects file opens");
    writeln!(file, "{line}").expect("the effect is written");
}

/// Runs `name`'s effect as a step, and prints whether it ran or was replayed.
async fn step<T>(name: &'static str, run: impl FnOnce() -> T) -> Result<T, Error>
where
    T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let ctx = idempotask::context().expect("inside the task");
    let ran = AtomicBool::new(false);
    let value = ctx
        .step(name, async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, Error>(run())
        })
        .await?;
    let how = if ran.load(Ordering::SeqCst) {
        "ran"
    } else {
        "replayed"
    };
    println!("{name}: {how} {value:?}");
    Ok(value)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let store = RedisStore::connect(&url).await?;
    let crash_after = std::env::var("CRASH_AFTER").ok();
    let order = "order-7";
    let report = CHECKOUT
        .call(order)
        .store(store)
        .run_reported(async {
            let charge = step("charge", || {
                effect(&format!("charge {order}"));
                format!("ch_{order}")
            })
            .await?;
            if crash_after.as_deref() == Some("charge") {
                println!("crashing after the charge");
                std::process::abort();
            }
            step("ledger", || effect(&format!("ledger {order} {charge}"))).await?;
            step("receipt", || effect(&format!("receipt {order} {charge}"))).await?;
            Ok::<_, Error>(charge)
        })
        .await?;
    println!("outcome: {:?} {}", report.outcome, report.value);
    Ok(())
}
