//! The SQS calls of a batch's settling: one `DeleteMessageBatch`, one
//! `ChangeMessageVisibilityBatch`, each answering every message's entry.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
};

use crate::SettleFailure;

/// SQS's longest visibility timeout: 12 hours.
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// Input: a delay. Output: the visibility timeout SQS takes for it, whole seconds rounded up,
/// at most 12 hours.
pub(crate) fn visibility_seconds(delay: Duration) -> i32 {
    let delay = delay.min(MAX_VISIBILITY);
    let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

/// Deletes the messages of `receipts` (an entry id and a receipt handle each) in one
/// `DeleteMessageBatch`; answers the failure of each entry that failed, by entry id.
pub(crate) async fn delete(
    client: &Client,
    queue_url: &str,
    receipts: &[(String, String)],
) -> HashMap<String, SettleFailure> {
    const ACTION: &str = "DeleteMessageBatch";
    if receipts.is_empty() {
        return HashMap::new();
    }
    let entries = receipts.iter().map(|(id, receipt)| {
        DeleteMessageBatchRequestEntry::builder()
            .id(id)
            .receipt_handle(receipt)
            .build()
    });
    let entries = match entries.collect::<Result<Vec<_>, _>>() {
        Ok(entries) => entries,
        Err(err) => return all_failed(ACTION, receipts, &err.to_string()),
    };
    let sent = client
        .delete_message_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await;
    match sent {
        Ok(output) => failures(ACTION, output.failed()),
        Err(err) => all_failed(ACTION, receipts, &DisplayErrorContext(&err).to_string()),
    }
}

/// Sets the visibility timeout of the messages of `changes` (an entry id, a receipt handle and
/// a delay each) in one `ChangeMessageVisibilityBatch`; answers the failure of each entry that
/// failed, by entry id.
pub(crate) async fn change_visibility(
    client: &Client,
    queue_url: &str,
    changes: &[(String, String, Duration)],
) -> HashMap<String, SettleFailure> {
    const ACTION: &str = "ChangeMessageVisibilityBatch";
    if changes.is_empty() {
        return HashMap::new();
    }
    let entries = changes.iter().map(|(id, receipt, delay)| {
        ChangeMessageVisibilityBatchRequestEntry::builder()
            .id(id)
            .receipt_handle(receipt)
            .visibility_timeout(visibility_seconds(*delay))
            .build()
    });
    let ids: Vec<(String, String)> = changes
        .iter()
        .map(|(id, receipt, _)| (id.clone(), receipt.clone()))
        .collect();
    let entries = match entries.collect::<Result<Vec<_>, _>>() {
        Ok(entries) => entries,
        Err(err) => return all_failed(ACTION, &ids, &err.to_string()),
    };
    let sent = client
        .change_message_visibility_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await;
    match sent {
        Ok(output) => failures(ACTION, output.failed()),
        Err(err) => all_failed(ACTION, &ids, &DisplayErrorContext(&err).to_string()),
    }
}

fn failures(
    action: &'static str,
    failed: &[aws_sdk_sqs::types::BatchResultErrorEntry],
) -> HashMap<String, SettleFailure> {
    failed
        .iter()
        .map(|entry| {
            let failure =
                SettleFailure::new(action, entry.code(), entry.message().unwrap_or_default());
            (entry.id().to_owned(), failure)
        })
        .collect()
}

fn all_failed(
    action: &'static str,
    entries: &[(String, String)],
    why: &str,
) -> HashMap<String, SettleFailure> {
    entries
        .iter()
        .map(|(id, _)| (id.clone(), SettleFailure::new(action, "CallFailed", why)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_becomes_whole_seconds_rounded_up_within_sqs_limit() {
        assert_eq!(visibility_seconds(Duration::ZERO), 0);
        assert_eq!(visibility_seconds(Duration::from_millis(100)), 1);
        assert_eq!(visibility_seconds(Duration::from_secs(2)), 2);
        assert_eq!(visibility_seconds(Duration::from_millis(2001)), 3);
        assert_eq!(visibility_seconds(Duration::from_secs(86_400)), 43_200);
    }
}
