//! `idempotask dashboard` against a redis-server this test starts and fills: every request
//! needs the token, the page escapes what the store holds and forbids inline script, a post
//! needs the session's CSRF token and this host's origin, a held unit resolved through the
//! page changes the store (and the audit trail says so), and 20,000 units are counted without
//! `KEYS`; the same page works on PostgreSQL and on a Redis Cluster.

use std::time::{Duration, Instant};

use idempotask::operator::{Marker, Operator};
use idempotask::store::{Fencing, UnitOfWork};
use idempotask_test_support::RedisServer;
use serde_json::Value;

mod common;

use common::web::{Dashboard, form_value, http};
use common::{Backend, Redis, json};

/// The key whose markup must show as text.
const SCRIPT_KEY: &str = "<script>document.title='pwned'</script>";

/// A store with `charge` holding one unit in doubt (`order-held`), one locked (`order-run`) and
/// two done (`order-1`, and [`SCRIPT_KEY`]).
fn filled() -> RedisServer {
    let server = RedisServer::start();
    let redis = Redis(&server);
    redis.complete("charge", &["order-1", SCRIPT_KEY]);
    redis.lock("charge", "order-run");
    redis.leave_in_doubt(&["order-held"], Fencing::On);
    server
}

#[test]
fn every_request_needs_the_token() {
    let server = filled();
    let dashboard = Dashboard::start("--redis-url", &server.url(), &["--task", "charge"]);
    for path in ["/", "/api/units", "/fragment", "/assets/app.js"] {
        let reply = http(dashboard.addr, "GET", path, &[], None);
        assert_eq!(reply.status, 401, "{path}: {reply:?}");
        assert!(reply.header("content-security-policy").is_some());
        let wrong = http(
            dashboard.addr,
            "GET",
            path,
            &[("Authorization", "Bearer 0123456789abcdef0123")],
            None,
        );
        assert_eq!(wrong.status, 401, "{path}");
    }
    let posted = http(
        dashboard.addr,
        "POST",
        "/action",
        &[],
        Some("action=free&task=charge&key=order-held"),
    );
    assert_eq!(posted.status, 401);
    assert_eq!(dashboard.get("/api/units").status, 200);
}

#[test]
fn the_page_shows_markup_from_the_store_as_text_under_a_strict_policy() {
    let server = filled();
    let dashboard = Dashboard::start("--redis-url", &server.url(), &["--task", "charge"]);
    let page = dashboard.get("/");
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.body
            .contains("&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;"),
        "{}",
        page.body
    );
    assert!(!page.body.contains("<script>document"), "{}", page.body);
    // The page's only script is its own file.
    assert_eq!(page.body.matches("<script").count(), 1);
    assert!(
        page.body
            .contains("<script src=\"/assets/app.js\" defer></script>")
    );
    let csp = page.header("content-security-policy").unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(
        dashboard.get("/assets/app.js").header("content-type"),
        Some("text/javascript; charset=utf-8")
    );

    let units = json(&dashboard.get("/api/units").body);
    let charge = &units["tasks"][0];
    assert_eq!(
        (&charge["done"], &charge["locked"], &charge["in_doubt"]),
        (&Value::from(2), &Value::from(1), &Value::from(1)),
        "{units}"
    );
    assert_eq!(charge["held_units"].as_array().unwrap().len(), 1);
    let locked = &charge["locked_units"][0];
    assert!(
        locked["lock_ttl_ms"].as_u64().unwrap() > 500_000,
        "{locked}"
    );
    // A 10-minute lock taken moments ago has used almost none of its TTL.
    assert_eq!(charge["ttl_used_max_percent"], 0, "{charge}");
    assert!(
        page.body.contains("closest to its TTL: 0% used"),
        "{}",
        page.body
    );
}

