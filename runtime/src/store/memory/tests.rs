use super::*;

#[test]
fn fencing_tokens_follow_the_clock_and_never_go_back() {
    let first = next_fencing_token(0);
    assert!(
        first > unix_micros() - 1_000_000,
        "{first} is not the clock in µs"
    );
    let mut last = first;
    for _ in 0..10_000 {
        let next = next_fencing_token(0);
        assert!(next > last);
        last = next;
    }
    // A unit's own counter ahead of the clock is honoured too.
    let ahead = last + 60_000_000;
    assert_eq!(next_fencing_token(ahead), ahead + 1);
}

#[tokio::test(start_paused = true)]
async fn entries_expire_and_are_swept() {
    let store = MemoryStore::new();
    let ttl = Duration::from_secs(1);
    for key in 0..1000 {
        let unit = UnitOfWork::new("t", key.to_string()).unwrap();
        store
            .begin(&unit, &LockToken::generate(), ttl, Fencing::Off)
            .await
            .unwrap();
    }
    let kept = UnitOfWork::new("t", "kept").unwrap();
    store
        .begin(
            &kept,
            &LockToken::generate(),
            Duration::from_secs(60),
            Fencing::Off,
        )
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(3)).await;
    let other = UnitOfWork::new("t", "other").unwrap();
    // Each operation sweeps a bounded number: enough of them sweep all.
    for _ in 0..1000 / SWEEP_BUDGET + 2 {
        store.inspect(&other).await.unwrap();
    }
    let state = store.state.lock().unwrap();
    assert_eq!(state.units.len(), 1, "the expired units are still held");
    assert!(state.units.keys().any(|unit| unit.key() == "kept"));
}

#[tokio::test(start_paused = true)]
async fn memory_comes_back_after_a_fill_expires() {
    let store = MemoryStore::new();
    for key in 0..20_000 {
        let unit = UnitOfWork::new("t", key.to_string()).unwrap();
        store
            .begin(
                &unit,
                &LockToken::generate(),
                Duration::from_secs(1),
                Fencing::Off,
            )
            .await
            .unwrap();
    }
    let full = store.state.lock().unwrap().units.capacity();
    tokio::time::advance(Duration::from_secs(3)).await;
    let other = UnitOfWork::new("t", "other").unwrap();
    for _ in 0..2 * SHRINK_EVERY {
        store.inspect(&other).await.unwrap();
    }
    let state = store.state.lock().unwrap();
    assert_eq!(state.units.len(), 0);
    assert!(
        state.units.capacity() * 8 < full,
        "capacity {} after the fill expired, {full} full",
        state.units.capacity()
    );
    assert!(
        state.expiries.is_empty(),
        "{} seconds still listed",
        state.expiries.len()
    );
}

#[tokio::test(start_paused = true)]
async fn an_entry_whose_expiry_moved_is_not_swept_at_its_old_one() {
    let store = MemoryStore::new();
    let unit = UnitOfWork::new("t", "renewed").unwrap();
    let token = LockToken::generate();
    store
        .begin(&unit, &token, Duration::from_secs(1), Fencing::Off)
        .await
        .unwrap();
    assert!(
        store
            .renew(&unit, &token, Duration::from_secs(60))
            .await
            .unwrap()
    );
    tokio::time::advance(Duration::from_secs(3)).await;
    let other = UnitOfWork::new("t", "other").unwrap();
    for _ in 0..4 {
        store.inspect(&other).await.unwrap();
    }
    assert!(store.inspect(&unit).await.unwrap().is_locked());
}
