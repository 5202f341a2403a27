//! The software RNIC: memory, queue pairs, the FPDU receive and transmit engines and the MPA
//! connection manager.

use crate::Term;
use crate::wire::{
    self, Header, IrdOrd, MPA_FLAG_CRC, MPA_FLAG_ENHANCED, MPA_FLAG_MARKERS, MPA_FLAG_REJECT, MPA_HEADER_LEN, MpaFrame, Opcode, QN_READ,
    QN_SEND, QN_TERMINATE, READ_REQUEST_LEN, ReadRequest, TerminateMsg, UNTAGGED_HDR,
};
use riser_verbs::{
    Access, BoxFuture, CompletionQueue, ConnParam, ConnectionRequest, Error, Established, Listener, MAX_PRIVATE_DATA, MemoryRegion,
    ProtectionDomain, Provider, QpCaps, QueuePair, RecvWr, Result, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// A completion without invalidation or solicited flag (all but successful receives).
fn wc(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Wc {
    Wc { wr_id, status, opcode, byte_len, invalidated_rkey: None, solicited: false }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Largest IRD/ORD either side may use (Linux siw's limit).
pub const MAX_IRD_ORD: u8 = 128;

/// How the software RNIC connects.
#[derive(Clone, Debug)]
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
}

impl Default for RnicConfig {
    fn default() -> Self {
        Self { crc: false, mpa_rev: 2, p2p: false, max_segment: 65516, setup_timeout: Duration::from_secs(10), max_handshakes: 64 }
    }
}

impl RnicConfig {
    /// How long a listener waits for a whole MPA request (see [`RnicConfig::setup_timeout`]).
    fn handshake_time(&self) -> Duration {
        self.setup_timeout.min(Duration::from_secs(5))
    }
}

/// The software RNIC (a [`Provider`]).
#[derive(Clone, Debug)]
pub struct SoftRnic {
    shared: Arc<RnicShared>,
}

#[derive(Debug)]
struct RnicShared {
    config: RnicConfig,
    /// STag index → region.
    regions: Mutex<HashMap<u32, Weak<SoftMr>>>,
    next_index: AtomicU32,
    next_pd: AtomicU64,
}

impl RnicShared {
    fn lookup(&self, stag: u32) -> Option<Arc<SoftMr>> {
        lock(&self.regions).get(&(stag >> 8)).and_then(Weak::upgrade)
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
                regions: Mutex::new(HashMap::new()),
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
        lock(&self.shared.regions).values().filter(|w| w.strong_count() > 0).count()
    }

    /// Answer an MPA connection request arriving on an already accepted TCP stream (for
    /// servers that run their own listener). Blocks until the request is read, within
    /// [`RnicConfig::setup_timeout`] (at most 5 s) in all.
    pub fn request_from_stream(&self, stream: TcpStream) -> Result<SoftRequest> {
        read_request(&self.shared, stream, Instant::now() + self.shared.config.handshake_time())
    }
}

// ------------------------------------------------------------------------------------------
// Completion queues

/// A completion queue.
#[derive(Debug)]
pub struct SoftCq {
    q: Mutex<VecDeque<Wc>>,
    cv: Condvar,
    /// Threads blocked in `wait_blocking` (changed under `q`'s lock): a notify of the condition
    /// variable is a system call even with nobody waiting, so it is only made for them.
    sleepers: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl SoftCq {
    fn push(&self, wc: Wc) {
        let mut q = lock(&self.q);
        q.push_back(wc);
        let sleepers = self.sleepers.load(Ordering::Relaxed);
        drop(q);
        if sleepers > 0 {
            self.cv.notify_all();
        }
        self.notify.notify_waiters();
    }
}

impl CompletionQueue for SoftCq {
    fn poll(&self, max: usize) -> Vec<Wc> {
        let mut q = lock(&self.q);
        let n = max.min(q.len());
        q.drain(..n).collect()
    }

    fn wait_blocking(&self, timeout: Duration) -> bool {
        let q = lock(&self.q);
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        let (q, _) = self.cv.wait_timeout_while(q, timeout, |q| q.is_empty()).unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        !q.is_empty()
    }

    fn ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let mut n = std::pin::pin!(self.notify.notified());
                n.as_mut().enable();
                if !lock(&self.q).is_empty() {
                    return;
                }
                n.await;
            }
        })
    }
}

// ------------------------------------------------------------------------------------------
// Memory

/// A registered memory region; it owns its buffer, and dropping it deregisters.
#[derive(Debug)]
pub struct SoftMr {
    index: u32,
    key: AtomicU32,
    valid: AtomicBool,
    pd: u64,
    access: Access,
    addr: u64,
    len: usize,
    mem: Mutex<Storage>,
    rnic: Weak<RnicShared>,
}

/// A region's memory: owned (any access), or shared read-only bytes (no write access at all,
/// so nothing can place into them).
#[derive(Debug)]
enum Storage {
    Owned(Vec<u8>),
    Shared(bytes::Bytes),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned(v) => v,
            Self::Shared(b) => b,
        }
    }
}

impl Storage {
    fn writable(&mut self) -> &mut [u8] {
        match self {
            Self::Owned(v) => v,
            // Registered without write rights: the access checks never get here.
            Self::Shared(_) => &mut [],
        }
    }
}

impl SoftMr {
    fn stag(&self) -> u32 {
        (self.index << 8) | self.key.load(Ordering::Acquire)
    }

    /// The buffer back (deregistering).
    pub fn into_inner(self: Arc<Self>) -> std::result::Result<Vec<u8>, Arc<Self>> {
        let mut m = Arc::try_unwrap(self)?;
        Ok(match std::mem::replace(m.mem.get_mut().unwrap_or_else(|e| e.into_inner()), Storage::Owned(Vec::new())) {
            Storage::Owned(v) => v,
            Storage::Shared(b) => b.to_vec(),
        })
    }

    /// Check an access of `len` bytes at virtual address `to` with STag `stag` from domain
    /// `pd` needing `need`; on failure, which check failed.
    fn check(&self, stag: u32, pd: u64, need: Access, to: u64, len: u64) -> std::result::Result<usize, Denied> {
        if stag != self.stag() || !self.valid.load(Ordering::Acquire) {
            return Err(Denied::Stag);
        }
        if pd != self.pd {
            return Err(Denied::Pd);
        }
        if !self.access.contains(need) {
            return Err(Denied::Access);
        }
        let end = to.checked_add(len).ok_or(Denied::Bounds)?;
        if to < self.addr || end > self.addr + self.len as u64 {
            return Err(Denied::Bounds);
        }
        Ok((to - self.addr) as usize)
    }

