//! Which offset each partition may commit: one past the records that finished, never past one
//! that is still running.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A partition: its topic and number.
pub(crate) type Partition = (String, i32);

/// The records of every assigned partition that were received and have not been committed past
/// yet, and the offset each partition committed last.
///
/// A partition's commit position is the offset of its first received record that has not
/// finished, or one past its last received record when all have. Offsets are compared as the
/// records came, not counted: a compacted or transactional topic leaves gaps between them.
/// A record still running holds back its own partition only.
#[derive(Debug, Default)]
pub(crate) struct OffsetTracker {
    partitions: HashMap<Partition, PartitionOffsets>,
}

#[derive(Debug, Default)]
struct PartitionOffsets {
    /// Received and not finished, by offset.
    running: BTreeSet<i64>,
    /// The highest offset received, finished or not.
    highest: Option<i64>,
    /// The last position sent as a commit, or the first offset received (where the group's
    /// position was).
    committed: Option<i64>,
}

impl PartitionOffsets {
    /// Its first running offset, or one past its highest received one.
    fn position(&self) -> Option<i64> {
        match self.running.first() {
            Some(first) => Some(*first),
            None => self.highest.map(|high| high + 1),
        }
    }
}

impl OffsetTracker {
    /// Input: a record handed to its unit. Output: its offset counted as running.
    pub(crate) fn received(&mut self, partition: &Partition, offset: i64) {
        let entry = self.partitions.entry(partition.clone()).or_default();
        // The consumer reads from the group's position: committing the first record's own
        // offset would say nothing new.
        if entry.highest.is_none() {
            entry.committed.get_or_insert(offset);
        }
        entry.running.insert(offset);
        entry.highest = Some(entry.highest.map_or(offset, |high| high.max(offset)));
    }

    /// Input: a record whose unit finished (acked, or dead-lettered and the copy acknowledged).
    /// Output: its offset no longer holds its partition back. A partition revoked meanwhile is
    /// not brought back.
    pub(crate) fn finished(&mut self, partition: &Partition, offset: i64) {
        if let Some(entry) = self.partitions.get_mut(partition) {
            entry.running.remove(&offset);
        }
    }

    /// How many records of `partition` are running.
    pub(crate) fn running(&self, partition: &Partition) -> usize {
        self.partitions
            .get(partition)
            .map_or(0, |entry| entry.running.len())
    }

    #[cfg(test)]
    /// The position `partition` may commit: its first running offset, or one past its highest
    /// received one; `None` before it received anything.
    pub(crate) fn position(&self, partition: &Partition) -> Option<i64> {
        self.partitions.get(partition)?.position()
    }

    /// The partitions whose position moved past their last commit, with that position, in
    /// partition order; each is counted as committed.
    pub(crate) fn take_commits(&mut self) -> Vec<(Partition, i64)> {
        let mut commits = BTreeMap::new();
        for (partition, entry) in &mut self.partitions {
            if let Some(position) = entry.position()
                && entry.committed.is_none_or(|done| position > done)
            {
                entry.committed = Some(position);
                commits.insert(partition.clone(), position);
            }
        }
        commits.into_iter().collect()
    }

    /// Input: a commit of `position` for `partition` that the broker refused. Output: the
    /// position counts as not sent, so that the next commit sends it again, unless a later
    /// position was sent meanwhile.
    pub(crate) fn commit_failed(&mut self, partition: &Partition, position: i64) {
        if let Some(entry) = self.partitions.get_mut(partition)
            && entry.committed == Some(position)
        {
            entry.committed = Some(position - 1);
        }
    }

    /// Input: a partition taken from this consumer. Output: its records forgotten; returns the
    /// position it may still commit if that moved past its last commit.
    pub(crate) fn revoke(&mut self, partition: &Partition) -> Option<i64> {
        let entry = self.partitions.remove(partition)?;
        let position = entry.position()?;
        entry
            .committed
            .is_none_or(|done| position > done)
            .then_some(position)
    }
}

#[cfg(test)]
mod tests {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn p(n: i32) -> Partition {
        ("orders".to_owned(), n)
    }

    #[test]
    fn nothing_received_commits_nothing() {
        let mut tracker = OffsetTracker::default();
        assert_eq!(tracker.position(&p(0)), None);
        assert!(tracker.take_commits().is_empty());
        assert_eq!(tracker.revoke(&p(0)), None);
    }

