//! Two software-RNIC queue pairs over loopback TCP: every operation, and every error a peer
//! can cause, with the Terminate and completions the RFCs ask for.

use riser_iwarp::wire::{self, Header, IrdOrd, MpaFrame, Opcode, ReadRequest};
use riser_iwarp::{RnicConfig, SoftCq, SoftMr, SoftPd, SoftQp, SoftRnic, Term};
use riser_verbs::{
    Access, CompletionQueue, ConnParam, ConnectionRequest, Error, Listener, MemoryRegion, ProtectionDomain, Provider, QpCaps, QueuePair,
    RecvWr, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE);

struct End {
    rnic: SoftRnic,
    pd: Arc<SoftPd>,
    cq: Arc<SoftCq>,
    rcq: Arc<SoftCq>,
    qp: Arc<SoftQp>,
}

impl End {
    fn mr(&self, data: Vec<u8>, access: Access) -> Arc<SoftMr> {
        self.pd.register(data, access).unwrap()
    }
    fn recv(&self, id: u64, mr: &SoftMr) {
        self.qp.post_recv(RecvWr { wr_id: id, sg_list: vec![sge(mr, 0, mr.len())] }).unwrap();
    }
    fn send(&self, id: u64, op: SendOp, sg: Vec<Sge>) {
        self.qp.post_send(SendWr { wr_id: id, op, sg_list: sg, signaled: true }).unwrap();
    }
}

fn sge(mr: &SoftMr, off: usize, len: usize) -> Sge {
    Sge { addr: mr.addr() + off as u64, length: len as u32, lkey: mr.lkey() }
}