    /// Invalidate at the peer's request (a Send with Invalidate). Only a key the peer can have
    /// been given qualifies: the full current STag (index and key byte: a stale key of a
    /// re-keyed region must not revoke the new one) of a region of the stream's protection
    /// domain registered for remote access (a local-only region's key was never advertised;
    /// letting the peer revoke it would let it break our own receive and send buffers). A region
    /// already invalid may be invalidated again, as the verbs allow.
    fn invalidate_remote(&self, stag: u32, pd: u64) -> std::result::Result<(), Denied> {
        if stag != self.stag() {
            return Err(Denied::Stag);
        }
        if pd != self.pd {
            return Err(Denied::Pd);
        }
        if !self.access.intersects(Access::REMOTE_READ | Access::REMOTE_WRITE) {
            return Err(Denied::Access);
        }
        self.invalidate();
        Ok(())
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        if let Some(r) = self.rnic.upgrade() {
            let mut t = lock(&r.regions);
            if t.get(&self.index).is_some_and(|w| w.strong_count() == 0) {
                t.remove(&self.index);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Denied {
    Stag,
    Pd,
    Access,
    Bounds,
}

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.stag()
    }
    fn rkey(&self) -> u32 {
        self.stag()
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> Access {
        self.access
    }
    fn read(&self, f: &mut dyn FnMut(&[u8])) {
        f(&lock(&self.mem))
    }
    fn write(&self, f: &mut dyn FnMut(&mut [u8])) {
        f(lock(&self.mem).writable())
    }
    fn invalidate(&self) {
        self.valid.store(false, Ordering::Release);
    }
    fn rekey(&self) -> Result<u32> {
        let k = self.key.load(Ordering::Acquire);
        self.key.store(k.wrapping_add(1) & 0xff, Ordering::Release);
        self.valid.store(true, Ordering::Release);
        Ok(self.stag())
    }
    fn is_valid(&self) -> bool {
        self.valid.load(Ordering::Acquire)
    }
    fn into_buffer(self: Arc<Self>) -> std::result::Result<Vec<u8>, Arc<Self>> {
        self.into_inner()
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct SoftPd {
    id: u64,
    rnic: Arc<RnicShared>,
}

impl ProtectionDomain for SoftPd {
    type Mr = SoftMr;

    fn register(&self, buf: Vec<u8>, access: Access) -> Result<Arc<SoftMr>> {
        let addr = buf.as_ptr() as u64;
        // Read Responses are placed by this RNIC's own read bookkeeping (the sink's STag is
        // checked for local write), so a read sink needs no remote rights here.
        let access = if access.contains(Access::READ_SINK) { (access - Access::READ_SINK) | Access::LOCAL_WRITE } else { access };
        self.insert(Storage::Owned(buf), addr, access)
    }

    fn register_shared(&self, buf: bytes::Bytes, access: Access) -> Result<Arc<SoftMr>> {
        if access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::READ_SINK) {
            return Err(Error::Registration("shared (read-only) memory cannot be registered for writing".into()));
        }
        let addr = buf.as_ptr() as u64;
        self.insert(Storage::Shared(buf), addr, access)
    }
}

impl SoftPd {
    fn insert(&self, mem: Storage, addr: u64, access: Access) -> Result<Arc<SoftMr>> {
        let mut t = lock(&self.rnic.regions);
        if t.len() >= 0x00ff_fff0 {
            return Err(Error::Registration("no free STag index".into()));
        }
        let index = loop {
            let i = self.rnic.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
            if i != 0 && t.get(&i).is_none_or(|w| w.strong_count() == 0) {
                break i;
            }
        };
        let mr = Arc::new(SoftMr {
            index,
            key: AtomicU32::new(u32::from(rand::random::<u8>())),
            valid: AtomicBool::new(true),
            pd: self.id,
            access,
            addr,
            len: mem.len(),
            mem: Mutex::new(mem),
            rnic: Arc::downgrade(&self.rnic),
        });
        t.insert(index, Arc::downgrade(&mr));
        Ok(mr)
    }
}

// ------------------------------------------------------------------------------------------
// Queue pairs

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpState {
    Idle,
    Connected,
    /// A Terminate is on its way out; then Error.
    Terminating,
    Error,
}

/// An outstanding RDMA Read this side issued.
#[derive(Debug)]
struct PendingRead {
    wr_id: u64,
    signaled: bool,
    sink: Sge,
    size: u32,
    received: u32,
    /// The ready-to-receive zero-length Read: no completion.
    internal: bool,
}

/// Work for the transmitter.
#[derive(Debug)]
enum TxItem {
    Wr(SendWr),
    /// The unsent tail of a request begun inline by its poster (see `SoftQp::post_inline`).
    Rest {
        bytes: Vec<u8>,
        wr: SendWr,
        /// Its completion's byte count once sent; None for a read (its response completes it).
        len: Option<u32>,
    },
    /// Answer a validated Read Request (`src` is None for zero-length reads).
    ReadResponse {
        req: ReadRequest,
        src: Option<Arc<SoftMr>>,
    },
    /// Zero-length RDMA Write as the ready-to-receive message.
    RtrWrite,
    Terminate(TerminateMsg),
    Stop,
}

/// A writer that never blocks: it sends what the socket takes at once and keeps the rest
/// (and everything after it, in order) in `rest` for the transmitter. It never fails either: a
/// broken socket leaves everything to the transmitter, which meets the error.
struct Unblocked<'a> {
    sock: socket2::SockRef<'a>,
    rest: Vec<u8>,
}

impl Write for Unblocked<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut sent = 0;
        while self.rest.is_empty() {
            match self.sock.send_vectored_with_flags(bufs, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
                Ok(n) => {
                    sent = n;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        // Keep whatever did not go out.
        let mut skip = sent;
        for b in bufs {
            let take = skip.min(b.len());
            skip -= take;
            self.rest.extend_from_slice(&b[take..]);
        }
        Ok(total)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How long a Terminate may take to leave before the stream closes without it. It is one small
/// FPDU, written as soon as the transmitter has finished the FPDU it is in, so it only waits
/// this long for a peer that reads nothing (which would not read the Terminate either); the
/// bound keeps such a peer from holding the stream, its threads and its memory open.
const TERMINATE_LINGER: Duration = Duration::from_secs(2);

/// Largest Send or RDMA Write a poster transmits inline (see `SoftQp::post_inline`).
const INLINE_MAX: u64 = 16 << 10;

/// The transmitter's queue, counting what it holds (queued or being sent): a poster may only
/// transmit inline while it holds nothing, or it would overtake.
#[derive(Clone, Debug)]
struct TxQueue {
    items: Sender<TxItem>,
    queued: Arc<AtomicUsize>,
}

impl TxQueue {
    fn send(&self, item: TxItem) -> std::result::Result<(), ()> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.items.send(item).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        })
    }
}

/// What writes to the stream: the transmitter thread, or a poster sending inline.
#[derive(Debug)]
struct Engine {
    w: TcpStream,
    tx: Tx,
}

#[derive(Debug)]
struct QpShared {
    rnic: Arc<RnicShared>,
    pd: u64,
    caps: QpCaps,
    send_cq: Arc<SoftCq>,
    recv_cq: Arc<SoftCq>,
    rq: Mutex<VecDeque<RecvWr>>,
    orq: Mutex<VecDeque<PendingRead>>,
    orq_cv: Condvar,
    state: Mutex<QpState>,
    state_cv: Condvar,
    closed: tokio::sync::Notify,
    tx: Mutex<Option<TxQueue>>,
    /// Items the transmitter holds (see [`TxQueue`]).
    queued: Arc<AtomicUsize>,
    /// The stream's writer and transmit state, taken per item by whoever transmits.
    engine: Mutex<Option<Engine>>,
    sock: Mutex<Option<TcpStream>>,
    established: Mutex<Option<Established>>,
    ird: AtomicU32,
    ord: AtomicU32,
    /// Inbound reads accepted but not yet answered.
    ird_in_use: AtomicU32,
    /// Responder side: nothing may be sent before the initiator's first FPDU (RFC 5044).
    may_send: Mutex<bool>,
    may_send_cv: Condvar,
    terminate_received: Mutex<Option<Term>>,
    terminate_sent: Mutex<Option<Term>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Active side: where [`Provider::connect`] connects to.
    dest: Mutex<Option<SocketAddr>>,
}

/// A queue pair of the software RNIC.
#[derive(Debug)]
pub struct SoftQp {
    s: Arc<QpShared>,
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.s.fail();
        if self.s.state() == QpState::Terminating {
            // A Terminate still on its way gets its chance to leave: the engines finish on
            // their own (at the latest at TERMINATE_LINGER), not on the dropping thread.
            return;
        }
        let threads = std::mem::take(&mut *lock(&self.s.threads));
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

impl SoftQp {
    fn new(rnic: &Arc<RnicShared>, pd: &SoftPd, send_cq: &Arc<SoftCq>, recv_cq: &Arc<SoftCq>, caps: QpCaps) -> Result<Arc<Self>> {
        if !Arc::ptr_eq(rnic, &pd.rnic) {
            return Err(Error::Invalid("protection domain of another device".into()));
        }
        Ok(Arc::new(Self {
            s: Arc::new(QpShared {
                rnic: rnic.clone(),
                pd: pd.id,
                caps,
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                rq: Mutex::new(VecDeque::new()),
                orq: Mutex::new(VecDeque::new()),
                orq_cv: Condvar::new(),
                state: Mutex::new(QpState::Idle),
                state_cv: Condvar::new(),
                closed: tokio::sync::Notify::new(),
                tx: Mutex::new(None),
                queued: Arc::new(AtomicUsize::new(0)),
                engine: Mutex::new(None),
                sock: Mutex::new(None),
                established: Mutex::new(None),
                ird: AtomicU32::new(0),
                ord: AtomicU32::new(0),
                ird_in_use: AtomicU32::new(0),
                may_send: Mutex::new(true),
                may_send_cv: Condvar::new(),
                terminate_received: Mutex::new(None),
                terminate_sent: Mutex::new(None),
                threads: Mutex::new(Vec::new()),
                dest: Mutex::new(None),
            }),
        }))
    }

    /// The Terminate the peer sent, if the connection ended with one.
    pub fn terminate_received(&self) -> Option<Term> {
        *lock(&self.s.terminate_received)
    }

    /// The Terminate this side sent, if it ended the connection with one.
    pub fn terminate_sent(&self) -> Option<Term> {
        *lock(&self.s.terminate_sent)
    }

    /// Transmit a small Send or RDMA Write on the caller's thread when the transmitter is idle
    /// (a doorbell without a thread hand-off). The message is framed under the engine lock and
    /// written without blocking; what the socket does not take at once goes to the transmitter
    /// as the next item, so the stream stays in order and a peer that stops reading can stall
    /// only the transmitter, never the caller. False: not taken, queue it.
    fn post_inline(&self, wr: &SendWr) -> bool {
        // A Read Request is small whatever it reads; the data is placed by the receiver.
        let read = matches!(wr.op, SendOp::RdmaRead { .. });
        let small = read || wr.sg_list.iter().map(|e| u64::from(e.length)).sum::<u64>() <= INLINE_MAX;
        if !small || !*lock(&self.s.may_send) {
            return false;
        }
        let Ok(mut engine) = self.s.engine.try_lock() else { return false };
        let Some(Engine { w, tx }) = engine.as_mut() else { return false };
        if self.s.queued.load(Ordering::Acquire) != 0 {
            return false;
        }
        // A read beyond the ORD waits in the transmitter, never here. Only the engine's holder
        // adds to the outbound read queue, so room seen now is still there below.
        if read && lock(&self.s.orq).len() >= self.s.ord.load(Ordering::Acquire) as usize {
            return false;
        }
        // Written straight from the region without blocking; only what the socket refuses is
        // copied, to be sent by the transmitter. Local errors (a bad key…) take the
        // transmitter's path; nothing was written then. A read is completed by the receiver
        // when its response arrives.
        let mut out = Unblocked { sock: socket2::SockRef::from(&*w), rest: Vec::new() };
        // Never stopped half-way: what the socket refused is owed to the stream.
        let len = match tx.work_request(&self.s, &mut out, wr, &|| false) {
            TxOutcome::Done(n) => Some(n),
            TxOutcome::Pending => None,
            TxOutcome::LocalError(_) | TxOutcome::Io(_) => return false,
        };
        if out.rest.is_empty() {
            if let Some(n) = len {
                self.s.complete_send(wr, WcStatus::Success, n);
            }
            return true;
        }
        let rest = TxItem::Rest { bytes: out.rest, wr: wr.clone(), len };
        if lock(&self.s.tx).as_ref().is_none_or(|q| q.send(rest).is_err()) {
            // Part of an FPDU went out and the rest cannot follow: the stream is unusable (a
            // read already queued is flushed by the failure).
            drop(engine);
            if len.is_some() {
                self.s.complete_send(wr, WcStatus::WrFlushErr, 0);
            }
            self.s.fail();
        }
        true
    }

    /// Start the engines on an established stream.
    fn start(&self, stream: TcpStream, crc: bool, responder: bool, est: Established, rtr_write: bool) -> Result<()> {
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(None)?;
        stream.set_nodelay(true)?;
        let rx_stream = stream.try_clone()?;
        let tx_stream = stream.try_clone()?;
        self.s.ird.store(u32::from(est.ird), Ordering::Release);
        self.s.ord.store(u32::from(est.ord), Ordering::Release);
        *lock(&self.s.established) = Some(est);
        *lock(&self.s.sock) = Some(stream);
        *lock(&self.s.may_send) = !responder;
        let (items, rxq) = channel();
        let txq = TxQueue { items, queued: self.s.queued.clone() };
        if rtr_write {
            let _ = txq.send(TxItem::RtrWrite);
        }
        let max_segment = self.s.rnic.config.max_segment.clamp(4, 65516) & !3;
        *lock(&self.s.engine) = Some(Engine { w: tx_stream, tx: Tx { crc, max_segment, msn_send: 0, msn_read: 0 } });
        *lock(&self.s.tx) = Some(txq.clone());
        *lock(&self.s.state) = QpState::Connected;
        let s = self.s.clone();
        let tx = std::thread::Builder::new().name("iwarp-tx".into()).spawn(move || transmit(&s, rxq)).map_err(Error::Io)?;
        let s = self.s.clone();
        let rx = std::thread::Builder::new()
            .name("iwarp-rx".into())
            .spawn(move || receive(&s, RxStream::new(rx_stream), crc, &txq))
            .map_err(Error::Io)?;
        lock(&self.s.threads).extend([tx, rx]);
        Ok(())
    }
}

impl QpShared {
    fn state(&self) -> QpState {
        *lock(&self.state)
    }

    /// Leave the connected state without a Terminate: close the socket and flush every
    /// outstanding request.
    ///
    /// Once a Terminate is on its way (`Terminating`) this changes nothing (whether it comes
    /// from a disconnect, the queue pair dropped, or the receiver or transmitter meeting an
    /// error): the stream closes right after the Terminate was written, or at
    /// [`TERMINATE_LINGER`] if it cannot be, never before, so the peer learns why it ended.
    fn fail(&self) {
        self.close_when(|st| matches!(st, QpState::Idle | QpState::Connected));
    }

    /// Leave the connected state with a Terminate: it goes out through the transmitter, which
    /// then closes the stream (see [`QpShared::fail`]). `failed` completes the request the
    /// error ended (with its error status) once no disconnect can overtake the Terminate any
    /// more, and before anything is flushed, so completions stay in order.
    fn terminate(self: &Arc<Self>, t: TerminateMsg, failed: impl FnOnce()) {
        let connected = {
            let mut st = lock(&self.state);
            let connected = *st == QpState::Connected;
            if connected {
                *st = QpState::Terminating;
                *lock(&self.terminate_sent) = Some(t.term);
            }
            connected
        };
        failed();
        if !connected {
            // Nothing to terminate (never connected, or already ending).
            self.fail();
            return;
        }
        let queued = lock(&self.tx).as_ref().is_some_and(|tx| tx.send(TxItem::Terminate(t)).is_ok());
        if !queued {
            self.close();
            return;
        }
        // Whatever holds the transmitter back must let it reach the Terminate: a responder
        // still waiting for the first FPDU, or a Read Request waiting for ORD room (woken
        // under the queue's lock so the waiter cannot miss the state change).
        self.may_send_release();
        drop(lock(&self.orq));
        self.orq_cv.notify_all();
        // A transmitter stuck in a write to a peer that reads nothing would hold the stream
        // open for ever: close at the deadline whatever happened to the Terminate.
        let s = self.clone();
        let watchdog = std::thread::Builder::new().name("iwarp-term".into()).spawn(move || {
            let st = lock(&s.state);
            let (st, _) =
                s.state_cv.wait_timeout_while(st, TERMINATE_LINGER, |st| *st != QpState::Error).unwrap_or_else(|e| e.into_inner());
            if *st != QpState::Error {
                drop(st);
                debug!("iwarp: the Terminate did not leave within {TERMINATE_LINGER:?}: closing the stream");
                s.close();
            }
        });
        match watchdog {
            Ok(t) => lock(&self.threads).push(t),
            Err(e) => {
                warn!("iwarp: no thread for the Terminate deadline ({e}): closing the stream");
                self.close();
            }
        }
    }

    /// Close the stream now, Terminate or not.
    fn close(&self) {
        self.close_when(|st| st != QpState::Error);
    }

    /// Close the stream and flush every outstanding request (the one place that does) if the
    /// state allows it (checked and changed under one lock).
    fn close_when(&self, allowed: impl Fn(QpState) -> bool) {
        {
            let mut st = lock(&self.state);
            if !allowed(*st) {
                return;
            }
            *st = QpState::Error;
        }
        self.state_cv.notify_all();
        if let Some(s) = lock(&self.sock).as_ref() {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(tx) = lock(&self.tx).take() {
            let _ = tx.send(TxItem::Stop);
        }
        self.may_send_release();
        self.flush_receives();
        self.flush_reads(None);
        self.closed.notify_waiters();
    }

    fn may_send_release(&self) {
        *lock(&self.may_send) = true;
        self.may_send_cv.notify_all();
    }

    fn flush_receives(&self) {
        let rq: Vec<RecvWr> = lock(&self.rq).drain(..).collect();
        for wr in rq {
            self.recv_cq.push(wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0));
        }
    }

    /// Complete outstanding reads: the oldest with `head_status` (the read a Terminate was
    /// about), the rest flushed.
    fn flush_reads(&self, head_status: Option<WcStatus>) {
        let reads: Vec<PendingRead> = lock(&self.orq).drain(..).collect();
        self.orq_cv.notify_all();
        for (i, r) in reads.into_iter().enumerate() {
            if r.internal {
                continue;
            }
            let status = if i == 0 { head_status.unwrap_or(WcStatus::WrFlushErr) } else { WcStatus::WrFlushErr };
            self.send_cq.push(wc(r.wr_id, status, WcOpcode::RdmaRead, 0));
        }
    }

    fn complete_send(&self, wr: &SendWr, status: WcStatus, byte_len: u32) {
        if status != WcStatus::Success || wr.signaled {
            let opcode = match wr.op {
                SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
                SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
                _ => WcOpcode::Send,
            };
            self.send_cq.push(wc(wr.wr_id, status, opcode, byte_len));
        }
    }

    /// Resolve a local element for an access needing `need`.
    fn local(&self, sge: &Sge, need: Access) -> Option<(Arc<SoftMr>, usize)> {
        let mr = self.rnic.lookup(sge.lkey)?;
        let off = mr.check(sge.lkey, self.pd, need, sge.addr, u64::from(sge.length)).ok()?;
        Some((mr, off))
    }
}

impl QueuePair for SoftQp {
    fn post_send(&self, wr: SendWr) -> Result<()> {
        if wr.sg_list.len() > self.s.caps.max_sge as usize {
            return Err(Error::Invalid(format!("{} scatter/gather elements (at most {})", wr.sg_list.len(), self.s.caps.max_sge)));
        }
        if matches!(wr.op, SendOp::RdmaRead { .. }) && wr.sg_list.len() != 1 {
            return Err(Error::Invalid("an RDMA Read takes exactly one sink element".into()));
        }
        match self.s.state() {
            QpState::Idle => return Err(Error::NotConnected),
            QpState::Connected => {
                if self.post_inline(&wr) {
                    return Ok(());
                }
                if let Some(tx) = lock(&self.s.tx).as_ref()
                    && tx.send(TxItem::Wr(wr.clone())).is_ok()
                {
                    return Ok(());
                }
            }
            QpState::Terminating | QpState::Error => {}
        }
        self.s.complete_send(&wr, WcStatus::WrFlushErr, 0);
        Ok(())
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sg_list.len() > self.s.caps.max_sge as usize {
            return Err(Error::Invalid(format!("{} scatter/gather elements (at most {})", wr.sg_list.len(), self.s.caps.max_sge)));
        }
        let mut rq = lock(&self.s.rq);
        if rq.len() >= self.s.caps.max_recv_wr as usize {
            return Err(Error::Invalid("receive queue full".into()));
        }
        match self.s.state() {
            QpState::Terminating | QpState::Error => {
                drop(rq);
                self.s.recv_cq.push(wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0));
            }
            _ => rq.push_back(wr),
        }
        Ok(())
    }

    fn disconnect(&self) {
        self.s.fail();
    }

    fn is_connected(&self) -> bool {
        self.s.state() == QpState::Connected
    }

    fn disconnected(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let mut n = std::pin::pin!(self.s.closed.notified());
                n.as_mut().enable();
                if matches!(self.s.state(), QpState::Error) {
                    return;
                }
                n.await;
            }
        })
    }

