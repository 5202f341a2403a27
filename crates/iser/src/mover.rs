//! The iSER datamover: RFC 5047's primitives as RDMA operations over a riser-verbs provider.

use crate::header::{CmPrivateData, ISER_HDR_LEN, ISER_HEADERS_LEN, IserHeader, IserOpcode, RFC5046_HDR_LEN, RemoteBuf};
use bytes::{Bytes, BytesMut};
use riser_datamover::{
    BoxFuture, ConnectionResources, ControlPdu, DataInDesc, Datamover, DmError, DmEvent, PutDataDone, R2tPlan, SequenceError, TaskBuffer,
    Terminated, Violation,
};
use riser_iscsi::keys::{NegotiatedParams, Role};
use riser_iscsi::wire::{BHS_LEN, DataOut, Header, Pdu, RESERVED_TAG, Reaction, ScsiCommand};
use riser_verbs::{
    Access, CompletionQueue, ConnParam, ConnectionRequest, MemoryRegion, ProtectionDomain, Provider, QpCaps, QueuePair, RecvWr, SendOp,
    SendWr, Sge, WcOpcode, WcStatus,
};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::{debug, warn};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sizing and options of an iSER connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IserConfig {
    /// Largest data segment this side receives: what it declares as
    /// InitiatorRecvDataSegmentLength / TargetRecvDataSegmentLength (login PDUs need 8192).
    pub recv_dsl: u32,
    /// Receives kept posted in full-feature phase: at least the CmdSN window plus room for
    /// unsolicited Data-Out, NOP-Out and task management.
    pub recv_depth: u32,
    /// Allow Send with Invalidate (the CM private data says so unless this is off).
    pub send_invalidate: bool,
    /// Initiator: with InitialR2T=No, send the unsolicited part of a write (up to
    /// FirstBurstLength) as Data-Out Sends after the immediate data, as the Linux initiator
    /// does; otherwise only immediate data is sent and the target RDMA Reads the rest.
    pub unsolicited_data_out: bool,
    /// Inbound RDMA Reads this side accepts outstanding (responder resources).
    pub ird: u8,
    /// RDMA Reads this side issues outstanding (initiator depth).
    pub ord: u8,
    /// Send queue entries; `None`: four per posted receive plus 16 (every command may need a
    /// Send, an RDMA Write or Read and a response in flight at once). Never fewer than two per
    /// posted receive plus 16: smaller values are raised to that.
    pub send_depth: Option<u32>,
    /// At most this many routine requests (commands, responses, Data-Out, RDMA Writes) in a
    /// row go unsignaled; 1 signals every request. Fewer completions mean fewer wake-ups of
    /// the completion driver, but unsignaled requests hold their send queue entries and memory
    /// until a later one completes: it is lowered to a quarter of the send queue if larger.
    pub signal_every: u32,
}

impl Default for IserConfig {
    fn default() -> Self {
        Self {
            recv_dsl: 8192,
            recv_depth: 128,
            send_invalidate: true,
            unsolicited_data_out: false,
            ird: 16,
            ord: 16,
            send_depth: None,
            signal_every: DEFAULT_SIGNAL_EVERY,
        }
    }
}

/// Receives posted while logging in.
const LOGIN_RECVS: u32 = 4;

/// Read data at least this large is registered in place rather than copied.
const ZERO_COPY_MIN: usize = 64 << 10;
/// The largest single RDMA Read: well within every device's max_msg_sz (2 GiB on rxe, siw and
/// InfiniBand HCAs; unbounded on the software RNIC), large enough that a command is one Read.
const MAX_RDMA_READ: u32 = 16 << 20;

type Mr<P> = <<P as Provider>::Pd as ProtectionDomain>::Mr;

/// What the target learned from a command's iSER header.
#[derive(Clone, Copy, Debug, Default)]
struct Remote {
    write: Option<RemoteBuf>,
    read: Option<RemoteBuf>,
}

/// Write data arriving before Get_Data (immediate data, unsolicited Data-Out).
struct WriteTask {
    buf: Vec<u8>,
    received: u32,
    /// The unsolicited burst is over (its last Data-Out had the F bit, or none was announced).
    burst_done: bool,
    /// The task's data broke the rules: Get_Data fails it (CHECK CONDITION), the connection stays.
    failed: Option<SequenceError>,
}

/// The initiator's registrations for one command.
struct InitTask<P: Provider> {
    read: Option<Arc<Mr<P>>>,
    write: Option<Arc<Mr<P>>>,
}

#[derive(Clone, Copy, Debug)]
struct Limits {
    max_send_dsl: u32,
    first_burst: u32,
    immediate_data: bool,
    initial_r2t: bool,
}

/// PDUs the target sends unasked (a NOP-In ping, an Async Message) land in the initiator's few
/// spare receives: Linux's iSER initiator sizes for two of each (ISER_MAX_RX_MISC_PDUS). The
/// target never has more than that in flight; a ping stops counting when its NOP-Out answer
/// arrives, an Async Message never does (riser's target core sends none today).
#[derive(Debug, Default)]
struct Unexpected {
    pings: Vec<u32>,
    asyncs: u8,
}

/// Unexpected PDUs of each kind the initiator can take.
const MAX_UNEXPECTED: usize = 2;

impl Unexpected {
    /// Account for an outgoing PDU; an error if the initiator could not receive it.
    fn sending(&mut self, h: &Header) -> Result<(), DmError> {
        match h {
            Header::NopIn(n) if n.itt == RESERVED_TAG && n.ttt != RESERVED_TAG => {
                if self.pings.len() >= MAX_UNEXPECTED {
                    return Err(Violation::TooManyUnexpected { limit: MAX_UNEXPECTED as u32 }.into());
                }
                self.pings.push(n.ttt);
            }
            Header::AsyncMessage(_) => {
                if usize::from(self.asyncs) >= MAX_UNEXPECTED {
                    return Err(Violation::TooManyUnexpected { limit: MAX_UNEXPECTED as u32 }.into());
                }
                self.asyncs += 1;
            }
            _ => {}
        }
        Ok(())
    }

