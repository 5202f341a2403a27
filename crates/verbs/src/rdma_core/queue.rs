//! Completion queues and queue pairs.

use super::cm::CmConn;
use super::mem::{Chunk, PdInner, RcPd, Window};
use super::{Device, KeyMode, Ptr, errno, ret_err};
use crate::{
    Access, BoxFuture, CompletionQueue, ConnParam, Error, Established, QpCaps, QueuePair, RecvWr, Result, SendOp, SendWr, Wc, WcOpcode,
    WcStatus,
};
use rdma_mummy_sys as sys;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Completions taken from the device per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;
/// Completion events acknowledged in batches of this many (acknowledging takes a lock).
const ACK_BATCH: u32 = 64;
/// Work request ids with this bit are the provider's own (window binds and invalidations).
const INTERNAL: u64 = 1 << 63;

/// A file descriptor tokio may watch (the completion channel's; owned by the channel).
#[derive(Debug)]
struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Make a descriptor non-blocking, so the `get_*_event` calls on it never block.
pub(super) fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take and return plain flags.
    let rc = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 { flags } else { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }
    };
    if rc < 0 { Err(Error::Io(errno())) } else { Ok(()) }
}

/// Wait until `fd` is readable or `timeout` passed (`None`: forever); true if readable.
pub(super) fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> = fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: p is a valid array of p.len() pollfd structures.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    p.iter().map(|x| x.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0).collect()
}

struct CqState {
    ready: VecDeque<Wc>,
    unacked: u32,
}

/// A completion queue with its completion channel.
pub struct RcCq {
    dev: Arc<Device>,
    channel: Ptr<sys::ibv_comp_channel>,
    cq: Ptr<sys::ibv_cq>,
    st: Mutex<CqState>,
    afd: OnceLock<Option<tokio::io::unix::AsyncFd<ChannelFd>>>,
    /// Queue pairs completing here, by number (to tell their requests apart).
    qps: Mutex<HashMap<u32, Weak<RcQp>>>,
}

impl std::fmt::Debug for RcCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcCq").field("device", &self.dev.name).finish_non_exhaustive()
    }
}

