//! How many times a message's body has failed, kept in a JetStream key-value bucket.
//!
//! JetStream's own count, `delivered`, includes every delivery that was deferred (a busy key, a
//! store error) and so cannot decide when a failing body has had enough tries: a message
//! deferred through a store outage would be terminated after one real failure. The count of
//! body failures is a value of its own, in the bucket, keyed by the message's identity in its
//! stream; only a failing body reads and writes it.

use std::fmt::Write as _;
use std::time::Duration;

use async_nats::jetstream::{self, Message, kv, stream};
use tokio::sync::OnceCell;

/// The bucket the failure counts are kept in, by default.
pub const DEFAULT_FAILURE_BUCKET: &str = "idempotask_failures";
/// How long a message's failure count is kept after its last failure, by default.
pub const DEFAULT_FAILURE_MEMORY: Duration = Duration::from_secs(24 * 60 * 60);

/// The failure counts of one consumer's messages, in bucket `bucket`.
pub(crate) struct FailureCounts {
    bucket: String,
    max_age: Duration,
    store: OnceCell<kv::Store>,
}

impl FailureCounts {
    pub(crate) fn new(bucket: String, max_age: Duration) -> Self {
        Self {
            bucket,
            max_age,
            store: OnceCell::new(),
        }
    }

    pub(crate) fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The body failures recorded for `message` before this delivery. A first delivery has none,
    /// and costs no round trip. A count that cannot be read counts from zero: the message is
    /// then tried more often, never terminated early.
    pub(crate) async fn recorded(&self, message: &Message) -> u32 {
        let Ok(info) = message.info() else { return 0 };
        if info.delivered <= 1 {
            return 0;
        }
        let key = entry_key(&info);
        let read = async {
            let store = self.store(&message.context).await?;
            store
                .entry(key)
                .await
                .map_err(|err| Box::new(err) as async_nats::Error)
        };
        match read.await {
            Ok(Some(entry)) => std::str::from_utf8(&entry.value)
                .ok()
                .and_then(|count| count.parse().ok())
                .unwrap_or_else(|| {
                    tracing::warn!(bucket = %self.bucket, "a failure count that is not a number; counted from zero");
                    0
                }),
            Ok(None) => 0,
            Err(err) => {
                tracing::warn!(
                    bucket = %self.bucket,
                    error = %err,
                    "could not read the message's failure count; counted from zero, so it may be tried more than max_failures times"
                );
                0
            }
        }
    }

    /// Records that `message`'s body has now failed `failures` times.
    pub(crate) async fn record(&self, message: &Message, failures: u32) {
        let Ok(info) = message.info() else { return };
        let key = entry_key(&info);
        let write = async {
            let store = self.store(&message.context).await?;
            store
                .put(key, failures.to_string().into())
                .await
                .map_err(|err| Box::new(err) as async_nats::Error)
        };
        if let Err(err) = write.await {
            tracing::warn!(
                bucket = %self.bucket,
                error = %err,
                "could not record the message's failure count; it may be tried more than max_failures times"
            );
        }
    }

    /// The bucket, opened (or created, with one value per key) on first use.
    async fn store(&self, context: &jetstream::Context) -> Result<&kv::Store, async_nats::Error> {
        self.store
            .get_or_try_init(|| async {
                if let Ok(store) = context.get_key_value(&self.bucket).await {
                    return Ok(store);
                }
                // The bucket's stream, declared as the key-value API lays it out, rather than
                // through `create_key_value`: its request carries settings of newer servers,
                // and a 2.9 server's answer to it does not parse.
                let created = context
                    .create_stream(stream::Config {
                        name: format!("KV_{}", self.bucket),
                        description: Some("idempotask: body failures per message".to_owned()),
                        subjects: vec![format!("$KV.{}.>", self.bucket)],
                        max_messages_per_subject: 1,
                        max_age: self.max_age,
                        discard: stream::DiscardPolicy::New,
                        allow_rollup: true,
                        deny_delete: true,
                        allow_direct: true,
                        ..Default::default()
                    })
                    .await;
                match context.get_key_value(&self.bucket).await {
                    Ok(store) => Ok(store),
                    // Made by another consumer meanwhile, or not at all: say why not.
                    Err(err) => Err(created.err().map_or_else(
                        || Box::new(err) as async_nats::Error,
                        |created| Box::new(created) as async_nats::Error,
                    )),
                }
            })
            .await
    }
}

/// The message's identity, which a redelivery keeps: stream, consumer and stream sequence, and
/// the time it was published, so that a stream deleted and made again (its sequences start
/// over) never meets the counts of the old one. Names are written byte for byte, anything but
/// letters, digits, `-` and `_` as `=` and two hex digits, which key-value keys allow.
fn entry_key(info: &jetstream::message::Info<'_>) -> String {
    let mut key = String::with_capacity(info.stream.len() + info.consumer.len() + 48);
    for (i, name) in [info.stream, info.consumer].into_iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        for byte in name.bytes() {
            if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
                key.push(char::from(byte));
            } else {
                let _ = write!(key, "={byte:02X}");
            }
        }
    }
    let _ = write!(
        key,
        ".{}.{}",
        info.stream_sequence,
        info.published.unix_timestamp_nanos()
    );
    key
}
