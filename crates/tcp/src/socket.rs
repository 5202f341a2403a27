//! The socket link: PDU framing on a TCP stream (BHS, AHS, optional CRC32C header digest, data
//! segment, padding, optional CRC32C data digest). Read ahead (one `recv` for every PDU that
//! has arrived), header first, so a large data segment still lands straight in its final buffer;
//! written with vectored writes, or gathered into one write while the link is told to gather.

use crate::PduDatamover;
use crate::link::{LinkParams, LinkRx, LinkTx, RxHeader};
use bytes::Bytes;
use riser_datamover::{BoxFuture, DmError, Violation};
use riser_iscsi::digest::{crc32c, crc32c_append};
use riser_iscsi::keys::{Digest, Role};
use riser_iscsi::wire::{BHS_LEN, Bhs, DecodeError, Header, PduLayout, Reaction, pad4};
use std::future::Future;
use std::io::{self, IoSlice};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// A [`PduDatamover`] over a connected TCP stream, and its receive driver (spawn it).
pub fn datamover(stream: TcpStream, role: Role) -> (PduDatamover, impl Future<Output = ()> + Send + 'static) {
    let _ = stream.set_nodelay(true);
    let (r, w) = stream.into_split();
    PduDatamover::new(role, Box::new(TcpRx::new(r)), Box::new(TcpTx::new(w)))
}

fn io_err(e: io::Error) -> DmError {
    DmError::from(e)
}

/// How many bytes the receiving half reads ahead: one `recv` takes in every PDU that has arrived
/// (up to this much), and they are parsed from memory. A data segment larger than what is left
/// to read of it past this size is read straight into its final buffer.
const READ_AHEAD: usize = 64 << 10;

/// Receiving half of a TCP link. It reads ahead into a buffer of [`READ_AHEAD`] bytes, so the
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
}

impl TcpRx {
    /// Wrap a read half.
    pub fn new(r: OwnedReadHalf) -> Self {
        Self { r, p: LinkParams::default(), data_len: 0, buf: vec![0; READ_AHEAD].into_boxed_slice(), start: 0, end: 0 }
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
            let got = self.r.read(&mut self.buf[self.end..]).await?;
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
            let mut bhs = [0u8; BHS_LEN];
            bhs.copy_from_slice(&self.buf[self.start..self.start + BHS_LEN]);
            let view = Bhs::new_unchecked(&bhs[..]);
            let layout = PduLayout::of(&view, self.p.max_recv_data_segment_length)?;
            self.start += BHS_LEN;
            let ahs =
                if layout.ahs_len == 0 { Bytes::new() } else { Bytes::copy_from_slice(self.take(layout.ahs_len).await.map_err(io_err)?) };
            if self.p.header_digest == Digest::Crc32c {
                let d = self.take(4).await.map_err(io_err)?;
                let d = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
                if d != crc32c_append(crc32c(&bhs), &ahs) {
                    return Err(DecodeError::HeaderDigest.into());
                }
            }
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
            Ok(Some(RxHeader { header, ahs, data_len: layout.data_len, malformed }))
        })
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
}

/// While gathering, a PDU of at most this many bytes is copied into the gathering buffer; a
/// larger one leaves at once (after what was gathered), its data written from where it is.
const GATHER_PDU_MAX: usize = 64 << 10;
/// Gathered bytes that are written out without waiting for the flush.
const GATHER_LIMIT: usize = 256 << 10;

/// Sending half of a TCP link. While [gathering](LinkTx::gather), small PDUs are copied into a
/// buffer that leaves in one write at the flush.
#[derive(Debug)]
pub struct TcpTx {
    w: OwnedWriteHalf,
    p: LinkParams,
    gather: bool,
    out: Vec<u8>,
}

impl TcpTx {
    /// Wrap a write half.
    pub fn new(w: OwnedWriteHalf) -> Self {
        Self { w, p: LinkParams::default(), gather: false, out: Vec::new() }
    }

