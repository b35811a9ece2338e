//! How a delivery waits while another one holds the lock: exponential backoff with full jitter.

use std::time::Duration;

/// The first wait after finding the lock taken, by default.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(10);
/// The longest single wait, by default.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How many times a call asks for the lock before it gives up, by default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 64;

/// How a delivery that finds the lock taken waits for the holder.
///
/// Each wait is drawn uniformly from zero to `initial_backoff × 2^(attempt−1)`, capped at
/// `max_backoff` ("full jitter", so waiters spread out instead of waking in lock step), and never
/// longer than the holder's lock has left. After each wait the call asks again, so a waiter gets
/// the holder's result as soon as it is stored. It gives up with
/// [`Error::Contended`](crate::Error::Contended) after `max_attempts` attempts or when it has
/// waited `max_wait` in all (by default the task's lock TTL: waiting longer than the holder may
/// hold the lock is pointless).
///
/// ```
/// use std::time::Duration;
/// use idempotask::RetryPolicy;
/// let policy = RetryPolicy::new()
///     .initial_backoff(Duration::from_millis(5))
///     .max_attempts(10)
///     .max_wait(Duration::from_secs(2));
/// assert_eq!(policy.attempts(), 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct RetryPolicy {
    initial_backoff: Duration,
    max_backoff: Duration,
    max_attempts: u32,
    max_wait: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The defaults: [`DEFAULT_INITIAL_BACKOFF`], [`DEFAULT_MAX_BACKOFF`],
    /// [`DEFAULT_MAX_ATTEMPTS`], and a total wait of at most the task's lock TTL.
    pub const fn new() -> Self {
        Self {
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_wait: None,
        }
    }

    /// Never wait: a delivery that finds the lock taken fails with `Contended` at once.
    pub const fn no_wait() -> Self {
        Self::new().max_attempts(1)
    }

    /// The upper bound of the first wait.
    pub const fn initial_backoff(mut self, backoff: Duration) -> Self {
        self.initial_backoff = backoff;
        self
    }

    /// The upper bound of any single wait.
    pub const fn max_backoff(mut self, backoff: Duration) -> Self {
        self.max_backoff = backoff;
        self
    }

    /// How many times to ask for the lock in all (at least 1).
    pub const fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = if attempts == 0 { 1 } else { attempts };
        self
    }

    /// The longest total wait (default: the task's lock TTL).
    pub const fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = Some(wait);
        self
    }

    /// How many times a delivery asks for the lock at most.
    pub const fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The configured total wait, or `lock_ttl` when none is set.
    pub(crate) fn total_wait(&self, lock_ttl: Duration) -> Duration {
        self.max_wait.unwrap_or(lock_ttl)
    }

    /// The wait after the `attempt`-th busy answer (1-based), before jitter is applied.
    pub(crate) fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.initial_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff)
    }

    /// A jittered wait after the `attempt`-th busy answer.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        ceiling.mul_f64(rand::random::<f64>())
    }

    /// The pause after the `attempts`-th busy answer, `waited` into a call of a task whose lock
    /// TTL is `lock_ttl`; `None` when the call has asked or waited enough.
    pub(crate) fn pause_after_busy(
        &self,
        lock_ttl: Duration,
        attempts: u32,
        waited: Duration,
        lock_ttl_remaining: Option<Duration>,
    ) -> Option<Duration> {
        let total_wait = self.total_wait(lock_ttl);
        if attempts >= self.attempts() || waited >= total_wait {
            return None;
        }
        let pause = self.delay(attempts).min(total_wait.saturating_sub(waited));
        // Ask again right after the holder's lock expires, not a backoff later.
        Some(lock_ttl_remaining.map_or(pause, |left| pause.min(left + Duration::from_millis(1))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_the_cap() {
        let policy = RetryPolicy::new()
            .initial_backoff(Duration::from_millis(10))
            .max_backoff(Duration::from_millis(70));
        let ceilings: Vec<u128> = (1..=5).map(|a| policy.ceiling(a).as_millis()).collect();
        assert_eq!(ceilings, [10, 20, 40, 70, 70]);
        assert_eq!(policy.ceiling(u32::MAX), Duration::from_millis(70));
    }

    #[test]
    fn jittered_delays_stay_under_the_ceiling_and_spread() {
        let policy = RetryPolicy::new();
        let delays: Vec<Duration> = (0..200).map(|_| policy.delay(4)).collect();
        assert!(delays.iter().all(|d| *d <= policy.ceiling(4)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "full jitter spreads waiters out");
    }

    #[test]
    fn zero_attempts_means_one() {
        assert_eq!(RetryPolicy::new().max_attempts(0).attempts(), 1);
        assert_eq!(RetryPolicy::no_wait().attempts(), 1);
    }
}
