//! The journals of units with steps, as the memory store keeps them.

use std::sync::Arc;

use tokio::time::Instant;

use super::expiring::Expiring;
use crate::context::expiry;
use crate::store::{Journal, StepEntry};

/// A unit's recorded steps, first step first.
pub(super) type Steps = Vec<Arc<[u8]>>;

/// The journal a grant or an inspection answers.
pub(super) fn journal_of(journal: Option<&Expiring<Steps>>) -> Journal {
    journal.map_or_else(Journal::default, |steps| {
        Journal::from_entries(steps.value.iter().map(|entry| entry.to_vec()).collect())
    })
}

/// Appends `entry` at its position, for a caller that holds the unit's lock; whether it is
/// recorded. The journal is then kept for the entry's `kept_for` from `now`.
pub(super) fn append(
    journal: &mut Option<Expiring<Steps>>,
    entry: StepEntry<'_>,
    now: Instant,
) -> bool {
    let Ok(position) = usize::try_from(entry.position) else {
        return false;
    };
    if journal.is_none() && position > 0 {
        return false;
    }
    let steps = journal.get_or_insert_with(|| Expiring::new(Vec::new(), entry.kept_for, now));
    match steps.value.get(position) {
        // Written already: by this holder, whose first reply was lost, or by an earlier holder
        // whose entry this one's replay did not match.
        Some(recorded) => return **recorded == *entry.bytes,
        None if position > steps.value.len() => return false,
        None => steps.value.push(Arc::from(entry.bytes)),
    }
    steps.until = expiry(now, entry.kept_for);
    true
}
