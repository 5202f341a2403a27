//! Every error a peer can cause, over loopback TCP: the Terminate and completions the RFCs ask
//! for, refused accesses and invalidations, protocol violations from a hand-driven peer, and
//! the Terminate leaving before the stream closes.

mod common;

use common::{ALL, End, contents, end, next, pair, pair_with, raw_fpdu, raw_peer, send_hdr, sge, wait_until};
use riser_iwarp::wire::{self, Header, IrdOrd, MpaFrame, Opcode, ReadRequest};
use riser_iwarp::{RnicConfig, SoftMr, SoftRnic, Term};
use riser_verbs::{
    Access, ConnParam, ConnectionRequest, MemoryRegion, ProtectionDomain, Provider, QpCaps, QueuePair, SendOp, Wc, WcOpcode, WcStatus,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Post `op` from the client against the server region `target` and expect the server to end
/// the connection with `term`; the region must be unchanged.
fn refused(target_access: Access, other_pd: bool, op: impl FnOnce(&End, &SoftMr) -> SendOp, len: usize, term: Term) -> (End, End) {
    let (c, s) = pair();
    let target = if other_pd {
        s.rnic.alloc_pd().unwrap().register(vec![0u8; 4096], target_access).unwrap()
    } else {
        s.mr(vec![0u8; 4096], target_access)
    };
    let op = op(&c, &target);
    let local = c.mr(vec![0xeeu8; len], Access::LOCAL_WRITE);
    c.send(9, op, vec![sge(&local, 0, len)]);
    wait_until("the Terminate", || c.qp.terminate_received().is_some());
    assert_eq!(s.qp.terminate_sent(), Some(term));
    assert_eq!(c.qp.terminate_received(), Some(term), "the Terminate reached the peer with its layer/type/code");
    assert_eq!(contents(&target), vec![0u8; 4096], "no byte placed");
    wait_until("both sides disconnected", || !c.qp.is_connected() && !s.qp.is_connected());
    // Later work is flushed.
    c.send(10, SendOp::Send, vec![]);
    let mut seen = vec![];
    loop {
        let wc = next(&c.cq);
        seen.push(wc);
        if wc.wr_id == 10 {
            assert_eq!(wc.status, WcStatus::WrFlushErr);
            break;
        }
    }
    drop(target);
    SEEN.lock().unwrap().clone_from(&seen);
    (c, s)
}

static SEEN: std::sync::Mutex<Vec<Wc>> = std::sync::Mutex::new(Vec::new());

fn write_to(off: u64) -> impl FnOnce(&End, &SoftMr) -> SendOp {
    move |_, t| SendOp::RdmaWrite { remote_addr: t.addr() + off, rkey: t.rkey() }
}

fn read_from(off: u64) -> impl FnOnce(&End, &SoftMr) -> SendOp {
    move |_, t| SendOp::RdmaRead { remote_addr: t.addr() + off, rkey: t.rkey() }
}

#[test]
fn write_with_unknown_stale_or_foreign_keys_is_refused() {
    refused(
        ALL,
        false,
        |_, t| SendOp::RdmaWrite { remote_addr: t.addr(), rkey: t.rkey() ^ 0x0100_0000 },
        16,
        Term::DDP_TAGGED_INVALID_STAG,
    );
    // A stale key: the region was re-keyed after the key was advertised.
    refused(
        ALL,
        false,
        |_, t| {
            let old = t.rkey();
            t.rekey().unwrap();
            SendOp::RdmaWrite { remote_addr: t.addr(), rkey: old }
        },
        16,
        Term::DDP_TAGGED_INVALID_STAG,
    );
    refused(ALL, true, write_to(0), 16, Term::DDP_TAGGED_PD);
}

#[test]
fn write_without_remote_write_or_out_of_bounds_is_refused() {
    refused(Access::LOCAL_WRITE | Access::REMOTE_READ, false, write_to(0), 16, Term::DDP_TAGGED_INVALID_STAG);
    refused(ALL, false, write_to(4090), 16, Term::DDP_TAGGED_BOUNDS);
    refused(ALL, false, |_, t| SendOp::RdmaWrite { remote_addr: t.addr() - 1, rkey: t.rkey() }, 16, Term::DDP_TAGGED_BOUNDS);
    // One byte more than the region.
    refused(ALL, false, write_to(0), 4097, Term::DDP_TAGGED_BOUNDS);
}

#[test]
fn read_errors_fail_the_read_with_remote_access_error() {
    for (access, off, len, term) in
        [(Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0u64, 16usize, Term::RDMAP_ACCESS), (ALL, 4000, 200, Term::RDMAP_BOUNDS)]
    {
        refused(access, false, read_from(off), len, term);
        let seen = SEEN.lock().unwrap().clone();
        let read = seen.iter().find(|w| w.wr_id == 9).expect("the read completed");
        assert_eq!((read.opcode, read.status), (WcOpcode::RdmaRead, WcStatus::RemoteAccessErr));
    }
    refused(
        ALL,
        false,
        |_, t| SendOp::RdmaRead { remote_addr: t.addr(), rkey: t.rkey().wrapping_add(0x100) },
        16,
        Term::RDMAP_INVALID_STAG,
    );
    refused(ALL, true, read_from(0), 16, Term::RDMAP_PD);
}

#[test]
fn send_without_a_receive_or_larger_than_it() {
    refused(ALL, false, |_, _| SendOp::Send, 16, Term::DDP_UNTAGGED_NO_BUFFER);
    let (c, s) = pair_with(RnicConfig::default(), RnicConfig::default(), |s| {
        let r = s.mr(vec![0u8; 8], Access::LOCAL_WRITE);
        s.recv(5, &r);
        RECV_SMALL.lock().unwrap().push(r);
    });
    let msg = c.mr(vec![9u8; 9], Access::empty());
    c.send(1, SendOp::Send, vec![sge(&msg, 0, 9)]);
    let wc = next(&s.rcq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocalLengthErr));
    wait_until("the Terminate", || c.qp.terminate_received().is_some());
    assert_eq!(c.qp.terminate_received(), Some(Term::DDP_UNTAGGED_NO_BUFFER));
    assert_eq!(contents(&RECV_SMALL.lock().unwrap()[0]), vec![0u8; 8], "a Send that does not fit places nothing");
    drop(s);
}

