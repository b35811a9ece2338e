//! `crate = "…"`: a crate that re-exports idempotask (a company's own task framework, say)
//! names where it lives, and its users need no `idempotask` dependency of their own.
#![deny(warnings, clippy::pedantic)]

mod framework {
    pub(crate) use ::idempotask;
}

use framework::idempotask::{Error, MemoryStore, idempotent_task};

#[idempotent_task(key = "report-{day}", crate = "crate::framework::idempotask", fingerprint = [pages])]
async fn build_report(day: u32, pages: u32) -> Result<u32, Error> {
    Ok(day * pages)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    framework::idempotask::install(MemoryStore::new());
    assert_eq!(build_report(3, 4).await.unwrap(), 12);
}
