//! Whether a consumer's own redelivery settings agree with the task's lock, and whether the
//! failure bucket can be used: checked on the first message, and reported at `WARN`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};

use crate::failures::FailureCounts;

/// A setting of the JetStream consumer, or of the bucket beside it, that works against the
/// task's lock: JetStream may deliver a message again while a worker still holds its lock, drop
/// a message that no worker finished, or end a message before its body has had its tries. See
/// [`Idempotent::consumer_problems`](crate::Idempotent::consumer_problems) and
/// [`Idempotent::check_consumer`](crate::Idempotent::check_consumer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerProblem {
    /// The consumer's `AckWait` is shorter than the one declared with
    /// [`Idempotent::ack_wait`](crate::Idempotent::ack_wait): progress acks come too late, and
    /// JetStream delivers a message again while its body still runs under the lock. A consumer
    /// with a `backoff` list is checked by its entries instead
    /// ([`BackoffShorterThanDeclared`](Self::BackoffShorterThanDeclared)).
    #[error(
        "the consumer's AckWait ({consumer:?}) is shorter than the declared one ({declared:?}): JetStream redelivers messages whose body still runs; declare the consumer's AckWait with `Idempotent::ack_wait`"
    )]
    #[non_exhaustive]
    AckWaitShorterThanDeclared {
        /// The consumer's `AckWait`.
        consumer: Duration,
        /// The one declared to the integration.
        declared: Duration,
    },
    /// An entry of the consumer's `backoff` list is shorter than the `AckWait` declared with
    /// [`Idempotent::ack_wait`](crate::Idempotent::ack_wait). With a `backoff` list, JetStream
    /// waits for the ack of the `n`-th delivery of a message for the list's `n`-th entry (the
    /// last one for every later delivery) instead of `AckWait`, and each progress ack starts
    /// that wait again: an entry shorter than the declared `AckWait` lets the progress acks come
    /// too late, and JetStream delivers the message again while its body still runs under the
    /// lock, as a short `AckWait` does. Only the entries JetStream uses under the consumer's
    /// `max_deliver` count; this is the shortest of them.
    #[error(
        "the consumer's backoff waits {backoff:?} for the ack of delivery {delivery}, less than the declared AckWait ({declared:?}): JetStream redelivers messages whose body still runs; make every backoff entry at least the declared AckWait, or declare the shortest one with `Idempotent::ack_wait`"
    )]
    #[non_exhaustive]
    BackoffShorterThanDeclared {
        /// The first delivery (1 for the first) whose ack JetStream waits `backoff` for.
        delivery: usize,
        /// The shortest entry of the consumer's `backoff` that JetStream uses.
        backoff: Duration,
        /// The `AckWait` declared to the integration.
        declared: Duration,
    },
    /// The consumer limits deliveries: every deferral (a busy key, a store error) is a
    /// delivery, so JetStream may drop a message after `max_deliver` deliveries although no
    /// worker finished it. The integration's
    /// [`max_failures`](crate::Idempotent::max_failures) ends a failing body instead.
    #[error(
        "the consumer's max_deliver is {max_deliver}: deferred deliveries count too, so JetStream may drop a message nobody finished; leave max_deliver unlimited and bound failures with `Idempotent::max_failures`"
    )]
    #[non_exhaustive]
    MaxDeliverLimited {
        /// The consumer's `max_deliver`.
        max_deliver: i64,
    },
    /// The key-value bucket that counts body failures
    /// ([`Idempotent::failure_counts`](crate::Idempotent::failure_counts)) cannot be opened,
    /// created or written. [`max_failures`](crate::Idempotent::max_failures) then counts
    /// JetStream's deliveries, deferred ones included, for each message whose count it cannot
    /// read or write: such a message may be terminated before its body has failed
    /// `max_failures` times (never later).
    #[error(
        "the failure bucket `{bucket}` cannot be used ({reason}): max_failures then counts JetStream's deliveries, deferred ones included, so a message may be terminated early; let the consumer's user create and write the bucket, or create it beforehand"
    )]
    #[non_exhaustive]
    FailureBucketUnusable {
        /// The bucket's name.
        bucket: String,
        /// Why it cannot be used, as the server or the client said.
        reason: String,
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
        if config.backoff.is_empty() {
            // Zero is what a configuration that sets none reads as: JetStream's default then
            // applies.
            let ack_wait = if config.ack_wait.is_zero() {
                crate::defaults::DEFAULT_ACK_WAIT
            } else {
                config.ack_wait
            };
            if ack_wait < self.declared_ack_wait {
                problems.push(ConsumerProblem::AckWaitShorterThanDeclared {
                    consumer: ack_wait,
                    declared: self.declared_ack_wait,
                });
            }
        } else if let Some((delivery, backoff)) =
            shortest_backoff_used(&config.backoff, config.max_deliver)
            && backoff < self.declared_ack_wait
        {
            // JetStream replaces `AckWait` by the first entry, and waits for the ack of each
            // delivery as long as its own entry says: the entries are the clocks to beat.
            problems.push(ConsumerProblem::BackoffShorterThanDeclared {
                delivery,
                backoff,
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

    /// Reads consumer `consumer` of stream `stream` and probes the failure bucket; answers
    /// every problem found.
    ///
    /// # Errors
    /// When the consumer's configuration cannot be read: nothing was checked.
    pub(crate) async fn check(
        self,
        context: &jetstream::Context,
        stream: &str,
        consumer: &str,
        failures: &FailureCounts,
    ) -> Result<Vec<ConsumerProblem>, async_nats::Error> {
        let info = context
            .get_consumer_from_stream::<consumer::Config, _, _>(consumer, stream)
            .await?;
        let mut problems = self.problems(&info.cached_info().config);
        problems.extend(bucket_problem(context, failures).await);
        Ok(problems)
    }
}

/// The bucket's problem, if it has one: it cannot be opened, created or written.
pub(crate) async fn bucket_problem(
    context: &jetstream::Context,
    failures: &FailureCounts,
) -> Option<ConsumerProblem> {
    let err = failures.probe(context).await.err()?;
    Some(ConsumerProblem::FailureBucketUnusable {
        bucket: failures.bucket().to_owned(),
        reason: err.to_string(),
    })
}

/// Input: a consumer's `backoff` list and its `max_deliver`. Output: the shortest entry that
/// JetStream waits for before it delivers a message again, and the first delivery (1-based)
/// it waits that long for; `None` when no entry is used.
///
/// Delivery `n` waits for entry `n - 1`, or the last one when the list is shorter. The last
/// delivery `max_deliver` allows is never followed by another, so its wait does not count.
fn shortest_backoff_used(backoff: &[Duration], max_deliver: i64) -> Option<(usize, Duration)> {
    let redelivered = if max_deliver > 0 {
        usize::try_from(max_deliver - 1).unwrap_or(usize::MAX)
    } else {
        usize::MAX
    };
    // Of equal entries, `min_by_key` keeps the first: the first delivery that waits that long.
    backoff
        .iter()
        .copied()
        .take(redelivered)
        .enumerate()
        .min_by_key(|&(_, entry)| entry)
        .map(|(index, entry)| (index + 1, entry))
}

/// Whether the first-message check has run: not yet, under way, or done. It is done only once
/// the consumer could be read; a check that could not read it (or whose task was dropped) goes
/// back to not yet, and a message at least [`RECHECK_AFTER`] later tries again.
#[derive(Debug, Default)]
pub(crate) struct CheckState {
    check: Mutex<Check>,
    /// `Check::Done`, readable without the mutex: once done, every message asks only this.
    done: AtomicBool,
}

#[derive(Debug, Default, Clone, Copy)]
enum Check {
    #[default]
    NotYet,
    /// The last check could not read the consumer; the next one waits until then.
    FailedUntil(Instant),
    UnderWay,
    Done,
}

/// How long after a check that could not read its consumer the next one may start: a consumer
/// whose user may not read it costs one request per this, not one per message.
pub(crate) const RECHECK_AFTER: Duration = Duration::from_secs(5);

impl CheckState {
    /// Whether a check has completed, after which no message checks again.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Claims the check for the caller when none has completed or is under way, and the last
    /// failed one is [`RECHECK_AFTER`] ago.
    pub(crate) fn start(self: &Arc<Self>) -> Option<Claim> {
        let mut check = self.check.lock().unwrap_or_else(PoisonError::into_inner);
        match *check {
            Check::NotYet => {}
            Check::FailedUntil(until) if Instant::now() >= until => {}
            Check::FailedUntil(_) | Check::UnderWay | Check::Done => return None,
        }
        *check = Check::UnderWay;
        Some(Claim {
            state: Arc::clone(self),
            completed: false,
        })
    }
}

/// A check under way. Dropped without [`completed`](Self::completed), it lets a later message
/// check again.
pub(crate) struct Claim {
    state: Arc<CheckState>,
    completed: bool,
}

impl Claim {
    /// The check ran to its end: no later message checks again.
    pub(crate) fn completed(mut self) {
        self.completed = true;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut check = self
            .state
            .check
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *check = if self.completed {
            self.state.done.store(true, Ordering::Release);
            Check::Done
        } else {
            Check::FailedUntil(Instant::now() + RECHECK_AFTER)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_backoff_entries_used_are_those_before_the_last_allowed_delivery() {
        let backoff = [5 * S, 2 * S, 9 * S];
        // Unlimited: every entry, the last repeated.
        assert_eq!(shortest_backoff_used(&backoff, -1), Some((2, 2 * S)));
        // Delivery 2 is the last: its wait is never followed by a redelivery.
        assert_eq!(shortest_backoff_used(&backoff, 2), Some((1, 5 * S)));
        assert_eq!(shortest_backoff_used(&backoff, 1), None);
        assert_eq!(shortest_backoff_used(&[], -1), None);
        // Equal entries: the first delivery that waits that long.
        assert_eq!(shortest_backoff_used(&[3 * S, S, S], 0), Some((2, S)));
    }

    #[test]
    fn a_consumer_with_a_backoff_is_checked_by_its_entries_not_its_ack_wait() {
        let expected = Expected {
            declared_ack_wait: 10 * S,
        };
        // The first entry is what JetStream turns AckWait into: not two problems.
        let config = consumer::Config {
            ack_wait: S,
            backoff: vec![S, 20 * S],
            ..Default::default()
        };
        assert_eq!(
            expected.problems(&config),
            [ConsumerProblem::BackoffShorterThanDeclared {
                delivery: 1,
                backoff: S,
                declared: 10 * S
            }]
        );
        let long = consumer::Config {
            ack_wait: S,
            backoff: vec![10 * S, 20 * S],
            ..Default::default()
        };
        assert_eq!(expected.problems(&long), []);
    }

    // The flag was set before the check ran: a first message whose consumer could not be read
    // left the consumer unchecked for good.
    #[test]
    fn a_check_that_did_not_complete_can_be_claimed_again_later() {
        let state = Arc::new(CheckState::default());
        let claim = state.start().expect("the first check");
        assert!(state.start().is_none(), "one check at a time");
        drop(claim);
        assert!(state.start().is_none(), "not again before RECHECK_AFTER");
        assert!(!state.is_done());
        *state.check.lock().unwrap() = Check::FailedUntil(Instant::now());
        state
            .start()
            .expect("again once RECHECK_AFTER has passed")
            .completed();
        assert!(state.is_done(), "every later message skips the check");
        assert!(
            state.start().is_none(),
            "a completed check is not run again"
        );
    }
}
