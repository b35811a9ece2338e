//! `#[idempotent_task]` end to end against a real Redis.

use idempotask_test_support as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::store::{Store, UnitOfWork};
use idempotask::{Error, idempotent_task};
use idempotask_redis::RedisStore;
use support::RedisServer;

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error("card declined")]
    Declined,
    #[error(transparent)]
    Idempotency(#[from] Error),
}

/// A payment service whose tasks use its own store, as a method on `&self`.
struct Payments {
    store: RedisStore,
    gateway_calls: AtomicUsize,
}

impl Payments {
    async fn new(server: &RedisServer) -> Arc<Self> {
        Arc::new(Self {
            store: server.store().await,
            gateway_calls: AtomicUsize::new(0),
        })
    }

    #[idempotent_task(key = "order-charge-{order_id}", store = self.store, fingerprint = [amount_cents])]
    async fn charge(&self, order_id: u64, amount_cents: u64) -> Result<String, PaymentError> {
        self.gateway_calls.fetch_add(1, Ordering::SeqCst);
        if amount_cents == 0 {
            return Err(PaymentError::Declined);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(format!("ch_{order_id}_{}", rand::random::<u32>()))
    }

    #[idempotent_task(key = "refund-{order_id}", store = self.store, lock_ttl = "30s")]
    async fn refund(&self, order_id: u64, fail_first: bool) -> Result<u32, PaymentError> {
        let call = self.gateway_calls.fetch_add(1, Ordering::SeqCst);
        if fail_first && call == 0 {
            return Err(PaymentError::Declined);
        }
        Ok(u32::try_from(order_id).unwrap())
    }

    #[idempotent_task(key = "audit-{order_id}", store = self.store)]
    async fn audit(&self, order_id: u64) -> Result<u64, PaymentError> {
        self.gateway_calls.fetch_add(1, Ordering::SeqCst);
        assert!(order_id != 13, "unlucky order");
        Ok(order_id)
    }

    #[idempotent_task(key = "export-{batch}", store = self.store, lock_ttl = 1, renew = true, max_attempts = 1)]
    async fn export(&self, batch: u32, work: Duration) -> Result<bool, PaymentError> {
        self.gateway_calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(work).await;
        Ok(idempotask::context().is_some_and(|ctx| ctx.lock_held()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_returns_the_stored_value_without_running_the_body() {
    let server = RedisServer::start();
    let payments = Payments::new(&server).await;
    let first = payments.charge(1, 1_200).await.unwrap();
    for _ in 0..3 {
        assert_eq!(payments.charge(1, 1_200).await.unwrap(), first);
    }
    assert_eq!(payments.gateway_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_run_the_body_once() {
    let server = RedisServer::start();
    let payments = Payments::new(&server).await;
    let deliveries: Vec<_> = (0..64)
        .map(|_| {
            let payments = payments.clone();
            tokio::spawn(async move { payments.charge(2, 500).await.unwrap() })
        })
        .collect();
    let mut results = Vec::new();
    for delivery in deliveries {
        results.push(delivery.await.unwrap());
    }
    assert_eq!(payments.gateway_calls.load(Ordering::SeqCst), 1);
    assert!(results.iter().all(|r| *r == results[0]));
}

#[tokio::test]
async fn an_error_leaves_no_marker_and_the_next_delivery_runs() {
    let server = RedisServer::start();
    let payments = Payments::new(&server).await;
    assert!(matches!(
        payments.refund(3, true).await,
        Err(PaymentError::Declined)
    ));
    let unit = UnitOfWork::new("refund", "refund-3").unwrap();
    let seen = payments.store.inspect(&unit).await.unwrap();
    assert!(!seen.is_done() && !seen.is_locked(), "{seen:?}");
    assert_eq!(payments.refund(3, true).await.unwrap(), 3);
    assert_eq!(payments.refund(3, true).await.unwrap(), 3);
    assert_eq!(payments.gateway_calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_panic_releases_the_lock() {
    let server = RedisServer::start();
    let payments = Payments::new(&server).await;
    let panicked = {
        let payments = payments.clone();
        tokio::spawn(async move { payments.audit(13).await }).await
    };
    assert!(panicked.unwrap_err().is_panic());
    let seen = payments
        .store
        .inspect(&UnitOfWork::new("audit", "audit-13").unwrap())
        .await
        .unwrap();
    assert!(!seen.is_locked() && !seen.is_done(), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_one_second_lock_through_a_three_second_body() {
    let server = RedisServer::start();
    let payments = Payments::new(&server).await;
    let holder = {
        let payments = payments.clone();
        tokio::spawn(async move { payments.export(1, Duration::from_secs(3)).await })
    };
    // Wait until the holder has the lock, then try again after its first TTL ran out.
    let unit = UnitOfWork::new("export", "export-1").unwrap();
    while !payments.store.inspect(&unit).await.unwrap().is_locked() {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let intruder = payments.export(1, Duration::ZERO).await;
    assert!(
        matches!(
            intruder,
            Err(PaymentError::Idempotency(Error::Contended { .. }))
        ),
        "{intruder:?}"
    );
    assert!(holder.await.unwrap().unwrap(), "the holder lost its lock");
    assert_eq!(payments.gateway_calls.load(Ordering::SeqCst), 1);
    assert!(payments.export(1, Duration::ZERO).await.unwrap());
}

#[tokio::test]
async fn a_reused_key_with_another_amount_is_key_reuse() {
    let server = RedisServer::start();
    let payments = Payments::new(&server).await;
    payments.charge(4, 1_000).await.unwrap();
    let reused = payments.charge(4, 9_999).await;
    assert!(
        matches!(
            reused,
            Err(PaymentError::Idempotency(Error::KeyReuse { .. }))
        ),
        "{reused:?}"
    );
    assert_eq!(payments.gateway_calls.load(Ordering::SeqCst), 1);
}

/// A free function on the installed store, with a bare parameter as its key.
#[idempotent_task(key = idempotency_key, lock_ttl = "2s")]
async fn send_receipt(idempotency_key: &str, counter: Arc<AtomicUsize>) -> Result<usize, Error> {
    Ok(counter.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn a_free_function_uses_the_installed_store() {
    let server = RedisServer::start();
    idempotask::install(server.store().await);
    let counter = Arc::new(AtomicUsize::new(0));
    assert_eq!(send_receipt("receipt-1", counter.clone()).await.unwrap(), 1);
    assert_eq!(send_receipt("receipt-1", counter.clone()).await.unwrap(), 1);
    assert_eq!(send_receipt("receipt-2", counter.clone()).await.unwrap(), 2);
}