fn contents(mr: &SoftMr) -> Vec<u8> {
    let mut v = Vec::new();
    mr.read(&mut |b| v = b.to_vec());
    v
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Wait for one completion.
fn next(cq: &SoftCq) -> Wc {
    let t0 = Instant::now();
    loop {
        if let Some(wc) = cq.poll(1).pop() {
            return wc;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no completion");
        cq.wait_blocking(Duration::from_millis(100));
    }
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn end(rnic: SoftRnic) -> (SoftRnic, Arc<SoftPd>, Arc<SoftCq>, Arc<SoftCq>) {
    let pd = rnic.alloc_pd().unwrap();
    let cq = rnic.create_cq(256).unwrap();
    let rcq = rnic.create_cq(256).unwrap();
    (rnic, pd, cq, rcq)
}

/// A connected pair: (client, server). `server_setup` runs on the server's queue pair before it
/// accepts (post receives there).
fn pair_with(client_cfg: RnicConfig, server_cfg: RnicConfig, server_setup: impl FnOnce(&End) + Send + 'static) -> (End, End) {
    let (srnic, spd, scq, srcq) = end(SoftRnic::new(server_cfg));
    let listener = srnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut req = listener.get_request().unwrap();
        assert_eq!(req.private_data(), b"hello");
        let qp = req.create_qp(&spd, &scq, &srcq, QpCaps::default()).unwrap();
        let e = End { rnic: srnic, pd: spd, cq: scq, rcq: srcq, qp };
        server_setup(&e);
        req.accept(&ConnParam { private_data: b"welcome".to_vec(), responder_resources: 4, initiator_depth: 4 }).unwrap();
        e
    });
    let (crnic, cpd, ccq, crcq) = end(SoftRnic::new(client_cfg));
    let qp = crnic.create_qp(addr, &cpd, &ccq, &crcq, QpCaps::default()).unwrap();
    let est = crnic.connect(&qp, &ConnParam { private_data: b"hello".to_vec(), responder_resources: 4, initiator_depth: 4 }).unwrap();
    assert_eq!(est.private_data, b"welcome");
    assert_eq!((est.ird, est.ord), (4, 4));
    let client = End { rnic: crnic, pd: cpd, cq: ccq, rcq: crcq, qp };
    (client, server.join().unwrap())
}

fn pair() -> (End, End) {
    pair_with(RnicConfig::default(), RnicConfig::default(), |_| {})
}

#[test]
fn send_receive_every_size_with_gather_and_scatter() {
    for crc in [true, false] {
        let cfg = RnicConfig { crc, ..RnicConfig::default() };
        let sizes = [0usize, 1, 3, 100, 65516, 65517, 200_000];
        let bufs: Vec<_> = sizes.iter().map(|&n| vec![0u8; n + 8]).collect();
        let (c, s) = pair_with(cfg.clone(), cfg, move |s| {
            for (i, b) in bufs.into_iter().enumerate() {
                // Two scatter elements per receive.
                let mr = s.mr(b, Access::LOCAL_WRITE);
                let half = mr.len() / 2;
                s.qp.post_recv(RecvWr { wr_id: i as u64, sg_list: vec![sge(&mr, 0, half), sge(&mr, half, mr.len() - half)] }).unwrap();
                RECEIVES.lock().unwrap().push(mr);
            }
        });
        for (i, &n) in sizes.iter().enumerate() {
            let data = pattern(i as u8, n);
            let mr = c.mr(data.clone(), Access::empty());
            // Three gather elements.
            let (a, b) = (n / 3, 2 * n / 3);
            c.send(i as u64, SendOp::Send, vec![sge(&mr, 0, a), sge(&mr, a, b - a), sge(&mr, b, n - b)]);
            let wc = next(&c.cq);
            assert_eq!((wc.wr_id, wc.status, wc.opcode, wc.byte_len), (i as u64, WcStatus::Success, WcOpcode::Send, n as u32));
            let wc = next(&s.rcq);
            assert_eq!((wc.wr_id, wc.status, wc.opcode, wc.byte_len), (i as u64, WcStatus::Success, WcOpcode::Recv, n as u32));
            let got = contents(&RECEIVES.lock().unwrap()[i]);
            assert_eq!(&got[..n], &data[..], "size {n}, crc {crc}");
        }
        RECEIVES.lock().unwrap().clear();
        assert!(c.qp.is_connected() && s.qp.is_connected());
    }
}

static RECEIVES: std::sync::Mutex<Vec<Arc<SoftMr>>> = std::sync::Mutex::new(Vec::new());

#[test]
fn rdma_write_then_read_back_large_and_small() {
    let (c, s) = pair();
    for n in [1usize, 4096, 1 << 20, (4 << 20) + 3] {
        let target = s.mr(vec![0u8; n], ALL);
        let src = c.mr(pattern(7, n), Access::empty());
        c.send(1, SendOp::RdmaWrite { remote_addr: target.addr(), rkey: target.rkey() }, vec![sge(&src, 0, n)]);
        let wc = next(&c.cq);
        assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::RdmaWrite, n as u32));
        let sink = c.mr(vec![0u8; n], Access::LOCAL_WRITE);
        c.send(2, SendOp::RdmaRead { remote_addr: target.addr(), rkey: target.rkey() }, vec![sge(&sink, 0, n)]);
        let wc = next(&c.cq);
        assert_eq!((wc.wr_id, wc.status, wc.opcode, wc.byte_len), (2, WcStatus::Success, WcOpcode::RdmaRead, n as u32));
        assert_eq!(contents(&sink), pattern(7, n), "the read returns what the write placed ({n} bytes)");
        assert_eq!(contents(&target), pattern(7, n));
    }
    // Zero-length read: answered without touching memory.
    let sink = c.mr(vec![0u8; 8], Access::LOCAL_WRITE);
    c.send(3, SendOp::RdmaRead { remote_addr: 0, rkey: 0 }, vec![sge(&sink, 0, 0)]);
    assert_eq!(next(&c.cq).status, WcStatus::Success);
}

