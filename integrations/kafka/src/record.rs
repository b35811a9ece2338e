//! [`Record`]: one Kafka record, owned, as a body sees it; [`BadRecord`]: a record a body cannot
//! use.

use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Headers};

/// One record of a topic, copied out of the client: its place (topic, partition, offset), its
/// key, payload and headers.
///
/// ```
/// use idempotask_kafka::Record;
///
/// let record = Record::new("orders", 2, 41)
///     .with_key("order-7")
///     .with_header("order_id", "7")
///     .with_payload(r#"{"amount":500}"#);
/// assert_eq!((record.topic(), record.partition(), record.offset()), ("orders", 2, 41));
/// assert_eq!(record.header("order_id"), Some(&b"7"[..]));
/// #[derive(serde::Deserialize)]
/// struct Order { amount: u64 }
/// assert_eq!(record.json::<Order>().unwrap().amount, 500);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    /// A record at `offset` of `partition` of `topic`, with no key, no payload and no headers
    /// (for tests and examples; the consumer copies its records from the client).
    pub fn new(topic: impl Into<String>, partition: i32, offset: i64) -> Self {
        Self {
            topic: topic.into(),
            partition,
            offset,
            key: None,
            payload: None,
            headers: Vec::new(),
        }
    }

    /// The record with `key` as its key.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The record with `payload` as its payload.
    #[must_use]
    pub fn with_payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = Some(payload.into());
        self
    }

    /// The record with one more header.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), Some(value.into())));
        self
    }

    pub(crate) fn from_message(message: &BorrowedMessage<'_>) -> Self {
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|header| (header.key.to_owned(), header.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The topic the record was read from.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Its partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// Its offset in the partition.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// Its key, if the producer gave one.
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// Its payload; empty for a record without one (a tombstone).
    ///
    /// ```
    /// # use idempotask_kafka::Record;
    /// assert!(Record::new("orders", 0, 0).payload().is_empty());
    /// ```
    pub fn payload(&self) -> &[u8] {
        self.payload.as_deref().unwrap_or_default()
    }

    /// The value of the last header named `name` (a header may repeat); `None` when there is
    /// none or its value is null.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .rev()
            .find(|(header, _)| header == name)
            .and_then(|(_, value)| value.as_deref())
    }

    /// Every header, in the order the producer wrote them.
    ///
    /// ```
    /// # use idempotask_kafka::Record;
    /// let record = Record::new("orders", 0, 0).with_header("a", "1").with_header("b", "2");
    /// let names: Vec<&str> = record.headers().map(|(name, _)| name).collect();
    /// assert_eq!(names, ["a", "b"]);
    /// ```
    pub fn headers(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_deref()))
    }

    /// The payload decoded from JSON.
    ///
    /// ```
    /// # use idempotask_kafka::Record;
    /// let err = Record::new("orders", 0, 5).with_payload("{").json::<u64>().unwrap_err();
    /// assert!(err.to_string().starts_with("record orders/0@5 cannot be used: its payload is not the JSON expected"));
    /// ```
    ///
    /// # Errors
    /// [`BadRecord`] when it is not JSON of `T`'s shape: the record then goes to the
    /// dead-letter topic without running.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, BadRecord> {
        serde_json::from_slice(self.payload()).map_err(|err| {
            BadRecord::new(
                self,
                format!("its payload is not the JSON expected ({err})"),
            )
        })
    }
}

/// A record the body's closure refused before running anything (a payload that does not
/// decode, a header missing): it goes to the dead-letter topic with this error, and its
/// partition moves on. No delivery of the same bytes could do better.
///
/// ```
/// use idempotask_kafka::{BadRecord, Record};
/// let err = BadRecord::new(&Record::new("orders", 1, 9), "no `currency` header");
/// assert_eq!(err.to_string(), "record orders/1@9 cannot be used: no `currency` header");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {topic}/{partition}@{offset} cannot be used: {why}")]
pub struct BadRecord {
    topic: String,
    partition: i32,
    offset: i64,
    why: String,
}

impl BadRecord {
    /// `record` cannot be used, for the reason `why`.
    pub fn new(record: &Record, why: impl Into<String>) -> Self {
        Self {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
            why: why.into(),
        }
    }
}
