//! `idempotask`: see what happened to a unit of work, forget one on purpose, list a task's keys,
//! resolve a unit in doubt.
//!
//! ```text
//! idempotask status --task charge_customer --key order-charge-42   # exit 0 done, 3 locked, 4 unknown, 5 in doubt
//! idempotask forget --task charge_customer --key order-charge-42 --yes
//! idempotask forget --task charge_customer --key order-charge-42 --force   # an unreadable marker
//! idempotask list --task charge_customer --locked --json
//! idempotask list --task charge_customer --in-doubt
//! idempotask resolve --task charge_customer --key order-charge-42 --result '{"id":"ch_1"}' --yes
//! idempotask resolve --task charge_customer --key order-charge-42 --free --yes
//! idempotask --database-url postgres://app@db/app status --task charge_customer --key order-charge-42
//! ```
//!
//! Exit codes: 0 done (or success), 1 error, 2 usage, 3 locked, 4 unknown key or task, 5 in
//! doubt.

mod args;
mod commands;
mod exit;
mod render;
mod scan;
mod stored;
mod target;
mod time;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use serde_json::json;

use crate::args::{Cli, Command, Selected};
use crate::commands::{Found, Only, Settle};
use crate::exit::{Exit, Failure};
use crate::target::Target;

fn main() -> ExitCode {
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches).map(|cli| (cli, matches)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                Exit::Usage.into()
            } else {
                Exit::Ok.into() // --help, --version
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return Exit::Error.into();
        }
    };
    let selected = args::select(&cli, &matches).map_err(Failure::usage);
    match runtime.block_on(run(&cli, selected)) {
        Ok(found) => {
            if cli.json {
                println!("{}", found.json);
            } else {
                println!("{}", found.text);
            }
            found.exit.into()
        }
        Err(failure) => {
            if cli.json {
                let error =
                    json!({ "error": { "kind": failure.kind, "message": failure.message } });
                println!("{error}");
            }
            eprintln!("error: {failure}");
            failure.exit.into()
        }
    }
}

async fn run(cli: &Cli, selected: Result<Selected, Failure>) -> Result<Found, Failure> {
    let target = match (selected?, &cli.database_url) {
        (Selected::Postgres, Some(url)) => Target::postgres(url, &cli.table).await?,
        _ => Target::redis(&cli.redis_url, &cli.namespace).await?,
    };
    match &cli.command {
        Command::Status(unit) => commands::status(&target, &unit.task, &unit.key).await,
        Command::Forget { unit, yes, force } => {
            commands::forget(&target, &unit.task, &unit.key, *yes, *force).await
        }
        Command::List {
            task,
            locked,
            done,
            in_doubt,
            older_than,
        } => {
            let only = match (*locked, *done, *in_doubt) {
                (true, _, _) => Only::Locked,
                (_, true, _) => Only::Done,
                (_, _, true) => Only::InDoubt {
                    older_than: *older_than,
                },
                _ => Only::All,
            };
            commands::list(&target, task, only).await
        }
        Command::Resolve {
            unit,
            result,
            result_ttl,
            yes,
            ..
        } => {
            // clap lets through exactly one of `--result` and `--free`.
            let settle = match result {
                Some(result) => Settle::Record {
                    result: result.clone(),
                    result_ttl: *result_ttl,
                },
                None => Settle::Free,
            };
            commands::resolve(&target, &unit.task, &unit.key, settle, *yes).await
        }
    }
}
