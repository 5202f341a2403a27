//! Connection setup over loopback TCP: MPA revisions and modes, rejects, refused markers, and
//! the listener's handshakes off the accept path (idle, trickling and excess connections).

mod common;

use common::{ALL, contents, end, next, pair_with, pattern, sge};
use riser_iwarp::wire::{self, IrdOrd, MpaFrame};
use riser_iwarp::{RnicConfig, SoftRnic};
use riser_verbs::{Access, ConnParam, ConnectionRequest, Error, Listener, MemoryRegion, Provider, QpCaps, SendOp, SetupError, WcStatus};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

#[test]
fn rev1_p2p_and_no_crc_connections_work() {
    for (client, server) in [
        (RnicConfig::default().mpa_rev(1), RnicConfig::default()),
        (RnicConfig::default().p2p(true), RnicConfig::default()),
        (RnicConfig::default().crc(false), RnicConfig::default().crc(false)),
    ] {
        let (c, s) = pair_with(client, server, |_| {});
        let target = s.mr(vec![0u8; 100], ALL);
        let src = c.mr(pattern(1, 100), Access::empty());
        c.send(1, SendOp::RdmaWrite { remote_addr: target.addr(), rkey: target.rkey() }, vec![sge(&src, 0, 100)]);
        assert_eq!(next(&c.cq).status, WcStatus::Success);
        let sink = c.mr(vec![0u8; 100], Access::LOCAL_WRITE);
        c.send(2, SendOp::RdmaRead { remote_addr: target.addr(), rkey: target.rkey() }, vec![sge(&sink, 0, 100)]);
        assert_eq!(next(&c.cq).status, WcStatus::Success);
        assert_eq!(contents(&sink), pattern(1, 100));
    }
}

#[test]
fn reject_carries_private_data() {
    let (srnic, ..) = end(SoftRnic::default());
    let listener = srnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || listener.get_request().unwrap().reject(b"go away"));
    let (crnic, pd, cq, rcq) = end(SoftRnic::default());
    let qp = crnic.create_qp(addr, &pd, &cq, &rcq, QpCaps::default()).unwrap();
    match crnic.connect(&qp, &ConnParam::default()) {
        Err(Error::Rejected { private_data }) => assert_eq!(private_data, b"go away"),
        other => panic!("expected a reject, got {other:?}"),
    }
    t.join().unwrap();
}

#[test]
fn markers_are_refused_in_mpa() {
    let (srnic, ..) = end(SoftRnic::default());
    let listener = srnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let _ = listener.get_request();
    });
    let mut sock = TcpStream::connect(addr).unwrap();
    let req = MpaFrame { reply: false, flags: wire::MPA_FLAG_MARKERS, rev: 2, ird_ord: Some(IrdOrd::default()), private_data: vec![] };
    sock.write_all(&req.emit()).unwrap();
    let mut h = [0u8; 24];
    sock.read_exact(&mut h).unwrap();
    let reply = MpaFrame::parse(&h).unwrap();
    assert!(reply.reply && reply.rejected() && !reply.markers());
}

/// The active side's error when a raw peer answers its MPA request with `answer`.
fn connect_to_raw_answer(answer: Vec<u8>) -> Error {
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut sock, _) = server.accept().unwrap();
        let mut h = [0u8; wire::MPA_HEADER_LEN];
        sock.read_exact(&mut h).unwrap();
        sock.write_all(&answer).unwrap();
        // Keep the connection until the client has read the answer and given up.
        let _ = sock.read_to_end(&mut Vec::new());
    });
    let (crnic, pd, cq, rcq) = end(SoftRnic::default());
    let qp = crnic.create_qp(addr, &pd, &cq, &rcq, QpCaps::default()).unwrap();
    let e = crnic.connect(&qp, &ConnParam::default()).unwrap_err();
    drop(qp);
    drop(crnic);
    peer.join().unwrap();
    e
}

#[test]
fn broken_mpa_replies_are_named() {
    let e = connect_to_raw_answer(mpa_request(b""));
    assert!(matches!(e, Error::Setup(SetupError::RequestInsteadOfReply)), "{e}");
    assert_eq!(e.to_string(), "connection setup failed: the peer answered with an MPA Request");
    let mut bad_key = mpa_request(b"");
    bad_key[0] ^= 0xff;
    let e = connect_to_raw_answer(bad_key);
    assert!(matches!(e, Error::Setup(SetupError::BadMpaKey)), "{e}");
    let reply = |rev, ird_ord| MpaFrame { reply: true, flags: 0, rev, ird_ord, private_data: vec![] }.emit();
    let mut rev3 = reply(2, Some(IrdOrd::default()));
    rev3[17] = 3;
    assert!(matches!(connect_to_raw_answer(rev3), Error::Setup(SetupError::MpaRevision(3))));
    let e = connect_to_raw_answer(reply(1, None));
    assert!(matches!(e, Error::Setup(SetupError::ReplyWithoutIrdOrd)), "{e}");
}

/// A listener whose requests are taken by a thread of their own as they come and handed over
/// with the time they arrived.
fn portal(cfg: RnicConfig) -> (SocketAddr, std::sync::mpsc::Receiver<(Instant, Vec<u8>)>) {
    let (srnic, ..) = end(SoftRnic::new(cfg));
    let listener = srnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        while let Ok(req) = listener.get_request() {
            if tx.send((Instant::now(), req.private_data().to_vec())).is_err() {
                break;
            }
            req.reject(b"");
        }
    });
    (addr, rx)
}

