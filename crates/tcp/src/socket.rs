//! The socket link: PDU framing on a TCP stream (BHS, AHS, optional CRC32C header digest, data
//! segment, padding, optional CRC32C data digest). Read ahead (one `recv` for every PDU that
//! has arrived), header first, so a large data segment still lands straight in its final buffer;
//! written with vectored writes (framing copied, data segments referenced, never copied), several
//! PDUs in one write while the link is told to gather.

use crate::PduDatamover;
use crate::link::{LinkParams, LinkRx, LinkTx, RxHeader};
use bytes::Bytes;
use riser_datamover::{BoxFuture, BufferPool, DmError, Violation};
use riser_iscsi::digest::{crc32c, crc32c_append};
use riser_iscsi::keys::{Digest, Role};
use riser_iscsi::wire::{BHS_LEN, Bhs, DecodeError, Header, PduLayout, Reaction, pad4};
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// A [`PduDatamover`] over a connected TCP stream, and its receive driver (spawn it).
pub fn datamover(stream: TcpStream, role: Role) -> (PduDatamover, impl Future<Output = ()> + Send + 'static) {
    datamover_with(stream, role, SocketOptions::default())
}

/// [`datamover`] with `options`.
pub fn datamover_with(stream: TcpStream, role: Role, options: SocketOptions) -> (PduDatamover, impl Future<Output = ()> + Send + 'static) {
    let _ = stream.set_nodelay(true);
    let (r, w) = stream.into_split();
    PduDatamover::new(role, Box::new(TcpRx::new(r).busy_poll(options.busy_poll)), Box::new(TcpTx::new(w)))
}

/// How a TCP datamover uses its socket. The default is what suits most: no busy polling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketOptions {
    /// Busy polling: when the stream runs dry, keep looking for the next bytes for up to this
    /// long (between other ready tasks of the runtime) before sleeping until they arrive.
    ///
    /// A sleeping thread costs a wake-up when the answer comes: on a virtual machine, where
    /// waking an idle CPU is an interrupt through the hypervisor, that was most of a 4 KiB
    /// read's round trip at queue depth 1 (measured on the 2-core development VM, one side
    /// polling 50 µs: p50 74 → 31 µs). The price is CPU: a connection waiting for answers
    /// keeps a core busy for up to the budget each time the stream runs dry, so it suits
    /// latency-sensitive, low-queue-depth use; at high queue depth the next bytes are almost
    /// always there and it costs nearly nothing. `None` (the default): sleep at once.
    pub busy_poll: Option<std::time::Duration>,
}

impl SocketOptions {
    /// Set [`SocketOptions::busy_poll`].
    pub fn busy_poll(mut self, budget: Option<std::time::Duration>) -> Self {
        self.busy_poll = budget;
        self
    }
}

fn io_err(e: io::Error) -> DmError {
    DmError::from(e)
}

/// How many bytes the receiving half reads ahead: one `recv` takes in every PDU that has arrived
/// (up to this much), and they are parsed from memory. A data segment larger than what is left
/// to read of it past this size is read straight into its final buffer.
const READ_AHEAD: usize = 64 << 10;

/// Receiving half of a TCP link. It reads ahead into a buffer of 64 KiB, so the
/// PDUs of a burst cost one system call together instead of one or two each.
#[derive(Debug)]
pub struct TcpRx {
    r: OwnedReadHalf,
    p: LinkParams,
    data_len: usize,
    /// Bytes read from the socket and not consumed yet: `buf[start..end]`.
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// See [`SocketOptions::busy_poll`].
    busy_poll: Option<std::time::Duration>,
}

impl TcpRx {
    /// Wrap a read half.
    pub fn new(r: OwnedReadHalf) -> Self {
        Self { r, p: LinkParams::default(), data_len: 0, buf: vec![0; READ_AHEAD].into_boxed_slice(), start: 0, end: 0, busy_poll: None }
    }

    /// Poll for up to `budget` before sleeping when the stream runs dry (see
    /// [`SocketOptions::busy_poll`]); `None`: never.
    pub fn busy_poll(mut self, budget: Option<std::time::Duration>) -> Self {
        self.busy_poll = budget;
        self
    }

