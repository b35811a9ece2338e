//! The Kafka side of the queue bench, on the Kafka-protocol broker it is given (tansu in the
//! bench script): each batch a topic of one partition, consumed by manual assignment with its
//! offsets committed to a group of its own.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idempotask_kafka::{Handled, Idempotent, KeyFrom};
use idempotask_redis::RedisStore;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::batch::{Batch, Clocks, Consumed, QUEUE_TASK, Shared};
use super::config::{Broker, Consumer, QueueError};
use super::handwritten::{Handwritten, handwritten};

/// The header that carries each record's key.
const KEY_HEADER: &str = "key";
/// How long a send may wait for the broker.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The Kafka side: the broker's settings, a producer and an admin client for the run.
pub(super) struct KafkaBench {
    config: ClientConfig,
    producer: FutureProducer,
    admin: AdminClient<DefaultClientContext>,
    store: RedisStore,
}

/// One record, copied out of its message: a message must not outlive its consumer.
struct Owned {
    offset: i64,
    key: String,
    payload: Vec<u8>,
}

impl KafkaBench {
    pub(super) fn new(bootstrap_servers: &str, store: &RedisStore) -> Result<Self, QueueError> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers);
        Ok(Self {
            producer: config.create()?,
            admin: config.create()?,
            config,
            store: store.clone(),
        })
    }

    /// Publishes the batch's records to a topic of their own (untimed), then times a consumer
    /// of their own over them.
    pub(super) async fn measure(
        &self,
        batch: &Batch,
        shared: &Shared,
    ) -> Result<Consumed, QueueError> {
        let topic = batch.name.as_str();
        let dead = format!("{topic}.dead");
        let topics = [
            NewTopic::new(topic, 1, TopicReplication::Fixed(1)),
            NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
        ];
        for created in self
            .admin
            .create_topics(&topics, &AdminOptions::new())
            .await?
        {
            created.map_err(|(topic, code)| format!("create {topic}: {code}"))?;
        }
        self.publish(batch).await?;
        let mut config = self.config.clone();
        config.set("group.id", topic);
        let cost = if batch.consumer == Consumer::Idempotask {
            self.idempotask(batch, shared, &config).await?
        } else {
            by_hand(batch, shared, &config).await?
        };
        Ok(cost)
    }

    /// Sends the batch's records, 256 at a time, each with its key in a header.
    async fn publish(&self, batch: &Batch) -> Result<(), QueueError> {
        let numbers: Vec<usize> = (0..batch.messages).collect();
        for chunk in numbers.chunks(256) {
            let sends = chunk.iter().map(|&number| async move {
                let key = batch.key(number);
                let payload = number.to_string();
                let headers = OwnedHeaders::new().insert(Header {
                    key: KEY_HEADER,
                    value: Some(&key),
                });
                let record = FutureRecord::<(), _>::to(&batch.name)
                    .partition(0)
                    .payload(&payload)
                    .headers(headers);
                self.producer
                    .send(record, SEND_TIMEOUT)
                    .await
                    .map(|_| ())
                    .map_err(|(err, _)| err)
            });
            for sent in futures_util::future::join_all(sends).await {
                sent?;
            }
        }
        Ok(())
    }

    /// `idempotask_kafka`'s consumer, `max_in_flight` records of the partition at a time, each
    /// ended record's offset committed as the crate does.
    async fn idempotask(
        &self,
        batch: &Batch,
        shared: &Shared,
        config: &ClientConfig,
    ) -> Result<Consumed, QueueError> {
        let bodies = Arc::clone(&batch.bodies);
        let mut consumer = Idempotent::new(QUEUE_TASK.clone(), KeyFrom::header(KEY_HEADER))
            .store(self.store.clone())
            .max_in_flight(batch.in_flight)
            .assign(config, &batch.name, &[0], move |record| {
                let (bodies, payload) = (Arc::clone(&bodies), record.payload().to_vec());
                Ok(async move { Ok::<_, std::convert::Infallible>(bodies.run(&payload)) })
            })
            .await?;
        let clocks = Clocks::start(shared, Broker::Kafka).await?;
        let mut ended = 0;
        while ended < batch.messages {
            let processed = consumer.next().await?;
            match processed.handled {
                Handled::Done(_) => ended += 1,
                Handled::Failed { .. } | Handled::Deferred { .. } => {}
                handled @ Handled::DeadLettered(_) => {
                    return Err(format!("not done: {handled:?}").into());
                }
            }
        }
        let cost = clocks.stop().await?;
        consumer.close().await?;
        Ok(cost)
    }
}

/// The bare or the hand-written consumer: the partition's records, `in_flight` at a time (the
/// hand-written pattern's round trips overlap), each one's offset committed (asynchronously,
/// as the crate commits) once it and every record before it are done.
async fn by_hand(
    batch: &Batch,
    shared: &Shared,
    config: &ClientConfig,
) -> Result<Consumed, QueueError> {
    let consumer: StreamConsumer = config
        .clone()
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(&batch.name, 0, Offset::Stored)?;
    consumer.assign(&assignment)?;
    let clocks = Clocks::start(shared, Broker::Kafka).await?;
    let bodies = &batch.bodies;
    let records = consumer.stream().take(batch.messages).map(|message| {
        let message = message?;
        let key = message
            .headers()
            .and_then(|headers| headers.iter().find(|header| header.key == KEY_HEADER))
            .and_then(|header| header.value)
            .ok_or("a record without its key")?;
        Ok::<_, QueueError>(Owned {
            offset: message.offset(),
            key: String::from_utf8(key.to_vec())?,
            payload: message.payload().unwrap_or_default().to_vec(),
        })
    });
    let done = records
        .map(|record| {
            let mut redis = shared.redis.clone();
            async move {
                let record = record?;
                if batch.consumer == Consumer::Handwritten {
                    let done = handwritten(&mut redis, &record.key, || bodies.run(&record.payload))
                        .await?;
                    if done == Handwritten::Busy {
                        return Err(format!("{} was busy", record.key).into());
                    }
                } else {
                    bodies.run(&record.payload);
                }
                Ok::<_, QueueError>(record.offset)
            }
        })
        .buffered(batch.in_flight);
    let mut done = std::pin::pin!(done);
    while let Some(offset) = done.next().await {
        let mut next = TopicPartitionList::new();
        next.add_partition_offset(&batch.name, 0, Offset::Offset(offset? + 1))?;
        consumer.commit(&next, CommitMode::Async)?;
    }
    clocks.stop().await
}
