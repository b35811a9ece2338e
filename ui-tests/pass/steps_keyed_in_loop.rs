//! A step that runs once per item names each run by a key part: in a `for` loop, and in an
//! `async move` closure handed to an iterator adapter.
#![deny(warnings, clippy::pedantic)]

use std::sync::atomic::{AtomicU64, Ordering};

use idempotask::{Error, MemoryStore, idempotent_task};

static MAILS: AtomicU64 = AtomicU64::new(0);

#[idempotent_task(key = "newsletter-{issue}")]
async fn send_newsletter(issue: u64, recipients: &[&str]) -> Result<u64, Error> {
    let ctx = idempotask::context().expect("inside a task");
    for recipient in recipients {
        ctx.step(("mail", recipient), async {
            Ok::<_, Error>(MAILS.fetch_add(1, Ordering::SeqCst))
        })
        .await?;
    }
    let texts = recipients.iter().enumerate().map(|(place, recipient)| {
        let ctx = ctx.clone();
        async move {
            ctx.step(("sms", place), async move {
                Ok::<_, Error>(format!("issue {issue} for {recipient}"))
            })
            .await
        }
    });
    let mut sent = 0;
    for text in texts {
        sent += u64::from(!text.await?.is_empty());
    }
    Ok(sent)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert_eq!(send_newsletter(1, &["ada", "grace"]).await.unwrap(), 2);
    assert_eq!(MAILS.load(Ordering::SeqCst), 2);
}
