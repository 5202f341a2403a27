//! The receive engine: the receiver (one task with the transmitter) parses FPDUs from the socket, checks each segment
//! (STag, domain, access, bounds, MSN, MO) and places its payload straight into registered
//! memory; a violation becomes a Terminate (the `denied_*` mappings name which).

use super::mr::{Denied, SoftMr};
use super::qp::{QpShared, TxQueue};
use super::tx::TxItem;
use super::{lock, terminate_for, wc};
use crate::wire::{self, Header, Opcode, QN_READ, QN_SEND, READ_REQUEST_LEN, ReadRequest, Term, TerminateMsg, UNTAGGED_HDR};
use riser_verbs::{Access, RecvWr, Sge, Wc, WcOpcode, WcStatus};
use smallvec::SmallVec;
use std::collections::VecDeque;
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

/// The most a stream's buffer is kept at (larger only while read-ahead put back needs it).
const BUF_MAX: usize = 4 * SPILL;

/// Spill used while large payloads stream in: their bytes should land in place, not here.
const SPILL_BULK: usize = 512;

/// Payload from which a segment counts as bulk (see `place`).
const BULK_SEGMENT: usize = 8 << 10;

/// Small segments in a row after which the spill grows again: a bulk stream's commands and
/// responses between its large segments do not, so its payload never lands in the spill.
const SMALL_RUN: u32 = 8;

/// Most of a message one read takes beyond the segment being placed (see
/// `RxStream::try_read_ahead`), in bytes and in segments.
const AHEAD_BYTES: usize = 1 << 20;
const AHEAD_SEGMENTS: usize = 16;
// A read's pieces fit `try_read_ahead`'s inline vectors: `dst`, two a segment, the spill.
const _: () = assert!(2 * AHEAD_SEGMENTS + 2 <= 36);

/// What a stream holds between an FPDU's payload and the next one's: the first's pad and CRC,
/// the second's length and its header of `hdr` bytes.
const fn between(pad: usize, hdr: usize) -> usize {
    pad + 4 + 2 + hdr
}

/// The receive side of the socket. Each read fills the caller's destination first (a region's
/// memory, for payload) and spills what follows (the FPDU's pad and CRC, the next headers) into
/// a buffer, so one system call per FPDU suffices. While segments are large the spill is small,
/// so payload hardly passes through it; once they have been small for a while (`SMALL_RUN`) it
/// takes several FPDUs at once (copying a few KiB costs less than a system call).
pub(super) struct RxStream<'a> {
    inner: Source<'a>,
    buf: Vec<u8>,
    /// The buffer `unahead` builds the next one in (the one before, kept: not cleared again).
    spare: Vec<u8>,
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
    /// Stream bytes a read put straight where a message's next segments would place them (see
    /// `try_read_ahead`), in stream order: each comes before the buffer's bytes from its `at`.
    ahead: VecDeque<Ahead>,
}

/// `len` bytes of the stream read into `mr` at `off`, before the header that says where they
/// go was seen: taken as placed if that header names this place (`RxStream::take_ahead`),
/// otherwise copied back into the stream (`RxStream::unahead`) before anything else is placed
/// (it could overwrite them) and before the message completes (its memory goes back to the
/// consumer). They lie in memory the message in progress was given and has not reached yet:
/// the rest of a Read's sink, which its segments still to come must cover before the Read
/// completes, or the rest of a Send's receive element, past the Send's end if it ends sooner
/// (bytes a receive's completion does not count, which verbs consumers do not read). Never in
/// a pooled region's (`Storage::Unwritten`: its unwritten bytes are cleared when it is read or
/// written locally, which could happen meanwhile). Until taken they do not count as written.
struct Ahead {
    at: usize,
    mr: Arc<SoftMr>,
    off: usize,
    len: usize,
}

/// The rest of a message's memory after the segment being placed, for
/// `RxStream::try_read_ahead`.
struct Expected<'m> {
    /// Its memory, from the end of this segment's payload.
    rest: &'m mut [u8],
    mr: &'m Arc<SoftMr>,
    /// Where `rest` starts in `mr`.
    off: usize,
    /// This segment's pad (its FPDU's).
    pad: usize,
    /// Payload per segment, as the sender cut this one.
    seg: usize,
    /// Header bytes of each segment after its MPA length.
    hdr: usize,
}

/// A piece of a read that reaches ahead: buffer bytes or a message's memory (ranges in each).
enum Piece {
    Buf(std::ops::Range<usize>),
    Mem(std::ops::Range<usize>),
}

