//! The core's [`Operator`] for [`RedisStore`] and [`RedisClusterStore`]: a key's [`Stored`]
//! value as the [`Held`] every store answers, and a listing one `SCAN` call per page (on each
//! master in turn, for a cluster).

use std::time::Duration;

use idempotask::operator::{
    Cursor, Forgot, Held, Listed, Operator, Page, Resolution, Resolved, Scope,
};
use idempotask::store::{Doubt, Journal, Store, StoreError, StoreErrorKind, UnitOfWork};
use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, Value};

use super::{Reading, Stored};
use crate::protocol::Protocol;
use crate::{RedisClusterStore, RedisStore};

/// The most keys one page's `SCAN` looks at.
const PAGE_MAX: usize = 10_000;

/// Input: a key's reading. Output: what an operator is shown of it.
fn held(reading: Reading) -> Held {
    let now_us = reading.server_time_us();
    match reading.into_stored() {
        Stored::Missing | Stored::Released { .. } => Held::Nothing,
        Stored::Lock {
            fencing_token,
            lock_ttl_remaining,
        } => Held::lock(
            fencing_token,
            lock_ttl_remaining,
            // A fencing token is the server's clock in microseconds when it was granted.
            fencing_token.map(|granted| Duration::from_micros(now_us.saturating_sub(granted))),
        ),
        Stored::InDoubt {
            bytes,
            fencing_token,
            expired_for,
            forgotten_in,
        } => Held::in_doubt(bytes, Doubt::new(fencing_token, expired_for), forgotten_in),
        Stored::Marker { bytes, ttl, .. } => Held::marker(bytes, ttl),
        Stored::Foreign { bytes } => Held::foreign(bytes),
        Stored::OtherType { kind } => Held::other_type(kind),
    }
}

/// A cursor this store cannot read, refused before anything is sent.
fn not_a_cursor(cursor: &Cursor, layout: &str) -> StoreError {
    StoreError::new(
        "list",
        StoreErrorKind::Configuration,
        format!(
            "`{cursor}` is not a cursor of this store's listings ({layout}); start from the first page, or pass the `next` of the page before"
        ),
    )
}

/// What one page found on one server.
struct Found {
    units: Vec<Listed>,
    keys_seen: usize,
    /// Where that server's `SCAN` stands after it: 0 when it is done.
    next: u64,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Protocol<C> {
    /// Input: a task, where its `SCAN` on one server stands, about how many keys to look at,
    /// and how to send the `SCAN` there. Output: one page's units, as an operator is shown them.
    async fn page_on<F, Fut>(
        &self,
        task: &str,
        cursor: u64,
        limit: usize,
        mut send: F,
    ) -> Result<Found, StoreError>
    where
        F: FnMut(Cmd) -> Fut,
        Fut: Future<Output = Result<Value, RedisError>>,
    {
        let count = limit.clamp(1, PAGE_MAX);
        let scanned = self.scan_page(task, cursor, count, &mut send).await?;
        let units = scanned
            .readings
            .into_iter()
            .filter_map(|(digest, reading)| match held(reading) {
                Held::Nothing => None,
                held => Some(Listed::new(task, digest, held)),
            })
            .collect();
        Ok(Found {
            units,
            keys_seen: scanned.keys_seen,
            next: scanned.next,
        })
    }
}

/// Implements [`Operator`] for a store of a [`Protocol`] in its `protocol` field, whose
/// `list_page` lists.
macro_rules! delegate_operator {
    ($ty:ty) => {
        impl Operator for $ty {
            fn scope(&self) -> Scope {
                Scope::new("namespace", &*self.protocol.namespace)
                    .with_max_key_len(self.protocol.max_key_len)
            }

            fn location(&self, unit: &UnitOfWork) -> String {
                self.protocol.key(unit)
            }

            async fn read(&self, unit: &UnitOfWork) -> Result<Held, StoreError> {
                self.protocol.read_unit(unit).await.map(held)
            }

            async fn list(
                &self,
                task: &str,
                from: Option<&Cursor>,
                limit: usize,
            ) -> Result<Page, StoreError> {
                self.list_page(task, from, limit).await
            }

            async fn forget_exact(
                &self,
                unit: &UnitOfWork,
                shown: &[u8],
            ) -> Result<Forgot, StoreError> {
                self.protocol.forget_exact(unit, shown).await
            }

            async fn resolve_exact(
                &self,
                unit: &UnitOfWork,
                shown: &[u8],
                resolution: &Resolution,
            ) -> Result<Resolved, StoreError> {
                self.protocol.resolve_exact(unit, shown, resolution).await
            }

            async fn task_exists(&self, task: &str) -> Result<bool, StoreError> {
                self.task_has_keys(task).await
            }

            async fn journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
                Store::read_journal(self, unit).await
            }

            // A lock keeps only its key's digest, and the journal is named after the unit's key.
            async fn listed_journal(&self, listed: &Listed) -> Result<Journal, StoreError> {
                let namespace = &self.protocol.namespace;
                let key = crate::keys::digest_key(namespace, &listed.task, &listed.digest);
                self.protocol.journal("journal", &key).await
            }
        }
    };
}