    /// Read what has arrived into the buffer's free part: polling for up to `budget` (the
    /// runtime's other ready tasks run between tries), then waiting as [`AsyncReadExt::read`].
    async fn read_polling(&mut self, budget: std::time::Duration) -> io::Result<usize> {
        let start = std::time::Instant::now();
        loop {
            match self.r.try_read(&mut self.buf[self.end..]) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if start.elapsed() >= budget {
                        return self.r.read(&mut self.buf[self.end..]).await;
                    }
                    tokio::task::yield_now().await;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Have at least `n` (at most [`READ_AHEAD`]) bytes buffered, reading whatever has arrived.
    /// `Ok(false)`: the stream ended with nothing buffered (a clean end between PDUs).
    async fn fill(&mut self, n: usize) -> io::Result<bool> {
        debug_assert!(n <= READ_AHEAD);
        if self.buffered() >= n {
            return Ok(true);
        }
        if self.start + n > READ_AHEAD {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.buffered() < n {
            let got = match self.busy_poll {
                Some(budget) => self.read_polling(budget).await?,
                None => self.r.read(&mut self.buf[self.end..]).await?,
            };
            if got == 0 {
                if self.buffered() == 0 {
                    return Ok(false);
                }
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.end += got;
        }
        Ok(true)
    }

    /// The length of the header that starts the buffer (BHS, AHS, header digest); the BHS is
    /// buffered.
    fn header_len(&self) -> Result<usize, DmError> {
        let view = Bhs::new_unchecked(&self.buf[self.start..self.start + BHS_LEN]);
        let layout = PduLayout::of(&view, self.p.max_recv_data_segment_length)?;
        Ok(BHS_LEN + layout.ahs_len + if self.p.header_digest == Digest::Crc32c { 4 } else { 0 })
    }

    /// Parse and consume the header that starts the buffer, all of it buffered
    /// ([`header_len`](Self::header_len) bytes).
    fn parse_header(&mut self) -> Result<RxHeader, DmError> {
        let mut bhs = [0u8; BHS_LEN];
        bhs.copy_from_slice(&self.buf[self.start..self.start + BHS_LEN]);
        let view = Bhs::new_unchecked(&bhs[..]);
        let layout = PduLayout::of(&view, self.p.max_recv_data_segment_length)?;
        let mut at = self.start + BHS_LEN;
        let ahs = if layout.ahs_len == 0 { Bytes::new() } else { Bytes::copy_from_slice(&self.buf[at..at + layout.ahs_len]) };
        at += layout.ahs_len;
        if self.p.header_digest == Digest::Crc32c {
            let d = &self.buf[at..at + 4];
            at += 4;
            if u32::from_le_bytes([d[0], d[1], d[2], d[3]]) != crc32c_append(crc32c(&bhs), &ahs) {
                return Err(DecodeError::HeaderDigest.into());
            }
        }
        self.start = at;
        for a in riser_iscsi::wire::AhsIter::new(&ahs) {
            a?;
        }
        // A header that is well framed but holds an impossible field is the session's to
        // reject; anything else wrong with it ends the connection.
        let (header, malformed) = match Header::parse(&view) {
            Ok(h) => (h, None),
            Err(e) if matches!(e.reaction(), Reaction::Reject(_)) => (Header::Unknown(bhs), Some(e)),
            Err(e) => return Err(e.into()),
        };
        self.data_len = layout.data_len;
        Ok(RxHeader { header, ahs, data_len: layout.data_len, malformed })
    }

    /// The next `n` (at most [`READ_AHEAD`]) bytes, consumed.
    async fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if !self.fill(n).await? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let at = self.start;
        self.start += n;
        Ok(&self.buf[at..at + n])
    }

    /// Fill `dst` with the next bytes of the stream: what is buffered, then the rest (straight
    /// from the socket when it is large, else through the buffer, which reads ahead).
    async fn read_into(&mut self, dst: &mut [u8]) -> io::Result<()> {
        let have = self.buffered().min(dst.len());
        dst[..have].copy_from_slice(&self.buf[self.start..self.start + have]);
        self.start += have;
        let rest = &mut dst[have..];
        if rest.len() >= READ_AHEAD / 2 {
            self.r.read_exact(rest).await?;
        } else if !rest.is_empty() {
            let src = self.take(rest.len()).await?;
            rest.copy_from_slice(src);
        }
        Ok(())
    }
}

impl LinkRx for TcpRx {
    fn read_header(&mut self) -> BoxFuture<'_, Result<Option<RxHeader>, DmError>> {
        Box::pin(async move {
            // A clean EOF is only clean between PDUs.
            if !self.fill(BHS_LEN).await.map_err(io_err)? {
                return Ok(None);
            }
            let len = self.header_len()?;
            if !self.fill(len).await.map_err(io_err)? {
                return Err(io_err(io::ErrorKind::UnexpectedEof.into()));
            }
            self.parse_header().map(Some)
        })
    }

    fn try_read_header(&mut self) -> Option<Result<Option<RxHeader>, DmError>> {
        if self.buffered() < BHS_LEN {
            return None;
        }
        match self.header_len() {
            Ok(len) if self.buffered() >= len => Some(self.parse_header().map(Some)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        }
    }

    fn read_data<'a>(&'a mut self, dst: &'a mut [u8]) -> BoxFuture<'a, Result<(), DmError>> {
        Box::pin(async move {
            if dst.len() != self.data_len {
                return Err(Violation::SegmentLengthMismatch.into());
            }
            self.read_into(dst).await.map_err(io_err)?;
            let pad_len = pad4(dst.len()) - dst.len();
            let digest = self.p.data_digest == Digest::Crc32c && !dst.is_empty();
            let tail = self.take(pad_len + if digest { 4 } else { 0 }).await.map_err(io_err)?;
            if digest {
                let (pad, d) = tail.split_at(pad_len);
                if u32::from_le_bytes([d[0], d[1], d[2], d[3]]) != crc32c_append(crc32c(dst), pad) {
                    // ERL 0: a data digest error ends the connection.
                    return Err(DecodeError::DataDigest.into());
                }
            }
            self.data_len = 0;
            Ok(())
        })
    }

    fn set_params(&mut self, p: LinkParams) {
        self.p = p;
    }

    fn drain(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            while let Ok(n) = self.r.read(&mut self.buf[..]).await
                && n > 0
            {}
            (self.start, self.end) = (0, 0);
        })
    }
}

/// While gathering, a PDU whose data segment is at most this many bytes waits for the flush; a
/// larger one leaves at once, in one vectored write with what was gathered before it.
const GATHER_PDU_MAX: usize = 64 << 10;
/// Gathered bytes that are written out without waiting for the flush.
const GATHER_LIMIT: usize = 256 << 10;
/// Slices one vectored write may take (Linux's `IOV_MAX`): gathering stops short of it, so what
/// was gathered always leaves in one `writev` (more only when the socket takes part of it).
const IOV_MAX: usize = 1024;
/// Slices one PDU adds at most: its framing (BHS, AHS, header digest), its data segment, and the
/// padding with the data digest.
const PDU_SLICES: usize = 3;

/// One piece of what waits to be written: framing bytes copied into [`TcpTx::framing`] (BHS,
/// AHS, digests, padding; consecutive ones are one piece), or a data segment, referenced.
#[derive(Debug)]
enum Piece {
    /// `framing[previous framing piece's end..end]`.
    Framing { end: usize },
    /// A data segment, as the sender handed it (never copied).
    Data(Bytes),
}

/// Sending half of a TCP link (`W`: the socket's write half; tests use other writers). Each PDU
/// is written with its data segment where it is: the framing is copied into a small buffer, the
/// data segment kept by reference, and the pieces leave in one vectored write. While
/// [gathering](LinkTx::gather), PDUs wait that way until the flush (or 256 KiB of them, or a
/// PDU larger than 64 KiB), then leave together.
#[derive(Debug)]
pub struct TcpTx<W = OwnedWriteHalf> {
    w: W,
    p: LinkParams,
    gather: bool,
    /// The framing of the PDUs waiting, copied.
    framing: Vec<u8>,
    /// What waits, in order: framing and data segments.
    pieces: Vec<Piece>,
    /// Bytes waiting (framing and data).
    waiting: usize,
    /// Of those, the bytes a partial write already took.
    sent: usize,
    /// Where written data segments' buffers go back to ([`LinkTx::recycle_into`]).
    pool: Option<Arc<BufferPool>>,
}

impl<W: AsyncWrite + Unpin + Send> TcpTx<W> {
    /// Wrap a write half.
    pub fn new(w: W) -> Self {
        Self { w, p: LinkParams::default(), gather: false, framing: Vec::new(), pieces: Vec::new(), waiting: 0, sent: 0, pool: None }
    }

