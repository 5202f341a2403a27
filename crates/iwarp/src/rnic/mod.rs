//! The software RNIC: the device ([`SoftRnic`], its [`RnicConfig`] and the [`Provider`] impl)
//! and the fuzzing entry points. Its parts live in rooms of their own:
//!
//! - `mr`: memory regions and protection domains, and the STag checks every access passes;
//! - `cq`: completion queues;
//! - `qp`: queue pairs, their shared state, the verbs on them and their teardown;
//! - `tx`: the transmit engine (work requests and Read Responses into FPDUs);
//! - `rx`: the receive engine (FPDUs parsed and placed, violations mapped to Terminates); the
//!   two engines of a queue pair are one task (`SoftQp::start`);
//! - `cm`: connection setup (MPA request/reply, the listener and its handshake threads).

mod cm;
mod cq;
mod mr;
mod qp;
mod rx;
mod tx;

pub use cm::{SoftListener, SoftRequest};
pub use cq::SoftCq;
use mr::Regions;
pub use mr::{SoftMr, SoftPd};
pub use qp::SoftQp;

use crate::wire::{Term, TerminateMsg};
use qp::{QpState, TxQueue};
use riser_verbs::{
    Access, ConnParam, Established, MemoryRegion, ProtectionDomain, Provider, QpCaps, QueuePair, RecvWr, Result, SgList, Sge, Wc, WcOpcode,
    WcStatus,
};
use rx::{RxStream, receive};
use std::hash::Hasher;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tx::{Out, Tx, TxItem, now};

/// A completion without invalidation or solicited flag (all but successful receives).
fn wc(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Wc {
    Wc { wr_id, status, opcode, byte_len, invalidated_rkey: None, solicited: false }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The runtime a queue pair's engines run on, and whether it is the RNIC's own: the current
/// tokio runtime (the target and the initiator always run in one; it must have I/O enabled),
/// else one the RNIC starts once for the whole process, with a worker per CPU (at least two,
/// so the two ends of a connection in one process still run side by side), that runs the
/// engines of every queue pair started outside a runtime.
fn engine_runtime() -> io::Result<(tokio::runtime::Handle, bool)> {
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        return Ok((h, false));
    }
    static OWN: Mutex<Option<tokio::runtime::Runtime>> = Mutex::new(None);
    let mut own = lock(&OWN);
    if let Some(rt) = own.as_ref() {
        return Ok((rt.handle().clone(), true));
    }
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).thread_name("iwarp-engine").enable_io().build()?;
    let h = rt.handle().clone();
    *own = Some(rt);
    Ok((h, true))
}

/// A Terminate with no headers attached.
fn terminate_for(term: Term) -> TerminateMsg {
    TerminateMsg { term, segment_len: None, ddp_header: false, rdmap_header: false, attached: vec![] }
}

/// Largest IRD/ORD either side may use (Linux siw's limit).
pub const MAX_IRD_ORD: u8 = 128;

/// How the software RNIC connects.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RnicConfig {
    /// Ask for MPA CRC32C on FPDUs. The connection uses CRC when either side asks; off by
    /// default, as Linux siw (TCP's checksum already covers the stream; CRC costs a pass over
    /// every payload byte on each side).
    pub crc: bool,
    /// MPA revision to request: 2 (RFC 6581 enhanced setup with IRD/ORD) or 1.
    pub mpa_rev: u8,
    /// As initiator, ask for peer-to-peer mode and send a zero-length RDMA Write as the
    /// ready-to-receive message.
    pub p2p: bool,
    /// Payload bytes per FPDU (a multiple of 4, at most 65516).
    pub max_segment: usize,
    /// Time allowed for TCP connect and the MPA exchange. A listener allows this (at most
    /// 5 s) for reading each whole MPA request: one deadline from the accept, not a timeout per
    /// read that a peer sending a byte at a time could renew for ever.
    pub setup_timeout: Duration,
    /// MPA handshakes a listener runs at once, counting requests read but not yet taken by
    /// `get_request`; beyond it new connections wait in the kernel's accept backlog (they are
    /// not refused) until a handshake ends. Each handshake has a thread of its own and ends at
    /// its deadline at the latest, so this bounds the threads and sockets idle or trickling
    /// clients can make a listener hold, while a well-behaved request is read at once: the
    /// default, 64, lets a host (re)connect dozens of iSER sessions at the same moment (after
    /// a target restart, say) without queueing, at a cost of at most 64 small threads.
    pub max_handshakes: usize,
    /// Busy polling: a queue pair's receiver whose stream runs dry keeps trying to read for up
    /// to this long, between the runtime's other ready tasks, before it sleeps until bytes
    /// arrive. Lower latency at low queue depth (no wake-up per message), for CPU while waiting;
    /// `None` (the default): sleep at once. As riser-tcp's `SocketOptions::busy_poll`.
    pub busy_poll: Option<Duration>,
}

impl Default for RnicConfig {
    fn default() -> Self {
        Self {
            crc: false,
            mpa_rev: 2,
            p2p: false,
            max_segment: 65516,
            setup_timeout: Duration::from_secs(10),
            max_handshakes: 64,
            busy_poll: None,
        }
    }
}

