//! The page's HTML, built on the server: every value that comes from the store, the command
//! line or a request goes through [`escape`], so a key or a result that holds markup shows as
//! text.

use std::fmt::Write;
use std::time::Duration;

use super::calls::Counters;
use super::view::{Row, StepRow, TaskView};
use crate::time::human;

/// Input: text. Output: the text with the five characters that mean something in HTML (in
/// content and in quoted attributes) replaced by their references.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The whole page: the header, each task's sections, and the confirmation dialog the buttons
/// open. `csrf` goes into the dialog's form.
pub(crate) fn page(scope: &str, views: &[TaskView], unread: &[String], csrf: &str) -> String {
    let csrf = escape(csrf);
    let scope = escape(scope);
    let sections = sections(views, unread);
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>idempotask dashboard</title>
<link rel="stylesheet" href="/assets/app.css">
<script src="/assets/app.js" defer></script>
</head>
<body>
<header><h1>idempotask</h1><p>Units in {scope}. <span id="refreshed">Refreshes every 5 s.</span></p></header>
<p id="outcome" role="status"></p>
<main id="units">{sections}</main>
<dialog id="confirm">
<form id="action-form" method="post" action="/action">
<input type="hidden" name="csrf" value="{csrf}">
<input type="hidden" name="action" id="confirm-action">
<input type="hidden" name="task" id="confirm-task">
<input type="hidden" name="digest" id="confirm-digest">
<p id="confirm-what"></p>
<label>Caller key <input name="key" id="confirm-key" required autocomplete="off"></label>
<label id="confirm-step-label">Step name, as the body gives it <input name="step" id="confirm-step" autocomplete="off"></label>
<label id="confirm-part-label">Its key part, for a step named with one <input name="part" id="confirm-part" autocomplete="off"></label>
<label id="confirm-result-label">Its result, as JSON <textarea name="result" id="confirm-result" rows="3"></textarea></label>
<label id="confirm-ttl-label">Kept for <input name="result_ttl" id="confirm-ttl" value="24h"></label>
<p><button type="submit" id="confirm-yes">Confirm</button> <button type="button" id="confirm-no">Cancel</button></p>
</form>
</dialog>
</body>
</html>
"#
    )
}

/// Each task's sections: what the page's script puts in place on every refresh.
pub(crate) fn sections(views: &[TaskView], unread: &[String]) -> String {
    let mut html = String::new();
    for failure in unread {
        let _ = write!(
            html,
            "<p class=\"error unread\">Metrics not read: {}</p>",
            escape(failure)
        );
    }
    for view in views {
        task(&mut html, view);
    }
    html
}

fn task(html: &mut String, view: &TaskView) {
    let name = escape(&view.task);
    let _ = write!(
        html,
        r#"<section class="task" data-task="{name}"><h2>{name}</h2>
<p class="counts"><span class="count done">{} done</span> <span class="count locked">{} locked</span> <span class="count held">{} in doubt</span> <span class="count flagged">{} flagged</span>{} <small>({} store calls, {} ms)</small></p>
"#,
        view.done,
        view.locked,
        view.in_doubt,
        view.flagged,
        view.ttl_used_max_percent
            .map_or_else(String::new, |percent| format!(
                " <span class=\"count ttl\">closest to its TTL: {percent}% used</span>"
            )),
        view.store_calls,
        view.elapsed_ms
    );
    if let Some(counted) = &view.calls {
        calls(html, counted);
    }
    let _ = write!(
        html,
        "<h3>In doubt (held): resolve each once you know whether its side effect happened</h3>"
    );
    held(html, view);
    html.push_str("<h3>Locked, closest to their lock TTL first</h3>");
    if view.locked_units.is_empty() {
        html.push_str("<p class=\"none\">None.</p>");
    } else {
        html.push_str("<table class=\"locked\"><tr><th>Key</th><th>Fencing token</th><th>Age</th><th>TTL left</th><th>TTL used</th></tr>");
        for row in &view.locked_units {
            let used = row.ttl_used_percent();
            let bar = used.map_or_else(String::new, |percent| {
                format!("<meter min=\"0\" max=\"100\" value=\"{percent}\"></meter> {percent}%")
            });
            let _ = write!(
                html,
                "<tr>{}<td>{}</td><td>{}</td><td>{}</td><td>{bar}</td></tr>",
                key_cell(row),
                token(row),
                ms(row.age_ms),
                row.lock_ttl_ms
                    .map_or_else(|| "never expires".to_owned(), |left| ms(Some(left))),
            );
        }
        html.push_str("</table>");
    }
    html.push_str("<h3>Done (one page)</h3>");
    if view.done_units.is_empty() {
        html.push_str("<p class=\"none\">None on this page.</p>");
    } else {
        html.push_str(
            "<table class=\"done\"><tr><th>Key</th><th>Result</th><th>Kept for</th><th></th></tr>",
        );
        for row in &view.done_units {
            let result = row
                .result
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            let _ = write!(
                html,
                "<tr>{}<td class=\"result\">{}</td><td>{}</td><td>{}</td></tr>",
                key_cell(row),
                escape(&result),
                row.marker_ttl_ms
                    .map_or_else(|| "always".to_owned(), |left| ms(Some(left))),
                button(&view.task, row, "forget", "Forget…"),
            );
        }
        html.push_str("</table>");
    }
    if let Some(next) = &view.done_next {
        let _ = write!(
            html,
            "<p><button type=\"button\" class=\"next\" data-task=\"{name}\" data-cursor=\"{}\">Next page of done units</button></p>",
            escape(next)
        );
    }
    html.push_str("</section>");
}