    /// Account for a received PDU: a NOP-Out answering a ping frees its receive.
    fn received(&mut self, h: &Header) {
        if let Header::NopOut(n) = h
            && n.ttt != RESERVED_TAG
        {
            self.pings.retain(|&t| t != n.ttt);
        }
    }
}

/// Memory of unsignaled requests, released in order as later requests complete.
struct Unsignaled<P: Provider> {
    held: std::collections::VecDeque<(u64, Arc<Mr<P>>)>,
    since_signal: u32,
}

/// The default of [`IserConfig::signal_every`].
pub const DEFAULT_SIGNAL_EVERY: u32 = 16;

struct Waiter<P: Provider> {
    done: oneshot::Sender<WcStatus>,
    _keep: Option<Arc<Mr<P>>>,
}

struct Shared<P: Provider> {
    role: Role,
    cfg: IserConfig,
    pd: Arc<P::Pd>,
    cq: Arc<P::Cq>,
    qp: Arc<P::Qp>,
    send_inv: AtomicBool,
    recv_size: usize,
    recvs: Mutex<HashMap<u64, Arc<Mr<P>>>>,
    next_wr: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiter<P>>>,
    unsignaled: Mutex<Unsignaled<P>>,
    events_tx: mpsc::UnboundedSender<DmEvent>,
    events_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<DmEvent>>,
    remote: Mutex<HashMap<u32, Remote>>,
    writes: Mutex<HashMap<u32, WriteTask>>,
    /// Task buffers (target: write data; initiator: read data), reused: see
    /// [`Datamover::release_task_buffer`].
    pool: riser_datamover::BufferPool,
    writes_changed: Notify,
    tasks: Mutex<HashMap<u32, InitTask<P>>>,
    limits: Mutex<Limits>,
    unexpected: Mutex<Unexpected>,
    ff_posted: AtomicBool,
    closed: AtomicBool,
}

/// The iSER datamover of one connection (initiator or target).
pub struct IserDatamover<P: Provider> {
    s: Arc<Shared<P>>,
}

impl<P: Provider> std::fmt::Debug for IserDatamover<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IserDatamover").field("role", &self.s.role).field("qp", &self.s.qp).finish_non_exhaustive()
    }
}

/// A verbs failure while doing `what`, as the seam reports it (the verbs error is logged here,
/// where its detail is known).
fn rdma(what: &'static str) -> impl Fn(riser_verbs::Error) -> DmError {
    move |e| match e {
        riser_verbs::Error::NotConnected => DmError::Closed,
        riser_verbs::Error::Io(e) => DmError::Io(e.kind()),
        e => {
            warn!("iSER: {what}: {e}");
            DmError::Resources { what }
        }
    }
}

impl<P: Provider + 'static> IserDatamover<P> {
    fn new(role: Role, cfg: IserConfig, pd: Arc<P::Pd>, cq: Arc<P::Cq>, qp: Arc<P::Qp>) -> Result<Self, riser_verbs::Error> {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let s = Arc::new(Shared {
            role,
            cfg,
            pd,
            cq,
            qp,
            send_inv: AtomicBool::new(false),
            recv_size: ISER_HEADERS_LEN + cfg.recv_dsl.max(8192) as usize,
            recvs: Mutex::new(HashMap::new()),
            next_wr: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
            unsignaled: Mutex::new(Unsignaled { held: Default::default(), since_signal: 0 }),
            events_tx,
            events_rx: tokio::sync::Mutex::new(events_rx),
            remote: Mutex::new(HashMap::new()),
            writes: Mutex::new(HashMap::new()),
            pool: riser_datamover::BufferPool::default(),
            writes_changed: Notify::new(),
            tasks: Mutex::new(HashMap::new()),
            limits: Mutex::new(Limits { max_send_dsl: 8192, first_burst: 0, immediate_data: false, initial_r2t: true }),
            unexpected: Mutex::new(Unexpected::default()),
            ff_posted: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        });
        // Login is carried by Sends from the very first PDU: receives are posted before the
        // connection is established.
        for _ in 0..LOGIN_RECVS {
            s.post_recv(None)?;
        }
        Ok(Self { s })
    }

    /// The completion driver: spawn it (tokio). It ends when the connection has.
    pub fn driver(&self) -> impl Future<Output = ()> + Send + 'static {
        let s = self.s.clone();
        async move { s.drive().await }
    }

    /// Whether Send with Invalidate is in use on this connection.
    pub fn remote_invalidation(&self) -> bool {
        self.s.send_inv.load(Ordering::Acquire)
    }
}