impl RnicConfig {
    /// Ask for MPA CRC32C.
    #[must_use]
    pub fn crc(mut self, yes: bool) -> Self {
        self.crc = yes;
        self
    }

    /// MPA revision to request (2 or 1).
    #[must_use]
    pub fn mpa_rev(mut self, rev: u8) -> Self {
        self.mpa_rev = rev;
        self
    }

    /// As initiator, ask for peer-to-peer mode.
    #[must_use]
    pub fn p2p(mut self, yes: bool) -> Self {
        self.p2p = yes;
        self
    }

    /// Payload bytes per FPDU.
    #[must_use]
    pub fn max_segment(mut self, bytes: usize) -> Self {
        self.max_segment = bytes;
        self
    }

    /// Time allowed for TCP connect and the MPA exchange.
    #[must_use]
    pub fn setup_timeout(mut self, timeout: Duration) -> Self {
        self.setup_timeout = timeout;
        self
    }

    /// MPA handshakes a listener runs at once.
    #[must_use]
    pub fn max_handshakes(mut self, n: usize) -> Self {
        self.max_handshakes = n;
        self
    }

    /// Busy polling (see the field).
    #[must_use]
    pub fn busy_poll(mut self, budget: Option<Duration>) -> Self {
        self.busy_poll = budget;
        self
    }

    /// How long a listener waits for a whole MPA request (see [`RnicConfig::setup_timeout`]).
    fn handshake_time(&self) -> Duration {
        self.setup_timeout.min(Duration::from_secs(5))
    }
}

/// Hashes an STag index (looked up for every work request and every tagged segment): one
/// multiplication spreads it over the bits the table uses. The indexes are this RNIC's own, not
/// chosen by peers (a peer's STag only looks one up).
#[derive(Default)]
struct IndexHasher(u64);

impl Hasher for IndexHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The software RNIC (a [`Provider`]).
///
/// A connected queue pair's engines (its receiver and its transmitter) are one task on the tokio
/// runtime current where it connects — which must have I/O enabled, as riser's target and
/// initiator runtimes do (tokio panics registering a socket on one without) — or, connected
/// outside any runtime, on a runtime the RNIC starts once for the process.
#[derive(Clone, Debug)]
pub struct SoftRnic {
    shared: Arc<RnicShared>,
}

/// The device's state, shared by its handles, protection domains, regions and queue pairs.
/// Regions are found through their protection domain's table (`mr::Regions`): registering,
/// deregistering and every access of a connection touch nothing another connection writes (a
/// domain takes STag indexes from the shared counter 64 at a time, and reuses its own).
#[derive(Debug)]
struct RnicShared {
    config: RnicConfig,
    /// Every protection domain's region table (pruned as domains are made).
    domains: Mutex<Vec<Weak<Regions>>>,
    next_index: AtomicU32,
    next_pd: AtomicU64,
}

impl RnicShared {
    /// The region of STag `stag` in any protection domain: for telling a key of another domain
    /// (refused as such) from an unknown one, after the stream's own domain had none.
    fn lookup_any(&self, stag: u32) -> Option<Arc<SoftMr>> {
        self.domains().iter().find_map(|d| d.lookup(stag))
    }

    /// The region tables of the protection domains still in use (taken out of the list's lock,
    /// so that each table's own lock is taken alone).
    fn domains(&self) -> Vec<Arc<Regions>> {
        lock(&self.domains).iter().filter_map(Weak::upgrade).collect()
    }
}

impl Default for SoftRnic {
    fn default() -> Self {
        Self::new(RnicConfig::default())
    }
}

