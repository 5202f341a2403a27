//! The socket link: PDU framing on a TCP stream (BHS, AHS, optional CRC32C header digest, data
//! segment, padding, optional CRC32C data digest), read header-first so data segments land in
//! their final buffers, written with vectored writes.

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

/// Receiving half of a TCP link.
#[derive(Debug)]
pub struct TcpRx {
    r: OwnedReadHalf,
    p: LinkParams,
    data_len: usize,
}

impl TcpRx {
    /// Wrap a read half.
    pub fn new(r: OwnedReadHalf) -> Self {
        Self { r, p: LinkParams::default(), data_len: 0 }
    }
}

impl LinkRx for TcpRx {
    fn read_header(&mut self) -> BoxFuture<'_, Result<Option<RxHeader>, DmError>> {
        Box::pin(async move {
            let mut bhs = [0u8; BHS_LEN];
            // A clean EOF is only clean between PDUs.
            let n = self.r.read(&mut bhs).await.map_err(io_err)?;
            if n == 0 {
                return Ok(None);
            }
            self.r.read_exact(&mut bhs[n..]).await.map_err(io_err)?;
            let view = Bhs::new_unchecked(&bhs[..]);
            let layout = PduLayout::of(&view, self.p.max_recv_data_segment_length)?;
            let mut ahs = vec![0u8; layout.ahs_len];
            self.r.read_exact(&mut ahs).await.map_err(io_err)?;
            if self.p.header_digest == Digest::Crc32c {
                let mut d = [0u8; 4];
                self.r.read_exact(&mut d).await.map_err(io_err)?;
                if u32::from_le_bytes(d) != crc32c_append(crc32c(&bhs), &ahs) {
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
            Ok(Some(RxHeader { header, ahs: Bytes::from(ahs), data_len: layout.data_len, malformed }))
        })
    }

    fn read_data<'a>(&'a mut self, dst: &'a mut [u8]) -> BoxFuture<'a, Result<(), DmError>> {
        Box::pin(async move {
            if dst.len() != self.data_len {
                return Err(Violation::SegmentLengthMismatch.into());
            }
            self.r.read_exact(dst).await.map_err(io_err)?;
            let mut pad = [0u8; 3];
            let pad = &mut pad[..pad4(dst.len()) - dst.len()];
            self.r.read_exact(pad).await.map_err(io_err)?;
            if self.p.data_digest == Digest::Crc32c && !dst.is_empty() {
                let mut d = [0u8; 4];
                self.r.read_exact(&mut d).await.map_err(io_err)?;
                if u32::from_le_bytes(d) != crc32c_append(crc32c(dst), pad) {
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

/// Sending half of a TCP link.
#[derive(Debug)]
pub struct TcpTx {
    w: OwnedWriteHalf,
    p: LinkParams,
}

impl TcpTx {
    /// Wrap a write half.
    pub fn new(w: OwnedWriteHalf) -> Self {
        Self { w, p: LinkParams::default() }
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

impl LinkTx for TcpTx {
    fn write_pdu<'a>(&'a mut self, header: &'a Header, ahs: &'a [u8], data: &'a [&'a [u8]]) -> BoxFuture<'a, Result<(), DmError>> {
        Box::pin(async move {
            let dsl: usize = data.iter().map(|d| d.len()).sum();
            let mut head = Vec::with_capacity(BHS_LEN + ahs.len() + 4);
            let mut bhs = [0u8; BHS_LEN];
            header.emit(&mut bhs, ahs.len(), dsl as u32);
            head.extend_from_slice(&bhs);
            head.extend_from_slice(ahs);
            if self.p.header_digest == Digest::Crc32c {
                head.extend_from_slice(&crc32c(&head).to_le_bytes());
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
            let mut slices = Vec::with_capacity(data.len() + 2);
            slices.push(IoSlice::new(&head));
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
            let _ = self.w.shutdown().await;
        })
    }
}
