// A step in an `async move` closure handed to an iterator adapter, named by a literal alone:
// the closure runs once per item, and every run records the same name.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "newsletter-{issue}")]
async fn send_newsletter(issue: u64, recipients: Vec<String>) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    let mails = recipients.iter().map(|recipient| {
        let ctx = ctx.clone();
        async move { ctx.step("mail", async { Ok::<_, Error>(recipient.len() as u64) }).await }
    });
    let mut sent = 0;
    for mail in mails {
        sent += mail.await?;
    }
    Ok(issue + sent)
}

fn main() {}
