//! Queue pairs: [`SoftQp`] and the state its engines share ([`QpShared`]), the verbs posted on
//! it, the transmitter's queue, and the one way a stream ends (Terminate, close, flush).

use super::cq::SoftCq;
use super::mr::{Regions, SoftMr, SoftPd};
use super::rx::{RxStream, receive};
use super::tx::{Engine, Gathered, Out, Tx, TxItem, TxOutcome, now, transmit};
use super::{RnicShared, lock, wc};
use crate::wire::{ReadRequest, Term, TerminateMsg};
use riser_verbs::{
    Access, BoxFuture, Error, Established, Invalid, QpCaps, QueuePair, RecvWr, Result, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use std::collections::VecDeque;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tracing::{debug, warn};

/// Where a queue pair is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum QpState {
    Idle,
    Connected,
    /// A Terminate is on its way out; then Error.
    Terminating,
    Error,
}

/// An outstanding RDMA Read this side issued.
#[derive(Debug)]
pub(super) struct PendingRead {
    pub(super) wr_id: u64,
    pub(super) signaled: bool,
    pub(super) sink: Sge,
    pub(super) size: u32,
    pub(super) received: u32,
    /// The ready-to-receive zero-length Read: no completion.
    pub(super) internal: bool,
}

/// How long a Terminate may take to leave before the stream closes without it. It is one small
/// FPDU, written as soon as the transmitter has finished the FPDU it is in, so it only waits
/// this long for a peer that reads nothing (which would not read the Terminate either); the
/// bound keeps such a peer from holding the stream, its threads and its memory open.
const TERMINATE_LINGER: Duration = Duration::from_secs(2);

/// Largest Send or RDMA Write a poster transmits inline (see `SoftQp::post_inline`): what the
/// socket refuses of it is copied. 64 KiB of data and room for the headers in front of it (an
/// iSCSI command with 64 KiB of immediate data is one Send of a little more).
const INLINE_MAX: u64 = (64 << 10) + 1024;

/// Largest Read Response the receiver sends itself (see `QpShared::respond_inline`), beyond
/// which the transmitter does (a hand-off): what the socket refuses of it is copied. 256 KiB: an
/// iSER write of 256 KiB is 64 KiB of immediate data and an RDMA Read of the other 192 KiB, and
/// answering that on the receiver's task took its rate from 0.68× to 0.80× TCP's here (one
/// session, QD 8); 1 MiB writes (960 KiB Reads) showed no difference either way.
const READ_RESPONSE_INLINE_MAX: u64 = 256 << 10;

/// Largest payload of the requests a poster transmits inline together (what riser-iser gathers
/// at most: 320 KiB, room for 256 KiB and one 64 KiB request more).
const INLINE_LIST_MAX: u64 = 320 << 10;

/// The transmitter's queue, counting what it holds (queued or being sent): a poster may only
/// transmit inline while it holds nothing, or it would overtake.
#[derive(Clone, Debug)]
pub(super) struct TxQueue {
    pub(super) items: UnboundedSender<TxItem>,
    pub(super) queued: Arc<AtomicUsize>,
}

impl TxQueue {
    /// Queue `item`; back if the transmitter is gone.
    pub(super) fn send(&self, item: TxItem) -> std::result::Result<(), TxItem> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.items.send(item).map_err(|e| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            e.0
        })
    }
}