impl RcCq {
    pub(super) fn new(dev: &Arc<Device>, depth: u32) -> Result<Arc<Self>> {
        // SAFETY: the device's context is open while `dev` lives.
        let channel = unsafe { sys::ibv_create_comp_channel(dev.ctx.0) };
        if channel.is_null() {
            return Err(Error::Io(std::io::Error::new(errno().kind(), format!("ibv_create_comp_channel: {}", errno()))));
        }
        let depth = depth.clamp(1, dev.attr.max_cqe.max(1) as u32) as i32;
        // SAFETY: context and channel are valid; no cq_context is used.
        let cq = unsafe { sys::ibv_create_cq(dev.ctx.0, depth, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = errno();
            // SAFETY: created above, not used elsewhere.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
            return Err(Error::Io(std::io::Error::new(e.kind(), format!("ibv_create_cq of {depth}: {e}"))));
        }
        let me = Arc::new(Self {
            dev: dev.clone(),
            channel: Ptr(channel),
            cq: Ptr(cq),
            st: Mutex::new(CqState { ready: VecDeque::new(), unacked: 0 }),
            afd: OnceLock::new(),
            qps: Mutex::new(HashMap::new()),
        });
        // SAFETY: the channel is valid; its fd lives as long as the channel.
        set_nonblocking(unsafe { (*channel).fd })?;
        Ok(me)
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as self.
        unsafe { (*self.channel.0).fd }
    }

    pub(super) fn add_qp(&self, num: u32, qp: &Arc<RcQp>) {
        lock(&self.qps).insert(num, Arc::downgrade(qp));
    }

    pub(super) fn remove_qp(&self, num: u32) {
        lock(&self.qps).remove(&num);
    }

    /// Take what the device has into `st.ready` (the provider's own completions are handled
    /// here and not passed on).
    fn drain(&self, st: &mut CqState) {
        // SAFETY: zeroed ibv_wc is plain data.
        let mut buf: [sys::ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: cq is valid; buf holds POLL_BATCH entries.
            let n = unsafe { sys::ibv_poll_cq(self.cq.0, POLL_BATCH as i32, buf.as_mut_ptr()) };
            if n <= 0 {
                return;
            }
            for raw in &buf[..n as usize] {
                let qp = lock(&self.qps).get(&raw.qp_num).and_then(Weak::upgrade);
                if let Some(wc) = qp.and_then(|qp| qp.complete(raw)) {
                    st.ready.push_back(wc);
                }
            }
            if (n as usize) < POLL_BATCH {
                return;
            }
        }
    }

    /// Arm the channel, then look once more (a completion may have come before the arming):
    /// true if completions are ready.
    fn arm_and_check(&self) -> bool {
        let mut st = lock(&self.st);
        if !st.ready.is_empty() {
            return true;
        }
        // SAFETY: cq is valid.
        unsafe { sys::ibv_req_notify_cq(self.cq.0, 0) };
        self.drain(&mut st);
        !st.ready.is_empty()
    }

    /// Consume one completion event if there is one (never blocks).
    fn take_event(&self) -> bool {
        let mut cq = std::ptr::null_mut();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the channel's fd is non-blocking, so this returns at once; the out-pointers
        // are valid.
        let rc = unsafe { sys::ibv_get_cq_event(self.channel.0, &mut cq, &mut ctx) };
        if rc != 0 {
            return false;
        }
        let mut st = lock(&self.st);
        st.unacked += 1;
        if st.unacked >= ACK_BATCH {
            // SAFETY: acknowledges events taken from this CQ's channel.
            unsafe { sys::ibv_ack_cq_events(self.cq.0, st.unacked) };
            st.unacked = 0;
        }
        true
    }

    fn async_fd(&self) -> Option<&tokio::io::unix::AsyncFd<ChannelFd>> {
        self.afd
            .get_or_init(|| {
                // SAFETY: the descriptor is the completion channel's, open until the channel is
                // destroyed in `drop`, which deregisters this AsyncFd first; nothing replaces it.
                unsafe { tokio::io::unix::AsyncFd::register_with_interest(ChannelFd(self.fd()), tokio::io::Interest::READABLE) }.ok()
            })
            .as_ref()
    }
}

impl Drop for RcCq {
    fn drop(&mut self) {
        // Stop watching the descriptor before the channel closes it.
        drop(self.afd.take());
        let st = self.st.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: every queue pair using this CQ holds an Arc of it, so none is left; all
        // events taken are acknowledged before the CQ is destroyed (verbs requires it), and the
        // channel is destroyed after its CQ.
        unsafe {
            if st.unacked > 0 {
                sys::ibv_ack_cq_events(self.cq.0, st.unacked);
            }
            sys::ibv_destroy_cq(self.cq.0);
            sys::ibv_destroy_comp_channel(self.channel.0);
        }
    }
}

impl CompletionQueue for RcCq {
    fn poll(&self, max: usize) -> Vec<Wc> {
        let mut st = lock(&self.st);
        if st.ready.len() < max {
            self.drain(&mut st);
        }
        let n = max.min(st.ready.len());
        st.ready.drain(..n).collect()
    }

    fn wait_blocking(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.arm_and_check() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if wait_readable(&[self.fd()], Some(left))[0] {
                self.take_event();
            }
        }
    }

    fn ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                if self.arm_and_check() {
                    return;
                }
                let Some(afd) = self.async_fd() else {
                    // Not inside a tokio runtime with I/O enabled: wait briefly on this thread
                    // instead (a degraded mode; riser always runs with I/O enabled).
                    self.wait_blocking(Duration::from_millis(10));
                    continue;
                };
                match afd.readable().await {
                    Ok(mut guard) => {
                        if !self.take_event() {
                            guard.clear_ready();
                        }
                    }
                    Err(_) => return,
                }
            }
        })
    }
}

/// What a send-queue entry was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SqKind {
    Op(WcOpcode),
    Bind,
    LocalInv,
}

/// A posted send-queue request, until it completes (or a later one shows it has).
#[derive(Clone, Copy, Debug)]
struct SqEntry {
    id: u64,
    kind: SqKind,
    signaled: bool,
}

/// A window being invalidated: its chunk stays reserved until the invalidation completed.
struct Retiring {
    mw: Ptr<sys::ibv_mw>,
    _chunk: Option<Arc<Chunk>>,
}

