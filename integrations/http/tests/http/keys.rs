//! Where the key comes from and what counts in the fingerprint: missing and malformed keys,
//! scopes, a key from the body, the stored headers, JSON numbers by their exact text, the size caps.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) async fn missing_and_malformed_keys(backend: Backend) {
    let server = Server::start(layer(&backend, "http_keys"), false).await;
    // No key: the request passes through, unprotected, every time.
    for _ in 0..2 {
        let answer = send(server.post("/payments", None, "1 EUR")).await;
        assert_eq!((answer.status, answer.replayed), (201, false));
    }
    assert_eq!(server.executions(), 2);
    for malformed in [
        "\"unterminated",
        "\"\"",
        "two words",
        "a,b",
        "\"bad \\n escape\"",
        &"k".repeat(256),
    ] {
        let answer = send(server.post("/payments", Some(malformed), "1 EUR")).await;
        assert_eq!(answer.status, 400, "{malformed}: {answer:?}");
        assert_eq!(answer.problem_type(), problem::INVALID_KEY);
    }
    assert_eq!(server.executions(), 2);

    let required = Server::start(
        layer(&backend, "http_keys_required").require_key(true),
        false,
    )
    .await;
    let answer = send(required.post("/payments", None, "1 EUR")).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.problem_type(), problem::MISSING_KEY);
    assert_eq!(required.executions(), 0);
    // A method the layer does not cover passes through even when keys are required.
    let get = required
        .client
        .get(format!("{}/payments", required.base))
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 405);
    drop(backend);
}

pub(super) async fn scopes_keep_equal_keys_apart(backend: Backend) {
    let scoped = layer(&backend, "http_scopes").scope(|request| {
        let tenant = request.headers.get("x-tenant");
        String::from_utf8_lossy(tenant.map_or(&b""[..], |v| v.as_bytes())).into_owned()
    });
    let server = Server::start(scoped, false).await;
    let mut bodies = Vec::new();
    for tenant in ["acme", "globex", "acme"] {
        let answer = send(
            server
                .post("/payments", Some("pay-7"), "5 EUR")
                .header("x-tenant", tenant),
        )
        .await;
        assert_eq!(answer.status, 201, "{answer:?}");
        bodies.push((answer.replayed, answer.body));
    }
    assert_eq!(server.executions(), 2);
    assert_eq!(bodies[0].1, bodies[2].1);
    assert_ne!(bodies[0].1, bodies[1].1);
    assert!(bodies[2].0, "the second request of a tenant is a replay");
    // A scope far longer than a key is hashed into the stored key: the key stays valid.
    let long = "t".repeat(4000);
    let answer = send(
        server
            .post("/payments", Some("pay-7"), "5 EUR")
            .header("x-tenant", &long),
    )
    .await;
    assert_eq!((answer.status, answer.replayed), (201, false), "{answer:?}");
    assert_eq!(server.executions(), 3);
}