impl<P: Provider + 'static> Shared<P> {
    /// Post one receive (a fresh buffer, or `mr` again).
    fn post_recv(&self, mr: Option<Arc<Mr<P>>>) -> Result<(), riser_verbs::Error> {
        let mr = match mr {
            Some(m) => m,
            None => self.pd.register(vec![0u8; self.recv_size], Access::LOCAL_WRITE)?,
        };
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        let sge = Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() };
        lock(&self.recvs).insert(wr_id, mr);
        self.qp.post_recv(RecvWr { wr_id, sg_list: vec![sge] }).inspect_err(|_| {
            lock(&self.recvs).remove(&wr_id);
        })
    }

    /// Full-feature receives: posted once, before the final login PDU leaves, so MaxCmdSN
    /// never opens beyond posted receives.
    fn post_ff_recvs(&self) -> Result<(), DmError> {
        if self.ff_posted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let have = lock(&self.recvs).len() as u32;
        for _ in have..self.cfg.recv_depth {
            self.post_recv(None).map_err(rdma("post a receive"))?;
        }
        Ok(())
    }

    fn fail(&self, why: DmError) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            warn!("iSER connection ended: {why}");
            let _ = self.events_tx.send(DmEvent::Terminated(Terminated::Error(why)));
        }
        self.qp.disconnect();
        self.writes_changed.notify_waiters();
    }

    async fn drive(self: Arc<Self>) {
        let mut quiet_rounds = 0;
        loop {
            let wcs = self.cq.poll(64);
            if wcs.is_empty() {
                if !self.qp.is_connected() {
                    // Flushes may trail the disconnect: look twice before leaving.
                    quiet_rounds += 1;
                    if quiet_rounds > 2 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                tokio::select! {
                    _ = self.cq.ready() => {}
                    _ = self.qp.disconnected() => {}
                }
                continue;
            }
            quiet_rounds = 0;
            for wc in wcs {
                if wc.opcode == WcOpcode::Recv {
                    let Some(mr) = lock(&self.recvs).remove(&wc.wr_id) else { continue };
                    if wc.status != WcStatus::Success {
                        if wc.status != WcStatus::WrFlushErr {
                            self.fail(DmError::Completion { op: WcOpcode::Recv.name(), status: wc.status.name() });
                        }
                        continue;
                    }
                    // Handled in place (immediate and Data-Out payload go straight to the task
                    // buffer), then the buffer is posted again.
                    let n = wc.byte_len as usize;
                    let mut handled = Ok(());
                    mr.read(&mut |b| handled = self.on_message(&b[..n.min(b.len())], wc.invalidated_rkey));
                    if !self.closed.load(Ordering::Acquire) && self.qp.is_connected() && self.post_recv(Some(mr)).is_err() {
                        self.fail(DmError::Resources { what: "repost a receive" });
                    }
                    if let Err(why) = handled {
                        self.fail(why);
                    }
                } else if let Some(Waiter { done, _keep }) = self.take_waiter(wc.wr_id) {
                    // Every request posted before this one has completed too.
                    let mut u = lock(&self.unsignaled);
                    while u.held.front().is_some_and(|(id, _)| *id < wc.wr_id) {
                        u.held.pop_front();
                    }
                    drop(u);
                    if wc.status != WcStatus::Success && wc.status != WcStatus::WrFlushErr {
                        self.fail(DmError::Completion { op: wc.opcode.name(), status: wc.status.name() });
                    }
                    // Our handle on the memory goes first, so the waiter may take it back whole.
                    drop(_keep);
                    let _ = done.send(wc.status);
                }
            }
        }
        lock(&self.waiting).clear();
        lock(&self.unsignaled).held.clear();
        lock(&self.recvs).clear();
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = self.events_tx.send(DmEvent::Terminated(Terminated::PeerClosed));
        }
        self.writes_changed.notify_waiters();
    }

    /// The waiter of a send-queue request (the map's lock released at once: the caller goes on
    /// to lock `unsignaled`, which posting takes before `waiting`).
    fn take_waiter(&self, wr_id: u64) -> Option<Waiter<P>> {
        lock(&self.waiting).remove(&wr_id)
    }

    /// One received Send: an iSER header, a BHS, AHS and data.
    fn on_message(&self, msg: &[u8], invalidated: Option<u32>) -> Result<(), DmError> {
        let ih = IserHeader::parse(msg).map_err(|_| Violation::IserTruncated)?;
        match ih.opcode {
            IserOpcode::Control => {}
            IserOpcode::Hello | IserOpcode::HelloReply => {
                return Err(Violation::IserHello.into());
            }
            IserOpcode::Other(n) => return Err(Violation::IserOpcode(n).into()),
        }
        let pdu = match Pdu::parse_limited(&msg[ISER_HDR_LEN..], self.cfg.recv_dsl.max(8192), false) {
            Ok((p, _)) => p,
            Err(e) => {
                let rfc5046 = msg.len() >= RFC5046_HDR_LEN + 48 && Pdu::parse_limited(&msg[RFC5046_HDR_LEN..], u32::MAX, false).is_ok();
                if rfc5046 {
                    return Err(Violation::Rfc5046Header.into());
                }
                // A whole message is one PDU, so the next one is framed whatever this one holds:
                // a field the session rejects costs only this PDU.
                if let (Reaction::Reject(_), Some(raw)) = (e.reaction(), msg.get(ISER_HDR_LEN..ISER_HDR_LEN + BHS_LEN)) {
                    let mut bhs = [0u8; BHS_LEN];
                    bhs.copy_from_slice(raw);
                    let _ = self.events_tx.send(DmEvent::Malformed { bhs, error: e });
                    return Ok(());
                }
                return Err(e.into());
            }
        };
        let header = pdu.header;
        tracing::trace!(role = ?self.role, op = ?header.opcode(), itt = header.itt(), len = msg.len(), ?invalidated, "iSER receive");
        let ahs = Bytes::copy_from_slice(pdu.ahs);
        if self.role == Role::Target {
            lock(&self.unexpected).received(&header);
        }
        match (self.role, &header) {
            (Role::Target, Header::ScsiCommand(c)) => {
                lock(&self.remote).insert(c.itt, Remote { write: ih.write, read: ih.read });
                if c.write && c.expected_data_len > 0 {
                    let edtl = c.expected_data_len as usize;
                    let imm = pdu.data.len();
                    if edtl > crate::MAX_TASK_BUFFER || imm > edtl {
                        // No task: the core answers CHECK CONDITION (as over TCP), seeing the
                        // immediate data beyond the command's length or a length beyond
                        // MAX_TASK_BUFFER; the connection goes on.
                        let _ =
                            self.events_tx.send(DmEvent::Control(ControlPdu { header, ahs, data: Bytes::new(), immediate: imm as u32 }));
                        return Ok(());
                    }
                    let l = *lock(&self.limits);
                    // Every byte is written before use: immediate data here, unsolicited
                    // Data-Out in order after it, RDMA Reads for the rest. Only the unsolicited
                    // part is taken now; Get_Data takes the rest within the core's budget.
                    let first = if !l.initial_r2t && !c.final_ { (l.first_burst as usize).min(edtl).max(imm) } else { imm };
                    let mut buf = self.pool.take_dirty_vec(first);
                    buf[..imm].copy_from_slice(&pdu.data[..imm]);
                    let task = WriteTask {
                        buf,
                        received: imm as u32,
                        burst_done: c.final_,
                        // F=0 announces unsolicited Data-Out, which InitialR2T=Yes forbids.
                        failed: (l.initial_r2t && !c.final_).then_some(SequenceError::UnsolicitedWithInitialR2t),
                    };
                    lock(&self.writes).insert(c.itt, task);
                    let _ = self.events_tx.send(DmEvent::Control(ControlPdu { header, ahs, data: Bytes::new(), immediate: imm as u32 }));
                    return Ok(());
                }
            }
            (Role::Target, Header::DataOut(d)) => {
                // Unsolicited Data-Out (InitialR2T=No): a Send, placed by its buffer offset.
                let first_burst = lock(&self.limits).first_burst;
                let mut w = lock(&self.writes);
                if let Some(t) = w.get_mut(&d.itt).filter(|t| t.failed.is_none()) {
                    // In order (DataPDUInOrder=Yes), so `received` is the covered prefix.
                    if d.buffer_offset != t.received {
                        return Err(Violation::DataOutOutOfOrder { offset: d.buffer_offset, due: t.received }.into());
                    }
                    let at = d.buffer_offset as usize;
                    let end = at.checked_add(pdu.data.len()).filter(|&e| e <= t.buf.len());
                    if t.burst_done {
                        t.failed = Some(SequenceError::UnsolicitedAfterEnd);
                    } else if end.is_none() {
                        t.failed = Some(SequenceError::BeyondFirstBurst);
                    } else {
                        let end = end.unwrap_or(at);
                        t.buf[at..end].copy_from_slice(pdu.data);
                        t.received += pdu.data.len() as u32;
                        if d.final_ {
                            t.burst_done = true;
                            // The burst is FirstBurstLength or the whole transfer, never less (as
                            // LIO): only what lies beyond it is read from the initiator.
                            if t.received != first_burst.min(t.buf.len() as u32) {
                                t.failed = Some(SequenceError::UnsolicitedEndedEarly);
                            }
                        }
                    }
                }
                drop(w);
                self.writes_changed.notify_waiters();
                return Ok(());
            }
            (Role::Initiator, h) => {
                if let Some(k) = invalidated {
                    if !self.send_inv.load(Ordering::Acquire) {
                        return Err(Violation::UnexpectedInvalidation.into());
                    }
                    let ok =
                        lock(&self.tasks).get(&h.itt()).is_some_and(|t| [&t.read, &t.write].into_iter().flatten().any(|mr| mr.rkey() == k));
                    if !ok {
                        return Err(Violation::ForeignInvalidation { key: k, itt: h.itt() }.into());
                    }
                }
            }
            _ => {}
        }
        let data = Bytes::copy_from_slice(pdu.data);
        let _ = self.events_tx.send(DmEvent::Control(ControlPdu { header, ahs, data, immediate: 0 }));
        Ok(())
    }

    /// Post a send-queue request now and hand back the receiver of its completion status.
    fn post_queued(&self, op: SendOp, sg: Vec<Sge>, keep: Option<Arc<Mr<P>>>) -> Result<oneshot::Receiver<WcStatus>, DmError> {
        let (tx, rx) = oneshot::channel();
        self.post_wr(op, sg, keep, Some(tx))?;
        Ok(rx)
    }

    /// Post a request nobody waits for. Unless `signal`, most go unsignaled (no completion, no
    /// wake-up of the driver): their memory is released when a later request completes, since
    /// a send queue completes in order. Every [`IserConfig::signal_every`]th is signaled so that always
    /// happens; a signaled one is in `waiting` until it completes (see `terminate`).
    fn post_unawaited(&self, op: SendOp, sg: Vec<Sge>, keep: Option<Arc<Mr<P>>>, signal: bool) -> Result<(), DmError> {
        self.post_wr(op, sg, keep, signal.then(|| oneshot::channel().0))
    }

    /// Post one request: signaled when someone waits, else now and then. Posting is
    /// serialised, so request ids increase in posting order.
    fn post_wr(&self, op: SendOp, sg: Vec<Sge>, keep: Option<Arc<Mr<P>>>, done: Option<oneshot::Sender<WcStatus>>) -> Result<(), DmError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(DmError::Closed);
        }
        let mut u = lock(&self.unsignaled);
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        u.since_signal += 1;
        let signaled = done.is_some() || u.since_signal >= signal_interval(&self.cfg);
        if signaled {
            u.since_signal = 0;
            let done = done.unwrap_or_else(|| oneshot::channel().0);
            lock(&self.waiting).insert(wr_id, Waiter { done, _keep: keep });
        } else if let Some(mr) = keep {
            u.held.push_back((wr_id, mr));
        }
        tracing::trace!(role = ?self.role, wr_id, ?op, signaled, "iSER post");
        if let Err(e) = self.qp.post_send(SendWr { wr_id, op, sg_list: sg, signaled }) {
            lock(&self.waiting).remove(&wr_id);
            if u.held.back().is_some_and(|(id, _)| *id == wr_id) {
                u.held.pop_back();
            }
            return Err(rdma("post a work request")(e));
        }
        Ok(())
    }

    /// One PDU as one Send: [iSER header | BHS | AHS | data].
    async fn send_pdu(&self, ih: IserHeader, header: &Header, ahs: &[u8], data: &[&[u8]], invalidate: Option<u32>) -> Result<(), DmError> {
        let dsl: usize = data.iter().map(|d| d.len()).sum();
        let mut buf = Vec::with_capacity(ISER_HEADERS_LEN + ahs.len() + dsl);
        buf.extend_from_slice(&ih.emit());
        let mut bhs = [0u8; 48];
        header.emit(&mut bhs, ahs.len(), dsl as u32);
        buf.extend_from_slice(&bhs);
        buf.extend_from_slice(ahs);
        data.iter().for_each(|d| buf.extend_from_slice(d));
        let mr = self.pd.register(buf, Access::empty()).map_err(rdma("register a send buffer"))?;
        let sge = Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() };
        let op = match invalidate {
            Some(rkey) => SendOp::SendWithInvalidate { rkey },
            None => SendOp::Send,
        };
        // The traffic of commands goes mostly unsignaled; anything else (login, logout, NOP,
        // task management, text, reject) is signaled, so a connection's end can wait for it.
        let routine = matches!(header, Header::ScsiCommand(_) | Header::ScsiResponse(_) | Header::DataOut(_));
        self.post_unawaited(op, vec![sge], Some(mr), !routine)
    }
}