/// A reliable-connected queue pair, with its connection.
pub struct RcQp {
    dev: Arc<Device>,
    pd: Arc<PdInner>,
    send_cq: Arc<RcCq>,
    recv_cq: Arc<RcCq>,
    conn: Arc<CmConn>,
    qp: Ptr<sys::ibv_qp>,
    num: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    /// Send-queue entries in posting order (error completions carry no valid opcode, so the kind
    /// is remembered here). Not strictly completed in order: siw completes an RDMA Read when its
    /// response arrives, after Sends posted later have completed.
    sq: Mutex<VecDeque<SqEntry>>,
    /// Posted receives, in order.
    rq: Mutex<VecDeque<u64>>,
    /// Windows bound and valid, by key (a remote invalidation removes its key).
    bound: Mutex<HashMap<u32, Ptr<sys::ibv_mw>>>,
    retiring: Mutex<HashMap<u64, Retiring>>,
    next_internal: AtomicU64,
    dest: Option<SocketAddr>,
}

impl std::fmt::Debug for RcQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcQp").field("device", &self.dev.name).field("qp_num", &self.num).field("dest", &self.dest).finish_non_exhaustive()
    }
}

fn status(s: sys::ibv_wc_status::Type) -> WcStatus {
    use sys::ibv_wc_status as st;
    match s {
        st::IBV_WC_SUCCESS => WcStatus::Success,
        st::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLengthErr,
        st::IBV_WC_LOC_PROT_ERR | st::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalProtErr,
        st::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        st::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccessErr,
        st::IBV_WC_REM_OP_ERR | st::IBV_WC_REM_ABORT_ERR => WcStatus::RemoteOpErr,
        st::IBV_WC_REM_INV_REQ_ERR | st::IBV_WC_REM_INV_RD_REQ_ERR => WcStatus::RemoteInvalidRequestErr,
        _ => WcStatus::FatalErr,
    }
}

