//! The contract of [`Operator`]: what an operator's tool reads of a store matches what the
//! store's deliveries wrote, its actions touch only what it was shown, and its listing finds
//! every unit, page by page.

use std::collections::BTreeMap;
use std::time::Duration;

use idempotask::operator::{
    Cursor, Forgot, Held, Listed, Marker, Operator, Page, Resolution, Resolved, SharedOperator,
    Stats,
};
use idempotask::store::{
    Begin, Fencing, Finish, LockToken, StepEntry, Store, StoreErrorKind, UnitOfWork,
};
use serde_json::value::to_raw_value;

use super::operator_steps;
use super::{DAY, LONG, outlive};

/// The lock TTL of a delivery that is left to run out.
const SHORT: Duration = Duration::from_millis(150);

/// How many pages a listing may take before the check calls it endless.
const MAX_PAGES: usize = 100_000;

/// Checks the contract of [`Operator`] on a store that is also the [`Store`] its deliveries
/// use, directly and through a [`SharedOperator`]: each state a delivery leaves reads back as
/// its [`Held`], `forget_exact` and `resolve_exact` act only on exactly what was shown, a
/// listing walked page by page (one key at a time, and a thousand) finds every unit of its task
/// and no other, `stats` and `task_exists` agree with it, and cursors the store did not make
/// never panic. Its units belong to tasks named `operator-…`: give it a store where those
/// names are free.
///
/// The store must remember locks that ran out ([`LockToken::with_doubt_memory`]); the check
/// waits out lock TTLs of 150 ms, so it takes a few seconds.
///
/// ```no_run
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
/// idempotask_conformance::check_operator(idempotask::MemoryStore::new()).await;
/// # }
/// ```
///
/// # Panics
/// When the store breaks the contract, with what it answered.
pub async fn check_operator<S: Store + Operator + Clone>(store: S) {
    let shared = SharedOperator::new(store.clone());
    assert_eq!(
        shared.scope(),
        store.scope(),
        "a shared operator must answer as the store does"
    );
    assert_eq!(
        store.scope().max_key_len,
        Store::max_key_len(&store),
        "the scope takes the keys the store takes"
    );
    let too_long = "k".repeat(store.scope().max_key_len + 1);
    assert!(store.scope().unit("operator-life", too_long).is_err());
    reads_follow_a_unit_through_its_life(&store).await;
    forget_exact_deletes_only_what_was_shown(&store, &shared).await;
    resolve_exact_settles_only_the_lock_in_doubt_shown(&store, &shared).await;
    if store.records_steps() {
        operator_steps::a_held_step_is_resolved_with_its_value(&store).await;
        operator_steps::a_body_whose_steps_changed_order_is_held(&store).await;
        operator_steps::a_changed_order_hold_is_freed_with_its_steps(&store).await;
    } else {
        a_store_without_steps_refuses_to_record_one(&store).await;
    }
    a_listing_finds_every_unit_of_its_task(&store, &shared).await;
    cursors_the_store_did_not_make_never_panic(&store).await;
}

/// Whether `left` is what is left of `full`, set a moment ago (within a busy machine's 20 s).
fn nearly(full: Duration, left: Duration) -> bool {
    left <= full && left + Duration::from_secs(20) > full
}

/// A real marker for `unit`, with `fencing_token`, whose result is `result`.
fn marker_of(unit: &UnitOfWork, fencing_token: Option<u64>, result: &str) -> Vec<u8> {
    let result = to_raw_value(result).unwrap();
    Marker::encode_resolution(unit, fencing_token, &result)
}

/// Takes `unit`'s lock for `ttl` with a token remembered for a day after it runs out; answers
/// the token as granted.
async fn take(store: &impl Store, unit: &UnitOfWork, ttl: Duration) -> LockToken {
    let token = LockToken::generate().with_doubt_memory(DAY);
    match store.begin(unit, &token, ttl, Fencing::On).await.unwrap() {
        Begin::Acquired {
            fencing_token: Some(fence),
            in_doubt: None,
            ..
        } => token.with_fencing_token(fence),
        other => panic!("expected the fenced lock of a free unit, got {other:?}"),
    }
}

