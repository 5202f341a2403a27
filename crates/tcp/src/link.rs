//! A PDU link: the byte-level half of a PDU-based datamover. The TCP datamover frames PDUs on a
//! socket (BHS, AHS, digests, padding); the loopback passes them through memory. Receiving is
//! split in two so that data segments land directly in their final buffer.

use bytes::Bytes;
use riser_datamover::{BoxFuture, BufferPool, DmError};
use riser_iscsi::keys::Digest;
use riser_iscsi::wire::{DecodeError, Header};
use std::sync::Arc;
use std::task::{Context, Poll};

/// A received PDU whose data segment has not been read yet.
#[derive(Debug)]
pub struct RxHeader {
    /// Parsed header.
    pub header: Header,
    /// AHS area.
    pub ahs: Bytes,
    /// DataSegmentLength: the caller must now read exactly this many bytes.
    pub data_len: usize,
    /// The PDU is well framed but its header breaks a rule whose answer is a Reject
    /// ([`DecodeError::reaction`]); `header` is then [`Header::Unknown`] with the raw BHS.
    /// Errors that lose framing are returned as errors instead.
    pub malformed: Option<DecodeError>,
}

/// Link framing parameters, effective from the next PDU (set after login).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkParams {
    /// Header digest.
    pub header_digest: Digest,
    /// Data digest.
    pub data_digest: Digest,
    /// Largest data segment accepted from the peer.
    pub max_recv_data_segment_length: u32,
}

impl Default for LinkParams {
    fn default() -> Self {
        Self {
            header_digest: Digest::None,
            data_digest: Digest::None,
            max_recv_data_segment_length: riser_iscsi::keys::DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
        }
    }
}

/// Receiving half.
pub trait LinkRx: Send {
    /// Next PDU header, or `None` at a clean end of stream.
    fn read_header(&mut self) -> BoxFuture<'_, Result<Option<RxHeader>, DmError>>;
    /// [`read_header`](Self::read_header) if the whole header is already here (read ahead):
    /// `None` when it would have to wait (nothing consumed). Default: always `None`.
    fn try_read_header(&mut self) -> Option<Result<Option<RxHeader>, DmError>> {
        None
    }
    /// Read the current PDU's data segment into `dst` (exactly `data_len` bytes), consuming
    /// padding and checking the data digest.
    fn read_data<'a>(&'a mut self, dst: &'a mut [u8]) -> BoxFuture<'a, Result<(), DmError>>;
    /// Apply new framing parameters.
    fn set_params(&mut self, p: LinkParams);
    /// Read and drop whatever the peer still sends, until it closes its side (or the link
    /// fails): the end of a graceful close. Default: nothing to read.
    fn drain(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Sending half. Its calls are polled or immediate, never boxed futures: a PDU is queued
/// ([`queue_pdu`](Self::queue_pdu)), and what is queued is written out by
/// [`poll_flush`](Self::poll_flush) — [`write_pdu`] and [`flush`] are the two as futures.
pub trait LinkTx: Send {
    /// Queue one PDU after everything queued before it: header (lengths filled from `ahs` and
    /// `data`), AHS, then the data segment. The link keeps `data` itself until it is written: a
    /// data segment is never copied. Returns whether what is queued must now be written out
    /// ([`poll_flush`](Self::poll_flush) before anything else is sent); `false` only while
    /// [gathering](Self::gather), for a PDU that waits for a later flush.
    fn queue_pdu(&mut self, header: &Header, ahs: &[u8], data: Bytes) -> Result<bool, DmError>;
    /// Whether a PDU with a data segment of `len` bytes, queued now, would wait for a later
    /// flush (gathering, and within the link's bounds): then sending it needs no I/O. Default:
    /// never.
    fn would_gather(&self, len: usize) -> bool {
        let _ = len;
        false
    }
    /// Write out what is queued; `Ready` once all of it is written (or the link failed).
    /// Progress is kept across `Pending`: polled again, it goes on where it stopped.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), DmError>>;
    /// Apply new framing parameters.
    fn set_params(&mut self, p: LinkParams);
    /// Close the sending direction (what was queued leaves first).
    fn shutdown(&mut self) -> BoxFuture<'_, ()>;
    /// Gather (`true`): PDUs queued from now on may wait in the link, in order, until the flush
    /// (or until a lot has gathered). Default: every PDU must leave at once.
    fn gather(&mut self, on: bool) {
        let _ = on;
    }
    /// Give the buffers of data segments written to `pool` when nothing else holds them (a
    /// gathering link holds them past the sender's own release). Default: they are dropped.
    fn recycle_into(&mut self, pool: Arc<BufferPool>) {
        let _ = pool;
    }
}

/// Send one PDU on `tx`: queued, and written out unless it waits, gathered, for a later flush.
pub async fn write_pdu<T: LinkTx + ?Sized>(tx: &mut T, header: &Header, ahs: &[u8], data: Bytes) -> Result<(), DmError> {
    if tx.queue_pdu(header, ahs, data)? { flush(tx).await } else { Ok(()) }
}

/// Write out what `tx` has queued.
pub async fn flush<T: LinkTx + ?Sized>(tx: &mut T) -> Result<(), DmError> {
    std::future::poll_fn(|cx| tx.poll_flush(cx)).await
}

/// What `poll_flush` does now, without waiting: `Some` once everything queued is written (or
/// the link failed), `None` when the rest must wait (progress is kept: [`flush`] goes on).
pub fn try_flush<T: LinkTx + ?Sized>(tx: &mut T) -> Option<Result<(), DmError>> {
    match tx.poll_flush(&mut Context::from_waker(std::task::Waker::noop())) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    }
}