fn ibv_remote_access(a: Access) -> u32 {
    let mut f = 0;
    if a.contains(Access::REMOTE_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    f
}

impl RcQp {
    /// Create the queue pair of `conn` (a resolved active id, or a connection request).
    pub(super) fn create(
        dev: &Arc<Device>,
        conn: Arc<CmConn>,
        pd: &Arc<RcPd>,
        send_cq: &Arc<RcCq>,
        recv_cq: &Arc<RcCq>,
        caps: QpCaps,
        dest: Option<SocketAddr>,
    ) -> Result<Arc<Self>> {
        if !Arc::ptr_eq(pd.inner.device(), dev) || !Arc::ptr_eq(&send_cq.dev, dev) || !Arc::ptr_eq(&recv_cq.dev, dev) {
            return Err(Error::Invalid("protection domain or completion queue of another device".into()));
        }
        if conn.context() != dev.ctx.0 {
            return Err(Error::Invalid(format!("the connection is on another RDMA device than {}", dev.name)));
        }
        let a = &dev.attr;
        let max_wr = a.max_qp_wr.max(1) as u32;
        // Window binds and invalidations share the send queue with the consumer's requests.
        let send_wr = if dev.keys == KeyMode::MemoryWindows { caps.max_send_wr.saturating_mul(2) } else { caps.max_send_wr };
        let sge = caps.max_sge.clamp(1, a.max_sge.max(1) as u32);
        // SAFETY: zeroed plain data is a valid init attr; the fields are set below.
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.cq.0;
        attr.recv_cq = recv_cq.cq.0;
        attr.cap.max_send_wr = send_wr.clamp(1, max_wr);
        attr.cap.max_recv_wr = caps.max_recv_wr.clamp(1, max_wr);
        attr.cap.max_send_sge = sge;
        attr.cap.max_recv_sge = sge;
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        // SAFETY: the id is resolved (or a request) on dev's context, the PD is of that
        // context, attr is valid; librdmacm moves the new QP to INIT so receives may be posted.
        let rc = unsafe { sys::rdma_create_qp(conn.id(), pd.inner.raw(), &mut attr) };
        if rc != 0 {
            return Err(Error::Io(std::io::Error::new(
                errno().kind(),
                format!("rdma_create_qp (send {} / recv {} requests): {}", attr.cap.max_send_wr, attr.cap.max_recv_wr, errno()),
            )));
        }
        let qp = conn.qp();
        // SAFETY: rdma_create_qp succeeded, so the id holds a valid QP.
        let num = unsafe { (*qp).qp_num };
        let me = Arc::new(Self {
            dev: dev.clone(),
            pd: pd.inner.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            conn,
            qp: Ptr(qp),
            num,
            max_send_sge: attr.cap.max_send_sge,
            max_recv_sge: attr.cap.max_recv_sge,
            sq: Mutex::new(VecDeque::new()),
            rq: Mutex::new(VecDeque::new()),
            bound: Mutex::new(HashMap::new()),
            retiring: Mutex::new(HashMap::new()),
            next_internal: AtomicU64::new(INTERNAL),
            dest,
        });
        send_cq.add_qp(num, &me);
        recv_cq.add_qp(num, &me);
        me.pd.attach(&me);
        Ok(me)
    }

    pub(super) fn connect(self: &Arc<Self>, param: &ConnParam) -> Result<Established> {
        self.conn.connect(param, self.dest)
    }

    pub(super) fn accept(&self, param: &ConnParam, peer_ird: u8, peer: SocketAddr, private_data: Vec<u8>) -> Result<()> {
        self.conn.accept(param, peer_ird, peer, private_data)
    }

    /// A completion of this queue pair: the consumer's (returned), or the provider's own
    /// (handled here).
    fn complete(&self, raw: &sys::ibv_wc) -> Option<Wc> {
        let st = status(raw.status);
        let is_recv = if raw.status == sys::ibv_wc_status::IBV_WC_SUCCESS {
            raw.opcode & sys::ibv_wc_opcode::IBV_WC_RECV != 0
        } else {
            lock(&self.rq).contains(&raw.wr_id) && raw.wr_id & INTERNAL == 0
        };
        if is_recv {
            let mut rq = lock(&self.rq);
            while let Some(id) = rq.pop_front() {
                if id == raw.wr_id {
                    break;
                }
            }
            drop(rq);
            let mut invalidated = None;
            if st == WcStatus::Success {
                let flags = raw.wc_flags;
                let inv = flags & sys::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0
                    || (self.dev.rxe && flags & sys::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0 != 0);
                if inv {
                    // SAFETY: with an invalidation flag the union holds the invalidated key.
                    let k = unsafe { raw.imm_data_invalidated_rkey_union.invalidated_rkey };
                    // The peer revoked the window: it is no longer ours to invalidate.
                    lock(&self.bound).remove(&k);
                    invalidated = Some(k);
                }
            }
            return Some(Wc {
                wr_id: raw.wr_id,
                status: st,
                opcode: WcOpcode::Recv,
                byte_len: raw.byte_len,
                invalidated_rkey: invalidated,
                solicited: false,
            });
        }
        let kind = {
            let mut sq = lock(&self.sq);
            match sq.iter().position(|e| e.id == raw.wr_id) {
                Some(at) => {
                    let e = sq.remove(at).map(|e| e.kind);
                    // Unsignaled requests posted before it have been carried out (they report
                    // only errors, and an error would have ended the queue pair); signaled ones
                    // (an RDMA Read still waiting for its response) stay until they complete.
                    let mut i = 0;
                    let mut before = at;
                    while i < before {
                        if sq[i].signaled {
                            i += 1;
                        } else {
                            sq.remove(i);
                            before -= 1;
                        }
                    }
                    e
                }
                None => None,
            }
        };
        let Some(kind) = kind else {
            // Not ours to place (an unsignaled request already counted as done): pass errors on
            // so the consumer sees the queue pair fail.
            return (st != WcStatus::Success).then_some(Wc {
                wr_id: raw.wr_id,
                status: st,
                opcode: WcOpcode::Send,
                byte_len: 0,
                invalidated_rkey: None,
                solicited: false,
            });
        };
        match kind {
            SqKind::Op(opcode) => {
                Some(Wc { wr_id: raw.wr_id, status: st, opcode, byte_len: raw.byte_len, invalidated_rkey: None, solicited: false })
            }
            SqKind::Bind => {
                if st != WcStatus::Success && st != WcStatus::WrFlushErr {
                    // The queue pair is in error now; the consumer's requests are flushed.
                    self.conn.fail(&format!("memory window bind failed ({st:?}, vendor error {:#x})", raw.vendor_err));
                }
                None
            }
            SqKind::LocalInv => {
                if let Some(r) = lock(&self.retiring).remove(&raw.wr_id) {
                    if st != WcStatus::Success && st != WcStatus::WrFlushErr {
                        self.conn.fail(&format!("memory window invalidation failed ({st:?}, vendor error {:#x})", raw.vendor_err));
                    }
                    // Invalidated, or flushed (the queue pair is dead): the window and the
                    // chunk are free again.
                    self.pd.spare_window(r.mw);
                }
                None
            }
        }
    }

    fn internal_id(&self) -> u64 {
        self.next_internal.fetch_add(1, Ordering::Relaxed) | INTERNAL
    }

    fn post(&self, wr: &mut sys::ibv_send_wr, kind: SqKind) -> Result<()> {
        if self.conn.ended() {
            return Err(Error::NotConnected);
        }
        let mut sq = lock(&self.sq);
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is valid while self lives; wr and its scatter list are valid for
        // the call (the device copies them); the memory they name is registered and kept
        // alive by the consumer until the completion.
        let rc = unsafe { sys::ibv_post_send(self.qp.0, wr, &mut bad) };
        if rc != 0 {
            return Err(ret_err("ibv_post_send", rc));
        }
        let signaled = wr.send_flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
        sq.push_back(SqEntry { id: wr.wr_id, kind, signaled });
        Ok(())
    }

    /// Bind `mw` over [addr, addr + len) of the pool region `mr` with `access`; the new key.
    pub(super) fn bind_window(&self, mw: Ptr<sys::ibv_mw>, mr: Ptr<sys::ibv_mr>, addr: u64, len: usize, access: Access) -> Result<u32> {
        // SAFETY: mw is an allocated window of this QP's PD.
        let key = unsafe { sys::ibv_inc_rkey((*mw.0).rkey) };
        // SAFETY: zeroed plain data; the bind fields are set below.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = self.internal_id();
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_BIND_MW;
        // Unsignaled: the Send that carries the key follows on the same send queue.
        wr.send_flags = 0;
        wr.bind_mw_tso_union.bind_mw = sys::bind_mw_t {
            mw: mw.0,
            rkey: key,
            bind_info: sys::ibv_mw_bind_info { mr: mr.0, addr, length: len as u64, mw_access_flags: ibv_remote_access(access) },
        };
        self.post(&mut wr, SqKind::Bind)?;
        // rxe: the window's key field must hold the new key, or the next bind fails.
        // SAFETY: the window is ours; nothing else writes its key.
        unsafe { (*mw.0).rkey = key };
        lock(&self.bound).insert(key, mw);
        Ok(key)
    }

    /// A window's region is done with it: invalidate it (unless the peer already did) and keep
    /// `chunk` reserved until that has completed.
    pub(super) fn retire_window(self: Arc<Self>, w: Window, chunk: Option<Arc<Chunk>>) {
        if lock(&self.bound).remove(&w.rkey).is_none() || self.conn.ended() {
            // Invalidated by the peer, or no connection left to use it: free now.
            self.pd.spare_window(w.mw);
            return;
        }
        // SAFETY: zeroed plain data; the fields are set below.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        let id = self.internal_id();
        wr.wr_id = id;
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_LOCAL_INV;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.imm_data_invalidated_rkey_union.invalidated_rkey = w.rkey;
        lock(&self.retiring).insert(id, Retiring { mw: w.mw, _chunk: chunk });
        if self.post(&mut wr, SqKind::LocalInv).is_err() {
            // Not postable: the queue pair is in error and no peer can use the key anymore.
            if let Some(r) = lock(&self.retiring).remove(&id) {
                self.pd.spare_window(r.mw);
            }
        }
    }
}

impl Drop for RcQp {
    fn drop(&mut self) {
        self.conn.disconnect();
        self.send_cq.remove_qp(self.num);
        self.recv_cq.remove_qp(self.num);
        // Destroying a connection's id can block for a long time (InfiniBand CM: a peer that
        // vanished leaves a disconnect request retrying for tens of seconds), and queue pairs are
        // dropped on async threads: the teardown runs on a thread of its own, in the order verbs
        // requires (QP, then windows, then the id and its channel, then CQs and PD when last).
        let teardown = Teardown {
            conn: self.conn.clone(),
            retiring: std::mem::take(self.retiring.get_mut().unwrap_or_else(|e| e.into_inner())),
            pd: self.pd.clone(),
            _cqs: [self.send_cq.clone(), self.recv_cq.clone()],
        };
        // (Should no thread be had, the closure is dropped here and the teardown runs inline.)
        let _ = std::thread::Builder::new().name("rdma-teardown".into()).spawn(move || drop(teardown));
    }
}

/// What a dropped queue pair leaves to destroy; destroyed when this is dropped. The fields go
/// in this order after the queue pair: CQs and PD (with its registrations) first, the id last
/// (its destruction is what can block).
struct Teardown {
    /// Held until the queue pair is destroyed (a CQ must outlive its queue pairs).
    _cqs: [Arc<RcCq>; 2],
    pd: Arc<PdInner>,
    retiring: HashMap<u64, Retiring>,
    conn: Arc<CmConn>,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        // SAFETY: the queue pair's last handle is gone (bound windows hold one), so no request
        // can be posted on it; it is destroyed before its CQs, PD and id (the fields, dropped
        // after this).
        unsafe { sys::rdma_destroy_qp(self.conn.id()) };
        for (_, r) in self.retiring.drain() {
            self.pd.spare_window(r.mw);
        }
        self.conn.stop();
    }
}

