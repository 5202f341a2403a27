//! The transmit engine: the transmitter thread, which turns work requests and Read Responses
//! into FPDUs written from registered memory, and the non-blocking writer posters use inline.

use super::mr::SoftMr;
use super::qp::{PendingRead, QpShared, QpState};
use super::{lock, terminate_for};
use crate::wire::{self, Header, Opcode, QN_READ, QN_SEND, QN_TERMINATE, READ_REQUEST_LEN, ReadRequest, Term, TerminateMsg, UNTAGGED_HDR};
use riser_verbs::{Access, SendOp, SendWr, WcStatus};
use std::io::{self, IoSlice, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use tracing::debug;

/// Work for the transmitter.
#[derive(Debug)]
pub(super) enum TxItem {
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
pub(super) struct Unblocked<'a> {
    pub(super) sock: socket2::SockRef<'a>,
    pub(super) rest: Vec<u8>,
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

/// What writes to the stream: the transmitter thread, or a poster sending inline.
#[derive(Debug)]
pub(super) struct Engine {
    pub(super) w: TcpStream,
    pub(super) tx: Tx,
}

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

/// The transmitter thread: send the queued items in order until told to stop, then flush
/// what is left.
pub(super) fn transmit(s: &Arc<QpShared>, items: Receiver<TxItem>) {
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
    pub(super) fn work_request(&mut self, s: &QpShared, w: &mut impl Write, wr: &SendWr, stop: &dyn Fn() -> bool) -> TxOutcome {
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
    pub(super) fn read_response(
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
