//! What a queue knows of a message's earlier deliveries.

use std::future::Future;

/// What the queue knows of a message's earlier deliveries: the counts that
/// [`ConsumerSettings::run`](crate::ConsumerSettings::run) maps a failure or a deferral by.
///
/// A queue keeps the two counts apart where it can (a header its retry copy carries, a
/// key-value bucket): a deferral (a busy key, a store that is down) says nothing about the
/// message, and must not use up its tries. A queue that can only count deliveries (an SQS
/// receive count, a JetStream `delivered` whose bucket cannot be read) answers the deliveries
/// before this one for both, which is never below either count: a poison message then ends
/// early rather than looping for ever.
///
/// ```
/// use idempotask_consumer::History;
///
/// /// A queue that only counts deliveries (1 for the first).
/// struct Delivered(u32);
///
/// impl History for Delivered {
///     async fn failures(&self) -> u32 { self.0.saturating_sub(1) }
///     async fn deferrals(&self) -> u32 { self.0.saturating_sub(1) }
/// }
/// # let _ = Delivered(1);
/// ```
pub trait History {
    /// How many times the message's body failed (an `Err` or a panic) before this delivery; 0
    /// on a first delivery. Asked only when the body failed this time, so a count that costs a
    /// round trip costs it only then.
    fn failures(&self) -> impl Future<Output = u32>;

    /// How many times the message was deferred for the store (a store error, no store, a
    /// misused task) before this delivery; 0 on a first delivery. Asked only when this
    /// delivery is deferred so, for the [`store_backoff`](crate::ConsumerSettings::store_backoff)
    /// delay.
    fn deferrals(&self) -> impl Future<Output = u32>;
}