static RECV_SMALL: std::sync::Mutex<Vec<Arc<SoftMr>>> = std::sync::Mutex::new(Vec::new());

/// The client sends a Send with Invalidate of the STag `target` picks on the server: the
/// server refuses it (the receive completes with an error, a Terminate ends the connection) and
/// the region stays valid.
fn invalidate_refused(target: impl FnOnce(&End) -> (Arc<SoftMr>, u32)) {
    // The receive buffer comes back through a channel (a static shared by tests running in
    // parallel could be cleared under another test's feet).
    let (keep, kept) = std::sync::mpsc::channel();
    let (c, s) = pair_with(RnicConfig::default(), RnicConfig::default(), move |s| {
        let r = s.mr(vec![0u8; 8], Access::LOCAL_WRITE);
        s.recv(1, &r);
        keep.send(r).unwrap();
    });
    let _recv_buf = kept.recv().unwrap();
    let (region, stag) = target(&s);
    let msg = c.mr(vec![1u8; 4], Access::empty());
    c.send(1, SendOp::SendWithInvalidate { rkey: stag }, vec![sge(&msg, 0, 4)]);
    let wc = next(&s.rcq);
    assert_eq!((wc.status, wc.invalidated_rkey), (WcStatus::RemoteInvalidRequestErr, None));
    wait_until("the Terminate", || c.qp.terminate_received().is_some());
    assert_eq!(c.qp.terminate_received(), Some(Term::RDMAP_CANNOT_INVALIDATE));
    assert_eq!(s.qp.terminate_sent(), Some(Term::RDMAP_CANNOT_INVALIDATE));
    assert!(region.is_valid(), "the refused invalidation left the region valid");
    wait_until("both sides disconnected", || !c.qp.is_connected() && !s.qp.is_connected());
}