/// A whole MPA request with `private_data`.
fn mpa_request(private_data: &[u8]) -> Vec<u8> {
    MpaFrame {
        reply: false,
        flags: 0,
        rev: 2,
        ird_ord: Some(IrdOrd { ird: 1, ord: 1, ..IrdOrd::default() }),
        private_data: private_data.to_vec(),
    }
    .emit()
}

/// A client that sends a request one byte every `every` and reports when the server dropped
/// the connection (None: it was still open after `give_up`).
fn trickler(addr: SocketAddr, every: Duration, give_up: Duration) -> std::thread::JoinHandle<Option<Duration>> {
    std::thread::spawn(move || {
        let mut sock = TcpStream::connect(addr).unwrap();
        let t0 = Instant::now();
        sock.set_read_timeout(Some(every)).unwrap();
        // Longer than anyone would wait for at this pace.
        let bytes = mpa_request(&[7u8; 200]);
        for b in bytes {
            if t0.elapsed() > give_up {
                return None;
            }
            if sock.write_all(&[b]).is_err() {
                return Some(t0.elapsed());
            }
            let mut x = [0u8; 64];
            match sock.read(&mut x) {
                Ok(_) => return Some(t0.elapsed()),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return Some(t0.elapsed()),
            }
        }
        panic!("the whole request went out");
    })
}

#[test]
fn idle_and_trickling_connections_do_not_delay_a_well_behaved_request() {
    let (addr, requests) = portal(RnicConfig::default().setup_timeout(Duration::from_secs(3)));
    // Two connections that send nothing, one that stops half-way through the header, and two
    // that trickle a byte at a time.
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(&mpa_request(b"half")[..10]).unwrap();
    let tricklers: Vec<_> = (0..2).map(|_| trickler(addr, Duration::from_millis(20), Duration::from_secs(4))).collect();
    std::thread::sleep(Duration::from_millis(100));
    for round in 0..3 {
        let t0 = Instant::now();
        let mut good = TcpStream::connect(addr).unwrap();
        good.write_all(&mpa_request(format!("good {round}").as_bytes())).unwrap();
        let (at, pd) = requests.recv_timeout(Duration::from_secs(10)).expect("the well-behaved request");
        assert_eq!(pd, format!("good {round}").as_bytes());
        let waited = at.duration_since(t0);
        assert!(waited < Duration::from_millis(500), "round {round}: the well-behaved request waited {waited:?}");
    }
    for t in tricklers {
        assert!(t.join().unwrap().is_some(), "the tricklers were dropped");
    }
    drop((idle, half));
}

#[test]
fn a_trickler_is_dropped_at_the_handshake_deadline() {
    let (addr, _requests) = portal(RnicConfig::default().setup_timeout(Duration::from_secs(1)));
    // A byte every 50 ms: each read would restart a per-read timeout; one deadline does not.
    let dropped = trickler(addr, Duration::from_millis(50), Duration::from_secs(5)).join().unwrap();
    let dropped = dropped.expect("the trickler was dropped");
    assert!(dropped >= Duration::from_millis(900) && dropped < Duration::from_millis(2500), "dropped after {dropped:?}");
}

#[test]
fn handshakes_beyond_the_bound_wait_for_a_slot() {
    // With room for two handshakes, two idle connections hold both slots: the next request is
    // read (not refused, not lost) once their deadline frees the slots.
    let (addr, requests) = portal(RnicConfig::default().setup_timeout(Duration::from_secs(1)).max_handshakes(2));
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    let mut good = TcpStream::connect(addr).unwrap();
    good.write_all(&mpa_request(b"good")).unwrap();
    let (at, pd) = requests.recv_timeout(Duration::from_secs(10)).expect("the request after the slots freed");
    assert_eq!(pd, b"good");
    let waited = at.duration_since(t0);
    assert!(waited >= Duration::from_millis(600) && waited < Duration::from_secs(3), "waited {waited:?}");
    drop(idle);
}

#[test]
fn dropping_the_listener_closes_the_port_and_pending_connections() {
    let (srnic, ..) = end(SoftRnic::default());
    let listener = srnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    // A request read but never taken, and a handshake in progress.
    let mut waiting = TcpStream::connect(addr).unwrap();
    waiting.write_all(&mpa_request(b"never taken")).unwrap();
    let mut idle = TcpStream::connect(addr).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    drop(listener);
    for sock in [&mut waiting, &mut idle] {
        sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut x = [0u8; 16];
        assert!(matches!(sock.read(&mut x), Ok(0) | Err(_)), "the connection was closed");
    }
    assert!(t0.elapsed() < Duration::from_secs(1), "closed with the listener, not at the handshake deadline");
    assert!(TcpStream::connect(addr).is_err(), "nothing listens any more");
}

#[test]
fn a_closed_listener_wakes_its_waiter_and_frees_its_address() {
    let (srnic, ..) = end(SoftRnic::default());
    let listener = std::sync::Arc::new(srnic.listen("127.0.0.1:0".parse().unwrap()).unwrap());
    let addr = listener.local_addr().unwrap();
    let waiter = std::thread::spawn({
        let l = listener.clone();
        move || l.get_request().map(drop)
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(!waiter.is_finished(), "waiting for a request");
    listener.close();
    let t0 = Instant::now();
    while !waiter.is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(5), "get_request still waits after close");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(waiter.join().unwrap().is_err());
    // A connection attempt now gets no MPA reply (refused or closed), and once the listener is
    // dropped its address can be listened on again.
    assert!(listener.get_request().is_err());
    drop(listener);
    let again = srnic.listen(addr).expect("the address is free again");
    assert_eq!(again.local_addr().unwrap(), addr);
}