    fn established(&self) -> Option<Established> {
        lock(&self.s.established).clone()
    }
}

// ------------------------------------------------------------------------------------------
// Transmit

/// Write all of `bufs` (std's write_all_vectored is unstable).
fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One FPDU: header (after the length field), payload pieces, then pad and CRC.
fn send_fpdu(w: &mut impl Write, crc: bool, header: &[u8], payload: &[&[u8]]) -> io::Result<()> {
    let plen: usize = payload.iter().map(|p| p.len()).sum();
    let mpa_len = header.len() + plen;
    let mut head = [0u8; 2 + UNTAGGED_HDR + READ_REQUEST_LEN + 8];
    head[..2].copy_from_slice(&(mpa_len as u16).to_be_bytes());
    head[2..2 + header.len()].copy_from_slice(header);
    let head = &head[..2 + header.len()];
    let pad = [0u8; 3];
    let pad = &pad[..wire::fpdu_pad(mpa_len)];
    let sum = if crc {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(payload.len() + 2);
        parts.push(head);
        parts.extend_from_slice(payload);
        parts.push(pad);
        wire::fpdu_crc(&parts)
    } else {
        [0; 4]
    };
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(payload.len() + 3);
    slices.push(IoSlice::new(head));
    slices.extend(payload.iter().map(|p| IoSlice::new(p)));
    slices.push(IoSlice::new(pad));
    slices.push(IoSlice::new(&sum));
    write_all_vectored(w, &mut slices)
}

