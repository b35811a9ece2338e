//! How a delivery waits while another one holds the lock: exponential backoff with full jitter.

use std::time::Duration;

use crate::backoff::Backoff;

/// The waits of a delivery that finds the lock taken, by default ([`RetryPolicy::backoff`]):
/// 10 ms after the first busy answer, doubling up to 1 s, with full jitter.
pub const DEFAULT_RETRY_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).full_jitter(true);
/// How many times a call asks for the lock before it gives up, by default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 64;

/// How a delivery that finds the lock taken waits for the holder.
///
/// Each wait is the [`Backoff`]'s [`delay`](Backoff::delay) for the attempt (by default
/// [`DEFAULT_RETRY_BACKOFF`]: drawn uniformly from zero to `10 ms × 2^(attempt−1)`, capped at
/// 1 s, "full jitter", so waiters spread out instead of waking in lock step), and never longer
/// than the holder's lock has left. After each wait the call asks again, so a waiter gets
/// the holder's result as soon as it is stored. It gives up with
/// [`Error::Contended`](crate::Error::Contended) after `max_attempts` attempts or when it has
/// waited `max_wait` in all (by default the task's lock TTL: waiting longer than the holder may
/// hold the lock is pointless).
///
/// ```
/// use std::time::Duration;
/// use idempotask::{Backoff, RetryPolicy};
/// let policy = RetryPolicy::new()
///     .backoff(Backoff::new(Duration::from_millis(5), Duration::from_millis(200)).full_jitter(true))
///     .max_attempts(10)
///     .max_wait(Duration::from_secs(2));
/// assert_eq!(policy.attempts(), 10);
/// assert_eq!(policy.wait_backoff().max_delay(), Duration::from_millis(200));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct RetryPolicy {
    backoff: Backoff,
    max_attempts: u32,
    max_wait: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The defaults: [`DEFAULT_RETRY_BACKOFF`], [`DEFAULT_MAX_ATTEMPTS`], and a total wait of
    /// at most the task's lock TTL.
    pub const fn new() -> Self {
        Self {
            backoff: DEFAULT_RETRY_BACKOFF,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_wait: None,
        }
    }

    /// Never wait: a delivery that finds the lock taken fails with `Contended` at once.
    pub const fn no_wait() -> Self {
        Self::new().max_attempts(1)
    }

    /// The waits between attempts (default [`DEFAULT_RETRY_BACKOFF`]). Keep its full jitter on
    /// unless waiters are few: without it, deliveries that found the lock taken together ask
    /// again together.
    pub const fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The upper bound of the first wait: the backoff's [`initial`](Backoff::initial).
    pub const fn initial_backoff(mut self, backoff: Duration) -> Self {
        self.backoff = self.backoff.initial(backoff);
        self
    }

    /// The upper bound of any single wait: the backoff's [`max`](Backoff::max).
    pub const fn max_backoff(mut self, backoff: Duration) -> Self {
        self.backoff = self.backoff.max(backoff);
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

    /// The waits between attempts.
    pub const fn wait_backoff(&self) -> Backoff {
        self.backoff
    }

    /// How many times a delivery asks for the lock at most.
    pub const fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The configured total wait, or `lock_ttl` when none is set.
    pub(crate) fn total_wait(&self, lock_ttl: Duration) -> Duration {
        self.max_wait.unwrap_or(lock_ttl)
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
        let pause = self
            .backoff
            .delay(attempts)
            .min(total_wait.saturating_sub(waited));
        // Ask again right after the holder's lock expires, not a backoff later.
        Some(lock_ttl_remaining.map_or(pause, |left| pause.min(left + Duration::from_millis(1))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_setters_forward_to_the_backoff() {
        let policy = RetryPolicy::new()
            .initial_backoff(Duration::from_millis(10))
            .max_backoff(Duration::from_millis(70));
        let ceilings: Vec<u128> = (1..=5)
            .map(|a| policy.wait_backoff().ceiling(a).as_millis())
            .collect();
        assert_eq!(ceilings, [10, 20, 40, 70, 70]);
        assert!(policy.wait_backoff().is_jittered(), "the jitter stays on");
        assert_eq!(RetryPolicy::new().wait_backoff(), DEFAULT_RETRY_BACKOFF);
    }

    #[test]
    fn a_pause_is_bounded_by_the_total_wait_and_the_holders_lock() {
        let ms = Duration::from_millis;
        let policy = RetryPolicy::new()
            .backoff(Backoff::constant(ms(100)))
            .max_attempts(3);
        assert_eq!(
            policy.pause_after_busy(ms(1000), 1, ms(0), None),
            Some(ms(100))
        );
        assert_eq!(
            policy.pause_after_busy(ms(1000), 1, ms(950), None),
            Some(ms(50))
        );
        assert_eq!(
            policy.pause_after_busy(ms(1000), 1, ms(0), Some(ms(5))),
            Some(ms(6))
        );
        assert_eq!(policy.pause_after_busy(ms(1000), 3, ms(0), None), None);
        assert_eq!(policy.pause_after_busy(ms(1000), 1, ms(1000), None), None);
    }

    #[test]
    fn zero_attempts_means_one() {
        assert_eq!(RetryPolicy::new().max_attempts(0).attempts(), 1);
        assert_eq!(RetryPolicy::no_wait().attempts(), 1);
    }
}
