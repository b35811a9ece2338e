//! What a task call tells operators: the fields of its `idempotask.call` span, its warnings, and
//! its metrics, for each way a call can end. Everything runs on the in-memory store on the test's
//! own thread, where a thread-local subscriber and recorder see it; a lost lock is scripted with
//! tokio's paused clock (the store's TTLs follow it), so nothing waits for real time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotask::store::UnitOfWork;
use idempotask::{Error, KeyLogging, MemoryStore, Outcome, RetryPolicy, Task};
use tokio::sync::oneshot;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// Field name → value as text.
#[derive(Debug, Default, Clone)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Keeps the fields of every closed `idempotask.call` span, of every closed `idempotask.step`
/// span (with its parent's name as `parent`), and of every warning.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<Fields>>>,
    steps: Arc<Mutex<Vec<Fields>>>,
    warnings: Arc<Mutex<Vec<Fields>>>,
    errors: Arc<Mutex<Vec<Fields>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let name = attrs.metadata().name();
        if name == "idempotask.call" || name == "idempotask.step" {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            let span = ctx.span(id).unwrap();
            if name == "idempotask.step" {
                let parent = span.parent().map_or("none", |parent| parent.name());
                fields.0.insert("parent".to_owned(), parent.to_owned());
            }
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(fields) = ctx.span(id).unwrap().extensions_mut().get_mut::<Fields>() {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let kept = match *event.metadata().level() {
            Level::WARN => &self.warnings,
            Level::ERROR => &self.errors,
            _ => return,
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        kept.lock().unwrap().push(fields);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let kept = match span.name() {
            "idempotask.step" => &self.steps,
            _ => &self.spans,
        };
        if let Some(fields) = span.extensions_mut().remove::<Fields>() {
            kept.lock().unwrap().push(fields);
        }
    }
}

impl Capture {
    /// A subscriber for this thread only, so that tests running in parallel do not mix.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(Registry::default().with(self.clone()))
    }

    fn only_span(&self) -> BTreeMap<String, String> {
        let spans = self.spans.lock().unwrap();
        assert_eq!(spans.len(), 1, "{spans:?}");
        spans[0].0.clone()
    }

    /// Each closed step span as `(step, position, outcome, kind)`, `-` for a field not set.
    fn steps(&self) -> Vec<[String; 4]> {
        let steps = self.steps.lock().unwrap();
        steps
            .iter()
            .map(|fields| {
                assert_eq!(field(&fields.0, "parent"), "idempotask.call");
                ["step", "position", "outcome", "kind"]
                    .map(|name| fields.0.get(name).cloned().unwrap_or_else(|| "-".into()))
            })
            .collect()
    }

    fn spans(&self) -> Vec<BTreeMap<String, String>> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.0.clone())
            .collect()
    }
}

fn field<'a>(fields: &'a BTreeMap<String, String>, name: &str) -> &'a str {
    fields
        .get(name)
        .unwrap_or_else(|| panic!("no `{name}` in {fields:?}"))
}

