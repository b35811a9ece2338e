//! `log_key = "hash"` is one decision for every output: a task whose keys hold personal data
//! goes through every failure path that names its key, and the plain key appears in none of
//! the errors' `Display` or `Debug`, nor in any span or event, while `CallerKey::as_str` still
//! gives it to code that asks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotask::store::{Fencing, LockToken, Store, UnitOfWork};
use idempotask::{CallerKey, CodecErrorKind, Error, KeyLogging, MemoryStore, RetryPolicy, Task};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, Registry};

const KEY: &str = "jane.doe@example.com";
const OTHER_KEY: &str = "john.roe@example.com";
const LONG: Duration = Duration::from_secs(30);

/// Every field of every span and event, as text.
#[derive(Clone, Default)]
struct Everything(Arc<Mutex<Vec<String>>>);

struct Text<'a>(&'a mut Vec<String>);

impl Visit for Text<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={value:?}", field.name()));
    }
}

impl<S: Subscriber> Layer<S> for Everything {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        attrs.record(&mut Text(&mut self.0.lock().unwrap()));
    }
    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        values.record(&mut Text(&mut self.0.lock().unwrap()));
    }
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        event.record(&mut Text(&mut self.0.lock().unwrap()));
    }
}

fn hashed(name: &'static str) -> Task {
    Task::new(name)
        .log_key(KeyLogging::Hash)
        .retry(RetryPolicy::no_wait())
}

/// The error's keys are hidden from its `Display` and `Debug` and there for `as_str`.
fn assert_private(err: &Error, keys: &[&CallerKey]) {
    let shown = format!("{err} / {err:?}");
    assert!(!shown.contains("example.com"), "{shown}");
    for key in keys {
        assert!(key.is_hidden());
        assert!(key.as_str().ends_with("@example.com"));
    }
}

/// A marker written for `key` by a task named `task` in a store of its own.
async fn marker_of(task: &Task, key: &str) -> Vec<u8> {
    let store = MemoryStore::new();
    let _: u32 = task
        .call(key)
        .store(store.clone())
        .run(async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let unit = UnitOfWork::new(task.name(), key).unwrap();
    store.inspect(&unit).await.unwrap().marker.unwrap()
}

/// Stores `marker` as `unit`'s, as if a delivery had written it.
async fn plant(store: &MemoryStore, unit: &UnitOfWork, marker: &[u8]) {
    let token = LockToken::generate();
    store.begin(unit, &token, LONG, Fencing::Off).await.unwrap();
    store.finish(unit, &token, marker, LONG).await.unwrap();
}

fn unit(task: &Task) -> UnitOfWork {
    UnitOfWork::new(task.name(), KEY).unwrap()
}

/// Another delivery holds the lock.
async fn contended() -> Error {
    let task = hashed("privacy_contended");
    let store = MemoryStore::new();
    store
        .begin(&unit(&task), &LockToken::generate(), LONG, Fencing::Off)
        .await
        .unwrap();
    task.call(KEY)
        .store(store)
        .run(async { Ok::<u32, Error>(1) })
        .await
        .unwrap_err()
}

/// The same key with other arguments.
async fn key_reuse() -> Error {
    let task = hashed("privacy_reuse");
    let store = MemoryStore::new();
    let call = |amount: u32| {
        task.call(KEY)
            .fingerprint_of(&amount)
            .unwrap()
            .store(store.clone())
            .run(async move { Ok::<u32, Error>(amount) })
    };
    call(100).await.unwrap();
    call(200).await.unwrap_err()
}

/// Each kind of codec error: a result of another type, one JSON cannot hold, an unreadable
/// marker (through a call and through `status`), arguments that cannot be fingerprinted.
async fn codecs() -> Vec<(Error, CodecErrorKind)> {
    let task = hashed("privacy_undecodable");
    let store = MemoryStore::new();
    let _: String = task
        .call(KEY)
        .store(store.clone())
        .run(async { Ok::<_, Error>("ch_1".to_owned()) })
        .await
        .unwrap();
    let undecodable = task
        .call(KEY)
        .store(store)
        .run(async { Ok::<u32, Error>(1) })
        .await
        .unwrap_err();
    let task = hashed("privacy_unstorable");
    let store = MemoryStore::new();
    let _: f64 = task
        .call(KEY)
        .store(store.clone())
        .run(async { Ok::<_, Error>(f64::NAN) })
        .await
        .unwrap();
    let unstorable = task
        .call(KEY)
        .store(store)
        .run(async { Ok::<f64, Error>(1.0) })
        .await
        .unwrap_err();
    let task = hashed("privacy_unreadable");
    let store = MemoryStore::new();
    plant(&store, &unit(&task), b"D not a marker").await;
    let unreadable = task
        .call(KEY)
        .store(store.clone())
        .run(async { Ok::<u32, Error>(1) })
        .await
        .unwrap_err();
    let status = task.status(KEY, &store).await.unwrap_err();
    let unfingerprintable = hashed("privacy_fingerprint")
        .call(KEY)
        .fingerprint_of(&HashMap::from([((1_u8, 2_u8), 3_u8)]))
        .unwrap_err();
    vec![
        (undecodable, CodecErrorKind::Undecodable),
        (unstorable, CodecErrorKind::Unstorable),
        (unreadable, CodecErrorKind::Unreadable),
        (status, CodecErrorKind::Unreadable),
        (unfingerprintable, CodecErrorKind::Fingerprint),
    ]
}

/// The unit holds a marker written for another key, seen by a call and by `status`.
async fn mismatches() -> [Error; 2] {
    let task = hashed("privacy_mismatch");
    let store = MemoryStore::new();
    plant(&store, &unit(&task), &marker_of(&task, OTHER_KEY).await).await;
    let call = task
        .call(KEY)
        .store(store.clone())
        .run(async { Ok::<u32, Error>(1) })
        .await
        .unwrap_err();
    [call, task.status(KEY, &store).await.unwrap_err()]
}

/// The body calls its own unit.
async fn reentered() -> Error {
    let task = hashed("privacy_reentered");
    let store = MemoryStore::new();
    let inner = Mutex::new(None);
    let outer = task.call(KEY).store(store.clone()).run(async {
        let nested = task
            .call(KEY)
            .store(store.clone())
            .run(async { Ok::<u32, Error>(2) })
            .await;
        *inner.lock().unwrap() = Some(nested);
        Ok::<u32, Error>(1)
    });
    Box::pin(outer).await.unwrap();
    inner.into_inner().unwrap().unwrap().unwrap_err()
}

/// A step named with a key part (a recipient) whose order changed on a rerun: the error names
/// both the recorded step and the one called.
async fn reordered_step() -> Error {
    let task = hashed("privacy_steps");
    let store = MemoryStore::new();
    let run = |part: &'static str, fail: bool| {
        task.call(KEY).store(store.clone()).run(async move {
            let ctx = idempotask::context().unwrap();
            ctx.step(("mail", part), async { Ok::<_, Error>(1_u32) })
                .await?;
            if fail {
                return Err(Error::NotConfigured);
            }
            Ok(0_u32)
        })
    };
    run(KEY, true).await.unwrap_err();
    run(OTHER_KEY, false).await.unwrap_err()
}

