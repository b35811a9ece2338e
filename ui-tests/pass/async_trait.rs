//! Methods of an `#[async_trait]` impl: async-trait expands first and hands the attribute
//! `fn run(..) -> Pin<Box<dyn Future<..> + Send + 'async_trait>> { Box::pin(async move { .. }) }`.
//! The boxed signature must stay as async-trait made it, so the impl still matches the trait
//! and the trait stays object-safe: the jobs run through `Box<dyn Job + Send + Sync>`.
#![deny(warnings, clippy::pedantic)]

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use idempotask::{Error, MemoryStore, idempotent_task};

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error("card declined")]
    Declined,
    #[error(transparent)]
    Idempotency(#[from] Error),
}

#[async_trait]
trait Job {
    async fn run(&self, order_id: u64, note: String) -> Result<String, PaymentError>;
    async fn run_shared(self: Arc<Self>, order_id: u64) -> Result<u32, PaymentError>;
    // Generic methods keep a trait object-safe only when left out of the vtable.
    async fn run_generic<T: Display + Send>(&self, id: T) -> Result<String, PaymentError>
    where
        Self: Sized;
    async fn run_mut(&mut self, order_id: u64) -> Result<u32, PaymentError>;
}

struct Charge {
    store: MemoryStore,
    tenant: String,
    calls: AtomicU32,
}

#[async_trait]
impl Job for Charge {
    /// `&self`, the store and part of the key taken from `self`, a `mut` parameter that is not
    /// part of the key, `?` and an early `return` in the body.
    #[idempotent_task(key = "{self.tenant}-charge-{order_id}", store = self.store, fingerprint = [note])]
    async fn run(&self, order_id: u64, mut note: String) -> Result<String, PaymentError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if order_id == 0 {
            return Err(PaymentError::Declined);
        }
        note.push('!');
        let cents = u32::try_from(order_id).map_err(|_| PaymentError::Declined)?;
        Ok(format!("ch_{cents}_{note}"))
    }

    /// `self: Arc<Self>`: the receiver is borrowed for the key, then moved into the body.
    #[idempotent_task(key = "shared-{order_id}", store = self.store)]
    async fn run_shared(self: Arc<Self>, order_id: u64) -> Result<u32, PaymentError> {
        let _ = order_id;
        Ok(self.calls.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// A generic method; async-trait adds `T: 'async_trait` to its bounds.
    #[idempotent_task(key = "generic-{id}", store = self.store)]
    async fn run_generic<T: Display + Send>(&self, id: T) -> Result<String, PaymentError>
    where
        Self: Sized,
    {
        Ok(format!("{}-{id}", self.tenant))
    }

    /// `&mut self`, with the key not reading `self`.
    #[idempotent_task(key = "mut-{order_id}", store = self.store)]
    async fn run_mut(&mut self, order_id: u64) -> Result<u32, PaymentError> {
        let _ = order_id;
        self.tenant.push('+');
        Ok(self.calls.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

/// `#[async_trait(?Send)]`: the boxed future has no `Send` bound.
#[async_trait(?Send)]
trait LocalJob {
    async fn run_local(&self, order_id: u64, (left, right): (u64, u64)) -> Result<u64, Error>;
}

#[async_trait(?Send)]
impl LocalJob for Charge {
    /// A destructured parameter, which async-trait renames, next to the key's parameter.
    #[idempotent_task(key = "local-{order_id}", store = self.store)]
    async fn run_local(&self, order_id: u64, (left, right): (u64, u64)) -> Result<u64, Error> {
        Ok(order_id + left + right)
    }
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[tokio::main]
async fn main() {
    let charge = Arc::new(Charge {
        store: MemoryStore::new(),
        tenant: "acme".to_owned(),
        calls: AtomicU32::new(0),
    });
    let job: Box<dyn Job + Send + Sync> = Box::new(Charge {
        store: MemoryStore::new(),
        tenant: "acme".to_owned(),
        calls: AtomicU32::new(0),
    });
    let first = assert_send(job.run(7, "a".to_owned())).await.unwrap();
    assert_eq!(first, "ch_7_a!");
    assert_eq!(job.run(7, "a".to_owned()).await.unwrap(), first);
    assert!(matches!(
        job.run(7, "b".to_owned()).await,
        Err(PaymentError::Idempotency(Error::KeyReuse { .. }))
    ));
    assert!(matches!(
        job.run(0, "a".to_owned()).await,
        Err(PaymentError::Declined)
    ));
    assert_eq!(charge.run_generic("x").await.unwrap(), "acme-x");
    assert_eq!(charge.run_generic("x").await.unwrap(), "acme-x");

    let shared: Arc<dyn Job + Send + Sync> = charge.clone();
    assert_eq!(shared.clone().run_shared(1).await.unwrap(), 1);
    assert_eq!(shared.run_shared(1).await.unwrap(), 1);

    let mut owned = Charge {
        store: MemoryStore::new(),
        tenant: "acme".to_owned(),
        calls: AtomicU32::new(0),
    };
    assert_eq!(owned.run_mut(1).await.unwrap(), 1);
    assert_eq!(owned.run_mut(1).await.unwrap(), 1);
    assert_eq!(owned.tenant, "acme+");

    assert_eq!(charge.run_local(4, (5, 6)).await.unwrap(), 15);
    assert_eq!(charge.run_local(4, (0, 0)).await.unwrap(), 15);
}
