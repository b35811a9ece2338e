//! `idempotask`: see what happened to a unit of work, forget one on purpose, list a task's keys,
//! resolve a unit in doubt, or do the same from a web page (`dashboard`).
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
//! idempotask --audit-log audit.jsonl dashboard --task charge_customer   # a web page on 127.0.0.1:8787
//! ```
//!
//! Exit codes: 0 done (or success), 1 error, 2 usage, 3 locked, 4 unknown key or task, 5 in
//! doubt.

mod args;
mod audit;
mod commands;
mod dashboard;
mod exit;
mod render;
mod resolve_step;
mod scan;
mod steps;
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
    // The dashboard refuses an unsafe start before it reaches the store.
    let dashboard = match &cli.command {
        Command::Dashboard {
            tasks,
            listen,
            token_file,
            hash_keys,
            metrics,
        } => {
            let options = dashboard::Options {
                tasks: tasks.clone(),
                listen: *listen,
                hash_keys: *hash_keys,
                audit_log: cli.audit_log.clone(),
                metrics: metrics.clone(),
            };
            let access = dashboard::prepare(&options, token_file.as_deref())?;
            Some((options, access))
        }
        _ => None,
    };
    let target = match (selected?, &cli.database_url) {
        (Selected::Postgres, Some(url)) => Target::postgres(url, &cli.table).await?,
        _ => Target::redis(&cli.redis_url, &cli.namespace).await?,
    };
    if let Some((options, access)) = dashboard {
        return dashboard::serve(target, options, access).await;
    }
    let found = match &cli.command {
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
            result_ttl,
            step,
            part,
            step_result: Some(value),
            yes,
            ..
        } => {
            // clap requires `--step` with `--step-result`.
            let step = resolve_step::HeldStep {
                name: step.clone().unwrap_or_default(),
                part: part.clone(),
                value: value.clone(),
                kept_for: *result_ttl,
            };
            resolve_step::resolve_step(&target, &unit.task, &unit.key, step, *yes).await
        }
        Command::Resolve {
            unit,
            result,
            result_ttl,
            discard_steps,
            yes,
            ..
        } => {
            // clap lets through exactly one of `--result`, `--free` and `--step-result`.
            let settle = match result {
                Some(result) => Settle::Record {
                    result: result.clone(),
                    result_ttl: *result_ttl,
                },
                None => Settle::Free {
                    discard_steps: *discard_steps,
                },
            };
            commands::resolve(&target, &unit.task, &unit.key, settle, *yes).await
        }
        Command::Dashboard { .. } => unreachable!("served above"),
    };
    audit_cli(cli, &target, &found);
    found
}

/// Appends what `resolve` or `forget` did (or why it refused) to `--audit-log`, the trail the
/// dashboard's actions go to as well.
fn audit_cli(cli: &Cli, target: &Target, found: &Result<Found, Failure>) {
    let (action, unit) = match &cli.command {
        Command::Forget { unit, .. } => ("forget", unit),
        Command::Resolve {
            unit,
            free,
            discard_steps,
            step_result,
            ..
        } => (
            if *discard_steps {
                "resolve_free_discarding_steps"
            } else if *free {
                "resolve_free"
            } else if step_result.is_some() {
                "resolve_step"
            } else {
                "resolve_record"
            },
            unit,
        ),
        _ => return,
    };
    let Some(path) = cli.audit_log.as_deref() else {
        return;
    };
    let digest = target
        .unit(&unit.task, &unit.key)
        .map(|unit| unit.digest().to_owned())
        .unwrap_or_default();
    let (outcome, detail) = match found {
        Ok(found) => ("ok", found.text.as_str()),
        Err(failure) => (failure.kind, failure.message.as_str()),
    };
    let entry = audit::Entry {
        who: &audit::cli_user(),
        action,
        task: &unit.task,
        digest: &digest,
        key: Some(&unit.key),
        outcome,
        detail,
    };
    if let Err(err) = audit::record(&entry, Some(path)) {
        eprintln!("warning: {err}");
    }
}
