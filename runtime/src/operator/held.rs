//! [`Held`]: what one unit holds, raw, as an operator is shown it; [`Listed`]: one unit of a
//! listing.

use std::time::Duration;

use crate::doubt::Doubt;
use crate::marker::{Marker, MarkerError};
use crate::unit::UnitOfWork;

/// What a store holds for one unit, raw, as an operator is shown it: the answer of
/// [`Operator::read`](super::Operator::read) and of each unit of a listing, the same on every
/// store.
///
/// [`Store::inspect`](crate::store::Store::inspect) answers what a delivery needs and folds
/// away the rest; this keeps what an operator must see before acting: the exact bytes that
/// [`forget_exact`](super::Operator::forget_exact) and
/// [`resolve_exact`](super::Operator::resolve_exact) compare, a marker that does not decode, a
/// value no delivery wrote. A store builds it with the constructors ([`Held::lock`],
/// [`Held::in_doubt`], [`Held::marker`], [`Held::foreign`], [`Held::other_type`]); treat a
/// variant this version does not know as one that no delivery can use.
///
/// ```
/// use std::time::Duration;
/// use idempotask::operator::Held;
///
/// let held = Held::marker(br#"D8,dH-3x|order-42|{"id":"ch_1"}"#.to_vec(), Some(Duration::from_secs(60)));
/// match &held {
///     Held::Marker { marker: Ok(marker), .. } => assert_eq!(marker.key(), "order-42"),
///     other => panic!("{other:?}"),
/// }
/// assert!(matches!(Held::marker(b"Dgarbage".to_vec(), None), Held::Marker { marker: Err(_), .. }));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Held {
    /// Nothing a delivery reads: the unit never ran, or was released, expired, forgotten or
    /// freed (a fenced unit's kept fencing counter included).
    Nothing,
    /// A lock: a delivery is running the work.
    #[non_exhaustive]
    Lock {
        /// The fencing token it was granted with, for a fenced task.
        fencing_token: Option<u64>,
        /// How long the lock has left; `None` when it has no expiry, which idempotask never
        /// leaves on a lock (something else changed it).
        lock_ttl_remaining: Option<Duration>,
        /// About how long ago it was granted, where the store can tell (the Redis stores' and
        /// `MemoryStore`'s fencing tokens are their clock in microseconds); `None` otherwise.
        age: Option<Duration>,
    },
    /// A lock that ran out without a release or a marker, still remembered: the unit is
    /// [in doubt](crate::store::Doubt) (its delivery may have done its side effect) until an
    /// operator resolves it, a delivery takes it over, or the store forgets it.
    #[non_exhaustive]
    InDoubt {
        /// What [`resolve_exact`](super::Operator::resolve_exact) compares: the lock as the
        /// store keeps it (the Redis value, the holder's token in a PostgreSQL row).
        bytes: Vec<u8>,
        /// The fencing token it was granted with, for a fenced task.
        fencing_token: Option<u64>,
        /// How long ago it ran out, on the store's clock.
        expired_for: Duration,
        /// How long the store remembers it still; then the unit is free.
        forgotten_in: Duration,
    },
    /// A completion marker, readable or not.
    #[non_exhaustive]
    Marker {
        /// The marker, exactly as stored: what
        /// [`forget_exact`](super::Operator::forget_exact) compares.
        bytes: Vec<u8>,
        /// How long the marker has left; `None` when it has no expiry.
        ttl: Option<Duration>,
        /// The marker decoded, or why it cannot be. A readable marker may still have been
        /// written for another key (a forged value): compare its [`key`](Marker::key).
        marker: Result<Marker, MarkerError>,
    },
    /// A value that is neither a marker nor a lock: not idempotask's.
    #[non_exhaustive]
    Foreign {
        /// The value, exactly as stored: what
        /// [`forget_exact`](super::Operator::forget_exact) compares.
        bytes: Vec<u8>,
    },
    /// Data of another type where the unit's value should be (a Redis hash, list, …):
    /// something else uses the name.
    #[non_exhaustive]
    OtherType {
        /// The type, as the store names it.
        kind: String,
    },
}

impl Held {
    /// A lock granted with `fencing_token`, with `lock_ttl_remaining` left (`None`: no
    /// expiry), granted about `age` ago where the store can tell.
    pub fn lock(
        fencing_token: Option<u64>,
        lock_ttl_remaining: Option<Duration>,
        age: Option<Duration>,
    ) -> Self {
        Self::Lock {
            fencing_token,
            lock_ttl_remaining,
            age,
        }
    }

