//! How long a message waits before JetStream delivers it again.

use std::time::Duration;

use idempotask::Backoff;

/// The shortest delay of any nak: a delay of zero would have JetStream deliver the message
/// again at once, and a worker spin on it.
pub(crate) const MIN_DELAY: Duration = Duration::from_millis(10);

/// The delay of a nak after the `count`-th failure or delivery (1-based; below 1 counts as 1):
/// `backoff`'s delay, never less than [`MIN_DELAY`].
pub(crate) fn nak_delay(backoff: &Backoff, count: i64) -> Duration {
    let attempt = u32::try_from(count.max(1)).unwrap_or(u32::MAX);
    backoff.delay(attempt).max(MIN_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_its_bound() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let delays: Vec<u128> = [0, 1, 2, 3, 4, 9999, i64::MAX]
            .map(|n| nak_delay(&backoff, n).as_millis())
            .to_vec();
        assert_eq!(delays, [100, 100, 200, 400, 700, 700, 700]);
    }

    #[test]
    fn never_asks_for_less_than_the_floor() {
        let backoff = Backoff::constant(Duration::ZERO);
        assert_eq!(nak_delay(&backoff, 1), MIN_DELAY);
        assert_eq!(nak_delay(&backoff, 30), MIN_DELAY);
        let jittered = Backoff::new(Duration::ZERO, MIN_DELAY).full_jitter(true);
        assert!((0..50).all(|_| nak_delay(&jittered, 3) == MIN_DELAY));
    }
}
