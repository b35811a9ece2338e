//! [`ConsumeError`]: what stopped the consumer from starting, reading or committing.

/// The consumer could not start, read, or commit.
///
/// ```
/// use idempotask_kafka::ConsumeError;
/// let err = ConsumeError::UnknownTopic { topic: "orders".into() };
/// assert_eq!(err.to_string(), "the topic `orders` does not exist on the broker; create it (this consumer creates no topic)");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The client failed, or the broker refused a request.
    #[error("Kafka failed at {action}: {source}")]
    Kafka {
        /// What the consumer was doing: `create consumer`, `subscribe`, `poll`, `commit`, ….
        action: &'static str,
        /// The client's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A topic to consume, or the dead-letter topic, does not exist. Checked at the start, so
    /// that a typo is not a consumer that waits for ever.
    #[error(
        "the topic `{topic}` does not exist on the broker; create it (this consumer creates no topic)"
    )]
    UnknownTopic {
        /// The topic's name.
        topic: String,
    },
}

impl ConsumeError {
    pub(crate) fn kafka(action: &'static str, err: rdkafka::error::KafkaError) -> Self {
        Self::Kafka {
            action,
            source: Box::new(err),
        }
    }
}