    /// The framing bytes appended since `from` become (or join) a framing piece.
    fn framed(&mut self, from: usize) {
        let end = self.framing.len();
        self.waiting += end - from;
        match self.pieces.last_mut() {
            Some(Piece::Framing { end: e }) => *e = end,
            _ => self.pieces.push(Piece::Framing { end }),
        }
    }

    /// Write out what waits: one vectored write (more if the socket takes only part of it).
    /// What a partial write took stays written: polled again, it goes on from there.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), DmError>> {
        while self.sent < self.waiting {
            let mut slices = Vec::with_capacity(self.pieces.len());
            let (mut at, mut skip) = (0, self.sent);
            for p in &self.pieces {
                let bytes = match p {
                    Piece::Framing { end } => {
                        let b = &self.framing[at..*end];
                        at = *end;
                        b
                    }
                    Piece::Data(d) => &d[..],
                };
                if skip >= bytes.len() {
                    skip -= bytes.len();
                    continue;
                }
                slices.push(IoSlice::new(&bytes[skip..]));
                skip = 0;
            }
            debug_assert!(slices.len() <= IOV_MAX);
            let n = match Pin::new(&mut self.w).poll_write_vectored(cx, &slices) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => Err(io::Error::from(io::ErrorKind::WriteZero)),
                Poll::Ready(r) => r,
            };
            drop(slices);
            match n {
                Ok(n) => self.sent += n,
                Err(e) => {
                    self.written();
                    return Poll::Ready(Err(io_err(e)));
                }
            }
        }
        self.written();
        Poll::Ready(Ok(()))
    }

    /// What waited is gone (written, or lost with the link).
    fn written(&mut self) {
        for p in self.pieces.drain(..) {
            // Read data the target has let go of: its buffer serves a later command.
            if let (Piece::Data(d), Some(pool)) = (p, &self.pool)
                && let Ok(buf) = d.try_into_mut()
            {
                pool.give(buf);
            }
        }
        self.framing.clear();
        (self.waiting, self.sent) = (0, 0);
    }

    /// Whether what waits must be written out now.
    fn must_write(&self) -> bool {
        !self.gather || self.waiting >= GATHER_LIMIT || self.pieces.len() > IOV_MAX - PDU_SLICES
    }
}

