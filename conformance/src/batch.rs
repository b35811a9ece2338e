//! What a store answers for a batch: each unit exactly what its single call would.

use std::time::Duration;

use idempotask::store::{Begin, Claim, Completion, Fencing, Finish, SharedStore, Store};
use idempotask::store::{LockToken, UnitOfWork};

use super::{DAY, LONG, acquire, acquire_fenced, fence, marker, outlive, unit};

/// Checks that a batched begin answers each unit as a begin of its own would.
///
/// One batch holds a free unit, a done one, one another holder has, one the caller holds
/// already, and one unit claimed twice by two tokens; then the same with fencing.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_batched_begin_answers_each_unit_as_alone)]
pub async fn a_batched_begin_answers_each_unit_as_alone(store: SharedStore) {
    assert!(
        store.begin_batch(&[], LONG, Fencing::Off).await.is_empty(),
        "an empty batch answers nothing"
    );
    for (fencing, tag) in [(Fencing::Off, "plain"), (Fencing::On, "fenced")] {
        let free = unit(&format!("batch-free-{tag}"));
        let done = unit(&format!("batch-done-{tag}"));
        let busy = unit(&format!("batch-busy-{tag}"));
        let own = unit(&format!("batch-own-{tag}"));
        let twice = unit(&format!("batch-twice-{tag}"));
        let (mine, other, second) = (
            LockToken::generate(),
            LockToken::generate(),
            LockToken::generate(),
        );

        let holder = other.clone();
        acquire(&store, &done, &holder, LONG).await;
        let done_marker = marker(done.key(), None, "done before");
        assert_eq!(
            store
                .finish(&done, &holder, &done_marker, DAY)
                .await
                .unwrap(),
            Finish::Completed
        );
        acquire(&store, &busy, &other, LONG).await;
        let held_before = if fencing == Fencing::On {
            Some(fence(&acquire_fenced(&store, &own, &mine, LONG).await))
        } else {
            acquire(&store, &own, &mine, LONG).await;
            None
        };

        let claims = [
            Claim::new(&free, &mine),
            Claim::new(&done, &mine),
            Claim::new(&busy, &mine),
            Claim::new(&own, &mine),
            Claim::new(&twice, &mine),
            Claim::new(&twice, &second),
        ];
        let answers = store.begin_batch(&claims, LONG, fencing).await;
        assert_eq!(answers.len(), claims.len(), "one answer per claim");
        let mut answers = answers.into_iter().map(|answer| answer.unwrap());
        let granted = |what: &str, answer: Option<Begin>| match answer {
            Some(Begin::Acquired {
                fencing_token,
                in_doubt: None,
                ..
            }) => {
                assert_eq!(
                    fencing_token.is_some(),
                    fencing == Fencing::On,
                    "{what}: a fencing token exactly when one is asked for"
                );
                fencing_token
            }
            other => panic!("{what} ({tag}): expected the lock, got {other:?}"),
        };
        granted("a free unit", answers.next());
        assert_eq!(
            answers.next(),
            Some(Begin::Done(done_marker.clone())),
            "a done unit ({tag}) answers its marker"
        );
        match answers.next() {
            Some(Begin::Busy {
                lock_ttl_remaining: Some(left),
                ..
            }) => assert!(left <= LONG, "{left:?}"),
            other => panic!("another holder's unit ({tag}): expected busy, got {other:?}"),
        }
        let again = granted("the caller's own lock", answers.next());
        assert_eq!(
            again, held_before,
            "a unit the caller holds keeps its fencing token ({tag})"
        );
        granted("the first claim of a unit", answers.next());
        match answers.next() {
            Some(Begin::Busy { .. }) => {}
            other => panic!(
                "the second claim of a unit in one batch ({tag}): expected busy, got {other:?}"
            ),
        }

        // Each grant is a lock of its own: only its holder's token releases it.
        assert!(!store.release(&free, &second).await.unwrap());
        assert!(store.inspect(&free).await.unwrap().is_locked());
        assert!(!store.release(&twice, &second).await.unwrap());
        assert!(store.inspect(&twice).await.unwrap().is_locked());
    }
}