impl SoftRnic {
    /// A software RNIC with `config`.
    pub fn new(config: RnicConfig) -> Self {
        let start = rand::random::<u32>() & 0x00ff_ffff;
        Self {
            shared: Arc::new(RnicShared {
                config,
                domains: Mutex::new(Vec::new()),
                next_index: AtomicU32::new(start.max(1)),
                next_pd: AtomicU64::new(1),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RnicConfig {
        &self.shared.config
    }

    /// Regions currently registered (all protection domains): what remote peers could still
    /// reach with a valid STag is a subset of these.
    pub fn registered_regions(&self) -> usize {
        self.shared.domains().iter().map(|d| d.live()).sum()
    }

    /// Answer an MPA connection request arriving on an already accepted TCP stream (for
    /// servers that run their own listener). Blocks until the request is read, within
    /// [`RnicConfig::setup_timeout`] (at most 5 s) in all.
    pub fn request_from_stream(&self, stream: TcpStream) -> Result<SoftRequest> {
        cm::read_request(&self.shared, stream, Instant::now() + self.shared.config.handshake_time())
    }
}

impl Provider for SoftRnic {
    type Pd = SoftPd;
    type Cq = SoftCq;
    type Qp = SoftQp;
    type Listener = SoftListener;
    type Request = SoftRequest;

    fn name(&self) -> String {
        "soft-iwarp".into()
    }

    fn alloc_pd(&self) -> Result<Arc<SoftPd>> {
        let regions = Arc::new(Regions::new(self.shared.next_pd.fetch_add(1, Ordering::Relaxed)));
        let mut domains = lock(&self.shared.domains);
        domains.retain(|d| d.strong_count() > 0);
        domains.push(Arc::downgrade(&regions));
        drop(domains);
        Ok(Arc::new(SoftPd { regions, rnic: self.shared.clone() }))
    }

    fn create_cq(&self, _depth: u32) -> Result<Arc<SoftCq>> {
        Ok(Arc::new(SoftCq::new()))
    }

    fn listen(&self, addr: SocketAddr) -> Result<SoftListener> {
        SoftListener::bind(&self.shared, addr)
    }

    fn create_qp(
        &self,
        dest: SocketAddr,
        pd: &Arc<SoftPd>,
        send_cq: &Arc<SoftCq>,
        recv_cq: &Arc<SoftCq>,
        caps: QpCaps,
    ) -> Result<Arc<SoftQp>> {
        let qp = SoftQp::new(&self.shared, pd, send_cq, recv_cq, caps)?;
        *lock(&qp.s.dest) = Some(dest);
        Ok(qp)
    }

    fn connect(&self, qp: &Arc<SoftQp>, param: &ConnParam) -> Result<Established> {
        cm::connect(&self.shared, qp, param)
    }
}

/// A queue pair with no connection (posting receives works; sends fail), with its device, PD
/// and CQ: for fuzzing the layers above the RNIC without sockets or engines.
pub fn detached_qp() -> (SoftRnic, Arc<SoftPd>, Arc<SoftCq>, Arc<SoftQp>) {
    let rnic = SoftRnic::default();
    let pd = rnic.alloc_pd().expect("pd");
    let cq = rnic.create_cq(64).expect("cq");
    let qp = SoftQp::new(&rnic.shared, &pd, &cq, &cq, QpCaps { max_send_wr: 1024, max_recv_wr: 1024, max_sge: 4 }).expect("qp");
    (rnic, pd, cq, qp)
}

/// Feed `bytes` to a connected queue pair's receive engine (no socket; what it would send is
/// discarded): the fuzz target for the FPDU state machine. The bytes go in twice, all at once
/// and in pieces of a few bytes (the engine's path for FPDUs read ahead whole, and the one for
/// FPDUs arriving in parts): both must come to the same completions and Terminate, and, when
/// the stream ended without a Terminate, the same memory. Panics where they do not.
pub fn fuzz_receive(bytes: &[u8], crc: bool) {
    let per_read = 1 + bytes.first().map_or(0, |b| usize::from(b % 13));
    receive_both_ways(crc, per_read, true, &|_| bytes.to_vec());
}

/// [`fuzz_receive`] of the stream `stream` makes for the engine's three regions (each as an
/// element: address, length, STag); memory compared only if `memory` (it cannot be where a
/// corrupted stream places bytes that differ between the runs, such as an STag).
fn receive_both_ways(crc: bool, per_read: usize, memory: bool, stream: &dyn Fn(&[Sge]) -> Vec<u8>) {
    let whole = receive_memory(crc, usize::MAX, stream);
    let pieces = receive_memory(crc, per_read, stream);
    assert_eq!(whole.completions, pieces.completions, "completions, {per_read} bytes per read");
    assert_eq!(whole.terminated, pieces.terminated, "Terminate, {per_read} bytes per read");
    assert_eq!(whole.read_requests, pieces.read_requests, "Read Requests answered, {per_read} bytes per read");
    if memory && whole.terminated.is_none() {
        for (i, (a, b)) in whole.memory.iter().zip(&pieces.memory).enumerate() {
            if let Some(at) = a.iter().zip(b).position(|(x, y)| x != y) {
                panic!("region {i} differs from byte {at}, {per_read} bytes per read");
            }
        }
    }
}

/// What a receive engine made of a stream (see [`receive_memory`]).
struct Received {
    completions: Vec<Wc>,
    terminated: Option<Term>,
    read_requests: Vec<crate::wire::ReadRequest>,
    memory: Vec<Vec<u8>>,
}

/// Run a connected queue pair's receive engine over the bytes `stream` makes for its regions,
/// read `per_read` at most at a time. The regions' STags are given as their index (0 to 2) in
/// what is returned: they differ from one run to the next.
/// A queue pair made connected without a stream, for engines driven over memory: its
/// transmit queue installed, and the receiving end of it.
fn connected_in_memory(qp: &SoftQp) -> (TxQueue, tokio::sync::mpsc::UnboundedReceiver<TxItem>) {
    *lock(&qp.s.state) = QpState::Connected;
    let (items_tx, items) = tokio::sync::mpsc::unbounded_channel();
    let txq = TxQueue { items: items_tx, queued: qp.s.queued.clone() };
    *lock(&qp.s.tx) = Some(txq.clone());
    (txq, items)
}

fn receive_memory(crc: bool, per_read: usize, stream: &dyn Fn(&[Sge]) -> Vec<u8>) -> Received {
    let rnic = SoftRnic::default();
    let pd = rnic.alloc_pd().expect("pd");
    let cq = rnic.create_cq(64).expect("cq");
    let qp = SoftQp::new(&rnic.shared, &pd, &cq, &cq, QpCaps::default()).expect("qp");
    let all = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    // The second region as a read buffer taken from a pool: registered as it is, its unwritten
    // bytes cleared by placement and at the end (`Storage::Unwritten`).
    let regions: Vec<_> = (0..3)
        .map(|i| match i {
            1 => pd.register_for_peer_writes(vec![0xaa; 256 << i], all).expect("mr"),
            _ => pd.register(vec![0u8; 256 << i], all).expect("mr"),
        })
        .collect();
    for (i, mr) in regions.iter().enumerate() {
        let _ = qp.post_recv(RecvWr {
            wr_id: i as u64,
            sg_list: SgList::from_slice(&[Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() }]),
        });
    }
    // A receive in two elements, the ends of the first and second regions.
    let ends = [(&regions[0], 128), (&regions[1], 448)].map(|(mr, at)| Sge { addr: mr.addr() + at, length: 64, lkey: mr.lkey() });
    let _ = qp.post_recv(RecvWr { wr_id: 3, sg_list: SgList::from_slice(&ends) });
    qp.s.ird.store(4, Ordering::Release);
    qp.s.ord.store(4, Ordering::Release);
    let (txq, mut items) = connected_in_memory(&qp);
    // Reading from memory never waits: one poll runs the receiver to the end of the bytes.
    let elements: Vec<_> = regions.iter().map(|mr| Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() }).collect();
    let index = |stag: u32| elements.iter().position(|e| e.lkey == stag).map_or(stag, |i| i as u32);
    let bytes = stream(&elements);
    let _ = now(tokio::task::unconstrained(receive(&qp.s, RxStream::memory(&bytes, per_read), crc, &txq)));
    // No transmitter writes a Terminate here: close now rather than at the Terminate deadline.
    qp.s.close();
    // Run the transmitter over what the receiver queued, into a sink.
    drop(txq);
    let _ = lock(&qp.s.tx).take();
    let tx = Tx { crc, max_segment: 65516, msn_send: 0, msn_read: 0 };
    let mut read_requests = Vec::new();
    while let Ok(item) = items.try_recv() {
        if let TxItem::ReadResponse { req, src } = item {
            // The source as region and offset, when it is one of the regions.
            let src_to = elements.iter().find(|e| e.lkey == req.src_stag).map_or(req.src_to, |e| req.src_to.wrapping_sub(e.addr));
            read_requests.push(crate::wire::ReadRequest { src_stag: index(req.src_stag), src_to, ..req });
            let _ = now(tx.read_response(&mut Out::Sink, &req, src.as_ref(), &mut || {}, &|| false));
        }
    }
    let memory = regions
        .iter()
        .map(|mr| {
            let mut m = Vec::new();
            mr.read(&mut |b| m.extend_from_slice(b));
            m
        })
        .collect();
    let completions = riser_verbs::CompletionQueue::poll(&*cq, usize::MAX)
        .into_iter()
        .map(|wc| Wc { invalidated_rkey: wc.invalidated_rkey.map(index), ..wc })
        .collect();
    Received { completions, terminated: *lock(&qp.s.terminate_sent), read_requests, memory }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Header, Opcode, QN_READ, QN_SEND, ReadRequest, fpdu_crc, fpdu_pad};

    /// One FPDU: length, `h`, `body`, pad, CRC (zero when off).
    fn fpdu(crc: bool, h: Header, body: &[u8]) -> Vec<u8> {
        let mut hb = [0u8; 32];
        let n = h.emit(&mut hb);
        let mpa_len = n + body.len();
        let mut f = (mpa_len as u16).to_be_bytes().to_vec();
        f.extend_from_slice(&hb[..n]);
        f.extend_from_slice(body);
        f.resize(f.len() + fpdu_pad(mpa_len), 0);
        let sum = if crc { fpdu_crc(&[&f]) } else { [0; 4] };
        f.extend_from_slice(&sum);
        f
    }

    fn send(op: Opcode, msn: u32, mo: u32, last: bool, inv_stag: u32) -> Header {
        Header::Untagged { op, last, inv_stag, qn: QN_SEND, msn, mo }
    }

    /// `n` bytes of a pattern of `seed`'s.
    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
    }