impl<'a> RxStream<'a> {
    fn new(inner: Source<'a>) -> Self {
        Self {
            inner,
            buf: vec![0; SPILL],
            spare: Vec::new(),
            start: 0,
            end: 0,
            spill: SPILL,
            small_run: 0,
            busy_poll: None,
            dry_since: None,
            ahead: VecDeque::new(),
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

    /// Where the buffer's bytes stop being the stream's next ones: at the first bytes read
    /// into memory ahead, if any.
    fn limit(&self) -> usize {
        self.ahead.front().map_or(self.end, |a| a.at)
    }

    /// Bytes read ahead into the buffer and not yet taken (up to any read into memory).
    fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.limit()]
    }

    /// Fill `dst` from what was read ahead, if all of it is there (`false`: nothing taken).
    fn take_buffered(&mut self, dst: &mut [u8]) -> bool {
        if self.limit() - self.start < dst.len() {
            return false;
        }
        dst.copy_from_slice(&self.buf[self.start..self.start + dst.len()]);
        self.start += dst.len();
        true
    }

    /// Read what is there into `dst` (not empty) without waiting: `Ok(0)` at the stream's end,
    /// `WouldBlock` when nothing is there yet.
    fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.try_read_ahead(dst, None)
    }

    /// [`Self::try_read`], and when `next` is given and nothing was read ahead, the same read
    /// goes on into where the message's next segments (a Read Response's, a Send's) would
    /// place their payload if the sender cuts them like this one: the bytes between payloads
    /// into the buffer, the payloads into memory. One system call takes many segments of a
    /// bulk message instead of one each (a 256 KiB Send: one `readv` instead of four). What
    /// it got in memory is held as [`Ahead`] until their headers have been checked.
    fn try_read_ahead(&mut self, dst: &mut [u8], next: Option<Expected<'_>>) -> io::Result<usize> {
        if self.start < self.limit() {
            let n = dst.len().min(self.limit() - self.start);
            dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.start += n;
            return Ok(n);
        }
        if !self.ahead.is_empty() {
            // The stream's next bytes are some read into memory, yet they are wanted here:
            // they were not the segment expected there. (No caller holds their region's lock
            // here: `place` takes them or puts them back before it locks one.)
            self.unahead()?;
            return self.try_read(dst);
        }
        if self.buf.len() > BUF_MAX {
            // Grown for much read ahead put back (rare): no more kept than usual.
            self.buf.truncate(SPILL);
            self.buf.shrink_to_fit();
        }
        let Some(Expected { rest, mr, off, pad, seg, hdr }) = next else {
            let mut iov = [IoSliceMut::new(dst), IoSliceMut::new(&mut self.buf[..self.spill])];
            let got = read_vectored(&mut self.inner, &mut iov)?;
            let direct = got.min(iov[0].len());
            (self.start, self.end) = (0, got - direct);
            self.dry_since = None;
            return Ok(direct);
        };
        // The pieces after `dst`, in stream order: for each expected segment the bytes between
        // payloads (into the buffer) and its payload (into memory); then the spill.
        let mut pieces: SmallVec<[Piece; 36]> = SmallVec::new();
        let (mut at, mut pad, mut placed) = (0, pad, 0);
        while placed < rest.len() && pieces.len() < 2 * AHEAD_SEGMENTS {
            let n = seg.min(rest.len() - placed);
            pieces.push(Piece::Buf(at..at + between(pad, hdr)));
            pieces.push(Piece::Mem(placed..placed + n));
            at += between(pad, hdr);
            placed += n;
            pad = wire::fpdu_pad(hdr + n);
        }
        pieces.push(Piece::Buf(at..(at + self.spill).min(self.buf.len())));
        let got = {
            let mut iov: SmallVec<[IoSliceMut<'_>; 36]> = SmallVec::new();
            iov.push(IoSliceMut::new(dst));
            let (mut buf, mut rest): (&mut [u8], &mut [u8]) = (&mut self.buf, rest);
            for p in &pieces {
                let (part, tail) = match p {
                    Piece::Buf(r) => std::mem::take(&mut buf).split_at_mut(r.len()),
                    Piece::Mem(r) => std::mem::take(&mut rest).split_at_mut(r.len()),
                };
                iov.push(IoSliceMut::new(part));
                match p {
                    Piece::Buf(_) => buf = tail,
                    Piece::Mem(_) => rest = tail,
                }
            }
            let got = read_vectored(&mut self.inner, &mut iov)?;
            let direct = got.min(iov[0].len());
            (direct, got - direct)
        };
        let (direct, mut beyond) = got;
        self.start = 0;
        self.end = 0;
        for p in &pieces {
            if beyond == 0 {
                break;
            }
            match p {
                Piece::Buf(r) => {
                    let n = beyond.min(r.len());
                    self.end = r.start + n;
                    beyond -= n;
                }
                Piece::Mem(r) => {
                    let n = beyond.min(r.len());
                    self.ahead.push_back(Ahead { at: self.end, mr: Arc::clone(mr), off: off + r.start, len: n });
                    beyond -= n;
                }
            }
        }
        self.dry_since = None;
        Ok(direct)
    }

    /// Whether the stream's next bytes are some read ahead into memory.
    fn ahead_next(&self) -> bool {
        self.ahead.front().is_some_and(|a| a.at == self.start)
    }

    /// The stream's next bytes, when they were read ahead into `mr` at `off` (up to `max` of
    /// them): taken, as if read into place now. `None`: the stream's next bytes are not there.
    fn take_ahead(&mut self, mr: &Arc<SoftMr>, off: usize, max: usize) -> Option<usize> {
        if !self.ahead_next() {
            return None;
        }
        let a = self.ahead.front_mut()?;
        if !Arc::ptr_eq(&a.mr, mr) || a.off != off {
            return None;
        }
        let n = a.len.min(max);
        if n == a.len {
            self.ahead.pop_front();
        } else {
            (a.off, a.len) = (a.off + n, a.len - n);
        }
        Some(n)
    }

    /// Copy every byte read ahead into memory back into the stream's buffer, in stream order.
    fn unahead(&mut self) -> io::Result<()> {
        let need = self.end - self.start + self.ahead.iter().map(|a| a.len).sum::<usize>();
        let mut v = std::mem::take(&mut self.spare);
        if v.len() < need.max(SPILL) {
            v.resize(need.max(SPILL), 0);
        }
        let mut w = 0;
        let mut put = |b: &[u8]| {
            v[w..w + b.len()].copy_from_slice(b);
            w += b.len();
        };
        let mut from = self.start;
        for a in self.ahead.drain(..) {
            put(&self.buf[from..a.at]);
            from = a.at;
            let mem = lock(&a.mr.mem);
            put(mem.unchecked(a.off..a.off + a.len).ok_or_else(|| io::Error::other("read-ahead memory gone"))?);
        }
        put(&self.buf[from..self.end]);
        (self.start, self.end) = (0, w);
        self.spare = std::mem::replace(&mut self.buf, v);
        if self.spare.len() > BUF_MAX {
            self.spare = Vec::new();
        }
        #[cfg(test)]
        UNAHEAD.fetch_add(1, Ordering::Relaxed);
        Ok(())
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

/// One read from `src` into `iov` in order: a socket's without waiting (a short read clears its
/// readiness), memory's at most its `per_read` bytes.
fn read_vectored(src: &mut Source<'_>, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
    match src {
        Source::Socket(s) => {
            // A short read has drained the socket: its readiness is cleared with it (as tokio's
            // own `poll_read` does), by the readiness seen before the read, so the next wait
            // sleeps at once instead of trying a read that finds nothing (one system call less
            // per wake-up) and data arriving meanwhile still wakes it.
            let want = iov.iter().map(|b| b.len()).sum::<usize>();
            let mut short = None;
            match s.try_io(Interest::READABLE, || match s.try_read_vectored(iov) {
                Ok(n) if n > 0 && n < want => {
                    short = Some(n);
                    Err(io::ErrorKind::WouldBlock.into())
                }
                r => r,
            }) {
                Ok(n) => Ok(n),
                Err(e) => short.ok_or(e),
            }
        }
        Source::Memory(c, per_read) => {
            let mut budget = *per_read;
            let mut got = 0;
            for b in iov.iter_mut() {
                let want = b.len().min(budget);
                let n = c.read(&mut b[..want])?;
                (got, budget) = (got + n, budget - n);
                if n < b.len() {
                    break;
                }
            }
            Ok(got)
        }
    }
}

/// FPDUs `Rx::fpdu_now` took (tests: that the path they compare runs at all).
#[cfg(test)]
pub(super) static FAST_FPDUS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Segments taken as read ahead into their place, and times bytes read ahead were not (tests).
#[cfg(test)]
pub(super) static AHEAD_TAKEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
#[cfg(test)]
pub(super) static UNAHEAD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

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
    /// The length of the last bulk Send received: how long the next is expected to be, so
    /// that reading it ahead stops at its end (see `Dest::Region`).
    send_len: u32,
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

/// The receiver: handle FPDUs until the stream ends or a violation ends it with a
/// Terminate.
pub(super) async fn receive(s: &Arc<QpShared>, mut r: RxStream<'_>, crc: bool, tx: &TxQueue) {
    let mut rx = Rx { crc, msn_send: 1, msn_read: 1, send: None, tagged: None, first_seen: false, failed: None, send_len: 0 };
    loop {
        let done = match rx.fpdu_now(s, &mut r, tx) {
            Some(done) => done,
            None => rx.fpdu(s, &mut r, tx).await,
        };
        // Every FPDU counts against the task's budget (the socket's reads and readiness waits
        // do not), so a stream that never runs dry still lets the transmitter (the same task)
        // and the runtime's other tasks take their turns.
        tokio::task::coop::consume_budget().await;
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
        let pad = wire::fpdu_pad(mpa_len);
        let commit = self.segment(s, r, &h, &hb[base..base + extra], payload, pad, &mut crc).await?;
        // Pad and CRC.
        let mut tail = [0u8; 7];
        if !r.take_buffered(&mut tail[..pad + 4]) {
            r.read_exact(&mut tail[..pad + 4]).await?;
        }
        crc.add(&tail[..pad]);
        if self.crc && crc.value.to_le_bytes() != tail[pad..pad + 4] {
            return Err(RxError::Term(Term::MPA_CRC, "FPDU CRC mismatch"));
        }
        if matches!(commit, Commit::SendDone { .. } | Commit::ReadProgress { last: true, .. }) && !r.ahead.is_empty() {
            // Read ahead past the message's end (the next message's bytes where this one's
            // did not reach): back into the stream before the memory is handed back.
            r.unahead()?;
        }
        debug_assert!(
            !matches!(commit, Commit::SendDone { .. } | Commit::ReadProgress { last: true, .. }) || r.ahead.is_empty(),
            "a message completes with bytes read ahead into its memory"
        );
        self.commit(s, commit, tx)
    }

    /// An FPDU that was read ahead whole (the common case once one read has taken several small
    /// ones), handled without waiting: no future, no copy of its framing. `None`: it is not all
    /// there, or it is one `fpdu` is left to (a Terminate, or framing it refuses); nothing was
    /// taken. The same checks, placement, state and completions as `fpdu`, except that the CRC
    /// is checked before anything is placed rather than after.
    fn fpdu_now(&mut self, s: &QpShared, r: &mut RxStream<'_>, tx: &TxQueue) -> Option<Result<(), RxError>> {
        if !r.ahead.is_empty() {
            // Bytes read ahead into memory are pending: an FPDU before them that is whole goes
            // through `place`, which puts them back before it writes anywhere.
            return None;
        }
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
            Dest::Region(mr, off, _) => place_now(mr, *off, payload),
            Dest::Scatter(parts, _) => {
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
                Dest::Scatter(parts, _) => parts.iter().map(|(_, _, n)| n).sum(),
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
            Dest::Scatter(parts, _) => parts.iter().for_each(|(_, _, n)| r.note_placement(*n)),
        }
        Some(self.commit(s, commit, tx))
    }

    /// Validate a segment (its FPDU padded with `pad` bytes) and place its payload; what to do
    /// once its CRC checked out is returned.
    #[allow(clippy::too_many_arguments)]
    async fn segment(
        &mut self,
        s: &QpShared,
        r: &mut RxStream<'_>,
        h: &Header,
        body: &[u8],
        payload: usize,
        pad: usize,
        crc: &mut Crc,
    ) -> Result<Commit, RxError> {
        let (dest, commit) = self.admit(s, h, body, payload)?;
        // A bulk message with more to come: its next segments are likely cut like this one
        // (see `RxStream::try_read_ahead`).
        let next = |then: usize| {
            (then > 0 && payload >= BULK_SEGMENT).then_some(Next {
                then: then.min(AHEAD_BYTES),
                pad,
                seg: payload,
                hdr: h.op().header_len(),
            })
        };
        match dest {
            Dest::Nothing => {}
            Dest::Region(mr, off, then) => place(r, &mr, off, payload, next(then), crc).await?,
            Dest::Scatter(parts, then) => {
                let last = parts.len() - 1;
                for (i, (mr, off, n)) in parts.iter().enumerate() {
                    place(r, mr, *off, *n, if i == last { next(then) } else { None }, crc).await?;
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
                Ok((Dest::Region(mr, off, 0), Commit::None))
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
                    Dest::Region(mr, off, (size - received) as usize - payload)
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
                // Room left after the last part in its element: where the message's next
                // segment goes, if it has one.
                let mut room = 0;
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
                    room = (len - at) as usize - take;
                    left -= take;
                    at = 0;
                }
                inb.received += payload as u32;
                // A Send's length is not on the wire: expected to be the last bulk one's, and
                // if it is not, up to the element's end.
                let then = match self.send_len.checked_sub(inb.received) {
                    _ if last => 0,
                    Some(more) if more > 0 => room.min(more as usize),
                    _ => room,
                };
                let dest = match parts.len() {
                    0 => Dest::Nothing,
                    1 => {
                        let (mr, off, _) = parts.pop().expect("one part");
                        Dest::Region(mr, off, then)
                    }
                    _ => Dest::Scatter(parts, then),
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
                if inb.received as usize > BULK_SEGMENT {
                    self.send_len = inb.received;
                }
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

/// A segment's message may go on after it: into `then` more bytes (what a read may reach for
/// of them), in segments of `seg` payload bytes as this one (its FPDU padded with `pad`
/// bytes), each behind a header of `hdr` bytes.
struct Next {
    then: usize,
    pad: usize,
    seg: usize,
    hdr: usize,
}

/// Read `len` payload bytes from the stream straight into `mr` at `off` (the region locked
/// for each read, never across a wait). With `next`, each read goes on into where the message's
/// next segments would go (see `RxStream::try_read_ahead`).
async fn place(r: &mut RxStream<'_>, mr: &Arc<SoftMr>, off: usize, len: usize, next: Option<Next>, crc: &mut Crc) -> Result<(), RxError> {
    r.note_placement(len);
    let mut done = 0;
    while done < len {
        // Bytes read ahead are taken here if they are this segment's next ones; otherwise all
        // go back into the stream before anything is placed (into memory that may hold them).
        if !r.ahead.is_empty() {
            match r.take_ahead(mr, off + done, len - done) {
                Some(n) => {
                    // Read here ahead of the header that has now said they go here.
                    let mut mem = lock(&mr.mem);
                    let Some(b) = mem.placing(off + done..off + done + n) else {
                        return Err(RxError::Term(Term::DDP_CATASTROPHIC, "placement into read-only memory"));
                    };
                    crc.add(b);
                    mem.placed(off + done + n);
                    #[cfg(test)]
                    AHEAD_TAKEN.fetch_add(1, Ordering::Relaxed);
                    done += n;
                    continue;
                }
                // Not this segment's: back into the stream, before the region is locked (they
                // may lie in it).
                None => r.unahead()?,
            }
        }
        let got = {
            let mut mem = lock(&mr.mem);
            // Reading ahead reaches into the message's rest if the region holds it (it should:
            // a Read's sink and a receive's elements were checked when posted), and only if its
            // memory keeps what is put there until placed over: not a pooled region's, whose
            // bytes past what was written a local read or write clears (`Storage::Unwritten`).
            let then = next.as_ref().filter(|_| mem.keeps_bytes()).map_or(0, |x| x.then);
            let reach = if then > 0 && mem.placing(off + len..off + len + then).is_some() { then } else { 0 };
            let Some(all) = mem.placing(off + done..off + len + reach) else {
                return Err(RxError::Term(Term::DDP_CATASTROPHIC, "placement into read-only memory"));
            };
            let (dst, rest) = all.split_at_mut(len - done);
            let expected =
                next.as_ref().filter(|_| reach > 0).map(|x| Expected { rest, mr, off: off + len, pad: x.pad, seg: x.seg, hdr: x.hdr });
            match r.try_read_ahead(dst, expected) {
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
    /// Into a region, from an offset (an RDMA Write, a Read Response, a Send's into one
    /// element), and how many bytes after it the same message is expected to fill, contiguous
    /// in the same region: a Read Response's rest; when a Send goes on, the room left in its
    /// element, up to where the Send would end if as long as the last bulk one; 0 otherwise
    /// (see `RxStream::try_read_ahead`).
    Region(Arc<SoftMr>, usize, usize),
    /// A Send's, over its receive's elements in order: region, offset and bytes each; and how
    /// many bytes after the last the Send may still fill (as for `Region`).
    Scatter(SmallVec<[(Arc<SoftMr>, usize, usize); 2]>, usize),
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
