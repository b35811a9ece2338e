//! The builder setters a queue's consumer hands on to its [`ConsumerSettings`](crate::ConsumerSettings).

/// Writes a queue consumer's builder setters that hand their argument on to the
/// [`ConsumerSettings`](crate::ConsumerSettings) setter of the same name, held in the
/// consumer's `settings` field: each setter keeps the queue's own docs and signature, and none
/// repeats the settings' logic (the clamp of `max_failures`, the store's wrapping).
///
/// Inside an `impl` block of a type with a `settings: ConsumerSettings` field, list the
/// setters as `fn NAME(ARG: TYPE);`, each after its docs; every one becomes
/// `#[must_use] pub fn NAME(mut self, ARG: TYPE) -> Self`.
///
/// ```
/// use idempotask::store::Store;
/// use idempotask::{Backoff, MemoryStore, Task};
/// use idempotask_consumer::ConsumerSettings;
///
/// /// A queue's consumer.
/// pub struct Consumer {
///     settings: ConsumerSettings,
/// }
///
/// impl Consumer {
///     idempotask_consumer::settings_setters! {
///         /// Uses `store` instead of the installed one.
///         fn store(store: impl Store);
///         /// The failure on which a message goes to this queue's dead-letter topic.
///         fn max_failures(failures: u32);
///     }
/// }
///
/// let consumer = Consumer { settings: ConsumerSettings::new(Task::new("refund")) }
///     .store(MemoryStore::new())
///     .max_failures(3);
/// # let _ = consumer;
/// ```
#[macro_export]
macro_rules! settings_setters {
    ($($(#[$attr:meta])* fn $name:ident($arg:ident: $ty:ty);)*) => {
        $(
            $(#[$attr])*
            #[must_use]
            pub fn $name(mut self, $arg: $ty) -> Self {
                self.settings = self.settings.$name($arg);
                self
            }
        )*
    };
}
