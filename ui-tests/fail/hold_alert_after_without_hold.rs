// `hold_alert_after` raises the alarm on held units: without `in_doubt = "hold"` there are none.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", hold_alert_after = "1h")]
async fn rerun_by_default(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", in_doubt = "rerun", hold_alert_after = "30m")]
async fn rerun_said(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
