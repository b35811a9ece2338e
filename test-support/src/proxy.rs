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

/// The requests to hold: those containing `pattern`, until `released` turns true.
struct Hold {
    pattern: Mutex<Option<Vec<u8>>>,
    released: watch::Sender<bool>,
    held: AtomicU64,
}

impl Hold {
    /// Whether `request` is to wait, counting it if so.
    fn holds(&self, request: &[u8]) -> bool {
        let pattern = self.pattern.lock().unwrap();
        let holds = pattern.as_deref().is_some_and(|pattern| {
            !*self.released.borrow()
                && request
                    .windows(pattern.len())
                    .any(|window| window == pattern)
        });
        if holds {
            self.held.fetch_add(1, Ordering::SeqCst);
        }
        holds
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
            released: watch::channel(false).0,
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
    /// [`release`](Self::release).
    pub fn hold_requests_containing(&self, pattern: &[u8]) {
        *self.hold.pattern.lock().unwrap() = Some(pattern.to_vec());
        self.hold.released.send_replace(false);
    }

    /// Forwards the held requests, and holds no more.
    pub fn release(&self) {
        *self.hold.pattern.lock().unwrap() = None;
        self.hold.released.send_replace(true);
    }

    /// How many requests were held so far.
    pub fn held(&self) -> u64 {
        self.hold.held.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
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
            if hold.holds(&buffer[..n]) {
                let mut released = hold.released.subscribe();
                if released.wait_for(|released| *released).await.is_err() {
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
