//! Where an entry's idempotency key comes from: a field the producer wrote, the entry's id, or
//! a function of the entry.

use crate::Entry;

/// Where the idempotency key of a stream entry comes from.
///
/// Implemented for [`Field`] (a field the producer wrote), [`EntryId`] (the id the stream gave
/// the entry) and every `Fn(&Entry) -> Option<String>` (`None` when the entry has no key).
///
/// The key must name one business operation: two entries that must not both take effect get
/// the same key. A producer that retries an `XADD` after a lost reply adds the entry twice,
/// under two ids: only a key the producer chose ([`Field`]) makes the two one unit.
///
/// ```
/// use idempotask_redis_streams::{Entry, EntryKey, Field};
///
/// let entry = Entry::new("1-0", [("order_id", "7")]);
/// assert_eq!(Field::new("order_id").key(&entry).unwrap(), "7");
/// assert!(Field::new("refund_id").key(&entry).is_err());
/// let prefixed = |entry: &Entry| entry.field_str("order_id").map(|id| format!("order-{id}"));
/// assert_eq!(prefixed.key(&entry).unwrap(), "order-7");
/// ```
pub trait EntryKey: Send + Sync + 'static {
    /// The key of `entry`.
    ///
    /// # Errors
    /// [`MissingKey`] when the entry carries none: it is then dead-lettered, never run.
    fn key(&self, entry: &Entry) -> Result<String, MissingKey>;
}

impl<F> EntryKey for F
where
    F: Fn(&Entry) -> Option<String> + Send + Sync + 'static,
{
    fn key(&self, entry: &Entry) -> Result<String, MissingKey> {
        self(entry).ok_or_else(|| MissingKey::new(entry, "the key function found none"))
    }
}

/// The key is the value of a field the producer wrote (`XADD orders * order_id 7 …`), as
/// text. An entry without it, with an empty one or with one that is not UTF-8 is
/// dead-lettered with [`MissingKey`], never run unprotected.
///
/// ```
/// use idempotask_redis_streams::{Entry, EntryKey, Field};
/// let by_order = Field::new("order_id");
/// assert_eq!(by_order.name(), "order_id");
/// assert_eq!(by_order.key(&Entry::new("3-0", [("order_id", "")])).unwrap_err().entry_id(), "3-0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field(String);

impl Field {
    /// The key is the value of `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// The field's name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl EntryKey for Field {
    fn key(&self, entry: &Entry) -> Result<String, MissingKey> {
        match entry.field(&self.0) {
            None => Err(MissingKey::new(
                entry,
                format!("it has no `{}` field", self.0),
            )),
            Some([]) => Err(MissingKey::new(
                entry,
                format!("its `{}` field is empty", self.0),
            )),
            Some(value) => std::str::from_utf8(value).map(str::to_owned).map_err(|_| {
                MissingKey::new(entry, format!("its `{}` field is not UTF-8", self.0))
            }),
        }
    }
}

/// The key is the entry's id in the stream. Every delivery of one entry (a claim after a
/// crash, a retry) is then one unit; an entry the producer added twice is two. Prefer a
/// [`Field`] the producer chose when it may retry its `XADD`.
///
/// ```
/// use idempotask_redis_streams::{Entry, EntryId, EntryKey};
/// assert_eq!(EntryId.key(&Entry::new("1700000000000-3", [("a", "b")])).unwrap(), "1700000000000-3");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryId;

impl EntryKey for EntryId {
    fn key(&self, entry: &Entry) -> Result<String, MissingKey> {
        Ok(entry.id().to_owned())
    }
}

/// An entry that carries no idempotency key where one was expected. Nothing ran, and the
/// entry is dead-lettered: no redelivery can bring a key.
///
/// ```
/// use idempotask_redis_streams::{Entry, EntryKey, Field};
/// let err = Field::new("order_id").key(&Entry::new("9-1", [("amount", "5")])).unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "entry 9-1 has no idempotency key (it has no `order_id` field); add it to the entry, or key the task by what the entry carries"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "entry {entry_id} has no idempotency key ({why}); add it to the entry, or key the task by what the entry carries"
)]
pub struct MissingKey {
    entry_id: String,
    why: String,
}

impl MissingKey {
    /// `entry` has no key, for the reason `why` (for [`EntryKey`] implementations).
    pub fn new(entry: &Entry, why: impl Into<String>) -> Self {
        Self {
            entry_id: entry.id().to_owned(),
            why: why.into(),
        }
    }

    /// The id of the entry.
    pub fn entry_id(&self) -> &str {
        &self.entry_id
    }
}
