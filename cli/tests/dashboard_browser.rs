//! The dashboard in a real browser: headless Chromium (Debian's `chromium`) logs in with the
//! token, sees the held unit, resolves it through the page's button and confirmation, and the
//! store changes; the key holding `<script>` shows as text and runs nothing; a unit held at a
//! step shows its steps, the hostile step name as text and no value; the task's calls,
//! read from a worker's metrics page, are on the page. Fails, never
//! skips, without Chromium. With `IDEMPOTASK_DASHBOARD_SCREENSHOT=PATH`, it saves the page as
//! it stands before the click to `PATH` (docs/img/dashboard.png).

use idempotask::store::Fencing;
use idempotask_test_support::RedisServer;

mod common;

use common::cdp::Browser;
use common::metrics::{serve, worker};
use common::web::Dashboard;
use common::{Backend, Redis, hold_at_step_on};

const SCRIPT_KEY: &str = "<script>document.title='pwned'</script>";

/// A step whose name is markup and whose value is script.
const HOSTILE_STEP: &str = r#"{"step":"<img src=x onerror=\"document.title='step'\">","ok":"<script>document.title='value'</script>"}"#;

#[test]
fn a_held_unit_is_resolved_from_the_page() {
    let server = RedisServer::start();
    let redis = Redis(&server);
    redis.complete("charge", &["order-1", SCRIPT_KEY]);
    redis.lock("charge", "order-run");
    redis.leave_in_doubt(&["order-held"], Fencing::On);
    // Held at its third step, after two that finished, one named and valued as hostile input.
    redis.with_store(async |store| {
        let steps = [r#"{"step":"reserve","ok":{"sku":"A-1"}}"#, HOSTILE_STEP];
        hold_at_step_on(&store, "checkout", "order-steps", &steps).await;
    });
    let worker = serve(worker(
        &[
            ("charge", "executed", 41),
            ("charge", "replayed", 12),
            ("charge", "contended", 2),
        ],
        &[("charge", 5)],
    ));
    let metrics = format!("http://{worker}/metrics");
    let dashboard = Dashboard::start(
        "--redis-url",
        &server.url(),
        &[
            "--task",
            "charge",
            "--task",
            "checkout",
            "--metrics",
            &metrics,
        ],
    );
    let mut browser = Browser::start();

    let login = format!("http://{}/?token={}", dashboard.addr, dashboard.token);
    browser.call("Page.navigate", &serde_json::json!({ "url": login }));
    browser.wait_for("document.querySelector('button.act.resolve') !== null");

    // The key's markup is text: no element came of it, and nothing ran.
    assert_eq!(browser.eval("document.title"), "idempotask dashboard");
    assert_eq!(browser.eval("document.scripts.length"), 1);
    let shown = browser.eval("document.body.innerText");
    assert!(shown.as_str().unwrap().contains(SCRIPT_KEY), "{shown}");
    assert_eq!(
        browser.eval("document.querySelector('td script') === null"),
        true
    );
    assert_eq!(
        browser.eval("document.querySelector('.count.held').textContent"),
        "1 in doubt"
    );
    the_unit_held_at_a_step_shows_its_steps_as_text(&mut browser, shown.as_str().unwrap());

    // The calls, from the worker's metrics page.
    assert_eq!(
        browser.eval("document.querySelector('.count.fresh').textContent"),
        "41 fresh"
    );

    // `IDEMPOTASK_DASHBOARD_SCREENSHOT=docs/img/dashboard.png` takes the picture the docs show.
    if let Some(path) = std::env::var_os("IDEMPOTASK_DASHBOARD_SCREENSHOT") {
        browser.screenshot(std::path::Path::new(&path));
    }
    browser.click("button.act.resolve");
    browser.wait_for("document.getElementById('confirm').open");
    // A Redis lock keeps only the digest of its key: the operator types the key.
    browser.type_into("#confirm-key", "order-held");
    browser.type_into("#confirm-result", r#"{"charge":"ch_from_the_page"}"#);
    browser.click("#confirm-yes");
    browser.wait_for("document.getElementById('outcome').textContent !== ''");
    let outcome = browser.eval("document.getElementById('outcome').textContent");
    assert!(
        outcome.as_str().unwrap().starts_with("recorded"),
        "{outcome}"
    );

    let status = redis.status_json("charge", "order-held");
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["result"]["charge"], "ch_from_the_page");
    // The page refreshed after the action: nothing is held any more.
    browser.wait_for("document.querySelector('.count.held').textContent === '0 in doubt'");
}

/// The unit held at a step: its two finished steps and the one in doubt, marked apart; the
/// hostile name is text, and no value is on the page (`shown`, its text).
fn the_unit_held_at_a_step_shows_its_steps_as_text(browser: &mut Browser, shown: &str) {
    let steps = "document.querySelectorAll('section[data-task=checkout] tr.at-step tr.step')";
    assert_eq!(browser.eval(&format!("{steps}.length")), 3);
    let states: Vec<String> = (0..3)
        .map(|row| {
            let cells = format!("{steps}[{row}].cells");
            let texts = browser.eval(&format!(
                "[0, 2].map((cell) => {cells}[cell].textContent).join(' ')"
            ));
            texts.as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(states[0], "0 finished");
    assert_eq!(states[1], "1 finished");
    assert!(states[2].starts_with("2 in doubt"), "{states:?}");
    let name = browser.eval(&format!(
        "{steps}[1].querySelector('.step-name').textContent"
    ));
    assert_eq!(name, r#"<img src=x onerror="document.title='step'">"#);
    assert_eq!(
        browser.eval("document.querySelector('table.steps img') === null"),
        true
    );
    assert_eq!(
        browser.eval(&format!("{steps}[0].querySelector('.size').textContent")),
        "13 B"
    );
    assert!(!shown.contains("document.title='value'"), "{shown}");
    assert_eq!(
        browser.eval("document.querySelectorAll('button.act.resolve_step').length"),
        1
    );
    assert_eq!(browser.eval("document.title"), "idempotask dashboard");
}
