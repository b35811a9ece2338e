//! Steps in the branches of an `if` and of a `match`, each with a name of its own: a rerun that
//! takes another branch meets a name that differs from the recorded one and stops, instead of
//! replaying the other branch's value.
#![deny(warnings, clippy::pedantic)]

use idempotask::{Error, MemoryStore, idempotent_task};

enum Method {
    Card,
    Invoice,
}

#[idempotent_task(key = "order-pay-{order_id}")]
async fn pay(order_id: u64, method: Method, express: bool) -> Result<String, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let paid = match method {
        Method::Card => {
            ctx.step("charge_card", async {
                Ok::<_, Error>(format!("ch_{order_id}"))
            })
            .await?
        }
        Method::Invoice => {
            ctx.step("send_invoice", async {
                Ok::<_, Error>(format!("in_{order_id}"))
            })
            .await?
        }
    };
    let shipped = if express {
        ctx.step("ship_express", async { Ok::<_, Error>(1_u8) })
            .await?
    } else {
        ctx.step("ship", async { Ok::<_, Error>(5_u8) }).await?
    };
    Ok(format!("{paid} in {shipped} days"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert_eq!(pay(7, Method::Card, true).await.unwrap(), "ch_7 in 1 days");
    assert_eq!(
        pay(8, Method::Invoice, false).await.unwrap(),
        "in_8 in 5 days"
    );
}