impl<W: AsyncWrite + Unpin + Send> LinkTx for TcpTx<W> {
    fn queue_pdu(&mut self, header: &Header, ahs: &[u8], data: Bytes) -> Result<bool, DmError> {
        let dsl = data.len();
        // BHS, AHS, header digest.
        let from = self.framing.len();
        self.framing.resize(from + BHS_LEN, 0);
        let bhs: &mut [u8; BHS_LEN] = (&mut self.framing[from..]).try_into().expect("BHS_LEN bytes");
        header.emit(bhs, ahs.len(), dsl as u32);
        self.framing.extend_from_slice(ahs);
        if self.p.header_digest == Digest::Crc32c {
            let crc = crc32c(&self.framing[from..]);
            self.framing.extend_from_slice(&crc.to_le_bytes());
        }
        self.framed(from);
        if dsl > 0 {
            // The data segment by reference; its padding and digest with the framing.
            let pad = [0u8; 3];
            let pad = &pad[..pad4(dsl) - dsl];
            let digest = (self.p.data_digest == Digest::Crc32c).then(|| crc32c_append(crc32c(&data), pad));
            self.waiting += dsl;
            self.pieces.push(Piece::Data(data));
            let from = self.framing.len();
            self.framing.extend_from_slice(pad);
            if let Some(crc) = digest {
                self.framing.extend_from_slice(&crc.to_le_bytes());
            }
            if self.framing.len() > from {
                self.framed(from);
            }
        }
        // What was gathered leaves first, with this PDU: PDUs never overtake each other.
        Ok(dsl > GATHER_PDU_MAX || self.must_write())
    }