#[tokio::test]
async fn no_error_span_or_event_shows_a_hashed_key() {
    let captured = Everything::default();
    let _guard = tracing::subscriber::set_default(Registry::default().with(captured.clone()));
    let mut seen = 0;

    let err = contended().await;
    let Error::Contended { key, .. } = &err else {
        panic!("{err:?}")
    };
    assert_private(&err, &[key]);
    seen += 1;

    let err = key_reuse().await;
    let Error::KeyReuse { key, .. } = &err else {
        panic!("{err:?}")
    };
    assert_private(&err, &[key]);
    seen += 1;

    for (err, kind) in codecs().await {
        let Error::Codec {
            key, kind: found, ..
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(*found, kind);
        assert_private(&err, &[key]);
        seen += 1;
    }

    // Both keys hidden: the caller's and the one the stored marker names.
    for err in mismatches().await {
        let Error::MarkerKeyMismatch {
            key, stored_key, ..
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(stored_key.as_str(), OTHER_KEY);
        assert_private(&err, &[key, stored_key]);
        seen += 1;
    }

    let err = reentered().await;
    let Error::Reentered { key, .. } = &err else {
        panic!("{err:?}")
    };
    assert_private(&err, &[key]);
    seen += 1;

    let err = reordered_step().await;
    let Error::Step { key, .. } = &err else {
        panic!("{err:?}")
    };
    assert_private(&err, &[key]);
    seen += 1;

    assert_eq!(seen, 11, "every path that names a key was taken");
    let everything = captured.0.lock().unwrap();
    assert!(everything.len() > 20, "{everything:?}");
    let leaks: Vec<_> = everything
        .iter()
        .filter(|text| text.contains("example.com"))
        .collect();
    assert!(leaks.is_empty(), "{leaks:?}");
}

#[tokio::test]
async fn plain_key_logging_shows_the_key_as_it_is() {
    // Every test of this binary runs under a subscriber of its own: tracing caches whether a
    // callsite is enabled process-wide, and a callsite first reached on a thread with no
    // subscriber could stay disabled for the other test's spans.
    let captured = Everything::default();
    let _guard = tracing::subscriber::set_default(Registry::default().with(captured.clone()));
    let task = Task::new("privacy_plain").retry(RetryPolicy::no_wait());
    let store = MemoryStore::new();
    let unit = UnitOfWork::new(task.name(), KEY).unwrap();
    store
        .begin(&unit, &LockToken::generate(), LONG, Fencing::Off)
        .await
        .unwrap();
    let err = task
        .call(KEY)
        .store(store)
        .run(async { Ok::<u32, Error>(1) })
        .await
        .unwrap_err();
    let Error::Contended { key, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(!key.is_hidden());
    assert!(err.to_string().contains(KEY), "{err}");
}