#[test]
fn keys_are_shown_hashed_when_asked() {
    let server = filled();
    let audit = std::env::temp_dir().join(format!("audit-{:x}.log", rand::random::<u64>()));
    let dashboard = Dashboard::start(
        "--redis-url",
        &server.url(),
        &[
            "--task",
            "charge",
            "--hash-keys",
            "--audit-log",
            audit.to_str().unwrap(),
        ],
    );
    let page = dashboard.get("/").body;
    assert!(!page.contains("order-1"), "{page}");
    let digest = UnitOfWork::new("charge", "order-1").unwrap();
    assert!(page.contains(digest.digest()), "{page}");

    // The operator types the key to act; the trail names the unit by its digest only.
    let forgot = dashboard.post_action("action=forget&task=charge&key=order-1");
    assert_eq!(forgot.status, 200, "{forgot:?}");
    let trail = std::fs::read_to_string(&audit).unwrap();
    assert!(trail.contains(digest.digest()), "{trail}");
    assert!(!trail.contains("order-1"), "{trail}");
    let _ = std::fs::remove_file(audit);
}

/// Logs in as a browser does: answers the session cookie and the page's CSRF token.
fn log_in(dashboard: &Dashboard) -> (String, String) {
    let login = http(
        dashboard.addr,
        "GET",
        &format!("/?token={}", dashboard.token),
        &[],
        None,
    );
    assert_eq!(login.status, 303, "{login:?}");
    let cookie = login
        .header("set-cookie")
        .and_then(|value| value.split(';').next())
        .unwrap()
        .to_owned();
    assert!(login.header("set-cookie").unwrap().contains("HttpOnly"));
    let page = http(dashboard.addr, "GET", "/", &[("Cookie", &cookie)], None);
    assert_eq!(page.status, 200);
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    assert_eq!(csrf.len(), 32, "{}", page.body);
    (cookie, csrf)
}

#[test]
fn a_held_unit_resolved_through_a_post_changes_the_store_once_csrf_holds() {
    let server = filled();
    let redis = Redis(&server);
    let audit = std::env::temp_dir().join(format!("audit-{:x}.log", rand::random::<u64>()));
    let dashboard = Dashboard::start(
        "--redis-url",
        &server.url(),
        &["--task", "charge", "--audit-log", audit.to_str().unwrap()],
    );
    let (cookie, csrf) = log_in(&dashboard);
    let origin = format!("http://{}", dashboard.addr);
    let digest = UnitOfWork::new("charge", "order-held")
        .unwrap()
        .digest()
        .to_owned();
    let form = |csrf: &str| {
        format!(
            "csrf={csrf}&action=resolve&task=charge&key=order-held&digest={digest}&result={}&result_ttl=1h",
            form_value("{\"charge\":\"ch_by_hand\"}")
        )
    };
    let post = |headers: &[(&str, &str)], body: &str| {
        http(dashboard.addr, "POST", "/action", headers, Some(body))
    };

    let no_csrf = post(&[("Cookie", &cookie), ("Origin", &origin)], &form(""));
    assert_eq!(no_csrf.status, 403, "{no_csrf:?}");
    let foreign = post(
        &[("Cookie", &cookie), ("Origin", "http://evil.example")],
        &form(&csrf),
    );
    assert_eq!(foreign.status, 403, "{foreign:?}");
    let no_origin = post(&[("Cookie", &cookie)], &form(&csrf));
    assert_eq!(no_origin.status, 403, "{no_origin:?}");
    assert_eq!(
        redis.status_json("charge", "order-held")["state"],
        "in_doubt"
    );

    let wrong_key = post(
        &[("Cookie", &cookie), ("Origin", &origin)],
        &form(&csrf).replace("key=order-held", "key=order-other"),
    );
    assert_eq!(wrong_key.status, 400, "{wrong_key:?}");

    let resolved = post(&[("Cookie", &cookie), ("Origin", &origin)], &form(&csrf));
    assert_eq!(resolved.status, 200, "{resolved:?}");
    let status = redis.status_json("charge", "order-held");
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["result"]["charge"], "ch_by_hand");

    // Done now: resolving again is refused as `resolve` refuses it, and the page says so.
    let again = post(&[("Cookie", &cookie), ("Origin", &origin)], &form(&csrf));
    assert_eq!(again.status, 409, "{again:?}");
    assert_eq!(json(&again.body)["kind"], "not_in_doubt");

    // A bearer (a script, not a browser) needs no CSRF token; forget goes through `forget`.
    let forgot = dashboard.post_action("action=forget&task=charge&key=order-1");
    assert_eq!(forgot.status, 200, "{forgot:?}");
    assert_eq!(redis.status_json("charge", "order-1")["state"], "unknown");

    let trail = std::fs::read_to_string(&audit).unwrap();
    let lines: Vec<Value> = trail.lines().map(json).collect();
    assert_eq!(lines.len(), 4, "{trail}");
    assert_eq!(lines[1]["action"], "resolve_record");
    assert_eq!(lines[1]["outcome"], "ok");
    assert_eq!(lines[1]["digest"], digest.as_str());
    assert!(lines[1]["who"].as_str().unwrap().starts_with("dashboard:"));
    assert_eq!(lines[2]["outcome"], "not_in_doubt");
    assert_eq!(lines[3]["action"], "forget");
    assert!(dashboard.stderr.lock().unwrap().contains("audit: "));

    // The CLI writes to the same trail.
    let (code, _, err) = redis.idempotask(&[
        "--audit-log",
        audit.to_str().unwrap(),
        "forget",
        "--task",
        "charge",
        "--key",
        "order-held",
        "--yes",
    ]);
    assert_eq!(code, 0, "{err}");
    let trail = std::fs::read_to_string(&audit).unwrap();
    let last = json(trail.lines().last().unwrap());
    assert!(last["who"].as_str().unwrap().starts_with("cli"), "{last}");
    assert_eq!(last["outcome"], "ok");
    let _ = std::fs::remove_file(audit);
}