    fn would_gather(&self, len: usize) -> bool {
        // The most a PDU adds: BHS, header digest, padding, data digest (an AHS only on commands).
        const FRAMING_MAX: usize = BHS_LEN + 4 + 3 + 4;
        self.gather
            && len <= GATHER_PDU_MAX
            && self.waiting + len + FRAMING_MAX < GATHER_LIMIT
            && self.pieces.len() + PDU_SLICES <= IOV_MAX - PDU_SLICES
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), DmError>> {
        self.poll_write_out(cx)
    }

    fn set_params(&mut self, p: LinkParams) {
        self.p = p;
    }

    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = std::future::poll_fn(|cx| self.poll_write_out(cx)).await;
            let _ = self.w.shutdown().await;
        })
    }

    fn gather(&mut self, on: bool) {
        self.gather = on;
    }

    fn recycle_into(&mut self, pool: Arc<BufferPool>) {
        self.pool = Some(pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_iscsi::wire::DataOut;
    use riser_scsi::lun::Lun;
    use tokio::net::TcpListener;

    async fn connected() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    fn data_out(n: u32) -> Header {
        Header::DataOut(DataOut { final_: true, lun: Lun::ZERO, itt: n, ttt: 7, exp_stat_sn: 0, data_sn: n, buffer_offset: 0 })
    }

    /// While gathering, small PDUs wait for the flush and then leave together; a large one
    /// leaves at once, after what was gathered before it: the order is always the sending order.
    #[tokio::test]
    async fn gathered_pdus_leave_at_the_flush_in_order() {
        let (a, b) = connected().await;
        let (_, w) = a.into_split();
        let mut tx = TcpTx::new(w);
        let (r, _keep) = b.into_split();
        let mut rx = TcpRx::new(r);
        rx.set_params(LinkParams { max_recv_data_segment_length: 1 << 20, ..LinkParams::default() });
        let nothing_yet = |rx: &mut TcpRx| {
            let mut probe = [0u8; 1];
            matches!(rx.r.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
        };
        tx.gather(true);
        for i in 0..3u32 {
            crate::link::write_pdu(&mut tx, &data_out(i), &[], Bytes::from(vec![i as u8; 100])).await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(nothing_yet(&mut rx), "gathered PDUs left before the flush");
        crate::link::flush(&mut tx).await.unwrap();
        // A large PDU while gathering: the two small ones before it leave first.
        for i in 3..5u32 {
            crate::link::write_pdu(&mut tx, &data_out(i), &[], Bytes::from(vec![i as u8; 100])).await.unwrap();
        }
        let big = Bytes::from(vec![5u8; GATHER_PDU_MAX + 1]);
        crate::link::write_pdu(&mut tx, &data_out(5), &[], big).await.unwrap();
        crate::link::write_pdu(&mut tx, &data_out(6), &[], Bytes::from_static(&[6u8; 10])).await.unwrap();
        tx.gather(false);
        crate::link::flush(&mut tx).await.unwrap();
        for i in 0..7u32 {
            let h = rx.read_header().await.unwrap().unwrap();
            assert_eq!(h.header, data_out(i));
            let mut d = vec![0u8; h.data_len];
            rx.read_data(&mut d).await.unwrap();
            assert!(d.iter().all(|b| *b == i as u8), "PDU {i}");
        }
    }

    /// PDUs with both digests, written by `TcpTx`, arrive cut at arbitrary points (from single
    /// bytes to many PDUs in one read, segments smaller and larger than the read-ahead): every
    /// header and segment comes out whole and in order, a clean end of stream only between PDUs.
    #[tokio::test]
    async fn pdus_cut_anywhere_are_framed_whole() {
        let p = LinkParams { header_digest: Digest::Crc32c, data_digest: Digest::Crc32c, max_recv_data_segment_length: 1 << 20 };
        let lens = [0usize, 1, 3, 4, 48, 4095, 4096, 40_000, READ_AHEAD + 5, 200_000, 7];
        // The wire bytes, as TcpTx writes them.
        let (a, b) = connected().await;
        let (_, w) = a.into_split();
        let mut tx = TcpTx::new(w);
        tx.set_params(p);
        let payload = |i: usize, len: usize| (0..len).map(|k| (k * 31 + i) as u8).collect::<Vec<u8>>();
        let writer = tokio::spawn(async move {
            for (i, len) in lens.iter().enumerate() {
                crate::link::write_pdu(&mut tx, &data_out(i as u32), &[], payload(i, *len).into()).await.unwrap();
            }
        });
        let mut wire = Vec::new();
        let mut b = b;
        let reader = async {
            b.read_to_end(&mut wire).await.unwrap();
        };
        let (w, ()) = tokio::join!(writer, reader);
        w.unwrap();
        for chunk in [1usize, 5, 47, 48, 1000, 70_000, usize::MAX] {
            let (a, b) = connected().await;
            let (r, _keep) = b.into_split();
            let mut rx = TcpRx::new(r);
            rx.set_params(p);
            let bytes = wire.clone();
            let feeder = tokio::spawn(async move {
                let mut a = a;
                for c in bytes.chunks(chunk.min(bytes.len())) {
                    a.write_all(c).await.unwrap();
                    if chunk < 100 {
                        tokio::task::yield_now().await;
                    }
                }
            });
            for (i, len) in lens.iter().enumerate() {
                let h = rx.read_header().await.unwrap().expect("a PDU");
                assert_eq!(h.header, data_out(i as u32), "chunk {chunk}");
                assert_eq!(h.data_len, *len);
                let mut d = vec![0u8; *len];
                rx.read_data(&mut d).await.unwrap();
                assert_eq!(d, payload(i, *len), "chunk {chunk}, PDU {i}");
            }
            feeder.await.unwrap();
            assert!(rx.read_header().await.unwrap().is_none(), "a clean end between PDUs");
        }
        // An end of stream inside a PDU is an error, not a clean end.
        let (a, b) = connected().await;
        let (r, _keep) = b.into_split();
        let mut rx = TcpRx::new(r);
        rx.set_params(p);
        let mut a = a;
        a.write_all(&wire[..20]).await.unwrap();
        drop(a);
        assert!(rx.read_header().await.is_err());
        // A corrupted data segment fails its digest.
        let (a, b) = connected().await;
        let (r, _keep) = b.into_split();
        let mut rx = TcpRx::new(r);
        rx.set_params(p);
        let mut bad = wire.clone();
        let first_data = 2 * (BHS_LEN + 4); // PDU 0 (empty), then PDU 1's header and its digest
        bad[first_data] ^= 1;
        let mut a = a;
        a.write_all(&bad).await.unwrap();
        assert!(rx.read_header().await.unwrap().is_some());
        rx.read_data(&mut []).await.unwrap();
        let h = rx.read_header().await.unwrap().unwrap();
        assert_eq!(h.data_len, 1);
        assert_eq!(rx.read_data(&mut [0u8]).await, Err(DecodeError::DataDigest.into()));
    }

    /// A writer that takes a few bytes per call (1 to 7, across slice boundaries), and now and
    /// then nothing yet (`Pending`); it notes the most slices one call was offered.
    #[derive(Debug, Default)]
    struct Trickle {
        wire: Vec<u8>,
        calls: usize,
        most_slices: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
            let me = self.get_mut();
            me.calls += 1;
            me.most_slices = me.most_slices.max(bufs.len());
            if me.calls.is_multiple_of(5) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let mut room = me.calls % 7 + 1;
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(room);
                me.wire.extend_from_slice(&b[..k]);
                n += k;
                room -= k;
                if room == 0 {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// What gathered, written out by polls that find the socket full now and then
    /// ([`crate::link::try_flush`], the datamover's flush without waiting): each poll goes on
    /// where the last stopped, and the bytes are those of the PDUs written one by one; while
    /// something waits, the link wants no more queued without a flush.
    #[tokio::test]
    async fn a_flush_that_stops_goes_on_where_it_stopped() {
        let p = LinkParams { header_digest: Digest::Crc32c, data_digest: Digest::Crc32c, max_recv_data_segment_length: 1 << 20 };
        let pdus: Vec<(Header, Bytes)> = (0..300u32)
            .map(|i| (data_out(i), Bytes::from((0..i as usize * 13 % 4001).map(|k| (k + i as usize) as u8).collect::<Vec<u8>>())))
            .collect();
        let mut one_by_one = TcpTx::new(Vec::new());
        one_by_one.set_params(p);
        for (h, d) in &pdus {
            crate::link::write_pdu(&mut one_by_one, h, &[], d.clone()).await.unwrap();
        }
        let mut tx = TcpTx::new(Trickle::default());
        tx.set_params(p);
        tx.gather(true);
        let (mut stopped, mut polls) = (0, 0);
        for chunk in pdus.chunks(37) {
            for (h, d) in chunk {
                assert!(tx.would_gather(d.len()));
                assert!(!tx.queue_pdu(h, &[], d.clone()).unwrap(), "a small PDU waits while gathering");
            }
            loop {
                polls += 1;
                match crate::link::try_flush(&mut tx) {
                    Some(r) => break r.unwrap(),
                    None => {
                        stopped += 1;
                        assert!(tx.sent > 0 || tx.w.calls % 5 == 0, "progress is kept");
                    }
                }
            }
            assert!(tx.pieces.is_empty() && tx.framing.is_empty() && tx.waiting == 0);
        }
        assert!(stopped > 10, "the writer never stopped a flush ({polls} polls)");
        assert_eq!(tx.w.wire, one_by_one.w, "bytes differ from the PDUs written one by one");
    }

    /// A data segment the sender has let go of while it waited in the gathering link goes back
    /// to the link's pool once written (a 4 KiB read's buffer serves the next read: no
    /// allocation and zero-fill per command); one the sender still holds does not.
    #[tokio::test]
    async fn written_segments_nobody_holds_go_back_to_the_pool() {
        let pool = Arc::new(BufferPool::default());
        let mut tx = TcpTx::new(Vec::new());
        tx.recycle_into(pool.clone());
        tx.gather(true);
        let let_go = Bytes::from(vec![1u8; 4096]);
        let at = let_go.as_ptr();
        let kept = Bytes::from(vec![2u8; 4096]);
        crate::link::write_pdu(&mut tx, &data_out(1), &[], let_go).await.unwrap();
        crate::link::write_pdu(&mut tx, &data_out(2), &[], kept.clone()).await.unwrap();
        crate::link::flush(&mut tx).await.unwrap();
        assert_eq!(tx.w.len(), 2 * (BHS_LEN + 4096));
        // A pooled buffer comes back as it was (`take_dirty_vec`), a fresh one zeroed.
        let again = pool.take_dirty_vec(4096);
        assert!(again.as_ptr() == at && again.iter().all(|&b| b == 1), "the written buffer nobody held was not pooled");
        let other = pool.take_dirty_vec(4096);
        assert!(other.iter().all(|&b| b == 0), "a buffer its sender still holds was pooled");
    }

    /// Gathered PDUs with both digests (a command with an extended-CDB AHS, more small PDUs
    /// than one vectored write may take slices for, one larger than [`GATHER_PDU_MAX`]) written
    /// to a socket that takes a few bytes per call: the bytes are exactly those of the same PDUs
    /// written one by one, every header and data segment comes out whole, in order, with good
    /// digests, and no write is offered more than [`IOV_MAX`] slices. A gathered data segment
    /// is the sender's buffer, not a copy.
    #[tokio::test]
    async fn gathered_pdus_survive_partial_vectored_writes() {
        let p = LinkParams { header_digest: Digest::Crc32c, data_digest: Digest::Crc32c, max_recv_data_segment_length: 1 << 20 };
        let mut ahs = Vec::new();
        riser_iscsi::wire::extended_cdb_ahs(&mut ahs, &[0xee; 16]);
        let command = Header::ScsiCommand(riser_iscsi::wire::ScsiCommand {
            write: true,
            itt: 77,
            expected_data_len: 4096,
            cdb: [0x7f; 16],
            ..Default::default()
        });
        let payload = |i: usize, len: usize| Bytes::from((0..len).map(|k| (k * 7 + i) as u8).collect::<Vec<u8>>());
        // (header, AHS, data): the command, 1 200 small Data-Outs (0 to 6 bytes: every
        // padding), a large one, and a few small ones after it.
        let mut pdus = vec![(command, ahs.clone(), payload(0, 1000))];
        pdus.extend((1..=1200).map(|i| (data_out(i), Vec::new(), payload(i as usize, i as usize % 7))));
        pdus.push((data_out(1201), Vec::new(), payload(1201, GATHER_PDU_MAX + 3)));
        pdus.extend((1202..1205).map(|i| (data_out(i), Vec::new(), payload(i as usize, 100))));

        let mut one_by_one = TcpTx::new(Vec::new());
        one_by_one.set_params(p);
        for (h, a, d) in &pdus {
            crate::link::write_pdu(&mut one_by_one, h, a, d.clone()).await.unwrap();
        }
        let mut tx = TcpTx::new(Trickle::default());
        tx.set_params(p);
        tx.gather(true);
        let mut kept_segments = 0;
        for (h, a, d) in &pdus {
            crate::link::write_pdu(&mut tx, h, a, d.clone()).await.unwrap();
            if !d.is_empty() && !tx.pieces.is_empty() {
                // Still waiting: its data segment is the last one kept.
                let kept = tx.pieces.iter().rev().find_map(|p| if let Piece::Data(k) = p { Some(k) } else { None });
                assert_eq!(kept.map(|k| k.as_ptr()), Some(d.as_ptr()), "a gathered data segment was copied");
                kept_segments += 1;
            }
        }
        assert!(kept_segments > 1000);
        crate::link::flush(&mut tx).await.unwrap();
        assert!(tx.pieces.is_empty() && tx.framing.is_empty());
        let t = &tx.w;
        assert_eq!(t.wire, one_by_one.w, "gathered bytes differ from the PDUs written one by one");
        assert!(t.most_slices <= IOV_MAX, "{} slices in one write", t.most_slices);
        assert!(t.most_slices > IOV_MAX / 2, "little was gathered: {} slices at most", t.most_slices);
        assert!(t.calls > t.wire.len() / 7, "the writer took more than it should");

        // Read back through the receiving half: framing, digests, order.
        let (a, b) = connected().await;
        let (r, _keep) = b.into_split();
        let mut rx = TcpRx::new(r);
        rx.set_params(p);
        let wire = t.wire.clone();
        let feeder = tokio::spawn(async move {
            let mut a = a;
            a.write_all(&wire).await.unwrap();
        });
        for (i, (h, a, d)) in pdus.iter().enumerate() {
            let got = rx.read_header().await.unwrap().expect("a PDU");
            assert_eq!((&got.header, &got.ahs[..]), (h, &a[..]), "PDU {i}");
            let mut data = vec![0u8; got.data_len];
            rx.read_data(&mut data).await.unwrap();
            assert_eq!(data, d[..], "PDU {i}");
        }
        feeder.await.unwrap();
        assert!(rx.read_header().await.unwrap().is_none());
    }
}
