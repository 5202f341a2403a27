//! Reliable-connected queue pairs: creation on a connection, posting sends and receives, sorting
//! their completions (the consumer's, and the provider's own window binds and invalidations),
//! and teardown.

use super::cm::CmConn;
use super::mem::{Chunk, PdInner, RcPd, Window};
use super::{Device, KeyMode, Ptr, RcCq, errno, lock, ret_err};
use crate::{
    Access, BoxFuture, ConnParam, Error, Established, Invalid, QpCaps, QueuePair, RecvWr, Result, SendOp, SendWr, Unreachable, Wc,
    WcOpcode, WcStatus,
};
use rdma_mummy_sys as sys;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Work request ids with this bit are the provider's own (window binds and invalidations).
const INTERNAL: u64 = 1 << 63;

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
    /// Signaled by the provider, not the consumer (siw, see [`SIW_COPIED_FROM`]): its
    /// successful completion is not passed on.
    quiet: bool,
}

/// siw sends requests of a page or more posted unsignaled from their memory, after counting
/// them complete (see the module documentation); signaled ones it copies. From this size on
/// (the smallest page), an unsignaled Send or RDMA Write is posted signaled on siw.
const SIW_COPIED_FROM: u64 = 4096;

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
    /// The send queue's depth, as the device made it.
    max_send_wr: u32,
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
            return Err(Error::Invalid(Invalid::ForeignObject("protection domain or completion queue")));
        }
        if conn.context() != dev.ctx.0 {
            return Err(Error::Invalid(Invalid::ConnectionOnOtherDevice { device: dev.name.clone() }));
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
            max_send_wr: attr.cap.max_send_wr,
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
    pub(super) fn complete(&self, raw: &sys::ibv_wc) -> Option<Wc> {
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
                    let e = sq.remove(at).filter(|e| !(e.quiet && st == WcStatus::Success)).map(|e| e.kind);
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
            // Done, and nobody asked to hear it (a request signaled for siw); or not ours to
            // place (an unsignaled request already counted as done): pass errors on so the
            // consumer sees the queue pair fail.
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
                    self.conn.fail(Unreachable::WindowBindFailed { status: st, vendor_err: raw.vendor_err });
                }
                None
            }
            SqKind::LocalInv => {
                if let Some(r) = lock(&self.retiring).remove(&raw.wr_id) {
                    if st != WcStatus::Success && st != WcStatus::WrFlushErr {
                        self.conn.fail(Unreachable::WindowInvalidationFailed { status: st, vendor_err: raw.vendor_err });
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

    fn post(&self, wr: &mut sys::ibv_send_wr, kind: SqKind, quiet: bool) -> Result<()> {
        if self.conn.ended() {
            return Err(Error::NotConnected);
        }
        let mut sq = lock(&self.sq);
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is valid while self lives; wr and its scatter list are valid for
        // the call (the device copies them); the memory they name is registered and kept
        // alive by the consumer until the completion.
        let rc = unsafe { sys::ibv_post_send(self.qp.0, wr, &mut bad) };
        if rc.abs() == libc::ENOMEM {
            // What the providers (mlx5, rxe, siw) answer for a full send queue: named as such,
            // so a consumer can tell a peer that takes nothing from a failed request.
            return Err(Error::Invalid(Invalid::SendQueueFull { depth: self.max_send_wr }));
        }
        if rc != 0 {
            return Err(ret_err("ibv_post_send", rc));
        }
        let signaled = wr.send_flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
        sq.push_back(SqEntry { id: wr.wr_id, kind, signaled, quiet });
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
        self.post(&mut wr, SqKind::Bind, false)?;
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
        if self.post(&mut wr, SqKind::LocalInv, false).is_err() {
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
        if let Some(b) = &wr.unregistered {
            // Every payload is in registered memory here (`max_unregistered_payload` is 0).
            return Err(Error::Invalid(Invalid::UnregisteredPayload { len: b.len(), max: 0 }));
        }
        let n = wr.sg_list.len() as u32;
        if n > self.max_send_sge {
            return Err(Error::Invalid(Invalid::TooManySge { got: wr.sg_list.len(), max: self.max_send_sge as usize }));
        }
        let max_rd = self.dev.attr.max_sge_rd.max(1) as u32;
        if matches!(wr.op, SendOp::RdmaRead { .. }) && n > max_rd {
            // siw completes a 2-element RDMA Read "successfully" with only the first element
            // filled: never hand a device more than it says it places.
            return Err(Error::Invalid(Invalid::TooManyReadSge {
                got: wr.sg_list.len(),
                max: max_rd as usize,
                device: self.dev.name.clone(),
            }));
        }
        let mut sges: smallvec::SmallVec<[sys::ibv_sge; 2]> =
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
        // siw would send it from its memory after completing it: signaled, it is copied.
        let bytes: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let quiet = self.dev.siw && !wr.signaled && kind != WcOpcode::RdmaRead && bytes >= SIW_COPIED_FROM;
        if quiet {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        w.opcode = opcode;
        w.send_flags = flags;
        self.post(&mut w, SqKind::Op(kind), quiet)
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let n = wr.sg_list.len() as u32;
        if n > self.max_recv_sge {
            return Err(Error::Invalid(Invalid::TooManySge { got: wr.sg_list.len(), max: self.max_recv_sge as usize }));
        }
        if self.conn.ended() {
            return Err(Error::NotConnected);
        }
        let mut sges: smallvec::SmallVec<[sys::ibv_sge; 2]> =
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
