//! `dashboard`: a web page for operators, served by the CLI on the store it was pointed at.
//!
//! The page is rendered on the server (every value from the store escaped), styled and
//! refreshed by two small assets compiled into the binary; it needs no build step. Each
//! request needs the token ([`auth`]); the buttons post to the same code paths as `resolve` and
//! `forget`, and each change goes to the audit trail.

mod auth;
mod calls;
mod render;
mod routes;
mod state;
mod view;

use std::path::Path;
use std::sync::Arc;

use crate::commands::Found;
use crate::exit::{Exit, Failure};
use crate::target::Target;

pub(crate) use auth::Access;
pub(crate) use state::Options;
use state::Shared;

/// Input: the options, and the token file if one was given. Output: the access the dashboard
/// grants, or why it must not start (a non-loopback address without a token, a task name no
/// task can have, an unreadable token file). Runs before the store is reached.
pub(crate) fn prepare(options: &Options, token_file: Option<&Path>) -> Result<Access, Failure> {
    for task in &options.tasks {
        Target::check_task(task)?;
    }
    for source in &options.metrics {
        calls::check_source(source)?;
    }
    Access::from_env_or_file(token_file, options.listen)
}

/// Serves the dashboard until the process is stopped; answers only when it cannot listen.
pub(crate) async fn serve(
    target: Target,
    options: Options,
    access: Access,
) -> Result<Found, Failure> {
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|err| {
            Failure::new(
                Exit::Error,
                "listen",
                format!("cannot listen on {}: {err}", options.listen),
            )
        })?;
    let bound = listener
        .local_addr()
        .map_err(|err| Failure::new(Exit::Error, "listen", format!("no local address: {err}")))?;
    // The line tests and operators read: where to go, and how to log in.
    eprintln!(
        "dashboard: listening on http://{bound}/ ; open {}",
        access.login_hint(bound)
    );
    let shared = Arc::new(Shared {
        target,
        options,
        access,
        recent: tokio::sync::Mutex::new(None),
        // No redirects: a metrics page sends the dashboard nowhere but where it was pointed.
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default(),
        history: std::sync::Mutex::new(calls::History::default()),
    });
    axum::serve(listener, routes::router(shared))
        .await
        .map_err(|err| Failure::new(Exit::Error, "serve", format!("the server stopped: {err}")))?;
    Err(Failure::new(
        Exit::Error,
        "serve",
        "the server stopped".to_owned(),
    ))
}
