//! A target that stops answering: each request gives up after the session's timeout (and not
//! much later), the session forgets it, and once the target answers again the session goes on
//! (the late answers to the forgotten tasks are dropped).
#![cfg(feature = "tcp")]

mod common;

use common::relay;
use riser_initiator::{Error, Lun, Session, SessionConfig};
use riser_target::backend::RamBackend;
use riser_target::lu::LogicalUnit;
use riser_target::server::{Node, Target, TargetConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const TARGET: &str = "iqn.2026-11.io.riser:timeouts";

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