#[test]
fn invalidate_of_a_foreign_key_is_refused() {
    invalidate_refused(|s| {
        let other = s.rnic.alloc_pd().unwrap().register(vec![0u8; 8], ALL).unwrap();
        let stag = other.rkey();
        (other, stag)
    });
}

#[test]
fn invalidate_with_a_stale_key_is_refused() {
    // The region was re-keyed after the old key was advertised: same index, other key byte.
    invalidate_refused(|s| {
        let r = s.mr(vec![0u8; 8], ALL);
        let old = r.rkey();
        let new = r.rekey().unwrap();
        assert_eq!((old >> 8, old & 0xff != new & 0xff), (new >> 8, true));
        (r, old)
    });
    // Any key byte but the current one.
    invalidate_refused(|s| {
        let r = s.mr(vec![0u8; 8], ALL);
        let wrong = r.rkey() ^ 0x5a;
        (r, wrong)
    });
}

#[test]
fn invalidate_of_a_local_only_region_is_refused() {
    // No remote rights: the key was never meant for the peer (a receive or send buffer).
    for access in [Access::LOCAL_WRITE, Access::empty()] {
        invalidate_refused(|s| {
            let r = s.mr(vec![0u8; 8], access);
            let stag = r.lkey();
            (r, stag)
        });
    }
}

fn expect_terminate(sock: &mut TcpStream, term: Term) {
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut all = Vec::new();
    let _ = sock.read_to_end(&mut all);
    // Skip anything before the Terminate (e.g. Read Responses), then decode it.
    let mut at = 0;
    while at + 2 <= all.len() {
        let len = usize::from(u16::from_be_bytes([all[at], all[at + 1]]));
        let h = Header::parse(&all[at + 2..]).unwrap();
        if h.op() == Opcode::Terminate {
            let t = wire::TerminateMsg::parse(&all[at + 2 + wire::UNTAGGED_HDR..at + 2 + len]).unwrap();
            assert_eq!(t.term, term);
            return;
        }
        at += 2 + len + wire::fpdu_pad(len) + 4;
    }
    panic!("no Terminate in {} bytes", all.len());
}

/// Read the stream to its end and check it: whole FPDUs one after another, the last of them a
/// Terminate carrying `term`, then EOF (not a reset). Returns how many FPDUs came before it.
fn expect_terminate_then_eof(sock: &mut TcpStream, term: Term) -> usize {
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut all = Vec::new();
    if let Err(e) = sock.read_to_end(&mut all) {
        panic!("the stream did not end with EOF after {} bytes: {e}", all.len());
    }
    let mut at = 0;
    let mut before = 0;
    loop {
        assert!(at + 2 <= all.len(), "EOF after {before} FPDUs ({} bytes) without a Terminate", all.len());
        let len = usize::from(u16::from_be_bytes([all[at], all[at + 1]]));
        let end = at + 2 + len + wire::fpdu_pad(len) + 4;
        assert!(end <= all.len(), "EOF inside an FPDU (FPDU {before} ends at {end}, stream at {})", all.len());
        let h = Header::parse(&all[at + 2..at + 2 + len]).unwrap();
        if h.op() == Opcode::Terminate {
            let t = wire::TerminateMsg::parse(&all[at + 2 + wire::UNTAGGED_HDR..at + 2 + len]).unwrap();
            assert_eq!(t.term, term);
            assert_eq!(end, all.len(), "nothing after the Terminate");
            return before;
        }
        before += 1;
        at = end;
    }
}