#[tokio::test]
async fn an_executed_call_records_every_field() {
    let capture = Capture::default();
    let _guard = capture.install();
    let report = Task::new("charge")
        .fencing(true)
        .call("order-1")
        .store(MemoryStore::new())
        .run_reported(async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    let span = capture.only_span();
    assert_eq!(field(&span, "task"), "charge");
    assert_eq!(field(&span, "key"), "order-1");
    assert_eq!(field(&span, "outcome"), "executed");
    assert_eq!(field(&span, "attempts"), "1");
    assert_eq!(
        field(&span, "fencing_token"),
        report.fencing_token.unwrap().to_string()
    );
    assert!(field(&span, "waited_ms").parse::<u64>().is_ok(), "{span:?}");
}

#[tokio::test]
async fn a_replayed_call_records_the_first_execution_s_token() {
    let capture = Capture::default();
    let store = MemoryStore::new();
    let task = Task::new("charge").fencing(true);
    let first = task
        .call("order-1")
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    let _guard = capture.install();
    let second = task
        .call("order-1")
        .store(store)
        .run_reported(async { Ok::<_, Error>(8) })
        .await
        .unwrap();
    assert_eq!(second.outcome, Outcome::Replayed);
    let span = capture.only_span();
    assert_eq!(field(&span, "outcome"), "replayed");
    assert_eq!(field(&span, "attempts"), "1");
    assert_eq!(
        field(&span, "fencing_token"),
        first.fencing_token.unwrap().to_string()
    );
}

#[tokio::test]
async fn a_contended_call_records_its_attempts_and_no_token() {
    let capture = Capture::default();
    let _guard = capture.install();
    let store = MemoryStore::new();
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let holder = {
        let store = store.clone();
        tokio::spawn(async move {
            Task::new("charge")
                .call("order-1")
                .store(store)
                .run(async move {
                    started_tx.send(()).unwrap();
                    finish_rx.await.unwrap();
                    Ok::<_, Error>(1)
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let intruder = Task::new("charge")
        .retry(RetryPolicy::no_wait())
        .call("order-1")
        .store(store)
        .run(async { Ok::<_, Error>(2) })
        .await;
    assert!(
        matches!(intruder, Err(Error::Contended { .. })),
        "{intruder:?}"
    );
    finish_tx.send(()).unwrap();
    holder.await.unwrap().unwrap();

    let spans = capture.spans();
    let contended = spans
        .iter()
        .find(|s| s.get("outcome").map(String::as_str) == Some("contended"))
        .unwrap_or_else(|| panic!("{spans:?}"));
    assert_eq!(field(contended, "attempts"), "1");
    assert!(!contended.contains_key("fencing_token"), "{contended:?}");
    assert!(contended.contains_key("waited_ms"), "{contended:?}");
    assert!(
        spans
            .iter()
            .any(|s| s.get("outcome").map(String::as_str) == Some("executed"))
    );
}

#[tokio::test]
async fn a_failed_call_records_failed_and_caches_nothing() {
    let capture = Capture::default();
    let _guard = capture.install();
    let store = MemoryStore::new();
    let failed: Result<u8, Error> = Task::new("charge")
        .fencing(true)
        .call("order-1")
        .store(store.clone())
        .run(async { Err(Error::NotConfigured) })
        .await;
    assert!(failed.is_err());
    let span = capture.only_span();
    assert_eq!(field(&span, "outcome"), "failed");
    assert_eq!(field(&span, "attempts"), "1");
    assert!(span.contains_key("fencing_token"), "{span:?}");
}

#[tokio::test]
async fn a_call_that_fails_before_the_store_records_failed() {
    let capture = Capture::default();
    let _guard = capture.install();
    let empty_key: Result<u8, Error> = Task::new("charge")
        .call("")
        .store(MemoryStore::new())
        .run(async { Ok(1) })
        .await;
    assert!(matches!(empty_key, Err(Error::InvalidKey(_))));
    let span = capture.only_span();
    assert_eq!(field(&span, "outcome"), "failed");
    assert!(!span.contains_key("key"), "{span:?}");
}

#[tokio::test(start_paused = true)]
async fn a_lost_lock_records_lock_lost_and_warns_with_the_hashed_key() {
    let capture = Capture::default();
    let _guard = capture.install();
    let ttl = Duration::from_millis(100);
    let report = Task::new("charge")
        .lock_ttl(ttl)
        // Forgotten when it runs out: remembered, the lock would still be this delivery's.
        .doubt_memory(Duration::ZERO)
        .log_key(KeyLogging::Hash)
        .call("alice@example.com")
        .store(MemoryStore::new())
        // The paused clock jumps past the TTL: the body outlives its lock.
        .run_reported(async move {
            tokio::time::sleep(ttl * 2).await;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert!(matches!(report.outcome, Outcome::LockLost { .. }));
    let digest = UnitOfWork::new("charge", "alice@example.com")
        .unwrap()
        .digest()
        .to_owned();
    let span = capture.only_span();
    assert_eq!(field(&span, "outcome"), "lock_lost");
    assert_eq!(field(&span, "key"), digest);
    let warnings = capture.warnings.lock().unwrap();
    // First the body's use of its TTL (200 %, unrenewed), then the lost lock.
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(field(&warnings[0].0, "message").contains("more than 80 % of its lock TTL"));
    assert!(field(&warnings[1].0, "message").contains("lock expired"));
    for warning in warnings.iter() {
        assert_eq!(field(&warning.0, "key"), digest);
    }
    let everything = format!("{span:?}{warnings:?}");
    assert!(!everything.contains("alice"), "{everything}");
}

#[idempotask::idempotent_task(key = "statement-{email}", log_key = "hash", store = *store)]
async fn send_statement(store: &MemoryStore, email: &str) -> Result<usize, Error> {
    Ok(email.len())
}

#[tokio::test]
async fn the_attribute_s_log_key_option_hashes_the_key_in_the_span() {
    let capture = Capture::default();
    let _guard = capture.install();
    send_statement(&MemoryStore::new(), "ada@example.com")
        .await
        .unwrap();
    let span = capture.only_span();
    let digest = UnitOfWork::new("send_statement", "statement-ada@example.com").unwrap();
    assert_eq!(field(&span, "key"), digest.digest());
    assert_eq!(field(&span, "task"), "send_statement");
}

/// Runs a `checkout` of `order` on `store`: a `charge` step, then the `mail` step, which fails
/// while `mail_works` is false.
async fn checkout(store: &MemoryStore, order: &str, mail_works: bool) -> Result<(), Error> {
    Task::new("checkout")
        .call(order)
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().expect("inside a task");
            ctx.step("charge", async { Ok::<_, Error>(7) }).await?;
            ctx.step(("mail", "ada"), async {
                if mail_works {
                    Ok(())
                } else {
                    Err(Error::NotConfigured)
                }
            })
            .await
        })
        .await
}

/// Each way a step can end, in its span: its name, its place, and whether it ran.
async fn every_step_ending(store: &MemoryStore) {
    assert!(checkout(store, "order-1", false).await.is_err());
    checkout(store, "order-1", true).await.unwrap();
    // Refused before any effect: a step past `max_steps`, two steps at once, and a body that
    // calls its steps in another order than the journal's.
    let refused = Task::new("checkout")
        .max_steps(1)
        .call("order-2")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().expect("inside a task");
            ctx.step("charge", async { Ok::<_, Error>(7) }).await?;
            ctx.step("mail", async { Ok::<_, Error>(()) }).await
        })
        .await;
    assert!(matches!(refused, Err(Error::Step { .. })), "{refused:?}");
    let joined = Task::new("checkout")
        .call("order-3")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().expect("inside a task");
            let (release, wait) = oneshot::channel::<()>();
            let (first, second) = tokio::join!(
                ctx.step("charge", async {
                    wait.await.unwrap();
                    Ok::<_, Error>(7)
                }),
                async {
                    let second = ctx.step("mail", async { Ok::<_, Error>(()) }).await;
                    release.send(()).unwrap();
                    second
                }
            );
            first.and(second)
        })
        .await;
    assert!(matches!(joined, Err(Error::Step { .. })), "{joined:?}");
    assert!(checkout(store, "order-4", false).await.is_err());
    let reordered = Task::new("checkout")
        .call("order-4")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().expect("inside a task");
            ctx.step(("mail", "ada"), async { Ok::<_, Error>(()) })
                .await
        })
        .await;
    assert!(
        matches!(reordered, Err(Error::Step { .. })),
        "{reordered:?}"
    );
}

