//! Limits that are TCP's: a peer that stops reading (the socket buffers fill) or stalls inside
//! a PDU, the connection cap and accept errors, and R2Ts a raw socket sees. The initiator here
//! writes and reads PDUs as bytes on its socket, so a test controls exactly what is sent and
//! when the socket is read.

use crate::support::raw::ends_within;
use crate::support::{Raw, Transport, WAIT, read10, sense, write10};
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::wire::{DataOut, Header, Isid, LoginRequest, Pdu, R2t};
use riser::scsi::lun::Lun;
use riser::scsi::sense::{AscAscq, Status};
use riser::target::server::TargetConfig;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start(cfg: impl FnOnce(&mut TargetConfig)) -> SocketAddr {
    Transport::Tcp.start(|_| {}, cfg).await
}

/// An initiator that stops reading cannot hold the target: a response the transport has not
/// taken within `send_timeout` ends the connection (the keepalive could not even ping it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_is_dropped_after_the_send_timeout() {
    let addr = start(|c| {
        c.send_timeout = Duration::from_millis(500);
        c.nop_interval = None;
    })
    .await;
    let mut r = Raw::login_tcp(addr, OperationalConfig::default(), 4).await;
    // 64 MiB of reads nobody reads: the socket buffers fill, the target's sends block.
    for i in 0..8u32 {
        let h = r.command(0x500 + i, &read10(i * 16384, 16384), 8 << 20, false, true, false);
        r.send(h, &[]).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // By now the target has given up: draining the socket ends in EOF.
    assert!(r.ends_within(WAIT).await, "the target dropped the connection");
}

/// The keepalive fires even when the send side is stuck: an initiator that stops reading is
/// dropped once its ping goes unanswered for `nop_timeout`, long before a generous
/// `send_timeout` (the ping used to wait in line behind the stuck Data-In, and the connection's
/// receive loop with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keepalive_fires_while_the_send_side_is_stuck() {
    let addr = start(|c| {
        c.send_timeout = Duration::from_secs(60);
        c.nop_interval = Some(Duration::from_millis(300));
        c.nop_timeout = Duration::from_millis(600);
    })
    .await;
    let mut r = Raw::login_tcp(addr, OperationalConfig::default(), 18).await;
    for i in 0..8u32 {
        let h = r.command(0x600 + i, &read10(i * 16384, 16384), 8 << 20, false, true, false);
        r.send(h, &[]).await;
    }
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(r.ends_within(WAIT).await, "the target dropped the connection");
    assert!(started.elapsed() < Duration::from_secs(14), "dropped by the keepalive, not the send timeout");
}

/// A peer that announces a data segment and stalls is dropped at the data timeout — in login and
/// in full feature phase (the receiver used to wait for the bytes forever, even after the login
/// timed out, and the socket stayed open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_data_segment_ends_the_connection() {
    let addr = start(|c| {
        c.data_timeout = Duration::from_millis(500);
        c.login.login_timeout = Duration::from_millis(800);
        c.nop_interval = None;
    })
    .await;
    // Login: a Login Request announcing 1000 bytes, 10 sent.
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let mut bytes = Vec::new();
    let req = LoginRequest { transit: false, itt: 1, isid: Isid([0x80, 0, 0, 0, 0, 5]), ..LoginRequest::default() };
    Pdu::new(Header::LoginRequest(req), &[][..], &[b'x'; 1000][..]).encode(&mut bytes);
    sock.write_all(&bytes[..58]).await.unwrap();
    assert!(ends_within(&mut sock, Duration::from_secs(5)).await, "a stalled login PDU is dropped");
    // Full feature phase: a command announcing 4096 bytes of immediate data, 100 sent.
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = Raw::login_tcp(addr, op, 6).await;
    let h = r.command(0x600, &write10(0, 8), 4096, true, true, false);
    let mut bytes = Vec::new();
    Pdu::new(h, &[][..], &[7u8; 4096][..]).encode(&mut bytes);
    r.sock().write_all(&bytes[..148]).await.unwrap();
    assert!(r.ends_within(Duration::from_secs(5)).await, "a stalled command PDU is dropped");
}

