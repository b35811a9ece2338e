//! The dashboard's routes: the page, the sections its script refreshes, a JSON view of the
//! same, the two assets, and the action every button posts to.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Extension, Form, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::auth::{COOKIE, Caller, same, same_origin};
use super::calls;
use super::render::{self, escape};
use super::state::{FRESH, Recent, Shared};
use super::view::{self, TaskView};
use crate::audit;
use crate::commands::{self, Settle};
use crate::exit::{Exit, Failure};
use crate::resolve_step::{HeldStep, resolve_step};
use crate::target::Target;
use crate::time::parse_ttl;

const APP_JS: &str = include_str!("app.js");
const APP_CSS: &str = include_str!("app.css");

/// No script but the page's own file, no inline script or style, no framing, posts only to
/// this host.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// Input: what the handlers share. Output: the dashboard's router, every route behind the
/// token and every answer with the security headers.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/fragment", get(fragment))
        .route("/api/units", get(units))
        .route("/assets/app.js", get(js))
        .route("/assets/app.css", get(css))
        .route("/action", post(action))
        .layer(middleware::from_fn_with_state(shared.clone(), guard))
        .layer(middleware::map_response(secure))
        .with_state(shared)
}

/// The headers every answer carries, a refusal included.
async fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Lets through a request with the token or a live session; turns `GET /?token=<token>` into a
/// session (and a redirect that takes the token out of the address bar); refuses anything else
/// with 401.
async fn guard(State(shared): State<Arc<Shared>>, mut request: Request, next: Next) -> Response {
    if let Some(caller) = shared.access.caller(request.headers()) {
        request.extensions_mut().insert(Arc::new(caller));
        return next.run(request).await;
    }
    let login = Query::<Login>::try_from_uri(request.uri())
        .ok()
        .and_then(|Query(login)| login.token);
    if request.method() == Method::GET
        && request.uri().path() == "/"
        && login.is_some_and(|token| shared.access.is_token(&token))
    {
        let session = shared.access.open_session();
        let cookie = format!("{COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/");
        let mut response = Redirect::to("/").into_response();
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, value);
        }
        return response;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "401: the dashboard needs its token: open /?token=<token> once, or send `Authorization: Bearer <token>`\n",
    )
        .into_response()
}

async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
}

async fn css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS)
}

/// The query of a login: `/?token=<token>`, percent-decoded.
#[derive(Debug, Deserialize)]
struct Login {
    token: Option<String>,
}

/// Which page of done units a request wants: from `from`, for `task`.
#[derive(Debug, Default, Deserialize)]
struct Paging {
    task: Option<String>,
    from: Option<String>,
}

/// The most tasks that only the metrics name which a refresh walks.
const MAX_DISCOVERED: usize = 20;

/// Every task's view; the one `paging` names from its cursor. A walk younger than [`FRESH`] for
/// the same page answers instead of a new one.
async fn views(shared: &Shared, paging: &Paging) -> Result<(Vec<TaskView>, Vec<String>), Response> {
    let key = (paging.task.clone(), paging.from.clone());
    let fresh = |recent: &Option<Recent>| {
        recent
            .as_ref()
            .filter(|last| last.paging == key && last.at.elapsed() < FRESH)
            .map(|last| (last.views.clone(), last.unread.clone()))
    };
    if let Some(answer) = fresh(&*shared.recent.lock().await) {
        return Ok(answer);
    }
    // The metrics are read before the walk's lock is taken, so that a page that hangs delays
    // this refresh only, not the actions and the other pages waiting on that lock.
    let mut read = if shared.options.metrics.is_empty() {
        calls::Read::default()
    } else {
        calls::read(&shared.client, &shared.options.metrics).await
    };
    let mut recent = shared.recent.lock().await;
    if let Some(answer) = fresh(&recent) {
        return Ok(answer);
    }
    if !shared.options.metrics.is_empty() {
        shared
            .history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(Instant::now(), &mut read);
    }
    // The tasks asked for, then those only the metrics name, up to a bound: each is a walk of
    // the store, and a metrics page is not the operator.
    let mut tasks = shared.options.tasks.clone();
    let named: Vec<String> = read
        .tasks
        .keys()
        .filter(|task| !tasks.contains(task) && Target::check_task(task).is_ok())
        .cloned()
        .collect();
    let (walked, left) = named.split_at(named.len().min(MAX_DISCOVERED));
    tasks.extend_from_slice(walked);
    if !left.is_empty() {
        read.failures.push(format!(
            "{} more tasks in the metrics are not shown (the first {MAX_DISCOVERED} are): {}; name the ones to watch with --task",
            left.len(),
            left.join(", ")
        ));
    }
    let mut views = Vec::new();
    for task in &tasks {
        let from = paging
            .from
            .as_deref()
            .filter(|_| paging.task.as_deref() == Some(task.as_str()));
        let mut view = view::task_view(&shared.target, task, shared.options.hash_keys, from)
            .await
            .map_err(|failure| {
                (
                    StatusCode::BAD_GATEWAY,
                    Html(format!(
                        "<p class=\"error\">{}</p>",
                        escape(&failure.message)
                    )),
                )
                    .into_response()
            })?;
        view.calls = read.tasks.remove(task);
        views.push(view);
    }
    let unread = read.failures;
    *recent = Some(Recent {
        at: Instant::now(),
        paging: key,
        views: views.clone(),
        unread: unread.clone(),
    });
    Ok((views, unread))
}