#[tokio::test]
async fn each_step_runs_in_a_span_that_says_whether_it_ran_or_was_replayed() {
    let capture = Capture::default();
    let _guard = capture.install();
    every_step_ending(&MemoryStore::new()).await;
    let row = |step: &str, position: &str, outcome: &str, kind: &str| {
        [step, position, outcome, kind].map(str::to_owned)
    };
    assert_eq!(
        capture.steps(),
        [
            row("charge", "0", "ran", "-"),
            row("mail[ada]", "1", "failed", "-"),
            row("charge", "0", "replayed", "-"),
            row("mail[ada]", "1", "ran", "-"),
            row("charge", "0", "ran", "-"),
            row("mail", "-", "refused", "too_many"),
            row("mail", "-", "refused", "overlapping"),
            row("charge", "0", "ran", "-"),
            row("charge", "0", "ran", "-"),
            row("mail[ada]", "1", "failed", "-"),
            row("mail[ada]", "-", "refused", "order_changed"),
        ]
    );
}

#[tokio::test]
async fn a_call_without_steps_has_no_step_span() {
    let capture = Capture::default();
    let _guard = capture.install();
    Task::new("charge")
        .call("order-1")
        .store(MemoryStore::new())
        .run(async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    assert!(capture.steps().is_empty());
    assert_eq!(capture.spans().len(), 1);
}

/// Run with `cargo test -p idempotask --features metrics --test observe` (scripts/test.sh does):
/// the feature is off in the workspace build so that the other suites run as users build them.
#[cfg(feature = "metrics")]
mod metrics_counts {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    /// A recorded metric: name, labels, value.
    type Metric = (String, Vec<(String, String)>, DebugValue);

    fn counter(snapshot: &[Metric], name: &str, labels: &[(&str, &str)]) -> u64 {
        snapshot
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, value)| match value {
                DebugValue::Counter(count) => *count,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    fn snapshot_of(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<Metric> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let labels = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                (key.name().to_owned(), labels, value)
            })
            .collect()
    }

    /// A held unit is counted as overdue, with an `ERROR`, only once it has been held for the
    /// task's `hold_alert_after`; before, it is the `WARN` of every unit in doubt.
    #[tokio::test(start_paused = true)]
    async fn a_unit_held_past_hold_alert_after_is_counted_and_logged_as_an_error() {
        use idempotask::InDoubt;
        use idempotask::store::{Fencing, LockToken, Store};

        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _metrics = metrics::set_default_local_recorder(&recorder);
        let capture = Capture::default();
        let _logs = capture.install();
        let store = MemoryStore::new();
        let ttl = Duration::from_millis(100);
        let unit = UnitOfWork::new("transfer", "t-1").unwrap();
        // A delivery that took the lock and died: its lock runs out and is remembered.
        let dead = LockToken::generate().with_doubt_memory(Duration::from_secs(24 * 3600));
        store.begin(&unit, &dead, ttl, Fencing::Off).await.unwrap();
        let transfer = Task::new("transfer")
            .in_doubt(InDoubt::Hold)
            .hold_alert_after(Duration::from_secs(3600));
        let deliver = || {
            transfer
                .call("t-1")
                .store(store.clone())
                .run(async { Ok::<_, Error>(()) })
        };
        let overdue = |snapshot: &[Metric]| {
            counter(
                snapshot,
                "idempotask_held_overdue_total",
                &[("task", "transfer")],
            )
        };

        tokio::time::advance(ttl + Duration::from_secs(60)).await;
        assert!(matches!(deliver().await, Err(Error::InDoubt { .. })));
        assert_eq!(overdue(&snapshot_of(&snapshotter)), 0);
        assert!(capture.errors.lock().unwrap().is_empty());

        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(matches!(deliver().await, Err(Error::InDoubt { .. })));
        assert!(matches!(deliver().await, Err(Error::InDoubt { .. })));
        let snapshot = snapshot_of(&snapshotter);
        assert_eq!(overdue(&snapshot), 2, "{snapshot:?}");
        // Counts since the last snapshot, which takes them.
        assert_eq!(
            counter(
                &snapshot,
                "idempotask_in_doubt_total",
                &[("task", "transfer"), ("policy", "hold")]
            ),
            2
        );
        let errors = capture.errors.lock().unwrap();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(field(&errors[0].0, "message").contains("hold_alert_after"));
        assert_eq!(field(&errors[0].0, "key"), "t-1");
    }

    #[tokio::test]
    async fn metrics_count_steps_by_outcome_and_refusals_by_kind() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _guard = metrics::set_default_local_recorder(&recorder);
        every_step_ending(&MemoryStore::new()).await;
        let snapshot = snapshot_of(&snapshotter);
        let steps = |outcome: &str| {
            counter(
                &snapshot,
                "idempotask_steps_total",
                &[("task", "checkout"), ("outcome", outcome)],
            )
        };
        let refused = |kind: &str| {
            counter(
                &snapshot,
                "idempotask_steps_refused_total",
                &[("task", "checkout"), ("kind", kind)],
            )
        };
        assert_eq!(
            ["ran", "replayed", "failed", "refused"].map(steps),
            [5, 1, 2, 3],
            "{snapshot:?}"
        );
        assert_eq!(
            ["too_many", "overlapping", "order_changed", "unsupported"].map(refused),
            [1, 1, 1, 0]
        );
    }

    fn histogram_len(snapshot: &[Metric], name: &str) -> usize {
        snapshot
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, _, value)| match value {
                DebugValue::Histogram(samples) => samples.len(),
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .sum()
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_calls_per_task_and_outcome() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _guard = metrics::set_default_local_recorder(&recorder);
        let store = MemoryStore::new();
        let charge = Task::new("charge");
        // One execution, two replays, one failure, one contended call, one call that waits for
        // the holder of order-3 and gets its result.
        for _ in 0..3 {
            charge
                .call("order-1")
                .store(store.clone())
                .run(async { Ok::<_, Error>(1) })
                .await
                .unwrap();
        }
        let failed: Result<u8, Error> = charge
            .call("order-2")
            .store(store.clone())
            .run(async { Err(Error::NotConfigured) })
            .await;
        assert!(failed.is_err());
        let (started_tx, started_rx) = oneshot::channel();
        let (finish_tx, finish_rx) = oneshot::channel::<()>();
        let holder = charge.call("order-3").store(store.clone()).run(async move {
            started_tx.send(()).unwrap();
            finish_rx.await.unwrap();
            Ok::<_, Error>(3)
        });
        let intruder = async {
            started_rx.await.unwrap();
            let result: Result<u8, Error> = Task::new("charge")
                .retry(RetryPolicy::no_wait())
                .call("order-3")
                .store(store.clone())
                .run(async { Ok(4) })
                .await;
            // Polled first, the waiter finds the unit busy before the holder is let go.
            let waiter = charge
                .call("order-3")
                .store(store.clone())
                .run(async { Ok::<u8, Error>(5) });
            let (replayed, ()) = tokio::join!(waiter, async { finish_tx.send(()).unwrap() });
            (result, replayed)
        };
        let (held, (contended, after_waiting)) = tokio::join!(holder, intruder);
        assert_eq!(held.unwrap(), 3);
        assert!(matches!(contended, Err(Error::Contended { .. })));
        assert_eq!(after_waiting.unwrap(), 3);
        // A renewing task whose body runs for 350 ms of paused time: renewals at 100, 200 and
        // 300 ms.
        Task::new("report")
            .lock_ttl(Duration::from_millis(300))
            .renew(true)
            .call("2026-11")
            .store(store.clone())
            .run(async {
                tokio::time::sleep(Duration::from_millis(350)).await;
                Ok::<_, Error>(())
            })
            .await
            .unwrap();

        let snapshot = snapshot_of(&snapshotter);
        let calls = |outcome: &str| {
            counter(
                &snapshot,
                "idempotask_calls_total",
                &[("task", "charge"), ("outcome", outcome)],
            )
        };
        assert_eq!(calls("executed"), 2, "{snapshot:?}"); // order-1 and the holder of order-3
        assert_eq!(calls("replayed"), 3);
        assert_eq!(calls("failed"), 1);
        assert_eq!(
            counter(
                &snapshot,
                "idempotask_lock_waits_total",
                &[("task", "charge")]
            ),
            1,
            "{snapshot:?}"
        );
        assert_eq!(calls("contended"), 1);
        assert_eq!(calls("lock_lost"), 0);
        assert_eq!(
            counter(&snapshot, "idempotask_calls_total", &[("task", "report")]),
            1
        );
        assert_eq!(
            counter(
                &snapshot,
                "idempotask_lock_renewals_total",
                &[("task", "report"), ("result", "renewed")]
            ),
            3
        );
        // Every call waited for the lock once; every body that ran was timed.
        assert_eq!(histogram_len(&snapshot, "idempotask_lock_wait_seconds"), 8);
        assert_eq!(
            histogram_len(&snapshot, "idempotask_body_duration_seconds"),
            4
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_near_its_lock_ttl_is_warned_about_once_and_a_renewed_one_is_not() {
    let capture = Capture::default();
    let _guard = capture.install();
    let ttl = Duration::from_secs(10);
    let body = |took: Duration| async move {
        tokio::time::sleep(took).await;
        Ok::<_, Error>(())
    };
    let store = MemoryStore::new();
    let task = Task::new("export").lock_ttl(ttl);
    task.call("70%")
        .store(store.clone())
        .run(body(ttl * 7 / 10))
        .await
        .unwrap();
    assert!(
        capture.warnings.lock().unwrap().is_empty(),
        "70 % is no warning"
    );
    task.call("90%")
        .store(store.clone())
        .run(body(ttl * 9 / 10))
        .await
        .unwrap();
    task.clone()
        .renew(true)
        .call("renewed")
        .store(store.clone())
        .run(body(ttl * 2))
        .await
        .unwrap();
    let warnings = capture.warnings.lock().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(field(&warnings[0].0, "message").contains("more than 80 %"));
    assert_eq!(field(&warnings[0].0, "key"), "90%");
}
