//! Helpers for testing your own tasks the way queues deliver them: several times at once.
//!
//! Testing a task twice in a row proves little: the dangerous duplicates arrive while the first
//! delivery is still running. [`deliver_concurrently`] starts N deliveries together and returns
//! what each one got, so a test can assert that the side effect ran once and that every caller
//! saw the same result, against a [`MemoryStore`](crate::MemoryStore) or a real Redis.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use idempotask::{Error, MemoryStore, idempotent_task, testing::deliver_concurrently};
//!
//! static EMAILS_SENT: AtomicUsize = AtomicUsize::new(0);
//!
//! #[idempotent_task(key = "welcome-{user_id}")]
//! async fn send_welcome(user_id: u64) -> Result<u64, Error> {
//!     EMAILS_SENT.fetch_add(1, Ordering::SeqCst);
//!     tokio::time::sleep(std::time::Duration::from_millis(20)).await; // the mail server
//!     Ok(user_id)
//! }
//!
//! # #[tokio::main] async fn main() {
//! // In a `#[tokio::test]`: a store of this test's own, whatever the other tests do.
//! let results = idempotask::with_store(MemoryStore::new(), async {
//!     deliver_concurrently(32, |_| send_welcome(7)).await
//! })
//! .await;
//! assert_eq!(EMAILS_SENT.load(Ordering::SeqCst), 1);
//! assert!(results.iter().all(|r| matches!(r, Ok(7))));
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Barrier;

/// Runs `deliveries` calls of `deliver(i)` as separate tokio tasks that start together, and
/// returns their outputs in order.
///
/// Each call runs on its own task (on several threads with a multi-threaded runtime), held at a
/// barrier until all of them exist, so they really overlap. A delivery that panics makes this
/// function panic with the same payload once all deliveries have ended.
///
/// # Panics
/// When a delivery panics, or when called outside a tokio runtime.
pub async fn deliver_concurrently<F, Fut>(deliveries: usize, deliver: F) -> Vec<Fut::Output>
where
    F: Fn(usize) -> Fut,
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(deliveries));
    // The caller's scoped store goes with each delivery onto its own task.
    let scoped = crate::install::scoped();
    let handles: Vec<_> = (0..deliveries)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let delivery = deliver(i);
            let scoped = scoped.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                match scoped {
                    Some(store) => crate::with_store(store, delivery).await,
                    None => delivery.await,
                }
            })
        })
        .collect();
    let mut outputs = Vec::with_capacity(deliveries);
    let mut panic = None;
    for handle in handles {
        match handle.await {
            Ok(output) => outputs.push(output),
            Err(err) if err.is_panic() => {
                panic.get_or_insert(err.into_panic());
            }
            Err(err) => panic!("a delivery was cancelled: {err}"),
        }
    }
    if let Some(payload) = panic {
        std::panic::resume_unwind(payload);
    }
    outputs
}
