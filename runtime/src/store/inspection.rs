//! [`Inspection`]: what a store holds for one unit, as an operator sees it.

use std::time::Duration;

use super::{Doubt, Journal};

/// What a store holds for one unit of work, from [`Store::inspect`](super::Store::inspect): a marker, a lock, or
/// neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The stored marker's bytes (decode with [`Marker::decode`](crate::operator::Marker::decode)).
    pub marker: Option<Vec<u8>>,
    /// How long the marker has left, when it has an expiry.
    pub marker_ttl: Option<Duration>,
    /// How long the current lock has left, if the unit is locked.
    pub lock_ttl: Option<Duration>,
    /// The unit is in doubt: its last lock ran out without a release or a marker, and the
    /// store still remembers it. The next delivery takes it over.
    pub in_doubt: Option<Doubt>,
    /// The steps recorded for a unit that has not finished (empty once it has, and for a
    /// store that does not record steps).
    pub journal: Journal,
}

impl Inspection {
    /// Nothing stored for the unit.
    pub fn empty() -> Self {
        Self::default()
    }

    /// A completion marker, kept for `ttl` more (`None`: no expiry).
    pub fn done(marker: Vec<u8>, ttl: Option<Duration>) -> Self {
        Self {
            marker: Some(marker),
            marker_ttl: ttl,
            lock_ttl: None,
            in_doubt: None,
            journal: Journal::default(),
        }
    }

    /// A lock with `ttl` left.
    pub fn locked(ttl: Duration) -> Self {
        Self {
            lock_ttl: Some(ttl),
            ..Self::default()
        }
    }

    /// A lock that ran out without a release or a marker, still remembered.
    pub fn doubtful(doubt: Doubt) -> Self {
        Self {
            in_doubt: Some(doubt),
            ..Self::default()
        }
    }

    /// The same, with the steps recorded so far.
    #[must_use]
    pub fn with_journal(mut self, journal: Journal) -> Self {
        self.journal = journal;
        self
    }

    /// Whether a completion marker exists.
    pub fn is_done(&self) -> bool {
        self.marker.is_some()
    }

    /// Whether a lock is held.
    pub fn is_locked(&self) -> bool {
        self.lock_ttl.is_some()
    }
}
