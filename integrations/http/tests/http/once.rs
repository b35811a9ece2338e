//! Each key runs its handler once: concurrent and waiting duplicates, a reused key with another
//! body, a client gone mid-handler, a handler slower than the lock TTL.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) async fn concurrent_duplicates_run_the_handler_once(backend: Backend) {
    let mut server = Server::start(layer(&backend, "http_concurrent"), true).await;
    let mut running = Vec::new();
    for _ in 0..64 {
        let request = server.post("/payments", Some("\"pay-1\""), "42 EUR");
        running.push(tokio::spawn(send(request)));
    }
    // The first request holds the key; let it finish once it has started.
    next(&mut server.signals.started, "the first handler start").await;
    // The gate is closed, so this one meets the held key for certain.
    let held = send(server.post("/payments", Some("\"pay-1\""), "42 EUR")).await;
    assert_eq!(held.status, 409, "{held:?}");
    assert_eq!(held.problem_type(), problem::IN_PROGRESS);
    // The holder's lock has about 30 s left; the wait it advertises is capped.
    assert_eq!(held.retry_after.as_deref(), Some("2"), "{held:?}");
    server.probe.gate.add_permits(Semaphore::MAX_PERMITS);
    let mut answers = Vec::new();
    for answer in running {
        answers.push(answer.await.unwrap());
    }

    let fresh: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == 201 && !a.replayed)
        .collect();
    assert_eq!(fresh.len(), 1, "{answers:#?}");
    let stored = fresh[0].body.clone();
    assert_eq!(stored, r#"{"charge":1,"amount":"42 EUR"}"#);
    for answer in &answers {
        match answer.status {
            201 => assert_eq!(answer.body, stored, "{answer:?}"),
            409 => {
                assert_eq!(answer.problem_type(), problem::IN_PROGRESS);
                let secs: u64 = answer.retry_after.as_deref().unwrap().parse().unwrap();
                assert!(secs >= 1, "{answer:?}");
            }
            _ => panic!("unexpected answer {answer:?}"),
        }
    }
    // Then every retry is the stored response, replayed.
    let retry = send(server.post("/payments", Some("\"pay-1\""), "42 EUR")).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body, stored);
    assert_eq!(server.executions(), 1);
    drop(backend);
}

pub(super) async fn waiting_duplicates_all_get_the_first_response(backend: Backend) {
    let layer = layer(&backend, "http_waiting").wait_for_result(Duration::from_secs(30));
    let mut server = Server::start(layer, true).await;
    let mut running = Vec::new();
    for _ in 0..64 {
        let request = server.post("/payments", Some("pay-2"), "7 EUR");
        running.push(tokio::spawn(send(request)));
    }
    next(&mut server.signals.started, "the first handler start").await;
    server.probe.gate.add_permits(Semaphore::MAX_PERMITS);
    let mut answers = Vec::new();
    for answer in running {
        answers.push(answer.await.unwrap());
    }
    let replayed = answers.iter().filter(|a| a.replayed).count();
    assert_eq!(replayed, 63, "{answers:#?}");
    for answer in &answers {
        assert_eq!(answer.status, 201, "{answer:?}");
        assert_eq!(answer.body, r#"{"charge":1,"amount":"7 EUR"}"#);
    }
    assert_eq!(server.executions(), 1);
    drop(backend);
}

pub(super) async fn a_key_reused_with_another_body_is_422_and_runs_nothing(backend: Backend) {
    let server = Server::start(layer(&backend, "http_reuse"), false).await;
    let first = send(server.post("/payments", Some("pay-3"), "10 EUR")).await;
    assert_eq!(first.status, 201);
    for (path, body) in [
        ("/payments", "11 EUR"),
        ("/payments?currency=USD", "10 EUR"),
    ] {
        let other = send(server.post(path, Some("pay-3"), body)).await;
        assert_eq!(other.status, 422, "{other:?}");
        assert_eq!(other.problem_type(), problem::KEY_REUSED);
    }
    assert_eq!(server.executions(), 1);
    let same = send(server.post("/payments", Some("pay-3"), "10 EUR")).await;
    assert_eq!(
        (same.status, same.replayed, &same.body),
        (201, true, &first.body)
    );
    drop(backend);
}

pub(super) async fn a_client_that_goes_away_mid_handler_gets_the_stored_response_on_retry(
    backend: Backend,
) {
    // The retry waits for the first request's response, whose client went away.
    let layer = layer(&backend, "http_disconnect").wait_for_result(Duration::from_secs(30));
    let mut server = Server::start(layer, true).await;
    let request = server.post("/payments", Some("pay-6"), "99 EUR");
    let client = tokio::spawn(request.send());
    next(&mut server.signals.started, "the handler start").await;
    // The client goes away while the handler is halfway through; the server notices.
    client.abort();
    next(
        &mut server.signals.dropped,
        "the server dropping the abandoned request",
    )
    .await;
    server.probe.gate.add_permits(Semaphore::MAX_PERMITS);

    let retry = send(server.post("/payments", Some("pay-6"), "99 EUR")).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body, r#"{"charge":1,"amount":"99 EUR"}"#);
    assert_eq!(server.executions(), 1);
    drop(backend);
}

pub(super) async fn a_handler_slower_than_the_lock_ttl_keeps_its_lock(backend: Backend) {
    // Both ways of renewing: in the handler's task (the default) and by a watchdog.
    for (how, key) in [
        (LockRenewal::InTask, "pay-long"),
        (LockRenewal::Watchdog, "pay-long-watchdog"),
    ] {
        let ttl = Duration::from_millis(600);
        let task = Task::new("http_long_handler").lock_ttl(ttl);
        let layer = Idempotency::new(task)
            .store(backend.store.clone())
            .lock_renewal(how);
        let mut server = Server::start(layer, true).await;
        let first = tokio::spawn(send(server.post("/payments", Some(key), "3 EUR")));
        next(&mut server.signals.started, "the handler start").await;
        // Time passing is what is under test: the handler is held three lock TTLs long.
        tokio::time::sleep(ttl * 3).await;
        let retry = tokio::spawn(send(server.post("/payments", Some(key), "3 EUR")));
        // Were the lock gone, the retry would start a second run, held at the gate for ever.
        let retry = tokio::select! {
            retry = retry => retry.unwrap(),
            _ = server.signals.started.recv() => {
                panic!("{how:?}: the lock expired under the handler: the retry started a second run")
            }
        };
        assert_eq!(
            retry.status, 409,
            "{how:?}: the lock expired under the handler: {retry:?}"
        );
        assert_eq!(retry.problem_type(), problem::IN_PROGRESS);
        server.probe.gate.add_permits(Semaphore::MAX_PERMITS);
        let first = first.await.unwrap();
        assert_eq!(
            (first.status, first.replayed),
            (201, false),
            "{how:?}: {first:?}"
        );
        let replay = send(server.post("/payments", Some(key), "3 EUR")).await;
        assert_eq!(
            (replay.status, replay.replayed),
            (201, true),
            "{how:?}: {replay:?}"
        );
        assert_eq!(
            server.executions(),
            1,
            "{how:?}: a second run while the first still ran"
        );
    }
    drop(backend);
}
