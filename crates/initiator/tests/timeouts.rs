//! A target that stops answering: a request gives up after the session's timeout (and not
//! much later); a command is aborted then, and when that goes unanswered too the connection is
//! dropped — the command fails `ConnectionLost`, never `Timeout` while the target may still run
//! it — and once the target answers again the session logs in again and goes on.
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
    // Commands registered at different moments; the first is given up between 1 and 1.25
    // timeouts after it was registered, its abort as long after that.
    let mut waits = Vec::new();
    for i in 0..4u32 {
        let s = s.clone();
        waits.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(90 * u64::from(i))).await;
            let start = Instant::now();
            let lba = (i * 8).to_be_bytes();
            let read10 = [0x28, 0, lba[0], lba[1], lba[2], lba[3], 0, 0, 8, 0];
            let r = s.command_once(Lun::ZERO, &read10, None, 4096).await;
            (r, start.elapsed())
        }));
    }
    let start = Instant::now();
    let ping = s.ping().await;
    let ping_waited = start.elapsed();
    assert!(matches!(ping, Err(Error::Timeout)), "ping: {ping:?}");
    assert!(ping_waited >= timeout && ping_waited < timeout * 2, "ping gave up after {ping_waited:?}");
    for (i, w) in waits.into_iter().enumerate() {
        let (r, waited) = w.await.unwrap();
        // Every command on the connection fails with it.
        assert!(matches!(r, Err(Error::ConnectionLost)), "read: {r:?}");
        if i == 0 {
            assert!(waited >= timeout * 2, "the connection was dropped early, after {waited:?}");
            assert!(waited < timeout * 7 / 2, "the connection was dropped late, after {waited:?}");
        }
    }

    // The target answers again: the session logs in again, and commands work.
    frozen.store(false, Ordering::Release);
    for i in 0..8u64 {
        let d = s.read(Lun::ZERO, i, 1, 512).await.unwrap();
        assert_eq!(d.len(), 512);
    }
    s.ping().await.unwrap();
}