#[test]
fn many_reads_beyond_ord_queue_in_order() {
    let (c, s) = pair_with(RnicConfig::default(), RnicConfig::default(), |_| {});
    let src = s.mr(pattern(3, 64 << 10), ALL);
    let sinks: Vec<_> = (0..16).map(|_| c.mr(vec![0u8; 4096], Access::LOCAL_WRITE)).collect();
    for (i, sink) in sinks.iter().enumerate() {
        c.send(i as u64, SendOp::RdmaRead { remote_addr: src.addr() + (i * 4096) as u64, rkey: src.rkey() }, vec![sge(sink, 0, 4096)]);
    }
    for (i, sink) in sinks.iter().enumerate() {
        let wc = next(&c.cq);
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success), "reads complete in order");
        assert_eq!(contents(sink), pattern(3, 64 << 10)[i * 4096..(i + 1) * 4096]);
    }
    assert!(s.qp.is_connected());
}

#[test]
fn send_with_invalidate_and_solicited_event() {
    let (c, s) = pair_with(RnicConfig::default(), RnicConfig::default(), |s| {
        let r = s.mr(vec![0u8; 64], Access::LOCAL_WRITE);
        s.recv(1, &r);
        s.recv(2, &r);
        RECV_INV.lock().unwrap().push(r);
    });
    let exposed = s.mr(vec![0u8; 4096], ALL);
    let msg = c.mr(b"done".to_vec(), Access::empty());
    c.send(1, SendOp::SendWithSolicitedEvent, vec![sge(&msg, 0, 4)]);
    let wc = next(&s.rcq);
    assert!(wc.solicited && wc.invalidated_rkey.is_none());
    c.send(2, SendOp::SendWithInvalidate { rkey: exposed.rkey() }, vec![sge(&msg, 0, 4)]);
    let wc = next(&s.rcq);
    assert_eq!((wc.status, wc.invalidated_rkey), (WcStatus::Success, Some(exposed.rkey())));
    assert!(!exposed.is_valid(), "the peer's invalidation revoked the key");
    // A write to the invalidated key is refused and ends the connection.
    let src = c.mr(vec![1u8; 16], Access::empty());
    c.send(3, SendOp::RdmaWrite { remote_addr: exposed.addr(), rkey: exposed.rkey() }, vec![sge(&src, 0, 16)]);
    wait_until("the Terminate", || c.qp.terminate_received().is_some());
    assert_eq!(s.qp.terminate_sent(), Some(Term::DDP_TAGGED_INVALID_STAG));
    assert_eq!(contents(&exposed), vec![0u8; 4096], "nothing written");
    RECV_INV.lock().unwrap().clear();
}

static RECV_INV: std::sync::Mutex<Vec<Arc<SoftMr>>> = std::sync::Mutex::new(Vec::new());

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

#[test]
fn disconnect_flushes_outstanding_work_on_both_sides() {
    let (c, s) = pair_with(RnicConfig::default(), RnicConfig::default(), |s| {
        let r = s.mr(vec![0u8; 64], Access::LOCAL_WRITE);
        for i in 0..3 {
            s.recv(i, &r);
        }
        RECV_FLUSH.lock().unwrap().push(r);
    });
    let r = c.mr(vec![0u8; 64], Access::LOCAL_WRITE);
    for i in 0..2 {
        c.recv(100 + i, &r);
    }
    s.qp.disconnect();
    for _ in 0..3 {
        assert_eq!(next(&s.rcq).status, WcStatus::WrFlushErr);
    }
    for _ in 0..2 {
        assert_eq!(next(&c.rcq).status, WcStatus::WrFlushErr, "the peer's close flushes our receives");
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), c.qp.disconnected()).await }).expect("disconnected() resolves");
    c.recv(200, &r);
    assert_eq!(next(&c.rcq).status, WcStatus::WrFlushErr, "receives posted after the end flush at once");
    RECV_FLUSH.lock().unwrap().clear();
}

static RECV_FLUSH: std::sync::Mutex<Vec<Arc<SoftMr>>> = std::sync::Mutex::new(Vec::new());