/// The units in doubt: each with its steps, and the buttons that settle it.
fn held(html: &mut String, view: &TaskView) {
    if view.held_units.is_empty() {
        html.push_str("<p class=\"none\">None.</p>");
    } else {
        if view.held_at_step > 0 {
            let _ = write!(
                html,
                "<p class=\"count held-at-step\">{} held at a step, with steps recorded: settle the step in doubt alone</p>",
                view.held_at_step
            );
        }
        html.push_str("<table class=\"held\"><tr><th>Key</th><th>Fencing token</th><th>Lock ran out</th><th>Remembered for</th><th>Steps</th><th></th></tr>");
        for row in &view.held_units {
            let (class, step_buttons) = match row.at_step() {
                Some(_) => (
                    " class=\"at-step\"",
                    format!(
                        "{}{}",
                        button(&view.task, row, "resolve_step", "Record the step…"),
                        button(&view.task, row, "discard", "Free, discard steps…"),
                    ),
                ),
                None => ("", String::new()),
            };
            let _ = write!(
                html,
                "<tr{class}>{}<td>{}</td><td>{} ago</td><td>{}</td><td>{}</td><td>{}{}{step_buttons}</td></tr>",
                key_cell(row),
                token(row),
                ms(row.expired_for_ms),
                ms(row.forgotten_in_ms),
                steps(row.steps.as_deref()),
                button(&view.task, row, "resolve", "Mark done…"),
                button(&view.task, row, "free", "Free (rerun)…"),
            );
        }
        html.push_str("</table>");
    }
}

/// A held unit's steps: each of its journal, then the step in doubt; never a value, only its
/// size.
fn steps(steps: Option<&[StepRow]>) -> String {
    let Some(steps) = steps else {
        return "<span class=\"none\">no journal</span>".to_owned();
    };
    if steps.len() <= 1 {
        return "<span class=\"none\">none recorded</span>".to_owned();
    }
    let mut html = String::from("<table class=\"steps\">");
    for step in steps {
        let (state, what) = match step.state {
            "finished" => ("finished", "finished"),
            "unstorable" => ("unstorable", "finished, value not stored"),
            "in_doubt" => (
                "in-doubt",
                "in doubt (or refused: the body changed its step order)",
            ),
            _ => ("unreadable", "not a journal entry"),
        };
        let name = step.step.as_deref().map_or_else(
            || "<span class=\"none\">the next step</span>".to_owned(),
            |name| format!("<span class=\"step-name\">{}</span>", escape(name)),
        );
        let size = step
            .value_bytes
            .map_or_else(String::new, |bytes| format!("{bytes} B"));
        let _ = write!(
            html,
            "<tr class=\"step {state}\"><td>{}</td><td>{name}</td><td>{what}</td><td class=\"size\">{size}</td></tr>",
            step.position
        );
    }
    html.push_str("</table>");
    html
}

/// What the workers counted of a task's calls, in one line.
fn calls(html: &mut String, calls: &Counters) {
    let recently = match (calls.gave_up_recently, calls.recently_s) {
        (Some(recent), Some(since)) => {
            format!(
                " ({recent} in the last {})",
                human(Duration::from_secs(since))
            )
        }
        _ => String::new(),
    };
    let _ = writeln!(
        html,
        r#"<p class="calls">Calls, as the workers counted them: <span class="count fresh">{} fresh</span> <span class="count duplicate">{} duplicate</span> <span class="count waited">{} waited</span> <span class="count gave-up{}">{} gave up{recently}</span> <span class="count failed">{} failed</span> <span class="count lost{}">{} lost</span> <span class="count held-calls">{} held</span></p>"#,
        calls.fresh,
        calls.duplicate,
        calls.waited,
        alert(calls.gave_up),
        calls.gave_up,
        calls.failed,
        alert(calls.lost),
        calls.lost,
        calls.held,
    );
}

/// The class that marks a count worth an operator's look: any at all.
fn alert(count: u64) -> &'static str {
    if count > 0 { " alert" } else { "" }
}

/// The key when it is shown, else the digest (Redis locks keep only the digest).
fn key_cell(row: &Row) -> String {
    match &row.key {
        Some(key) => format!("<td class=\"key\">{}</td>", escape(key)),
        None => format!(
            "<td class=\"key digest\">digest {}</td>",
            escape(&row.digest)
        ),
    }
}

fn token(row: &Row) -> String {
    row.fencing_token
        .map_or_else(|| "–".to_owned(), |token| token.to_string())
}

fn ms(value: Option<u64>) -> String {
    value.map_or_else(|| "–".to_owned(), |ms| human(Duration::from_millis(ms)))
}

/// A button that opens the confirmation dialog for `action` on the unit of `row`.
fn button(task: &str, row: &Row, action: &str, label: &str) -> String {
    format!(
        "<button type=\"button\" class=\"act {action}\" data-action=\"{action}\" data-task=\"{}\" data-digest=\"{}\" data-key=\"{}\">{label}</button>",
        escape(task),
        escape(&row.digest),
        escape(row.key.as_deref().unwrap_or_default()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_shown_as_text() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }
}