/// The target serves at most `max_connections`; one more is closed at once, and a place freed
/// is a place for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed() {
    let addr = start(|c| c.max_connections = 2).await;
    let a = Raw::login_tcp(addr, OperationalConfig::default(), 7).await;
    let _b = Raw::login_tcp(addr, OperationalConfig::default(), 8).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(WAIT, third.read(&mut b)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "the third connection is closed");
    drop(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut again = Raw::login_tcp(addr, OperationalConfig::default(), 9).await;
    again.ping(5).await;
}

/// A portal survives accept errors (here: out of file descriptors) and serves again once
/// descriptors are free. Runs in a child process with a small RLIMIT_NOFILE (set by the shell).
#[test]
fn accept_errors_do_not_stop_the_portal() {
    if std::env::var_os("RISER_LIMITS_CHILD").is_some() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("ulimit -n 48 && exec \"$0\" --exact tcp_limits::accept_errors_child --nocapture --test-threads 1")
        .arg(&me)
        .env("RISER_LIMITS_CHILD", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

#[test]
fn accept_errors_child() {
    if std::env::var_os("RISER_LIMITS_CHILD").is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let addr = start(|c| c.max_connections = 1000).await;
        // Use up the descriptors: accept() then fails with EMFILE for the connections beyond.
        let mut held = Vec::new();
        for _ in 0..60 {
            match TcpStream::connect(addr).await {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(held);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // The portal still serves.
        let mut r = Raw::login_tcp(addr, OperationalConfig::default(), 17).await;
        r.ping(1).await;
    });
}

/// A write whose expected length is far beyond its CDB, with the smallest MaxBurstLength: the
/// target solicits only what the CDB uses (it used to plan an R2T per 512 bytes of the expected
/// length, millions, and then left the command unanswered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_max_burst_with_a_huge_edtl_solicits_only_what_the_cdb_needs() {
    let small = OperationalConfig::default().initial_r2t(true).immediate_data(false).max_burst_length(512).first_burst_length(512);
    let addr = start(|c| c.login.operational = small.clone()).await;
    let mut r = Raw::login_tcp(addr, small.clone(), 12).await;
    assert_eq!(r.o.params.max_burst_length, 512);
    let edtl = 60 << 20;
    let h = r.command(0x900, &write10(0, 1), edtl, true, true, false);
    r.send(h, &[]).await;
    let r2t = match r.next().await {
        (Header::R2t(t), _) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!((r2t.buffer_offset, r2t.desired_len), (0, 512));
    let d = DataOut { final_: true, lun: Lun::ZERO, itt: 0x900, ttt: r2t.ttt, data_sn: 0, buffer_offset: 0, ..DataOut::default() };
    r.send(Header::DataOut(d), &[9; 512]).await;
    let (resp, _) = r.response(0x900, |h| assert!(!matches!(h, Header::R2t(R2t { .. })), "a second R2T: {h:?}")).await;
    assert_eq!(resp.status, Status::GOOD);
    assert!(resp.underflow && resp.residual == edtl - 512, "{resp:?}");
}

/// Write data the target asked for (an R2T) and never got: after `data_timeout` the command
/// ends with CHECK CONDITION; the connection stays. (Unsolicited data that never comes, on
/// every transport: `bad_input`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_data_that_never_comes_ends_the_command_not_the_session() {
    let op = OperationalConfig::default().initial_r2t(true).immediate_data(false);
    let addr = start(|c| {
        c.login.operational = op.clone();
        c.data_timeout = Duration::from_millis(500);
    })
    .await;
    let mut r = Raw::login_tcp(addr, op, 16).await;
    let h = r.command(0xc00, &write10(0, 8), 4096, true, true, false);
    r.send(h, &[]).await;
    let (resp, d) = r.response(0xc00, |h| assert!(matches!(h, Header::R2t(_)), "{h:?}")).await;
    assert_eq!((resp.status, sense(&d).asc), (Status::CHECK_CONDITION, AscAscq::DATA_PHASE_ERROR));
    r.ping(0xc01).await;
}