pub(super) async fn a_key_from_the_body_and_the_stored_headers(backend: Backend) {
    // A webhook whose event id is in its JSON body, as Stripe's are.
    let by_event = layer(&backend, "http_key_fn").key_fn(|_, body| {
        let event: serde_json::Value = serde_json::from_slice(body).ok()?;
        Some(event.get("id")?.as_str()?.to_owned())
    });
    let server = Server::start(by_event, false).await;
    let event = r#"{"id":"evt_1","type":"charge.succeeded"}"#;
    let first = server.post("/payments", None, event).send().await.unwrap();
    let location = first.headers().get("location").cloned();
    assert_eq!(first.headers().get("date").unwrap(), SENTINEL_DATE);
    assert_eq!(
        first.headers().get("set-cookie").unwrap(),
        "session=charge-1"
    );
    assert_eq!(first.status(), 201);
    let replay = server.post("/payments", None, event).send().await.unwrap();
    assert_eq!(
        replay.headers().get(IDEMPOTENT_REPLAYED.as_str()).unwrap(),
        "true"
    );
    // End-to-end headers come back as stored; `Date` is the replay's own.
    assert_eq!(replay.headers().get("location").cloned(), location);
    assert!(location.is_some());
    let date = replay
        .headers()
        .get("date")
        .expect("the server dates the replay");
    assert_ne!(date, SENTINEL_DATE, "the stored Date was replayed");
    assert!(
        replay.headers().get("set-cookie").is_none(),
        "a session cookie was handed to whoever retried the key"
    );
    // A body without an id has no key: it passes through and runs.
    let unkeyed = send(server.post("/payments", None, r#"{"type":"ping"}"#)).await;
    assert_eq!((unkeyed.status, unkeyed.replayed), (201, false));
    assert_eq!(server.executions(), 2);
    drop(backend);
}

pub(super) async fn what_counts_in_the_fingerprint(backend: Backend) {
    // Only the amount makes a payment: a retry that changes `sent_at` is the same request.
    let by_amount = layer(&backend, "http_fingerprint_fn")
        .fingerprint_headers([http::HeaderName::from_static("x-api-version")])
        .fingerprint_body_with(|_, body| {
            let payment: serde_json::Value = serde_json::from_slice(body).ok()?;
            idempotask::Fingerprint::of(payment.get("amount")?).ok()
        });
    let server = Server::start(by_amount, false).await;
    let versioned = |key: &str, body: &str, version: &str| {
        server
            .post("/payments", Some(key), body)
            .header("x-api-version", version)
    };
    // A body the function refuses: 400, nothing ran, and the key is not taken.
    let refused = send(versioned("fp-1", "not json", "1")).await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.problem_type(), problem::BODY_INVALID);
    assert_eq!(server.executions(), 0);

    let first = send(versioned("fp-1", r#"{"amount":5,"sent_at":1}"#, "1")).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    let retry = send(versioned("fp-1", r#"{"amount":5,"sent_at":2}"#, "1")).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body, first.body);
    for (body, version) in [
        (r#"{"amount":6,"sent_at":1}"#, "1"),
        (r#"{"amount":5,"sent_at":1}"#, "2"),
    ] {
        let other = send(versioned("fp-1", body, version)).await;
        assert_eq!(other.status, 422, "{body} {version}: {other:?}");
        assert_eq!(other.problem_type(), problem::KEY_REUSED);
    }
    assert_eq!(server.executions(), 1);

    // JSON bodies count by value: spacing and member order are the same request.
    let json = layer(&backend, "http_fingerprint_json")
        .fingerprint_body(idempotask_http::BodyFingerprint::Json);
    let server = Server::start(json, false).await;
    let first = send(server.post("/payments", Some("fp-2"), r#"{"a":1,"b":2}"#)).await;
    let retry = send(server.post("/payments", Some("fp-2"), r#"{ "b": 2, "a": 1 }"#)).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body, first.body);
    let other = send(server.post("/payments", Some("fp-2"), r#"{"a":1,"b":3}"#)).await;
    assert_eq!(other.status, 422, "{other:?}");
    assert_eq!(server.executions(), 1);
    drop(backend);
}

// A float round trip made 2^64 and 2^64 + 1 one payload under `BodyFingerprint::Json`: the
// second request got the first one's `201`, replayed, and never ran.
pub(super) async fn json_numbers_count_by_their_exact_text(backend: Backend) {
    let json = layer(&backend, "http_json_numbers")
        .fingerprint_body(idempotask_http::BodyFingerprint::Json);
    let server = Server::start(json, false).await;
    // (first body, second body, whether they are one payload)
    let cases = [
        (
            r#"{"account":18446744073709551616,"amount":5}"#,
            r#"{"account":18446744073709551617,"amount":5}"#,
            false,
        ),
        (
            r#"{"amount":-170141183460469231731687303715884105729}"#,
            r#"{"amount":-170141183460469231731687303715884105730}"#,
            false,
        ),
        (
            r#"{"amount":0.12345678901234567890123}"#,
            r#"{"amount":0.12345678901234567890124}"#,
            false,
        ),
        (r#"{"amount":1.0}"#, r#"{"amount":1}"#, false),
        (r#"{"amount":-0}"#, r#"{"amount":0}"#, false),
        (r#"{"amount":1e2}"#, r#"{"amount":100}"#, false),
        (
            r#"{"account":18446744073709551616,"amount":5}"#,
            r#"{ "amount": 5, "account": 18446744073709551616 }"#,
            true,
        ),
        (r#"{"amount":1E+02}"#, r#"{"amount":1e2}"#, true),
    ];
    for (index, (first, second, same)) in cases.into_iter().enumerate() {
        let key = format!("numbers-{index}");
        let ran = send(server.post("/payments", Some(&key), first)).await;
        assert_eq!((ran.status, ran.replayed), (201, false), "{first}: {ran:?}");
        let retry = send(server.post("/payments", Some(&key), second)).await;
        if same {
            assert_eq!(
                (retry.status, retry.replayed, &retry.body),
                (201, true, &ran.body),
                "{first} then {second}"
            );
        } else {
            assert_eq!(retry.status, 422, "{first} then {second}: {retry:?}");
            assert_eq!(retry.problem_type(), problem::KEY_REUSED);
        }
    }
    assert_eq!(server.executions(), 8);
    drop(backend);
}

pub(super) async fn the_size_caps(backend: Backend) {
    let capped = layer(&backend, "http_caps")
        .max_request_body(64)
        .max_stored_body(1000);
    let server = Server::start(capped, false).await;
    // A request body over the buffer limit: 413, nothing ran.
    let big = send(server.post("/payments", Some("pay-5"), &"x".repeat(65))).await;
    assert_eq!(big.status, 413, "{big:?}");
    assert_eq!(big.problem_type(), problem::BODY_TOO_LARGE);
    assert_eq!(server.executions(), 0);

    // A response at the cap is stored; one over it is sent whole, and its retry is told so.
    let at_cap = send(server.post("/large", Some("large-1"), "1000")).await;
    assert_eq!((at_cap.status, at_cap.body.len()), (200, 1000));
    let replay = send(server.post("/large", Some("large-1"), "1000")).await;
    assert_eq!((replay.replayed, &replay.body), (true, &at_cap.body));

    let over = send(server.post("/large", Some("large-2"), "1001")).await;
    assert_eq!((over.status, over.replayed), (200, false));
    assert_eq!(over.body, "2".repeat(1001));
    let retry = send(server.post("/large", Some("large-2"), "1001")).await;
    assert_eq!(retry.status, 410, "{retry:?}");
    assert_eq!(retry.problem_type(), problem::RESPONSE_NOT_STORED);
    assert_eq!(
        server.executions(),
        2,
        "the over-cap request never runs again"
    );
    drop(backend);
}

pub(super) async fn a_chunked_body_over_the_cap_is_413_and_runs_nothing(backend: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let server = Server::start(layer(&backend, "http_chunked").max_request_body(64), false).await;
    let address = server.base.trim_start_matches("http://").to_owned();
    // No Content-Length: the layer learns the size only by reading, and stops at the cap.
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let chunk = "x".repeat(40);
    let request = format!(
        "POST /payments HTTP/1.1\r\nhost: {address}\r\nidempotency-key: pay-8\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         28\r\n{chunk}\r\n28\r\n{chunk}\r\n0\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // The server may reset the connection once it has answered, with the rest of the body
    // unread: what arrived counts.
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains(problem::BODY_TOO_LARGE), "{answer}");
    assert_eq!(server.executions(), 0);
    // Nothing was stored for the key: a request within the cap runs.
    let within = send(server.post("/payments", Some("pay-8"), "1 EUR")).await;
    assert_eq!((within.status, within.replayed), (201, false), "{within:?}");
    drop(backend);
}
