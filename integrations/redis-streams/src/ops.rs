//! The Redis commands of a consumer: join the group, read, claim, count deliveries, settle a
//! batch in one transaction, and trim.

use redis::aio::ConnectionManager;
use redis::{Cmd, Pipeline, Value};

use crate::StreamError;
use crate::entry::{Entry, text};

/// Where a consumer reads and writes: its stream, group and name, the dead-letter stream, and
/// the hash of failure counts.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) stream: String,
    pub(crate) group: String,
    pub(crate) consumer: String,
    pub(crate) dead: String,
    pub(crate) failures: String,
}

/// What a settled batch writes: the acks, the dead letters and the failure counts.
#[derive(Debug, Default)]
pub(crate) struct Settlement {
    pub(crate) acked: Vec<String>,
    /// The entry, the reason's short name and its text.
    pub(crate) dead: Vec<(Entry, &'static str, String)>,
    pub(crate) failures: Vec<(String, u32)>,
}

impl Settlement {
    pub(crate) fn is_empty(&self) -> bool {
        self.acked.is_empty() && self.dead.is_empty() && self.failures.is_empty()
    }
}

/// The id of the original entry, in a dead-letter entry.
///
/// A dead-letter entry is the original's fields followed by this one, [`REASON_FIELD`] and
/// [`ERROR_FIELD`]; an operator's tool reads them back:
///
/// ```
/// use idempotask_redis_streams::{ERROR_FIELD, Entry, REASON_FIELD, SOURCE_ID_FIELD};
///
/// // As `XRANGE orders:dead - +` returns it.
/// let dead = Entry::new("1700000000500-0", [
///     ("order_id", "7"),
///     (SOURCE_ID_FIELD, "1700000000000-0"),
///     (REASON_FIELD, "gave-up"),
///     (ERROR_FIELD, "the body failed 5 times, which is max_failures: declined"),
/// ]);
/// assert_eq!(dead.field_str(REASON_FIELD), Some("gave-up"));
/// let original: Vec<_> = dead.fields().filter(|(name, _)| !name.starts_with("idempotask-")).collect();
/// assert_eq!(original, [("order_id", b"7".as_slice())]);
/// ```
pub const SOURCE_ID_FIELD: &str = "idempotask-source-id";
/// Why the entry was dead-lettered, in a dead-letter entry:
/// [`Rejection::reason`](crate::Rejection::reason).
pub const REASON_FIELD: &str = "idempotask-reason";
/// The error's text, in a dead-letter entry.
pub const ERROR_FIELD: &str = "idempotask-error";

static TRIM: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("trim.lua")));

impl Names {
    /// Creates the group at the stream's start (and the stream, when missing); a group that
    /// exists is left as it is.
    pub(crate) async fn join(&self, conn: &mut ConnectionManager) -> Result<(), StreamError> {
        let created: Result<Value, _> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(conn)
            .await;
        match created {
            Ok(_) => Ok(()),
            Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
            Err(err) => Err(StreamError::redis("XGROUP CREATE", err)),
        }
    }

    /// New entries for this consumer, at most `count`, waiting up to `block_ms` when there
    /// are none (`None`: not at all).
    pub(crate) async fn read(
        &self,
        conn: &mut ConnectionManager,
        count: usize,
        block_ms: Option<u64>,
    ) -> Result<Vec<Entry>, StreamError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(count);
        if let Some(ms) = block_ms {
            cmd.arg("BLOCK").arg(ms);
        }
        cmd.arg("STREAMS").arg(&self.stream).arg(">");
        let Some(reply) = self.in_group(conn, &cmd, "XREADGROUP").await? else {
            return Ok(Vec::new());
        };
        let streams = match reply {
            Value::Nil => return Ok(Vec::new()),
            Value::Array(streams) => streams
                .into_iter()
                .filter_map(|stream| match stream {
                    Value::Array(mut pair) if pair.len() == 2 => pair.pop(),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            Value::Map(streams) => streams.into_iter().map(|(_, entries)| entries).collect(),
            other => return Err(StreamError::reply("XREADGROUP", &format!("{other:?}"))),
        };
        Ok(streams
            .into_iter()
            .flat_map(|entries| match entries {
                Value::Array(entries) => entries,
                _ => Vec::new(),
            })
            .filter_map(Entry::from_value)
            .collect())
    }

    /// Claims up to `count` entries idle for at least `idle_ms`, from any consumer, starting
    /// at `cursor`; answers them and the next cursor.
    pub(crate) async fn autoclaim(
        &self,
        conn: &mut ConnectionManager,
        idle_ms: u64,
        cursor: &str,
        count: usize,
    ) -> Result<(Vec<Entry>, String), StreamError> {
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(idle_ms)
            .arg(cursor)
            .arg("COUNT")
            .arg(count);
        let Some(reply) = self.in_group(conn, &cmd, "XAUTOCLAIM").await? else {
            return Ok((Vec::new(), "0-0".to_owned()));
        };
        let Value::Array(mut parts) = reply else {
            return Err(StreamError::reply("XAUTOCLAIM", "not an array"));
        };
        if parts.len() < 2 {
            return Err(StreamError::reply("XAUTOCLAIM", "too short"));
        }
        let entries = parts.swap_remove(1);
        let next = text(parts.swap_remove(0))
            .ok_or_else(|| StreamError::reply("XAUTOCLAIM", "no cursor"))?;
        let entries = match entries {
            Value::Array(entries) => entries.into_iter().filter_map(Entry::from_value).collect(),
            _ => Vec::new(),
        };
        Ok((entries, next))
    }

    /// Runs `cmd`, a command of the group; when the group is gone (the stream was deleted, or
    /// Redis restarted without persistence), joins it again and answers `None`: the entries the
    /// group held went with it, and new ones are read from the new group.
    async fn in_group(
        &self,
        conn: &mut ConnectionManager,
        cmd: &Cmd,
        action: &'static str,
    ) -> Result<Option<Value>, StreamError> {
        match cmd.query_async(conn).await {
            Ok(reply) => Ok(Some(reply)),
            Err(err) if err.code() == Some("NOGROUP") => {
                tracing::warn!(
                    stream = self.stream,
                    group = self.group,
                    "the consumer group is gone (the stream was deleted, or Redis restarted without persistence); creating it again"
                );
                self.join(conn).await?;
                Ok(None)
            }
            Err(err) => Err(StreamError::redis(action, err)),
        }
    }

    /// The group's delivery counter of each of `ids` (1 for an id no longer pending).
    pub(crate) async fn deliveries(
        &self,
        conn: &mut ConnectionManager,
        ids: &[&str],
    ) -> Result<Vec<u32>, StreamError> {
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("XPENDING")
                .arg(&self.stream)
                .arg(&self.group)
                .arg(*id)
                .arg(*id)
                .arg(1);
        }
        let replies: Vec<Value> = pipe
            .query_async(conn)
            .await
            .map_err(|err| StreamError::redis("XPENDING", err))?;
        Ok(replies.into_iter().map(delivery_count).collect())
    }

