//! [`Status`]: what an operator needs to know about one unit before replaying it.

use std::time::Duration;

use crate::error::check_marker_key;
use crate::error::{CallerKey, CodecErrorKind, Error};
use crate::marker::{Marker, MarkerError};
use crate::store::{Inspection, Store};
use crate::task::Task;
use crate::unit::UnitOfWork;

/// Whether a unit of work is done, running, or unknown to the store.
///
/// This is the question to ask before replaying a dead-lettered message: replay only what is
/// [`Unknown`](Self::Unknown). A `Done` unit would only hand back its stored result, and a
/// `Locked` one is being run right now. The `idempotask status` command prints the same.
///
/// ```
/// use idempotask::{MemoryStore, Task};
/// use idempotask::operator::Status;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
/// let store = MemoryStore::new();
/// let task = Task::new("refund");
/// assert!(matches!(task.status("order-7", &store).await?, Status::Unknown));
/// task.call("order-7").store(store.clone()).run(async { Ok::<_, idempotask::Error>(5) }).await?;
/// let Status::Done(done) = task.status("order-7", &store).await? else { panic!() };
/// assert_eq!(done.marker.key(), "order-7");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Status {
    /// The work succeeded and its result is stored; a delivery gets that result back.
    Done(Done),
    /// A delivery holds the lock and is running the work now.
    #[non_exhaustive]
    Locked {
        /// How long the lock has left (unless its holder renews it).
        lock_ttl: Duration,
    },
    /// The unit is [in doubt](crate::store::Doubt): a delivery's lock ran out without a
    /// release or a result, so its side effect may have happened. The next delivery takes it
    /// over (and reruns, reconciles or holds it, as its task says); find out downstream
    /// whether the effect happened before replaying anything.
    InDoubt(crate::store::Doubt),
    /// The store knows nothing of this unit: it never ran, failed, or its marker expired or
    /// was forgotten. A delivery runs the work.
    Unknown,
}

/// A [`Status::Done`] unit: the stored marker and how long it is kept.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Done {
    /// The stored marker: result, plain key, fencing token.
    pub marker: Marker,
    /// How long the marker has left, when it has an expiry.
    pub ttl: Option<Duration>,
}

impl Inspection {
    /// Reads this inspection as a [`Status`], decoding the marker.
    ///
    /// # Errors
    /// [`MarkerError`] when the stored marker cannot be read by this build.
    pub fn status(&self) -> Result<Status, MarkerError> {
        Ok(match (&self.marker, self.lock_ttl, self.in_doubt) {
            (Some(bytes), _, _) => Status::Done(Done {
                marker: Marker::decode(bytes)?,
                ttl: self.marker_ttl,
            }),
            (None, Some(lock_ttl), _) => Status::Locked { lock_ttl },
            (None, None, Some(doubt)) => Status::InDoubt(doubt),
            (None, None, None) => Status::Unknown,
        })
    }
}

impl Task {
    /// What `store` holds for this task and the caller's `key` (one round trip; changes
    /// nothing).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a key no call could have used, [`Error::Store`] when the store
    /// cannot be reached, [`Error::Codec`] when the stored marker cannot be read, and
    /// [`Error::MarkerKeyMismatch`] when it was written for another key.
    pub async fn status(
        &self,
        key: impl Into<String>,
        store: &impl Store,
    ) -> Result<Status, Error> {
        let unit = UnitOfWork::with_limit(self.name(), key, store.max_key_len())?;
        let inspection = store.inspect(&unit).await?;
        let status = inspection.status().map_err(|err| {
            Error::Codec {
                task: unit.task().to_owned(),
                key: CallerKey::plain(unit.key()),
                kind: CodecErrorKind::Unreadable,
                reason: format!("the stored marker cannot be read: {err}"),
            }
            .keys_shown_as(self.log_key)
        })?;
        if let Status::Done(done) = &status {
            check_marker_key(&unit, done.marker.key())
                .map_err(|err| err.keys_shown_as(self.log_key))?;
        }
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn marker() -> Vec<u8> {
        b"D1,f3|k|true".to_vec()
    }

    #[test]
    fn a_lock_is_locked_and_a_marker_is_done() {
        let locked = Inspection {
            lock_ttl: Some(Duration::from_secs(5)),
            ..Inspection::default()
        };
        assert!(
            matches!(locked.status(), Ok(Status::Locked { lock_ttl }) if lock_ttl.as_secs() == 5)
        );
        let both = Inspection {
            marker: Some(marker()),
            marker_ttl: Some(Duration::from_secs(60)),
            lock_ttl: Some(Duration::from_secs(5)),
            ..Inspection::default()
        };
        let Ok(Status::Done(done)) = both.status() else {
            panic!("{both:?}")
        };
        assert_eq!(done.marker.fencing_token(), Some(3));
        assert!(matches!(
            Inspection::default().status(),
            Ok(Status::Unknown)
        ));
    }

    #[test]
    fn an_unreadable_marker_is_an_error_not_unknown() {
        let foreign = Inspection {
            marker: Some(b"OK".to_vec()),
            ..Inspection::default()
        };
        assert!(foreign.status().is_err());
    }
}
