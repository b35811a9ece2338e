//! [`Record`]: one Kafka record, owned, as a body sees it; [`BadRecord`]: a record a body cannot
//! use.

use std::panic::{AssertUnwindSafe, catch_unwind};

use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Headers};

/// A header's name and value, copied out of the client.
type OwnedHeader = (String, Option<Vec<u8>>);

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
    headers: Vec<OwnedHeader>,
    /// The positions of the headers whose names are not UTF-8, which rdkafka cannot read.
    unreadable_headers: Vec<usize>,
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
            unreadable_headers: Vec::new(),
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
        let (headers, unreadable_headers) = message.headers().map(read_headers).unwrap_or_default();
        Self {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers,
            unreadable_headers,
        }
    }

    /// Why the record cannot be used as it came, before any body sees it: a header whose name
    /// is not UTF-8.
    pub(crate) fn unreadable(&self) -> Option<BadRecord> {
        let positions: Vec<String> = self
            .unreadable_headers
            .iter()
            .map(ToString::to_string)
            .collect();
        (!positions.is_empty()).then(|| {
            BadRecord::new(
                self,
                format!(
                    "the name of its header at position {} is not UTF-8",
                    positions.join(", ")
                ),
            )
        })
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

/// Input: a polled record's headers. Output: those whose names are UTF-8, in order, and the
/// positions of the others.
///
/// Every way rdkafka offers to read a header (`get`, `try_get`, `get_as`, `iter`) decodes its
/// name with `str::from_utf8(..).unwrap()`, and reading the bytes around it needs `unsafe`,
/// which this workspace forbids. A name that is not UTF-8 is a panic inside rdkafka, caught
/// here header by header; the panic hook still reports it (to stderr by default), and under
/// `panic = "abort"` it ends the process.
fn read_headers<H: Headers>(headers: &H) -> (Vec<OwnedHeader>, Vec<usize>) {
    let mut readable = Vec::with_capacity(headers.count());
    let mut unreadable = Vec::new();
    for position in 0..headers.count() {
        let header = catch_unwind(AssertUnwindSafe(|| {
            headers
                .try_get(position)
                .map(|header| (header.key.to_owned(), header.value.map(<[u8]>::to_vec)))
        }));
        match header {
            Ok(Some(header)) => readable.push(header),
            Ok(None) => {}
            Err(_) => unreadable.push(position),
        }
    }
    (readable, unreadable)
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
