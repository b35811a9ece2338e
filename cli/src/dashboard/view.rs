//! What the page shows of one task, read from the store page by page: the counts of the whole
//! task, the locked units closest to their lock's expiry, the units in doubt longest held, and
//! one page of done units.

use std::collections::HashMap;
use std::time::Instant;

use idempotask::operator::{Cursor, Listed, StepRecord, StoredResult};
use idempotask::store::Journal;
use serde::Serialize;

use super::calls::Counters;
use crate::exit::Failure;
use crate::scan::{Entry, describe};
use crate::target::Target;

/// How many keys or rows one store call looks at: small, so that no call holds the store for
/// more than a few milliseconds.
const PAGE: usize = 500;

/// How many locked and how many held units the page lists; the counts are the whole task's.
pub(crate) const SHOWN: usize = 100;

/// How many keys one page of done units looks at.
const DONE_PAGE: usize = 200;

/// One unit as a row of the page.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// The caller key, when the store knows it and keys are not shown hashed.
    pub(crate) key: Option<String>,
    pub(crate) digest: String,
    pub(crate) fencing_token: Option<u64>,
    /// Locked: how long its lock has left (`None`: no expiry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lock_ttl_ms: Option<u64>,
    /// Locked: how long ago its fencing token was granted, where the store can tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) age_ms: Option<u64>,
    /// In doubt: how long ago its lock ran out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) expired_for_ms: Option<u64>,
    /// In doubt: how long the store remembers it still.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) forgotten_in_ms: Option<u64>,
    /// Done: the stored result, unless keys are shown hashed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) result: Option<serde_json::Value>,
    /// Done: how long the result is kept still.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) marker_ttl_ms: Option<u64>,
    /// In doubt: its journal's steps, then the step in doubt; `None` where the store keeps no
    /// journal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) steps: Option<Vec<StepRow>>,
}

/// One step of a held unit's journal as the page shows it: never the value itself, which is
/// the body's data (and hostile input), only its size.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StepRow {
    pub(crate) position: usize,
    /// The step's label (`mail[<part>]`), the part left out where keys are shown hashed;
    /// `None` for the step in doubt, whose name the store never sees.
    pub(crate) step: Option<String>,
    /// `finished`, `unstorable` (it ran; its value could not be stored), `unreadable` (not a
    /// journal entry), or `in_doubt`: the first step the journal lacks, whose effect may have
    /// happened (or, for a body whose step order changed, the step that was refused).
    pub(crate) state: &'static str,
    /// The size of the stored value (or of the whole entry, when it does not decode), in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) value_bytes: Option<usize>,
}

impl StepRow {
    /// Input: a held unit's journal. Output: each entry as a row, then the step in doubt.
    fn of(journal: &Journal, hash_keys: bool) -> Vec<Self> {
        let mut rows: Vec<Self> = journal
            .entries()
            .iter()
            .enumerate()
            .map(|(position, entry)| match StepRecord::decode(entry) {
                Ok(record) => {
                    let (state, value_bytes) = match &record.result {
                        StoredResult::Json(json) => ("finished", Some(json.get().len())),
                        _ => ("unstorable", None),
                    };
                    let step = match (&record.part, hash_keys) {
                        // A key part is the caller's data, as the key is.
                        (Some(_), true) => format!("{}[…]", record.name),
                        _ => record.label(),
                    };
                    Self {
                        position,
                        step: Some(step),
                        state,
                        value_bytes,
                    }
                }
                Err(_) => Self {
                    position,
                    step: None,
                    state: "unreadable",
                    value_bytes: Some(entry.len()),
                },
            })
            .collect();
        rows.push(Self {
            position: journal.len(),
            step: None,
            state: "in_doubt",
            value_bytes: None,
        });
        rows
    }
}

impl Row {
    fn of(entry: Entry, hash_keys: bool) -> Self {
        Self {
            key: entry.key.filter(|_| !hash_keys),
            digest: entry.digest,
            fencing_token: entry.fencing_token,
            lock_ttl_ms: entry.lock_ttl_ms,
            age_ms: None,
            expired_for_ms: entry.expired_for_ms,
            forgotten_in_ms: entry.forgotten_in_ms,
            // A result can name the key (or hold more of the same personal data).
            result: entry.result.filter(|_| !hash_keys),
            marker_ttl_ms: entry.marker_ttl_ms,
            steps: None,
        }
    }

    /// Whether the unit is held at a step: in doubt with steps recorded before it.
    pub(crate) fn at_step(&self) -> Option<usize> {
        let steps = self.steps.as_ref()?;
        (steps.len() > 1).then(|| steps.len() - 1)
    }

    /// The share of its lock's TTL a locked unit has used, in percent, where the store tells
    /// its age.
    pub(crate) fn ttl_used_percent(&self) -> Option<u64> {
        let (age, left) = (self.age_ms?, self.lock_ttl_ms?);
        let whole = age.saturating_add(left).max(1);
        Some(age.saturating_mul(100) / whole)
    }
}

