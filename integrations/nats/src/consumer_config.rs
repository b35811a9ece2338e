//! Whether a consumer's own redelivery settings agree with the task's lock: read from
//! JetStream once, on the first message, and reported at `WARN`.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};

/// A setting of the JetStream consumer that works against the task's lock: JetStream may
/// deliver a message again while a worker still holds its lock, or drop a message that no
/// worker finished. See [`Idempotent::consumer_problems`](crate::Idempotent::consumer_problems).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerProblem {
    /// The consumer's `AckWait` is shorter than the one declared with
    /// [`Idempotent::ack_wait`](crate::Idempotent::ack_wait): progress acks come too late, and
    /// JetStream delivers a message again while its body still runs under the lock.
    #[error(
        "the consumer's AckWait ({consumer:?}) is shorter than the declared one ({declared:?}): JetStream redelivers messages whose body still runs; declare the consumer's AckWait with `Idempotent::ack_wait`"
    )]
    AckWaitShorterThanDeclared {
        /// The consumer's `AckWait`.
        consumer: Duration,
        /// The one declared to the integration.
        declared: Duration,
    },
    /// The consumer limits deliveries: every deferral (a busy key, a store error) is a
    /// delivery, so JetStream may drop a message after `max_deliver` deliveries although no
    /// worker finished it. The integration's
    /// [`max_failures`](crate::Idempotent::max_failures) ends a failing body instead.
    #[error(
        "the consumer's max_deliver is {max_deliver}: deferred deliveries count too, so JetStream may drop a message nobody finished; leave max_deliver unlimited and bound failures with `Idempotent::max_failures`"
    )]
    MaxDeliverLimited {
        /// The consumer's `max_deliver`.
        max_deliver: i64,
    },
}

/// What the integration expects of its consumer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expected {
    pub(crate) declared_ack_wait: Duration,
}

impl Expected {
    /// Input: a consumer's configuration. Output: each way it works against the lock.
    pub(crate) fn problems(self, config: &consumer::Config) -> Vec<ConsumerProblem> {
        let mut problems = Vec::new();
        // Zero is what a configuration that sets none reads as: JetStream's default then applies.
        let ack_wait = if config.ack_wait.is_zero() {
            crate::DEFAULT_ACK_WAIT
        } else {
            config.ack_wait
        };
        if ack_wait < self.declared_ack_wait {
            problems.push(ConsumerProblem::AckWaitShorterThanDeclared {
                consumer: ack_wait,
                declared: self.declared_ack_wait,
            });
        }
        if config.max_deliver > 0 {
            problems.push(ConsumerProblem::MaxDeliverLimited {
                max_deliver: config.max_deliver,
            });
        }
        problems
    }

    /// Reads consumer `consumer` of stream `stream` and logs each problem at `WARN`; a consumer
    /// that cannot be read is logged at `DEBUG` and left alone.
    pub(crate) async fn warn_about(
        self,
        context: jetstream::Context,
        stream: String,
        consumer: String,
    ) {
        let info = context
            .get_consumer_from_stream::<consumer::Config, _, _>(&consumer, &stream)
            .await;
        let info = match info {
            Ok(info) => info,
            Err(err) => {
                tracing::debug!(stream, consumer, error = %err, "could not read the consumer's configuration to check it");
                return;
            }
        };
        for problem in self.problems(&info.cached_info().config) {
            tracing::warn!(stream, consumer, "{problem}");
        }
    }
}
