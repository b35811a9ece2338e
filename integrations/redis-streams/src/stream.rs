//! [`StreamConsumer`]: a consumer of a group, which reads batches, runs their entries and
//! settles them.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use futures_util::future::{Either, join_all, select};
use idempotask_consumer::History;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::batch::{Delivery, Held};
use crate::ops::Names;
use crate::{BadEntry, Batch, Entry, EntryKey, Idempotent, Processed, Rejection, StreamError};

/// How much longer than a read's `BLOCK` a reply may take before the connection gives up.
const REPLY_MARGIN: Duration = Duration::from_secs(5);

/// One consumer of a consumer group, made by [`Idempotent::consume`]: it reads entries in
/// batches, runs each through the task, and settles them (see the [crate docs](crate)).
///
/// It holds the entries it left pending for a later try (a failed body, a busy key, a store
/// that is down) and runs them again when they are due, in a later
/// [`next_batch`](Self::next_batch); call it in a loop. Dropped, it leaves them pending, and
/// another consumer claims them after [`claim_idle`](Idempotent::claim_idle).
///
/// ```no_run
/// use idempotask::Task;
/// use idempotask_redis_streams::{EntryId, Idempotent};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut consumer = Idempotent::new(Task::new("mail_receipt"), EntryId)
///     .consume("redis://127.0.0.1:6379", "receipts", "mailers", "mailer-1")
///     .await?;
/// for round in 0_u64.. {
///     consumer.next_batch(|_entry| Ok(async { Ok::<_, std::io::Error>(()) })).await?;
///     if round % 1000 == 0 {
///         consumer.trim().await?;
///     }
/// }
/// # Ok(()) }
/// ```
pub struct StreamConsumer<K> {
    idempotent: Idempotent<K>,
    conn: ConnectionManager,
    names: Names,
    held: Vec<Held>,
    cursor: String,
    refreshed: Instant,
    claimed: Option<Instant>,
}

impl<K: EntryKey> Idempotent<K> {
    /// Joins the consumer group `group` of `stream` as `consumer`, on the Redis at `url`
    /// (`redis://…`, `rediss://…` with the `tls` feature of redis-rs in your build): the group
    /// is created at the stream's start (and the stream too) when it does not exist.
    ///
    /// Give every process its own `consumer` name (a host name and pid, a pod name): the
    /// group's pending entries are kept by name, and a name taken over by a restarted process
    /// takes its entries back at once.
    ///
    /// ```no_run
    /// use idempotask::Task;
    /// use idempotask_redis_streams::{Field, Idempotent};
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let consumer = Idempotent::new(Task::new("order_charge"), Field::new("order_id"))
    ///     .consume("redis://127.0.0.1:6379", "orders", "chargers", "worker-1")
    ///     .await?;
    /// # let _ = consumer; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StreamError::ClaimIdleBelowLockTtl`] when [`claim_idle`](Self::claim_idle) is shorter
    /// than the task's lock TTL; [`StreamError::Redis`] when Redis cannot be reached or refuses
    /// `XGROUP CREATE` (the key holds no stream, say).
    pub async fn consume(
        self,
        url: &str,
        stream: impl Into<String>,
        group: impl Into<String>,
        consumer: impl Into<String>,
    ) -> Result<StreamConsumer<K>, StreamError> {
        let lock_ttl = self.task().settings().lock_ttl;
        if self.claim_idle < lock_ttl {
            return Err(StreamError::ClaimIdleBelowLockTtl {
                claim_idle: self.claim_idle,
                lock_ttl,
            });
        }
        let stream = stream.into();
        let group = group.into();
        let names = Names {
            dead: self
                .dead_letter_stream
                .clone()
                .unwrap_or_else(|| format!("{stream}:dead")),
            failures: format!("{stream}:{group}:failures"),
            stream,
            group,
            consumer: consumer.into(),
        };
        let client = redis::Client::open(url).map_err(|err| StreamError::redis("connect", err))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(REPLY_MARGIN))
            .set_response_timeout(Some(self.block + REPLY_MARGIN));
        let mut conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|err| StreamError::redis("connect", err))?;
        names.join(&mut conn).await?;
        Ok(StreamConsumer {
            idempotent: self,
            conn,
            names,
            held: Vec::new(),
            cursor: "0-0".to_owned(),
            refreshed: Instant::now(),
            claimed: None,
        })
    }
}

