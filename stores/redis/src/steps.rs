//! The journal of a unit's steps: a list beside the unit's key, in its hash slot.
//!
//! `read_journal` is one `LRANGE`; `record_step` is the script `step.lua` (the lock checked,
//! the entry appended at its position, the lock renewed). A unit without steps has no list and
//! costs nothing more. The list is not deleted when the unit finishes: it was last kept for the
//! task's result TTL when its last step was recorded, and the marker, written later for as
//! long, outlives it. `forget` deletes it with the marker.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use super::keys::journal_key;
use super::lock::{key_millis, lock_value};
use super::protocol::{Protocol, STEP};
use super::reply::{parse_flag, unexpected};
use idempotask::store::{Journal, LockToken, StepEntry, StoreError, UnitOfWork, ttl_millis};

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Protocol<C> {
    pub(super) fn journal_key(&self, key: &str) -> String {
        journal_key(&self.namespace, key)
    }

    pub(super) async fn read_journal_call(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.journal("read_journal", &self.key(unit)).await
    }

    /// The journal beside the unit's key `key`, one `LRANGE`.
    pub(super) async fn journal(
        &self,
        operation: &'static str,
        key: &str,
    ) -> Result<Journal, StoreError> {
        let journal = self.journal_key(key);
        let mut cmd = redis::cmd("LRANGE");
        cmd.arg(&journal).arg(0).arg(-1);
        let reply = self
            .query(&cmd)
            .await
            .map_err(|err| self.error(operation, &journal, &err))?;
        journal_of(operation, &journal, reply)
    }

    pub(super) async fn record_step_call(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.key(unit);
        let journal = self.journal_key(&key);
        let reply = self
            .invoke_on("record_step", &STEP, &[&key, &journal], |cmd| {
                step_args(cmd, token, entry, lock_ttl);
            })
            .await?;
        parse_flag("record_step", &key, &reply)
    }
}

/// The arguments of `step.lua` (and of the quorum's, which adds its own after them): the
/// lock's value, the entry's position and bytes, the unit key's TTL and the journal's.
pub(super) fn step_args(
    cmd: &mut Cmd,
    token: &LockToken,
    entry: StepEntry<'_>,
    lock_ttl: Duration,
) {
    cmd.arg(lock_value(token))
        .arg(entry.position)
        .arg(entry.bytes)
        .arg(key_millis(token, ttl_millis(lock_ttl)))
        .arg(ttl_millis(entry.kept_for));
}

/// The entries of an `LRANGE` reply.
fn journal_of(operation: &'static str, key: &str, reply: Value) -> Result<Journal, StoreError> {
    let Value::Array(items) = reply else {
        return Err(unexpected(operation, key, &reply));
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::BulkString(entry) => entries.push(entry),
            other => return Err(unexpected(operation, key, &other)),
        }
    }
    Ok(Journal::from_entries(entries))
}
