//! Whether the server has a native compare-and-set (`SET … IFEQ`, Valkey 8.1+ and Redis 8.4+),
//! which lets `finish` and `renew` be plain commands instead of scripts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// How often a store whose server had no `SET … IFEQ` tries it again.
const PROBE_AGAIN_AFTER_MS: u64 = 5_000;

/// What a store last found out about `SET … IFEQ`, shared by its clones.
#[derive(Clone)]
pub(super) struct NativeCas {
    /// Whether the server has it.
    has: Arc<AtomicBool>,
    /// While it has not: when to try it again, in ms since `created` (a failover, a rolling
    /// upgrade or a restart can put a server that has it behind the same address).
    probe_again_at: Arc<AtomicU64>,
    created: Instant,
}

impl NativeCas {
    /// As `connect`'s probe found it.
    pub(super) fn new(has: bool) -> Self {
        Self {
            has: Arc::new(AtomicBool::new(has)),
            probe_again_at: Arc::new(AtomicU64::new(PROBE_AGAIN_AFTER_MS)),
            created: Instant::now(),
        }
    }

    /// Whether `finish` and `renew` run as plain `SET … IFEQ` commands, as last found out.
    pub(super) fn known(&self) -> bool {
        self.has.load(Ordering::Relaxed)
    }

    /// Whether the next `finish` or `renew` tries `SET … IFEQ`: yes where the server has it,
    /// and once every few seconds where it had not (one caller at a time), since another
    /// server may answer at the same address now. A server without it refuses the command
    /// before doing anything, so a try costs one round trip.
    pub(super) fn try_now(&self) -> bool {
        if self.known() {
            return true;
        }
        let now = self.elapsed_ms();
        let due = self.probe_again_at.load(Ordering::Relaxed);
        now >= due
            && self
                .probe_again_at
                .compare_exchange(
                    due,
                    now + PROBE_AGAIN_AFTER_MS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// The server refused `SET … IFEQ` (a syntax error, before doing anything): the scripts
    /// until it is tried again.
    pub(super) fn refused(&self) {
        self.has.store(false, Ordering::Relaxed);
        self.probe_again_at
            .store(self.elapsed_ms() + PROBE_AGAIN_AFTER_MS, Ordering::Relaxed);
    }

    /// The server ran `SET … IFEQ`: tried again after a fallback, it has it now.
    pub(super) fn answered(&self) {
        self.has.store(true, Ordering::Relaxed);
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.created.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}
