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
    /// Give-ups since the oldest earlier read within [`RECENT`], and how long ago that read
    /// was, in seconds; `None` before there is one.
    pub(crate) gave_up_recently: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) recently_s: Option<u64>,
    /// Bodies that failed (`failed`): no result kept, the next delivery runs.
    pub(crate) failed: u64,
    /// Bodies whose lock ran out under them, or whose result could not be recorded.
    pub(crate) lost: u64,
    /// Deliveries of units held in doubt (`in_doubt`).
    pub(crate) held: u64,
}

impl Counters {
    /// Adds another source's counts of the same task.
    fn sum(&mut self, other: &Self) {
        for (mine, theirs) in [
            (&mut self.fresh, other.fresh),
            (&mut self.duplicate, other.duplicate),
            (&mut self.waited, other.waited),
            (&mut self.gave_up, other.gave_up),
            (&mut self.failed, other.failed),
            (&mut self.lost, other.lost),
            (&mut self.held, other.held),
        ] {
            *mine = mine.saturating_add(theirs);
        }
    }

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

/// Give-ups by source, then by task.
pub(crate) type GaveUpBySource = BTreeMap<String, BTreeMap<String, u64>>;

/// Every task's counters from every source, and what went wrong with the sources that did not
/// answer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Read {
    pub(crate) tasks: BTreeMap<String, Counters>,
    pub(crate) failures: Vec<String>,
    /// Each source's give-ups by task (sources that did not answer are left out).
    pub(crate) gave_up_by_source: GaveUpBySource,
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

/// The most of a page that is read: a page that keeps sending is cut off there and named.
const MAX_PAGE_BYTES: usize = 8 << 20;

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
            Ok(text) => {
                let mut own = BTreeMap::new();
                add_exposition(&text, &mut own);
                let gave_up = own
                    .iter()
                    .map(|(task, counters)| (task.clone(), counters.gave_up))
                    .collect();
                read.gave_up_by_source.insert(sources[at].clone(), gave_up);
                for (task, counters) in own {
                    read.tasks.entry(task).or_default().sum(&counters);
                }
            }
            Err(err) => read
                .failures
                .push(format!("{}: {err}", shown(&sources[at]))),
        }
    }
    read
}

/// A source as the page names it: without the user and password a URL may carry.
fn shown(source: &str) -> String {
    match reqwest::Url::parse(source) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        }
        Err(_) => source.to_owned(),
    }
}

/// One source's page, or why it could not be read.
async fn page(client: &reqwest::Client, source: &str) -> Result<String, String> {
    let mut response = client
        .get(source)
        .timeout(SCRAPE_TIMEOUT)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|err| err.without_url().to_string())?;
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| err.without_url().to_string())?
    {
        if body.len() + chunk.len() > MAX_PAGE_BYTES {
            return Err(format!(
                "the page is longer than {} MiB: point --metrics at a page of the idempotask metrics only",
                MAX_PAGE_BYTES >> 20
            ));
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| "the page is not UTF-8".to_owned())
}

/// The give-ups each source reported in earlier reads, for what gave up recently.
#[derive(Debug, Default)]
pub(crate) struct History {
    reads: VecDeque<(Instant, GaveUpBySource)>,
}

impl History {
    /// Input: a read made at `now`. Output: the same, each task's `gave_up_recently` filled in
    /// from the oldest earlier read within [`RECENT`], if any, source by source: a source whose
    /// count went down restarted, and all it counts now is recent; a source that read did not
    /// have is left out of the recent count. The read is kept for the next ones.
    pub(crate) fn record(&mut self, now: Instant, read: &mut Read) {
        while self
            .reads
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > RECENT)
        {
            self.reads.pop_front();
        }
        if let Some((at, oldest)) = self.reads.front() {
            let since = now.saturating_duration_since(*at).as_secs();
            for (task, counters) in &mut read.tasks {
                let mut recent: u64 = 0;
                for (source, gave_up) in &read.gave_up_by_source {
                    let Some(before) = oldest.get(source) else {
                        continue;
                    };
                    let now = gave_up.get(task).copied().unwrap_or(0);
                    let then = before.get(task).copied().unwrap_or(0);
                    recent = recent.saturating_add(if now >= then { now - then } else { now });
                }
                counters.gave_up_recently = Some(recent);
                counters.recently_s = Some(since);
            }
        }
        self.reads.push_back((now, read.gave_up_by_source.clone()));
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
    fn a_source_is_named_without_its_password() {
        assert_eq!(
            shown("http://scraper:s3cret@prometheus:9090/federate?match[]=x"),
            "http://prometheus:9090/federate?match[]=x"
        );
    }

    #[test]
    fn the_sources_are_summed() {
        let mut tasks = BTreeMap::new();
        add_exposition(EXPOSITION, &mut tasks);
        add_exposition(EXPOSITION, &mut tasks);
        assert_eq!((tasks["charge"].fresh, tasks["charge"].waited), (14, 8));
    }

    #[test]
    fn recent_give_ups_are_counted_source_by_source_since_the_oldest_read_in_the_window() {
        // Give-ups of `charge` by source: worker a, and worker b when it answered.
        let read_of = |a: u64, b: Option<u64>| {
            let mut by_source =
                BTreeMap::from([("a".to_owned(), BTreeMap::from([("charge".to_owned(), a)]))]);
            if let Some(b) = b {
                by_source.insert("b".to_owned(), BTreeMap::from([("charge".to_owned(), b)]));
            }
            Read {
                tasks: BTreeMap::from([(
                    "charge".to_owned(),
                    Counters {
                        gave_up: a + b.unwrap_or(0),
                        ..Counters::default()
                    },
                )]),
                failures: Vec::new(),
                gave_up_by_source: by_source,
            }
        };
        let recent = |read: &Read| {
            let counters = &read.tasks["charge"];
            (counters.gave_up_recently, counters.recently_s)
        };
        let start = Instant::now();
        let mut history = History::default();
        let mut first = read_of(10, Some(4));
        history.record(start, &mut first);
        assert_eq!(recent(&first), (None, None));
        let mut second = read_of(12, Some(5));
        history.record(start + Duration::from_secs(60), &mut second);
        assert_eq!(recent(&second), (Some(3), Some(60)));
        // Worker a restarted (its 2 give-ups since are recent) while b gave up twice more: the
        // drop of a's total hides none of b's.
        let mut restarted = read_of(2, Some(6));
        history.record(start + Duration::from_secs(90), &mut restarted);
        assert_eq!(recent(&restarted), (Some(4), Some(90)));
        // The first read is out of the window: the second one is the oldest left. b did not
        // answer this time: only a counts.
        let mut later = read_of(3, None);
        history.record(start + RECENT + Duration::from_secs(30), &mut later);
        assert_eq!(recent(&later), (Some(3), Some(RECENT.as_secs() - 30)));
    }
}
