//! For operators: what a store holds for a unit ([`Status`], [`Marker`]), what a
//! compare-and-forget did with it ([`Forgot`]), and how a unit in doubt is resolved
//! ([`Resolution`], [`Resolved`]).
//! [`Task::status`](crate::Task::status) answers it for one unit; the `idempotask` command line
//! tool is built on these and on each store crate's own layout (`idempotask_redis::RedisKeys`).

pub use crate::marker::{Marker, MarkerError, StoredResult};
pub use crate::status::{Done, Status};

use std::time::Duration;

use crate::store::{StoreError, StoreErrorKind, UnitOfWork};

/// What a store's compare-and-forget (`forget_exact` in `idempotask_redis` and
/// `idempotask_postgres`) did with the value an operator was shown.
///
/// The operator reads a unit, shows it, and asks to forget it only if it still holds exactly
/// what was shown; this says which of the three things happened. Treat a variant this version
/// does not know as [`Changed`](Self::Changed): nothing is known to be deleted.
///
/// ```
/// use idempotask::operator::Forgot;
///
/// fn say(forgot: Forgot) -> &'static str {
///     match forgot {
///         Forgot::Deleted => "forgotten; the next delivery runs it again",
///         Forgot::Gone => "expired or forgotten meanwhile",
///         _ => "it changed since it was shown; nothing deleted",
///     }
/// }
///
/// assert_eq!(say(Forgot::Gone), "expired or forgotten meanwhile");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forgot {
    /// The value was still the one shown; it is gone (a fenced unit keeps its fencing counter).
    Deleted,
    /// The unit held nothing any more (it expired, or someone else forgot it).
    Gone,
    /// The unit holds something else now (another marker, a lock); nothing was deleted.
    Changed,
}

/// How an operator settles a unit [in doubt](crate::store::Doubt), once the downstream system
/// has told whether the earlier delivery's side effect happened: given to a store's
/// compare-and-set for units in doubt (`resolve_exact` in `idempotask_redis` and
/// `idempotask_postgres`).
///
/// ```
/// use std::time::Duration;
/// use idempotask::operator::{Marker, Resolution};
/// use idempotask::store::UnitOfWork;
/// use serde_json::value::RawValue;
///
/// let unit = UnitOfWork::new("charge", "order-42")?;
/// // The charge went through: every later delivery gets its result back.
/// let result = RawValue::from_string(r#"{"charge":"ch_1"}"#.to_owned())?;
/// let marker = Marker::encode_resolution(&unit, None, &result);
/// let recorded = Resolution::record(marker, Duration::from_secs(24 * 60 * 60));
/// assert!(matches!(recorded, Resolution::Record { .. }));
/// // It did not: the next delivery runs the work as new.
/// let _freed = Resolution::Free;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// The effect happened: store this completion marker (see [`Marker::encode_resolution`])
    /// in place of the lock, kept for `result_ttl`, as a finish would have.
    #[non_exhaustive]
    Record {
        /// The marker's bytes.
        marker: Vec<u8>,
        /// How long the marker is kept: the task's result TTL.
        result_ttl: Duration,
    },
    /// The effect did not happen: forget the lock that ran out, so that the next delivery runs
    /// the work as new, with no doubt (a fenced unit keeps its fencing counter).
    Free,
}

impl Resolution {
    /// [`Record`](Self::Record) `marker`, kept for `result_ttl`.
    pub fn record(marker: Vec<u8>, result_ttl: Duration) -> Self {
        Self::Record { marker, result_ttl }
    }

    /// For a store carrying the resolution out on `unit`: the marker to store in place of the
    /// lock and how long to keep it, or `None` to free the unit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::operator::{Marker, Resolution};
    /// use idempotask::store::UnitOfWork;
    /// use serde_json::value::RawValue;
    ///
    /// let unit = UnitOfWork::new("charge", "order-42")?;
    /// let other = UnitOfWork::new("charge", "order-43")?;
    /// let result = RawValue::from_string("7".to_owned())?;
    /// let day = Duration::from_secs(24 * 60 * 60);
    /// let recorded = Resolution::record(Marker::encode_resolution(&unit, None, &result), day);
    /// assert_eq!(recorded.marker_to_store(&unit)?.map(|(_, ttl)| ttl), Some(day));
    /// assert!(recorded.marker_to_store(&other).is_err());
    /// assert!(Resolution::Free.marker_to_store(&unit)?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// A `Configuration` [`StoreError`] of the operation `resolve` when the marker is not one
    /// that a delivery of `unit` reads: it does not decode, or it was written for another key.
    /// Every store refuses it before writing anything.
    pub fn marker_to_store(
        &self,
        unit: &UnitOfWork,
    ) -> Result<Option<(&[u8], Duration)>, StoreError> {
        let (marker, result_ttl) = match self {
            Self::Record { marker, result_ttl } => (marker, *result_ttl),
            Self::Free => return Ok(None),
        };
        let refused = |why: String| {
            StoreError::new(
                "resolve",
                StoreErrorKind::Configuration,
                format!("refusing to record that marker: {why}"),
            )
        };
        let decoded = Marker::decode(marker).map_err(|err| refused(err.to_string()))?;
        if decoded.key() != unit.key() {
            return Err(refused(format!(
                "it was written for key `{}`, not `{}`",
                decoded.key(),
                unit.key()
            )));
        }
        Ok(Some((marker, result_ttl)))
    }
}

/// What a store's compare-and-set for units in doubt did with the lock an operator was shown.
///
/// It acts only while the unit still holds exactly that lock and the lock is still run out;
/// a unit that changed meanwhile is left alone. Treat a variant this version does not know as
/// [`Changed`](Self::Changed): nothing is known to be written.
///
/// ```
/// use idempotask::operator::Resolved;
///
/// fn say(resolved: Resolved) -> &'static str {
///     match resolved {
///         Resolved::Recorded => "recorded; deliveries get the result back",
///         Resolved::Freed => "freed; the next delivery runs it as new",
///         Resolved::Gone => "the store forgot it meanwhile; nothing written",
///         _ => "it changed since it was shown; nothing written",
///     }
/// }
///
/// assert_eq!(say(Resolved::Freed), "freed; the next delivery runs it as new");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolved {
    /// The unit was still in doubt with the lock shown; the marker is stored in its place.
    Recorded,
    /// The unit was still in doubt with the lock shown; the lock is gone.
    Freed,
    /// The unit was free: the store's memory of the lock ran out, or it was freed (or
    /// released by its holder, come back) meanwhile. Nothing was written; the next delivery
    /// runs the work as new.
    Gone,
    /// The unit holds something else now (a delivery took it over, its holder came back and
    /// finished or renewed it, or it was resolved); nothing was written.
    Changed,
}