/// A queue pair's state, shared by its handle, its transmitter and its receiver.
#[derive(Debug)]
pub(super) struct QpShared {
    pub(super) rnic: Arc<RnicShared>,
    pub(super) pd: u64,
    /// The protection domain's regions, where every STag the stream names is looked up.
    pub(super) regions: Arc<Regions>,
    pub(super) caps: QpCaps,
    pub(super) send_cq: Arc<SoftCq>,
    pub(super) recv_cq: Arc<SoftCq>,
    pub(super) rq: Mutex<VecDeque<RecvWr>>,
    /// A Send takes the receive posted last ([`QueuePair::receives_interchangeable`]).
    pub(super) rq_last_first: AtomicBool,
    pub(super) orq: Mutex<VecDeque<PendingRead>>,
    /// Signals every change that can make room under the ORD (a response, the stream's end).
    pub(super) orq_room: tokio::sync::Notify,
    pub(super) state: Mutex<QpState>,
    pub(super) state_cv: Condvar,
    pub(super) closed: tokio::sync::Notify,
    pub(super) tx: Mutex<Option<TxQueue>>,
    /// Items the transmitter holds (see [`TxQueue`]).
    pub(super) queued: Arc<AtomicUsize>,
    /// The stream's writer and transmit state, taken per item by whoever transmits.
    pub(super) engine: Mutex<Option<Engine>>,
    pub(super) sock: Mutex<Option<TcpStream>>,
    pub(super) established: Mutex<Option<Established>>,
    pub(super) ird: AtomicU32,
    pub(super) ord: AtomicU32,
    /// Inbound reads accepted but not yet answered.
    pub(super) ird_in_use: AtomicU32,
    /// Responder side: nothing may be sent before the initiator's first FPDU (RFC 5044).
    pub(super) may_send: AtomicBool,
    pub(super) may_send_now: tokio::sync::Notify,
    pub(super) terminate_received: Mutex<Option<Term>>,
    pub(super) terminate_sent: Mutex<Option<Term>>,
    /// The Terminate watchdog's thread.
    pub(super) threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Engines (receiver, transmitter: one task) still running, and the signal of each ending.
    pub(super) engines: Mutex<usize>,
    pub(super) engines_cv: Condvar,
    /// The engines run on the RNIC's own runtime (no runtime was current at the start).
    pub(super) own_runtime: AtomicBool,
    /// Active side: where [`Provider::connect`](riser_verbs::Provider::connect) connects to.
    pub(super) dest: Mutex<Option<SocketAddr>>,
}

/// A queue pair of the software RNIC.
#[derive(Debug)]
pub struct SoftQp {
    pub(super) s: Arc<QpShared>,
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
        // Engines on the RNIC's own runtime always make progress: a caller outside any runtime
        // finds them ended when the drop returns, as it found the threads joined. On the
        // caller's runtime they end on their own (waiting for them there could block the
        // very thread that is to run them).
        if self.s.own_runtime.load(Ordering::Acquire) && tokio::runtime::Handle::try_current().is_err() {
            let n = lock(&self.s.engines);
            drop(self.s.engines_cv.wait_while(n, |n| *n > 0).unwrap_or_else(|e| e.into_inner()));
        }
    }
}