impl<K: EntryKey> StreamConsumer<K> {
    /// Reads a batch and handles every entry of it: the entries left pending here that are due
    /// again, then those claimed from consumers that stopped answering (idle for
    /// [`claim_idle`](Idempotent::claim_idle)), then new ones, up to
    /// [`batch_size`](Idempotent::batch_size) in all, waiting up to
    /// [`block`](Idempotent::block) when there is nothing. An empty batch means nothing came.
    ///
    /// For each entry, `body` is called with it before its unit begins: it decodes what it
    /// needs (a [`BadEntry`] dead-letters the entry, nothing ran) and returns the body's
    /// future, which is only polled once the lock is held (a duplicate never polls it). The
    /// batch's bodies run at the same time; then every entry is settled in one transaction.
    /// The body's `Ok` type is stored as JSON, so it must implement `Serialize` and
    /// `DeserializeOwned` (`()` does).
    ///
    /// ```no_run
    /// use idempotask::Task;
    /// use idempotask_redis_streams::{Field, Handled, Idempotent};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Order { amount: u64 }
    ///
    /// async fn charge(amount: u64) -> Result<String, std::io::Error> {
    ///     Ok(format!("ch_{amount}"))
    /// }
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut consumer = Idempotent::new(Task::new("order_charge"), Field::new("order_id"))
    ///     .consume("redis://127.0.0.1:6379", "orders", "chargers", "worker-1")
    ///     .await?;
    /// loop {
    ///     let batch = consumer
    ///         .next_batch(|entry| {
    ///             let order: Order = entry.json("order")?;
    ///             Ok(charge(order.amount))
    ///         })
    ///         .await?;
    ///     for processed in batch {
    ///         if let Handled::DeadLettered(why) = &processed.handled {
    ///             eprintln!("{} dead-lettered: {why}", processed.id);
    ///         }
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`StreamError::Redis`] when a read, a claim or the settling failed. Entries read but
    /// not settled stay pending and are claimed again after `claim_idle`, and a stored result
    /// is then replayed.
    pub async fn next_batch<T, E, F, Fut>(
        &mut self,
        body: F,
    ) -> Result<Vec<Processed<T, E>>, StreamError>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnMut(&Entry) -> Result<Fut, BadEntry>,
        Fut: Future<Output = Result<T, E>>,
    {
        let batch = self.run_batch(body).await?;
        self.settle(batch).await
    }

    /// Reads a batch and runs it as [`next_batch`](Self::next_batch) does, and answers what
    /// became of each entry without telling the group yet: for a consumer that records or
    /// reports something between the run and the ack. Until [`settle`](Self::settle), every
    /// entry stays pending (a crash there leaves them to be claimed, and a stored result is
    /// replayed).
    ///
    /// ```no_run
    /// use idempotask::Task;
    /// use idempotask_redis_streams::{Field, Handled, Idempotent};
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut consumer = Idempotent::new(Task::new("order_charge"), Field::new("order_id"))
    ///     .consume("redis://127.0.0.1:6379", "orders", "chargers", "worker-1")
    ///     .await?;
    /// let batch = consumer
    ///     .run_batch(|entry| {
    ///         let amount: u64 = entry.json("amount")?;
    ///         Ok(async move { Ok::<_, std::io::Error>(format!("ch_{amount}")) })
    ///     })
    ///     .await?;
    /// let charged = batch.processed().iter().filter(|p| matches!(p.handled, Handled::Acked(_))).count();
    /// println!("{charged} charged; acking them now");
    /// consumer.settle(batch).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StreamError::Redis`] when a read or a claim failed.
    pub async fn run_batch<T, E, F, Fut>(&mut self, mut body: F) -> Result<Batch<T, E>, StreamError>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnMut(&Entry) -> Result<Fut, BadEntry>,
        Fut: Future<Output = Result<T, E>>,
    {
        let deliveries = self.gather().await?;
        if deliveries.is_empty() {
            return Ok(Batch::decide(Vec::new()));
        }
        // Refreshed while the batch runs: the entries running, and those waiting here.
        let ids: Vec<String> = deliveries
            .iter()
            .map(|delivery| &delivery.entry)
            .chain(self.held.iter().map(|held| &held.entry))
            .map(|entry| entry.id().to_owned())
            .collect();
        let settings = &self.idempotent.settings;
        let max_deliveries = self.idempotent.max_deliveries;
        let runs = deliveries.into_iter().map(|delivery| {
            let plan = if delivery.deliveries > max_deliveries {
                Err(Rejection::TooManyDeliveries {
                    deliveries: delivery.deliveries,
                })
            } else {
                match self.idempotent.key.key(&delivery.entry) {
                    Err(missing) => Err(Rejection::MissingKey(missing)),
                    Ok(key) => match body(&delivery.entry) {
                        Err(bad) => Err(Rejection::BadEntry(bad)),
                        Ok(future) => Ok((key, future)),
                    },
                }
            };
            let history = EntryHistory {
                conn: self.conn.clone(),
                names: &self.names,
                id: delivery.entry.id().to_owned(),
                deliveries: delivery.deliveries,
                deferrals: delivery.deferrals,
            };
            async move {
                let verdict = match plan {
                    Err(rejection) => Err(rejection),
                    Ok((key, future)) => {
                        let payload = delivery.entry.payload();
                        Ok(settings.run(key, &payload, &history, future).await)
                    }
                };
                (delivery, verdict)
            }
        });
        let ran = join_all(runs);
        let ran = {
            let heartbeat = heartbeat(
                self.conn.clone(),
                &self.names,
                self.idempotent.claim_idle / 3,
                ids,
            );
            match select(pin!(ran), pin!(heartbeat)).await {
                Either::Left((ran, _)) => ran,
                Either::Right(((), _)) => unreachable!("the heartbeat never ends"),
            }
        };
        Ok(Batch::decide(ran))
    }

    /// Tells the group what became of `batch`'s entries, in one transaction (the acks, the
    /// dead letters with their copies, the failure counts), keeps the entries to try again
    /// later, and answers what became of each.
    ///
    /// See [`run_batch`](Self::run_batch) for an example.
    ///
    /// # Errors
    /// [`StreamError::Redis`] when the transaction failed: nothing of it was written, and the
    /// entries stay pending until they are claimed again (a stored result is then replayed).
    pub async fn settle<T, E>(
        &mut self,
        batch: Batch<T, E>,
    ) -> Result<Vec<Processed<T, E>>, StreamError> {
        self.names.settle(&mut self.conn, &batch.settlement).await?;
        self.held.extend(batch.held);
        Ok(batch.processed)
    }

    /// Trims the stream of every entry all its groups have acknowledged (`XTRIM MINID`, up to
    /// the oldest entry some group has pending or has yet to read, in one script), and
    /// answers how many entries went. Call it now and then (every so many batches, or from a
    /// timer); a stream is never trimmed by the consumer on its own, and an entry that some
    /// group still has pending is never trimmed. The dead-letter stream is left as it is.
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{EntryId, Idempotent};
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut consumer = Idempotent::new(Task::new("t"), EntryId).consume("redis://127.0.0.1:6379", "orders", "g", "c").await?;
    /// let removed = consumer.trim().await?;
    /// println!("trimmed {removed} acknowledged entries");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StreamError::Redis`] when the script fails.
    pub async fn trim(&mut self) -> Result<u64, StreamError> {
        self.names.trim(&mut self.conn).await
    }

    /// How many entries this consumer holds pending for a later try.
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{EntryId, Idempotent};
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let consumer = Idempotent::new(Task::new("t"), EntryId).consume("redis://127.0.0.1:6379", "orders", "g", "c").await?;
    /// assert_eq!(consumer.waiting(), 0);
    /// # Ok(()) }
    /// ```
    pub fn waiting(&self) -> usize {
        self.held.len()
    }

    /// The settings the consumer runs with.
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{EntryId, Idempotent};
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let consumer = Idempotent::new(Task::new("refund"), EntryId).consume("redis://127.0.0.1:6379", "orders", "g", "c").await?;
    /// assert_eq!(consumer.idempotent().task().name(), "refund");
    /// # Ok(()) }
    /// ```
    pub fn idempotent(&self) -> &Idempotent<K> {
        &self.idempotent
    }

    /// The entries of the next batch: the held ones that are due, claimed ones, new ones.
    async fn gather(&mut self) -> Result<Vec<Delivery>, StreamError> {
        let room = self.idempotent.batch_size;
        let claim_idle = self.idempotent.claim_idle;
        let now = Instant::now();
        let mut batch = Vec::new();
        if !self.held.is_empty() {
            let refresh_all = self.refreshed.elapsed() >= claim_idle / 3;
            let asked: Vec<String> = self
                .held
                .iter()
                .filter(|held| refresh_all || held.due <= now)
                .map(|held| held.entry.id().to_owned())
                .collect();
            let ids: Vec<&str> = asked.iter().map(String::as_str).collect();
            let still: Vec<String> = self.names.refresh(&mut self.conn, &ids).await?;
            if refresh_all {
                self.refreshed = now;
            }
            // An entry asked for and not answered is no longer pending for the group (acked or
            // deleted elsewhere): it is dropped.
            let gone = |held: &Held| {
                asked.iter().any(|id| id == held.entry.id())
                    && !still.iter().any(|id| id == held.entry.id())
            };
            let kept: Vec<Held> = std::mem::take(&mut self.held)
                .into_iter()
                .filter(|held| !gone(held))
                .collect();
            for held in kept {
                if held.due <= now && batch.len() < room {
                    batch.push(Delivery {
                        entry: held.entry,
                        deliveries: held.deliveries,
                        deferrals: held.deferrals,
                    });
                } else {
                    self.held.push(held);
                }
            }
        }
        let claim_due = self
            .claimed
            .is_none_or(|at| at.elapsed() >= (claim_idle / 4).min(self.idempotent.block));
        if batch.len() < room && claim_due {
            self.claim(room - batch.len(), &mut batch).await?;
        }
        if batch.len() < room {
            let block = batch.is_empty().then(|| {
                let mut wait = self.idempotent.block.min(claim_idle / 3);
                if let Some(due) = self.held.iter().map(|held| held.due).min() {
                    wait = wait.min(due.saturating_duration_since(Instant::now()));
                }
                u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1)
            });
            let read = self
                .names
                .read(&mut self.conn, room - batch.len(), block)
                .await?;
            batch.extend(read.into_iter().map(|entry| Delivery {
                entry,
                deliveries: 1,
                deferrals: 0,
            }));
        }
        Ok(batch)
    }

    /// Claims up to `room` entries idle for `claim_idle` into `batch`, with their delivery
    /// counts.
    async fn claim(&mut self, room: usize, batch: &mut Vec<Delivery>) -> Result<(), StreamError> {
        let idle = u64::try_from(self.idempotent.claim_idle.as_millis()).unwrap_or(u64::MAX);
        let (claimed, next) = self
            .names
            .autoclaim(&mut self.conn, idle, &self.cursor, room)
            .await?;
        self.cursor = next;
        // A scan that came back round starts over at once; otherwise after a pause.
        self.claimed = (self.cursor == "0-0" || claimed.is_empty()).then(Instant::now);
        if claimed.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = claimed.iter().map(Entry::id).collect();
        let counts = self.names.deliveries(&mut self.conn, &ids).await?;
        for (entry, deliveries) in claimed.into_iter().zip(counts) {
            // One of this consumer's own, overdue: it comes back as claimed.
            let deferrals = self
                .held
                .iter()
                .position(|held| held.entry.id() == entry.id())
                .map_or(0, |at| self.held.swap_remove(at).deferrals);
            batch.push(Delivery {
                entry,
                deliveries,
                deferrals,
            });
        }
        Ok(())
    }
}

/// What the group knows of an entry's earlier deliveries: its failure count in Redis, and
/// its deferrals in this process.
struct EntryHistory<'a> {
    conn: ConnectionManager,
    names: &'a Names,
    id: String,
    deliveries: u32,
    deferrals: u32,
}

impl History for EntryHistory<'_> {
    async fn failures(&self) -> u32 {
        match self.names.failures(&mut self.conn.clone(), &self.id).await {
            Ok(count) => count,
            // Never below the recorded count: a poison entry ends early rather than looping.
            Err(err) => {
                tracing::warn!(error = %err, entry = self.id, "could not read the entry's failure count; counting its deliveries instead");
                self.deliveries.saturating_sub(1)
            }
        }
    }

    async fn deferrals(&self) -> u32 {
        self.deferrals
    }
}

/// Every `every`, takes `ids` (the entries running and waiting) back for this consumer, so that none of them
/// looks idle to the group's other consumers while a batch runs; never ends.
async fn heartbeat(conn: ConnectionManager, names: &Names, every: Duration, ids: Vec<String>) {
    let every = every.max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        if let Err(err) = names.refresh(&mut conn.clone(), &ids).await {
            tracing::warn!(error = %err, "could not refresh the pending entries");
        }
    }
}