    async fn write_out(&mut self) -> Result<(), DmError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = self.w.write_all(&self.out).await.map_err(io_err);
        self.out.clear();
        r
    }
}

/// Write every slice, retrying partial vectored writes.
async fn write_all_vectored<W: AsyncWrite + Unpin>(w: &mut W, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !bufs.is_empty() {
        let n = w.write_vectored(bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// Largest BHS + AHS + header digest (AHS: at most 255 words).
const HEAD_MAX: usize = BHS_LEN + 255 * 4 + 4;

impl LinkTx for TcpTx {
    fn write_pdu<'a>(&'a mut self, header: &'a Header, ahs: &'a [u8], data: &'a [&'a [u8]]) -> BoxFuture<'a, Result<(), DmError>> {
        Box::pin(async move {
            let dsl: usize = data.iter().map(|d| d.len()).sum();
            let mut head = [0u8; HEAD_MAX];
            header.emit((&mut head[..BHS_LEN]).try_into().expect("BHS_LEN bytes"), ahs.len(), dsl as u32);
            let mut head_len = BHS_LEN + ahs.len();
            head[BHS_LEN..head_len].copy_from_slice(ahs);
            if self.p.header_digest == Digest::Crc32c {
                let crc = crc32c(&head[..head_len]);
                head[head_len..head_len + 4].copy_from_slice(&crc.to_le_bytes());
                head_len += 4;
            }
            let mut tail = [0u8; 7];
            let pad = pad4(dsl) - dsl;
            let mut tail_len = pad;
            if self.p.data_digest == Digest::Crc32c && dsl > 0 {
                let crc = data.iter().fold(crc32c(&[]), |c, d| crc32c_append(c, d));
                let crc = crc32c_append(crc, &tail[..pad]);
                tail[pad..pad + 4].copy_from_slice(&crc.to_le_bytes());
                tail_len += 4;
            }
            if self.gather && dsl <= GATHER_PDU_MAX {
                self.out.extend_from_slice(&head[..head_len]);
                data.iter().for_each(|d| self.out.extend_from_slice(d));
                self.out.extend_from_slice(&tail[..tail_len]);
                if self.out.len() >= GATHER_LIMIT {
                    self.write_out().await?;
                }
                return Ok(());
            }
            // What was gathered leaves first: PDUs never overtake each other.
            self.write_out().await?;
            let mut slices = Vec::with_capacity(data.len() + 2);
            slices.push(IoSlice::new(&head[..head_len]));
            slices.extend(data.iter().filter(|d| !d.is_empty()).map(|d| IoSlice::new(d)));
            if tail_len > 0 {
                slices.push(IoSlice::new(&tail[..tail_len]));
            }
            write_all_vectored(&mut self.w, &mut slices).await.map_err(io_err)
        })
    }

    fn set_params(&mut self, p: LinkParams) {
        self.p = p;
    }

    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = self.write_out().await;
            let _ = self.w.shutdown().await;
        })
    }

    fn gather(&mut self, on: bool) {
        self.gather = on;
    }

    fn flush(&mut self) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(self.write_out())
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
            tx.write_pdu(&data_out(i), &[], &[&[i as u8; 100]]).await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(nothing_yet(&mut rx), "gathered PDUs left before the flush");
        tx.flush().await.unwrap();
        // A large PDU while gathering: the two small ones before it leave first.
        for i in 3..5u32 {
            tx.write_pdu(&data_out(i), &[], &[&[i as u8; 100]]).await.unwrap();
        }
        let big = vec![5u8; GATHER_PDU_MAX + 1];
        tx.write_pdu(&data_out(5), &[], &[&big]).await.unwrap();
        tx.write_pdu(&data_out(6), &[], &[&[6u8; 10]]).await.unwrap();
        tx.gather(false);
        tx.flush().await.unwrap();
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
                let d = payload(i, *len);
                tx.write_pdu(&data_out(i as u32), &[], &[&d]).await.unwrap();
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
}