/// Marks `unit` done as its delivery does; answers the marker's bytes.
async fn complete(store: &impl Store, unit: &UnitOfWork, result: &str) -> Vec<u8> {
    let token = take(store, unit, LONG).await;
    let marker = marker_of(unit, token.fencing_token(), result);
    let finished = store.finish(unit, &token, &marker, DAY).await.unwrap();
    assert_eq!(finished, Finish::Completed);
    marker
}

/// Leaves each of `units` in doubt; answers the lock bytes an operator is shown of each.
async fn leave_in_doubt(
    store: &(impl Store + Operator),
    units: &[&UnitOfWork],
) -> Vec<(Vec<u8>, Option<u64>)> {
    let mut tokens = Vec::new();
    for unit in units {
        tokens.push(take(store, unit, SHORT).await);
    }
    outlive(SHORT).await;
    let mut shown = Vec::new();
    for (unit, token) in units.iter().zip(&tokens) {
        match store.read(unit).await.unwrap() {
            Held::InDoubt {
                bytes,
                fencing_token,
                expired_for,
                forgotten_in,
                ..
            } => {
                assert_eq!(fencing_token, token.fencing_token());
                assert!(
                    expired_for > Duration::ZERO && expired_for < Duration::from_secs(20),
                    "ran out {expired_for:?} ago, on another clock?"
                );
                assert!(
                    nearly(DAY, forgotten_in),
                    "remembered for {forgotten_in:?} more"
                );
                shown.push((bytes, fencing_token));
            }
            other => panic!("a lock that ran out must read as in doubt, got {other:?}"),
        }
    }
    shown
}

async fn reads_follow_a_unit_through_its_life(store: &(impl Store + Operator + Clone)) {
    let unit = store.scope().unit("operator-life", "order-1").unwrap();
    let held = store.read(&unit).await.unwrap();
    assert!(matches!(held, Held::Nothing), "a fresh unit: {held:?}");

    let token = take(store, &unit, LONG).await;
    match store.read(&unit).await.unwrap() {
        Held::Lock {
            fencing_token,
            lock_ttl_remaining: Some(left),
            ..
        } => {
            assert_eq!(fencing_token, token.fencing_token());
            assert!(nearly(LONG, left), "{left:?} left");
        }
        other => panic!("a held lock must read as one, with its TTL: {other:?}"),
    }

    journals_read_as_the_store_keeps_them(store, &unit, &token).await;

    let marker = marker_of(&unit, token.fencing_token(), "7");
    let finished = store.finish(&unit, &token, &marker, DAY).await.unwrap();
    assert_eq!(finished, Finish::Completed);
    match store.read(&unit).await.unwrap() {
        Held::Marker {
            bytes,
            ttl: Some(ttl),
            marker: Ok(read),
            ..
        } => {
            assert_eq!(bytes, marker, "the bytes shown are the bytes stored");
            assert_eq!(read.key(), unit.key());
            assert_eq!(read.fencing_token(), token.fencing_token());
            assert!(nearly(DAY, ttl), "{ttl:?} left");
        }
        other => panic!("a finished unit must read as its marker: {other:?}"),
    }
    assert!(!store.location(&unit).is_empty());
}