async fn index(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Arc<Caller>>,
) -> Response {
    let csrf = match caller.as_ref() {
        Caller::Session { csrf } => csrf.as_str(),
        Caller::Bearer => "",
    };
    match views(&shared, &Paging::default()).await {
        Ok((views, unread)) => Html(render::page(
            &shared.target.scope_text(),
            &views,
            &unread,
            csrf,
        ))
        .into_response(),
        Err(response) => response,
    }
}

async fn fragment(State(shared): State<Arc<Shared>>, Query(paging): Query<Paging>) -> Response {
    match views(&shared, &paging).await {
        Ok((views, unread)) => Html(render::sections(&views, &unread)).into_response(),
        Err(response) => response,
    }
}

async fn units(State(shared): State<Arc<Shared>>, Query(paging): Query<Paging>) -> Response {
    match views(&shared, &paging).await {
        Ok((views, unread)) => {
            let (scope, name) = shared.target.scope();
            Json(json!({ scope: name, "tasks": views, "metrics_unread": unread })).into_response()
        }
        Err(response) => response,
    }
}

/// What a button posts.
#[derive(Debug, Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    action: String,
    task: String,
    key: String,
    /// The digest of the row the button was on: the key typed must be that unit's.
    #[serde(default)]
    digest: String,
    #[serde(default)]
    result: String,
    #[serde(default)]
    result_ttl: String,
    /// `resolve_step`: the step in doubt's name, and its key part (empty: none).
    #[serde(default)]
    step: String,
    #[serde(default)]
    part: String,
}

/// Resolves, frees or forgets one unit, as `resolve` and `forget` do (and only while it still
/// holds what was read), writes the audit line, and answers `{ok, kind, message}`.
async fn action(
    State(shared): State<Arc<Shared>>,
    Extension(caller): Extension<Arc<Caller>>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Caller::Session { csrf } = caller.as_ref()
        && (!same(form.csrf.as_bytes(), csrf.as_bytes()) || !same_origin(&headers))
    {
        return answer(
            StatusCode::FORBIDDEN,
            "csrf",
            "refused: the form's CSRF token or the request's origin is not this page's; nothing was changed; reload the page",
        );
    }
    let acted = act(&shared, &form).await;
    // The next refresh shows what the action changed.
    *shared.recent.lock().await = None;
    let (name, done) = match acted {
        Ok((name, found)) => (name, Ok(found.text)),
        Err((name, failure)) => (name, Err(failure)),
    };
    let digest = shared
        .target
        .unit(&form.task, &form.key)
        .map(|unit| unit.digest().to_owned())
        .unwrap_or_default();
    let (outcome, said) = match &done {
        Ok(text) => ("ok", text.as_str()),
        Err(failure) => (failure.kind, failure.message.as_str()),
    };
    // The commands' words name the key; a trail of hashed keys must not.
    let detail = if shared.options.hash_keys && !form.key.is_empty() {
        said.replace(&form.key, "<key>")
    } else {
        said.to_owned()
    };
    let detail = detail.as_str();
    let entry = audit::Entry {
        who: &shared.access.who(),
        action: name,
        task: &form.task,
        digest: &digest,
        key: Some(form.key.as_str()).filter(|_| !shared.options.hash_keys),
        outcome,
        detail,
    };
    let mut message = detail.to_owned();
    match audit::record(&entry, shared.options.audit_log.as_deref()) {
        Ok(line) => eprintln!("audit: {line}"),
        Err(err) => {
            eprintln!("error: {err}");
            message = format!("{message} (warning: {err})");
        }
    }
    let status = match &done {
        Ok(_) => StatusCode::OK,
        Err(failure) if failure.exit == Exit::Usage => StatusCode::BAD_REQUEST,
        Err(_) => StatusCode::CONFLICT,
    };
    answer(status, outcome, &message)
}

