//! What several of these tests share: a TCP relay that stands for the network between an
//! initiator and a target, and can freeze.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Relay connections from `public` to `inner` until aborted (which drops them all), passing
/// nothing while `frozen`.
#[allow(dead_code)] // not every test crate uses both
pub(crate) async fn relay(public: tokio::net::TcpListener, inner: SocketAddr, frozen: Arc<AtomicBool>) {
    relay_refusing(public, inner, frozen, Arc::default()).await
}

/// [`relay`], closing every new connection at once while `refusing` (those relayed already
/// go on).
pub(crate) async fn relay_refusing(public: tokio::net::TcpListener, inner: SocketAddr, frozen: Arc<AtomicBool>, refusing: Arc<AtomicBool>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((client, _)) = public.accept().await else { continue };
        if refusing.load(Ordering::Acquire) {
            continue;
        }
        let Ok(server) = tokio::net::TcpStream::connect(inner).await else { continue };
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        conns.spawn(pump(cr, sw, frozen.clone()));
        conns.spawn(pump(sr, cw, frozen.clone()));
    }
}

async fn pump(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, frozen: Arc<AtomicBool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else { return };
        while frozen.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
