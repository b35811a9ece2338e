//! Per-task call counters, read from the workers' metrics: each `--metrics URL` is a page in
//! Prometheus' text format (a worker's exporter, or a Prometheus server's `/federate`), and
//! the page sums what every source reports of `idempotask_calls_total` (by outcome) and
//! `idempotask_lock_waits_total`. The store keeps no such counts: they are the workers'.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use idempotask::observe::{CALLS_TOTAL, LOCK_WAITS_TOTAL};
use serde::Serialize;

use crate::exit::Failure;

/// How long one source may take to answer before the page goes on without it.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// How far back "recent" give-ups reach.
pub(crate) const RECENT: Duration = Duration::from_secs(5 * 60);

/// What the workers counted of one task's calls, summed over every source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Counters {
    /// Bodies that ran and recorded their result (`executed`, `reconciled`).
    pub(crate) fresh: u64,
    /// Calls answered with a stored result (`replayed`).
    pub(crate) duplicate: u64,
    /// Calls that found the unit busy and asked again, whatever they got in the end.
    pub(crate) waited: u64,
    /// Calls that gave up waiting (`contended`).
    pub(crate) gave_up: u64,
    /// Give-ups since the oldest earlier read within [`RECENT`]; `None` before there is one.
    pub(crate) gave_up_recently: Option<u64>,
    /// Bodies that failed (`failed`): no result kept, the next delivery runs.
    pub(crate) failed: u64,
    /// Bodies whose lock ran out under them, or whose result could not be recorded.
    pub(crate) lost: u64,
    /// Deliveries of units held in doubt (`in_doubt`).
    pub(crate) held: u64,
}

impl Counters {
    /// Adds one sample: `outcome` of `idempotask_calls_total`, or `None` for the waits.
    fn add(&mut self, outcome: Option<&str>, value: u64) {
        let slot = match outcome {
            None => &mut self.waited,
            Some("executed" | "reconciled") => &mut self.fresh,
            Some("replayed") => &mut self.duplicate,
            Some("contended") => &mut self.gave_up,
            Some("failed") => &mut self.failed,
            Some("lock_lost" | "marker_not_written") => &mut self.lost,
            Some("in_doubt") => &mut self.held,
            // An outcome newer than this dashboard: not shown rather than put in a wrong column.
            Some(_) => return,
        };
        *slot = slot.saturating_add(value);
    }
}

/// Every task's counters from every source, and what went wrong with the sources that did not
/// answer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Read {
    pub(crate) tasks: BTreeMap<String, Counters>,
    pub(crate) failures: Vec<String>,
}

/// Input: the page of one source, in Prometheus' text format. Output: each task's counters in
/// it, added to `tasks`. Lines of other metrics, comments and samples that do not parse are
/// skipped: a source's other metrics are none of the dashboard's business.
pub(crate) fn add_exposition(text: &str, tasks: &mut BTreeMap<String, Counters>) {
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(sample) = Sample::parse(line) else {
            continue;
        };
        let outcome = match sample.name {
            CALLS_TOTAL => match sample.label("outcome") {
                Some(outcome) => Some(outcome),
                None => continue,
            },
            LOCK_WAITS_TOTAL => None,
            _ => continue,
        };
        let Some(task) = sample.label("task") else {
            continue;
        };
        // Counters are whole numbers; an exporter writes them as floats all the same.
        if !(sample.value.is_finite() && sample.value >= 0.0) {
            continue;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a finite, non-negative count; beyond u64 it saturates"
        )]
        let value = sample.value as u64;
        tasks
            .entry(task.to_owned())
            .or_default()
            .add(outcome, value);
    }
}