/// Input: a checked form. Output: the action's name for the audit trail, and what the command
/// found or why it refused.
async fn act(
    shared: &Shared,
    form: &ActionForm,
) -> Result<(&'static str, commands::Found), (&'static str, Failure)> {
    let name = match form.action.as_str() {
        "resolve" => "resolve_record",
        "free" => "resolve_free",
        "discard" => "resolve_free_discarding_steps",
        "resolve_step" => "resolve_step",
        "forget" => "forget",
        _ => "unknown",
    };
    let fail = |failure| (name, failure);
    if !shared.options.tasks.contains(&form.task) {
        return Err(fail(Failure::usage(format!(
            "task `{}` is not one this dashboard shows",
            form.task
        ))));
    }
    let unit = shared.target.unit(&form.task, &form.key).map_err(fail)?;
    if !form.digest.is_empty() && unit.digest() != form.digest {
        return Err(fail(Failure::usage(
            "the key typed is not this unit's: its digest differs from the row's; nothing was changed",
        )));
    }
    let target = &shared.target;
    let (task, key) = (form.task.as_str(), form.key.as_str());
    let found = match form.action.as_str() {
        "resolve" => {
            let (result, result_ttl) = result_and_ttl(form).map_err(fail)?;
            let settle = Settle::Record { result, result_ttl };
            commands::resolve(target, task, key, settle, true).await
        }
        "resolve_step" => {
            let (value, kept_for) = result_and_ttl(form).map_err(fail)?;
            let name = form.step.trim();
            if name.is_empty() {
                return Err(fail(Failure::usage(
                    "name the step in doubt, as the body gives it; nothing was changed",
                )));
            }
            let part = Some(form.part.as_str()).filter(|part| !part.is_empty());
            let step = HeldStep {
                name: name.to_owned(),
                part: part.map(str::to_owned),
                value,
                kept_for,
            };
            resolve_step(target, task, key, step, true).await
        }
        "free" | "discard" => {
            let discard_steps = form.action == "discard";
            let settle = Settle::Free { discard_steps };
            commands::resolve(target, task, key, settle, true).await
        }
        "forget" => commands::forget(target, task, key, true, false).await,
        other => Err(Failure::usage(format!(
            "unknown action `{other}`: resolve, resolve_step, free, discard or forget"
        ))),
    };
    found.map(|found| (name, found)).map_err(fail)
}

/// Input: a form that records a value. Output: its value as JSON and how long it is kept (24 h
/// when not given), or why they are refused.
fn result_and_ttl(form: &ActionForm) -> Result<(Box<RawValue>, std::time::Duration), Failure> {
    let result = RawValue::from_string(form.result.trim().to_owned()).map_err(|err| {
        Failure::usage(format!(
            "the result is not JSON ({err}); nothing was changed"
        ))
    })?;
    let ttl = match form.result_ttl.trim() {
        "" => "24h",
        ttl => ttl,
    };
    Ok((result, parse_ttl(ttl).map_err(Failure::usage)?))
}

fn answer(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        Json(json!({ "ok": status == StatusCode::OK, "kind": kind, "message": message })),
    )
        .into_response()
}