/// Records a step of `unit`, held by `token`, where the store records steps; the journal an
/// operator reads, directly and shared, is the one a delivery reads. A store that keeps no
/// journal, or whose operator does not read it yet, answers an error of kind
/// `Configuration` (the provided [`Operator::journal`]), never a journal it does not keep.
async fn journals_read_as_the_store_keeps_them(
    store: &(impl Store + Operator + Clone),
    unit: &UnitOfWork,
    token: &LockToken,
) {
    let shared = SharedOperator::new(store.clone());
    if store.records_steps() {
        let entry = StepEntry::new(0, br#"{"step":"charge","ok":7}"#, DAY);
        assert!(store.record_step(unit, token, entry, LONG).await.unwrap());
    }
    for read in [store.journal(unit).await, shared.journal(unit).await] {
        match read {
            Ok(journal) => {
                assert!(
                    store.records_steps(),
                    "a journal from a store without steps"
                );
                assert_eq!(
                    journal,
                    store.read_journal(unit).await.unwrap(),
                    "an operator reads the journal a delivery replays"
                );
                assert_eq!(journal.len(), 1, "{journal:?}");
            }
            Err(err) => assert_eq!(
                err.kind(),
                StoreErrorKind::Configuration,
                "a journal that cannot be read says why: {err}"
            ),
        }
    }
}

async fn forget_exact_deletes_only_what_was_shown(
    store: &(impl Store + Operator),
    shared: &SharedOperator,
) {
    let unit = store.scope().unit("operator-forget", "order-1").unwrap();
    let marker = complete(store, &unit, "1").await;
    let fence = Marker::decode(&marker).unwrap().fencing_token().unwrap();
    let other = marker_of(&unit, Some(fence), "2");
    assert_eq!(
        shared.forget_exact(&unit, &other).await.unwrap(),
        Forgot::Changed,
        "another marker than the one stored must be left alone"
    );
    assert!(matches!(
        store.read(&unit).await.unwrap(),
        Held::Marker { .. }
    ));
    assert_eq!(
        shared.forget_exact(&unit, &marker).await.unwrap(),
        Forgot::Deleted
    );
    assert!(matches!(store.read(&unit).await.unwrap(), Held::Nothing));
    assert_eq!(
        store.forget_exact(&unit, &marker).await.unwrap(),
        Forgot::Gone
    );
    // The fencing counter stays: the next grant is still higher.
    let next = take(store, &unit, LONG).await;
    assert!(next.fencing_token().unwrap() > fence);

    // A held lock is never deleted, whatever it is shown.
    assert_eq!(
        store.forget_exact(&unit, &marker).await.unwrap(),
        Forgot::Changed
    );
    assert!(matches!(
        store.read(&unit).await.unwrap(),
        Held::Lock { .. }
    ));

    // A unit forgotten on purpose runs its steps again, however long its journal is kept.
    if store.records_steps() {
        let unit = store.scope().unit("operator-forget", "steps").unwrap();
        let token = take(store, &unit, LONG).await;
        let entry = StepEntry::new(0, b"step", DAY);
        assert!(store.record_step(&unit, &token, entry, LONG).await.unwrap());
        let marker = marker_of(&unit, token.fencing_token(), "3");
        let finished = store.finish(&unit, &token, &marker, DAY).await.unwrap();
        assert_eq!(finished, Finish::Completed);
        let forgot = shared.forget_exact(&unit, &marker).await.unwrap();
        assert_eq!(forgot, Forgot::Deleted);
        take(store, &unit, LONG).await;
        let journal = store.read_journal(&unit).await.unwrap();
        assert!(
            journal.is_empty(),
            "a forgotten unit replays its last run's steps: {journal:?}"
        );
    }
}

async fn resolve_exact_settles_only_the_lock_in_doubt_shown(
    store: &(impl Store + Operator),
    shared: &SharedOperator,
) {
    let recorded = store.scope().unit("operator-doubt", "order-1").unwrap();
    let freed = store.scope().unit("operator-doubt", "order-2").unwrap();
    let shown = leave_in_doubt(store, &[&recorded, &freed]).await;
    let (bytes, fence) = &shown[0];
    let result = Resolution::record(marker_of(&recorded, *fence, "42"), DAY);

    let wrong = [bytes.as_slice(), b"x"].concat();
    assert_eq!(
        shared
            .resolve_exact(&recorded, &wrong, &Resolution::Free)
            .await
            .unwrap(),
        Resolved::Changed,
        "another lock than the one shown must be left alone"
    );
    let foreign = Resolution::record(marker_of(&freed, *fence, "42"), DAY);
    let refused = store.resolve_exact(&recorded, bytes, &foreign).await;
    assert!(
        matches!(&refused, Err(err) if err.kind() == StoreErrorKind::Configuration),
        "a marker written for another key must be refused: {refused:?}"
    );
    assert!(matches!(
        store.read(&recorded).await.unwrap(),
        Held::InDoubt { .. }
    ));

    assert_eq!(
        shared
            .resolve_exact(&recorded, bytes, &result)
            .await
            .unwrap(),
        Resolved::Recorded
    );
    match store.read(&recorded).await.unwrap() {
        Held::Marker {
            marker: Ok(marker),
            ttl: Some(ttl),
            ..
        } => {
            assert_eq!(marker.key(), recorded.key());
            assert!(nearly(DAY, ttl), "{ttl:?} left");
        }
        other => panic!("a recorded unit must read as done: {other:?}"),
    }
    assert_eq!(
        store
            .resolve_exact(&recorded, bytes, &result)
            .await
            .unwrap(),
        Resolved::Changed,
        "a unit done since must be left alone"
    );

    let (bytes, _) = &shown[1];
    assert_eq!(
        store
            .resolve_exact(&freed, bytes, &Resolution::Free)
            .await
            .unwrap(),
        Resolved::Freed
    );
    assert!(matches!(store.read(&freed).await.unwrap(), Held::Nothing));
    assert_eq!(
        store
            .resolve_exact(&freed, bytes, &Resolution::Free)
            .await
            .unwrap(),
        Resolved::Gone
    );

    // A lock still held is nobody's to resolve.
    take(store, &freed, LONG).await;
    assert_eq!(
        store
            .resolve_exact(&freed, bytes, &Resolution::Free)
            .await
            .unwrap(),
        Resolved::Changed
    );
}

/// A store that records no steps refuses to resolve a unit with a step's value, and writes
/// nothing.
async fn a_store_without_steps_refuses_to_record_one(store: &(impl Store + Operator)) {
    let unit = store.scope().unit("operator-doubt", "no-steps").unwrap();
    let (bytes, _) = leave_in_doubt(store, &[&unit]).await.remove(0);
    let value = to_raw_value(&1).unwrap();
    let step = Resolution::record_step(idempotask::operator::step_entry("b", None, &value), DAY);
    let refused = store.resolve_exact(&unit, &bytes, &step).await;
    assert!(
        matches!(&refused, Err(err) if err.kind() == StoreErrorKind::Configuration),
        "a store without steps must refuse a step: {refused:?}"
    );
    assert!(matches!(
        store.read(&unit).await.unwrap(),
        Held::InDoubt { .. }
    ));
}

/// What a store holds for one unit, in a word, for comparing listings.
fn state(held: &Held) -> &'static str {
    match held {
        Held::Nothing => "nothing",
        Held::Lock { .. } => "locked",
        Held::InDoubt { .. } => "in doubt",
        Held::Marker { .. } => "done",
        _ => "other",
    }
}

