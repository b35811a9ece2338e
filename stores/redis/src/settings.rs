//! The connection settings every Redis store has, and their setters, written once for the
//! three builders.

use std::time::Duration;

use idempotask::store::MAX_KEY_LEN;

/// The namespace used when none is configured.
pub(crate) const DEFAULT_NAMESPACE: &str = "default";
/// How long connecting to one server may take before it fails, by default.
pub(crate) const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one store call may take before it fails, by default.
pub(crate) const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// What [`RedisStoreBuilder`](crate::RedisStoreBuilder),
/// [`RedisClusterStoreBuilder`](crate::RedisClusterStoreBuilder) and
/// [`RedlockStoreBuilder`](crate::RedlockStoreBuilder) all configure, with the same setters
/// (`connection_setters!`) and the same defaults ([`Default`]).
#[derive(Debug, Clone)]
pub(crate) struct ConnectionSettings {
    pub(crate) namespace: String,
    pub(crate) connection_timeout: Duration,
    /// `None` until set: each store says what it waits then (`RedlockStore` goes by its
    /// server timeout).
    pub(crate) response_timeout: Option<Duration>,
    pub(crate) max_key_len: usize,
    /// A private CA (PEM) trusted for `rediss://` instead of the system's roots.
    #[cfg(feature = "tls")]
    pub(crate) root_certificate: Option<Vec<u8>>,
}

impl ConnectionSettings {
    /// The response timeout as set, else [`DEFAULT_RESPONSE_TIMEOUT`].
    pub(crate) fn response_timeout(&self) -> Duration {
        self.response_timeout.unwrap_or(DEFAULT_RESPONSE_TIMEOUT)
    }
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        Self {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            response_timeout: None,
            max_key_len: MAX_KEY_LEN,
            #[cfg(feature = "tls")]
            root_certificate: None,
        }
    }
}

impl ConnectionSettings {
    /// The certificates redis-rs takes for `rediss://`: the private CA, no client certificate;
    /// `None` when the system's roots are trusted.
    #[cfg(feature = "tls")]
    pub(crate) fn tls_certificates(&self) -> Option<redis::TlsCertificates> {
        // rustls needs a process-wide crypto provider; another library may have installed one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        self.root_certificate
            .as_ref()
            .map(|pem| redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            })
    }
}

/// The setters of [`ConnectionSettings`], for a builder with a `settings` field; invoked inside
/// each builder's `impl` block so that every builder has every setter under the same name,
/// with the same docs and defaults.
macro_rules! connection_setters {
    () => {
        /// The namespace that separates applications sharing the same servers (default
        /// [`DEFAULT_NAMESPACE`](crate::RedisStore::DEFAULT_NAMESPACE), `"default"`).
        pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
            self.settings.namespace = namespace.into();
            self
        }

        /// How long connecting to one server may take (default
        /// [`DEFAULT_CONNECTION_TIMEOUT`](crate::RedisStore::DEFAULT_CONNECTION_TIMEOUT)).
        pub fn connection_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.settings.connection_timeout = timeout;
            self
        }

        /// How long one store call may wait for a server (default
        /// [`DEFAULT_RESPONSE_TIMEOUT`](crate::RedisStore::DEFAULT_RESPONSE_TIMEOUT)): its
        /// commands, a wait for a reconnection and a reloaded script included. A call still
        /// waiting then fails with kind `Timeout`, ambiguous (the command may have run); a
        /// server that is down and refuses connections fails it sooner. A task's `begin` tries
        /// a failing call three times, 50 and 100 ms apart, before the task call returns the
        /// error.
        ///
        /// How each store reconnects, re-sends and waits within this is in its Behaviour
        /// section: [`RedisStore`](crate::RedisStore#behaviour),
        /// [`RedisClusterStore`](crate::RedisClusterStore#behaviour),
        /// [`RedlockStore`](crate::RedlockStore#behaviour).
        pub fn response_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.settings.response_timeout = Some(timeout);
            self
        }

        /// The longest caller key accepted, in bytes (default
        /// [`MAX_KEY_LEN`](::idempotask::store::MAX_KEY_LEN)).
        pub fn max_key_len(mut self, max: usize) -> Self {
            self.settings.max_key_len = max;
            self
        }

        /// Trusts this CA (PEM) for `rediss://` servers instead of the system's roots: for
        /// servers behind a private certificate authority. `redis://` URLs stay plain TCP.
        #[cfg(feature = "tls")]
        #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
        pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
            self.settings.root_certificate = Some(pem.into());
            self
        }
    };
}
pub(crate) use connection_setters;
