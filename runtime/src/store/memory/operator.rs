//! [`Operator`] for [`MemoryStore`]: what the operator's tools see of a store in this process,
//! so that a tool, and the trait's contract, can be tested with no server.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{Entry, Expiring, MemoryStore, released, steps, unix_micros};
use crate::error::{StoreError, StoreErrorKind};
use crate::marker::Marker;
use crate::operator::{Cursor, Forgot, Held, Listed, Operator, Page, Resolution, Resolved, Scope};
use crate::store::{Journal, StepEntry, Store};
use crate::unit::{UnitOfWork, check_task_name};

/// Input: a unit's live entry at `now`. Output: what an operator is shown of it.
fn held(entry: &Expiring<Entry>, now: Instant) -> Held {
    match &entry.value {
        Entry::Done(marker) => Held::marker(marker.to_vec(), Some(entry.left(now))),
        locked @ Entry::Locked {
            token,
            fencing_token,
            ..
        } => match locked.lock_state(now) {
            // Fencing tokens are the wall clock in microseconds when they were granted.
            Ok(left) => Held::lock(
                *fencing_token,
                Some(left),
                fencing_token
                    .map(|granted| Duration::from_micros(unix_micros().saturating_sub(granted))),
            ),
            Err(doubt) => {
                Held::in_doubt(token.as_str().as_bytes().to_vec(), doubt, entry.left(now))
            }
        },
        Entry::Released { .. } => Held::Nothing,
    }
}

/// The fencing counter a forgotten or freed unit keeps, if it has one.
fn kept_counter(fencing_token: Option<u64>, now: Instant) -> Option<Expiring<Entry>> {
    fencing_token.map(|fencing_token| released(fencing_token, now))
}

/// The units live in this process: the scope is the store itself, and a unit's place is its
/// entry. A cursor is the last caller key of the page before, so any text is one.
impl Operator for MemoryStore {
    fn scope(&self) -> Scope {
        Scope::new("store", "memory")
    }

    fn location(&self, unit: &UnitOfWork) -> String {
        format!(
            "the memory entry of task {} key {:?}",
            unit.task(),
            unit.key()
        )
    }

    async fn read(&self, unit: &UnitOfWork) -> Result<Held, StoreError> {
        Ok(self.with_entry(unit, |slot, now| {
            slot.as_ref()
                .map_or(Held::Nothing, |entry| held(entry, now))
        }))
    }

    async fn journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        Store::read_journal(self, unit).await
    }

    async fn list(
        &self,
        task: &str,
        from: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        check_task_name(task).map_err(|err| {
            StoreError::new("list", StoreErrorKind::Configuration, err.to_string())
        })?;
        let now = Instant::now();
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let after = from.map(Cursor::as_str);
        let mut found: Vec<(&UnitOfWork, &Expiring<Entry>)> = state
            .units
            .iter()
            .filter(|(unit, entry)| {
                unit.task() == task
                    && entry.until > now
                    && after.is_none_or(|after| unit.key() > after)
            })
            .collect();
        found.sort_unstable_by(|(a, _), (b, _)| a.key().cmp(b.key()));
        let limit = limit.max(1);
        let next = (found.len() > limit).then(|| Cursor::new(found[limit - 1].0.key()));
        found.truncate(limit);
        let keys_seen = found.len();
        let units = found
            .into_iter()
            .filter_map(|(unit, entry)| match held(entry, now) {
                Held::Nothing => None,
                held => Some(Listed::new(task, unit.digest(), held).with_key(unit.key())),
            })
            .collect();
        Ok(Page::new(units, keys_seen, next))
    }

    async fn forget_exact(&self, unit: &UnitOfWork, shown: &[u8]) -> Result<Forgot, StoreError> {
        Ok(self.with_entry(unit, |slot, now| match slot.as_ref() {
            None
            | Some(Expiring {
                value: Entry::Released { .. },
                ..
            }) => Forgot::Gone,
            Some(Expiring {
                value: Entry::Done(marker),
                ..
            }) if **marker == *shown => {
                let fencing_token = Marker::decode(marker)
                    .ok()
                    .and_then(|marker| marker.fencing_token());
                *slot = kept_counter(fencing_token, now);
                Forgot::Deleted
            }
            Some(_) => Forgot::Changed,
        }))
    }

    async fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
        resolution: &Resolution,
    ) -> Result<Resolved, StoreError> {
        let step = resolution.step_to_record()?;
        let marker = match step {
            Some(_) => None,
            None => resolution.marker_to_store(unit)?,
        };
        Ok(self.with_unit(unit, |slot, journal, now| {
            let fencing_token = match slot.as_ref() {
                None
                | Some(Expiring {
                    value: Entry::Released { .. },
                    ..
                }) => return Resolved::Gone,
                Some(Expiring {
                    value:
                        locked @ Entry::Locked {
                            token,
                            fencing_token,
                            ..
                        },
                    ..
                }) if token.as_str().as_bytes() == shown && locked.lock_state(now).is_err() => {
                    *fencing_token
                }
                Some(_) => return Resolved::Changed,
            };
            if let Some((entry, kept_for)) = step {
                let position = journal.as_ref().map_or(0, |steps| steps.value.len());
                let position = u32::try_from(position).unwrap_or(u32::MAX);
                // At the journal's end, which nobody else extends while the unit is in doubt
                // under this store's one lock: it always appends.
                steps::append(journal, StepEntry::new(position, entry, kept_for), now);
                *slot = kept_counter(fencing_token, now);
                Resolved::StepRecorded
            } else if let Some((marker, result_ttl)) = marker {
                let done = Entry::Done(Arc::from(marker));
                *slot = Some(Expiring::new(done, result_ttl, now));
                Resolved::Recorded
            } else {
                if resolution.discards_steps() {
                    *journal = None;
                }
                *slot = kept_counter(fencing_token, now);
                Resolved::Freed
            }
        }))
    }
}