#[test]
fn terminate_leaves_before_close_when_the_consumer_disconnects_at_once() {
    // The consumer (as iSER does) disconnects as soon as it sees the failed receive: the
    // Terminate must still reach the peer before the stream closes.
    for round in 0..20 {
        let (keep, kept) = std::sync::mpsc::channel();
        let (mut sock, server) = raw_peer(false, move |s| {
            let r = s.mr(vec![0u8; 64], Access::LOCAL_WRITE);
            s.recv(1, &r);
            keep.send(r).unwrap();
        });
        let s = server.join().unwrap();
        let _recv_buf = kept.recv().unwrap();
        let consumer = {
            let (qp, rcq) = (s.qp.clone(), s.rcq.clone());
            std::thread::spawn(move || {
                let wc = next(&rcq);
                qp.disconnect();
                wc.status
            })
        };
        // A Send out of MSN sequence: its receive fails, a Terminate follows.
        sock.write_all(&raw_fpdu(send_hdr(2, 0, true), &[], b"abcd", false)).unwrap();
        assert_eq!(consumer.join().unwrap(), WcStatus::LocalProtErr, "round {round}");
        expect_terminate_then_eof(&mut sock, Term::DDP_UNTAGGED_BAD_MSN);
        assert_eq!(s.qp.terminate_sent(), Some(Term::DDP_UNTAGGED_BAD_MSN));
    }
}

#[test]
fn terminate_leaves_before_close_behind_a_stalled_read_response() {
    // The transmitter is stuck writing a large Read Response to a peer that reads nothing when
    // the peer's next FPDU breaks the protocol. The consumer disconnects; then the peer reads:
    // whole FPDUs, the Terminate, EOF.
    let (mut sock, server) = raw_peer(false, |_| {});
    let s = server.join().unwrap();
    let src = s.mr(vec![5u8; 32 << 20], ALL);
    let rr = ReadRequest { sink_stag: 0x100, sink_to: 0, size: 32 << 20, src_stag: src.rkey(), src_to: src.addr() };
    let f = raw_fpdu(Header::Untagged { op: Opcode::ReadRequest, last: true, inv_stag: 0, qn: 1, msn: 1, mo: 0 }, &rr.emit(), &[], false);
    sock.write_all(&f).unwrap();
    // Let the response fill the socket buffers.
    std::thread::sleep(Duration::from_millis(300));
    let mut bad = raw_fpdu(send_hdr(1, 0, true), &[], b"", false);
    bad[3] = 0x48;
    sock.write_all(&bad).unwrap();
    wait_until("the protocol error", || s.qp.terminate_sent().is_some());
    assert_eq!(s.qp.terminate_sent(), Some(Term::RDMAP_BAD_OPCODE));
    s.qp.disconnect();
    let responses = expect_terminate_then_eof(&mut sock, Term::RDMAP_BAD_OPCODE);
    assert!(responses < (32 << 20) / 65_000, "the Read Response was cut short at an FPDU boundary ({responses} segments)");
    wait_until("the queue pair to close", || !s.qp.is_connected());
}

#[test]
fn a_terminate_the_peer_never_reads_holds_the_stream_only_until_its_deadline() {
    // As above, but the peer reads nothing at all: the Terminate cannot leave, and the stream
    // closes (flushing everything) at the Terminate deadline, not never. The server's socket
    // has a small fixed send buffer (a server running its own listener), so the transmitter is
    // stuck in the middle of its first batch of FPDUs whatever the host's TCP tuning.
    let (srnic, spd, scq, srcq) = end(SoftRnic::default());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        socket2::SockRef::from(&stream).set_send_buffer_size(64 << 10).unwrap();
        let mut req = srnic.request_from_stream(stream).unwrap();
        let qp = req.create_qp(&spd, &scq, &srcq, QpCaps::default()).unwrap();
        req.accept(&ConnParam { private_data: vec![], responder_resources: 1, initiator_depth: 1 }).unwrap();
        End { rnic: srnic, pd: spd, cq: scq, rcq: srcq, qp }
    });
    let mut sock = TcpStream::connect(addr).unwrap();
    let request =
        MpaFrame { reply: false, flags: 0, rev: 2, ird_ord: Some(IrdOrd { ird: 1, ord: 1, ..IrdOrd::default() }), private_data: vec![] };
    sock.write_all(&request.emit()).unwrap();
    let mut h = [0u8; 24];
    sock.read_exact(&mut h).unwrap();
    assert!(MpaFrame::parse(&h).unwrap().reply);
    let s = server.join().unwrap();
    let src = s.mr(vec![5u8; 32 << 20], ALL);
    let rr = ReadRequest { sink_stag: 0x100, sink_to: 0, size: 32 << 20, src_stag: src.rkey(), src_to: src.addr() };
    let f = raw_fpdu(Header::Untagged { op: Opcode::ReadRequest, last: true, inv_stag: 0, qn: 1, msn: 1, mo: 0 }, &rr.emit(), &[], false);
    sock.write_all(&f).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut bad = raw_fpdu(send_hdr(1, 0, true), &[], b"", false);
    bad[3] = 0x48;
    sock.write_all(&bad).unwrap();
    wait_until("the protocol error", || s.qp.terminate_sent().is_some());
    let t0 = Instant::now();
    s.qp.disconnect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), s.qp.disconnected()).await })
        .expect("the stream closes at the Terminate deadline");
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(1500) && waited < Duration::from_secs(5), "closed after {waited:?}");
    drop(sock);
}