impl<P: Provider + 'static> Datamover for IserDatamover<P> {
    fn send_control(&self, pdu: ControlPdu) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(async move {
            let s = &self.s;
            let mut invalidate = None;
            match &pdu.header {
                Header::NopIn(_) | Header::AsyncMessage(_) if s.role == Role::Target => lock(&s.unexpected).sending(&pdu.header)?,
                Header::ScsiResponse(r) => {
                    // The command's STags end with it; with remote invalidation negotiated the
                    // response invalidates the one key the initiator gave (read, else write).
                    let remote = lock(&s.remote).remove(&r.itt);
                    if s.send_inv.load(Ordering::Acquire)
                        && let Some(rm) = remote
                    {
                        invalidate = rm.read.or(rm.write).map(|b| b.stag).filter(|&k| k != 0);
                    }
                }
                _ => {}
            }
            s.send_pdu(IserHeader::CONTROL, &pdu.header, &pdu.ahs, &[&pdu.data], invalidate).await
        })
    }

    fn put_data(&self, desc: DataInDesc, data: Bytes) -> BoxFuture<'_, Result<PutDataDone, DmError>> {
        Box::pin(async move {
            let s = &self.s;
            if lock(&s.remote).get(&desc.itt).is_none_or(|r| r.read.is_none()) {
                return Err(Violation::NoReadStag { itt: desc.itt }.into());
            }
            if !data.is_empty() {
                // RDMA Write to (read STag, read VA + offset); the SCSI Response Send follows on
                // the same queue pair, so the data is placed before the status arrives.
                // Large data is registered where it lies (no copy) and the write awaited, so the
                // caller gets its buffer back; small data is copied and the write left queued.
                let large = data.len() >= ZERO_COPY_MIN;
                let mr = if large { s.pd.register_shared(data, Access::empty()) } else { s.pd.register(data.to_vec(), Access::empty()) }
                    .map_err(rdma("register read data"))?;
                let sge = Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() };
                // Posted under the lock task management takes to end the task: once a task is
                // aborted (and its TMF response may be on its way) nothing more is posted for
                // it, so the initiator never sees a write to a key it has revoked.
                let done = {
                    let remote = lock(&s.remote);
                    let Some(rb) = remote.get(&desc.itt).and_then(|r| r.read) else { return Err(DmError::NoTask(desc.itt)) };
                    let op = SendOp::RdmaWrite { remote_addr: rb.va.wrapping_add(u64::from(desc.offset)), rkey: rb.stag };
                    if large {
                        Some(s.post_queued(op, vec![sge], Some(mr))?)
                    } else {
                        s.post_unawaited(op, vec![sge], Some(mr), false).map(|()| None)?
                    }
                };
                if let Some(done) = done {
                    completion(done).await?;
                }
            }
            // No Data-In PDUs (DataSN not consumed) and never a collapsed status.
            Ok(PutDataDone { pdus: 0, status_sent: false })
        })
    }

    fn get_data(&self, plan: R2tPlan) -> BoxFuture<'_, Result<TaskBuffer, DmError>> {
        Box::pin(async move {
            let s = &self.s;
            let (itt, total_len, unsolicited_len) = (plan.itt, plan.end, plan.start);
            if unsolicited_len > total_len {
                lock(&s.writes).remove(&itt);
                return Err(SequenceError::UnsolicitedBeyondLength { len: total_len }.into());
            }
            // Every byte is covered exactly once: the unsolicited part (checked complete below),
            // then the solicited range to the end (the buffer is reused, not cleared).
            // Unsolicited Data-Out arrives as Sends: wait for all of it (the caller bounds the
            // wait; the burst's end is known from its F bit).
            loop {
                let mut n = std::pin::pin!(s.writes_changed.notified());
                n.as_mut().enable();
                let state = lock(&s.writes).get(&itt).map(|t| (t.received, t.burst_done, t.failed));
                match state {
                    Some((_, _, Some(why))) => {
                        lock(&s.writes).remove(&itt);
                        return Err(why.into());
                    }
                    Some((got, _, None)) if got == unsolicited_len => break,
                    Some((got, done, None)) if got > unsolicited_len || done => {
                        lock(&s.writes).remove(&itt);
                        return Err(SequenceError::UnsolicitedShort { got, due: unsolicited_len }.into());
                    }
                    None if unsolicited_len > 0 => return Err(DmError::NoTask(itt)),
                    _ if unsolicited_len == 0 => break,
                    _ => {}
                }
                if s.closed.load(Ordering::Acquire) {
                    return Err(DmError::Closed);
                }
                n.await;
            }
            let task = lock(&s.writes).remove(&itt);
            let mut buf = task.map_or_else(|| s.pool.take_vec(total_len as usize), |t| t.buf);
            if buf.len() != total_len as usize {
                // The buffer held the unsolicited part; the whole transfer's memory is taken
                // only now that the core collects it.
                let mut whole = s.pool.take_dirty_vec(total_len as usize);
                let have = (unsolicited_len as usize).min(buf.len());
                whole[..have].copy_from_slice(&buf[..have]);
                s.pool.give_vec(std::mem::replace(&mut buf, whole));
            }
            if plan.count() == 0 {
                return Ok(TaskBuffer { data: riser_datamover::into_bytes_mut(buf) });
            }
            if lock(&s.remote).get(&itt).is_none_or(|r| r.write.is_none()) {
                return Err(SequenceError::NoWriteStag.into());
            }
            // RDMA Read the rest from (write STag, write VA + (offset − unsolicited)) into the
            // task buffer itself, registered as a read sink. The R2T sequence is only
            // bookkeeping here: the solicited range goes in reads as large as the provider
            // takes (not MaxBurstLength), all posted at once; the ORD paces them.
            let mr = s.pd.register(buf, Access::LOCAL_WRITE | Access::READ_SINK).map_err(rdma("register a write buffer"))?;
            let (start, end) = (plan.start, plan.end);
            let mut pending = Vec::new();
            {
                // Posted under the lock task management takes to end the task (see put_data).
                let remote = lock(&s.remote);
                let Some(wb) = remote.get(&itt).and_then(|r| r.write) else { return Err(DmError::NoTask(itt)) };
                let mut at = start;
                while at < end {
                    let len = (end - at).min(MAX_RDMA_READ);
                    let sge = Sge { addr: mr.addr() + u64::from(at), length: len, lkey: mr.lkey() };
                    let remote_addr = wb.va.wrapping_add(u64::from(at - unsolicited_len.min(at)));
                    // The sink stays registered until the read completes, even if this task is
                    // aborted meanwhile (a response into a deregistered sink would end the stream).
                    pending.push(s.post_queued(SendOp::RdmaRead { remote_addr, rkey: wb.stag }, vec![sge], Some(mr.clone()))?);
                    at += len;
                }
            }
            for done in pending {
                completion(done).await?;
            }
            let data = copy_out(mr);
            Ok(TaskBuffer { data })
        })
    }

    fn notice_key_values(&self, p: &NegotiatedParams) {
        let send = match self.s.role {
            Role::Target => p.initiator_recv_data_segment_length,
            Role::Initiator => p.target_recv_data_segment_length,
        };
        *lock(&self.s.limits) =
            Limits { max_send_dsl: send, first_burst: p.first_burst_length, immediate_data: p.immediate_data, initial_r2t: p.initial_r2t };
    }

    fn allocate_connection_resources(&self, _res: ConnectionResources) -> Result<(), DmError> {
        self.s.post_ff_recvs()
    }

    fn deallocate_connection_resources(&self) {
        lock(&self.s.writes).clear();
        lock(&self.s.remote).clear();
        lock(&self.s.tasks).clear();
    }

    fn enable(&self) {
        // The receives went up in allocate_connection_resources, before the final login PDU.
    }

    fn release_task_buffer(&self, buf: TaskBuffer) {
        self.s.pool.give(buf.data);
    }

    fn deallocate_task_resources(&self, itt: u32) {
        lock(&self.s.writes).remove(&itt);
        lock(&self.s.remote).remove(&itt);
        if let Some(t) = lock(&self.s.tasks).remove(&itt) {
            // No response will invalidate these: revoke them here.
            [t.read, t.write].into_iter().flatten().for_each(|mr| mr.invalidate());
        }
    }

    fn terminate(&self) {
        // The user of this datamover learns of the end as of any other (the event is what
        // ends an initiator's receiver and so fails its commands in flight).
        if !self.s.closed.swap(true, Ordering::AcqRel) {
            let _ = self.s.events_tx.send(DmEvent::Terminated(Terminated::Local));
        }
        self.s.writes_changed.notify_waiters();
        // Sends return once queued: let the signaled ones (a Logout Response, a Reject, a
        // failed Login Response) and with them all posted before leave, then disconnect.
        let s = self.s.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    for _ in 0..200 {
                        if lock(&s.waiting).is_empty() || !s.qp.is_connected() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    s.qp.disconnect();
                });
            }
            Err(_) => s.qp.disconnect(),
        }
    }

    fn next_event(&self) -> BoxFuture<'_, DmEvent> {
        Box::pin(async move {
            match self.s.events_rx.lock().await.recv().await {
                Some(e) => e,
                None => DmEvent::Terminated(Terminated::Local),
            }
        })
    }

    fn send_command(&self, mut cmd: ScsiCommand, ahs: Bytes, read_len: u32, write: Option<Bytes>) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(async move {
            let s = &self.s;
            let l = *lock(&s.limits);
            let mut ih = IserHeader::CONTROL;
            let mut task = InitTask::<P> { read: None, write: None };
            if read_len > 0 {
                // A fresh registration (and key) per command and direction.
                let mr =
                    s.pd.register(s.pool.take_vec(read_len as usize), Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                        .map_err(rdma("register a read buffer"))?;
                ih.read = Some(RemoteBuf { stag: mr.rkey(), va: mr.addr() });
                task.read = Some(mr);
            }
            let mut immediate = Bytes::new();
            let mut unsolicited = Bytes::new();
            if let Some(data) = write.filter(|d| !d.is_empty()) {
                let len = data.len();
                let imm = if l.immediate_data { len.min(l.first_burst as usize).min(l.max_send_dsl as usize) } else { 0 };
                let unsolicited_end =
                    if s.cfg.unsolicited_data_out && !l.initial_r2t { len.min(l.first_burst as usize).max(imm) } else { imm };
                if unsolicited_end < len {
                    // The caller's bytes themselves, registered read-only for the target's RDMA Read.
                    let mr = s.pd.register_shared(data.clone(), Access::REMOTE_READ).map_err(rdma("register write data"))?;
                    // The write VA names the first byte not sent unsolicited.
                    ih.write = Some(RemoteBuf { stag: mr.rkey(), va: mr.addr() + unsolicited_end as u64 });
                    task.write = Some(mr);
                }
                immediate = data.slice(..imm);
                unsolicited = data.slice(imm..unsolicited_end);
            }
            // F: no unsolicited Data-Out follows.
            cmd.final_ = unsolicited.is_empty();
            let (itt, lun, exp_stat_sn) = (cmd.itt, cmd.lun, cmd.exp_stat_sn);
            lock(&s.tasks).insert(itt, task);
            let mut r = s.send_pdu(ih, &Header::ScsiCommand(cmd), &ahs, &[&immediate], None).await;
            // Unsolicited Data-Out PDUs as Sends, each within the target's receive size.
            let seg = (l.max_send_dsl as usize).max(512);
            let (mut at, mut data_sn) = (0usize, 0u32);
            while r.is_ok() && at < unsolicited.len() {
                let n = seg.min(unsolicited.len() - at);
                let d = DataOut {
                    final_: at + n == unsolicited.len(),
                    lun,
                    itt,
                    ttt: RESERVED_TAG,
                    exp_stat_sn,
                    data_sn,
                    buffer_offset: (immediate.len() + at) as u32,
                };
                r = s.send_pdu(IserHeader::CONTROL, &Header::DataOut(d), &[], &[&unsolicited[at..at + n]], None).await;
                at += n;
                data_sn += 1;
            }
            if r.is_err() {
                self.deallocate_task_resources(itt);
            }
            r
        })
    }

    fn max_recv_data_segment_length(&self) -> Option<u32> {
        Some(self.s.cfg.recv_dsl.max(8192))
    }

    fn can_put_data(&self, itt: u32) -> bool {
        lock(&self.s.remote).get(&itt).is_some_and(|r| r.read.is_some_and(|b| b.stag != 0))
    }

    fn take_read_data(&self, itt: u32) -> Option<BytesMut> {
        let t = lock(&self.s.tasks).remove(&itt)?;
        if let Some(w) = t.write {
            w.invalidate();
        }
        let r = t.read?;
        r.invalidate();
        Some(copy_out(r))
    }
}