impl QueuePair for RcQp {
    fn post_send(&self, wr: SendWr) -> Result<()> {
        let n = wr.sg_list.len() as u32;
        if n > self.max_send_sge {
            return Err(Error::Invalid(format!("{n} scatter/gather elements (this queue pair takes {})", self.max_send_sge)));
        }
        let max_rd = self.dev.attr.max_sge_rd.max(1) as u32;
        if matches!(wr.op, SendOp::RdmaRead { .. }) && n > max_rd {
            // siw completes a 2-element RDMA Read "successfully" with only the first element
            // filled: never hand a device more than it says it places.
            return Err(Error::Invalid(format!("RDMA Read into {n} elements: {} places at most {max_rd} per read", self.dev.name)));
        }
        let mut sges: Vec<sys::ibv_sge> =
            wr.sg_list.iter().map(|s| sys::ibv_sge { addr: s.addr, length: s.length, lkey: s.lkey }).collect();
        // SAFETY: zeroed plain data; the fields are set below.
        let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.wr_id;
        w.sg_list = if sges.is_empty() { std::ptr::null_mut() } else { sges.as_mut_ptr() };
        w.num_sge = sges.len() as i32;
        let mut flags = if wr.signaled { sys::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
        let (opcode, kind) = match wr.op {
            SendOp::Send => (sys::ibv_wr_opcode::IBV_WR_SEND, WcOpcode::Send),
            SendOp::SendWithSolicitedEvent => {
                flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
                (sys::ibv_wr_opcode::IBV_WR_SEND, WcOpcode::Send)
            }
            SendOp::SendWithInvalidate { rkey } | SendOp::SendWithSolicitedEventInvalidate { rkey } => {
                if matches!(wr.op, SendOp::SendWithSolicitedEventInvalidate { .. }) {
                    flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
                }
                w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
                // siw's library takes the key to invalidate from here instead.
                w.wr.rdma = sys::rdma_t { remote_addr: 0, rkey };
                (sys::ibv_wr_opcode::IBV_WR_SEND_WITH_INV, WcOpcode::Send)
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                w.wr.rdma = sys::rdma_t { remote_addr, rkey };
                (sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE, WcOpcode::RdmaWrite)
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                w.wr.rdma = sys::rdma_t { remote_addr, rkey };
                (sys::ibv_wr_opcode::IBV_WR_RDMA_READ, WcOpcode::RdmaRead)
            }
        };
        w.opcode = opcode;
        w.send_flags = flags;
        self.post(&mut w, SqKind::Op(kind))
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let n = wr.sg_list.len() as u32;
        if n > self.max_recv_sge {
            return Err(Error::Invalid(format!("{n} scatter/gather elements (this queue pair receives into {})", self.max_recv_sge)));
        }
        if self.conn.ended() {
            return Err(Error::NotConnected);
        }
        let mut sges: Vec<sys::ibv_sge> =
            wr.sg_list.iter().map(|s| sys::ibv_sge { addr: s.addr, length: s.length, lkey: s.lkey }).collect();
        let mut w =
            sys::ibv_recv_wr { wr_id: wr.wr_id, next: std::ptr::null_mut(), sg_list: sges.as_mut_ptr(), num_sge: sges.len() as i32 };
        let mut rq = lock(&self.rq);
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in `post`; the receive memory is registered for local write and kept
        // alive by the consumer until the completion.
        let rc = unsafe { sys::ibv_post_recv(self.qp.0, &mut w, &mut bad) };
        if rc != 0 {
            return Err(ret_err("ibv_post_recv", rc));
        }
        rq.push_back(wr.wr_id);
        Ok(())
    }

    fn disconnect(&self) {
        self.conn.disconnect();
    }

    fn is_connected(&self) -> bool {
        self.conn.connected()
    }

    fn disconnected(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.conn.wait_ended())
    }

    fn established(&self) -> Option<Established> {
        self.conn.established()
    }
}