#[test]
fn crc_errors_bad_msn_mo_and_qn_get_their_terminates() {
    let keep = |s: &End| {
        let r = s.mr(vec![0u8; 64], Access::LOCAL_WRITE);
        s.recv(1, &r);
        s.recv(2, &r);
        RAW_RECV.lock().unwrap().push(r);
    };
    let cases: [(bool, Vec<u8>, Term); 5] = [
        (
            true,
            {
                let mut f = raw_fpdu(send_hdr(1, 0, true), &[], b"abcd", true);
                let n = f.len();
                f[n - 1] ^= 1;
                f
            },
            Term::MPA_CRC,
        ),
        (false, raw_fpdu(send_hdr(2, 0, true), &[], b"abcd", false), Term::DDP_UNTAGGED_BAD_MSN),
        (false, raw_fpdu(send_hdr(1, 4, true), &[], b"abcd", false), Term::DDP_UNTAGGED_BAD_MO),
        (
            false,
            raw_fpdu(Header::Untagged { op: Opcode::Send, last: true, inv_stag: 0, qn: 3, msn: 1, mo: 0 }, &[], b"", false),
            Term::DDP_UNTAGGED_INVALID_QN,
        ),
        (
            false,
            {
                let mut f = raw_fpdu(send_hdr(1, 0, true), &[], b"", false);
                f[3] = 0x48;
                f
            },
            Term::RDMAP_BAD_OPCODE,
        ),
    ];
    for (crc, bytes, term) in cases {
        let (mut sock, server) = raw_peer(crc, keep);
        let s = server.join().unwrap();
        sock.write_all(&bytes).unwrap();
        expect_terminate(&mut sock, term);
        assert_eq!(s.qp.terminate_sent(), Some(term));
        assert_eq!(next(&s.rcq).status, next_status(term));
    }
    RAW_RECV.lock().unwrap().clear();
}

fn next_status(term: Term) -> WcStatus {
    match term {
        // The receive was taken by the Send the error is in.
        Term::MPA_CRC | Term::DDP_UNTAGGED_BAD_MSN | Term::DDP_UNTAGGED_BAD_MO => WcStatus::LocalProtErr,
        _ => WcStatus::WrFlushErr,
    }
}

static RAW_RECV: std::sync::Mutex<Vec<Arc<SoftMr>>> = std::sync::Mutex::new(Vec::new());

#[test]
fn read_requests_beyond_ird_are_refused() {
    let (mut sock, server) = raw_peer(false, |_| {});
    let s = server.join().unwrap();
    // A big source so the first response is still being written (we do not read) when the
    // second request arrives: two outstanding against IRD 1.
    let src = s.mr(vec![5u8; 32 << 20], ALL);
    for msn in 1..=2 {
        let rr = ReadRequest { sink_stag: 0x100, sink_to: 0, size: 32 << 20, src_stag: src.rkey(), src_to: src.addr() };
        let f = raw_fpdu(Header::Untagged { op: Opcode::ReadRequest, last: true, inv_stag: 0, qn: 1, msn, mo: 0 }, &rr.emit(), &[], false);
        sock.write_all(&f).unwrap();
    }
    wait_until("the IRD violation", || s.qp.terminate_sent().is_some());
    assert_eq!(s.qp.terminate_sent(), Some(Term::RDMAP_IRD_EXCEEDED));
}
