//! A TCP proxy between a client and Redis that can lose a reply on purpose.
//!
//! Armed with [`Proxy::swallow_next_reply`], it forwards the next request to Redis, which applies
//! it, then throws the reply away and closes the client's connection: the client cannot tell
//! whether its command ran.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A proxy on a free loopback port in front of `upstream`; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    swallow: Arc<AtomicBool>,
    swallowed: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free loopback port in front of `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let swallow = Arc::new(AtomicBool::new(false));
        let swallowed = Arc::new(AtomicU64::new(0));
        let accept = {
            let (swallow, swallowed) = (swallow.clone(), swallowed.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        continue;
                    };
                    tokio::spawn(pump(client, server, swallow.clone(), swallowed.clone()));
                }
            })
        };
        Self {
            addr,
            swallow,
            swallowed,
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
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pump(
    client: TcpStream,
    server: TcpStream,
    swallow: Arc<AtomicBool>,
    swallowed: Arc<AtomicU64>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
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
