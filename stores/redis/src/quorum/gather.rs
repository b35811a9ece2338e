//! Waiting on one future per server: all of them, or only as many as a decision needs.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

/// Polls every future of `futures` until all are ready; their outputs in the same order.
pub(super) async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    gather(futures, Duration::MAX, |_| false)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Polls every future of `futures` until all are ready, or until `soft` has passed and
/// `decided` says the outputs so far (`None` for a future not ready) are enough; the outputs
/// in the same order.
pub(super) async fn gather<F: Future>(
    futures: impl IntoIterator<Item = F>,
    soft: Duration,
    decided: impl Fn(&[Option<F::Output>]) -> bool,
) -> Vec<Option<F::Output>> {
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    let mut soft_over = Box::pin(tokio::time::sleep(soft));
    let mut waited = false;
    poll_fn(|cx| {
        let mut ready = true;
        for (slot, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    Poll::Pending => ready = false,
                }
            }
        }
        if ready {
            return Poll::Ready(());
        }
        if !waited && soft_over.as_mut().poll(cx).is_ready() {
            waited = true;
        }
        if waited && decided(&outputs) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs
}
