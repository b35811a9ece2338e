//! Exponential backoff: the one doubling delay behind every wait of idempotask and its
//! integrations.

use std::time::Duration;

/// The most doublings a delay takes: `2^31` times the first delay is past any useful bound, and
/// the factor still fits a `u32`.
const MAX_DOUBLINGS: u32 = 31;

/// The pauses between tries of a failing store call (`begin`, `finish`): 50 ms after the first
/// failure, doubling up to 800 ms, without jitter.
pub(crate) const STORE_RETRY_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_millis(800));

/// Exponential backoff: `initial` after the first attempt, doubling with each further one, never
/// more than `max`, optionally with full jitter.
///
/// The delay after the `attempt`-th attempt (1-based; 0 counts as 1) is
/// `min(initial × 2^(attempt−1), max)`, its [`ceiling`](Self::ceiling). With
/// [`full_jitter`](Self::full_jitter) on, [`delay`](Self::delay) draws it uniformly from zero to
/// that ceiling instead, so that waiters which failed together spread out rather than try again
/// in lock step. The doubling saturates: no attempt number overflows, and every delay is at
/// most `max` (when `max` is below `initial`, every delay is `max`).
///
/// One type for every wait: the [`RetryPolicy`](crate::RetryPolicy) of a delivery that finds
/// the lock taken ([`DEFAULT_RETRY_BACKOFF`](crate::DEFAULT_RETRY_BACKOFF), with full jitter),
/// the pauses between tries of a failing store call, and the redelivery delays of the queue
/// integrations (`failure_backoff` and `store_backoff` in `idempotask-nats` and
/// `idempotask-lapin`, each crate's defaults in its `DEFAULT_FAILURE_BACKOFF` and
/// `DEFAULT_STORE_BACKOFF`).
///
/// ```
/// use std::time::Duration;
/// use idempotask::Backoff;
///
/// const BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
/// let delays: Vec<u128> = (1..=5).map(|attempt| BACKOFF.delay(attempt).as_millis()).collect();
/// assert_eq!(delays, [100, 200, 400, 500, 500]);
///
/// // With full jitter, each delay is drawn from zero up to the same ceiling.
/// let jittered = BACKOFF.full_jitter(true);
/// assert!(jittered.delay(3) <= jittered.ceiling(3));
/// assert_eq!(jittered.ceiling(3), Duration::from_millis(400));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    full_jitter: bool,
}

impl Backoff {
    /// `initial` after the first attempt, doubling up to `max`, without jitter.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            full_jitter: false,
        }
    }

    /// The same delay after every attempt: `delay`, without jitter.
    pub const fn constant(delay: Duration) -> Self {
        Self::new(delay, delay)
    }

    /// The delay after the first attempt (the ceiling of the first one, with jitter).
    pub const fn initial(mut self, initial: Duration) -> Self {
        self.initial = initial;
        self
    }

    /// The longest delay (the highest ceiling, with jitter).
    pub const fn max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// Whether each delay is drawn uniformly from zero to its [`ceiling`](Self::ceiling)
    /// ("full jitter") instead of being the ceiling itself.
    pub const fn full_jitter(mut self, on: bool) -> Self {
        self.full_jitter = on;
        self
    }

    /// The delay after the first attempt.
    pub const fn initial_delay(&self) -> Duration {
        self.initial
    }

    /// The longest delay.
    pub const fn max_delay(&self) -> Duration {
        self.max
    }

    /// Whether [`full_jitter`](Self::full_jitter) is on.
    pub const fn is_jittered(&self) -> bool {
        self.full_jitter
    }

    /// The delay after the `attempt`-th attempt (1-based; 0 counts as 1) before jitter:
    /// `min(initial × 2^(attempt−1), max)`, saturating instead of overflowing.
    pub const fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1);
        let doublings = if doublings > MAX_DOUBLINGS {
            MAX_DOUBLINGS
        } else {
            doublings
        };
        let ceiling = self.initial.saturating_mul(1 << doublings);
        if ceiling.as_nanos() < self.max.as_nanos() {
            ceiling
        } else {
            self.max
        }
    }

    /// The delay after the `attempt`-th attempt (1-based): the [`ceiling`](Self::ceiling), or,
    /// with [`full_jitter`](Self::full_jitter), a uniform draw from zero to it.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        if !self.full_jitter {
            return ceiling;
        }
        // Through `try_from`: near `Duration::MAX`, a product that rounds up past it is the
        // ceiling itself, not a panic.
        Duration::try_from_secs_f64(ceiling.as_secs_f64() * rand::random::<f64>())
            .map_or(ceiling, |drawn| drawn.min(ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_from_the_first_delay() {
        let backoff = Backoff::new(10 * MS, Duration::from_secs(60));
        let delays: Vec<u128> = (1..=6).map(|a| backoff.delay(a).as_millis()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 320]);
        assert_eq!(backoff.delay(0), 10 * MS, "attempt 0 counts as the first");
    }

    #[test]
    fn stops_at_the_cap() {
        let backoff = Backoff::new(10 * MS, 70 * MS);
        let delays: Vec<u128> = (1..=5).map(|a| backoff.delay(a).as_millis()).collect();
        assert_eq!(delays, [10, 20, 40, 70, 70]);
        // A cap below the first delay bounds every delay.
        assert_eq!(Backoff::new(100 * MS, 30 * MS).delay(1), 30 * MS);
        assert_eq!(Backoff::constant(5 * MS).delay(9), 5 * MS);
    }

    #[test]
    fn large_attempts_saturate_instead_of_overflowing() {
        let capped = Backoff::new(10 * MS, Duration::from_secs(1));
        for attempt in [31, 32, 33, 64, 1000, u32::MAX] {
            assert_eq!(capped.delay(attempt), Duration::from_secs(1));
        }
        let unbounded = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX);
        assert_eq!(unbounded.ceiling(u32::MAX), Duration::MAX);
        assert!(unbounded.full_jitter(true).delay(u32::MAX) <= Duration::MAX);
        assert_eq!(
            Backoff::new(Duration::ZERO, MS).delay(u32::MAX),
            Duration::ZERO
        );
    }

    #[test]
    fn full_jitter_stays_within_the_ceiling_and_spreads() {
        let backoff = Backoff::new(10 * MS, Duration::from_secs(1)).full_jitter(true);
        for attempt in [1, 4, 40] {
            let delays: Vec<Duration> = (0..200).map(|_| backoff.delay(attempt)).collect();
            assert!(delays.iter().all(|d| *d <= backoff.ceiling(attempt)));
            let distinct: std::collections::HashSet<_> = delays.iter().collect();
            assert!(distinct.len() > 100, "full jitter spreads waiters out");
        }
        assert_eq!(backoff.ceiling(4), 80 * MS);
        assert_eq!(backoff.full_jitter(false).delay(4), 80 * MS);
    }

    #[test]
    fn the_builders_and_getters_agree() {
        let backoff = Backoff::new(MS, MS)
            .initial(2 * MS)
            .max(9 * MS)
            .full_jitter(true);
        assert_eq!(backoff.initial_delay(), 2 * MS);
        assert_eq!(backoff.max_delay(), 9 * MS);
        assert!(backoff.is_jittered());
    }

    #[test]
    fn store_retries_pause_as_before() {
        // 25 ms × 2^min(failures, 5), as `begin` and `finish` paused before `Backoff`.
        let pauses: Vec<u128> = (1..=7)
            .map(|f| STORE_RETRY_BACKOFF.delay(f).as_millis())
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 800, 800]);
    }
}