/// Send one item of the transmit queue.
fn transmit_item(s: &Arc<QpShared>, w: &mut TcpStream, tx: &mut Tx, item: TxItem) {
    let state = s.state();
    match item {
        TxItem::Stop => {}
        TxItem::Terminate(t) => {
            let h = Header::Untagged { op: Opcode::Terminate, last: true, inv_stag: 0, qn: QN_TERMINATE, msn: 1, mo: 0 };
            let mut hb = [0u8; UNTAGGED_HDR];
            h.emit(&mut hb);
            let body = t.emit();
            let _ = send_fpdu(w, tx.crc, &hb, &[&body]);
            let _ = w.flush();
            // Only now, with the Terminate handed to TCP ahead of the FIN, may the stream close.
            s.close();
        }
        TxItem::Wr(_) if state != QpState::Connected => flush_item(s, item),
        // The tail of an FPDU begun inline is written even when a Terminate follows it, or the
        // Terminate would land inside that FPDU and the peer could not parse it.
        TxItem::Rest { .. } if state == QpState::Error => flush_item(s, item),
        TxItem::Rest { bytes, wr, len } => match w.write_all(&bytes) {
            Ok(()) => {
                if let Some(n) = len {
                    s.complete_send(&wr, WcStatus::Success, n);
                }
            }
            Err(e) => {
                debug!("iwarp transmit: {e}");
                if len.is_some() {
                    s.complete_send(&wr, WcStatus::WrFlushErr, 0);
                }
                s.fail();
            }
        },
        TxItem::Wr(wr) => match tx.work_request(s, w, &wr, &|| s.state() != QpState::Connected) {
            TxOutcome::Done(n) => s.complete_send(&wr, WcStatus::Success, n),
            TxOutcome::Pending => {}
            TxOutcome::LocalError(st) => {
                // A local protection error moves the queue pair to the error state.
                s.terminate(terminate_for(Term::RDMAP_CATASTROPHIC), || s.complete_send(&wr, st, 0));
            }
            TxOutcome::Io(e) => {
                debug!("iwarp transmit: {e}");
                s.complete_send(&wr, WcStatus::WrFlushErr, 0);
                s.fail();
            }
        },
        TxItem::ReadResponse { .. } | TxItem::RtrWrite if state != QpState::Connected => {}
        TxItem::ReadResponse { req, src } => {
            let mut freed = false;
            let r = tx.read_response(
                w,
                &req,
                src.as_ref(),
                &mut || {
                    freed = true;
                    s.ird_in_use.fetch_sub(1, Ordering::AcqRel);
                },
                &|| s.state() != QpState::Connected,
            );
            if !freed {
                s.ird_in_use.fetch_sub(1, Ordering::AcqRel);
            }
            if let Err(e) = r {
                debug!("iwarp transmit: {e}");
                s.fail();
            }
        }
        TxItem::RtrWrite => {
            let mut hb = [0u8; 14];
            Header::Tagged { op: Opcode::Write, last: true, stag: 1, to: 0 }.emit(&mut hb);
            if send_fpdu(w, tx.crc, &hb, &[]).is_err() {
                s.fail();
            }
        }
    }
}

/// Why a message was abandoned between FPDUs.
fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the stream is being terminated")
}

/// Transmit state: per-queue MSNs.
#[derive(Debug)]
struct Tx {
    crc: bool,
    max_segment: usize,
    msn_send: u32,
    msn_read: u32,
}

enum TxOutcome {
    Done(u32),
    /// An RDMA Read is on its way; the receiver completes it.
    Pending,
    LocalError(WcStatus),
    Io(io::Error),
}

fn transmit(s: &Arc<QpShared>, items: Receiver<TxItem>) {
    while let Ok(item) = items.recv() {
        // The responder waits for the initiator's first FPDU before sending anything.
        {
            let g = lock(&s.may_send);
            drop(s.may_send_cv.wait_while(g, |ok| !*ok).unwrap_or_else(|e| e.into_inner()));
        }
        let stop = matches!(item, TxItem::Stop);
        {
            let mut engine = lock(&s.engine);
            if let Some(Engine { w, tx }) = engine.as_mut() {
                transmit_item(s, w, tx, item);
            } else {
                flush_item(s, item);
            }
            // Counted down under the engine lock: a poster seeing zero may write inline.
            s.queued.fetch_sub(1, Ordering::AcqRel);
        }
        if stop {
            break;
        }
    }
    // Whatever is still queued is flushed.
    while let Ok(item) = items.try_recv() {
        s.queued.fetch_sub(1, Ordering::AcqRel);
        flush_item(s, item);
    }
}

/// A request the transmitter will not send completes as flushed; the tail of a read begun
/// inline does not (the read is in the outbound read queue, flushed with it).
fn flush_item(s: &QpShared, item: TxItem) {
    match item {
        TxItem::Wr(wr) | TxItem::Rest { wr, len: Some(_), .. } => s.complete_send(&wr, WcStatus::WrFlushErr, 0),
        _ => {}
    }
}

impl Tx {
    /// Transmit one work request. `stop` is asked between FPDUs: true ends the message there
    /// (a Terminate is waiting; the transmitter's work is flushed anyway).
    fn work_request(&mut self, s: &QpShared, w: &mut impl Write, wr: &SendWr, stop: &dyn Fn() -> bool) -> TxOutcome {
        let need = if matches!(wr.op, SendOp::RdmaRead { .. }) { Access::LOCAL_WRITE } else { Access::empty() };
        let mut sources = Vec::with_capacity(wr.sg_list.len());
        for sge in &wr.sg_list {
            match s.local(sge, need) {
                Some((mr, off)) => sources.push((mr, off, sge.length as usize)),
                None => return TxOutcome::LocalError(WcStatus::LocalProtErr),
            }
        }
        let total: usize = sources.iter().map(|(_, _, n)| n).sum();
        if total > u32::MAX as usize {
            return TxOutcome::LocalError(WcStatus::LocalLengthErr);
        }
        let r = match wr.op {
            SendOp::RdmaRead { remote_addr, rkey } => {
                // The sink was checked; the receiver resolves it again per Read Response. Holding
                // it here would outlive the completion (the consumer may reclaim the region then).
                drop(sources);
                return self.read_request(s, w, wr, remote_addr, rkey);
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                let header = |off: u64, last| Header::Tagged { op: Opcode::Write, last, stag: rkey, to: remote_addr.wrapping_add(off) };
                self.stream_out(w, &sources, header, &mut || {}, stop)
            }
            op => {
                let (op, inv) = match op {
                    SendOp::SendWithInvalidate { rkey } => (Opcode::SendInvalidate, rkey),
                    SendOp::SendWithSolicitedEvent => (Opcode::SendSe, 0),
                    SendOp::SendWithSolicitedEventInvalidate { rkey } => (Opcode::SendSeInvalidate, rkey),
                    _ => (Opcode::Send, 0),
                };
                self.msn_send = self.msn_send.wrapping_add(1);
                let msn = self.msn_send;
                self.stream_out(
                    w,
                    &sources,
                    |off, last| Header::Untagged { op, last, inv_stag: inv, qn: QN_SEND, msn, mo: off as u32 },
                    &mut || {},
                    stop,
                )
            }
        };
        match r {
            Ok(()) => TxOutcome::Done(total as u32),
            Err(e) => TxOutcome::Io(e),
        }
    }

    /// Send the gathered `sources` as one DDP message, segment by segment; `before_last` runs
    /// just before the final segment goes out; `stop` true between segments abandons the rest.
    fn stream_out(
        &self,
        w: &mut impl Write,
        sources: &[(Arc<SoftMr>, usize, usize)],
        header: impl Fn(u64, bool) -> Header,
        before_last: &mut dyn FnMut(),
        stop: &dyn Fn() -> bool,
    ) -> io::Result<()> {
        let total: usize = sources.iter().map(|(_, _, n)| n).sum();
        let mut hb = [0u8; UNTAGGED_HDR];
        if total == 0 {
            before_last();
            let n = header(0, true).emit(&mut hb);
            return send_fpdu(w, self.crc, &hb[..n], &[]);
        }
        if let [(mr, off, len)] = sources {
            return self.stream_region(w, &lock(&mr.mem)[*off..*off + *len], header, before_last, stop);
        }
        let (mut sent, mut i, mut within) = (0usize, 0usize, 0usize);
        let mut staging = Vec::new();
        while sent < total {
            if stop() {
                return Err(stopped());
            }
            let seg = (total - sent).min(self.max_segment);
            let last = sent + seg == total;
            if last {
                before_last();
            }
            let n = header(sent as u64, last).emit(&mut hb);
            // Skip empty elements.
            while sources[i].2 == within {
                i += 1;
                within = 0;
            }
            let (mr, off, len) = &sources[i];
            if len - within >= seg {
                // One element holds the whole segment: write it straight from the region.
                let mem = lock(&mr.mem);
                send_fpdu(w, self.crc, &hb[..n], &[&mem[off + within..off + within + seg]])?;
                within += seg;
            } else {
                // The segment spans elements: gather it (one region lock at a time).
                staging.clear();
                let mut need = seg;
                while need > 0 {
                    let (mr, off, len) = &sources[i];
                    let take = (len - within).min(need);
                    staging.extend_from_slice(&lock(&mr.mem)[off + within..off + within + take]);
                    need -= take;
                    within += take;
                    if within == *len && need > 0 {
                        i += 1;
                        within = 0;
                    }
                }
                send_fpdu(w, self.crc, &hb[..n], &[&staging])?;
            }
            sent += seg;
        }
        Ok(())
    }

