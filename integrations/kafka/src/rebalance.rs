//! What the consumer shares with its rebalance callback, and the callback: before partitions
//! are taken away, their running units end or are stopped, and their offsets are committed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::task::AbortHandle;

use crate::Record;
use crate::offsets::{OffsetTracker, Partition};

/// What the consumer and its rebalance callback share.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Notified each time a unit ends.
    pub(crate) ended: Condvar,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) offsets: OffsetTracker,
    /// The running units, to stop those of a revoked partition.
    pub(crate) units: HashMap<(Partition, i64), AbortHandle>,
    /// Records received beyond `max_in_flight`, waiting in order, their partition paused.
    pub(crate) waiting: HashMap<Partition, VecDeque<Record>>,
    pub(crate) paused: HashSet<Partition>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The consumer's rebalance callback: before partitions are taken away, their running units
/// end or are stopped, and their offsets are committed.
pub(crate) struct Context {
    pub(crate) shared: Arc<Shared>,
    pub(crate) revoke_wait: Duration,
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let partitions: Vec<Partition> = revoked
            .elements()
            .iter()
            .map(|element| (element.topic().to_owned(), element.partition()))
            .collect();
        let commits = self.revoke(&partitions);
        if commits.count() > 0
            && let Err(err) = consumer.commit(&commits, CommitMode::Sync)
        {
            tracing::warn!(error = %err, "the offsets of revoked partitions could not be committed; their records after the last commit are delivered again");
        }
    }
}

impl Context {
    /// Input: the partitions a rebalance takes away. Output: their units ended (waited for up
    /// to `revoke_wait`) or stopped, their state forgotten, and the offsets they may commit.
    fn revoke(&self, partitions: &[Partition]) -> TopicPartitionList {
        // The units run on the runtime's other threads; on a current-thread runtime they
        // cannot while this callback holds the thread, so waiting would only delay the stop.
        let can_wait = tokio::runtime::Handle::try_current().is_ok_and(|handle| {
            handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
        });
        let wait = || {
            let deadline = Instant::now() + self.revoke_wait;
            let mut state = self.shared.lock();
            for partition in partitions {
                state.waiting.remove(partition);
            }
            // Units, not the tracker's running offsets: records that wait behind a paused
            // partition and units already stopped (a dropped consumer's) never end.
            while state
                .units
                .keys()
                .any(|(partition, _)| partitions.contains(partition))
            {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                state = self
                    .shared
                    .ended
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            state
        };
        let mut state = if can_wait {
            tokio::task::block_in_place(wait)
        } else {
            let mut state = self.shared.lock();
            for partition in partitions {
                state.waiting.remove(partition);
            }
            state
        };
        let mut commits = TopicPartitionList::new();
        let state = &mut *state;
        state.units.retain(|(partition, offset), unit| {
            let revoked = partitions.contains(partition);
            if revoked {
                tracing::warn!(
                    topic = partition.0,
                    partition = partition.1,
                    offset,
                    "a record of a revoked partition was still running; it is stopped and its lock released"
                );
                unit.abort();
            }
            !revoked
        });
        for partition in partitions {
            state.paused.remove(partition);
            if let Some(position) = state.offsets.revoke(partition) {
                let _ = commits.add_partition_offset(
                    &partition.0,
                    partition.1,
                    Offset::Offset(position),
                );
            }
        }
        commits
    }
}
