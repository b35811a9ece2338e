// The step checks follow the context wherever the body binds it: `let .. else`, a reference,
// a clone moved into a closure. Pins the defect where steps were told by the method's name
// alone; another type's `step` right next to them stays out of the checks.
use idempotask::{Error, idempotent_task};

struct Counter(u64);

impl Counter {
    fn step(&mut self, label: &str, by: u64) {
        self.0 += by + label.len() as u64;
    }
}

#[idempotent_task(key = "order-{order_id}")]
async fn checkout(order_id: u64, lines: Vec<u64>) -> Result<u64, Error> {
    let Some(task) = idempotask::context() else {
        return Err(Error::NotConfigured);
    };
    let journal = &task;
    let name = "charge";
    let mut counter = Counter(0);
    let charged = journal.step(name, async { Ok::<_, Error>(order_id) }).await?;
    for line in &lines {
        counter.step(name, *line);
    }
    let shipped = lines.iter().map(|line| {
        let ctx = task.clone();
        async move { ctx.step("ship", async { Ok::<_, Error>(*line) }).await }
    });
    for ship in shipped {
        counter.step("shipped", ship.await?);
    }
    task.step("charge", async { Ok::<_, Error>(counter.0) }).await?;
    task.step("charge", async { Ok::<_, Error>(charged) }).await
}

fn main() {}
