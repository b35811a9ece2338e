//! The Redis Streams side of the queue bench: the streams live on the store's own Redis, as
//! they do for a user who already runs that Redis for idempotask.

use idempotask::store::BatchingStore;
use idempotask_redis::RedisStore;
use idempotask_redis_streams::{Field, Handled, Idempotent};
use redis::aio::ConnectionManager;

use super::batch::{Batch, Clocks, Consumed, QUEUE_TASK, Shared};
use super::config::{Broker, Consumer, QueueError};
use super::handwritten::run_read;

/// The group every batch's stream is read by, and the field names of its entries.
const GROUP: &str = "bench";
const KEY: &str = "key";
const PAYLOAD: &str = "n";

/// The Redis Streams side: the Redis's URL (each idempotask consumer joins with a connection
/// of its own, as a worker does) and the store its consumers share.
pub(super) struct StreamsBench {
    url: String,
    /// The batching wrapper the crate's docs recommend over `RedisStore`: a read batch's
    /// `begin`s reach Redis as one pipeline, and so do its `finish`es.
    store: BatchingStore<RedisStore>,
}

/// One entry as the bare and hand-written consumers read it: its id, key and payload.
struct Read {
    id: String,
    key: String,
    payload: Vec<u8>,
}

impl StreamsBench {
    pub(super) fn new(url: &str, store: &RedisStore) -> Self {
        Self {
            url: url.to_owned(),
            store: BatchingStore::new(store.clone()),
        }
    }

    /// Adds the batch's entries to a stream of their own (untimed), then times a consumer of
    /// the group over them, reading up to `in_flight` entries at a time.
    pub(super) async fn measure(
        &self,
        batch: &Batch,
        shared: &Shared,
    ) -> Result<Consumed, QueueError> {
        let mut redis = shared.redis.clone();
        for first in (0..batch.messages).step_by(256) {
            let mut pipe = redis::pipe();
            for number in first..batch.messages.min(first + 256) {
                pipe.cmd("XADD")
                    .arg(&batch.name)
                    .arg("*")
                    .arg(KEY)
                    .arg(batch.key(number))
                    .arg(PAYLOAD)
                    .arg(number.to_string())
                    .ignore();
            }
            let () = pipe.query_async(&mut redis).await?;
        }
        let cost = if batch.consumer == Consumer::Idempotask {
            self.idempotask(batch, shared).await?
        } else {
            let () = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&batch.name)
                .arg(GROUP)
                .arg("0")
                .query_async(&mut redis)
                .await?;
            let clocks = Clocks::start(shared, Broker::RedisStreams).await?;
            by_hand(batch, &mut redis).await?;
            clocks.stop().await?
        };
        let _: i64 = redis::cmd("DEL")
            .arg(&batch.name)
            .query_async(&mut redis)
            .await?;
        Ok(cost)
    }

    /// The integration's consumer over the batch: `next_batch` until every entry is acked.
    async fn idempotask(&self, batch: &Batch, shared: &Shared) -> Result<Consumed, QueueError> {
        let mut consumer = Idempotent::new(QUEUE_TASK.clone(), Field::new(KEY))
            .store(self.store.clone())
            .batch_size(batch.in_flight)
            .consume(&self.url, batch.name.as_str(), GROUP, "idempotask")
            .await?;
        let clocks = Clocks::start(shared, Broker::RedisStreams).await?;
        let bodies = &batch.bodies;
        let mut acked = 0;
        while acked < batch.messages {
            let processed = consumer
                .next_batch(|entry| {
                    let payload = entry.field(PAYLOAD).unwrap_or_default().to_vec();
                    Ok(async move { Ok::<_, std::convert::Infallible>(bodies.run(&payload)) })
                })
                .await?;
            if processed.is_empty() {
                return Err(format!("the stream ran dry after {acked} entries").into());
            }
            for one in &processed {
                if !matches!(one.handled, Handled::Acked(_)) {
                    return Err(format!("{} not acked: {:?}", one.id, one.handled).into());
                }
            }
            acked += processed.len();
        }
        clocks.stop().await
    }
}

/// The bare or the hand-written consumer over the batch: `XREADGROUP` of up to `in_flight`
/// entries, each run (the hand-written one under its lock and marker), then one `XACK` of the
/// read's entries, as a consumer of a group acks what it read.
async fn by_hand(batch: &Batch, redis: &mut ConnectionManager) -> Result<(), QueueError> {
    let bodies = &batch.bodies;
    let mut acked = 0;
    while acked < batch.messages {
        let reply: Reply = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(batch.consumer.name())
            .arg("COUNT")
            .arg(batch.in_flight)
            .arg("STREAMS")
            .arg(&batch.name)
            .arg(">")
            .query_async(redis)
            .await?;
        let entries = entries_of(reply)?;
        if entries.is_empty() {
            return Err(format!("the stream ran dry after {acked} entries").into());
        }
        let read: Vec<(&str, &[u8])> = entries
            .iter()
            .map(|entry| (entry.key.as_str(), entry.payload.as_slice()))
            .collect();
        run_read(batch.consumer, redis, bodies, &read).await?;
        let mut ack = redis::cmd("XACK");
        ack.arg(&batch.name).arg(GROUP);
        for entry in &entries {
            ack.arg(&entry.id);
        }
        let _: i64 = ack.query_async(redis).await?;
        acked += entries.len();
    }
    Ok(())
}

/// An `XREADGROUP` reply as redis-rs converts it: nil, or each stream's name and entries, an
/// entry its id and its fields and values one after the other.
type Reply = Option<Vec<(String, Vec<(String, Vec<Vec<u8>>)>)>>;

/// Input: an `XREADGROUP` reply. Output: its entries, with the bench's key and payload fields.
fn entries_of(reply: Reply) -> Result<Vec<Read>, QueueError> {
    let entries = reply.into_iter().flatten().flat_map(|(_, entries)| entries);
    entries
        .map(|(id, fields)| {
            let field = |name: &str| {
                fields
                    .chunks_exact(2)
                    .find(|pair| pair[0] == name.as_bytes())
                    .map(|pair| pair[1].clone())
                    .ok_or_else(|| format!("entry {id} has no `{name}` field"))
            };
            Ok(Read {
                key: String::from_utf8(field(KEY)?)?,
                payload: field(PAYLOAD)?,
                id,
            })
        })
        .collect()
}
