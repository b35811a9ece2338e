//! [`Expiring`]: a value of the memory store with the instant it lapses.

use std::time::Duration;

use tokio::time::Instant;

use crate::context::expiry;

#[derive(Debug)]
pub(super) struct Expiring<T> {
    pub(super) value: T,
    pub(super) until: Instant,
}

impl<T> Expiring<T> {
    pub(super) fn new(value: T, ttl: Duration, now: Instant) -> Self {
        Self {
            value,
            until: expiry(now, ttl),
        }
    }

    pub(super) fn left(&self, now: Instant) -> Duration {
        self.until.saturating_duration_since(now)
    }
}
