//! `&self` and `&mut self` methods, with the store taken from `self`.
#![deny(warnings, clippy::pedantic)]

use idempotask::store::SharedStore;
use idempotask::{Error, MemoryStore, idempotent_task};

struct Mailer {
    store: MemoryStore,
    sent: u32,
}

impl Mailer {
    #[idempotent_task(key = "confirmation-{order_id}", store = self.store, lock_ttl = "15s", result_ttl = "7d")]
    async fn send_confirmation(&self, order_id: u64) -> Result<String, Error> {
        Ok(format!("mail for {order_id}"))
    }

    #[idempotent_task(key = "reminder-{order_id}", store = self.store)]
    async fn send_reminder(&mut self, order_id: u64) -> Result<u32, Error> {
        self.sent += 1;
        let _ = order_id;
        Ok(self.sent)
    }
}

struct Shared {
    store: SharedStore,
    tenant: String,
}

impl Shared {
    #[idempotent_task(key = "{self.tenant}-{invoice}", store = self.store)]
    async fn issue(&self, invoice: u32) -> Result<u32, Error> {
        Ok(invoice)
    }
}

#[tokio::main]
async fn main() {
    let mut mailer = Mailer {
        store: MemoryStore::new(),
        sent: 0,
    };
    let first = mailer.send_confirmation(1).await.unwrap();
    assert_eq!(first, mailer.send_confirmation(1).await.unwrap());
    assert_eq!(mailer.send_reminder(1).await.unwrap(), 1);
    assert_eq!(mailer.send_reminder(1).await.unwrap(), 1);
    assert_eq!(mailer.sent, 1);

    let shared = Shared {
        store: SharedStore::new(MemoryStore::new()),
        tenant: "acme".to_owned(),
    };
    assert_eq!(shared.issue(3).await.unwrap(), 3);
}
