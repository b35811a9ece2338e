//! The defaults a consumer starts from: JetStream's `AckWait`, the nak backoffs and the failures
//! after which a message is terminated.

use std::time::Duration;

use idempotask::Backoff;

/// JetStream's `AckWait` when a consumer sets none.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
/// The nak delays of a message whose body failed ([`Idempotent::failure_backoff`](crate::Idempotent::failure_backoff)), by default:
/// 1 s after the first failure, doubling with each further one up to 60 s, without jitter.
pub const DEFAULT_FAILURE_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// The nak delays of a message whose store call failed ([`Idempotent::store_backoff`](crate::Idempotent::store_backoff)), by
/// default: 1 s after the first delivery, doubling with each further one up to 60 s, without
/// jitter.
pub const DEFAULT_STORE_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// The failure of a message's body after which it is terminated instead of tried again, by
/// default.
pub const DEFAULT_MAX_FAILURES: u32 = 5;
