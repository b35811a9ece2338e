//! A unit's journal: the recorded results of its finished steps, as a store keeps them.

use std::time::Duration;

use crate::doubt::Doubt;

/// The encoded entries of a unit's finished steps, in the order its body ran them.
///
/// A store hands the journal back with every grant ([`Begin::Acquired`](super::Begin)), so
/// that a rerun replays the finished steps instead of running them again; it keeps the journal
/// across a release and a lapsed lock, and drops it when the unit's result is recorded or
/// forgotten. The entries are opaque to a store: the runtime encodes and decodes them (the
/// layout is in `docs/protocol.md`).
///
/// ```
/// use idempotask::store::Journal;
/// let journal = Journal::from_entries(vec![b"first".to_vec(), b"second".to_vec()]);
/// assert_eq!(journal.len(), 2);
/// assert_eq!(journal.entries()[1], b"second");
/// assert!(Journal::default().is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Journal {
    entries: Vec<Vec<u8>>,
    doubt: Option<Doubt>,
}

impl Journal {
    /// A journal of these entries, first step first.
    pub fn from_entries(entries: Vec<Vec<u8>>) -> Self {
        Self {
            entries,
            doubt: None,
        }
    }

    /// This journal, read by a holder that learned with it that an earlier execution died
    /// while it held the unit, with this journal as it left it: the step after its last entry
    /// is in doubt, and gets its step's policy
    /// ([`TaskContext::step_or_hold`](crate::TaskContext::step_or_hold), …). What a store
    /// whose lock leaves no trace of a dead holder (a database transaction's) answers from
    /// the [step store of a transaction](super::TransactionScope::step_store); a store whose
    /// lock lapses into doubt answers that doubt with the grant instead
    /// ([`Begin::Acquired`](super::Begin)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::store::{Doubt, Journal};
    /// let doubt = Doubt::new(None, Duration::from_secs(3));
    /// let journal = Journal::from_entries(vec![b"first".to_vec()]).in_doubt(doubt);
    /// assert_eq!(journal.doubt(), Some(doubt));
    /// assert_eq!(Journal::default().doubt(), None);
    /// ```
    #[must_use]
    pub fn in_doubt(mut self, doubt: Doubt) -> Self {
        self.doubt = Some(doubt);
        self
    }

    /// The doubt the store found with this journal (see [`in_doubt`](Self::in_doubt)).
    pub fn doubt(&self) -> Option<Doubt> {
        self.doubt
    }

    /// The entries, first step first.
    pub fn entries(&self) -> &[Vec<u8>] {
        &self.entries
    }

    /// How many steps are recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no step is recorded (a unit without steps, or none finished yet).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, to keep.
    pub fn into_entries(self) -> Vec<Vec<u8>> {
        self.entries
    }
}

/// One finished step to append to a unit's journal with
/// [`Store::record_step`](super::Store::record_step).
///
/// ```
/// use std::time::Duration;
/// use idempotask::store::StepEntry;
/// let entry = StepEntry::new(0, b"{}", Duration::from_secs(3600));
/// assert_eq!(entry.position, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepEntry<'a> {
    /// Where the entry goes: the number of entries the journal must hold before it. A store
    /// appends it only at that position, so that two writers cannot both extend one journal.
    pub position: u32,
    /// The encoded entry.
    pub bytes: &'a [u8],
    /// How long the store keeps the journal when the unit never gets its result (its holder
    /// gave up or died): the task's result TTL.
    pub kept_for: Duration,
}

impl<'a> StepEntry<'a> {
    /// The entry `bytes` at `position`, kept for `kept_for` when the unit never finishes.
    pub fn new(position: u32, bytes: &'a [u8], kept_for: Duration) -> Self {
        Self {
            position,
            bytes,
            kept_for,
        }
    }
}