/// The outcome of a posted request, once it completes.
async fn completion(done: oneshot::Receiver<WcStatus>) -> Result<(), DmError> {
    match done.await {
        Ok(WcStatus::Success) => Ok(()),
        Ok(WcStatus::WrFlushErr) | Err(_) => Err(DmError::Closed),
        Ok(st) => Err(DmError::Completion { op: "work request", status: st.name() }),
    }
}

/// A region's bytes: its buffer back (no copy) when this is the last handle, else a copy —
/// never nothing (a count checked before an unwrap could race with a handle taken or dropped
/// in between, and an empty buffer would have been written as the command's data).
fn copy_out<M: MemoryRegion>(mr: Arc<M>) -> BytesMut {
    match mr.into_buffer() {
        Ok(whole) => riser_datamover::into_bytes_mut(whole),
        Err(shared) => {
            let mut copy = BytesMut::new();
            shared.read(&mut |b| copy.extend_from_slice(b));
            copy
        }
    }
}

fn caps(cfg: &IserConfig) -> QpCaps {
    let max_send_wr = cfg.send_depth.unwrap_or(cfg.recv_depth * 4 + 16).max(cfg.recv_depth * 2 + 16);
    QpCaps { max_send_wr, max_recv_wr: cfg.recv_depth + LOGIN_RECVS, max_sge: 2 }
}

