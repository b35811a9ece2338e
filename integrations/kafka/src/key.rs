//! Where a record's idempotency key comes from: a header, the record's key, or its place.

use crate::Record;

/// Where the idempotency key of a record comes from.
///
/// The key must name one business operation: two records that must not both take effect get
/// the same key. A producer that retries a send after a lost acknowledgement writes the record
/// twice, at two offsets: only a key the producer chose ([`Header`](Self::Header) or
/// [`RecordKey`](Self::RecordKey)) makes the two one unit.
///
/// ```
/// use idempotask_kafka::{KeyFrom, Record};
///
/// let record = Record::new("orders", 3, 17).with_key("order-7").with_header("order_id", "7");
/// assert_eq!(KeyFrom::header("order_id").key(&record).unwrap(), "7");
/// assert_eq!(KeyFrom::RecordKey.key(&record).unwrap(), "order-7");
/// assert_eq!(KeyFrom::Position.key(&record).unwrap(), "orders/3@17");
/// assert!(KeyFrom::header("refund_id").key(&record).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyFrom {
    /// The value of a header the producer wrote, as UTF-8 text.
    Header(String),
    /// The record's key, as UTF-8 text (the key that also chose its partition).
    RecordKey,
    /// `topic/partition@offset`: every delivery of one record is one unit, but two sends of one
    /// job are two.
    Position,
}

impl KeyFrom {
    /// The key is the value of the header `name`.
    pub fn header(name: impl Into<String>) -> Self {
        Self::Header(name.into())
    }

    /// The key of `record`.
    ///
    /// # Errors
    /// [`MissingKey`] when the record carries none (no such header or record key, an empty
    /// one, or one that is not UTF-8): it then goes to the dead-letter topic, never run
    /// unprotected.
    pub fn key(&self, record: &Record) -> Result<String, MissingKey> {
        let (value, what) = match self {
            Self::Position => {
                return Ok(format!(
                    "{}/{}@{}",
                    record.topic(),
                    record.partition(),
                    record.offset()
                ));
            }
            Self::Header(name) => (record.header(name), format!("`{name}` header")),
            Self::RecordKey => (record.key(), "record key".to_owned()),
        };
        match value {
            None => Err(MissingKey::new(record, format!("it has no {what}"))),
            Some([]) => Err(MissingKey::new(record, format!("its {what} is empty"))),
            Some(bytes) => std::str::from_utf8(bytes)
                .map(str::to_owned)
                .map_err(|_| MissingKey::new(record, format!("its {what} is not UTF-8"))),
        }
    }
}

/// A record that carries no idempotency key where one was expected. Nothing ran, and the
/// record goes to the dead-letter topic: no redelivery can bring a key.
///
/// ```
/// use idempotask_kafka::{KeyFrom, Record};
/// let err = KeyFrom::header("order_id").key(&Record::new("orders", 0, 4)).unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "record orders/0@4 has no idempotency key (it has no `order_id` header); add it to the record, or key the task by what the record carries"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "record {topic}/{partition}@{offset} has no idempotency key ({why}); add it to the record, or key the task by what the record carries"
)]
pub struct MissingKey {
    topic: String,
    partition: i32,
    offset: i64,
    why: String,
}

impl MissingKey {
    fn new(record: &Record, why: String) -> Self {
        Self {
            topic: record.topic().to_owned(),
            partition: record.partition(),
            offset: record.offset(),
            why,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_or_key_that_cannot_be_a_key_says_why() {
        let record = Record::new("t", 0, 1)
            .with_header("empty", "")
            .with_header("binary", vec![0xff, 0xfe])
            .with_key(vec![0xff]);
        let why = |from: KeyFrom| from.key(&record).unwrap_err().to_string();
        assert!(why(KeyFrom::header("empty")).contains("its `empty` header is empty"));
        assert!(why(KeyFrom::header("binary")).contains("its `binary` header is not UTF-8"));
        assert!(why(KeyFrom::RecordKey).contains("its record key is not UTF-8"));
        assert!(why(KeyFrom::RecordKey).starts_with("record t/0@1 has no idempotency key"));
        let keyless = Record::new("t", 0, 2);
        assert!(
            KeyFrom::RecordKey
                .key(&keyless)
                .unwrap_err()
                .to_string()
                .contains("it has no record key")
        );
    }

    #[test]
    fn the_last_of_repeated_headers_is_the_key() {
        let record = Record::new("t", 0, 1)
            .with_header("id", "first")
            .with_header("id", "second");
        assert_eq!(KeyFrom::header("id").key(&record).unwrap(), "second");
    }
}
