//! The SQS tests' queues on the shared `moto_server`: a client for it, a queue with its
//! dead-letter queue, and what the queues hold.

use std::sync::atomic::{AtomicU32, Ordering};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName};
use idempotask_test_support::moto::MotoServer;

/// A client of the binary's shared `moto_server`.
pub(crate) fn client() -> Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
        .endpoint_url(MotoServer::shared().endpoint())
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    Client::from_conf(config)
}

/// A queue of the test's own and its dead-letter queue.
pub(crate) struct Queue {
    pub(crate) client: Client,
    pub(crate) url: String,
    pub(crate) dead_url: String,
}

/// How a test's queue is made.
pub(crate) struct Shape {
    pub(crate) visibility: u32,
    pub(crate) max_receive_count: Option<u32>,
    pub(crate) fifo: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            visibility: 2,
            max_receive_count: Some(3),
            fifo: false,
        }
    }
}

impl Queue {
    /// A new queue named after `name` (unique in the binary), with `shape`.
    pub(crate) async fn create(name: &str, shape: Shape) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let suffix = if shape.fifo { ".fifo" } else { "" };
        let client = client();
        let mut dead = client
            .create_queue()
            .queue_name(format!("{name}-{n}-dead{suffix}"));
        let mut main = client
            .create_queue()
            .queue_name(format!("{name}-{n}{suffix}"));
        if shape.fifo {
            dead = dead.attributes(QueueAttributeName::FifoQueue, "true");
            main = main
                .attributes(QueueAttributeName::FifoQueue, "true")
                .attributes(QueueAttributeName::ContentBasedDeduplication, "true");
        }
        let dead_url = dead.send().await.unwrap().queue_url().unwrap().to_owned();
        let arn = client
            .get_queue_attributes()
            .queue_url(&dead_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap()
            .attributes()
            .unwrap()[&QueueAttributeName::QueueArn]
            .clone();
        main = main.attributes(
            QueueAttributeName::VisibilityTimeout,
            shape.visibility.to_string(),
        );
        if let Some(count) = shape.max_receive_count {
            let policy =
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{count}"}}"#);
            main = main.attributes(QueueAttributeName::RedrivePolicy, policy);
        }
        let url = main.send().await.unwrap().queue_url().unwrap().to_owned();
        Self {
            client,
            url,
            dead_url,
        }
    }

    /// Sends `body` with the string attribute `order_id` (none when `None`), in `group` on a
    /// FIFO queue.
    pub(crate) async fn send(
        &self,
        body: &str,
        order_id: Option<&str>,
        group: Option<&str>,
    ) -> String {
        let mut send = self
            .client
            .send_message()
            .queue_url(&self.url)
            .message_body(body);
        if let Some(id) = order_id {
            let value = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(id)
                .build()
                .unwrap();
            send = send.message_attributes("order_id", value);
        }
        if let Some(group) = group {
            send = send.message_group_id(group);
        }
        send.send().await.unwrap().message_id().unwrap().to_owned()
    }

    /// How many messages `url` holds, visible or in flight.
    pub(crate) async fn holds(&self, url: &str) -> u32 {
        let output = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap();
        let attributes = output.attributes().unwrap();
        [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        ]
        .iter()
        .map(|name| attributes[name].parse::<u32>().unwrap())
        .sum()
    }
}
