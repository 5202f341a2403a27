//! A target that stops answering: each request gives up after the session's timeout (and not
//! much later), the session forgets it, and once the target answers again the session goes on
//! (the late answers to the forgotten tasks are dropped).
#![cfg(feature = "tcp")]

use riser_initiator::{Error, Lun, Session, SessionConfig};
use riser_target::backend::RamBackend;
use riser_target::lu::LogicalUnit;
use riser_target::server::{Node, Target, TargetConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const TARGET: &str = "iqn.2026-11.io.riser:timeouts";

/// Relay from a public listener to the target, passing nothing while `frozen`.
async fn relay(public: tokio::net::TcpListener, inner: std::net::SocketAddr, frozen: Arc<AtomicBool>) {
    loop {
        let Ok((client, _)) = public.accept().await else { continue };
        let Ok(server) = tokio::net::TcpStream::connect(inner).await else { continue };
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        tokio::spawn(pump(cr, sw, frozen.clone()));
        tokio::spawn(pump(sr, cw, frozen.clone()));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_requests_time_out_on_time_and_the_session_goes_on() {
    let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), riser_target::lu::LuIdentity::random()));
    let target = Target::new(TargetConfig::default().node(Node::new(TARGET).lun(lu)));
    let inner = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let inner_addr = inner.local_addr().unwrap();
    let t = target.clone();
    tokio::spawn(async move { t.serve(inner).await });
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = public.local_addr().unwrap();
    let frozen = Arc::new(AtomicBool::new(false));
    tokio::spawn(relay(public, inner_addr, frozen.clone()));

    let timeout = Duration::from_millis(400);
    let s = Session::connect(addr, SessionConfig::new("iqn.2026-11.io.riser:timeouts-host", TARGET).timeout(timeout)).await.unwrap();
    s.read(Lun::ZERO, 0, 8, 512).await.unwrap();

    frozen.store(true, Ordering::Release);
    // Requests registered at different moments each get their whole timeout, and little more.
    let mut waits = Vec::new();
    for i in 0..4u64 {
        let s = s.clone();
        waits.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(90 * i)).await;
            let start = Instant::now();
            let r = s.read(Lun::ZERO, i * 8, 8, 512).await;
            (r, start.elapsed())
        }));
    }
    let start = Instant::now();
    let ping = s.ping().await;
    let ping_waited = start.elapsed();
    assert!(matches!(ping, Err(Error::Timeout)), "ping: {ping:?}");
    assert!(ping_waited >= timeout && ping_waited < timeout * 2, "ping gave up after {ping_waited:?}");
    for w in waits {
        let (r, waited) = w.await.unwrap();
        assert!(matches!(r, Err(Error::Timeout)), "read: {r:?}");
        assert!(waited >= timeout, "a read gave up early, after {waited:?}");
        assert!(waited < timeout * 2, "a read gave up late, after {waited:?}");
    }

    // The target answers again: the forgotten tasks' answers are dropped, and new commands work.
    frozen.store(false, Ordering::Release);
    for i in 0..8u64 {
        let d = s.read(Lun::ZERO, i, 1, 512).await.unwrap();
        assert_eq!(d.len(), 512);
    }
    s.ping().await.unwrap();
}