/// How many routine requests in a row may go unsignaled: [`IserConfig::signal_every`], at most
/// a quarter of the send queue (unsignaled requests keep their entries until a later one
/// completes).
fn signal_interval(cfg: &IserConfig) -> u32 {
    cfg.signal_every.clamp(1, (caps(cfg).max_send_wr / 4).max(1))
}

/// Target: accept an iSER connection request (blocking: run it off the async threads). The
/// returned datamover's [`IserDatamover::driver`] must be spawned. Every connection has a
/// protection domain of its own, so a peer's keys can never reach another connection's memory.
pub fn accept<P: Provider + 'static>(
    provider: &P,
    mut req: P::Request,
    cfg: IserConfig,
) -> Result<(IserDatamover<P>, SocketAddr), riser_verbs::Error> {
    let theirs = CmPrivateData::parse(req.private_data());
    let send_inv = cfg.send_invalidate && !theirs.send_inv_not_supported;
    let peer = req.peer();
    let pd = provider.alloc_pd()?;
    let cq = provider.create_cq(caps(&cfg).max_send_wr + caps(&cfg).max_recv_wr)?;
    let qp = req.create_qp(&pd, &cq, &cq, caps(&cfg))?;
    let dm = IserDatamover::new(Role::Target, cfg, pd, cq, qp)?;
    dm.s.send_inv.store(send_inv, Ordering::Release);
    let (peer_ird, _peer_ord) = req.ird_ord();
    let ours = CmPrivateData { zbva_not_supported: true, send_inv_not_supported: !send_inv };
    req.accept(&ConnParam { private_data: ours.emit().to_vec(), responder_resources: cfg.ird, initiator_depth: cfg.ord.min(peer_ird) })?;
    debug!(%peer, send_inv, "iSER connection accepted");
    Ok((dm, peer))
}

