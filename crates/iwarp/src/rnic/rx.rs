//! The receive engine: the receiver task parses FPDUs from the socket, checks each segment
//! (STag, domain, access, bounds, MSN, MO) and places its payload straight into registered
//! memory; a violation becomes a Terminate (the `denied_*` mappings name which).

use super::mr::{Denied, SoftMr};
use super::qp::{QpShared, TxQueue};
use super::tx::TxItem;
use super::{lock, terminate_for, wc};
use crate::wire::{self, Header, Opcode, QN_READ, QN_SEND, READ_REQUEST_LEN, ReadRequest, Term, TerminateMsg, UNTAGGED_HDR};
use riser_verbs::{Access, RecvWr, Sge, Wc, WcOpcode, WcStatus};
use smallvec::SmallVec;
use std::io::{self, IoSliceMut, Read};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tracing::{debug, warn};

/// Where the bytes come from: the socket (waiting for them), or memory (fuzzing: never waits),
/// at most so many bytes per read.
enum Source<'a> {
    Socket(Arc<TcpStream>),
    Memory(io::Cursor<&'a [u8]>, usize),
}

/// Spill buffer: room for a turn's worth of small messages (a 4 KiB RDMA Write and the Send
/// behind it, several commands' worth) in one read.
const SPILL: usize = 64 << 10;

/// Spill used while large payloads stream in: their bytes should land in place, not here.
const SPILL_BULK: usize = 512;

/// Payload from which a segment counts as bulk (see `place`).
const BULK_SEGMENT: usize = 8 << 10;

/// Small segments in a row after which the spill grows again: a bulk stream's commands and
/// responses between its large segments do not, so its payload never lands in the spill.
const SMALL_RUN: u32 = 8;

/// The receive side of the socket. Each read fills the caller's destination first (a region's
/// memory, for payload) and spills what follows (the FPDU's pad and CRC, the next headers) into
/// a buffer, so one system call per FPDU suffices. While segments are large the spill is small,
/// so payload hardly passes through it; once they have been small for a while (`SMALL_RUN`) it
/// takes several FPDUs at once (copying a few KiB costs less than a system call).
pub(super) struct RxStream<'a> {
    inner: Source<'a>,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The spill's size for the next read.
    spill: usize,
    /// Small segments placed since the last large one.
    small_run: u32,
    /// See `RnicConfig::busy_poll`.
    busy_poll: Option<std::time::Duration>,
    /// When the stream last ran dry (while polling).
    dry_since: Option<std::time::Instant>,
}

impl<'a> RxStream<'a> {
    fn new(inner: Source<'a>) -> Self {
        Self {
            inner,
            buf: vec![0; SPILL].into_boxed_slice(),
            start: 0,
            end: 0,
            spill: SPILL,
            small_run: 0,
            busy_poll: None,
            dry_since: None,
        }
    }

    pub(super) fn socket(sock: Arc<TcpStream>) -> Self {
        Self::new(Source::Socket(sock))
    }

    pub(super) fn busy_poll(mut self, budget: Option<std::time::Duration>) -> Self {
        self.busy_poll = budget;
        self
    }

    /// `bytes`, at most `per_read` of them per read (a stream arriving in pieces).
    pub(super) fn memory(bytes: &'a [u8], per_read: usize) -> Self {
        Self::new(Source::Memory(io::Cursor::new(bytes), per_read.max(1)))
    }

    /// A segment's `len` payload bytes are being placed: the spill's size follows the sizes of
    /// the segments.
    fn note_placement(&mut self, len: usize) {
        if len >= BULK_SEGMENT {
            (self.spill, self.small_run) = (SPILL_BULK, 0);
        } else {
            self.small_run = self.small_run.saturating_add(1);
            if self.small_run >= SMALL_RUN {
                self.spill = SPILL;
            }
        }
    }

    /// Bytes read ahead and not yet taken.
    fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Fill `dst` from what was read ahead, if all of it is there (`false`: nothing taken).
    fn take_buffered(&mut self, dst: &mut [u8]) -> bool {
        if self.end - self.start < dst.len() {
            return false;
        }
        dst.copy_from_slice(&self.buf[self.start..self.start + dst.len()]);
        self.start += dst.len();
        true
    }