#[test]
fn rev1_p2p_and_no_crc_connections_work() {
    for (client, server) in [
        (RnicConfig { mpa_rev: 1, ..RnicConfig::default() }, RnicConfig::default()),
        (RnicConfig { p2p: true, ..RnicConfig::default() }, RnicConfig::default()),
        (RnicConfig { crc: false, ..RnicConfig::default() }, RnicConfig { crc: false, ..RnicConfig::default() }),
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

// ----------------------------------------------------------------------------------------
// A hand-driven peer, for what a well-behaved RNIC never sends.

/// Connect a raw TCP peer to a riser server queue pair (IRD 1) and complete MPA.
fn raw_peer(crc: bool, setup: impl FnOnce(&End) + Send + 'static) -> (TcpStream, std::thread::JoinHandle<End>) {
    let (srnic, spd, scq, srcq) = end(SoftRnic::new(RnicConfig { crc: false, ..RnicConfig::default() }));
    let listener = srnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut req = listener.get_request().unwrap();
        let qp = req.create_qp(&spd, &scq, &srcq, QpCaps::default()).unwrap();
        let e = End { rnic: srnic, pd: spd, cq: scq, rcq: srcq, qp };
        setup(&e);
        req.accept(&ConnParam { private_data: vec![], responder_resources: 1, initiator_depth: 1 }).unwrap();
        e
    });
    let mut sock = TcpStream::connect(addr).unwrap();
    let request = MpaFrame {
        reply: false,
        flags: if crc { wire::MPA_FLAG_CRC } else { 0 },
        rev: 2,
        ird_ord: Some(IrdOrd { ird: 1, ord: 1, ..IrdOrd::default() }),
        private_data: vec![],
    };
    sock.write_all(&request.emit()).unwrap();
    let mut h = [0u8; 24];
    sock.read_exact(&mut h).unwrap();
    let reply = MpaFrame::parse(&h).unwrap();
    assert!(reply.reply && reply.rev == 2 && reply.crc() == crc);
    assert_eq!(reply.ird_ord.map(|io| (io.ird, io.ord)), Some((1, 1)));
    (sock, server)
}

fn raw_fpdu(h: Header, body: &[u8], payload: &[u8], crc: bool) -> Vec<u8> {
    let mut hb = [0u8; 64];
    let n = h.emit(&mut hb);
    let mut v = ((n + body.len() + payload.len()) as u16).to_be_bytes().to_vec();
    v.extend_from_slice(&hb[..n]);
    v.extend_from_slice(body);
    v.extend_from_slice(payload);
    v.resize(v.len() + wire::fpdu_pad(n + body.len() + payload.len()), 0);
    let sum = if crc { wire::fpdu_crc(&[&v]) } else { [0; 4] };
    v.extend_from_slice(&sum);
    v
}