/// Initiator: connect to an iSER target (blocking). Spawn the returned datamover's driver. The
/// connection has a protection domain of its own.
pub fn connect<P: Provider + 'static>(provider: &P, addr: SocketAddr, cfg: IserConfig) -> Result<IserDatamover<P>, riser_verbs::Error> {
    let pd = provider.alloc_pd()?;
    let cq = provider.create_cq(caps(&cfg).max_send_wr + caps(&cfg).max_recv_wr)?;
    let qp = provider.create_qp(addr, &pd, &cq, &cq, caps(&cfg))?;
    let dm = IserDatamover::new(Role::Initiator, cfg, pd, cq, qp)?;
    // Offer remote invalidation only where the provider's keys can be invalidated by the peer
    // (not with plain registrations on rxe, nor with a fixed-key pool).
    let offer_inv = cfg.send_invalidate && provider.remote_invalidation();
    let ours = CmPrivateData { zbva_not_supported: true, send_inv_not_supported: !offer_inv };
    let est = provider
        .connect(&dm.s.qp, &ConnParam { private_data: ours.emit().to_vec(), responder_resources: cfg.ird, initiator_depth: cfg.ord })?;
    // As Linux: remote invalidation is on iff the reply's 0x40 bit is clear (and we offered it).
    let theirs = CmPrivateData::parse(&est.private_data);
    dm.s.send_inv.store(offer_inv && !est.private_data.is_empty() && !theirs.send_inv_not_supported, Ordering::Release);
    debug!(%addr, transport = %est.description, "iSER connection established");
    Ok(dm)
}

