// A step in a `for` loop named by a literal alone: every item's run records the same name.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "newsletter-{issue}")]
async fn send_newsletter(issue: u64, recipients: Vec<String>) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let mut sent = 0;
    for recipient in &recipients {
        sent += ctx.step("mail", async { Ok::<_, Error>(recipient.len() as u64) }).await?;
    }
    Ok(issue + sent)
}

fn main() {}