delegate_operator!(RedisStore);
delegate_operator!(RedisClusterStore);

/// A listing on one server: the cursor is where its `SCAN` stands, in decimal.
impl RedisStore {
    async fn list_page(
        &self,
        task: &str,
        from: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let cursor = match from {
            Some(from) => from
                .as_str()
                .parse()
                .map_err(|_| not_a_cursor(from, "a `SCAN` cursor"))?,
            None => 0,
        };
        let send = |cmd: Cmd| {
            let protocol = &self.protocol;
            async move { protocol.query(&cmd).await }
        };
        let found = self.protocol.page_on(task, cursor, limit, send).await?;
        let next = (found.next != 0).then(|| Cursor::new(found.next.to_string()));
        Ok(Page::new(found.units, found.keys_seen, next))
    }
}

/// A cluster's cursor: where the `SCAN` of one master stands, and that master, as
/// `<scan cursor>/<port>/<host>` (the host last, so that an IPv6 address keeps its colons).
fn master_cursor(scan: u64, (host, port): &(String, u16)) -> Cursor {
    Cursor::new(format!("{scan}/{port}/{host}"))
}

/// Reads a [`master_cursor`].
fn read_master_cursor(cursor: &Cursor) -> Result<(u64, (String, u16)), StoreError> {
    let refused = || not_a_cursor(cursor, "`<scan cursor>/<port>/<host>`");
    let mut parts = cursor.as_str().splitn(3, '/');
    let mut next = || parts.next().ok_or_else(refused);
    let scan = next()?.parse().map_err(|_| refused())?;
    let port = next()?.parse().map_err(|_| refused())?;
    let host = next()?;
    if host.is_empty() {
        return Err(refused());
    }
    Ok((scan, (host.to_owned(), port)))
}

/// A listing walks the masters one after the other, in the order of
/// [`masters`](RedisClusterStore::masters), each with `SCAN`; while slots move, a unit whose
/// key moves from a master not walked yet to one walked already is missed, as
/// [`list_task`](RedisClusterStore::list_task) says.
impl RedisClusterStore {
    async fn list_page(
        &self,
        task: &str,
        from: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let from = from.map(read_master_cursor).transpose()?;
        let masters = self.masters().await?;
        // The master the cursor stood on; if it is gone (the cluster changed), the one that
        // comes after it, from the start.
        let (index, cursor) = match &from {
            None => (0, 0),
            Some((cursor, master)) => match masters.binary_search(master) {
                Ok(index) => (index, *cursor),
                Err(index) => (index, 0),
            },
        };
        let Some((host, port)) = masters.get(index) else {
            return Ok(Page::new(Vec::new(), 0, None).with_servers_scanned(0));
        };
        let send = self.on_master(host, *port);
        let found = self.protocol.page_on(task, cursor, limit, send).await?;
        if found.next != 0 {
            let next = master_cursor(found.next, &masters[index]);
            return Ok(Page::new(found.units, found.keys_seen, Some(next)));
        }
        let next = masters
            .get(index + 1)
            .map(|master| master_cursor(0, master));
        Ok(Page::new(found.units, found.keys_seen, next).with_servers_scanned(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_cursors_read_back_and_refuse_what_they_are_not() {
        let master = ("::1".to_owned(), 7001);
        let cursor = master_cursor(1792, &master);
        assert_eq!(cursor.as_str(), "1792/7001/::1");
        assert_eq!(read_master_cursor(&cursor).unwrap(), (1792, master));
        for text in [
            "",
            "17",
            "17/",
            "17/x/h",
            "17/7001/",
            "-1/7001/h",
            "17/70000/h",
        ] {
            let err = read_master_cursor(&Cursor::new(text)).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Configuration, "{text}");
        }
    }
}