/// The fuzz target for the iSER receive path: `input` (a control byte, then messages as
/// `[selector, length u16 LE, bytes]`) is handled as received Sends, in either role, on a
/// datamover over the given (unconnected) queue pair, until one ends the connection. Checks
/// what must hold whatever arrives: no panic, write data only inside its task buffer, no more
/// immediate data than the command's length, remote invalidation only of the task's own keys.
pub fn fuzz_receive<P: Provider + 'static>(pd: Arc<P::Pd>, cq: Arc<P::Cq>, qp: Arc<P::Qp>, input: &[u8]) {
    let Some((&ctl, mut rest)) = input.split_first() else { return };
    let role = if ctl & 1 == 0 { Role::Target } else { Role::Initiator };
    let cfg = IserConfig { unsolicited_data_out: ctl & 4 != 0, ..IserConfig::default() };
    let Ok(dm) = IserDatamover::<P>::new(role, cfg, pd, cq, qp) else { return };
    let s = &dm.s;
    s.send_inv.store(ctl & 2 != 0, Ordering::Release);
    // An initiator with two commands in flight, each with a read and a write registration.
    let mut keys = Vec::new();
    if role == Role::Initiator {
        for itt in 1..=2u32 {
            let (Ok(read), Ok(write)) = (
                s.pd.register(vec![0; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE),
                s.pd.register(vec![0; 4096], Access::REMOTE_READ),
            ) else {
                return;
            };
            keys.extend([read.rkey(), write.rkey()]);
            lock(&s.tasks).insert(itt, InitTask { read: Some(read), write: Some(write) });
        }
    }
    for _ in 0..64 {
        let [sel, l0, l1, tail @ ..] = rest else { break };
        let (msg, tail) = tail.split_at(usize::from(u16::from_le_bytes([*l0, *l1])).min(tail.len()));
        rest = tail;
        let invalidated = match sel % 4 {
            0 => None,
            1 | 2 => keys.get(usize::from(sel >> 2) % 4).copied().or(Some(u32::from(*sel))),
            _ => Some(u32::from(*sel) << 8),
        };
        // A message never exceeds the receive buffer it lands in.
        if msg.len() > s.recv_size {
            continue;
        }
        let tasks_before: std::collections::HashSet<u32> = lock(&s.writes).keys().copied().collect();
        let r = s.on_message(msg, invalidated);
        let mut events = s.events_rx.try_lock().expect("events");
        while let Ok(ev) = events.try_recv() {
            if let DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), immediate, .. }) = ev {
                // Immediate data beyond EDTL reaches the target core (which answers it with
                // CHECK CONDITION) without a task: nothing of it is ever written.
                let new_task = lock(&s.writes).contains_key(&c.itt) && !tasks_before.contains(&c.itt);
                assert!(immediate <= c.expected_data_len || !new_task, "a write task for immediate data beyond EDTL");
            }
        }
        drop(events);
        if r.is_err() {
            break;
        }
        for t in lock(&s.writes).values() {
            assert!(t.received as usize <= t.buf.len() && t.buf.len() <= crate::MAX_TASK_BUFFER);
        }
        // A remote invalidation accepted by the initiator named a key of the task it came with.
        if let (Role::Initiator, Some(k)) = (role, invalidated) {
            assert!(s.send_inv.load(Ordering::Acquire) && keys.contains(&k), "invalidation of {k:#x} accepted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_iscsi::wire::{AsyncMessage, NopIn, NopOut};

    #[test]
    fn the_send_queue_holds_what_the_settings_can_leave_in_it() {
        let d = IserConfig::default();
        assert_eq!((caps(&d).max_send_wr, signal_interval(&d)), (528, DEFAULT_SIGNAL_EVERY));
        // Too shallow a queue is raised to two entries per receive plus 16; an interval longer
        // than a quarter of the queue is shortened (unsignaled requests keep their entries).
        let c = IserConfig { send_depth: Some(16), signal_every: 1000, ..d };
        assert_eq!((caps(&c).max_send_wr, signal_interval(&c)), (272, 68));
        let c = IserConfig { send_depth: Some(4096), signal_every: 0, ..d };
        assert_eq!((caps(&c).max_send_wr, signal_interval(&c)), (4096, 1));
    }

    fn ping(ttt: u32) -> Header {
        Header::NopIn(NopIn { itt: RESERVED_TAG, ttt, ..NopIn::default() })
    }

    /// A region whose buffer cannot be taken back even though the caller holds the only strong
    /// handle: the software RNIC's receive path upgrades its weak handle for a moment whenever
    /// a tagged message names the region's STag, so `Arc::try_unwrap` may fail at any time.
    #[derive(Debug)]
    struct Held(Vec<u8>);

    impl MemoryRegion for Held {
        fn lkey(&self) -> u32 {
            1
        }
        fn rkey(&self) -> u32 {
            1
        }
        fn addr(&self) -> u64 {
            self.0.as_ptr() as u64
        }
        fn len(&self) -> usize {
            self.0.len()
        }
        fn access(&self) -> Access {
            Access::LOCAL_WRITE
        }
        fn read(&self, f: &mut dyn FnMut(&[u8])) {
            f(&self.0)
        }
        fn write(&self, _: &mut dyn FnMut(&mut [u8])) {
            unreachable!("copy_out only reads")
        }
        fn invalidate(&self) {}
        fn rekey(&self) -> riser_verbs::Result<u32> {
            Ok(1)
        }
        fn is_valid(&self) -> bool {
            true
        }
        fn into_buffer(self: Arc<Self>) -> Result<Vec<u8>, Arc<Self>> {
            Err(self)
        }
    }

    /// The bytes of a region that cannot be unwrapped are copied, never lost: the last strong
    /// handle used to be unwrapped without a fallback, and a region held for a moment by the
    /// RNIC came out empty, to be written as the command's data with GOOD status.
    #[test]
    fn a_region_that_cannot_be_unwrapped_is_copied() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let mr = Arc::new(Held(data.clone()));
        assert_eq!(Arc::strong_count(&mr), 1);
        assert_eq!(&copy_out(mr)[..], &data[..]);
    }

    #[test]
    fn at_most_two_unanswered_pings_and_two_async_messages() {
        let mut u = Unexpected::default();
        u.sending(&ping(1)).unwrap();
        u.sending(&ping(2)).unwrap();
        assert_eq!(u.sending(&ping(3)), Err(Violation::TooManyUnexpected { limit: 2 }.into()));
        // A NOP-In answering the initiator's NOP-Out is expected: not counted.
        u.sending(&Header::NopIn(NopIn { itt: 7, ttt: RESERVED_TAG, ..NopIn::default() })).unwrap();
        // An answer to an unknown ping frees nothing; the answer to ping 1 frees one.
        u.received(&Header::NopOut(NopOut { itt: 9, ttt: 5, ..NopOut::default() }));
        assert!(u.sending(&ping(3)).is_err());
        u.received(&Header::NopOut(NopOut { itt: 9, ttt: 1, ..NopOut::default() }));
        u.sending(&ping(3)).unwrap();
        let asyncm = Header::AsyncMessage(AsyncMessage::default());
        u.sending(&asyncm).unwrap();
        u.sending(&asyncm).unwrap();
        assert!(u.sending(&asyncm).is_err());
    }
}