    /// Read what is there into `dst` (not empty) without waiting: `Ok(0)` at the stream's end,
    /// `WouldBlock` when nothing is there yet.
    fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if self.start < self.end {
            let n = dst.len().min(self.end - self.start);
            dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.start += n;
            return Ok(n);
        }
        let mut iov = [IoSliceMut::new(dst), IoSliceMut::new(&mut self.buf[..self.spill])];
        let got = match &mut self.inner {
            Source::Socket(s) => {
                // A short read has drained the socket: its readiness is cleared with it (as
                // tokio's own `poll_read` does), by the readiness seen before the read, so the
                // next wait sleeps at once instead of trying a read that finds nothing (one
                // system call less per wake-up) and data arriving meanwhile still wakes it.
                let want = iov.iter().map(|b| b.len()).sum::<usize>();
                let mut short = None;
                match s.try_io(Interest::READABLE, || match s.try_read_vectored(&mut iov) {
                    Ok(n) if n > 0 && n < want => {
                        short = Some(n);
                        Err(io::ErrorKind::WouldBlock.into())
                    }
                    r => r,
                }) {
                    Ok(n) => n,
                    Err(e) => short.ok_or(e)?,
                }
            }
            Source::Memory(c, per_read) => {
                let [dst, spill] = &mut iov;
                let first = dst.len().min(*per_read);
                let n = c.read(&mut dst[..first])?;
                let more = (*per_read - first).min(spill.len());
                if n == first && more > 0 { n + c.read(&mut spill[..more])? } else { n }
            }
        };
        let direct = got.min(iov[0].len());
        (self.start, self.end) = (0, got - direct);
        self.dry_since = None;
        Ok(direct)
    }

    /// Wait until the socket has something to read: while busy polling and within its budget
    /// since the stream ran dry, only until the runtime's other ready tasks have run (the
    /// caller tries again).
    async fn ready(&mut self) -> io::Result<()> {
        match &self.inner {
            Source::Socket(s) => {
                if let Some(budget) = self.busy_poll {
                    let since = *self.dry_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() < budget {
                        tokio::task::yield_now().await;
                        return Ok(());
                    }
                }
                s.readable().await
            }
            Source::Memory(..) => Ok(()),
        }
    }

    /// Fill `dst`.
    async fn read_exact(&mut self, mut dst: &mut [u8]) -> io::Result<()> {
        while !dst.is_empty() {
            match self.try_read(dst) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => dst = &mut std::mem::take(&mut dst)[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.ready().await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// FPDUs `Rx::fpdu_now` took (tests: that the path they compare runs at all).
#[cfg(test)]
pub(super) static FAST_FPDUS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

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

/// The receiver task: handle FPDUs until the stream ends or a violation ends it with a
/// Terminate.
pub(super) async fn receive(s: &Arc<QpShared>, mut r: RxStream<'_>, crc: bool, tx: &TxQueue) {
    let mut rx = Rx { crc, msn_send: 1, msn_read: 1, send: None, tagged: None, first_seen: false, failed: None };
    loop {
        let done = match rx.fpdu_now(s, &mut r, tx) {
            Some(done) => done,
            None => rx.fpdu(s, &mut r, tx).await,
        };
        match done {
            Ok(()) => {
                if !rx.first_seen {
                    rx.first_seen = true;
                    s.may_send_release();
                }
            }
            Err(RxError::Closed) => {
                s.fail();
                // A Send under way when the stream ended: its receive is flushed like those
                // still queued, not left without a completion.
                if let Some(inb) = rx.send.take() {
                    s.recv_cq.push(wc(inb.wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0));
                }
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
    async fn fpdu(&mut self, s: &QpShared, r: &mut RxStream<'_>, tx: &TxQueue) -> Result<(), RxError> {
        let mut lenb = [0u8; 2];
        let mut hb = [0u8; UNTAGGED_HDR + READ_REQUEST_LEN];
        // The length and the DDP header in one copy when they were read ahead (the common case:
        // a read that placed the last payload took what followed it too), else field by field
        // as they arrive. Either way the checks below see the same bytes.
        let ahead = r.buffered();
        let whole = ahead.len() >= 4 && {
            let base = if ahead[2] & 0x80 != 0 { wire::TAGGED_HDR } else { UNTAGGED_HDR };
            let mpa_len = usize::from(u16::from_be_bytes([ahead[0], ahead[1]]));
            mpa_len >= base && ahead.len() >= 2 + base
        };
        if whole {
            r.take_buffered(&mut lenb);
            let base = if r.buffered()[0] & 0x80 != 0 { wire::TAGGED_HDR } else { UNTAGGED_HDR };
            r.take_buffered(&mut hb[..base]);
        } else {
            r.read_exact(&mut lenb).await?;
        }
        let mpa_len = usize::from(u16::from_be_bytes(lenb));
        let mut crc = Crc { on: self.crc, value: 0 };
        crc.add(&lenb);
        if mpa_len < 2 {
            return Err(RxError::Term(Term::MPA_FRAMING, "FPDU shorter than a DDP header"));
        }
        if !whole {
            r.read_exact(&mut hb[..2]).await?;
        }
        let base = ddp_header_len(mpa_len, hb[0])?;
        if !whole {
            r.read_exact(&mut hb[2..base]).await?;
        }
        let (h, extra) = parse_header(&hb[..base], mpa_len)?;
        if extra > 0 {
            r.read_exact(&mut hb[base..base + extra]).await?;
        }
        crc.add(&hb[..base + extra]);
        let payload = mpa_len - base - extra;
        let commit = self.segment(s, r, &h, &hb[base..base + extra], payload, &mut crc).await?;
        // Pad and CRC.
        let mut tail = [0u8; 7];
        let pad = wire::fpdu_pad(mpa_len);
        if !r.take_buffered(&mut tail[..pad + 4]) {
            r.read_exact(&mut tail[..pad + 4]).await?;
        }
        crc.add(&tail[..pad]);
        if self.crc && crc.value.to_le_bytes() != tail[pad..pad + 4] {
            return Err(RxError::Term(Term::MPA_CRC, "FPDU CRC mismatch"));
        }
        self.commit(s, commit, tx)
    }

    /// An FPDU that was read ahead whole (the common case once one read has taken several small
    /// ones), handled without waiting: no future, no copy of its framing. `None`: it is not all
    /// there, or it is one `fpdu` is left to (a Terminate, or framing it refuses); nothing was
    /// taken. The same checks, placement, state and completions as `fpdu`, except that the CRC
    /// is checked before anything is placed rather than after.
    fn fpdu_now(&mut self, s: &QpShared, r: &mut RxStream<'_>, tx: &TxQueue) -> Option<Result<(), RxError>> {
        let ahead = r.buffered();
        if ahead.len() < 2 + wire::TAGGED_HDR {
            return None;
        }
        let mpa_len = usize::from(u16::from_be_bytes([ahead[0], ahead[1]]));
        let pad = wire::fpdu_pad(mpa_len);
        let total = 2 + mpa_len + pad + 4;
        if ahead.len() < total {
            return None;
        }
        let fpdu = &ahead[..total];
        let base = ddp_header_len(mpa_len, fpdu[2]).ok()?;
        let (h, extra) = parse_header(&fpdu[2..2 + base], mpa_len).ok()?;
        if h.op() == Opcode::Terminate {
            return None;
        }
        let body = &fpdu[2 + base..2 + base + extra];
        let payload = &fpdu[2 + base + extra..2 + mpa_len];
        let payload_len = payload.len();
        let (dest, commit) = match self.admit(s, &h, body, payload_len) {
            Ok(admitted) => admitted,
            Err(e) => return Some(Err(e)),
        };
        if self.crc && wire::fpdu_crc(&[&fpdu[..2 + mpa_len + pad]])[..] != fpdu[2 + mpa_len + pad..] {
            return Some(Err(RxError::Term(Term::MPA_CRC, "FPDU CRC mismatch")));
        }
        let placed = match &dest {
            Dest::Nothing | Dest::Terminate => Ok(()),
            Dest::Region(mr, off) => place_now(mr, *off, payload),
            Dest::Scatter(parts) => {
                let mut at = 0;
                parts.iter().try_for_each(|(mr, off, n)| {
                    at += n;
                    place_now(mr, *off, &payload[at - n..at])
                })
            }
        };
        if let Err(e) = placed {
            return Some(Err(e));
        }
        // What the slow path reads is what it places: the payload, all of it.
        debug_assert_eq!(
            match &dest {
                Dest::Nothing | Dest::Terminate => 0,
                Dest::Region(..) => payload_len,
                Dest::Scatter(parts) => parts.iter().map(|(_, _, n)| n).sum(),
            },
            payload_len,
            "a payload placed in part"
        );
        r.start += total;
        #[cfg(test)]
        FAST_FPDUS.fetch_add(1, Ordering::Relaxed);
        match &dest {
            Dest::Nothing | Dest::Terminate => {}
            Dest::Region(..) => r.note_placement(payload_len),
            Dest::Scatter(parts) => parts.iter().for_each(|(_, _, n)| r.note_placement(*n)),
        }
        Some(self.commit(s, commit, tx))
    }

    /// Validate a segment and place its payload; what to do once its CRC checked out is returned.
    async fn segment(
        &mut self,
        s: &QpShared,
        r: &mut RxStream<'_>,
        h: &Header,
        body: &[u8],
        payload: usize,
        crc: &mut Crc,
    ) -> Result<Commit, RxError> {
        let (dest, commit) = self.admit(s, h, body, payload)?;
        match dest {
            Dest::Nothing => {}
            Dest::Region(mr, off) => place(r, &mr, off, payload, crc).await?,
            Dest::Scatter(parts) => {
                for (mr, off, n) in &parts {
                    place(r, mr, *off, *n, crc).await?;
                }
            }
            Dest::Terminate => {
                let mut b = vec![0u8; payload];
                r.read_exact(&mut b).await?;
                crc.add(&b);
                let t = TerminateMsg::parse(&b).map(|t| t.term).unwrap_or(Term::RDMAP_CATASTROPHIC);
                return Ok(Commit::Terminated(t));
            }
        }
        Ok(commit)
    }

    /// Check a segment of `payload` bytes against the stream's state and the memory it names,
    /// and advance that state: where its payload goes, and what to do once it is placed and its
    /// CRC checked out. Nothing is placed here.
    fn admit(&mut self, s: &QpShared, h: &Header, body: &[u8], payload: usize) -> Result<(Dest, Commit), RxError> {
        match *h {
            Header::Tagged { op: Opcode::Write, last, stag, to } => {
                if let Some((cur, next)) = self.tagged {
                    if cur != stag || next != to {
                        return Err(RxError::Term(Term::DDP_TAGGED_BOUNDS, "RDMA Write segment does not continue its message"));
                    }
                } else if payload == 0 {
                    // A zero-length Write (e.g. the peer-to-peer ready-to-receive) touches nothing.
                    return Ok((Dest::Nothing, Commit::None));
                }
                let mr = s.lookup(stag).ok_or(RxError::Term(Term::DDP_TAGGED_INVALID_STAG, "RDMA Write to an unknown STag"))?;
                let off = mr
                    .check(stag, s.pd, Access::REMOTE_WRITE, to, payload as u64)
                    .map_err(|d| RxError::Term(denied_tagged(d), "RDMA Write refused"))?;
                self.tagged = if last { None } else { Some((stag, to + payload as u64)) };
                Ok((Dest::Region(mr, off), Commit::None))
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
                let dest = if payload > 0 {
                    let part = Sge { addr: to, length: payload as u32, lkey: stag };
                    let (mr, off) = s
                        .local(&part, Access::LOCAL_WRITE)
                        .ok_or(RxError::Term(Term::DDP_TAGGED_INVALID_STAG, "Read sink no longer valid"))?;
                    Dest::Region(mr, off)
                } else {
                    Dest::Nothing
                };
                Ok((dest, Commit::ReadProgress { bytes: payload as u32, last }))
            }
            Header::Untagged { op, last, inv_stag, qn, msn, mo } if op.is_send() => {
                if qn != QN_SEND {
                    return Err(RxError::Term(Term::DDP_UNTAGGED_INVALID_QN, "Send on a queue other than 0"));
                }
                if self.send.is_none() {
                    let mut rq = lock(&s.rq);
                    let wr = if s.rq_last_first.load(Ordering::Relaxed) { rq.pop_back() } else { rq.pop_front() };
                    drop(rq);
                    let wr = wr.ok_or(RxError::Term(Term::DDP_UNTAGGED_NO_BUFFER, "Send with no receive posted"))?;
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
                // Scattered over the receive's elements, from where the message has got to.
                let mut parts: SmallVec<[_; 2]> = SmallVec::new();
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
                    parts.push((mr, off, take));
                    left -= take;
                    at = 0;
                }
                inb.received += payload as u32;
                let dest = match parts.len() {
                    0 => Dest::Nothing,
                    1 => {
                        let (mr, off, _) = parts.pop().expect("one part");
                        Dest::Region(mr, off)
                    }
                    _ => Dest::Scatter(parts),
                };
                Ok((dest, if last { Commit::SendDone { op, inv_stag } } else { Commit::None }))
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
                Ok((Dest::Nothing, Commit::Read(req)))
            }
            Header::Untagged { op: Opcode::Terminate, .. } => Ok((Dest::Terminate, Commit::None)),
            _ => Err(RxError::Term(Term::RDMAP_BAD_OPCODE, "unexpected opcode")),
        }
    }

    fn commit(&mut self, s: &QpShared, c: Commit, tx: &TxQueue) -> Result<(), RxError> {
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
                    s.orq_room.notify_waiters();
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
                    let refused = match s.lookup(inv_stag) {
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
                    let mr = s.lookup(req.src_stag).ok_or(RxError::Term(Term::RDMAP_INVALID_STAG, "RDMA Read of an unknown STag"))?;
                    mr.check(req.src_stag, s.pd, Access::REMOTE_READ, req.src_to, u64::from(req.size))
                        .map_err(|d| RxError::Term(denied_read(d), "RDMA Read refused"))?;
                    Some(mr)
                };
                s.ird_in_use.fetch_add(1, Ordering::AcqRel);
                if s.respond_inline(&req, src.as_ref()) {
                    return Ok(());
                }
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

/// Read `len` payload bytes from the stream straight into `mr` at `off` (the region locked
/// for each read, never across a wait).
async fn place(r: &mut RxStream<'_>, mr: &SoftMr, off: usize, len: usize, crc: &mut Crc) -> Result<(), RxError> {
    r.note_placement(len);
    let mut done = 0;
    while done < len {
        let got = {
            let mut mem = lock(&mr.mem);
            let Some(dst) = mem.placing(off + done..off + len) else {
                return Err(RxError::Term(Term::DDP_CATASTROPHIC, "placement into read-only memory"));
            };
            match r.try_read(dst) {
                Ok(0) => return Err(RxError::Closed),
                Ok(n) => {
                    crc.add(&dst[..n]);
                    mem.placed(off + done + n);
                    Some(n)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Some(0),
                Err(_) => return Err(RxError::Closed),
            }
        };
        match got {
            Some(n) => done += n,
            None => r.ready().await?,
        }
    }
    Ok(())
}

/// Place `bytes` (read ahead) into `mr` at `off`.
fn place_now(mr: &SoftMr, off: usize, bytes: &[u8]) -> Result<(), RxError> {
    if bytes.is_empty() {
        return Ok(());
    }
    let mut mem = lock(&mr.mem);
    let Some(dst) = mem.placing(off..off + bytes.len()) else {
        return Err(RxError::Term(Term::DDP_CATASTROPHIC, "placement into read-only memory"));
    };
    dst.copy_from_slice(bytes);
    mem.placed(off + bytes.len());
    Ok(())
}

/// Where an admitted segment's payload goes (see `Rx::admit`): every check done, nothing
/// placed yet.
enum Dest {
    /// Nowhere: no payload, or a Read Request's.
    Nothing,
    /// Into a region, from an offset (an RDMA Write, a Read Response).
    Region(Arc<SoftMr>, usize),
    /// A Send's, over its receive's elements in order: region, offset and bytes each.
    Scatter(SmallVec<[(Arc<SoftMr>, usize, usize); 2]>),
    /// A Terminate's, to be parsed.
    Terminate,
}

/// The length of the DDP header that starts with `first` in an FPDU of `mpa_len` bytes.
fn ddp_header_len(mpa_len: usize, first: u8) -> Result<usize, RxError> {
    let base = if first & 0x80 != 0 { wire::TAGGED_HDR } else { UNTAGGED_HDR };
    if mpa_len < base {
        return Err(RxError::Term(Term::MPA_FRAMING, "FPDU shorter than its DDP header"));
    }
    Ok(base)
}

/// The DDP and RDMAP header in `hb` (all of the DDP header), and how many bytes of RDMAP header
/// follow it (a Read Request's), checked against the FPDU's `mpa_len`.
fn parse_header(hb: &[u8], mpa_len: usize) -> Result<(Header, usize), RxError> {
    let h = Header::parse(hb).map_err(|e| match e {
        wire::WireError::Violation(t, why) => RxError::Term(t, why),
        _ => RxError::Term(Term::MPA_FRAMING, "bad DDP header"),
    })?;
    let extra = match h.op() {
        Opcode::ReadRequest => READ_REQUEST_LEN,
        _ => 0,
    };
    if mpa_len < hb.len() + extra {
        return Err(RxError::Term(Term::MPA_FRAMING, "FPDU shorter than its RDMAP header"));
    }
    Ok((h, extra))
}
