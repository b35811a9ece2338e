//! How long a message waits before its queue delivers it again.

use std::time::Duration;

use idempotask::Backoff;

/// The shortest delay of any redelivery: a delay of zero would have the queue deliver the
/// message again at once, and a worker spin on it; a lock about to expire still gets a moment.
///
/// ```
/// use idempotask::Backoff;
/// use idempotask_consumer::{MIN_DELAY, retry_delay};
/// assert_eq!(retry_delay(&Backoff::constant(std::time::Duration::ZERO), 3), MIN_DELAY);
/// ```
pub const MIN_DELAY: Duration = Duration::from_millis(10);

/// The delay of a redelivery after the `count`-th failure or deferral of a message (1-based;
/// 0 counts as 1): `backoff`'s delay, never less than [`MIN_DELAY`].
///
/// ```
/// use std::time::Duration;
/// use idempotask::Backoff;
/// use idempotask_consumer::retry_delay;
///
/// let backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
/// let delays: Vec<u128> = [0, 1, 2, 3, 4, u32::MAX].map(|n| retry_delay(&backoff, n).as_millis()).to_vec();
/// assert_eq!(delays, [100, 100, 200, 400, 700, 700]);
/// ```
pub fn retry_delay(backoff: &Backoff, count: u32) -> Duration {
    backoff.delay(count.max(1)).max(MIN_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_its_bound() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let delays: Vec<u128> = [0, 1, 2, 3, 4, 9999, u32::MAX]
            .map(|n| retry_delay(&backoff, n).as_millis())
            .to_vec();
        assert_eq!(delays, [100, 100, 200, 400, 700, 700, 700]);
    }

    #[test]
    fn never_asks_for_less_than_the_floor() {
        let backoff = Backoff::constant(Duration::ZERO);
        assert_eq!(retry_delay(&backoff, 1), MIN_DELAY);
        assert_eq!(retry_delay(&backoff, 30), MIN_DELAY);
        let jittered = Backoff::new(Duration::ZERO, MIN_DELAY).full_jitter(true);
        assert!((0..50).all(|_| retry_delay(&jittered, 3) == MIN_DELAY));
    }
}