    /// Takes `ids` (this consumer's entries, running or waiting) for this consumer again,
    /// resetting their idle time without counting a delivery (`XCLAIM … JUSTID`); answers
    /// those that are still pending.
    pub(crate) async fn refresh(
        &self,
        conn: &mut ConnectionManager,
        ids: &[&str],
    ) -> Result<Vec<String>, StreamError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(0)
            .arg(ids)
            .arg("JUSTID");
        let Some(reply) = self.in_group(conn, &cmd, "XCLAIM").await? else {
            return Ok(Vec::new());
        };
        match reply {
            Value::Array(ids) => Ok(ids.into_iter().filter_map(text).collect()),
            other => Err(StreamError::reply("XCLAIM", &format!("{other:?}"))),
        }
    }

    /// The failure count recorded for entry `id`; 0 when none is.
    pub(crate) async fn failures(
        &self,
        conn: &mut ConnectionManager,
        id: &str,
    ) -> Result<u32, StreamError> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&self.failures).arg(id);
        match query(conn, &cmd, "HGET").await? {
            Value::Nil => Ok(0),
            value => text(value)
                .and_then(|count| count.parse().ok())
                .ok_or_else(|| StreamError::reply("HGET", "not a count")),
        }
    }

    /// Writes `settlement` in one transaction: the failure counts, the dead letters (each
    /// added to the dead-letter stream and acked together) and the acks.
    pub(crate) async fn settle(
        &self,
        conn: &mut ConnectionManager,
        settlement: &Settlement,
    ) -> Result<(), StreamError> {
        if settlement.is_empty() {
            return Ok(());
        }
        let mut pipe = Pipeline::new();
        pipe.atomic();
        for (id, count) in &settlement.failures {
            pipe.cmd("HSET")
                .arg(&self.failures)
                .arg(id)
                .arg(*count)
                .ignore();
        }
        let mut done: Vec<&str> = settlement.acked.iter().map(String::as_str).collect();
        for (entry, reason, error) in &settlement.dead {
            let add = pipe.cmd("XADD").arg(&self.dead).arg("*");
            for (field, value) in entry.fields() {
                add.arg(field).arg(value);
            }
            add.arg(SOURCE_ID_FIELD)
                .arg(entry.id())
                .arg(REASON_FIELD)
                .arg(*reason)
                .arg(ERROR_FIELD)
                .arg(error)
                .ignore();
            done.push(entry.id());
        }
        if !done.is_empty() {
            pipe.cmd("XACK")
                .arg(&self.stream)
                .arg(&self.group)
                .arg(&done)
                .ignore();
            pipe.cmd("HDEL").arg(&self.failures).arg(&done).ignore();
        }
        pipe.query_async::<()>(conn)
            .await
            .map_err(|err| StreamError::redis("MULTI (XACK, XADD, HSET)", err))
    }

    /// Trims the stream up to the oldest entry some group has not acknowledged (see
    /// `trim.lua`); answers how many entries went.
    pub(crate) async fn trim(&self, conn: &mut ConnectionManager) -> Result<u64, StreamError> {
        let removed: u64 = TRIM
            .key(&self.stream)
            .invoke_async(conn)
            .await
            .map_err(|err| StreamError::redis("XTRIM MINID (trim.lua)", err))?;
        Ok(removed)
    }
}

async fn query(
    conn: &mut ConnectionManager,
    cmd: &Cmd,
    action: &'static str,
) -> Result<Value, StreamError> {
    cmd.query_async(conn)
        .await
        .map_err(|err| StreamError::redis(action, err))
}

/// Input: an `XPENDING <id> <id> 1` reply (`[[id, consumer, idle, deliveries]]`). Output:
/// the delivery count, 1 when the entry is no longer pending.
fn delivery_count(reply: Value) -> u32 {
    let Value::Array(mut rows) = reply else {
        return 1;
    };
    let Some(Value::Array(mut row)) = rows.pop() else {
        return 1;
    };
    match row.pop() {
        Some(Value::Int(n)) => u32::try_from(n).unwrap_or(u32::MAX).max(1),
        _ => 1,
    }
}
