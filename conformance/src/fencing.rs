//! What a store's fencing counter and releases must do at their edges: a burst of grants
//! faster than the clock, and a release by a caller that never learned its fencing token.

use std::time::Duration;

use idempotask::store::LockToken;
use idempotask::store::{Begin, Fencing, SharedStore, Store};

use super::{LONG, acquire_fenced, fence, outlive, unit};

/// Checks that fencing tokens stay increasing after a burst of grants (a poison message failing
/// fast) is followed by a lock that expires instead of being released.
///
/// A counter that takes the clock in milliseconds as its floor runs ahead of it under more than
/// one grant per millisecond; the lead lives only as long as the key, and once a lock expires
/// with it the next grant starts again from the clock, below the tokens already handed out.
///
/// # Panics
/// When the store does not.
#[doc = example!(fencing_tokens_never_go_back_after_a_burst_and_an_expiry)]
pub async fn fencing_tokens_never_go_back_after_a_burst_and_an_expiry(store: SharedStore) {
    let unit = unit("burst");
    let short = Duration::from_millis(100);
    let mut highest = 0;
    for grant in 0..1000 {
        let token = acquire_fenced(&store, &unit, &LockToken::generate(), LONG).await;
        assert!(
            fence(&token) > highest,
            "grant {grant}: {token:?} after {highest}"
        );
        highest = fence(&token);
        assert!(store.release(&unit, &token).await.unwrap());
    }
    // This one is not released: it expires, and with it whatever the key kept.
    let expiring = acquire_fenced(&store, &unit, &LockToken::generate(), short).await;
    assert!(fence(&expiring) > highest);
    outlive(short).await;
    let next = acquire_fenced(&store, &unit, &LockToken::generate(), LONG).await;
    assert!(
        fence(&next) > fence(&expiring),
        "the fencing token went back after an expiry: {} after {}",
        fence(&next),
        fence(&expiring)
    );
}

/// Checks that the holder's token alone releases a fenced lock: a caller whose grant's reply
/// was lost never learned the fencing token, and its clean-up must not leave the unit locked for
/// the whole TTL.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_release_without_the_fencing_token_frees_the_lock)]
pub async fn a_release_without_the_fencing_token_frees_the_lock(store: SharedStore) {
    let unit = unit("release-unconfirmed");
    let token = LockToken::generate();
    let granted = acquire_fenced(&store, &unit, &token, LONG).await;
    assert!(
        store.release(&unit, &token).await.unwrap(),
        "a release by the holder's token without its fencing token was refused"
    );
    let seen = store.inspect(&unit).await.unwrap();
    assert!(!seen.is_locked(), "{seen:?}");
    // The counter goes on: a task without fencing that takes the unit next gets one anyway,
    // and releases it the same way.
    let plain = LockToken::generate();
    let next = match store
        .begin(&unit, &plain, LONG, Fencing::Off)
        .await
        .unwrap()
    {
        Begin::Acquired {
            fencing_token: Some(next),
            ..
        } => next,
        other => panic!("expected the lock with the counter going on, got {other:?}"),
    };
    assert!(next > fence(&granted));
    assert!(store.release(&unit, &plain).await.unwrap());
    // Another holder's token still releases nothing.
    let holder = acquire_fenced(&store, &unit, &LockToken::generate(), LONG).await;
    assert!(!store.release(&unit, &LockToken::generate()).await.unwrap());
    assert!(store.inspect(&unit).await.unwrap().is_locked());
    assert!(store.release(&unit, &holder).await.unwrap());
}
