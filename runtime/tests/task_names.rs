//! Two `#[idempotent_task]` functions with one name never share their units: the default name
//! is the bare function name, so `billing::notify` and `shipping::notify` would otherwise
//! answer each other's deliveries, skipping a side effect with a success reply.

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotask::{Error, MemoryStore, Task, idempotent_task};

static BILLING_MAILS: AtomicUsize = AtomicUsize::new(0);
static SHIPPING_MAILS: AtomicUsize = AtomicUsize::new(0);

mod billing {
    use super::*;

    #[idempotent_task(key = "order-{order_id}", store = super::store())]
    pub async fn notify(order_id: u64) -> Result<String, Error> {
        BILLING_MAILS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("invoice for {order_id}"))
    }
}

mod shipping {
    use super::*;

    #[idempotent_task(key = "order-{order_id}", store = super::store())]
    pub async fn notify(order_id: u64) -> Result<String, Error> {
        SHIPPING_MAILS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("parcel for {order_id}"))
    }

    /// The same name on purpose, given explicitly: refused too.
    #[idempotent_task(key = "order-{order_id}", store = super::store(), name = "notify")]
    pub async fn notify_again(order_id: u64) -> Result<String, Error> {
        SHIPPING_MAILS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("parcel again for {order_id}"))
    }
}

fn store() -> MemoryStore {
    static STORE: std::sync::OnceLock<MemoryStore> = std::sync::OnceLock::new();
    STORE.get_or_init(MemoryStore::new).clone()
}

#[tokio::test]
async fn the_second_task_with_a_name_is_refused_before_its_body_runs() {
    assert_eq!(billing::notify(7).await.unwrap(), "invoice for 7");
    // Called again, the first one keeps working: it owns the name.
    assert_eq!(billing::notify(7).await.unwrap(), "invoice for 7");
    for refused in [shipping::notify(7).await, shipping::notify_again(7).await] {
        match refused {
            Err(Error::TaskNameTaken {
                task,
                first,
                second,
                ..
            }) => {
                assert_eq!(task, "notify");
                // The user's file, where the attribute stands, not the runtime's own.
                assert!(first.starts_with(file!()), "{first} is not in {}", file!());
                assert_ne!(first, second);
            }
            other => panic!("expected TaskNameTaken, got {other:?}"),
        }
    }
    assert_eq!(BILLING_MAILS.load(Ordering::SeqCst), 1);
    assert_eq!(SHIPPING_MAILS.load(Ordering::SeqCst), 0);
    let message = shipping::notify(8).await.unwrap_err().to_string();
    assert!(message.contains("name = \"…\""), "{message}");

    // A task built by hand may share a worker's name on purpose (a replay tool reading its
    // results): it reads billing's result.
    let replayed: String = Task::new("notify")
        .call("order-7")
        .store(store())
        .run(async { Ok::<_, Error>("ran".to_owned()) })
        .await
        .unwrap();
    assert_eq!(replayed, "invoice for 7");
}
