//! A TCP proxy between a client and Redis that can lose a reply, or stall a request, on purpose.
//!
//! Armed with [`Proxy::swallow_next_reply`], it forwards the next request to Redis, which applies
//! it, then throws the reply away and closes the client's connection: the client cannot tell
//! whether its command ran. With [`Proxy::hold_requests_containing`], a request that holds
//! given bytes (a script's SHA1, say) waits, with everything after it on its connection, until
//! [`Proxy::release`]: a server that stalls at one exact command.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A proxy on a free loopback port in front of `upstream`; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    swallow: Arc<AtomicBool>,
    swallowed: Arc<AtomicU64>,
    hold: Arc<Hold>,
    accept: JoinHandle<()>,
}

/// The requests to hold: those containing `pattern`, until the next release. `releases`
/// counts them, so that a hold set again right after a release never keeps the requests the
/// release let go.
struct Hold {
    pattern: Mutex<Option<Vec<u8>>>,
    releases: watch::Sender<u64>,
    held: AtomicU64,
}

impl Hold {
    /// The releases so far when `request` is to wait for the next one, counting it; `None` when
    /// it goes on.
    fn holds(&self, request: &[u8]) -> Option<u64> {
        let pattern = self.pattern.lock().unwrap();
        let pattern = pattern.as_deref()?;
        if !request
            .windows(pattern.len())
            .any(|window| window == pattern)
        {
            return None;
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        Some(*self.releases.borrow())
    }

    /// Lets every held request go, and holds no more.
    fn release(&self) {
        *self.pattern.lock().unwrap() = None;
        self.releases.send_modify(|releases| *releases += 1);
    }
}

impl Proxy {
    /// A proxy on a free loopback port in front of `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let swallow = Arc::new(AtomicBool::new(false));
        let swallowed = Arc::new(AtomicU64::new(0));
        let hold = Arc::new(Hold {
            pattern: Mutex::new(None),
            releases: watch::channel(0).0,
            held: AtomicU64::new(0),
        });
        let accept = {
            let (swallow, swallowed, hold) = (swallow.clone(), swallowed.clone(), hold.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let connection = (swallow.clone(), swallowed.clone(), hold.clone());
                    tokio::spawn(pump(client, server, connection));
                }
            })
        };
        Self {
            addr,
            swallow,
            swallowed,
            hold,
            accept,
        }
    }

    /// `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The proxy's port, for a cluster node to announce (see
    /// [`serve_every_slot`](crate::cluster::serve_every_slot)).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Loses the next reply from Redis and closes that client connection.
    pub fn swallow_next_reply(&self) {
        self.swallow.store(true, Ordering::SeqCst);
    }

    /// How many replies were lost so far.
    pub fn swallowed(&self) -> u64 {
        self.swallowed.load(Ordering::SeqCst)
    }

    /// From now on, holds every request whose bytes, as one read from the client delivered
    /// them, contain `pattern` (and what follows it on that connection) until
    /// [`release`](Self::release) or the proxy's drop.
    pub fn hold_requests_containing(&self, pattern: &[u8]) {
        assert!(
            !pattern.is_empty(),
            "an empty pattern would hold everything"
        );
        *self.hold.pattern.lock().unwrap() = Some(pattern.to_vec());
    }

    /// Forwards the held requests, and holds no more.
    pub fn release(&self) {
        self.hold.release();
    }

    /// How many reads from clients were held so far: one per request that a client sent
    /// alone.
    pub fn held(&self) -> u64 {
        self.hold.held.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.hold.release();
        self.accept.abort();
    }
}

async fn pump(
    client: TcpStream,
    server: TcpStream,
    (swallow, swallowed, hold): (Arc<AtomicBool>, Arc<AtomicU64>, Arc<Hold>),
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = tokio::spawn(async move {
        let mut buffer = vec![0_u8; 64 * 1024];
        while let Ok(n) = client_read.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            if let Some(before) = hold.holds(&buffer[..n]) {
                let mut releases = hold.releases.subscribe();
                if releases.wait_for(|now| *now > before).await.is_err() {
                    break;
                }
            }
            if server_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buffer = vec![0_u8; 64 * 1024];
    while let Ok(n) = server_read.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        if swallow.swap(false, Ordering::SeqCst) {
            swallowed.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if client_write.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    requests.abort();
    let _ = client_write.shutdown().await;
}
