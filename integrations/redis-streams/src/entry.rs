//! One stream entry as the consumer hands it to a body: its id and its fields, in their order.

use redis::Value;
use serde::de::DeserializeOwned;

/// One entry of the stream: its id and its fields, as `XADD` wrote them (in their order, a
/// field's value as the bytes it was given).
///
/// ```
/// use idempotask_redis_streams::Entry;
///
/// let entry = Entry::new("1700000000000-0", [("order_id", "7"), ("order", r#"{"amount":5}"#)]);
/// assert_eq!(entry.id(), "1700000000000-0");
/// assert_eq!(entry.field_str("order_id"), Some("7"));
///
/// #[derive(serde::Deserialize)]
/// struct Order { amount: u32 }
/// let order: Order = entry.json("order").unwrap();
/// assert_eq!(order.amount, 5);
/// assert!(entry.json::<Order>("refund").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    id: String,
    fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    /// An entry with `id` and `fields` (for tests, and for bodies called outside a consumer).
    pub fn new<F, V>(id: impl Into<String>, fields: impl IntoIterator<Item = (F, V)>) -> Self
    where
        F: Into<String>,
        V: Into<Vec<u8>>,
    {
        Self {
            id: id.into(),
            fields: fields
                .into_iter()
                .map(|(field, value)| (field.into(), value.into()))
                .collect(),
        }
    }

    /// The entry's id in its stream (`<milliseconds>-<sequence>`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The value of `field`, the first one of that name; `None` when the entry has none.
    pub fn field(&self, field: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(name, _)| name == field)
            .map(|(_, value)| value.as_slice())
    }

    /// The value of `field` as text; `None` when the entry has none or it is not UTF-8.
    pub fn field_str(&self, field: &str) -> Option<&str> {
        self.field(field)
            .and_then(|value| std::str::from_utf8(value).ok())
    }

    /// Every field and its value, in the order `XADD` wrote them.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.fields
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_slice()))
    }

    /// The value of `field` decoded from JSON: what a body's closure calls before it returns
    /// the body, so that an entry that does not decode is dead-lettered with a [`BadEntry`]
    /// instead of being run and retried.
    ///
    /// # Errors
    /// [`BadEntry`] when the entry has no `field`, or its value is not JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self, field: &str) -> Result<T, BadEntry> {
        let value = self
            .field(field)
            .ok_or_else(|| BadEntry::new(self, format!("it has no `{field}` field")))?;
        serde_json::from_slice(value).map_err(|err| {
            BadEntry::new(
                self,
                format!("its `{field}` field is not the expected JSON: {err}"),
            )
        })
    }

    /// The bytes the payload check ([`fingerprint_payload`](crate::Idempotent::fingerprint_payload))
    /// hashes: every field and value, each prefixed with its length, in their order.
    pub(crate) fn payload(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for (name, value) in &self.fields {
            for part in [name.as_bytes(), value.as_slice()] {
                bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
                bytes.extend_from_slice(part);
            }
        }
        bytes
    }

    /// Input: one entry of an `XREADGROUP`, `XCLAIM` or `XAUTOCLAIM` reply (`[id, [field,
    /// value, ...]]`). Output: the entry, or `None` for an entry deleted from the stream while
    /// it was pending (its fields are nil) or a reply of another shape.
    pub(crate) fn from_value(value: Value) -> Option<Self> {
        let Value::Array(mut parts) = value else {
            return None;
        };
        if parts.len() != 2 {
            return None;
        }
        let fields = parts.pop()?;
        let id = text(parts.pop()?)?;
        let pairs = match fields {
            Value::Array(values) => {
                let mut pairs = Vec::with_capacity(values.len() / 2);
                let mut values = values.into_iter();
                while let (Some(name), Some(value)) = (values.next(), values.next()) {
                    pairs.push((text(name)?, bytes(value)?));
                }
                pairs
            }
            Value::Map(map) => map
                .into_iter()
                .map(|(name, value)| Some((text(name)?, bytes(value)?)))
                .collect::<Option<_>>()?,
            _ => return None,
        };
        Some(Self { id, fields: pairs })
    }
}

/// Input: a reply's bulk or simple string. Output: its text.
pub(crate) fn text(value: Value) -> Option<String> {
    String::from_utf8(bytes(value)?).ok()
}

fn bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

/// An entry the body cannot take: a field it needs is missing, or does not decode. Nothing
/// ran; the entry is dead-lettered at once (a redelivery would bring the same fields), with
/// this error's text as its reason.
///
/// ```
/// use idempotask_redis_streams::{BadEntry, Entry};
///
/// let entry = Entry::new("5-0", [("order", "not json")]);
/// let err: BadEntry = entry.json::<u32>("order").unwrap_err();
/// assert_eq!(err.entry_id(), "5-0");
/// assert!(err.to_string().starts_with("entry 5-0 cannot be handled: its `order` field is not the expected JSON"));
/// // A check of the body's own:
/// let err = BadEntry::new(&entry, "the amount is negative");
/// assert_eq!(err.to_string(), "entry 5-0 cannot be handled: the amount is negative");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {entry_id} cannot be handled: {why}")]
pub struct BadEntry {
    entry_id: String,
    why: String,
}

impl BadEntry {
    /// `entry` cannot be handled, for the reason `why`.
    pub fn new(entry: &Entry, why: impl Into<String>) -> Self {
        Self {
            entry_id: entry.id.clone(),
            why: why.into(),
        }
    }

    /// The id of the entry.
    pub fn entry_id(&self) -> &str {
        &self.entry_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_reply_entry_keeps_its_fields_in_order_and_a_deleted_one_is_none() {
        let reply = Value::Array(vec![
            bulk("1-2"),
            Value::Array(vec![bulk("b"), bulk("x"), bulk("a"), bulk("y")]),
        ]);
        let entry = Entry::from_value(reply).unwrap();
        assert_eq!(entry, Entry::new("1-2", [("b", "x"), ("a", "y")]));
        let deleted = Value::Array(vec![bulk("1-3"), Value::Nil]);
        assert_eq!(Entry::from_value(deleted), None);
    }

    #[test]
    fn the_payload_tells_fields_apart_from_their_split() {
        let one = Entry::new("1-0", [("ab", "c")]).payload();
        let other = Entry::new("1-0", [("a", "bc")]).payload();
        assert_ne!(one, other);
    }
}