/// One task as the page shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TaskView {
    pub(crate) task: String,
    pub(crate) done: usize,
    pub(crate) locked: usize,
    pub(crate) in_doubt: usize,
    /// Keys no delivery can use (see `idempotask list`).
    pub(crate) flagged: usize,
    /// The largest share of its lock's TTL a locked unit has used, in percent: how close the
    /// task's work comes to its TTL (where the store tells lock ages).
    pub(crate) ttl_used_max_percent: Option<u64>,
    /// The locked units with the least lock TTL left, first.
    pub(crate) locked_units: Vec<Row>,
    /// The units in doubt whose lock ran out longest ago, first.
    pub(crate) held_units: Vec<Row>,
    /// How many of the units in doubt shown are held at a step, with steps recorded.
    pub(crate) held_at_step: usize,
    /// One page of done units.
    pub(crate) done_units: Vec<Row>,
    /// Where the next page of done units starts.
    pub(crate) done_next: Option<String>,
    /// What the workers counted of the task's calls (`--metrics`); `None` without sources, or
    /// when none of them knows the task yet.
    pub(crate) calls: Option<Counters>,
    /// How many store calls the counts took, and how long, in milliseconds.
    pub(crate) store_calls: usize,
    pub(crate) elapsed_ms: u64,
}

/// Input: the target, a task, whether keys are shown hashed, and where its page of done units
/// starts. Output: the task's view: one walk over its units, `PAGE` keys per store call.
pub(crate) async fn task_view(
    target: &Target,
    task: &str,
    hash_keys: bool,
    done_from: Option<&str>,
) -> Result<TaskView, Failure> {
    let started = Instant::now();
    // A `SCAN` may answer a unit twice: each is counted once, as last read.
    let mut states: HashMap<String, u8> = HashMap::new();
    let mut locked: Vec<Row> = Vec::new();
    let mut held: Vec<Row> = Vec::new();
    // What the listing knows of each unit in doubt, to find its journal by.
    let mut held_listed: HashMap<String, Listed> = HashMap::new();
    let mut from: Option<Cursor> = None;
    let mut calls = 0;
    loop {
        let page = target.page(task, from.as_ref(), PAGE).await?;
        calls += 1;
        for listed in &page.units {
            let age = match &listed.held {
                idempotask::operator::Held::Lock { age, .. } => age.map(crate::time::millis),
                _ => None,
            };
            let Some((digest, entry)) = describe(listed) else {
                continue;
            };
            let state = match (entry.done, entry.locked, entry.in_doubt) {
                (true, _, _) => b'd',
                (_, true, _) => b'l',
                (_, _, true) => b'h',
                _ => b'f',
            };
            states.insert(digest.clone(), state);
            locked.retain(|row| row.digest != digest);
            held.retain(|row| row.digest != digest);
            if entry.locked {
                let mut row = Row::of(entry, hash_keys);
                row.age_ms = age;
                locked.push(row);
            } else if entry.in_doubt {
                held_listed.insert(digest.clone(), listed.clone());
                held.push(Row::of(entry, hash_keys));
            }
        }
        keep_first(&mut locked, |row| row.lock_ttl_ms.unwrap_or(u64::MAX));
        keep_first(&mut held, |row| {
            u64::MAX - row.expired_for_ms.unwrap_or_default()
        });
        match page.next {
            Some(next) => from = Some(next),
            None => break,
        }
    }
    // One store call per unit shown in doubt: the held units are few, and each is an
    // operator's work to do.
    for row in &mut held {
        if let Some(listed) = held_listed.get(&row.digest) {
            let journal = target.listed_journal(listed).await?;
            calls += 1;
            row.steps = journal.map(|journal| StepRow::of(&journal, hash_keys));
        }
    }
    let count = |wanted: u8| states.values().filter(|state| **state == wanted).count();
    let (done_units, done_next) = done_page(target, task, hash_keys, done_from).await?;
    Ok(TaskView {
        task: task.to_owned(),
        done: count(b'd'),
        locked: count(b'l'),
        in_doubt: count(b'h'),
        flagged: count(b'f'),
        ttl_used_max_percent: locked.iter().filter_map(Row::ttl_used_percent).max(),
        locked_units: locked,
        held_at_step: held.iter().filter(|row| row.at_step().is_some()).count(),
        held_units: held,
        done_units,
        done_next,
        calls: None,
        store_calls: calls,
        elapsed_ms: crate::time::millis(started.elapsed()),
    })
}

/// Sorts `rows` by `key`, smallest first, and keeps the first [`SHOWN`].
fn keep_first(rows: &mut Vec<Row>, key: impl Fn(&Row) -> u64) {
    rows.sort_by_key(|row| key(row));
    rows.truncate(SHOWN);
}

/// Input: where the page starts (a cursor from the page before). Output: the done units of one
/// store call of `DONE_PAGE` keys (none, on a page of locks), and where the next page starts.
async fn done_page(
    target: &Target,
    task: &str,
    hash_keys: bool,
    from: Option<&str>,
) -> Result<(Vec<Row>, Option<String>), Failure> {
    let from = from.filter(|text| !text.is_empty()).map(Cursor::new);
    let page = target.page(task, from.as_ref(), DONE_PAGE).await?;
    let rows = page
        .units
        .iter()
        .filter_map(describe)
        .filter(|(_, entry)| entry.done)
        .map(|(_, entry)| Row::of(entry, hash_keys))
        .collect();
    Ok((rows, page.next.map(|next| next.as_str().to_owned())))
}