/// One sample line: `name{label="value",…} value [timestamp]`.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, String)>,
    value: f64,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let (name, mut rest) = line.split_at(name_end);
        let mut labels = Vec::new();
        if let Some(inner) = rest.strip_prefix('{') {
            rest = inner;
            loop {
                rest = rest.trim_start_matches([' ', ',']);
                if let Some(after) = rest.strip_prefix('}') {
                    rest = after;
                    break;
                }
                let (label, after) = rest.split_once('=')?;
                let (value, after) = quoted(after.trim_start())?;
                labels.push((label.trim(), value));
                rest = after;
            }
        }
        let value = rest.split_whitespace().next()?.parse().ok()?;
        Some(Self {
            name,
            labels,
            value,
        })
    }

    fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(label, _)| *label == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Input: text that starts with a quoted label value. Output: the value, unescaped (`\\`,
/// `\"`, `\n`), and the text after its closing quote.
fn quoted(text: &str) -> Option<(String, &str)> {
    let mut chars = text.strip_prefix('"')?.char_indices();
    let mut value = String::new();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Some((value, &text[at + 2..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            other => value.push(other),
        }
    }
    None
}

/// Input: a `--metrics` source. Output: why it cannot be read, before the dashboard starts.
pub(crate) fn check_source(source: &str) -> Result<(), Failure> {
    match reqwest::Url::parse(source) {
        Ok(url) if url.scheme() == "http" && url.host().is_some() => Ok(()),
        Ok(url) => Err(Failure::usage(format!(
            "--metrics {source}: only http:// pages are read (the dashboard has no TLS client, not {}:); read an https:// exporter through a local Prometheus' /federate or a tunnel",
            url.scheme()
        ))),
        Err(err) => Err(Failure::usage(format!(
            "--metrics {source}: not a URL ({err}); e.g. http://127.0.0.1:9000/metrics"
        ))),
    }
}

/// Reads every source at once, each within [`SCRAPE_TIMEOUT`]: a source that hangs delays
/// the page by that much at most, however many sources there are.
pub(crate) async fn read(client: &reqwest::Client, sources: &[String]) -> Read {
    let mut reads = tokio::task::JoinSet::new();
    for (at, source) in sources.iter().enumerate() {
        let (client, source) = (client.clone(), source.clone());
        reads.spawn(async move { (at, page(&client, &source).await) });
    }
    let mut pages = Vec::with_capacity(sources.len());
    while let Some(joined) = reads.join_next().await {
        // A fetch cannot panic but by a bug of the HTTP client; the page goes on without it.
        if let Ok(page) = joined {
            pages.push(page);
        }
    }
    // Summed and reported in the order the sources were given, whatever order they answered in.
    pages.sort_by_key(|(at, _)| *at);
    let mut read = Read::default();
    for (at, page) in pages {
        match page {
            Ok(text) => add_exposition(&text, &mut read.tasks),
            Err(err) => read.failures.push(format!("{}: {err}", sources[at])),
        }
    }
    read
}

/// One source's page, or why it could not be read.
async fn page(client: &reqwest::Client, source: &str) -> Result<String, reqwest::Error> {
    client
        .get(source)
        .timeout(SCRAPE_TIMEOUT)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await
}

/// The give-up totals of earlier reads, for what gave up recently.
#[derive(Debug, Default)]
pub(crate) struct History {
    reads: VecDeque<(Instant, BTreeMap<String, u64>)>,
}

impl History {
    /// Input: a read made at `now`. Output: the same, each task's `gave_up_recently` filled in
    /// from the oldest earlier read within [`RECENT`], if any; the read is kept for the next
    /// ones. A source
    /// that restarted counts from zero again: its give-ups before the restart are not
    /// subtracted twice, they are only no longer seen.
    pub(crate) fn record(&mut self, now: Instant, read: &mut Read) {
        while self
            .reads
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > RECENT)
        {
            self.reads.pop_front();
        }
        if let Some((_, oldest)) = self.reads.front() {
            for (task, counters) in &mut read.tasks {
                // A task the earlier read did not see had given up nothing then.
                let before = oldest.get(task).copied().unwrap_or(0);
                counters.gave_up_recently = Some(counters.gave_up.saturating_sub(before));
            }
        }
        let totals = read
            .tasks
            .iter()
            .map(|(task, counters)| (task.clone(), counters.gave_up))
            .collect();
        self.reads.push_back((now, totals));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = r#"# HELP idempotask_calls_total calls
# TYPE idempotask_calls_total counter
idempotask_calls_total{task="charge",outcome="executed"} 7
idempotask_calls_total{outcome="replayed",task="charge"} 3 1733500000000
idempotask_calls_total{task="charge",outcome="contended"} 2
idempotask_calls_total{task="charge",outcome="marker_not_written"} 1
idempotask_calls_total{task="a \"quoted\", odd\\name",outcome="executed"} 1e0
idempotask_calls_total{task="charge",outcome="from_a_newer_release"} 5
idempotask_lock_waits_total{task="charge"} 4
idempotask_lock_wait_seconds_count{task="charge"} 13
other_total{task="charge",outcome="executed"} 99
idempotask_calls_total{task="charge",outcome="executed"} NaN
idempotask_calls_total{task="broken
"#;

    #[test]
    fn the_counters_of_each_task_are_read_and_everything_else_is_skipped() {
        let mut tasks = BTreeMap::new();
        add_exposition(EXPOSITION, &mut tasks);
        assert_eq!(
            tasks["charge"],
            Counters {
                fresh: 7,
                duplicate: 3,
                waited: 4,
                gave_up: 2,
                lost: 1,
                ..Counters::default()
            }
        );
        assert_eq!(tasks[r#"a "quoted", odd\name"#].fresh, 1);
        assert_eq!(tasks.len(), 2, "{tasks:?}");
    }

    #[test]
    fn every_outcome_the_runtime_counts_has_a_column() {
        for outcome in idempotask::observe::OUTCOMES {
            let mut counters = Counters::default();
            counters.add(Some(outcome), 1);
            assert_ne!(counters, Counters::default(), "{outcome} is dropped");
        }
    }

    #[test]
    fn the_sources_are_summed() {
        let mut tasks = BTreeMap::new();
        add_exposition(EXPOSITION, &mut tasks);
        add_exposition(EXPOSITION, &mut tasks);
        assert_eq!((tasks["charge"].fresh, tasks["charge"].waited), (14, 8));
    }

    #[test]
    fn recent_give_ups_are_those_since_the_oldest_read_within_the_window() {
        let read_of = |gave_up| Read {
            tasks: BTreeMap::from([(
                "charge".to_owned(),
                Counters {
                    gave_up,
                    ..Counters::default()
                },
            )]),
            failures: Vec::new(),
        };
        let start = Instant::now();
        let mut history = History::default();
        let mut first = read_of(10);
        history.record(start, &mut first);
        assert_eq!(first.tasks["charge"].gave_up_recently, None);
        let mut second = read_of(12);
        history.record(start + Duration::from_secs(60), &mut second);
        assert_eq!(second.tasks["charge"].gave_up_recently, Some(2));
        // The first read is out of the window: the second one is the oldest left.
        let mut third = read_of(15);
        history.record(start + RECENT + Duration::from_secs(30), &mut third);
        assert_eq!(third.tasks["charge"].gave_up_recently, Some(3));
        // A restarted source counts from zero: never below zero.
        let mut restarted = read_of(1);
        history.record(start + RECENT + Duration::from_secs(40), &mut restarted);
        assert_eq!(restarted.tasks["charge"].gave_up_recently, Some(0));
    }
}
