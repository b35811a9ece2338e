//! Batches on `PostgresStore`: what one statement for many units must not change.

use idempotask::store::{Claim, Completion};

use super::*;

/// Three units of task `pg_write`, the middle one `held`, with a token each.
fn three_units(held: &str) -> ([UnitOfWork; 3], [LockToken; 3]) {
    let unit = |key: &str| UnitOfWork::new("pg_write", key).unwrap();
    (
        [unit("batched-free-1"), unit(held), unit("batched-free-2")],
        std::array::from_fn(|_| LockToken::generate()),
    )
}

/// A batch with a unit whose row a transaction holds uncommitted: the batch statement's wait
/// on that row runs out in the server, and the other units of the batch are still taken (each
/// asked alone); the held unit's answer is its own timeout, which says nothing was taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn one_units_row_lock_wait_never_fails_the_rest_of_its_batch() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let bounded = PostgresStore::builder(pool.clone())
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let held = HeldDelivery::start(&store, "write-batched").await;
    let (units, tokens) = three_units("write-batched");
    let claims: Vec<_> = units
        .iter()
        .zip(&tokens)
        .map(|(u, t)| Claim::new(u, t))
        .collect();

    let answers = bounded
        .begin_batch(&claims, Duration::from_secs(30), Fencing::On)
        .await;
    assert_eq!(answers.len(), 3);
    let mut granted = tokens.clone();
    for at in [0, 2] {
        match &answers[at] {
            Ok(Begin::Acquired {
                fencing_token: Some(fence),
                ..
            }) => granted[at] = tokens[at].clone().with_fencing_token(*fence),
            other => panic!("unit {at}: expected the lock, got {other:?}"),
        }
    }
    match &answers[1] {
        Err(err) => {
            assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
            assert!(!err.is_ambiguous(), "{err}");
        }
        other => panic!("the held unit: expected its own timeout, got {other:?}"),
    }
    assert_eq!(held.resume(Ok(1)).await.unwrap(), 1);
    assert_eq!(effects(&pool, "write-batched").await, 1);

    // The taken units finish together; the held unit, never granted, is told it holds nothing.
    let markers = [b"one".as_slice(), b"two", b"three"];
    let completions: Vec<_> = (0..3)
        .map(|at| Completion::new(&units[at], &granted[at], markers[at]))
        .collect();
    let finished = bounded
        .finish_batch(&completions, Duration::from_secs(60))
        .await;
    assert!(
        matches!(finished[0], Ok(Finish::Completed)),
        "{:?}",
        finished[0]
    );
    assert!(
        matches!(finished[2], Ok(Finish::Completed)),
        "{:?}",
        finished[2]
    );
    assert!(
        matches!(finished[1], Ok(Finish::LockLost { .. })),
        "{:?}",
        finished[1]
    );
    for at in [0, 2] {
        let seen = store.inspect(&units[at]).await.unwrap();
        assert_eq!(seen.marker.as_deref(), Some(markers[at]), "unit {at}");
    }
}
