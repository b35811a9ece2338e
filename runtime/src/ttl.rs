//! The bounds of every lock and result TTL, in one place: [`MIN_TTL`], [`MAX_TTL`].
//!
//! The attribute checks its TTL literals against copies of these two in `idempotask-macros`, to
//! point its errors at the literal (a proc macro cannot read the constants of the crate it
//! expands for); the UI cases `lock_ttl_at_the_floor`, `lock_ttl_below_the_floor`,
//! `ttl_at_the_ceiling` and `ttl_too_long` fail unless the copies are equal.

use std::time::Duration;

/// The longest lock or result TTL: 100 years of 365 days, "for ever" in practice.
///
/// Stores keep nothing longer: Redis refuses an expiry past about `i64::MAX` milliseconds from
/// now, PostgreSQL's timestamps end in the year 294276, and a `tokio` `Instant` overflows. A
/// longer TTL given to [`Task`](crate::Task) is kept as `MAX_TTL`; the attribute refuses one; every store
/// shipped clamps what reaches it to this.
pub const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The shortest lock TTL: 100 ms, on every store. [`Task::lock_ttl`](crate::Task::lock_ttl) refuses a shorter one,
/// and so does the attribute, at compile time.
///
/// A lock must outlive what the runner and the stores do with it. The watchdog renews every
/// third of the TTL, so at 100 ms a renewal has 66 ms to be scheduled, sent and answered before
/// the lock it extends expires (millisecond timers and a busy machine's scheduling delays take
/// a good part of that). A grant is kept only when at least 10 ms of its TTL are left once its
/// reply arrives (the late-grant rule, on every store), a tenth of the floor; on
/// `RedlockStore` the clock-drift allowance (1 % + 2 ms) and that floor leave a round 87 ms.
/// Below that, the stores disagree: a 1 ms lock was granted and expired before its body's
/// first renewal on `MemoryStore`, so several deliveries ran, and was always granted too late
/// on Redis, so none did. Results are kept at least as long as the lock
/// ([`Task::result_ttl`](crate::Task::result_ttl)), so no TTL a task uses is shorter.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// `ttl`, at most [`MAX_TTL`].
pub(crate) const fn clamp_ttl(ttl: Duration) -> Duration {
    if ttl.as_secs() > MAX_TTL.as_secs() {
        MAX_TTL
    } else {
        ttl
    }
}
