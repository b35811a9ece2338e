//! `idempotask`: see what happened to a unit of work, forget one on purpose, list a task's keys.
//!
//! ```text
//! idempotask status --task charge_customer --key order-charge-42   # exit 0 done, 3 locked, 4 unknown
//! idempotask forget --task charge_customer --key order-charge-42 --yes
//! idempotask forget --task charge_customer --key order-charge-42 --force   # an unreadable marker
//! idempotask list --task charge_customer --locked --json
//! ```
//!
//! Exit codes: 0 done (or success), 1 error, 2 usage, 3 locked, 4 unknown key or task.

mod args;
mod commands;
mod exit;
mod kind;
mod render;
mod scan;
mod stored;
mod target;
mod time;

use std::process::ExitCode;

use clap::Parser;
use serde_json::json;

use crate::args::{Cli, Command};
use crate::commands::Found;
use crate::exit::{Exit, Failure};
use crate::target::Target;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
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
    match runtime.block_on(run(&cli)) {
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

async fn run(cli: &Cli) -> Result<Found, Failure> {
    let target = Target::connect(&cli.redis_url, &cli.namespace).await?;
    match &cli.command {
        Command::Status(unit) => commands::status(&target, &unit.task, &unit.key).await,
        Command::Forget { unit, yes, force } => {
            commands::forget(&target, &unit.task, &unit.key, *yes, *force).await
        }
        Command::List { task, locked, done } => commands::list(&target, task, *locked, *done).await,
    }
}