#[test]
fn a_non_loopback_address_without_a_token_is_refused() {
    // No store is reached: the refusal comes first.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idempotask"))
        .env_remove("IDEMPOTASK_DASHBOARD_TOKEN")
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .args([
            "--redis-url",
            "redis://127.0.0.1:1",
            "dashboard",
            "--task",
            "charge",
        ])
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("not a loopback address"), "{err}");
}

#[test]
fn twenty_thousand_units_are_counted_without_keys() {
    // `IDEMPOTASK_DASHBOARD_UNITS=100000` measures a bigger store.
    let units: usize = std::env::var("IDEMPOTASK_DASHBOARD_UNITS")
        .ok()
        .and_then(|units| units.parse().ok())
        .unwrap_or(20_000);
    let server = filled();
    common::runtime().block_on(async {
        let store = server.store().await;
        let mut conn = server.connection().await;
        let mut pipe = redis::pipe();
        for i in 0..units {
            let unit = UnitOfWork::new("charge", format!("bulk-{i}")).unwrap();
            let result = serde_json::value::RawValue::from_string(i.to_string()).unwrap();
            let marker = Marker::encode_resolution(&unit, None, &result);
            pipe.cmd("SET")
                .arg(store.location(&unit))
                .arg(marker)
                .arg("EX")
                .arg(3600)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
    });
    let dashboard = Dashboard::start("--redis-url", &server.url(), &["--task", "charge"]);
    let started = Instant::now();
    let view = json(&dashboard.get("/api/units").body);
    let elapsed = started.elapsed();
    let charge = &view["tasks"][0];
    println!(
        "{units} units: {elapsed:?}, {} store calls",
        charge["store_calls"]
    );
    assert_eq!(charge["done"], units + 2, "{}", charge["done"]);
    assert_eq!(charge["in_doubt"], 1);
    // One page: about 200 keys (a `SCAN`'s `COUNT` is a hint, so a few more at times).
    let shown = charge["done_units"].as_array().unwrap().len();
    assert!((1..units / 10).contains(&shown), "{shown}");
    assert!(charge["done_next"].is_string());
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    let page = dashboard.get(&format!(
        "/fragment?task=charge&from={}",
        form_value(charge["done_next"].as_str().unwrap())
    ));
    assert_eq!(page.status, 200);
    let stats = commandstats(&server);
    // What each call cost the server: `usec_per_call` is how long it held it.
    for line in stats.lines().filter(|line| line.starts_with("cmdstat_")) {
        println!("{line}");
    }
    assert!(stats.contains("cmdstat_scan"), "{stats}");
    assert!(!stats.contains("cmdstat_keys"), "{stats}");
}

#[test]
fn the_dashboard_works_on_postgres_where_rows_keep_their_keys() {
    let postgres = common::Postgres::start();
    postgres.complete("charge", &["order-1"]);
    postgres.leave_in_doubt(&["order-held"], Fencing::On);
    let dashboard = Dashboard::start("--database-url", &postgres.url(), &["--task", "charge"]);
    let units = json(&dashboard.get("/api/units").body);
    let charge = &units["tasks"][0];
    assert_eq!(units["table"], "idempotask_units", "{units}");
    assert_eq!(charge["held_units"][0]["key"], "order-held", "{units}");
    let page = dashboard.get("/").body;
    assert!(page.contains("data-key=\"order-held\""), "{page}");

    let freed = dashboard.post_action("action=free&task=charge&key=order-held");
    assert_eq!(freed.status, 200, "{freed:?}");
    assert_eq!(
        postgres.status_json("charge", "order-held")["state"],
        "unknown"
    );
}

/// The server's `INFO commandstats`: each command's calls and time.
fn commandstats(server: &RedisServer) -> String {
    common::runtime().block_on(async {
        let mut conn = server.connection().await;
        redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap()
    })
}

/// How many `SCAN` calls the server answered since its stats were reset.
fn scans(server: &RedisServer) -> u64 {
    commandstats(server)
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_scan:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

#[test]
fn pages_refreshed_together_share_one_walk_and_an_action_starts_a_new_one() {
    let server = filled();
    let dashboard = Dashboard::start("--redis-url", &server.url(), &["--task", "charge"]);
    let first = dashboard.get("/api/units");
    let walked = scans(&server);
    assert!(walked > 0);
    let second = dashboard.get("/fragment");
    assert_eq!(second.status, 200);
    assert_eq!(dashboard.get("/api/units").body, first.body);
    assert_eq!(scans(&server), walked, "a second walk within 2 s");

    let freed = dashboard.post_action("action=free&task=charge&key=order-held");
    assert_eq!(freed.status, 200, "{freed:?}");
    let after = json(&dashboard.get("/api/units").body);
    assert_eq!(after["tasks"][0]["in_doubt"], 0, "{after}");
    assert!(scans(&server) > walked);
}

#[test]
fn the_dashboard_walks_every_master_of_a_redis_cluster() {
    let cluster = idempotask_test_support::cluster::RedisCluster::shared();
    let namespace = format!("t{:016x}", rand::random::<u64>());
    let keys: Vec<String> = (0..12).map(|i| format!("order-{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    common::runtime().block_on(async {
        let store = cluster.store_in(&namespace).await;
        common::leave_in_doubt_on(&store, "charge", &keys, Fencing::On).await;
    });
    let url = cluster.urls()[0].clone();
    let dashboard = Dashboard::start(
        "--redis-url",
        &url,
        &["--namespace", &namespace, "--task", "charge"],
    );
    let units = json(&dashboard.get("/api/units").body);
    let charge = &units["tasks"][0];
    assert_eq!(charge["in_doubt"], 12, "{units}");
    assert_eq!(charge["held_units"].as_array().unwrap().len(), 12);

    let freed = dashboard.post_action("action=free&task=charge&key=order-3");
    assert_eq!(freed.status, 200, "{freed:?}");
    let after = json(&dashboard.get("/api/units").body);
    assert_eq!(after["tasks"][0]["in_doubt"], 11, "{after}");
}

#[test]
fn a_token_file_wins_over_the_environment_and_logs_in_percent_encoded() {
    let server = filled();
    let token = "s3cret+token/with=odd&chars!";
    let file = std::env::temp_dir().join(format!("token-{:x}", rand::random::<u64>()));
    std::fs::write(&file, format!("{token}\nignored second line\n")).unwrap();
    let dashboard = Dashboard::start(
        "--redis-url",
        &server.url(),
        &["--task", "charge", "--token-file", file.to_str().unwrap()],
    );
    // `Dashboard::start` put another token in the environment: the file's wins.
    assert_eq!(dashboard.get("/").status, 401);
    let login = http(
        dashboard.addr,
        "GET",
        &format!("/?token={}", form_value(token)),
        &[],
        None,
    );
    assert_eq!(login.status, 303, "{login:?}");
    let bearer = format!("Bearer {token}");
    let page = http(
        dashboard.addr,
        "GET",
        "/",
        &[("Authorization", &bearer)],
        None,
    );
    assert_eq!(page.status, 200);
    let _ = std::fs::remove_file(file);
}
