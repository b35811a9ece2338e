//! Steps are calls on the task's context, wherever the body binds it (a reference, a clone, a
//! `let .. else`); a method named `step` on another type is the body's own code, left alone
//! even with a name that is not a literal, in a loop. Pins the defect where any two-argument
//! `.step(..)` was taken for a step.
#![deny(warnings, clippy::pedantic)]

use idempotask::{Error, MemoryStore, TaskContext, idempotent_task};

/// A simulation whose `step` has nothing to do with idempotask.
struct Simulation {
    ticks: u64,
}

impl Simulation {
    fn step(&mut self, label: &str, by: u64) -> u64 {
        self.ticks += by + u64::from(label.is_empty());
        self.ticks
    }
}

/// A helper the body hands its context to: its steps run in the unit's journal, and the
/// attribute, which sees the body alone, does not check their names.
async fn mail(ctx: &TaskContext, label: String) -> Result<String, Error> {
    ctx.step(("mail", label.clone()), async { Ok::<_, Error>(label) })
        .await
}

#[idempotent_task(key = "simulation-{run}")]
async fn simulate(run: u64, labels: Vec<String>) -> Result<u64, Error> {
    let Some(task) = idempotask::context() else {
        return Err(Error::NotConfigured);
    };
    let ctx = &task;
    let mut sim = Simulation { ticks: 0 };
    for label in &labels {
        sim.step(label, run);
    }
    let ticks = ctx
        .step("ticks", async { Ok::<_, Error>(sim.ticks) })
        .await?;
    let mailer = task.clone();
    let sent = mail(&mailer, format!("run {run}")).await?;
    let extra = mailer
        .step("mailed", async { Ok::<_, Error>(sent.len() as u64) })
        .await?;
    Ok(ticks + extra)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(MemoryStore::new());
    let labels = vec!["a".to_owned(), "b".to_owned()];
    assert_eq!(simulate(3, labels.clone()).await.unwrap(), 11);
    assert_eq!(simulate(3, labels).await.unwrap(), 11, "replayed");
}