    /// Send `data` (one contiguous piece of a region) as one DDP message: up to 16 FPDUs per
    /// vectored write, payload straight from the region; `stop` is asked before each write.
    fn stream_region(
        &self,
        w: &mut impl Write,
        data: &[u8],
        header: impl Fn(u64, bool) -> Header,
        before_last: &mut dyn FnMut(),
        stop: &dyn Fn() -> bool,
    ) -> io::Result<()> {
        const BATCH: usize = 16;
        let total = data.len();
        let mut sent = 0usize;
        let mut heads = [[0u8; 2 + UNTAGGED_HDR]; BATCH];
        let mut tails = [[0u8; 7]; BATCH];
        while sent < total {
            // Between writes the stream is at an FPDU boundary: the only place to stop.
            if stop() {
                return Err(stopped());
            }
            let mut frames = [(0usize, 0usize, 0usize, 0usize); BATCH];
            let mut n = 0;
            let mut at = sent;
            while n < BATCH && at < total {
                let seg = (total - at).min(self.max_segment);
                let last = at + seg == total;
                if last {
                    before_last();
                }
                let hl = header(at as u64, last).emit(&mut heads[n][2..]);
                let mpa_len = hl + seg;
                heads[n][..2].copy_from_slice(&(mpa_len as u16).to_be_bytes());
                let pad = wire::fpdu_pad(mpa_len);
                tails[n][..pad].fill(0);
                let sum = if self.crc { wire::fpdu_crc(&[&heads[n][..2 + hl], &data[at..at + seg], &tails[n][..pad]]) } else { [0; 4] };
                tails[n][pad..pad + 4].copy_from_slice(&sum);
                frames[n] = (2 + hl, at, seg, pad + 4);
                at += seg;
                n += 1;
            }
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(3 * n);
            for (k, &(hl, off, seg, tl)) in frames[..n].iter().enumerate() {
                slices.push(IoSlice::new(&heads[k][..hl]));
                slices.push(IoSlice::new(&data[off..off + seg]));
                slices.push(IoSlice::new(&tails[k][..tl]));
            }
            write_all_vectored(w, &mut slices)?;
            sent = at;
        }
        Ok(())
    }

    fn read_request(&mut self, s: &QpShared, w: &mut impl Write, wr: &SendWr, remote_addr: u64, rkey: u32) -> TxOutcome {
        let sink = wr.sg_list[0];
        {
            // At most ORD reads outstanding: later work waits (in order) for a response.
            let orq = lock(&s.orq);
            let ord = s.ord.load(Ordering::Acquire) as usize;
            if ord == 0 {
                return TxOutcome::LocalError(WcStatus::LocalProtErr);
            }
            let mut orq =
                s.orq_cv.wait_while(orq, |q| q.len() >= ord && s.state() == QpState::Connected).unwrap_or_else(|e| e.into_inner());
            if s.state() != QpState::Connected {
                return TxOutcome::Io(io::ErrorKind::NotConnected.into());
            }
            orq.push_back(PendingRead { wr_id: wr.wr_id, signaled: wr.signaled, sink, size: sink.length, received: 0, internal: false });
        }
        self.msn_read = self.msn_read.wrapping_add(1);
        let rr = ReadRequest { sink_stag: sink.lkey, sink_to: sink.addr, size: sink.length, src_stag: rkey, src_to: remote_addr };
        let mut hb = [0u8; UNTAGGED_HDR + READ_REQUEST_LEN];
        Header::Untagged { op: Opcode::ReadRequest, last: true, inv_stag: 0, qn: QN_READ, msn: self.msn_read, mo: 0 }.emit(&mut hb);
        hb[UNTAGGED_HDR..].copy_from_slice(&rr.emit());
        match send_fpdu(w, self.crc, &hb, &[]) {
            // Completed by the receiver when the last Read Response segment arrives.
            Ok(()) => TxOutcome::Pending,
            Err(e) => TxOutcome::Io(e),
        }
    }

