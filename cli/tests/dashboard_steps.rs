//! The dashboard's view of steps, against a redis-server this test starts: a unit held at a
//! step shows each step of its journal (position, name, state, the size of its value, never
//! the value) and the step in doubt, marked apart from plain units in doubt; a hostile step
//! name shows as text; the page records the held step or frees the unit with its journal
//! through the operator's calls, as `resolve --step` and `resolve --free --discard-steps` do.

use idempotask::store::{Fencing, Store, UnitOfWork};
use idempotask_test_support::RedisServer;
use serde_json::{Value, json as value};

mod common;

use common::web::{Dashboard, form_value};
use common::{Backend, Redis, hold_at_step_on, json, leave_in_doubt_on};

/// A step name that is markup, and a value that is script: values are hostile input.
const HOSTILE: &str = r#"{"step":"<img src=x onerror=alert(1)>","ok":"<script>alert(2)</script>"}"#;

/// The held row of `key` in the JSON view.
fn held_row(units: &Value, key: &str) -> Value {
    let digest = UnitOfWork::new("checkout", key)
        .unwrap()
        .digest()
        .to_owned();
    let rows = units["tasks"][0]["held_units"].as_array().unwrap();
    rows.iter()
        .find(|row| row["digest"] == digest.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{key} is not held: {units}"))
}

#[test]
fn a_unit_held_at_a_step_shows_its_steps_and_is_settled_step_by_step() {
    let server = RedisServer::start();
    let redis = Redis(&server);
    redis.with_store(async |store| {
        leave_in_doubt_on(&store, "checkout", &["plain"], Fencing::Off).await;
        let charge = r#"{"step":"charge","ok":"ch_1"}"#;
        hold_at_step_on(&store, "checkout", "order-1", &[charge, HOSTILE]).await;
        hold_at_step_on(&store, "checkout", "order-2", &[charge]).await;
    });
    let dashboard = Dashboard::start("--redis-url", &server.url(), &["--task", "checkout"]);

    let units = json(&dashboard.get("/api/units").body);
    assert_eq!(units["tasks"][0]["in_doubt"], 3, "{units}");
    assert_eq!(units["tasks"][0]["held_at_step"], 2, "{units}");
    let steps = &held_row(&units, "order-1")["steps"];
    let hostile_value = r#""<script>alert(2)</script>""#.len();
    assert_eq!(
        steps,
        &value!([
            {"position": 0, "step": "charge", "state": "finished", "value_bytes": 6},
            {"position": 1, "step": "<img src=x onerror=alert(1)>", "state": "finished", "value_bytes": hostile_value},
            {"position": 2, "step": null, "state": "in_doubt"},
        ])
    );

    let page = dashboard.get("/fragment").body;
    assert!(
        page.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "{page}"
    );
    assert!(!page.contains("<img"), "a step name became markup: {page}");
    assert!(
        !page.contains("alert(2)"),
        "a step's value is never shown: {page}"
    );
    assert_eq!(page.matches("<tr class=\"at-step\">").count(), 2, "{page}");
    assert!(page.contains("data-action=\"resolve_step\""), "{page}");

    // The held step's effect happened: recorded at the journal's end, the unit freed.
    let recorded = dashboard.post_action(&format!(
        "action=resolve_step&task=checkout&key=order-1&step=receipt&result={}&result_ttl=1h",
        form_value("\"rc_1\"")
    ));
    assert_eq!(recorded.status, 200, "{recorded:?}");
    assert!(
        json(&recorded.body)["message"]
            .as_str()
            .unwrap()
            .starts_with("recorded step receipt")
    );
    let unnamed = dashboard.post_action("action=resolve_step&task=checkout&key=order-2&result=1");
    assert_eq!(unnamed.status, 400, "{unnamed:?}");

    // A body whose step order changed: freed with its journal, it runs as new.
    let freed = dashboard.post_action("action=discard&task=checkout&key=order-2");
    assert_eq!(freed.status, 200, "{freed:?}");
    let journals = redis.with_store(async |store| {
        let mut lengths = Vec::new();
        for key in ["order-1", "order-2"] {
            let unit = UnitOfWork::new("checkout", key).unwrap();
            lengths.push(store.read_journal(&unit).await.unwrap().len());
        }
        lengths
    });
    assert_eq!(journals, [3, 0]);
    for key in ["order-1", "order-2"] {
        assert_eq!(redis.status_json("checkout", key)["state"], "unknown");
    }
    let units = json(&dashboard.get("/api/units").body);
    assert_eq!(units["tasks"][0]["held_at_step"], 0, "{units}");
    assert_eq!(
        held_row(&units, "plain")["steps"],
        value!([{"position": 0, "step": null, "state": "in_doubt"}])
    );
}