fn send_hdr(msn: u32, mo: u32, last: bool) -> Header {
    Header::Untagged { op: Opcode::Send, last, inv_stag: 0, qn: 0, msn, mo }
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

#[test]
fn shared_regions_are_read_only_and_readable_remotely() {
    let (c, s) = pair();
    let bytes = bytes::Bytes::from(pattern(5, 10_000));
    assert!(s.pd.register_shared(bytes.clone(), Access::REMOTE_WRITE).is_err(), "no write rights on shared bytes");
    assert!(s.pd.register_shared(bytes.clone(), Access::LOCAL_WRITE).is_err());
    let src = s.pd.register_shared(bytes.clone(), Access::REMOTE_READ).unwrap();
    assert_eq!(src.addr(), bytes.as_ptr() as u64, "registered where it lies");
    let sink = c.mr(vec![0u8; 10_000], Access::LOCAL_WRITE);
    c.send(1, SendOp::RdmaRead { remote_addr: src.addr(), rkey: src.rkey() }, vec![sge(&sink, 0, 10_000)]);
    assert_eq!(next(&c.cq).status, WcStatus::Success);
    assert_eq!(contents(&sink), pattern(5, 10_000));
    // A write aimed at it is refused like any region without REMOTE_WRITE.
    let data = c.mr(vec![1u8; 16], Access::empty());
    c.send(2, SendOp::RdmaWrite { remote_addr: src.addr(), rkey: src.rkey() }, vec![sge(&data, 0, 16)]);
    wait_until("the Terminate", || c.qp.terminate_received().is_some());
    assert_eq!(s.qp.terminate_sent(), Some(Term::DDP_TAGGED_INVALID_STAG));
    assert_eq!(contents(&src), pattern(5, 10_000));
}

#[test]
fn a_peer_that_stops_reading_stalls_only_the_transmitter_and_order_holds() {
    // Small Sends go out on the poster's thread when the transmitter is idle; when the socket
    // is full they must neither block the poster nor overtake what is queued.
    let keep = |s: &End| {
        let r = s.mr(vec![0u8; 64], Access::LOCAL_WRITE);
        s.recv(1, &r);
        // Kept for the connection's life (not in RAW_RECV: another test clears that).
        std::mem::forget(r);
    };
    let (mut sock, server) = raw_peer(false, keep);
    let s = server.join().unwrap();
    // The responder speaks only after the initiator's first FPDU.
    sock.write_all(&raw_fpdu(send_hdr(1, 0, true), &[], b"", false)).unwrap();
    assert_eq!(next(&s.rcq).status, WcStatus::Success);
    // Far more than the socket buffers hold, in 3000-byte Sends, while the peer reads nothing:
    // every post returns.
    let (count, size) = (6000usize, 3000usize);
    let src = s.mr(pattern(7, count * size), Access::empty());
    let posted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poster = {
        let (qp, src, posted) = (s.qp.clone(), src.clone(), posted.clone());
        std::thread::spawn(move || {
            for i in 0..count {
                qp.post_send(SendWr { wr_id: i as u64, op: SendOp::Send, sg_list: vec![sge(&src, i * size, size)], signaled: true })
                    .unwrap();
            }
            posted.store(true, std::sync::atomic::Ordering::Release);
        })
    };
    wait_until("every post to return while the peer reads nothing", || posted.load(std::sync::atomic::Ordering::Acquire));
    poster.join().unwrap();
    // Now read the stream: every Send whole, in posting order (MSN 1, 2, …).
    let reader = std::thread::spawn(move || {
        let mut msn = 0u32;
        let mut data = Vec::new();
        while msn < count as u32 {
            let mut len = [0u8; 2];
            sock.read_exact(&mut len).unwrap();
            let len = usize::from(u16::from_be_bytes(len));
            let mut body = vec![0u8; len + wire::fpdu_pad(len) + 4];
            sock.read_exact(&mut body).unwrap();
            let h = Header::parse(&body).unwrap();
            let Header::Untagged { op: Opcode::Send, msn: m, mo: 0, last: true, .. } = h else { panic!("unexpected {h:?}") };
            msn += 1;
            assert_eq!(m, msn, "Sends arrive in posting order");
            data.extend_from_slice(&body[wire::UNTAGGED_HDR..len]);
        }
        data
    });
    for i in 0..count {
        let wc = next(&s.cq);
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success), "completions in order");
    }
    assert_eq!(reader.join().unwrap(), contents(&src));
}

// ----------------------------------------------------------------------------------------
// The listener: MPA handshakes off the accept path.

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
    let (addr, requests) = portal(RnicConfig { setup_timeout: Duration::from_secs(3), ..RnicConfig::default() });
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
    let (addr, _requests) = portal(RnicConfig { setup_timeout: Duration::from_secs(1), ..RnicConfig::default() });
    // A byte every 50 ms: each read would restart a per-read timeout; one deadline does not.
    let dropped = trickler(addr, Duration::from_millis(50), Duration::from_secs(5)).join().unwrap();
    let dropped = dropped.expect("the trickler was dropped");
    assert!(dropped >= Duration::from_millis(900) && dropped < Duration::from_millis(2500), "dropped after {dropped:?}");
}

#[test]
fn handshakes_beyond_the_bound_wait_for_a_slot() {
    // With room for two handshakes, two idle connections hold both slots: the next request is
    // read (not refused, not lost) once their deadline frees the slots.
    let (addr, requests) = portal(RnicConfig { setup_timeout: Duration::from_secs(1), max_handshakes: 2, ..RnicConfig::default() });
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