    /// A lock in doubt, stored as `bytes`, that ran out as `doubt` says and is remembered for
    /// `forgotten_in` more.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::operator::Held;
    /// use idempotask::store::Doubt;
    ///
    /// let doubt = Doubt::new(Some(7), Duration::from_secs(3));
    /// let held = Held::in_doubt(b"Labc~60000.7".to_vec(), doubt, Duration::from_secs(57));
    /// assert!(matches!(held, Held::InDoubt { fencing_token: Some(7), .. }));
    /// ```
    pub fn in_doubt(bytes: Vec<u8>, doubt: Doubt, forgotten_in: Duration) -> Self {
        Self::InDoubt {
            bytes,
            fencing_token: doubt.fencing_token,
            expired_for: doubt.expired_for,
            forgotten_in,
        }
    }

    /// A completion marker stored as `bytes`, with `ttl` left (`None`: no expiry), decoded
    /// here.
    pub fn marker(bytes: Vec<u8>, ttl: Option<Duration>) -> Self {
        Self::Marker {
            marker: Marker::decode(&bytes),
            bytes,
            ttl,
        }
    }

    /// A value no delivery wrote, stored as `bytes`.
    pub fn foreign(bytes: Vec<u8>) -> Self {
        Self::Foreign { bytes }
    }

    /// Data of type `kind` where the unit's value should be.
    pub fn other_type(kind: impl Into<String>) -> Self {
        Self::OtherType { kind: kind.into() }
    }
}

/// One unit of a task as a listing found it ([`Page::units`](super::Page::units)): which unit,
/// and what it holds.
///
/// ```
/// use idempotask::operator::{Held, Listed};
/// use idempotask::store::UnitOfWork;
///
/// let unit = UnitOfWork::new("charge", "order-42")?;
/// let listed = Listed::new("charge", unit.digest(), Held::Nothing).with_key("order-42");
/// assert_eq!(listed.unit(), Some(unit));
/// # Ok::<(), idempotask::InvalidKey>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Listed {
    /// The task.
    pub task: String,
    /// The digest of the unit's caller key ([`UnitOfWork::digest`]): what identifies it where
    /// the store keeps no key.
    pub digest: String,
    /// The caller key, where the store keeps it beside the unit (a PostgreSQL row); `None`
    /// where it keeps only the digest (a Redis key). A marker names it too:
    /// [`own_marker`](Self::own_marker).
    pub key: Option<String>,
    /// What the unit holds.
    pub held: Held,
}

impl Listed {
    /// The unit of `task` whose key has `digest`, holding `held`.
    pub fn new(task: impl Into<String>, digest: impl Into<String>, held: Held) -> Self {
        Self {
            task: task.into(),
            digest: digest.into(),
            key: None,
            held,
        }
    }

    /// The same, with the caller key the store keeps beside it.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The unit's completion marker, when it holds one that decodes and was written for this
    /// unit: its key hashes to [`digest`](Self::digest). `None` for anything else, a marker
    /// of another key (a forged value or a digest collision) included.
    ///
    /// ```
    /// use idempotask::operator::{Held, Listed};
    /// use idempotask::store::UnitOfWork;
    ///
    /// let marker = br#"D8,dH-3x|order-42|{"id":"ch_1"}"#.to_vec();
    /// let own = UnitOfWork::new("charge", "order-42")?;
    /// let other = UnitOfWork::new("charge", "order-43")?;
    /// let listed = |digest: &str| Listed::new("charge", digest, Held::marker(marker.clone(), None));
    /// assert!(listed(own.digest()).own_marker().is_some());
    /// assert!(listed(other.digest()).own_marker().is_none());
    /// # Ok::<(), idempotask::InvalidKey>(())
    /// ```
    pub fn own_marker(&self) -> Option<&Marker> {
        match &self.held {
            Held::Marker {
                marker: Ok(marker), ..
            } if self.hashes_here(marker.key()) => Some(marker),
            _ => None,
        }
    }

    /// The unit, when its caller key is known: kept by the store beside it, or named by its
    /// own marker. `None` for a unit known by its digest alone (a Redis lock).
    pub fn unit(&self) -> Option<UnitOfWork> {
        let key = match (&self.key, self.own_marker()) {
            (Some(key), _) => key.as_str(),
            (None, Some(marker)) => marker.key(),
            (None, None) => return None,
        };
        UnitOfWork::with_limit(&self.task, key, usize::MAX)
            .ok()
            .filter(|unit| unit.digest() == self.digest)
    }

    /// Whether `key` is the caller key whose digest this unit has.
    fn hashes_here(&self, key: &str) -> bool {
        UnitOfWork::with_limit(&self.task, key, usize::MAX)
            .is_ok_and(|unit| unit.digest() == self.digest)
    }
}
