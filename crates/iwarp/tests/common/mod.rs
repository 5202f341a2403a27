//! What the iWARP integration tests share: a connected pair of software-RNIC queue pairs over
//! loopback TCP, a hand-driven raw peer, and small helpers for regions and completions.

// Each test file uses its own subset of these.
#![allow(dead_code)]

use riser_iwarp::wire::{self, Header, IrdOrd, MpaFrame, Opcode};
use riser_iwarp::{RnicConfig, SoftCq, SoftMr, SoftPd, SoftQp, SoftRnic};
use riser_verbs::{
    Access, CompletionQueue, ConnParam, ConnectionRequest, Listener, MemoryRegion, ProtectionDomain, Provider, QpCaps, QueuePair, RecvWr,
    SendOp, SendWr, Sge, Wc,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE);

pub(crate) struct End {
    pub(crate) rnic: SoftRnic,
    pub(crate) pd: Arc<SoftPd>,
    pub(crate) cq: Arc<SoftCq>,
    pub(crate) rcq: Arc<SoftCq>,
    pub(crate) qp: Arc<SoftQp>,
}

impl End {
    pub(crate) fn mr(&self, data: Vec<u8>, access: Access) -> Arc<SoftMr> {
        self.pd.register(data, access).unwrap()
    }
    pub(crate) fn recv(&self, id: u64, mr: &SoftMr) {
        self.qp.post_recv(RecvWr { wr_id: id, sg_list: vec![sge(mr, 0, mr.len())].into() }).unwrap();
    }
    pub(crate) fn send(&self, id: u64, op: SendOp, sg: Vec<Sge>) {
        let sg = riser_verbs::SgList::from_vec(sg);
        self.qp.post_send(SendWr { wr_id: id, op, sg_list: sg, unregistered: None, signaled: true }).unwrap();
    }
}

pub(crate) fn sge(mr: &SoftMr, off: usize, len: usize) -> Sge {
    Sge { addr: mr.addr() + off as u64, length: len as u32, lkey: mr.lkey() }
}

pub(crate) fn contents(mr: &SoftMr) -> Vec<u8> {
    let mut v = Vec::new();
    mr.read(&mut |b| v = b.to_vec());
    v
}

pub(crate) fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Wait for one completion.
pub(crate) fn next(cq: &SoftCq) -> Wc {
    let t0 = Instant::now();
    loop {
        if let Some(wc) = cq.poll(1).pop() {
            return wc;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no completion");
        cq.wait_blocking(Duration::from_millis(100));
    }
}

pub(crate) fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub(crate) fn end(rnic: SoftRnic) -> (SoftRnic, Arc<SoftPd>, Arc<SoftCq>, Arc<SoftCq>) {
    let pd = rnic.alloc_pd().unwrap();
    let cq = rnic.create_cq(256).unwrap();
    let rcq = rnic.create_cq(256).unwrap();
    (rnic, pd, cq, rcq)
}

/// A connected pair: (client, server). `server_setup` runs on the server's queue pair before it
/// accepts (post receives there).
pub(crate) fn pair_with(client_cfg: RnicConfig, server_cfg: RnicConfig, server_setup: impl FnOnce(&End) + Send + 'static) -> (End, End) {
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

pub(crate) fn pair() -> (End, End) {
    pair_with(RnicConfig::default(), RnicConfig::default(), |_| {})
}

/// Connect a raw TCP peer to a riser server queue pair (IRD 1) and complete MPA.
pub(crate) fn raw_peer(crc: bool, setup: impl FnOnce(&End) + Send + 'static) -> (TcpStream, std::thread::JoinHandle<End>) {
    raw_peer_with(crc, QpCaps::default(), setup)
}

/// [`raw_peer`], the server's queue pair created with `caps`.
pub(crate) fn raw_peer_with(
    crc: bool,
    caps: QpCaps,
    setup: impl FnOnce(&End) + Send + 'static,
) -> (TcpStream, std::thread::JoinHandle<End>) {
    let (srnic, spd, scq, srcq) = end(SoftRnic::new(RnicConfig::default().crc(false)));
    let listener = srnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut req = listener.get_request().unwrap();
        let qp = req.create_qp(&spd, &scq, &srcq, caps).unwrap();
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

pub(crate) fn raw_fpdu(h: Header, body: &[u8], payload: &[u8], crc: bool) -> Vec<u8> {
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

pub(crate) fn send_hdr(msn: u32, mo: u32, last: bool) -> Header {
    Header::Untagged { op: Opcode::Send, last, inv_stag: 0, qn: 0, msn, mo }
}