/// Every unit of `task`, by digest, walked with pages of `limit`; and the stats of the walk.
async fn walk(
    operator: &impl Operator,
    task: &str,
    limit: usize,
) -> (BTreeMap<String, Listed>, Stats) {
    let mut units = BTreeMap::new();
    let (mut keys_seen, mut servers_scanned) = (0, 0);
    let mut from: Option<Cursor> = None;
    for _ in 0..MAX_PAGES {
        let page = operator.list(task, from.as_ref(), limit).await.unwrap();
        keys_seen += page.keys_seen;
        servers_scanned += page.servers_scanned;
        for listed in page.units {
            assert_eq!(listed.task, task);
            assert!(
                !matches!(listed.held, Held::Nothing),
                "a page holds only units that hold something: {listed:?}"
            );
            units.insert(listed.digest.clone(), listed);
        }
        if let Some(next) = page.next {
            from = Some(next);
            continue;
        }
        // Each unit once: a listing may answer one twice.
        let mut stats = Stats::default();
        let units_once = units.values().cloned().collect();
        stats.add(&Page::new(units_once, keys_seen, None).with_servers_scanned(servers_scanned));
        return (units, stats);
    }
    panic!("the listing of {task} did not end after {MAX_PAGES} pages of {limit}");
}

async fn a_listing_finds_every_unit_of_its_task(
    store: &(impl Store + Operator),
    shared: &SharedOperator,
) {
    let task = "operator-list";
    let unit = |key: &str| store.scope().unit(task, key).unwrap();
    let (done, locked, doubtful) = (
        ["order-1", "order-2", "order-3"].map(unit),
        ["order-4", "order-5"].map(unit),
        ["order-6", "order-7"].map(unit),
    );
    for unit in &done {
        complete(store, unit, "1").await;
    }
    for unit in &locked {
        take(store, unit, LONG).await;
    }
    leave_in_doubt(store, &[&doubtful[0], &doubtful[1]]).await;
    let elsewhere = store
        .scope()
        .unit("operator-list-other", "order-1")
        .unwrap();
    complete(store, &elsewhere, "1").await;

    let mut expected = BTreeMap::new();
    for (units, word) in [
        (&done[..], "done"),
        (&locked, "locked"),
        (&doubtful, "in doubt"),
    ] {
        for unit in units {
            expected.insert(unit.digest().to_owned(), (unit, word));
        }
    }
    for limit in [1, 1000] {
        let (units, stats) = walk(shared, task, limit).await;
        let found: BTreeMap<&str, &str> = units
            .iter()
            .map(|(digest, listed)| (digest.as_str(), state(&listed.held)))
            .collect();
        let wanted: BTreeMap<&str, &str> = expected
            .iter()
            .map(|(digest, (_, word))| (digest.as_str(), *word))
            .collect();
        assert_eq!(found, wanted, "the listing in pages of {limit}");
        for (digest, listed) in &units {
            let (unit, _) = expected[digest];
            if let Some(known) = listed.unit() {
                assert_eq!(&known, unit, "a listed unit's key is its own");
            }
        }
        assert!(
            listed_done(&units) == 3 && stats.done == 3,
            "done units' markers are their own: {stats:?}"
        );
        assert_eq!((stats.locked, stats.in_doubt, stats.unreadable), (2, 2, 0));
        assert!(
            stats.keys_seen >= 7 && stats.servers_scanned >= 1,
            "{stats:?}"
        );
        let counted = store.stats(task).await.unwrap();
        assert_eq!(
            (
                counted.done,
                counted.locked,
                counted.in_doubt,
                counted.unreadable
            ),
            (stats.done, stats.locked, stats.in_doubt, stats.unreadable),
            "stats count what a listing finds"
        );
        assert!(counted.keys_seen >= 7, "{counted:?}");
    }
    assert!(store.task_exists(task).await.unwrap());
    assert!(shared.task_exists("operator-list-other").await.unwrap());
    assert!(!shared.task_exists("operator-list-none").await.unwrap());
    assert_eq!(
        shared.stats("operator-list-none").await.unwrap().keys_seen,
        0
    );
    let (units, _) = walk(store, "operator-list-none", 1000).await;
    assert!(units.is_empty(), "{units:?}");
    let refused = store.list("no task has/this name", None, 10).await;
    assert!(
        matches!(&refused, Err(err) if err.kind() == StoreErrorKind::Configuration),
        "{refused:?}"
    );
}

fn listed_done(units: &BTreeMap<String, Listed>) -> usize {
    units
        .values()
        .filter(|listed| listed.own_marker().is_some())
        .count()
}

async fn cursors_the_store_did_not_make_never_panic(store: &impl Operator) {
    let long = "9".repeat(4096);
    for text in ["", "-1", "x", "\u{0}", "/0/", "18446744073709551616", &long] {
        // Any answer but a panic: a store that cannot read the cursor refuses it, one whose
        // every text is a cursor lists from there.
        let _ = store
            .list("operator-list", Some(&Cursor::new(text)), 10)
            .await;
    }
}
