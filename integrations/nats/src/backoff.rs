//! How long a message waits before JetStream delivers it again.

use std::time::Duration;

/// The shortest delay of any nak: a delay of zero would have JetStream deliver the message
/// again at once, and a worker spin on it.
pub(crate) const MIN_DELAY: Duration = Duration::from_millis(10);

/// `first` after the first delivery, doubling with each further one, at most `max`, and never
/// less than [`MIN_DELAY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) first: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max: max.max(first),
        }
    }

    /// The delay after the `delivered`-th delivery (1-based) failed.
    pub(crate) fn after(self, delivered: i64) -> Duration {
        let doublings = u32::try_from(delivered.saturating_sub(1).clamp(0, 20)).unwrap_or(20);
        self.first
            .saturating_mul(1 << doublings)
            .min(self.max)
            .max(MIN_DELAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_its_bound() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let delays: Vec<u128> = [0, 1, 2, 3, 4, 9999]
            .map(|n| backoff.after(n).as_millis())
            .to_vec();
        assert_eq!(delays, [100, 100, 200, 400, 700, 700]);
    }

    #[test]
    fn never_asks_for_less_than_the_floor() {
        let backoff = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(backoff.after(1), MIN_DELAY);
        assert_eq!(backoff.after(30), MIN_DELAY);
    }
}
