//! How many times a message's body has failed, kept in a JetStream key-value bucket.
//!
//! JetStream's own count, `delivered`, includes every delivery that was deferred (a busy key, a
//! store error) and so cannot decide when a failing body has had enough tries: a message
//! deferred through a store outage would be terminated after one real failure. The count of
//! body failures is a value of its own, in the bucket, keyed by the message's identity in its
//! stream; only a failing body reads and writes it.
//!
//! When the bucket cannot be used, the count falls back to `delivered`, which is never below
//! it: for a delivery whose count cannot be read (the bucket cannot be opened or created, a
//! read is refused), and for the next deliveries of a message whose count could not be written,
//! whose count in the bucket is then behind. A message may be terminated before `max_failures`
//! failures of its body, but a poison message never loops for ever.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream::{self, Message, kv, stream};
use idempotask_consumer::History;
use tokio::sync::OnceCell;

/// The bucket the failure counts are kept in, by default.
pub const DEFAULT_FAILURE_BUCKET: &str = "idempotask_failures";
/// How long a message's failure count is kept after its last failure, by default.
pub const DEFAULT_FAILURE_MEMORY: Duration = Duration::from_secs(24 * 60 * 60);

/// The keys the consumer check writes to find out whether the bucket takes writes, each
/// followed by `.` and the time of its check: a new key each time, since a bucket that refuses
/// new keys may still take a key written again. A message's key always has three dots (see
/// [`entry_key`]), so it never meets one of these.
pub(crate) const PROBE_PREFIX: &str = "idempotask_check";

/// How many messages whose count could not be written are remembered at most; past that, the
/// oldest is forgotten, which costs it at most one more try.
const MAX_BEHIND: usize = 65_536;

/// The failure counts of one consumer's messages, in bucket `bucket`.
pub(crate) struct FailureCounts {
    bucket: String,
    max_age: Duration,
    store: OnceCell<kv::Store>,
    /// The messages whose count in the bucket is behind, since a write of it failed, and when
    /// it failed: their deliveries count as failures until a write of theirs succeeds.
    behind: Mutex<HashMap<String, Instant>>,
    /// Whether the fallback to `delivered` has been logged at `WARN` (once; `DEBUG` after).
    warned: AtomicBool,
}

impl FailureCounts {
    pub(crate) fn new(bucket: String, max_age: Duration) -> Self {
        Self {
            bucket,
            max_age,
            store: OnceCell::new(),
            behind: Mutex::new(HashMap::new()),
            warned: AtomicBool::new(false),
        }
    }

    pub(crate) fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The body failures recorded for `message` before this delivery. A first delivery has
    /// none, and costs no round trip. A count that cannot be read, or that is behind because a
    /// write of it failed, is taken as the deliveries before this one: never fewer than the
    /// failures, so the message is terminated early rather than tried for ever.
    pub(crate) async fn recorded(&self, message: &Message) -> u32 {
        let Ok(info) = message.info() else { return 0 };
        if info.delivered <= 1 {
            return 0;
        }
        let upper_bound = u32::try_from(info.delivered - 1).unwrap_or(u32::MAX);
        let key = entry_key(&info);
        if self.behind().contains_key(&key) {
            return upper_bound;
        }
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
                    self.fall_back(&"a failure count that is not a number");
                    upper_bound
                }),
            Ok(None) => 0,
            Err(err) => {
                self.fall_back(&err);
                upper_bound
            }
        }
    }

    /// Records that `message`'s body has now failed `failures` times. A write that fails leaves
    /// the message's count behind, and its next deliveries count by `delivered`.
    pub(crate) async fn record(&self, message: &Message, failures: u32) {
        let Ok(info) = message.info() else { return };
        let key = entry_key(&info);
        match self
            .put(&message.context, key.clone(), failures.to_string())
            .await
        {
            Ok(()) => {
                self.behind().remove(&key);
            }
            Err(err) => {
                self.fall_back(&err);
                self.remember_behind(key);
            }
        }
    }

    /// Forgets `message`, which gets no more deliveries.
    pub(crate) fn forget(&self, message: &Message) {
        if let Ok(info) = message.info() {
            self.behind().remove(&entry_key(&info));
        }
    }

    /// Whether the bucket can be opened (or created) and written, as a failing body needs it:
    /// writes a new probe key.
    ///
    /// # Errors
    /// Why the bucket cannot be used.
    pub(crate) async fn probe(
        &self,
        context: &jetstream::Context,
    ) -> Result<(), async_nats::Error> {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let key = format!("{PROBE_PREFIX}.{}", now.as_nanos());
        // Not empty, as a count is not: a server may take an empty value where it refuses
        // others (2.9 does, in a stream at its byte limit).
        self.put(context, key, "0".to_owned()).await
    }

    fn behind(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.behind.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remember_behind(&self, key: String) {
        let mut behind = self.behind();
        if behind.len() >= MAX_BEHIND && !behind.contains_key(&key) {
            // Counts older than the bucket's max_age are gone from it anyway.
            let now = Instant::now();
            behind.retain(|_, failed| now.duration_since(*failed) < self.max_age);
            if behind.len() >= MAX_BEHIND
                && let Some(oldest) = behind
                    .iter()
                    .min_by_key(|(_, failed)| **failed)
                    .map(|(key, _)| key.clone())
            {
                behind.remove(&oldest);
            }
        }
        behind.insert(key, Instant::now());
    }

    async fn put(
        &self,
        context: &jetstream::Context,
        key: String,
        value: String,
    ) -> Result<(), async_nats::Error> {
        let store = self.store(context).await?;
        store.put(key, value.into()).await?;
        Ok(())
    }

    /// Logs that the counts fall back to `delivered`: at `WARN` the first time, at `DEBUG`
    /// after, so that a bucket that stays unusable does not log once per message.
    fn fall_back(&self, error: &dyn std::fmt::Display) {
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                bucket = %self.bucket,
                error = %error,
                "the failure bucket cannot be used; the message's deliveries count against max_failures"
            );
        } else {
            tracing::warn!(
                bucket = %self.bucket,
                error = %error,
                "the failure bucket cannot be used; the messages whose count cannot be read or written count JetStream's deliveries against max_failures, deferred ones included, so they may be terminated before max_failures failures of their body (logged once)"
            );
        }
    }

    /// The bucket, opened (or created, with one value per key) on first use; a failure to open
    /// it is not kept, so the next use tries again.
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

/// One delivery's history, as the consumer core counts it: its body failures from the bucket
/// (read only once the body failed), and its deliveries before this one as its store
/// deferrals, which JetStream does not count apart.
pub(crate) struct MessageHistory<'a> {
    pub(crate) counts: &'a FailureCounts,
    pub(crate) message: &'a Message,
}

impl History for MessageHistory<'_> {
    async fn failures(&self) -> u32 {
        self.counts.recorded(self.message).await
    }

    async fn deferrals(&self) -> u32 {
        self.message.info().map_or(0, |info| {
            u32::try_from(info.delivered.saturating_sub(1).max(0)).unwrap_or(u32::MAX)
        })
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
