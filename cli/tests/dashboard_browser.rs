//! The dashboard in a real browser: headless Chromium (Debian's `chromium`) logs in with the
//! token, sees the held unit, resolves it through the page's button and confirmation, and the
//! store changes; the key holding `<script>` shows as text and runs nothing; the task's calls,
//! read from a worker's metrics page, are on the page. Fails, never
//! skips, without Chromium. With `IDEMPOTASK_DASHBOARD_SCREENSHOT=PATH`, it saves the page as
//! it stands before the click to `PATH` (docs/img/dashboard.png).

use idempotask::store::Fencing;
use idempotask_test_support::RedisServer;

mod common;

use common::cdp::Browser;
use common::metrics::{serve, worker};
use common::web::Dashboard;
use common::{Backend, Redis};

const SCRIPT_KEY: &str = "<script>document.title='pwned'</script>";

#[test]
fn a_held_unit_is_resolved_from_the_page() {
    let server = RedisServer::start();
    let redis = Redis(&server);
    redis.complete("charge", &["order-1", SCRIPT_KEY]);
    redis.lock("charge", "order-run");
    redis.leave_in_doubt(&["order-held"], Fencing::On);
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
        &["--task", "charge", "--metrics", &metrics],
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
