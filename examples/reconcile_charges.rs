//! Charging customers through a payment gateway that knows its charges by idempotency key, and
//! asking it about an order left in doubt instead of charging again.
//!
//! A worker killed between taking an order and recording its charge leaves the order in doubt:
//! the charge may or may not have gone through. `reconcile = find_charge` makes the delivery that
//! takes the order over ask the gateway first (`LOOKUP <key>`): a charge it knows is recorded as
//! the result, and only an order it has never seen is charged.
//!
//! The gateway is this example's own small server: `reconcile_charges gateway` listens on
//! `GATEWAY_ADDR` (default `127.0.0.1:7070`), answers `CHARGE <key>` with a new charge id (every
//! request is a charge, as at a real gateway without idempotency: two requests, two charges),
//! `LOOKUP <key>` with the first charge of that key or `NONE`, and `CHARGES` with every charge
//! made, `<key> <charge id>` per line, then `END`. A worker (`REDIS_URL` for the store,
//! `ORDERS=a-b`) delivers those orders once each and prints `order 5: charged ch_3`,
//! `order 5: reconciled ch_3` or `order 5: replayed ch_3`; `CRASH_AT=5:before-charge` (or
//! `5:after-charge`) waits there for a SIGKILL, which is how `tests/examples.rs` leaves orders in
//! doubt.
//!
//! ```text
//! cargo run --example reconcile_charges --features redis -- gateway &
//! REDIS_URL=redis://127.0.0.1:6379 ORDERS=1-6 cargo run --example reconcile_charges --features redis
//! ```
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "net", "io-util"] }
//! ```

use std::env::{args, var};

use idempotask::{Outcome, Reconciled, Task, TaskContext};
use idempotask_redis::RedisStore;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn gateway_addr() -> String {
    var("GATEWAY_ADDR").unwrap_or_else(|_| "127.0.0.1:7070".to_owned())
}

/// The gateway: every `CHARGE` is a charge; `LOOKUP` finds a key's first.
async fn gateway() -> Result<(), BoxError> {
    let listener = TcpListener::bind(gateway_addr()).await?;
    println!("gateway listening on {}", listener.local_addr()?);
    let charges: &'static Mutex<Vec<(String, String)>> = Box::leak(Box::default());
    loop {
        let (socket, _) = listener.accept().await?;
        tokio::spawn(async move {
            let (read, mut write) = socket.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut charges = charges.lock().await;
                let reply = match line.split_once(' ') {
                    Some(("CHARGE", key)) => {
                        let id = format!("ch_{}", charges.len() + 1);
                        charges.push((key.to_owned(), id.clone()));
                        id
                    }
                    Some(("LOOKUP", key)) => charges
                        .iter()
                        .find(|(charged, _)| charged == key)
                        .map_or_else(|| "NONE".to_owned(), |(_, id)| id.clone()),
                    _ if line == "CHARGES" => {
                        let all = charges.iter().map(|(key, id)| format!("{key} {id}\n"));
                        format!("{}END", all.collect::<String>())
                    }
                    _ => "ERR".to_owned(),
                };
                if write
                    .write_all(format!("{reply}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
}

/// One request to the gateway, one line back.
async fn ask_gateway(request: &str) -> Result<String, BoxError> {
    let mut socket = BufReader::new(TcpStream::connect(gateway_addr()).await?);
    socket
        .get_mut()
        .write_all(format!("{request}\n").as_bytes())
        .await?;
    let mut reply = String::new();
    socket.read_line(&mut reply).await?;
    Ok(reply.trim_end().to_owned())
}

/// The gateway's lookup by idempotency key: the charge it made for this order, if any.
async fn find_charge(ctx: TaskContext) -> Result<Reconciled<String>, BoxError> {
    Ok(
        match ask_gateway(&format!("LOOKUP {}", ctx.key()))
            .await?
            .as_str()
        {
            "NONE" => Reconciled::NotDone,
            charge => Reconciled::Done(charge.to_owned()),
        },
    )
}

/// `CRASH_AT=<order>:<point>`: stop at `point` of that order and wait for a SIGKILL.
async fn crash_point(order_id: u64, point: &str) {
    if var("CRASH_AT").is_ok_and(|at| at == format!("{order_id}:{point}")) {
        println!("order {order_id}: crashing {point}");
        std::future::pending::<()>().await;
    }
}

static CHARGE: Task = Task::new("charge_customer").lock_ttl(std::time::Duration::from_secs(2));

async fn charge_customer(order_id: u64) -> Result<(String, Outcome), BoxError> {
    let key = format!("order-charge-{order_id}");
    let report = CHARGE
        .call(key.clone())
        .reconcile(find_charge)
        .run_reported(async move {
            crash_point(order_id, "before-charge").await;
            let charge = ask_gateway(&format!("CHARGE {key}")).await?;
            crash_point(order_id, "after-charge").await;
            Ok(charge)
        })
        .await?;
    Ok((report.value, report.outcome))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    if args().nth(1).as_deref() == Some("gateway") {
        return gateway().await;
    }
    idempotask::install(RedisStore::connect(&var("REDIS_URL")?).await?);
    let orders = var("ORDERS").unwrap_or_else(|_| "1-1".to_owned());
    let (first, last) = orders.split_once('-').ok_or("ORDERS is `first-last`")?;
    for order_id in first.parse::<u64>()?..=last.parse()? {
        let (charge, outcome) = charge_customer(order_id).await?;
        let how = match outcome {
            Outcome::Replayed => "replayed",
            Outcome::Reconciled => "reconciled",
            _ => "charged",
        };
        println!("order {order_id}: {how} {charge}");
    }
    Ok(())
}