    /// Every kind of segment the engine takes, whole and in parts, over the three regions of
    /// `receive_memory` (`e`).
    fn stream(crc: bool, e: &[Sge]) -> Vec<u8> {
        fpdus(crc, e).concat()
    }

    /// [`stream`]'s FPDUs.
    fn fpdus(crc: bool, e: &[Sge]) -> Vec<Vec<u8>> {
        let write = |stag: u32, to: u64, last: bool| Header::Tagged { op: Opcode::Write, last, stag, to };
        let req = ReadRequest { sink_stag: 0x1234, sink_to: 0, size: 64, src_stag: e[2].lkey, src_to: e[2].addr + 8 };
        [
            fpdu(crc, send(Opcode::Send, 1, 0, true, 0), &bytes(100, 1)),
            fpdu(crc, write(e[2].lkey, e[2].addr + 10, true), &bytes(300, 2)),
            fpdu(crc, write(e[1].lkey, e[1].addr + 100, false), &bytes(50, 3)),
            fpdu(crc, write(e[1].lkey, e[1].addr + 150, true), &bytes(21, 4)),
            fpdu(crc, send(Opcode::SendSe, 2, 0, false, 0), &bytes(40, 5)),
            fpdu(crc, send(Opcode::SendSe, 2, 40, true, 0), &bytes(31, 6)),
            fpdu(crc, Header::Untagged { op: Opcode::ReadRequest, last: true, inv_stag: 0, qn: QN_READ, msn: 1, mo: 0 }, &req.emit()),
            fpdu(crc, write(e[0].lkey, e[0].addr, true), &[]),
            fpdu(crc, send(Opcode::SendInvalidate, 3, 0, true, e[2].lkey), &bytes(9, 7)),
            fpdu(crc, send(Opcode::Send, 4, 0, false, 0), &bytes(50, 8)),
            fpdu(crc, send(Opcode::Send, 4, 50, true, 0), &bytes(60, 9)),
        ]
        .to_vec()
    }