/// Checks that a batched finish answers each unit as a finish of its own would: a held lock
/// completes, a lock that ran out with nobody after it keeps the result as lost, and another
/// holder's unit is left alone.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_batched_finish_answers_each_unit_as_alone)]
pub async fn a_batched_finish_answers_each_unit_as_alone(store: SharedStore) {
    assert!(
        store.finish_batch(&[], DAY).await.is_empty(),
        "an empty batch answers nothing"
    );
    let short = Duration::from_millis(150);
    let held = unit("batch-finish-held");
    let lapsed = unit("batch-finish-lapsed");
    let taken = unit("batch-finish-taken");
    let (mine, successor) = (LockToken::generate(), LockToken::generate());
    let held_token = acquire_fenced(&store, &held, &mine, LONG).await;
    acquire(&store, &lapsed, &mine, short).await;
    acquire(&store, &taken, &mine, short).await;
    outlive(short).await;
    acquire(&store, &taken, &successor, LONG).await;

    let markers = [
        marker(held.key(), Some(fence(&held_token)), "held"),
        marker(lapsed.key(), None, "lapsed"),
        marker(taken.key(), None, "taken"),
    ];
    let completions = [
        Completion::new(&held, &held_token, &markers[0]),
        Completion::new(&lapsed, &mine, &markers[1]),
        Completion::new(&taken, &mine, &markers[2]),
    ];
    let answers: Vec<Finish> = store
        .finish_batch(&completions, DAY)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        answers,
        [
            Finish::Completed,
            Finish::lost_marker_written(),
            Finish::lost_nothing_written(),
        ]
    );
    let seen = store.inspect(&held).await.unwrap();
    assert_eq!(seen.marker.as_deref(), Some(&markers[0][..]));
    assert!(!seen.is_locked());
    assert!(
        store.inspect(&lapsed).await.unwrap().is_done(),
        "a result whose lock ran out with nobody after it is kept"
    );
    let seen = store.inspect(&taken).await.unwrap();
    assert!(
        seen.is_locked() && !seen.is_done(),
        "the successor's lock is untouched"
    );

    // A batch re-sent after its reply was lost answers as the first one did.
    let again = store.finish_batch(&completions[..1], DAY).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].as_ref().unwrap(), &Finish::Completed);
}

/// Checks that a batch of many units answers each one: every unit of a hundred is granted
/// once, and a second batch of the same units with other tokens finds every one busy.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_large_batch_answers_every_unit)]
pub async fn a_large_batch_answers_every_unit(store: SharedStore) {
    let units: Vec<UnitOfWork> = (0..100).map(|i| unit(&format!("batch-many-{i}"))).collect();
    let first: Vec<LockToken> = units.iter().map(|_| LockToken::generate()).collect();
    let claims: Vec<Claim<'_>> = units
        .iter()
        .zip(&first)
        .map(|(unit, token)| Claim::new(unit, token))
        .collect();
    let answers = store.begin_batch(&claims, LONG, Fencing::Off).await;
    assert_eq!(answers.len(), units.len());
    for (unit, answer) in units.iter().zip(answers) {
        assert!(
            matches!(answer, Ok(Begin::Acquired { .. })),
            "{}: {answer:?}",
            unit.key()
        );
    }
    let second: Vec<LockToken> = units.iter().map(|_| LockToken::generate()).collect();
    let claims: Vec<Claim<'_>> = units
        .iter()
        .zip(&second)
        .map(|(unit, token)| Claim::new(unit, token))
        .collect();
    for answer in store.begin_batch(&claims, LONG, Fencing::Off).await {
        assert!(matches!(answer, Ok(Begin::Busy { .. })), "{answer:?}");
    }
    let markers: Vec<Vec<u8>> = units
        .iter()
        .map(|unit| marker(unit.key(), None, "many"))
        .collect();
    let completions: Vec<Completion<'_>> = units
        .iter()
        .zip(&first)
        .zip(&markers)
        .map(|((unit, token), marker)| Completion::new(unit, token, marker))
        .collect();
    for answer in store.finish_batch(&completions, DAY).await {
        assert_eq!(answer.unwrap(), Finish::Completed);
    }
}