impl SoftQp {
    pub(super) fn new(
        rnic: &Arc<RnicShared>,
        pd: &SoftPd,
        send_cq: &Arc<SoftCq>,
        recv_cq: &Arc<SoftCq>,
        caps: QpCaps,
    ) -> Result<Arc<Self>> {
        if !Arc::ptr_eq(rnic, &pd.rnic) {
            return Err(Error::Invalid(Invalid::ForeignObject("protection domain")));
        }
        Ok(Arc::new(Self {
            s: Arc::new(QpShared {
                rnic: rnic.clone(),
                pd: pd.regions.pd,
                regions: pd.regions.clone(),
                caps,
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                rq: Mutex::new(VecDeque::new()),
                rq_last_first: AtomicBool::new(false),
                orq: Mutex::new(VecDeque::new()),
                orq_room: tokio::sync::Notify::new(),
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
                may_send: AtomicBool::new(true),
                may_send_now: tokio::sync::Notify::new(),
                terminate_received: Mutex::new(None),
                terminate_sent: Mutex::new(None),
                threads: Mutex::new(Vec::new()),
                engines: Mutex::new(0),
                engines_cv: Condvar::new(),
                own_runtime: AtomicBool::new(false),
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

    /// Transmit small requests on the caller's thread when the transmitter is idle (a
    /// doorbell without a hand-off). They are framed under the engine lock and written without
    /// blocking (one request straight from its region; several gathered into one buffer, one
    /// write); what the socket does not take at once goes to the transmitter as the next item,
    /// so the stream stays in order and a peer that stops reading can stall only the
    /// transmitter, never the caller. Returns how many of `wrs` were taken, from the front: the
    /// caller queues the rest (a request meeting a local error, a bad key…, is left to the
    /// transmitter's path; nothing of it was framed).
    fn post_inline(&self, wrs: &mut [SendWr]) -> usize {
        // A Read Request is small whatever it reads; the data is placed by the receiver.
        let payload = |wr: &SendWr| match wr.op {
            SendOp::RdmaRead { .. } => 0,
            _ => wr.sg_list.iter().map(|e| u64::from(e.length)).sum::<u64>() + wr.unregistered.as_ref().map_or(0, |b| b.len() as u64),
        };
        let reads = wrs.iter().filter(|wr| matches!(wr.op, SendOp::RdmaRead { .. })).count();
        let small = wrs.iter().all(|wr| payload(wr) <= INLINE_MAX) && wrs.iter().map(payload).sum::<u64>() <= INLINE_LIST_MAX;
        if wrs.is_empty() || !small || !self.s.may_send.load(Ordering::Acquire) {
            return 0;
        }
        let Ok(mut engine) = self.s.engine.try_lock() else { return 0 };
        let Some(Engine { w, tx, gather }) = engine.as_mut() else { return 0 };
        if self.s.queued.load(Ordering::Acquire) != 0 {
            return 0;
        }
        // A read beyond the ORD waits in the transmitter, never here. Only the engine's holder
        // adds to the outbound read queue, so room seen now is still there below.
        if reads > 0 && lock(&self.s.orq).len() + reads > self.s.ord.load(Ordering::Acquire) as usize {
            return 0;
        }
        // Only what the socket refuses is copied, to be sent by the transmitter. A read is
        // completed by the receiver when its response arrives.
        // Room for the payload and each request's FPDU framing (one FPDU each: all are small).
        let room = wrs.iter().map(payload).sum::<u64>() as usize + wrs.len() * 64;
        let mut out = if wrs.len() == 1 {
            Out::NoWait { sock: w, rest: Vec::new() }
        } else {
            let mut g = std::mem::take(gather);
            g.reserve(room);
            Out::Gather(g)
        };
        let mut taken = 0;
        for wr in wrs.iter() {
            // Never stopped half-way: what the socket refused is owed to the stream. Nothing
            // here waits (the writers never do, the ORD room was checked), so one poll
            // finishes it. A request taken is done (its payload is its byte count) or a read
            // (pending: its response completes it).
            match tx.small_now(&self.s, &mut out, wr, &|| false).or_else(|| now(tx.work_request(&self.s, &mut out, wr, &|| false))) {
                Some(TxOutcome::Done(_) | TxOutcome::Pending) => {}
                Some(TxOutcome::LocalError(_) | TxOutcome::Io(_)) | None => break,
            }
            taken += 1;
        }
        if taken == 0 {
            if let Out::Gather(g) = out {
                *gather = g.recycle().unwrap_or_default();
            }
            return 0;
        }
        // Each request's bytes are let go as it is answered for (see `Owed`); the caller
        // discards the requests taken.
        let owed = wrs[..taken].iter_mut().filter(|wr| !matches!(wr.op, SendOp::RdmaRead { .. })).map(|wr| {
            let owed = (Owed::of(wr), payload(wr) as u32);
            wr.unregistered = None;
            owed
        });
        if let Out::Gather(gathered) = out {
            out = Out::NoWait { sock: w, rest: Vec::new() };
            let _ = out.write_gathered_now(&gathered);
            *gather = gathered.recycle().unwrap_or_default();
        }
        let Out::NoWait { rest, .. } = out else { unreachable!("written without waiting above") };
        if rest.is_empty() {
            for (o, n) in owed {
                self.s.complete(o, WcStatus::Success, n);
            }
            return taken;
        }
        let rest = TxItem::Rest { bytes: rest, owed: owed.collect() };
        let refused = match lock(&self.s.tx).as_ref() {
            Some(q) => q.send(rest),
            None => Err(rest),
        };
        if let Err(TxItem::Rest { owed, .. }) = refused {
            // Part of an FPDU went out and the rest cannot follow: the stream is unusable (a
            // read already queued is flushed by the failure).
            drop(engine);
            for (o, _) in owed {
                self.s.complete(o, WcStatus::WrFlushErr, 0);
            }
            self.s.fail();
        }
        taken
    }

    /// Refuse a request the queue pair cannot take at all.
    fn check(&self, wr: &SendWr) -> Result<()> {
        if wr.sg_list.len() > self.s.caps.max_sge as usize {
            return Err(Error::Invalid(Invalid::TooManySge { got: wr.sg_list.len(), max: self.s.caps.max_sge as usize }));
        }
        if matches!(wr.op, SendOp::RdmaRead { .. }) && wr.sg_list.len() != 1 {
            return Err(Error::Invalid(Invalid::ReadSinkCount { got: wr.sg_list.len() }));
        }
        if let Some(b) = &wr.unregistered
            && (!wr.sg_list.is_empty() || matches!(wr.op, SendOp::RdmaRead { .. }) || b.len() > u32::MAX as usize)
        {
            return Err(Error::Invalid(Invalid::UnregisteredPayload { len: b.len(), max: u32::MAX }));
        }
        Ok(())
    }

    /// Queue requests for the transmitter (flushed if the stream is ending).
    /// Queue requests for the transmitter, as many as the send queue has room for: its depth
    /// (`max_send_wr`) counts what the transmitter holds, queued or being sent (and the Read
    /// Responses it owes, IRD at most, beside it). A peer that reads nothing makes the
    /// transmitter stall; without the bound, everything posted meanwhile was kept.
    fn queue(&self, wrs: impl ExactSizeIterator<Item = SendWr>) -> Result<()> {
        let room = self.s.caps.max_send_wr as usize + self.s.ird.load(Ordering::Acquire) as usize;
        if self.s.queued.load(Ordering::Acquire).saturating_add(wrs.len()) > room {
            return Err(Error::Invalid(Invalid::SendQueueFull { depth: self.s.caps.max_send_wr }));
        }
        let tx = lock(&self.s.tx).clone();
        for wr in wrs {
            let refused = match tx.as_ref() {
                Some(q) => q.send(TxItem::Wr(wr)),
                None => Err(TxItem::Wr(wr)),
            };
            if let Err(TxItem::Wr(wr)) = refused {
                self.s.complete_send(wr, WcStatus::WrFlushErr, 0);
            }
        }
        Ok(())
    }

    /// Start the engines on an established stream: the receiver and the transmitter, one task
    /// on the caller's tokio runtime, or on the RNIC's own when no runtime is current.
    pub(super) fn start(&self, stream: TcpStream, crc: bool, responder: bool, est: Established, rtr_write: bool) -> Result<()> {
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(None)?;
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let shut = stream.try_clone()?;
        let (rt, own) = super::engine_runtime()?;
        let sock = {
            let _in = rt.enter();
            Arc::new(tokio::net::TcpStream::from_std(stream)?)
        };
        self.s.ird.store(u32::from(est.ird), Ordering::Release);
        self.s.ord.store(u32::from(est.ord), Ordering::Release);
        *lock(&self.s.established) = Some(est);
        *lock(&self.s.sock) = Some(shut);
        self.s.may_send.store(!responder, Ordering::Release);
        let (items, mut rxq) = unbounded_channel();
        let txq = TxQueue { items, queued: self.s.queued.clone() };
        if rtr_write {
            let _ = txq.send(TxItem::RtrWrite);
        }
        let max_segment = self.s.rnic.config.max_segment.clamp(4, 65516) & !3;
        *lock(&self.s.engine) =
            Some(Engine { w: sock.clone(), tx: Tx { crc, max_segment, msn_send: 0, msn_read: 0 }, gather: Gathered::default() });
        *lock(&self.s.tx) = Some(txq.clone());
        *lock(&self.s.state) = QpState::Connected;
        self.s.own_runtime.store(own, Ordering::Release);
        *lock(&self.s.engines) = 2;
        let (sending, receiving) = (EngineRunning(self.s.clone()), EngineRunning(self.s.clone()));
        let transmitter = async move {
            transmit(&sending.0, &mut rxq).await;
        };
        let receiver = async move {
            let busy_poll = receiving.0.rnic.config.busy_poll;
            receive(&receiving.0, RxStream::socket(sock).busy_poll(busy_poll), crc, &txq).await;
        };
        // One task for both: they take turns on the socket. As two tasks on a multi-threaded
        // runtime they ran at once on two threads, and the receiver's `readv` slept in the
        // kernel for the socket's lock whenever the transmitter's `writev` of a large message
        // held it (a sleep and a wake-up per message, the receiving thread idle meanwhile).
        rt.spawn(async move {
            tokio::join!(transmitter, receiver);
        });
        Ok(())
    }
}

/// Held by an engine while it runs. Its end, however it comes (the engine returned, or the
/// runtime dropped its task), is counted; an engine that ends before the stream did fails the queue
/// pair, so nothing waits for completions that cannot come.
struct EngineRunning(Arc<QpShared>);

impl Drop for EngineRunning {
    fn drop(&mut self) {
        self.0.fail();
        *lock(&self.0.engines) -= 1;
        self.0.engines_cv.notify_all();
    }
}

impl QpShared {
    pub(super) fn state(&self) -> QpState {
        *lock(&self.state)
    }

    /// Answer a validated Read Request on the receiver's task when the transmitter is idle (no
    /// hand-off), counted in `ird_in_use` already: written without blocking, straight from the
    /// region; what the socket does not take at once goes to the transmitter as the next item.
    /// False: not taken, queue it.
    pub(super) fn respond_inline(&self, req: &ReadRequest, src: Option<&Arc<SoftMr>>) -> bool {
        if u64::from(req.size) > READ_RESPONSE_INLINE_MAX || !self.may_send.load(Ordering::Acquire) || self.state() != QpState::Connected {
            return false;
        }
        let Ok(mut engine) = self.engine.try_lock() else { return false };
        let Some(Engine { w, tx, .. }) = engine.as_mut() else { return false };
        if self.queued.load(Ordering::Acquire) != 0 {
            return false;
        }
        let mut out = Out::NoWait { sock: w, rest: Vec::new() };
        let mut freed = false;
        // Never waits, never stops half-way: one poll finishes it.
        let _ = now(tx.read_response(
            &mut out,
            req,
            src,
            &mut || {
                freed = true;
                self.ird_in_use.fetch_sub(1, Ordering::AcqRel);
            },
            &|| false,
        ));
        if !freed {
            self.ird_in_use.fetch_sub(1, Ordering::AcqRel);
        }
        let Out::NoWait { rest, .. } = out else { unreachable!("written without waiting above") };
        if !rest.is_empty() {
            let refused = match lock(&self.tx).as_ref() {
                Some(q) => q.send(TxItem::Rest { bytes: rest, owed: Vec::new() }).is_err(),
                None => true,
            };
            if refused {
                // Part of an FPDU went out and the rest cannot follow: the stream is unusable.
                drop(engine);
                self.fail();
            }
        }
        true
    }

    /// Leave the connected state without a Terminate: close the socket and flush every
    /// outstanding request.
    ///
    /// Once a Terminate is on its way (`Terminating`) this changes nothing (whether it comes
    /// from a disconnect, the queue pair dropped, or the receiver or transmitter meeting an
    /// error): the stream closes right after the Terminate was written, or at
    /// [`TERMINATE_LINGER`] if it cannot be, never before, so the peer learns why it ended.
    pub(super) fn fail(&self) {
        self.close_when(|st| matches!(st, QpState::Idle | QpState::Connected));
    }

    /// Leave the connected state with a Terminate: it goes out through the transmitter, which
    /// then closes the stream (see [`QpShared::fail`]). `failed` completes the request the
    /// error ended (with its error status) once no disconnect can overtake the Terminate any
    /// more, and before anything is flushed, so completions stay in order.
    pub(super) fn terminate(self: &Arc<Self>, t: TerminateMsg, failed: impl FnOnce()) {
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
        self.orq_room.notify_waiters();
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
    pub(super) fn close(&self) {
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

    pub(super) fn may_send_release(&self) {
        self.may_send.store(true, Ordering::Release);
        self.may_send_now.notify_waiters();
    }

    /// Wait until this side may send (see `may_send`).
    pub(super) async fn may_send_wait(&self) {
        loop {
            let mut n = std::pin::pin!(self.may_send_now.notified());
            n.as_mut().enable();
            if self.may_send.load(Ordering::Acquire) {
                return;
            }
            n.await;
        }
    }

    /// Wait until an RDMA Read may go out: fewer than ORD outstanding, or the stream no longer
    /// connected (the request then meets that).
    pub(super) async fn ord_room_wait(&self) {
        loop {
            let mut n = std::pin::pin!(self.orq_room.notified());
            n.as_mut().enable();
            let ord = self.ord.load(Ordering::Acquire) as usize;
            // No ORD at all: the request fails at once (a local error).
            let room = ord == 0 || lock(&self.orq).len() < ord;
            if room || self.state() != QpState::Connected {
                return;
            }
            n.await;
        }
    }

    fn flush_receives(&self) {
        let rq: Vec<RecvWr> = lock(&self.rq).drain(..).collect();
        for wr in rq {
            self.recv_cq.push(wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0));
        }
    }

    /// Complete outstanding reads: the oldest with `head_status` (the read a Terminate was
    /// about), the rest flushed.
    pub(super) fn flush_reads(&self, head_status: Option<WcStatus>) {
        let reads: Vec<PendingRead> = lock(&self.orq).drain(..).collect();
        self.orq_room.notify_waiters();
        for (i, r) in reads.into_iter().enumerate() {
            if r.internal {
                continue;
            }
            let status = if i == 0 { head_status.unwrap_or(WcStatus::WrFlushErr) } else { WcStatus::WrFlushErr };
            self.send_cq.push(wc(r.wr_id, status, WcOpcode::RdmaRead, 0));
        }
    }

    /// Complete a send-queue request, taken by value: it is dropped, and its unregistered
    /// bytes let go, before the completion can be polled (see [`Owed`]).
    pub(super) fn complete_send(&self, wr: SendWr, status: WcStatus, byte_len: u32) {
        let owed = Owed::of(&wr);
        drop(wr);
        self.complete(owed, status, byte_len);
    }

    /// Report what a request is owed (if signaled, or failed).
    pub(super) fn complete(&self, o: Owed, status: WcStatus, byte_len: u32) {
        if status != WcStatus::Success || o.signaled {
            self.send_cq.push(wc(o.wr_id, status, o.opcode, byte_len));
        }
    }

    /// The region an STag names: this stream's protection domain's, else another domain's
    /// (which the access checks then refuse as such), else none.
    pub(super) fn lookup(&self, stag: u32) -> Option<Arc<SoftMr>> {
        self.regions.lookup(stag).or_else(|| self.rnic.lookup_any(stag))
    }

    /// Resolve a local element for an access needing `need`.
    pub(super) fn local(&self, sge: &Sge, need: Access) -> Option<(Arc<SoftMr>, usize)> {
        let mr = self.lookup(sge.lkey)?;
        let off = mr.check(sge.lkey, self.pd, need, sge.addr, u64::from(sge.length)).ok()?;
        Some((mr, off))
    }
}

/// What a send completion needs of its request. The request itself is dropped before its
/// completion is reported, so a consumer that sees the completion owns the request's
/// unregistered bytes again (riser-iser takes its buffers back to a pool on seeing it); the
/// tail of a request begun inline (`TxItem::Rest`) keeps only this.
#[derive(Clone, Copy, Debug)]
pub(super) struct Owed {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
}

impl Owed {
    pub(super) fn of(wr: &SendWr) -> Self {
        let opcode = match wr.op {
            SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            _ => WcOpcode::Send,
        };
        Self { wr_id: wr.wr_id, opcode, signaled: wr.signaled }
    }
}

impl QueuePair for SoftQp {
    fn post_send(&self, mut wr: SendWr) -> Result<()> {
        self.check(&wr)?;
        match self.s.state() {
            QpState::Idle => Err(Error::NotConnected),
            QpState::Connected => {
                // On a runtime the request is queued: the transmitter gathers what the ready
                // tasks post into one write. A poster outside any runtime writes inline.
                if tokio::runtime::Handle::try_current().is_err() && self.post_inline(std::slice::from_mut(&mut wr)) == 1 {
                    return Ok(());
                }
                self.queue([wr].into_iter())
            }
            QpState::Terminating | QpState::Error => {
                self.s.complete_send(wr, WcStatus::WrFlushErr, 0);
                Ok(())
            }
        }
    }

    /// Every request is checked first (an invalid one fails the call and none is posted); then
    /// they are written at once, together, when the transmitter is idle, else queued for it
    /// (it gathers them).
    fn post_send_list(&self, wrs: &mut Vec<SendWr>) -> Result<()> {
        if let Err(e) = wrs.iter().try_for_each(|wr| self.check(wr)) {
            wrs.clear();
            return Err(e);
        }
        match self.s.state() {
            QpState::Idle => {
                wrs.clear();
                Err(Error::NotConnected)
            }
            QpState::Connected => {
                let taken = self.post_inline(wrs);
                wrs.drain(..taken);
                self.queue(wrs.drain(..))
            }
            QpState::Terminating | QpState::Error => {
                for wr in wrs.drain(..) {
                    self.s.complete_send(wr, WcStatus::WrFlushErr, 0);
                }
                Ok(())
            }
        }
    }

    /// Any length: the bytes are written to the stream as they are (referred to, not copied,
    /// when they leave gathered with others).
    fn max_unregistered_payload(&self) -> u32 {
        u32::MAX
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sg_list.len() > self.s.caps.max_sge as usize {
            return Err(Error::Invalid(Invalid::TooManySge { got: wr.sg_list.len(), max: self.s.caps.max_sge as usize }));
        }
        let mut rq = lock(&self.s.rq);
        if rq.len() >= self.s.caps.max_recv_wr as usize {
            return Err(Error::Invalid(Invalid::ReceiveQueueFull { depth: self.s.caps.max_recv_wr }));
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

    fn receives_interchangeable(&self) {
        self.s.rq_last_first.store(true, Ordering::Release);
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