    /// Answer a Read Request. The IRD slot frees (`done`) just before the last segment leaves:
    /// the requester can issue its next read only after receiving it. `stop` as for
    /// [`Tx::work_request`].
    fn read_response(
        &self,
        w: &mut impl Write,
        req: &ReadRequest,
        src: Option<&Arc<SoftMr>>,
        done: &mut dyn FnMut(),
        stop: &dyn Fn() -> bool,
    ) -> io::Result<()> {
        let header =
            |off: u64, last| Header::Tagged { op: Opcode::ReadResponse, last, stag: req.sink_stag, to: req.sink_to.wrapping_add(off) };
        match src {
            None => {
                done();
                let mut hb = [0u8; 14];
                header(0, true).emit(&mut hb);
                send_fpdu(w, self.crc, &hb, &[])
            }
            Some(mr) => {
                let off = (req.src_to - mr.addr) as usize;
                self.stream_out(w, &[(mr.clone(), off, req.size as usize)], header, done, stop)
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Receive

/// The receive side of the socket. Each read fills the caller's destination first (a region's
/// memory, for payload) and spills what follows (the FPDU's pad and CRC, the next headers) into
/// a small buffer, so one system call per FPDU suffices and payload never passes through an
/// intermediate buffer beyond the few bytes that shared a read with a header.
struct RxStream<R> {
    inner: R,
    buf: Box<[u8; 512]>,
    start: usize,
    end: usize,
}

impl<R: Read> RxStream<R> {
    fn new(inner: R) -> Self {
        Self { inner, buf: Box::new([0; 512]), start: 0, end: 0 }
    }
}

impl<R: Read> Read for RxStream<R> {
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        if self.start < self.end {
            let n = dst.len().min(self.end - self.start);
            dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.start += n;
            return Ok(n);
        }
        let mut iov = [IoSliceMut::new(dst), IoSliceMut::new(&mut self.buf[..])];
        let got = self.inner.read_vectored(&mut iov)?;
        let direct = got.min(iov[0].len());
        (self.start, self.end) = (0, got - direct);
        Ok(direct)
    }
}

/// A Send being received across segments.
struct InboundSend {
    wr: RecvWr,
    msn: u32,
    received: u32,
    capacity: u64,
}

/// Receive state: what each queue expects next.
struct Rx {
    crc: bool,
    msn_send: u32,
    msn_read: u32,
    send: Option<InboundSend>,
    /// A tagged message in progress: (STag, next TO).
    tagged: Option<(u32, u64)>,
    first_seen: bool,
    /// The completion of a receive a violation ended (when not the one in `send`): pushed once
    /// the stream is terminating.
    failed: Option<Wc>,
}

enum RxError {
    /// The stream ended or broke.
    Closed,
    /// Protocol or access violation: send this Terminate.
    Term(Term, &'static str),
}

impl From<io::Error> for RxError {
    fn from(_: io::Error) -> Self {
        Self::Closed
    }
}

fn terminate_for(term: Term) -> TerminateMsg {
    TerminateMsg { term, segment_len: None, ddp_header: false, rdmap_header: false, attached: vec![] }
}

fn receive<R: Read>(s: &Arc<QpShared>, mut r: R, crc: bool, tx: &TxQueue) {
    let mut rx = Rx { crc, msn_send: 1, msn_read: 1, send: None, tagged: None, first_seen: false, failed: None };
    loop {
        match rx.fpdu(s, &mut r, tx) {
            Ok(()) => {
                if !rx.first_seen {
                    rx.first_seen = true;
                    s.may_send_release();
                }
            }
            Err(RxError::Closed) => {
                s.fail();
                break;
            }
            Err(RxError::Term(t, why)) => {
                debug!("iwarp receive: {why}: sending Terminate {t}");
                // The receive the violation ended completes only once the stream is
                // terminating: a disconnect in answer to that completion must not close the
                // stream ahead of the Terminate.
                let failed = rx.failed.take().or_else(|| {
                    rx.send.take().map(|inb| {
                        let status = if t == Term::DDP_UNTAGGED_NO_BUFFER { WcStatus::LocalLengthErr } else { WcStatus::LocalProtErr };
                        wc(inb.wr.wr_id, status, WcOpcode::Recv, 0)
                    })
                });
                s.terminate(terminate_for(t), || {
                    if let Some(failed) = failed {
                        s.recv_cq.push(failed);
                    }
                });
                break;
            }
        }
    }
}

fn denied_tagged(d: Denied) -> Term {
    match d {
        Denied::Stag | Denied::Access => Term::DDP_TAGGED_INVALID_STAG,
        Denied::Pd => Term::DDP_TAGGED_PD,
        Denied::Bounds => Term::DDP_TAGGED_BOUNDS,
    }
}

fn denied_read(d: Denied) -> Term {
    match d {
        Denied::Stag => Term::RDMAP_INVALID_STAG,
        Denied::Pd => Term::RDMAP_PD,
        Denied::Access => Term::RDMAP_ACCESS,
        Denied::Bounds => Term::RDMAP_BOUNDS,
    }
}

/// Running CRC over an FPDU (nothing computed when the connection has CRC off).
struct Crc {
    on: bool,
    value: u32,
}

impl Crc {
    fn add(&mut self, b: &[u8]) {
        if self.on {
            self.value = crc32c::crc32c_append(self.value, b);
        }
    }
}

impl Rx {
    fn fpdu<R: Read>(&mut self, s: &QpShared, r: &mut R, tx: &TxQueue) -> std::result::Result<(), RxError> {
        let mut lenb = [0u8; 2];
        r.read_exact(&mut lenb)?;
        let mpa_len = usize::from(u16::from_be_bytes(lenb));
        let mut crc = Crc { on: self.crc, value: 0 };
        crc.add(&lenb);
        if mpa_len < 2 {
            return Err(RxError::Term(Term::MPA_FRAMING, "FPDU shorter than a DDP header"));
        }
        let mut hb = [0u8; UNTAGGED_HDR + READ_REQUEST_LEN];
        r.read_exact(&mut hb[..2])?;
        let tagged = hb[0] & 0x80 != 0;
        let base = if tagged { wire::TAGGED_HDR } else { UNTAGGED_HDR };
        if mpa_len < base {
            return Err(RxError::Term(Term::MPA_FRAMING, "FPDU shorter than its DDP header"));
        }
        r.read_exact(&mut hb[2..base])?;
        let h = Header::parse(&hb[..base]).map_err(|e| match e {
            wire::WireError::Violation(t, why) => RxError::Term(t, why),
            _ => RxError::Term(Term::MPA_FRAMING, "bad DDP header"),
        })?;
        let extra = match h.op() {
            Opcode::ReadRequest => READ_REQUEST_LEN,
            _ => 0,
        };
        if mpa_len < base + extra {
            return Err(RxError::Term(Term::MPA_FRAMING, "FPDU shorter than its RDMAP header"));
        }
        r.read_exact(&mut hb[base..base + extra])?;
        crc.add(&hb[..base + extra]);
        let payload = mpa_len - base - extra;
        let commit = self.segment(s, r, &h, &hb[base..base + extra], payload, &mut crc)?;
        // Pad and CRC.
        let mut tail = [0u8; 7];
        let pad = wire::fpdu_pad(mpa_len);
        r.read_exact(&mut tail[..pad + 4])?;
        crc.add(&tail[..pad]);
        if self.crc && crc.value.to_le_bytes() != tail[pad..pad + 4] {
            return Err(RxError::Term(Term::MPA_CRC, "FPDU CRC mismatch"));
        }
        self.commit(s, commit, tx)
    }

    /// Validate a segment and place its payload; what to do once its CRC checked out is returned.
    fn segment<R: Read>(
        &mut self,
        s: &QpShared,
        r: &mut R,
        h: &Header,
        body: &[u8],
        payload: usize,
        crc: &mut Crc,
    ) -> std::result::Result<Commit, RxError> {
        match *h {
            Header::Tagged { op: Opcode::Write, last, stag, to } => {
                if let Some((cur, next)) = self.tagged {
                    if cur != stag || next != to {
                        return Err(RxError::Term(Term::DDP_TAGGED_BOUNDS, "RDMA Write segment does not continue its message"));
                    }
                } else if payload == 0 {
                    // A zero-length Write (e.g. the peer-to-peer ready-to-receive) touches nothing.
                    return Ok(Commit::None);
                }
                let mr = s.rnic.lookup(stag).ok_or(RxError::Term(Term::DDP_TAGGED_INVALID_STAG, "RDMA Write to an unknown STag"))?;
                let off = mr
                    .check(stag, s.pd, Access::REMOTE_WRITE, to, payload as u64)
                    .map_err(|d| RxError::Term(denied_tagged(d), "RDMA Write refused"))?;
                place(r, &mr, off, payload, crc)?;
                self.tagged = if last { None } else { Some((stag, to + payload as u64)) };
                Ok(Commit::None)
            }
            Header::Tagged { op: Opcode::ReadResponse, last, stag, to } => {
                let (sink, received, size) = {
                    let orq = lock(&s.orq);
                    let head = orq.front().ok_or(RxError::Term(Term::DDP_CATASTROPHIC, "Read Response without an outstanding Read"))?;
                    (head.sink, head.received, head.size)
                };
                if stag != sink.lkey {
                    return Err(RxError::Term(Term::DDP_TAGGED_INVALID_STAG, "Read Response for another sink STag"));
                }
                if to != sink.addr.wrapping_add(u64::from(received)) || u64::from(received) + payload as u64 > u64::from(size) {
                    return Err(RxError::Term(Term::DDP_TAGGED_BOUNDS, "Read Response outside the requested range"));
                }
                if last && u64::from(received) + payload as u64 != u64::from(size) {
                    return Err(RxError::Term(Term::DDP_TAGGED_BOUNDS, "Read Response shorter than requested"));
                }
                if payload > 0 {
                    let part = Sge { addr: to, length: payload as u32, lkey: stag };
                    let (mr, off) = s
                        .local(&part, Access::LOCAL_WRITE)
                        .ok_or(RxError::Term(Term::DDP_TAGGED_INVALID_STAG, "Read sink no longer valid"))?;
                    place(r, &mr, off, payload, crc)?;
                }
                Ok(Commit::ReadProgress { bytes: payload as u32, last })
            }
            Header::Untagged { op, last, inv_stag, qn, msn, mo } if op.is_send() => {
                if qn != QN_SEND {
                    return Err(RxError::Term(Term::DDP_UNTAGGED_INVALID_QN, "Send on a queue other than 0"));
                }
                if self.send.is_none() {
                    let wr = lock(&s.rq).pop_front().ok_or(RxError::Term(Term::DDP_UNTAGGED_NO_BUFFER, "Send with no receive posted"))?;
                    let capacity = wr.sg_list.iter().map(|e| u64::from(e.length)).sum();
                    self.send = Some(InboundSend { wr, msn, received: 0, capacity });
                }
                let inb = self.send.as_mut().expect("set above");
                if msn != self.msn_send || inb.msn != msn {
                    return Err(RxError::Term(Term::DDP_UNTAGGED_BAD_MSN, "Send MSN out of sequence"));
                }
                if mo != inb.received {
                    return Err(RxError::Term(Term::DDP_UNTAGGED_BAD_MO, "Send MO does not follow the bytes received"));
                }
                if u64::from(inb.received) + payload as u64 > inb.capacity {
                    return Err(RxError::Term(Term::DDP_UNTAGGED_NO_BUFFER, "Send larger than the posted receive"));
                }
                // Scatter into the receive's elements.
                let mut at = u64::from(inb.received);
                let mut left = payload;
                for sge in &inb.wr.sg_list {
                    if left == 0 {
                        break;
                    }
                    let len = u64::from(sge.length);
                    if at >= len {
                        at -= len;
                        continue;
                    }
                    let take = ((len - at) as usize).min(left);
                    let part = Sge { addr: sge.addr + at, length: take as u32, lkey: sge.lkey };
                    let (mr, off) =
                        s.local(&part, Access::LOCAL_WRITE).ok_or(RxError::Term(Term::DDP_CATASTROPHIC, "receive buffer not usable"))?;
                    place(r, &mr, off, take, crc)?;
                    left -= take;
                    at = 0;
                }
                inb.received += payload as u32;
                Ok(if last { Commit::SendDone { op, inv_stag } } else { Commit::None })
            }
            Header::Untagged { op: Opcode::ReadRequest, qn, msn, mo, .. } => {
                if qn != QN_READ {
                    return Err(RxError::Term(Term::DDP_UNTAGGED_INVALID_QN, "Read Request on a queue other than 1"));
                }
                if msn != self.msn_read || mo != 0 {
                    return Err(RxError::Term(Term::DDP_UNTAGGED_BAD_MSN, "Read Request MSN out of sequence"));
                }
                if payload != 0 {
                    return Err(RxError::Term(Term::MPA_FRAMING, "Read Request with a payload"));
                }
                let req = ReadRequest::parse(body).map_err(|_| RxError::Term(Term::MPA_FRAMING, "short Read Request"))?;
                Ok(Commit::Read(req))
            }
            Header::Untagged { op: Opcode::Terminate, .. } => {
                let mut b = vec![0u8; payload];
                r.read_exact(&mut b)?;
                crc.add(&b);
                let t = TerminateMsg::parse(&b).map(|t| t.term).unwrap_or(Term::RDMAP_CATASTROPHIC);
                Ok(Commit::Terminated(t))
            }
            _ => Err(RxError::Term(Term::RDMAP_BAD_OPCODE, "unexpected opcode")),
        }
    }

    fn commit(&mut self, s: &QpShared, c: Commit, tx: &TxQueue) -> std::result::Result<(), RxError> {
        match c {
            Commit::None => Ok(()),
            Commit::ReadProgress { bytes, last } => {
                let done = {
                    let mut orq = lock(&s.orq);
                    let Some(head) = orq.front_mut() else { return Ok(()) };
                    head.received += bytes;
                    if last { orq.pop_front() } else { None }
                };
                if let Some(r) = done {
                    s.orq_cv.notify_all();
                    if r.signaled && !r.internal {
                        s.send_cq.push(wc(r.wr_id, WcStatus::Success, WcOpcode::RdmaRead, r.size));
                    }
                }
                Ok(())
            }
            Commit::SendDone { op, inv_stag } => {
                let inb = self.send.take().expect("a Send in progress");
                self.msn_send = self.msn_send.wrapping_add(1);
                let mut invalidated = None;
                if matches!(op, Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
                    let refused = match s.rnic.lookup(inv_stag) {
                        Some(mr) => mr.invalidate_remote(inv_stag, s.pd).err(),
                        None => Some(Denied::Stag),
                    };
                    if let Some(d) = refused {
                        // The RFC 5040 reaction: the STag stays as it was, the receive completes
                        // in error and the stream ends with a Terminate.
                        debug!(inv_stag, ?d, "iwarp: Send with Invalidate refused");
                        self.failed = Some(wc(inb.wr.wr_id, WcStatus::RemoteInvalidRequestErr, WcOpcode::Recv, inb.received));
                        return Err(RxError::Term(
                            Term::RDMAP_CANNOT_INVALIDATE,
                            "Send with Invalidate of an STag the peer may not invalidate",
                        ));
                    }
                    invalidated = Some(inv_stag);
                }
                s.recv_cq.push(Wc {
                    wr_id: inb.wr.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: inb.received,
                    invalidated_rkey: invalidated,
                    solicited: matches!(op, Opcode::SendSe | Opcode::SendSeInvalidate),
                });
                Ok(())
            }
            Commit::Read(req) => {
                self.msn_read = self.msn_read.wrapping_add(1);
                let ird = s.ird.load(Ordering::Acquire);
                if s.ird_in_use.load(Ordering::Acquire) >= ird {
                    return Err(RxError::Term(Term::RDMAP_IRD_EXCEEDED, "more Read Requests outstanding than IRD"));
                }
                let src = if req.size == 0 {
                    None
                } else {
                    let mr = s.rnic.lookup(req.src_stag).ok_or(RxError::Term(Term::RDMAP_INVALID_STAG, "RDMA Read of an unknown STag"))?;
                    mr.check(req.src_stag, s.pd, Access::REMOTE_READ, req.src_to, u64::from(req.size))
                        .map_err(|d| RxError::Term(denied_read(d), "RDMA Read refused"))?;
                    Some(mr)
                };
                s.ird_in_use.fetch_add(1, Ordering::AcqRel);
                tx.send(TxItem::ReadResponse { req, src }).map_err(|_| RxError::Closed)
            }
            Commit::Terminated(t) => {
                warn!("iwarp: peer terminated the connection: {t}");
                *lock(&s.terminate_received) = Some(t);
                let status = if t.is_protection() { WcStatus::RemoteAccessErr } else { WcStatus::RemoteOpErr };
                s.flush_reads(Some(status));
                Err(RxError::Closed)
            }
        }
    }
}

enum Commit {
    None,
    ReadProgress { bytes: u32, last: bool },
    SendDone { op: Opcode, inv_stag: u32 },
    Read(ReadRequest),
    Terminated(Term),
}

/// Read `len` payload bytes from the stream straight into `mr` at `off`.
fn place<R: Read>(r: &mut R, mr: &SoftMr, off: usize, len: usize, crc: &mut Crc) -> std::result::Result<(), RxError> {
    let mut mem = lock(&mr.mem);
    let Some(dst) = mem.writable().get_mut(off..off + len) else {
        return Err(RxError::Term(Term::DDP_CATASTROPHIC, "placement into read-only memory"));
    };
    r.read_exact(dst)?;
    crc.add(dst);
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Connection management (MPA)

fn setup_err(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Unreachable("MPA exchange not complete in time".into()),
        _ => Error::Io(e),
    }
}

/// The time left until `deadline`, or a timeout error once it passed.
fn left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() { Err(io::ErrorKind::TimedOut.into()) } else { Ok(left) }
}

/// Fill `buf` by `deadline`: one deadline for the whole exchange, not a timeout per read that
/// a peer sending a byte at a time could renew for ever.
fn read_exact_by(stream: &mut TcpStream, mut buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        stream.set_read_timeout(Some(left(deadline)?))?;
        match stream.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_frame(stream: &mut TcpStream, deadline: Instant) -> Result<MpaFrame> {
    let mut h = [0u8; MPA_HEADER_LEN];
    read_exact_by(stream, &mut h, deadline).map_err(setup_err)?;
    let (reply, flags, rev, pd_len) = MpaFrame::parse_header(&h).map_err(|e| Error::Setup(e.to_string()))?;
    let mut pd = vec![0u8; pd_len];
    read_exact_by(stream, &mut pd, deadline).map_err(setup_err)?;
    MpaFrame::with_private_data(reply, flags, rev, &pd).map_err(|e| Error::Setup(e.to_string()))
}

fn describe(rev: u8, crc: bool, ird: u8, ord: u8, p2p: bool) -> String {
    let crc = if crc { "on" } else { "off" };
    let p2p = if p2p { ", peer-to-peer (zero-length Write RTR)" } else { "" };
    format!("MPA rev {rev}, CRC {crc}, markers off, IRD {ird}, ORD {ord}{p2p}")
}

fn clamp(v: u16) -> u8 {
    v.min(u16::from(MAX_IRD_ORD)) as u8
}

/// A connection request read from a new TCP connection.
#[derive(Debug)]
pub struct SoftRequest {
    rnic: Arc<RnicShared>,
    stream: TcpStream,
    frame: MpaFrame,
    peer: SocketAddr,
    qp: Option<Arc<SoftQp>>,
}

/// Read the MPA request of a new connection by `deadline` (refusing what this RNIC cannot
/// serve).
fn read_request(rnic: &Arc<RnicShared>, mut stream: TcpStream, deadline: Instant) -> Result<SoftRequest> {
    stream.set_nodelay(true)?;
    let peer = stream.peer_addr()?;
    let frame = read_frame(&mut stream, deadline)?;
    let mut refuse = |why: &str| {
        // The reject fits any fresh socket's buffer; the timeout only guards the deadline.
        let _ = left(deadline).and_then(|t| stream.set_write_timeout(Some(t)));
        // A protocol reject: R set, no consumer data.
        let reply = MpaFrame {
            reply: true,
            flags: MPA_FLAG_REJECT,
            rev: frame.rev.max(1),
            ird_ord: frame.ird_ord.map(|_| IrdOrd::default()),
            private_data: vec![],
        };
        let _ = stream.write_all(&reply.emit());
        Err(Error::Setup(why.into()))
    };
    if frame.reply {
        return refuse("an MPA Reply where a Request belongs");
    }
    if frame.markers() {
        return refuse("MPA markers requested (not supported)");
    }
    Ok(SoftRequest { rnic: rnic.clone(), stream, frame, peer, qp: None })
}

impl ConnectionRequest for SoftRequest {
    type Qp = SoftQp;
    type Pd = SoftPd;
    type Cq = SoftCq;

    fn private_data(&self) -> &[u8] {
        &self.frame.private_data
    }

    fn ird_ord(&self) -> (u8, u8) {
        self.frame.ird_ord.map(|io| (clamp(io.ird), clamp(io.ord))).unwrap_or((1, 1))
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn create_qp(&mut self, pd: &Arc<SoftPd>, send_cq: &Arc<SoftCq>, recv_cq: &Arc<SoftCq>, caps: QpCaps) -> Result<Arc<SoftQp>> {
        let qp = SoftQp::new(&self.rnic, pd, send_cq, recv_cq, caps)?;
        self.qp = Some(qp.clone());
        Ok(qp)
    }

    fn accept(mut self, param: &ConnParam) -> Result<Arc<SoftQp>> {
        let qp = self.qp.take().ok_or_else(|| Error::Invalid("accept before create_qp".into()))?;
        if param.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::Invalid(format!("{} bytes of private data (at most {MAX_PRIVATE_DATA})", param.private_data.len())));
        }
        let (peer_ird, peer_ord) = self.ird_ord();
        // Our ORD may not exceed the requester's IRD; our IRD covers what it will issue.
        let ord = param.initiator_depth.min(peer_ird);
        let ird = param.responder_resources.max(peer_ord).min(MAX_IRD_ORD);
        let crc = self.frame.crc() || self.rnic.config.crc;
        let ird_ord = self.frame.ird_ord.map(|req| {
            let (write_rtr, read_rtr) =
                if req.p2p { if req.write_rtr || !req.read_rtr { (true, false) } else { (false, true) } } else { (false, false) };
            IrdOrd { ird: u16::from(ird), ord: u16::from(ord), p2p: req.p2p, write_rtr, read_rtr }
        });
        let flags = (self.frame.flags & !(MPA_FLAG_REJECT | MPA_FLAG_MARKERS | MPA_FLAG_ENHANCED)) | if crc { MPA_FLAG_CRC } else { 0 };
        let reply = MpaFrame { reply: true, flags, rev: self.frame.rev, ird_ord, private_data: param.private_data.clone() };
        let est = Established {
            private_data: self.frame.private_data.clone(),
            ird,
            ord,
            peer: Some(self.peer),
            description: describe(self.frame.rev, crc, ird, ord, ird_ord.is_some_and(|io| io.p2p)),
        };
        // The engines start before the reply goes out so the first FPDU is handled at once;
        // the transmitter holds back until that FPDU arrived.
        qp.start(self.stream.try_clone()?, crc, true, est, false)?;
        if let Err(e) = self.stream.write_all(&reply.emit()) {
            qp.s.fail();
            return Err(Error::Io(e));
        }
        Ok(qp)
    }

    fn reject(mut self, private_data: &[u8]) {
        let reply = MpaFrame {
            reply: true,
            flags: MPA_FLAG_REJECT,
            rev: self.frame.rev.max(1),
            ird_ord: self.frame.ird_ord.map(|_| IrdOrd::default()),
            private_data: private_data[..private_data.len().min(MAX_PRIVATE_DATA)].to_vec(),
        };
        let _ = self.stream.write_all(&reply.emit());
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// A listening endpoint. A thread of its own accepts connections and hands each to a
/// handshake thread that reads its MPA request (by one deadline, see
/// [`RnicConfig::setup_timeout`]); [`Listener::get_request`] takes the requests read, in the
/// order they completed. So a client that connects and sends nothing, or a byte at a time,
/// delays nobody else; at most [`RnicConfig::max_handshakes`] are in progress at once.
#[derive(Debug)]
pub struct SoftListener {
    local: SocketAddr,
    listener: Arc<TcpListener>,
    handshakes: Arc<Handshakes>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

/// The requests of a listener, read and being read.
#[derive(Debug, Default)]
struct Handshakes {
    state: Mutex<HandshakeState>,
    /// Signals every change of `state` (a slot freed, a request ready, the end).
    cv: Condvar,
}

#[derive(Debug, Default)]
struct HandshakeState {
    /// Requests read, waiting for `get_request`.
    ready: VecDeque<SoftRequest>,
    /// Handshakes in progress, by number: their connections, to end them with the listener.
    running: HashMap<u64, TcpStream>,
    next: u64,
    /// The listener was dropped.
    closed: bool,
    /// The listening socket failed for good: what `get_request` reports.
    failed: Option<(io::ErrorKind, String)>,
}

/// Stack of a handshake thread: it reads at most a few hundred bytes.
const HANDSHAKE_STACK: usize = 256 << 10;

/// Pause after an accept error that may pass (out of descriptors or memory), so the acceptor
/// does not spin while it lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accept connections while there is room for their handshakes.
fn accept_loop(rnic: &Arc<RnicShared>, listener: &TcpListener, hs: &Arc<Handshakes>) {
    let max = rnic.config.max_handshakes.max(1);
    loop {
        {
            let st = lock(&hs.state);
            let st = hs.cv.wait_while(st, |st| !st.closed && st.running.len() + st.ready.len() >= max).unwrap_or_else(|e| e.into_inner());
            if st.closed {
                return;
            }
        }
        let (stream, peer) = match listener.accept() {
            Ok(a) => a,
            Err(_) if lock(&hs.state).closed => return,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP)) => {
                warn!("iwarp: the listening socket failed: {e}");
                lock(&hs.state).failed = Some((e.kind(), e.to_string()));
                hs.cv.notify_all();
                return;
            }
            Err(e) => {
                // A connection that was reset before its accept, or a shortage that may pass.
                debug!("iwarp: accept: {e}");
                if e.kind() != io::ErrorKind::ConnectionAborted {
                    std::thread::sleep(ACCEPT_BACKOFF);
                }
                continue;
            }
        };
        let deadline = Instant::now() + rnic.config.handshake_time();
        let watch = match stream.try_clone() {
            Ok(w) => w,
            Err(e) => {
                debug!(%peer, "iwarp: connection dropped: {e}");
                continue;
            }
        };
        let id = {
            let mut st = lock(&hs.state);
            let id = st.next;
            st.next += 1;
            st.running.insert(id, watch);
            id
        };
        let (r, h) = (rnic.clone(), hs.clone());
        let spawned = std::thread::Builder::new().name("iwarp-mpa".into()).stack_size(HANDSHAKE_STACK).spawn(move || {
            let result = read_request(&r, stream, deadline);
            let unclaimed = {
                let mut st = lock(&h.state);
                st.running.remove(&id);
                match result {
                    Ok(req) if !st.closed => {
                        st.ready.push_back(req);
                        None
                    }
                    // The listener is gone: dropping the request closes its connection.
                    Ok(req) => Some(req),
                    Err(e) => {
                        debug!(%peer, "iwarp: connection request dropped: {e}");
                        None
                    }
                }
            };
            h.cv.notify_all();
            drop(unclaimed);
        });
        if let Err(e) = spawned {
            // The stream went with the closure: the connection is closed.
            warn!(%peer, "iwarp: no thread for an MPA handshake ({e}): connection dropped");
            lock(&hs.state).running.remove(&id);
            hs.cv.notify_all();
        }
    }
}

impl Listener for SoftListener {
    type Request = SoftRequest;

    fn get_request(&self) -> Result<SoftRequest> {
        let st = lock(&self.handshakes.state);
        let mut st = self.handshakes.cv.wait_while(st, |st| st.ready.is_empty() && st.failed.is_none()).unwrap_or_else(|e| e.into_inner());
        if let Some(req) = st.ready.pop_front() {
            drop(st);
            // A slot is free.
            self.handshakes.cv.notify_all();
            return Ok(req);
        }
        let (kind, what) = st.failed.clone().unwrap_or((io::ErrorKind::Other, "listener failed".into()));
        Err(Error::Io(io::Error::new(kind, what)))
    }

    fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.local)
    }
}

impl Drop for SoftListener {
    fn drop(&mut self) {
        let unclaimed = {
            let mut st = lock(&self.handshakes.state);
            st.closed = true;
            // Handshakes in progress end at once (their reads fail) and find the listener closed.
            for s in st.running.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut st.ready)
        };
        self.handshakes.cv.notify_all();
        // Requests nobody will take: their connections close.
        drop(unclaimed);
        // Shutting a listening socket down wakes the acceptor from accept().
        let _ = socket2::SockRef::from(&*self.listener).shutdown(Shutdown::Both);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
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
        Ok(Arc::new(SoftPd { id: self.shared.next_pd.fetch_add(1, Ordering::Relaxed), rnic: self.shared.clone() }))
    }

    fn create_cq(&self, _depth: u32) -> Result<Arc<SoftCq>> {
        Ok(Arc::new(SoftCq {
            q: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            notify: tokio::sync::Notify::new(),
        }))
    }

    fn listen(&self, addr: SocketAddr) -> Result<SoftListener> {
        let listener = Arc::new(TcpListener::bind(addr)?);
        let local = listener.local_addr()?;
        let handshakes = Arc::new(Handshakes::default());
        let (rnic, l, hs) = (self.shared.clone(), listener.clone(), handshakes.clone());
        let acceptor =
            std::thread::Builder::new().name("iwarp-listen".into()).spawn(move || accept_loop(&rnic, &l, &hs)).map_err(Error::Io)?;
        Ok(SoftListener { local, listener, handshakes, acceptor: Some(acceptor) })
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
        let addr = lock(&qp.s.dest).ok_or_else(|| Error::Invalid("queue pair not created for an active connection".into()))?;
        if param.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::Invalid(format!("{} bytes of private data (at most {MAX_PRIVATE_DATA})", param.private_data.len())));
        }
        if qp.s.state() != QpState::Idle {
            return Err(Error::Invalid("queue pair already connected".into()));
        }
        let cfg = &self.shared.config;
        let mut stream = TcpStream::connect_timeout(&addr, cfg.setup_timeout).map_err(|e| match e.kind() {
            io::ErrorKind::TimedOut => Error::Unreachable(format!("{addr}: TCP connect timed out")),
            _ => Error::Io(e),
        })?;
        stream.set_nodelay(true)?;
        let deadline = Instant::now() + cfg.setup_timeout;
        let enhanced = cfg.mpa_rev >= 2;
        let request = MpaFrame {
            reply: false,
            flags: if cfg.crc { MPA_FLAG_CRC } else { 0 },
            rev: if enhanced { 2 } else { 1 },
            ird_ord: enhanced.then_some(IrdOrd {
                ird: u16::from(param.responder_resources.min(MAX_IRD_ORD)),
                ord: u16::from(param.initiator_depth.min(MAX_IRD_ORD)),
                p2p: cfg.p2p,
                write_rtr: cfg.p2p,
                read_rtr: false,
            }),
            private_data: param.private_data.clone(),
        };
        stream.write_all(&request.emit())?;
        let reply = read_frame(&mut stream, deadline)?;
        if !reply.reply {
            return Err(Error::Setup("the peer answered with an MPA Request".into()));
        }
        if reply.rejected() {
            return Err(Error::Rejected { private_data: reply.private_data });
        }
        if reply.markers() {
            return Err(Error::Setup("the peer wants MPA markers (not supported)".into()));
        }
        if enhanced && reply.ird_ord.is_none() {
            return Err(Error::Setup("enhanced MPA request answered without IRD/ORD".into()));
        }
        let (ird, ord) = match reply.ird_ord {
            Some(io) => (param.responder_resources.max(clamp(io.ord)).min(MAX_IRD_ORD), param.initiator_depth.min(clamp(io.ird))),
            None => (param.responder_resources, param.initiator_depth),
        };
        let rtr_write = reply.ird_ord.is_some_and(|io| io.p2p && io.write_rtr) && cfg.p2p;
        if reply.ird_ord.is_some_and(|io| io.p2p && !io.write_rtr) && cfg.p2p {
            return Err(Error::Setup("the peer chose a ready-to-receive message we did not offer".into()));
        }
        let est = Established {
            private_data: reply.private_data.clone(),
            ird,
            ord,
            peer: Some(addr),
            description: describe(reply.rev, reply.crc(), ird, ord, rtr_write),
        };
        qp.start(stream, reply.crc(), false, est.clone(), rtr_write)?;
        Ok(est)
    }
}

