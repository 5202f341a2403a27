//! The transmit engine: the transmitter (one task with the receiver), which turns work requests and Read Responses
//! into FPDUs written from registered memory, and the non-blocking writer posters use inline.
//! The framing is written once, as futures over an [`Out`]: the transmitter's waits for room in
//! the socket; a poster's and the fuzzer's never wait (driven by [`now`]).

use super::mr::{SoftMr, Storage};
use super::qp::{Owed, PendingRead, QpShared, QpState};
use super::{lock, terminate_for};
use crate::wire::{self, Header, Opcode, QN_READ, QN_SEND, QN_TERMINATE, READ_REQUEST_LEN, ReadRequest, Term, TerminateMsg, UNTAGGED_HDR};
use riser_verbs::{Access, SendOp, SendWr, WcStatus};
use smallvec::{SmallVec, smallvec};
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::debug;

/// Work for the transmitter.
#[derive(Debug)]
pub(super) enum TxItem {
    Wr(SendWr),
    /// The unsent tail of a request begun inline by its poster (see `SoftQp::post_inline`).
    Rest {
        bytes: Vec<u8>,
        /// The completions (with their byte counts) owed once these bytes are out; reads are
        /// not among them (their responses complete them).
        owed: Vec<(Owed, u32)>,
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

/// Poll `f` once: its output if it is ready. For futures that never wait (an [`Out`] other
/// than [`Out::Wait`], a receiver reading from memory — outside a runtime's task, or
/// `unconstrained`: the receiver spends the task's budget, and a spent budget waits).
pub(super) fn now<F: Future>(f: F) -> Option<F::Output> {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// A piece of what one write sends: bytes of the caller's, or a range of the region the
/// write names (read under its lock, never across a wait).
#[derive(Clone, Copy)]
pub(super) enum Piece<'a> {
    Bytes(&'a [u8]),
    Mem(usize, usize),
    /// A request's unregistered payload: gathered by reference from [`REF_MIN`], as a shared
    /// region's bytes are.
    Shared(&'a bytes::Bytes),
}

impl Piece<'_> {
    /// Its length in bytes.
    fn len(&self) -> usize {
        match self {
            Piece::Bytes(b) => b.len(),
            Piece::Mem(_, n) => *n,
            Piece::Shared(b) => b.len(),
        }
    }
}

/// A writer that never waits: `bufs` (no empty one among them) written as far as the socket
/// takes them at once, and whatever did not go out kept in `rest` — all of it once anything is
/// kept (the stream's order).
fn write_or_keep(sock: &TcpStream, rest: &mut Vec<u8>, bufs: &[IoSlice<'_>]) {
    let mut sent = 0;
    while rest.is_empty() && !bufs.is_empty() {
        match sock.try_write_vectored(bufs) {
            Ok(n) => {
                sent = n;
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Would block, or broken: everything is left to the transmitter.
            Err(_) => break,
        }
    }
    // Keep whatever did not go out.
    for b in bufs {
        if sent >= b.len() {
            sent -= b.len();
            continue;
        }
        rest.extend_from_slice(&b[sent..]);
        sent = 0;
    }
}

/// Where FPDUs go.
pub(super) enum Out<'a> {
    /// The transmitter: all of it, waiting for room in the socket as long as it takes.
    Wait(&'a TcpStream),
    /// A poster: what the socket takes at once, the rest (and everything after it, in order)
    /// kept in `rest` for the transmitter. It never waits and never fails: a broken socket
    /// leaves everything to the transmitter, which meets the error.
    NoWait { sock: &'a TcpStream, rest: Vec<u8> },
    /// Memory: FPDUs gathered to leave in one write (see [`transmit`]).
    Gather(Gathered),
    /// Nowhere (fuzzing).
    Sink,
}

/// Payload of a shared region from which gathering refers to it rather than copying it.
const REF_MIN: usize = 2 << 10;

/// Slices a gathered write may have at most (IOV_MAX is 1024).
const GATHER_SLICES: usize = 512;

/// FPDUs gathered in memory to leave in one write: framing and small payloads copied into
/// `buf`; larger payloads of shared regions (immutable bytes, see
/// `ProtectionDomain::register_shared`) referred to where they lie, each at an offset of `buf`.
#[derive(Debug, Default)]
pub(super) struct Gathered {
    buf: Vec<u8>,
    refs: Vec<(usize, bytes::Bytes)>,
    total: usize,
}

impl Gathered {
    /// Room for `n` more bytes of framing and copied payload.
    pub(super) fn reserve(&mut self, n: usize) {
        self.buf.reserve(n);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Whether it should be written now: large enough, or as many slices as one write takes.
    fn full(&self) -> bool {
        self.total >= GATHER_MAX || 2 * self.refs.len() + 1 >= GATHER_SLICES
    }

    /// What to write, in order, as the slices of one vectored write (empty ones left out):
    /// what [`pieces`](Self::pieces) holds, without a list of pieces in between (a writer that
    /// does not wait for the socket takes these at once).
    pub(super) fn io_slices(&self) -> SmallVec<[IoSlice<'_>; 32]> {
        let mut out = SmallVec::with_capacity(2 * self.refs.len() + 1);
        let mut at = 0;
        for (off, b) in &self.refs {
            if *off > at {
                out.push(IoSlice::new(&self.buf[at..*off]));
            }
            if !b.is_empty() {
                out.push(IoSlice::new(b));
            }
            at = *off;
        }
        if self.buf.len() > at {
            out.push(IoSlice::new(&self.buf[at..]));
        }
        out
    }

    /// What to write, in order.
    pub(super) fn pieces(&self) -> Vec<Piece<'_>> {
        let mut out = Vec::with_capacity(2 * self.refs.len() + 1);
        let mut at = 0;
        for (off, b) in &self.refs {
            out.push(Piece::Bytes(&self.buf[at..*off]));
            out.push(Piece::Bytes(b));
            at = *off;
        }
        out.push(Piece::Bytes(&self.buf[at..]));
        out
    }

    /// Empty again (the framing buffer's memory kept), or `None` when it grew beyond what is
    /// worth keeping.
    pub(super) fn recycle(mut self) -> Option<Self> {
        (self.buf.capacity() <= SPARE_MAX).then(|| {
            self.buf.clear();
            self.refs.clear();
            self.total = 0;
            self
        })
    }

    /// One FPDU of a connection without CRC, framed where it is gathered: the length field
    /// and `header` (after it), the payload (copied or referred to, as [`Gathered::add`] does),
    /// then pad and the CRC field (zero). The bytes [`Framing`] gives, without its copies.
    fn fpdu(&mut self, header: &[u8], mem: Option<&SoftMr>, payload: Piece<'_>) {
        let mpa_len = header.len() + payload.len();
        self.buf.extend_from_slice(&(mpa_len as u16).to_be_bytes());
        self.buf.extend_from_slice(header);
        self.total += 2 + header.len();
        self.add(mem, &[payload]);
        let tail = wire::fpdu_pad(mpa_len) + 4;
        self.buf.extend_from_slice(&[0u8; 7][..tail]);
        self.total += tail;
    }

    /// Add `pieces` (`Piece::Mem` ranges of `mem`).
    fn add(&mut self, mem: Option<&SoftMr>, pieces: &[Piece<'_>]) {
        let guard = mem.map(|m| m.locked());
        for p in pieces {
            match (*p, guard.as_deref()) {
                (Piece::Bytes(b), _) => {
                    self.buf.extend_from_slice(b);
                    self.total += b.len();
                }
                (Piece::Shared(b), _) if b.len() >= REF_MIN => {
                    self.refs.push((self.buf.len(), b.clone()));
                    self.total += b.len();
                }
                (Piece::Shared(b), _) => {
                    self.buf.extend_from_slice(b);
                    self.total += b.len();
                }
                (Piece::Mem(off, n), Some(Storage::Shared(b))) if n >= REF_MIN => {
                    self.refs.push((self.buf.len(), b.slice(off..off + n)));
                    self.total += n;
                }
                (Piece::Mem(off, n), Some(m)) => {
                    self.buf.extend_from_slice(&m[off..off + n]);
                    self.total += n;
                }
                (Piece::Mem(..), None) => {}
            }
        }
    }
}

impl Out<'_> {
    /// [`write`](Self::write) for the writers that never wait (all but [`Out::Wait`], for which
    /// it is `None`), without a future.
    pub(super) fn write_now(&mut self, mem: Option<&SoftMr>, pieces: &[Piece<'_>]) -> Option<io::Result<()>> {
        match self {
            Out::Wait(_) => None,
            Out::Sink => Some(Ok(())),
            Out::Gather(g) => {
                g.add(mem, pieces);
                Some(Ok(()))
            }
            Out::NoWait { sock, rest } => {
                let guard = mem.map(|m| m.locked());
                let bufs: SmallVec<[IoSlice<'_>; 48]> = pieces
                    .iter()
                    .map(|p| match *p {
                        Piece::Bytes(b) => b,
                        Piece::Shared(b) => &b[..],
                        Piece::Mem(off, n) => guard.as_deref().map_or(&[][..], |m| &m[off..off + n]),
                    })
                    .filter(|b| !b.is_empty())
                    .map(IoSlice::new)
                    .collect();
                write_or_keep(sock, rest, &bufs);
                Some(Ok(()))
            }
        }
    }

    /// [`write_now`](Self::write_now) of what was gathered.
    pub(super) fn write_gathered_now(&mut self, g: &Gathered) -> Option<io::Result<()>> {
        match self {
            Out::NoWait { sock, rest } => {
                write_or_keep(sock, rest, &g.io_slices());
                Some(Ok(()))
            }
            _ => self.write_now(None, &g.pieces()),
        }
    }

    /// Write `pieces` (`Piece::Mem` ranges of `mem`) in order, all of them.
    pub(super) async fn write(&mut self, mem: Option<&SoftMr>, pieces: &[Piece<'_>]) -> io::Result<()> {
        if let Some(r) = self.write_now(mem, pieces) {
            return r;
        }
        let total: usize = pieces.iter().map(Piece::len).sum();
        let mut done = 0;
        while done < total {
            let r = {
                let guard = mem.map(|m| m.locked());
                let mut skip = done;
                let mut bufs: SmallVec<[IoSlice<'_>; 48]> = SmallVec::with_capacity(pieces.len());
                for p in pieces {
                    let b: &[u8] = match *p {
                        Piece::Bytes(b) => b,
                        Piece::Shared(b) => &b[..],
                        Piece::Mem(off, n) => guard.as_deref().map_or(&[][..], |m| &m[off..off + n]),
                    };
                    if skip >= b.len() {
                        skip -= b.len();
                        continue;
                    }
                    bufs.push(IoSlice::new(&b[skip..]));
                    skip = 0;
                }
                match self {
                    Out::Wait(sock) => sock.try_write_vectored(&bufs),
                    _ => unreachable!("only the transmitter's writer waits (`write_now` took the others)"),
                }
            };
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Out::Wait(sock) = self {
                        sock.writable().await?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// What writes to the stream: the transmitter, or a poster sending inline.
#[derive(Debug)]
pub(super) struct Engine {
    pub(super) w: Arc<TcpStream>,
    pub(super) tx: Tx,
    /// A poster's gathering buffer, empty, kept from one list to the next.
    pub(super) gather: Gathered,
}

/// An FPDU's framing around its payload: the length field and the header before it, pad and
/// CRC after it.
struct Framing {
    head: [u8; 2 + UNTAGGED_HDR + READ_REQUEST_LEN + 8],
    head_len: usize,
    tail: [u8; 7],
    tail_len: usize,
}

impl Framing {
    /// Frame `payload` (`Piece::Mem` of `mem`) behind `header` (after the length field).
    fn new(crc: bool, header: &[u8], mem: Option<&SoftMr>, payload: Piece<'_>) -> Self {
        let plen = payload.len();
        let mpa_len = header.len() + plen;
        let mut f = Self { head: [0; 2 + UNTAGGED_HDR + READ_REQUEST_LEN + 8], head_len: 2 + header.len(), tail: [0; 7], tail_len: 0 };
        f.head[..2].copy_from_slice(&(mpa_len as u16).to_be_bytes());
        f.head[2..f.head_len].copy_from_slice(header);
        let pad = wire::fpdu_pad(mpa_len);
        f.tail_len = pad + 4;
        if crc {
            let sum = {
                let guard = mem.map(|m| m.locked());
                let body: &[u8] = match payload {
                    Piece::Bytes(b) => b,
                    Piece::Shared(b) => b,
                    Piece::Mem(off, n) => guard.as_deref().map_or(&[][..], |m| &m[off..off + n]),
                };
                wire::fpdu_crc(&[&f.head[..f.head_len], body, &f.tail[..pad]])
            };
            f.tail[pad..pad + 4].copy_from_slice(&sum);
        }
        f
    }

    /// The FPDU's pieces: framing, payload, framing.
    fn around<'a>(&'a self, payload: Piece<'a>) -> [Piece<'a>; 3] {
        [Piece::Bytes(&self.head[..self.head_len]), payload, Piece::Bytes(&self.tail[..self.tail_len])]
    }
}

/// One FPDU: header (after the length field), the payload (`Piece::Mem` of `mem`), then pad
/// and CRC.
async fn send_fpdu(w: &mut Out<'_>, crc: bool, header: &[u8], mem: Option<&SoftMr>, payload: Piece<'_>) -> io::Result<()> {
    let f = Framing::new(crc, header, mem, payload);
    w.write(mem, &f.around(payload)).await
}

/// Send one item of the transmit queue.
async fn transmit_item(s: &Arc<QpShared>, engine: &mut Engine, item: TxItem) {
    let state = s.state();
    let Engine { w, tx, .. } = engine;
    let w = &mut Out::Wait(w);
    match item {
        TxItem::Stop => {}
        TxItem::Terminate(t) => {
            let h = Header::Untagged { op: Opcode::Terminate, last: true, inv_stag: 0, qn: QN_TERMINATE, msn: 1, mo: 0 };
            let mut hb = [0u8; UNTAGGED_HDR];
            h.emit(&mut hb);
            let body = t.emit();
            let _ = send_fpdu(w, tx.crc, &hb, None, Piece::Bytes(&body)).await;
            // Only now, with the Terminate handed to TCP ahead of the FIN, may the stream close.
            s.close();
        }
        TxItem::Wr(_) if state != QpState::Connected => flush_item(s, item),
        // The tail of an FPDU begun inline is written even when a Terminate follows it, or the
        // Terminate would land inside that FPDU and the peer could not parse it.
        TxItem::Rest { .. } if state == QpState::Error => flush_item(s, item),
        TxItem::Rest { bytes, owed } => match w.write(None, &[Piece::Bytes(&bytes)]).await {
            Ok(()) => {
                for (o, n) in owed {
                    s.complete(o, WcStatus::Success, n);
                }
            }
            Err(e) => {
                debug!("iwarp transmit: {e}");
                for (o, _) in owed {
                    s.complete(o, WcStatus::WrFlushErr, 0);
                }
                s.fail();
            }
        },
        TxItem::Wr(wr) => match tx.work_request(s, w, &wr, &|| s.state() != QpState::Connected).await {
            TxOutcome::Done(n) => s.complete_send(wr, WcStatus::Success, n),
            TxOutcome::Pending => {}
            TxOutcome::LocalError(st) => {
                // A local protection error moves the queue pair to the error state.
                s.terminate(terminate_for(Term::RDMAP_CATASTROPHIC), || s.complete_send(wr, st, 0));
            }
            TxOutcome::Io(e) => {
                debug!("iwarp transmit: {e}");
                s.complete_send(wr, WcStatus::WrFlushErr, 0);
                s.fail();
            }
        },
        TxItem::ReadResponse { .. } | TxItem::RtrWrite if state != QpState::Connected => {}
        TxItem::ReadResponse { req, src } => {
            let mut freed = false;
            let r = tx
                .read_response(
                    w,
                    &req,
                    src.as_ref(),
                    &mut || {
                        freed = true;
                        s.ird_in_use.fetch_sub(1, Ordering::AcqRel);
                    },
                    &|| s.state() != QpState::Connected,
                )
                .await;
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
            if send_fpdu(w, tx.crc, &hb, None, Piece::Bytes(&[])).await.is_err() {
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
pub(super) struct Tx {
    pub(super) crc: bool,
    pub(super) max_segment: usize,
    pub(super) msn_send: u32,
    pub(super) msn_read: u32,
}

/// What became of a work request the transmitter took.
pub(super) enum TxOutcome {
    Done(u32),
    /// An RDMA Read is on its way; the receiver completes it.
    Pending,
    LocalError(WcStatus),
    Io(io::Error),
}

/// Largest request the transmitter gathers with others (payload bytes; a Read Request and a
/// Read Response count by what they read), unless its payload is one piece of a shared region
/// (gathered by reference, see [`Gathered`]).
const GATHER_ITEM_MAX: u64 = 16 << 10;

/// What the transmitter gathers at most before it writes.
const GATHER_MAX: usize = 256 << 10;

/// Largest gathering buffer the transmitter keeps for the next write (a queue pair idle after
/// a burst holds no more than this).
const SPARE_MAX: usize = 64 << 10;

/// Whether `item` may be gathered: small, on a connected stream, and (a Read Request) with room
/// under the ORD now (only the engine's holder adds to the outbound read queue).
fn gatherable(s: &QpShared, item: &TxItem) -> bool {
    if s.state() != QpState::Connected {
        return false;
    }
    match item {
        TxItem::Wr(wr) => match wr.op {
            SendOp::RdmaRead { .. } => {
                let ord = s.ord.load(Ordering::Acquire) as usize;
                lock(&s.orq).len() < ord
            }
            // Unregistered bytes are gathered by reference, as a shared region's.
            _ if wr.unregistered.is_some() => true,
            _ => match wr.sg_list.as_slice() {
                // One large piece is gathered by reference when its region is shared.
                [sge] if u64::from(sge.length) > GATHER_ITEM_MAX => s.local(sge, Access::empty()).is_some_and(|(mr, _)| mr.is_shared()),
                sges => sges.iter().map(|e| u64::from(e.length)).sum::<u64>() <= GATHER_ITEM_MAX,
            },
        },
        TxItem::ReadResponse { req, src } => u64::from(req.size) <= GATHER_ITEM_MAX || src.as_ref().is_some_and(|mr| mr.is_shared()),
        TxItem::RtrWrite => true,
        _ => false,
    }
}

/// Why gathering stopped at an item: what to do once what was gathered before it has left.
enum Halt {
    /// A local protection or length error: the request completes with it, a Terminate follows.
    Local(SendWr, WcStatus),
    /// The stream is ending: the request (if it has a completion) is flushed.
    Ended(Option<SendWr>),
}

/// Frame a gatherable item into `out` (a [`Out::Gather`]): the completion it is owed once
/// written, if any.
async fn gather_item(s: &Arc<QpShared>, tx: &mut Tx, out: &mut Out<'_>, item: TxItem) -> Result<Option<(SendWr, u32)>, Halt> {
    let stop = &|| s.state() != QpState::Connected;
    match item {
        TxItem::Wr(wr) => match match tx.small_now(s, out, &wr, stop) {
            Some(done) => done,
            None => tx.work_request(s, out, &wr, stop).await,
        } {
            TxOutcome::Done(n) => Ok(Some((wr, n))),
            TxOutcome::Pending => Ok(None),
            TxOutcome::LocalError(st) => Err(Halt::Local(wr, st)),
            TxOutcome::Io(_) => Err(Halt::Ended(Some(wr))),
        },
        TxItem::ReadResponse { req, src } => {
            let mut freed = false;
            let r = tx
                .read_response(
                    out,
                    &req,
                    src.as_ref(),
                    &mut || {
                        freed = true;
                        s.ird_in_use.fetch_sub(1, Ordering::AcqRel);
                    },
                    stop,
                )
                .await;
            if !freed {
                s.ird_in_use.fetch_sub(1, Ordering::AcqRel);
            }
            r.map(|()| None).map_err(|_| Halt::Ended(None))
        }
        TxItem::RtrWrite => {
            let mut hb = [0u8; 14];
            Header::Tagged { op: Opcode::Write, last: true, stag: 1, to: 0 }.emit(&mut hb);
            send_fpdu(out, tx.crc, &hb, None, Piece::Bytes(&[])).await.map(|()| None).map_err(|_| Halt::Ended(None))
        }
        // Not gatherable (see `gatherable`).
        other => {
            flush_item(s, other);
            Ok(None)
        }
    }
}

/// The transmitter: send the queued items in order until told to stop, then flush what
/// is left. Small requests are gathered: once the runtime's ready tasks have run (each may
/// post), every small item queued is framed into one buffer that leaves in one write, and
/// their completions follow it; anything else is written straight from its region.
pub(super) async fn transmit(s: &Arc<QpShared>, items: &mut UnboundedReceiver<TxItem>) {
    let mut held = None;
    // The gathering buffer, kept from one write to the next.
    let mut spare: Option<Gathered> = None;
    loop {
        let item = match held.take() {
            Some(item) => item,
            None => match items.recv().await {
                Some(item) => item,
                None => break,
            },
        };
        // The responder waits for the initiator's first FPDU before sending anything.
        s.may_send_wait().await;
        // An RDMA Read beyond the ORD waits for a response (or the stream's end), in order.
        if let TxItem::Wr(SendWr { op: SendOp::RdmaRead { .. }, .. }) = &item {
            s.ord_room_wait().await;
        }
        let stop = matches!(item, TxItem::Stop);
        // The engine is taken for the item (a poster finding it gone queues its request).
        let taken = lock(&s.engine).take();
        let Some(mut engine) = taken else {
            flush_item(s, item);
            s.queued.fetch_sub(1, Ordering::AcqRel);
            if stop {
                break;
            }
            continue;
        };
        let mut count = 1;
        if gatherable(s, &item) {
            tokio::task::yield_now().await;
            let mut out = Out::Gather(spare.take().unwrap_or_default());
            let mut owed = Vec::new();
            let mut halt = None;
            let mut next = Some(item);
            while let Some(item) = next.take() {
                match gather_item(s, &mut engine.tx, &mut out, item).await {
                    Ok(c) => owed.extend(c),
                    Err(h) => {
                        halt = Some(h);
                        break;
                    }
                }
                if matches!(&out, Out::Gather(g) if g.full()) {
                    break;
                }
                match items.try_recv() {
                    Ok(item) if gatherable(s, &item) => {
                        count += 1;
                        next = Some(item);
                    }
                    Ok(item) => held = Some(item),
                    Err(_) => {}
                }
            }
            let Out::Gather(gathered) = out else { unreachable!("gathering into memory") };
            let written = gathered.is_empty() || Out::Wait(&engine.w).write(None, &gathered.pieces()).await.is_ok();
            spare = gathered.recycle();
            // Counted down before their completions: a request the consumer has seen complete
            // no longer holds a place in the send queue (a post right after polling it found
            // the queue full). The engine is still out, so no poster writes inline meanwhile.
            s.queued.fetch_sub(count, Ordering::AcqRel);
            let status = if written { WcStatus::Success } else { WcStatus::WrFlushErr };
            for (wr, n) in owed {
                s.complete_send(wr, status, if written { n } else { 0 });
            }
            if !written {
                s.fail();
            }
            match halt {
                Some(Halt::Local(wr, st)) => s.terminate(terminate_for(Term::RDMAP_CATASTROPHIC), || s.complete_send(wr, st, 0)),
                Some(Halt::Ended(wr)) => {
                    if let Some(wr) = wr {
                        s.complete_send(wr, WcStatus::WrFlushErr, 0);
                    }
                    s.fail();
                }
                None => {}
            }
        } else {
            // As above: counted down before it completes, the engine still out.
            s.queued.fetch_sub(count, Ordering::AcqRel);
            transmit_item(s, &mut engine, item).await;
        }
        // Back: a poster seeing nothing queued may write inline now.
        *lock(&s.engine) = Some(engine);
        if stop {
            break;
        }
    }
    // Whatever is still queued is flushed.
    if let Some(item) = held {
        s.queued.fetch_sub(1, Ordering::AcqRel);
        flush_item(s, item);
    }
    items.close();
    while let Ok(item) = items.try_recv() {
        s.queued.fetch_sub(1, Ordering::AcqRel);
        flush_item(s, item);
    }
}

/// A request the transmitter will not send completes as flushed; the tail of a read begun
/// inline does not (the read is in the outbound read queue, flushed with it).
fn flush_item(s: &QpShared, item: TxItem) {
    match item {
        TxItem::Wr(wr) => s.complete_send(wr, WcStatus::WrFlushErr, 0),
        TxItem::Rest { owed, .. } => owed.into_iter().for_each(|(o, _)| s.complete(o, WcStatus::WrFlushErr, 0)),
        _ => {}
    }
}

/// What asks, between FPDUs, whether to abandon the message (a Terminate is waiting).
type Stop<'a> = &'a (dyn Fn() -> bool + Sync);

/// A request's local elements resolved (region, offset, length): inline for the one or two a
/// request mostly has (no allocation per request).
type Sources = SmallVec<[(Arc<SoftMr>, usize, usize); 2]>;

impl Tx {
    /// A Send's RDMAP opcode, the key it invalidates (0: none) and its MSN, the next on the
    /// Send queue.
    fn next_send(&mut self, op: SendOp) -> (Opcode, u32, u32) {
        let (op, inv) = match op {
            SendOp::SendWithInvalidate { rkey } => (Opcode::SendInvalidate, rkey),
            SendOp::SendWithSolicitedEvent => (Opcode::SendSe, 0),
            SendOp::SendWithSolicitedEventInvalidate { rkey } => (Opcode::SendSeInvalidate, rkey),
            _ => (Opcode::Send, 0),
        };
        self.msn_send = self.msn_send.wrapping_add(1);
        (op, inv, self.msn_send)
    }

    /// The common request framed at once, without the general path's futures: an RDMA Write or
    /// a Send of any kind whose payload is at most one local element and fits one FPDU, written
    /// to a writer that never waits (`None`: not such a request, or `w` is the transmitter's
    /// writer; [`Tx::work_request`] takes it). The same checks, numbering and FPDU as there,
    /// and as there `stop` true abandons a message with payload before its FPDU.
    pub(super) fn small_now(&mut self, s: &QpShared, w: &mut Out<'_>, wr: &SendWr, stop: Stop<'_>) -> Option<TxOutcome> {
        if matches!(w, Out::Wait(_)) || matches!(wr.op, SendOp::RdmaRead { .. }) || wr.sg_list.len() > 1 {
            return None;
        }
        if wr.sg_list.first().is_some_and(|sge| sge.length as usize > self.max_segment)
            || wr.unregistered.as_ref().is_some_and(|b| b.len() > self.max_segment)
        {
            return None;
        }
        let source = match wr.sg_list.first() {
            Some(sge) => match s.local(sge, Access::empty()) {
                Some((mr, off)) => Some((mr, off, sge.length as usize)),
                None => return Some(TxOutcome::LocalError(WcStatus::LocalProtErr)),
            },
            None => None,
        };
        let unregistered = wr.unregistered.as_ref().filter(|b| !b.is_empty());
        if (source.as_ref().is_some_and(|(_, _, len)| *len > 0) || unregistered.is_some()) && stop() {
            return Some(TxOutcome::Io(stopped()));
        }
        let header = match wr.op {
            SendOp::RdmaWrite { remote_addr, rkey } => Header::Tagged { op: Opcode::Write, last: true, stag: rkey, to: remote_addr },
            op => {
                let (op, inv, msn) = self.next_send(op);
                Header::Untagged { op, last: true, inv_stag: inv, qn: QN_SEND, msn, mo: 0 }
            }
        };
        let mut hb = [0u8; UNTAGGED_HDR];
        let n = header.emit(&mut hb);
        let (mem, payload) = match (&source, unregistered) {
            (Some((mr, off, len)), _) => (Some(&**mr), Piece::Mem(*off, *len)),
            (None, Some(b)) => (None, Piece::Shared(b)),
            (None, None) => (None, Piece::Bytes(&[])),
        };
        if let (Out::Gather(g), false) = (&mut *w, self.crc) {
            g.fpdu(&hb[..n], mem, payload);
            return Some(TxOutcome::Done(payload.len() as u32));
        }
        let f = Framing::new(self.crc, &hb[..n], mem, payload);
        let r = w.write_now(mem, &f.around(payload))?;
        Some(match r {
            Ok(()) => TxOutcome::Done(payload.len() as u32),
            Err(e) => TxOutcome::Io(e),
        })
    }

    /// Transmit one work request. `stop` is asked between FPDUs: true ends the message there
    /// (a Terminate is waiting; the transmitter's work is flushed anyway). An RDMA Read needs
    /// room under the ORD, which the caller made sure of.
    pub(super) async fn work_request(&mut self, s: &QpShared, w: &mut Out<'_>, wr: &SendWr, stop: Stop<'_>) -> TxOutcome {
        let need = if matches!(wr.op, SendOp::RdmaRead { .. }) { Access::LOCAL_WRITE } else { Access::empty() };
        let mut sources: Sources = SmallVec::with_capacity(wr.sg_list.len());
        for sge in &wr.sg_list {
            match s.local(sge, need) {
                Some((mr, off)) => sources.push((mr, off, sge.length as usize)),
                None => return TxOutcome::LocalError(WcStatus::LocalProtErr),
            }
        }
        if let Some(b) = wr.unregistered.as_ref().filter(|b| !b.is_empty()) {
            sources.push((SoftMr::detached(b.clone(), &s.regions), 0, b.len()));
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
                return self.read_request(s, w, wr, remote_addr, rkey).await;
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                let header = |off: u64, last| Header::Tagged { op: Opcode::Write, last, stag: rkey, to: remote_addr.wrapping_add(off) };
                self.stream_out(w, &sources, header, &mut || {}, stop).await
            }
            op => {
                let (op, inv, msn) = self.next_send(op);
                self.stream_out(
                    w,
                    &sources,
                    |off, last| Header::Untagged { op, last, inv_stag: inv, qn: QN_SEND, msn, mo: off as u32 },
                    &mut || {},
                    stop,
                )
                .await
            }
        };
        match r {
            Ok(()) => TxOutcome::Done(total as u32),
            Err(e) => TxOutcome::Io(e),
        }
    }

    /// Send the gathered `sources` as one DDP message, segment by segment; `before_last` runs
    /// just before the final segment goes out; `stop` true between segments abandons the rest.
    async fn stream_out(
        &self,
        w: &mut Out<'_>,
        sources: &[(Arc<SoftMr>, usize, usize)],
        header: impl Fn(u64, bool) -> Header,
        before_last: &mut (dyn FnMut() + Send),
        stop: Stop<'_>,
    ) -> io::Result<()> {
        let total: usize = sources.iter().map(|(_, _, n)| n).sum();
        let mut hb = [0u8; UNTAGGED_HDR];
        if total == 0 {
            before_last();
            let n = header(0, true).emit(&mut hb);
            return send_fpdu(w, self.crc, &hb[..n], None, Piece::Bytes(&[])).await;
        }
        if let [(mr, off, len)] = sources {
            return self.stream_region(w, mr, *off, *len, header, before_last, stop).await;
        }
        // Several elements (headers in one region, data in another): the message's FPDUs are
        // gathered (framing and small or private pieces copied, large pieces of shared regions
        // referred to) and leave in one write per `GATHER_MAX`, or join the caller's gathering.
        let into_caller = matches!(w, Out::Gather(_));
        let mut own = Gathered::default();
        let (mut sent, mut i, mut within) = (0usize, 0usize, 0usize);
        while sent < total {
            if stop() {
                return Err(stopped());
            }
            let seg = (total - sent).min(self.max_segment);
            let last = sent + seg == total;
            if last {
                before_last();
            }
            let g = match w {
                Out::Gather(g) => &mut *g,
                _ => &mut own,
            };
            // The MPA length, then the DDP/RDMAP header (tagged or untagged).
            let mut head = [0u8; 2 + UNTAGGED_HDR];
            let n = header(sent as u64, last).emit(&mut head[2..]);
            head[..2].copy_from_slice(&((n + seg) as u16).to_be_bytes());
            let head = &head[..2 + n];
            let mut crc = self.crc.then(|| crc32c::crc32c(head));
            g.add(None, &[Piece::Bytes(head)]);
            let mut need = seg;
            while need > 0 {
                // Skip empty (or used up) elements.
                while sources[i].2 == within {
                    i += 1;
                    within = 0;
                }
                let (mr, off, len) = &sources[i];
                let take = (len - within).min(need);
                if let Some(c) = crc.as_mut() {
                    *c = crc32c::crc32c_append(*c, &mr.locked()[off + within..off + within + take]);
                }
                g.add(Some(mr), &[Piece::Mem(off + within, take)]);
                need -= take;
                within += take;
            }
            let pad = wire::fpdu_pad(n + seg);
            let mut tail = [0u8; 7];
            if let Some(c) = crc {
                let c = crc32c::crc32c_append(c, &tail[..pad]);
                tail[pad..pad + 4].copy_from_slice(&c.to_le_bytes());
            }
            g.add(None, &[Piece::Bytes(&tail[..pad + 4])]);
            sent += seg;
            if !into_caller && (own.full() || last) {
                w.write(None, &own.pieces()).await?;
                own = own.recycle().unwrap_or_default();
            }
        }
        Ok(())
    }

    /// Send `len` bytes of `mr` from `off` (one contiguous piece) as one DDP message: up to 16
    /// FPDUs per vectored write, payload straight from the region; `stop` is asked before each
    /// write.
    #[allow(clippy::too_many_arguments)]
    async fn stream_region(
        &self,
        w: &mut Out<'_>,
        mr: &SoftMr,
        base: usize,
        total: usize,
        header: impl Fn(u64, bool) -> Header,
        before_last: &mut (dyn FnMut() + Send),
        stop: Stop<'_>,
    ) -> io::Result<()> {
        const BATCH: usize = 16;
        // Room for the FPDUs of one write, inline (only `room` of them written): a 64 KiB
        // message is two FPDUs, and with room for one these took four allocations per message.
        let room = total.div_ceil(self.max_segment).min(BATCH);
        let mut sent = 0usize;
        let mut heads: SmallVec<[[u8; 2 + UNTAGGED_HDR]; BATCH]> = smallvec![[0u8; 2 + UNTAGGED_HDR]; room];
        let mut tails: SmallVec<[[u8; 7]; BATCH]> = smallvec![[0u8; 7]; room];
        let mut frames: SmallVec<[(usize, usize, usize, usize); BATCH]> = smallvec![(0, 0, 0, 0); room];
        while sent < total {
            // Between writes the stream is at an FPDU boundary: the only place to stop.
            if stop() {
                return Err(stopped());
            }
            let mut n = 0;
            let mut at = sent;
            {
                // The region is read here only for the CRC.
                let mem = self.crc.then(|| mr.locked());
                while n < room && at < total {
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
                    let sum = match &mem {
                        Some(m) => wire::fpdu_crc(&[&heads[n][..2 + hl], &m[base + at..base + at + seg], &tails[n][..pad]]),
                        None => [0; 4],
                    };
                    tails[n][pad..pad + 4].copy_from_slice(&sum);
                    frames[n] = (2 + hl, at, seg, pad + 4);
                    at += seg;
                    n += 1;
                }
            }
            let mut pieces: SmallVec<[Piece<'_>; 3 * BATCH]> = SmallVec::with_capacity(3 * n);
            for (k, &(hl, off, seg, tl)) in frames[..n].iter().enumerate() {
                pieces.push(Piece::Bytes(&heads[k][..hl]));
                pieces.push(Piece::Mem(base + off, seg));
                pieces.push(Piece::Bytes(&tails[k][..tl]));
            }
            w.write(Some(mr), &pieces).await?;
            sent = at;
        }
        Ok(())
    }

    async fn read_request(&mut self, s: &QpShared, w: &mut Out<'_>, wr: &SendWr, remote_addr: u64, rkey: u32) -> TxOutcome {
        let sink = wr.sg_list[0];
        {
            let mut orq = lock(&s.orq);
            if s.ord.load(Ordering::Acquire) == 0 {
                return TxOutcome::LocalError(WcStatus::LocalProtErr);
            }
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
        match send_fpdu(w, self.crc, &hb, None, Piece::Bytes(&[])).await {
            // Completed by the receiver when the last Read Response segment arrives.
            Ok(()) => TxOutcome::Pending,
            Err(e) => TxOutcome::Io(e),
        }
    }

    /// Answer a Read Request. The IRD slot frees (`done`) just before the last segment leaves:
    /// the requester can issue its next read only after receiving it. `stop` as for
    /// [`Tx::work_request`].
    pub(super) async fn read_response(
        &self,
        w: &mut Out<'_>,
        req: &ReadRequest,
        src: Option<&Arc<SoftMr>>,
        done: &mut (dyn FnMut() + Send),
        stop: Stop<'_>,
    ) -> io::Result<()> {
        let header =
            |off: u64, last| Header::Tagged { op: Opcode::ReadResponse, last, stag: req.sink_stag, to: req.sink_to.wrapping_add(off) };
        match src {
            None => {
                done();
                let mut hb = [0u8; 14];
                header(0, true).emit(&mut hb);
                send_fpdu(w, self.crc, &hb, None, Piece::Bytes(&[])).await
            }
            Some(mr) => {
                let off = (req.src_to - mr.addr) as usize;
                self.stream_region(w, mr, off, req.size as usize, header, done, stop).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Framing in place while gathering (connections without CRC) gives the bytes `Framing`
    /// gives: length, header, payload copied or referred to, pad and a zero CRC field.
    #[test]
    fn fpdus_framed_while_gathered_are_framed_as_alone() {
        let header = Header::Untagged { op: Opcode::Send, last: true, inv_stag: 0, qn: QN_SEND, msn: 7, mo: 0 };
        let mut hb = [0u8; UNTAGGED_HDR];
        let n = header.emit(&mut hb);
        let small = bytes::Bytes::from(vec![3u8; 45]);
        let large = bytes::Bytes::from((0..REF_MIN + 3).map(|i| i as u8).collect::<Vec<u8>>());
        // A region's bytes, as a request's element names them.
        let rnic = crate::SoftRnic::default();
        let pd = riser_verbs::Provider::alloc_pd(&rnic).expect("pd");
        let mr = riser_verbs::ProtectionDomain::register(&*pd, (0..100u8).collect(), Access::LOCAL_WRITE).expect("mr");
        let payloads = [
            (None, Piece::Bytes(&[])),
            (None, Piece::Bytes(&[1, 2, 3])),
            (None, Piece::Shared(&small)),
            (None, Piece::Shared(&large)),
            (Some(&*mr), Piece::Mem(10, 50)),
        ];
        let mut g = Gathered::default();
        let mut alone = Vec::new();
        for (mem, p) in payloads {
            let f = Framing::new(false, &hb[..n], mem, p);
            for piece in f.around(p) {
                match piece {
                    Piece::Bytes(b) => alone.extend_from_slice(b),
                    Piece::Shared(b) => alone.extend_from_slice(b),
                    Piece::Mem(off, len) => alone.extend_from_slice(&mem.expect("a region").locked()[off..off + len]),
                }
            }
            g.fpdu(&hb[..n], mem, p);
        }
        let gathered: Vec<u8> = g.pieces().iter().flat_map(|p| if let Piece::Bytes(b) = p { b.to_vec() } else { unreachable!() }).collect();
        assert_eq!(gathered, alone);
        assert_eq!(g.total, alone.len());
        assert_eq!(g.refs.len(), 1, "the large payload referred to, not copied");
        // The slices a writer that never waits writes: the same bytes, none of them empty.
        let slices = g.io_slices();
        assert!(slices.iter().all(|s| !s.is_empty()));
        assert_eq!(slices.iter().flat_map(|s| s.to_vec()).collect::<Vec<u8>>(), alone);
    }

    /// What the socket does not take at once is kept, from the first byte not written on, in
    /// order — whatever the slices' boundaries (`write_or_keep`).
    #[tokio::test]
    async fn a_writer_that_never_waits_keeps_what_the_socket_refused_in_order() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let (client, server) = tokio::join!(TcpStream::connect(listener.local_addr().expect("addr")), listener.accept());
        let (client, (server, _)) = (client.expect("connect"), server.expect("accept"));
        // More than the socket buffers hold, in uneven slices: the socket refuses some.
        let chunks: Vec<Vec<u8>> = (0..200u32).map(|i| (0..(1000 + 997 * i as usize)).map(|j| (j as u32 ^ i) as u8).collect()).collect();
        let all: Vec<u8> = chunks.concat();
        let mut rest = Vec::new();
        write_or_keep(&client, &mut rest, &chunks.iter().map(|c| IoSlice::new(c)).collect::<Vec<_>>());
        assert!(!rest.is_empty(), "the socket took {} bytes: nothing was kept, the test shows nothing", all.len());
        // Once something is kept, everything after it is too (nothing may overtake it).
        write_or_keep(&client, &mut rest, &[IoSlice::new(b"after")]);
        let written = all.len() + 5 - rest.len();
        assert!(written > 0 && written < all.len(), "{written} of {} bytes written: the socket took part of them", all.len());
        let mut got = vec![0u8; written];
        let mut server = server.into_std().expect("std socket");
        server.set_nonblocking(false).expect("blocking");
        io::Read::read_exact(&mut server, &mut got).expect("read");
        got.extend_from_slice(&rest);
        assert_eq!(&got[..all.len()], &all[..]);
        assert_eq!(&got[all.len()..], b"after");
    }
}