    /// What [`bulk_receive`] ends with: completions (work request, status, bytes), the
    /// Terminate sent if any, the receives' data parts and the Read's sink as a local reader
    /// sees them.
    type Bulk = (Vec<(u64, WcStatus, u32)>, Option<Term>, Vec<u8>, Vec<u8>);

    /// The data part of each bulk receive in [`bulk_receive`].
    const BULK_PART: usize = 320 << 10;

    /// A connected queue pair's receive engine, read `per_read` bytes at most at a time, over
    /// the FPDUs `stream` makes (given the elements: a receive's header part of 76 bytes, the
    /// data parts of two receives, 320 KiB each, in one region, a small receive of 1 KiB, a
    /// Read's 300 KiB sink, as address, length and STag). Posted in this order: receive 1 (the
    /// header part, the first data part), receive 2 (1 KiB), receive 3 (the header part, the
    /// second data part); Read 9 into the sink outstanding. The data parts hold 0xaa first, the
    /// sink 0xbb.
    fn bulk_receive(crc: bool, per_read: usize, stream: &dyn Fn(&[Sge]) -> Vec<u8>) -> Bulk {
        let rnic = SoftRnic::default();
        let pd = rnic.alloc_pd().expect("pd");
        let cq = rnic.create_cq(64).expect("cq");
        let qp = SoftQp::new(&rnic.shared, &pd, &cq, &cq, QpCaps::default()).expect("qp");
        let head = pd.register(vec![0u8; 76], Access::LOCAL_WRITE).expect("mr");
        let data = pd.register(vec![0xaa; 2 * BULK_PART], Access::LOCAL_WRITE).expect("mr");
        let small = pd.register(vec![0u8; 1024], Access::LOCAL_WRITE).expect("mr");
        let sink = pd.register(vec![0xbb; 300 << 10], Access::LOCAL_WRITE | Access::READ_SINK).expect("mr");
        let whole = |mr: &Arc<SoftMr>| Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() };
        let part = |i: u64| Sge { addr: data.addr() + i * BULK_PART as u64, length: BULK_PART as u32, lkey: data.lkey() };
        let e = [whole(&head), part(0), part(1), whole(&small), whole(&sink)];
        for (wr_id, sg) in [(1, [e[0], e[1]].as_slice()), (2, &e[3..4]), (3, &[e[0], e[2]])] {
            qp.post_recv(RecvWr { wr_id, sg_list: SgList::from_slice(sg) }).expect("recv");
        }
        lock(&qp.s.orq).push_back(qp::PendingRead {
            wr_id: 9,
            signaled: true,
            sink: e[4],
            size: e[4].length,
            received: 0,
            internal: false,
        });
        let (txq, _items) = connected_in_memory(&qp);
        let bytes = stream(&e);
        let _ = now(tokio::task::unconstrained(receive(&qp.s, RxStream::memory(&bytes, per_read), crc, &txq)));
        qp.s.close();
        let completions =
            riser_verbs::CompletionQueue::poll(&*cq, usize::MAX).into_iter().map(|wc| (wc.wr_id, wc.status, wc.byte_len)).collect();
        let read = |mr: &Arc<SoftMr>| {
            let mut m = Vec::new();
            mr.read(&mut |b| m.extend_from_slice(b));
            m
        };
        (completions, *lock(&qp.s.terminate_sent), read(&data), read(&sink))
    }

    /// A receiver whose stream never runs dry still lets the rest of its task take turns (the
    /// transmitter is the same task, see `SoftQp::start`): every FPDU counts against the
    /// task's tokio budget, also one read in pieces (before, only one found whole in the
    /// buffer did, and a stream of larger FPDUs held the task until it ended).
    #[test]
    fn a_receiver_whose_stream_never_runs_dry_lets_its_task_take_turns() {
        const SENDS: u64 = 400;
        let rnic = SoftRnic::default();
        let pd = rnic.alloc_pd().expect("pd");
        let cq = rnic.create_cq(1024).expect("cq");
        let qp = SoftQp::new(&rnic.shared, &pd, &cq, &cq, QpCaps { max_recv_wr: 512, ..QpCaps::default() }).expect("qp");
        let mr = pd.register(vec![0u8; 256 * SENDS as usize], Access::LOCAL_WRITE).expect("mr");
        for i in 0..SENDS {
            let sge = Sge { addr: mr.addr() + i * 256, length: 256, lkey: mr.lkey() };
            qp.post_recv(RecvWr { wr_id: i, sg_list: SgList::from_slice(&[sge]) }).expect("recv");
        }
        let (txq, _items) = connected_in_memory(&qp);
        // Sends of 200 bytes read 64 bytes at a time: none is ever whole in the buffer.
        let bytes: Vec<u8> = (0..SENDS)
            .flat_map(|i| {
                let h = Header::Untagged { op: Opcode::Send, last: true, inv_stag: 0, qn: QN_SEND, msn: i as u32 + 1, mo: 0 };
                fpdu(false, h, &[7u8; 200])
            })
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let (turn, all) = rt.block_on(async {
            // The rest of the task: asks for its next turn, then counts the Sends received.
            let rest = async {
                tokio::task::yield_now().await;
                riser_verbs::CompletionQueue::poll(&*cq, usize::MAX).len()
            };
            let ((), turn) = tokio::join!(receive(&qp.s, RxStream::memory(&bytes, 64), false, &txq), rest);
            (turn, turn + riser_verbs::CompletionQueue::poll(&*cq, usize::MAX).len())
        });
        assert_eq!(all, SENDS as usize, "every Send received");
        assert!(turn > 0 && turn < SENDS as usize, "the rest of the task had its turn after {turn} of {SENDS} Sends");
    }

    /// A message's FPDUs, cut into segments of the sizes `cuts` gives in turn (the last size
    /// repeated), each with the header `msg(offset, last)`.
    fn cut(crc: bool, payload: &[u8], cuts: &[usize], msg: &dyn Fn(usize, bool) -> Header) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        let mut i = 0;
        while at < payload.len() || out.is_empty() {
            let n = cuts[i.min(cuts.len() - 1)].min(payload.len() - at);
            out.push(fpdu(crc, msg(at, at + n == payload.len()), &payload[at..at + n]));
            at += n;
            i += 1;
        }
        out
    }

    /// A bulk message's next segments are read ahead into where they would go, and taken as
    /// placed once their headers say they go there: the same completions and bytes as when
    /// each is read on its own, whatever the sender's cuts, the bytes per read and what comes
    /// between or after them (segments cut shorter or longer, a Send between a Read's
    /// segments, a Send right after, a bulk Send longer or shorter than the one before). A
    /// corrupted CRC in a segment read ahead still ends the stream.
    #[test]
    fn bulk_segments_read_ahead_into_place_are_received_as_read_one_by_one() {
        let first = bytes(76 + (250 << 10), 11);
        let read_data = bytes(300 << 10, 12);
        let small = bytes(300, 13);
        let (longer, shorter) = (bytes(76 + (300 << 10), 14), bytes(76 + (100 << 10), 15));
        let send = |msn: u32| {
            move |mo: usize, last: bool| Header::Untagged { op: Opcode::Send, last, inv_stag: 0, qn: QN_SEND, msn, mo: mo as u32 }
        };
        let resp = |e: &[Sge]| {
            let sink = e[4];
            move |at: usize, last: bool| Header::Tagged { op: Opcode::ReadResponse, last, stag: sink.lkey, to: sink.addr + at as u64 }
        };
        let m = 65516;
        // A Send of whole segments: it ends where its last segment read ahead ends.
        let whole = bytes(3 * m, 16);
        // (name, the stream, the first Send's bytes, the third's)
        type Streams<'a> = Vec<(&'a str, Box<dyn Fn(bool, &[Sge]) -> Vec<u8> + 'a>, &'a [u8], &'a [u8])>;
        // The first Send, the Read, the small Send and the third Send in that order, each cut
        // as given.
        let in_order = |crc: bool, e: &[Sge], cuts: [&[usize]; 3], third: &[u8]| {
            let [a, b, c, d] = [
                cut(crc, &first, cuts[0], &send(1)),
                cut(crc, &read_data, cuts[1], &resp(e)),
                cut(crc, &small, &[m], &send(2)),
                cut(crc, third, cuts[2], &send(3)),
            ];
            [a, b, c, d].concat().concat()
        };
        let streams: Streams<'_> = vec![
            ("regular cuts", Box::new(|crc, e| in_order(crc, e, [&[m], &[m], &[m]], &longer)), &first, &longer),
            (
                "cuts that shrink",
                Box::new(|crc, e| in_order(crc, e, [&[m, 30000, 9000, m], &[m, m, 12000, m - 4], &[m]], &shorter)),
                &first,
                &shorter,
            ),
            (
                "cuts that grow",
                Box::new(|crc, e| in_order(crc, e, [&[9000, m], &[8192, 8193, m], &[9000, 20000, m]], &longer)),
                &first,
                &longer,
            ),
            (
                "a Send of whole segments, another message right behind",
                Box::new(|crc, e| {
                    let [a, b, c, d] = [
                        cut(crc, &whole, &[m], &send(1)),
                        cut(crc, &small, &[m], &send(2)),
                        cut(crc, &read_data, &[m], &resp(e)),
                        cut(crc, &whole, &[m], &send(3)),
                    ];
                    [a, b, c, d].concat().concat()
                }),
                &whole,
                &whole,
            ),
            (
                "a Send between a Read's segments",
                Box::new(|crc, e| {
                    let r = cut(crc, &read_data, &[m], &resp(e));
                    let [a, b, c] =
                        [cut(crc, &first, &[m], &send(1)), cut(crc, &small, &[m], &send(2)), cut(crc, &shorter, &[m], &send(3))];
                    [&r[..2], &a[..], &r[2..], &b[..], &c[..]].concat().concat()
                }),
                &first,
                &shorter,
            ),
        ];
        for crc in [false, true] {
            for (name, stream, first, third) in &streams {
                let mut seen = None;
                for per_read in [usize::MAX, 1 << 20, 100_000, 65536, 4096, 1000, 7] {
                    let (taken, back) = (rx::AHEAD_TAKEN.load(Ordering::Relaxed), rx::UNAHEAD.load(Ordering::Relaxed));
                    let got = bulk_receive(crc, per_read, &|e| stream(crc, e));
                    if per_read == usize::MAX {
                        assert!(rx::AHEAD_TAKEN.load(Ordering::Relaxed) > taken, "{name}: segments taken as read ahead");
                        assert!(rx::UNAHEAD.load(Ordering::Relaxed) > back, "{name}: bytes read ahead put back");
                    }
                    let at = format!("{name}, crc {crc}, {per_read} bytes per read");
                    let (completions, terminated, data, sink) = &got;
                    assert_eq!(*terminated, None, "{at}");
                    let mut done = completions.clone();
                    done.sort_unstable_by_key(|c| c.0);
                    let want = [(1, first.len()), (2, small.len()), (3, third.len()), (9, read_data.len())]
                        .map(|(id, n)| (id, WcStatus::Success, n as u32));
                    assert_eq!(done, want, "{at}");
                    let differs = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
                    assert_eq!(differs(sink, &read_data), None, "{at}: the Read's sink differs from this byte on");
                    assert_eq!(differs(&data[..first.len() - 76], &first[76..]), None, "{at}: the first Send's data");
                    assert_eq!(differs(&data[BULK_PART..BULK_PART + third.len() - 76], &third[76..]), None, "{at}: the third Send's data");
                    // Read in pieces or in one go: the same outcome (the bytes past each Send's
                    // end in its element are not compared: they may hold bytes read ahead).
                    match &seen {
                        None => seen = Some(got),
                        Some(s) => assert!(s.0 == got.0 && s.1 == got.1 && s.3 == got.3, "{at}: as read in one go"),
                    }
                }
            }
            // A segment read ahead with a bad CRC ends the stream as one read on its own does.
            if crc {
                let bad = |e: &[Sge]| {
                    let mut s = [cut(true, &read_data, &[m], &resp(e)), cut(true, &small, &[m], &send(1))].concat();
                    let last = s[2].len() - 1;
                    s[2][last] ^= 1;
                    s.concat()
                };
                for per_read in [usize::MAX, 100_000, 4096] {
                    let (completions, terminated, _, _) = bulk_receive(true, per_read, &bad);
                    assert_eq!(terminated, Some(Term::MPA_CRC), "{per_read} bytes per read");
                    assert!(!completions.iter().any(|c| c.0 == 9 && c.1 == WcStatus::Success), "the Read does not complete");
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(40))]

        /// Reading ahead, whatever the sender's cuts, the bytes per read and where a small Send
        /// comes between a Read's segments: a bulk Send, the Read, the small Send and a second
        /// bulk Send all complete with their bytes where they belong.
        #[test]
        fn bulk_messages_cut_any_way_arrive_whole(
            first_len in 1usize..76 + BULK_PART,
            third_len in 1usize..76 + BULK_PART,
            send_cuts in proptest::collection::vec(1usize..=65516, 1..6),
            read_cuts in proptest::collection::vec(1usize..=65516, 1..6),
            between in 0usize..8,
            per_read in proptest::prop_oneof![proptest::strategy::Just(usize::MAX), 1000usize..300_000],
            crc: bool,
        ) {
            let (first, third) = (bytes(first_len, 21), bytes(third_len, 22));
            let (read_data, small) = (bytes(300 << 10, 23), bytes(300, 24));
            let send = |msn: u32| move |mo: usize, last: bool| Header::Untagged { op: Opcode::Send, last, inv_stag: 0, qn: QN_SEND, msn, mo: mo as u32 };
            let stream = |e: &[Sge]| {
                let sink = e[4];
                let resp = move |at: usize, last: bool| Header::Tagged { op: Opcode::ReadResponse, last, stag: sink.lkey, to: sink.addr + at as u64 };
                let r = cut(crc, &read_data, &read_cuts, &resp);
                let at = between.min(r.len());
                let rev: Vec<usize> = send_cuts.iter().rev().copied().collect();
                [cut(crc, &first, &send_cuts, &send(1)), r[..at].to_vec(), cut(crc, &small, &[65516], &send(2)), r[at..].to_vec(), cut(crc, &third, &rev, &send(3))]
                    .concat()
                    .concat()
            };
            let (completions, terminated, data, sink) = bulk_receive(crc, per_read, &stream);
            proptest::prop_assert_eq!(terminated, None);
            let mut done = completions;
            done.sort_unstable_by_key(|c| c.0);
            let want = [(1, first_len), (2, small.len()), (3, third_len), (9, read_data.len())].map(|(id, n)| (id, WcStatus::Success, n as u32));
            proptest::prop_assert_eq!(done, want);
            proptest::prop_assert!(sink == read_data, "the Read's sink");
            let body = |b: &[u8]| b.get(76..).map(<[u8]>::to_vec).unwrap_or_default();
            proptest::prop_assert!(data[..body(&first).len()] == body(&first)[..], "the first Send's data");
            proptest::prop_assert!(data[BULK_PART..BULK_PART + body(&third).len()] == body(&third)[..], "the third Send's data");
        }
    }

    /// The engine's path for FPDUs read ahead whole and its path for FPDUs arriving in parts
    /// come to the same completions, Terminate, Read Responses and memory: for a stream of
    /// every kind of segment, read in pieces of every size, and for every truncation and every
    /// corrupted byte of it, CRC on and off.
    #[test]
    fn fpdus_read_ahead_whole_and_in_parts_are_received_alike() {
        for crc in [false, true] {
            let fast = rx::FAST_FPDUS.load(Ordering::Relaxed);
            let clean = receive_memory(crc, usize::MAX, &|e| stream(crc, e));
            assert!(rx::FAST_FPDUS.load(Ordering::Relaxed) >= fast + 10, "the stream read ahead is taken without waiting");
            assert_eq!(clean.terminated, None, "crc {crc}");
            let recvs: Vec<_> = clean.completions.iter().map(|wc| (wc.wr_id, wc.status, wc.byte_len, wc.invalidated_rkey)).collect();
            assert_eq!(
                recvs,
                [
                    (0, WcStatus::Success, 100, None),
                    (1, WcStatus::Success, 71, None),
                    (2, WcStatus::Success, 9, Some(2)),
                    (3, WcStatus::Success, 110, None)
                ]
            );
            let r = clean.read_requests[0];
            assert_eq!((clean.read_requests.len(), r.src_stag, r.src_to, r.sink_to, r.size), (1, 2, 8, 0, 64), "crc {crc}");
            // Every byte where the stream put it; the second region's unwritten bytes cleared.
            let mut want = [vec![0u8; 256], vec![0u8; 512], vec![0u8; 1024]];
            let sends = [bytes(40, 5), bytes(31, 6)].concat();
            let two = [bytes(50, 8), bytes(60, 9)].concat();
            for (region, at, b) in [
                (0, 0, &bytes(100, 1)[..]),
                (2, 10, &bytes(300, 2)),
                (1, 100, &bytes(50, 3)),
                (1, 150, &bytes(21, 4)),
                (1, 0, &sends),
                (2, 0, &bytes(9, 7)),
                (0, 128, &two[..64]),
                (1, 448, &two[64..]),
            ] {
                want[region][at..at + b.len()].copy_from_slice(b);
            }
            assert!(clean.memory == want, "memory, crc {crc}");
            for per_read in (1..=24).chain([63, 64, 65, 1000]) {
                receive_both_ways(crc, per_read, true, &|e| stream(crc, e));
            }
            // Bytes that name a region (an STag, an address, and the CRC over them) differ from
            // one run to the next, as the regions do: a change to one of them lands elsewhere
            // in each. The others are corrupted one at a time (memory not compared: a changed
            // length can make bytes that name a region payload).
            let fake = |k: u64| -> Vec<Sge> {
                (0..3)
                    .map(|i| Sge { addr: 0x0101_0101_0101_0101 * k + (i << 4), length: 0, lkey: 0x0101_0101 * k as u32 + i as u32 })
                    .collect()
            };
            let (a, b) = (stream(crc, &fake(1)), stream(crc, &fake(2)));
            let n = a.len();
            // A stream that ends inside a Send: its receive is flushed with those still queued.
            let cut = fpdus(crc, &fake(1))[..5].concat().len();
            let ended = receive_memory(crc, usize::MAX, &|e| stream(crc, e)[..cut].to_vec());
            let mut flushed: Vec<_> = ended.completions.iter().filter(|wc| wc.status == WcStatus::WrFlushErr).map(|wc| wc.wr_id).collect();
            flushed.sort_unstable();
            assert_eq!(flushed, [1, 2, 3], "crc {crc}");
            for cut in 0..n {
                receive_both_ways(crc, 1 + cut % 7, true, &|e| stream(crc, e)[..cut].to_vec());
            }
            // A changed length field makes bytes further on a length: perhaps an address's.
            let mut lengths = Vec::new();
            let mut at = 0;
            for f in fpdus(crc, &fake(1)) {
                lengths.extend([at, at + 1]);
                at += f.len();
            }
            for at in (0..n).filter(|&at| a[at] == b[at] && !lengths.contains(&at)) {
                receive_both_ways(crc, 1 + at % 5, false, &|e| {
                    let mut s = stream(crc, e);
                    s[at] ^= 0x5a;
                    s
                });
            }
        }
    }
}