/// A queue pair with no connection (posting receives works; sends fail), with its device, PD
/// and CQ: for fuzzing the layers above the RNIC without sockets or threads.
pub fn detached_qp() -> (SoftRnic, Arc<SoftPd>, Arc<SoftCq>, Arc<SoftQp>) {
    let rnic = SoftRnic::default();
    let pd = rnic.alloc_pd().expect("pd");
    let cq = rnic.create_cq(64).expect("cq");
    let qp = SoftQp::new(&rnic.shared, &pd, &cq, &cq, QpCaps { max_send_wr: 1024, max_recv_wr: 1024, max_sge: 4 }).expect("qp");
    (rnic, pd, cq, qp)
}

/// Feed `bytes` to a connected queue pair's receive engine (no socket; what it would send is
/// discarded): the fuzz target for the FPDU state machine.
pub fn fuzz_receive(bytes: &[u8], crc: bool) {
    let rnic = SoftRnic::default();
    let pd = rnic.alloc_pd().expect("pd");
    let cq = rnic.create_cq(64).expect("cq");
    let qp = SoftQp::new(&rnic.shared, &pd, &cq, &cq, QpCaps::default()).expect("qp");
    let all = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let regions: Vec<_> = (0..3).map(|i| pd.register(vec![0u8; 256 << i], all).expect("mr")).collect();
    for (i, mr) in regions.iter().enumerate() {
        let _ = qp.post_recv(RecvWr { wr_id: i as u64, sg_list: vec![Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() }] });
    }
    qp.s.ird.store(4, Ordering::Release);
    qp.s.ord.store(4, Ordering::Release);
    *lock(&qp.s.state) = QpState::Connected;
    let (items_tx, items) = channel();
    let txq = TxQueue { items: items_tx, queued: qp.s.queued.clone() };
    *lock(&qp.s.tx) = Some(txq.clone());
    receive(&qp.s, io::Cursor::new(bytes), crc, &txq);
    // No transmitter writes a Terminate here: close now rather than at the Terminate deadline.
    qp.s.close();
    // Run the transmitter over what the receiver queued, into a sink.
    drop(txq);
    let _ = lock(&qp.s.tx).take();
    let tx = Tx { crc, max_segment: 65516, msn_send: 0, msn_read: 0 };
    while let Ok(item) = items.try_recv() {
        if let TxItem::ReadResponse { req, src } = item {
            let _ = tx.read_response(&mut io::sink(), &req, src.as_ref(), &mut || {}, &|| false);
        }
    }
}