    #[test]
    fn commits_one_past_the_contiguous_finished_records() {
        let mut tracker = OffsetTracker::default();
        for offset in 0..4 {
            tracker.received(&p(0), offset);
        }
        tracker.finished(&p(0), 0);
        tracker.finished(&p(0), 2);
        tracker.finished(&p(0), 3);
        // Offset 1 still runs: 2 and 3 wait behind it.
        assert_eq!(tracker.take_commits(), [(p(0), 1)]);
        assert!(tracker.take_commits().is_empty(), "committed once");
        tracker.finished(&p(0), 1);
        assert_eq!(tracker.take_commits(), [(p(0), 4)]);
        assert_eq!(tracker.running(&p(0)), 0);
    }

    #[test]
    fn a_running_record_holds_back_only_its_own_partition() {
        let mut tracker = OffsetTracker::default();
        tracker.received(&p(0), 10);
        tracker.received(&p(1), 20);
        tracker.received(&p(1), 21);
        tracker.finished(&p(1), 20);
        tracker.finished(&p(1), 21);
        // Partition 0 is where the group left it: nothing to commit.
        assert_eq!(tracker.take_commits(), [(p(1), 22)]);
        assert_eq!(tracker.running(&p(0)), 1);
    }

    #[test]
    fn gaps_between_offsets_are_not_waited_for() {
        // A compacted topic: offsets 5, 9 and 30 are all there is.
        let mut tracker = OffsetTracker::default();
        for offset in [5, 9, 30] {
            tracker.received(&p(0), offset);
        }
        tracker.finished(&p(0), 5);
        tracker.finished(&p(0), 30);
        assert_eq!(tracker.position(&p(0)), Some(9));
        tracker.finished(&p(0), 9);
        assert_eq!(tracker.position(&p(0)), Some(31));
    }

    #[test]
    fn a_revoked_partition_answers_what_it_may_still_commit_and_stays_gone() {
        let mut tracker = OffsetTracker::default();
        tracker.received(&p(0), 0);
        tracker.received(&p(0), 1);
        tracker.finished(&p(0), 0);
        assert_eq!(tracker.revoke(&p(0)), Some(1));
        // A unit that ends after the revoke does not bring the partition back.
        tracker.finished(&p(0), 1);
        assert_eq!(tracker.position(&p(0)), None);
        assert!(tracker.take_commits().is_empty());
        // Nothing new since the last commit: nothing to commit at the revoke.
        tracker.received(&p(1), 7);
        tracker.finished(&p(1), 7);
        assert_eq!(tracker.take_commits(), [(p(1), 8)]);
        assert_eq!(tracker.revoke(&p(1)), None);
    }

    #[test]
    fn finishing_an_unknown_offset_changes_nothing() {
        let mut tracker = OffsetTracker::default();
        tracker.received(&p(0), 3);
        tracker.finished(&p(0), 99);
        tracker.finished(&p(5), 3);
        assert_eq!(tracker.position(&p(0)), Some(3));
    }

    /// Random offsets with gaps over three partitions, finished in a random order, commits
    /// taken at random moments: a committed position never passes a record that has not
    /// finished, never goes back, and ends one past each partition's last record.
    #[test]
    fn random_orders_never_commit_past_a_running_record() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(56);
        for _round in 0..500 {
            let mut tracker = OffsetTracker::default();
            let mut records = Vec::new();
            for partition in 0..3 {
                let mut offset = rng.random_range(0..5_i64);
                for _ in 0..rng.random_range(0..20) {
                    records.push((p(partition), offset));
                    offset += rng.random_range(1..4);
                }
            }
            // Received in partition order (as a partition's records come), finished in any.
            for (partition, offset) in &records {
                tracker.received(partition, *offset);
            }
            let mut order = records.clone();
            order.shuffle(&mut rng);
            let mut finished: Vec<(Partition, i64)> = Vec::new();
            let mut last: HashMap<Partition, i64> = HashMap::new();
            for (partition, offset) in order {
                tracker.finished(&partition, offset);
                finished.push((partition, offset));
                if rng.random_bool(0.3) {
                    for (partition, position) in tracker.take_commits() {
                        let unfinished_below = records.iter().any(|(q, o)| {
                            *q == partition && *o < position && !finished.contains(&(q.clone(), *o))
                        });
                        assert!(
                            !unfinished_below,
                            "{partition:?} committed {position} past a running record"
                        );
                        let previous = last.insert(partition.clone(), position);
                        assert!(previous.is_none_or(|before| before < position));
                    }
                }
            }
            tracker.take_commits();
            for (partition, _) in &records {
                let highest = records
                    .iter()
                    .filter(|(q, _)| q == partition)
                    .map(|(_, o)| *o)
                    .max();
                assert_eq!(tracker.position(partition), highest.map(|h| h + 1));
                assert_eq!(tracker.running(partition), 0);
            }
        }
    }
}
