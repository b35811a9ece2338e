// The attribute belongs on the implementation, which has a body.
use idempotask::{Error, idempotent_task};

trait Notifier {
    #[idempotent_task(key = "n-{user_id}")]
    async fn notify(&self, user_id: u64) -> Result<bool, Error>;
}

fn main() {}
