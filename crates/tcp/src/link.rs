//! A PDU link: the byte-level half of a PDU-based datamover. The TCP datamover frames PDUs on a
//! socket (BHS, AHS, digests, padding); the loopback passes them through memory. Receiving is
//! split in two so that data segments land directly in their final buffer.

use bytes::Bytes;
use riser_datamover::{BoxFuture, BufferPool, DmError};
use riser_iscsi::keys::Digest;
use riser_iscsi::wire::{DecodeError, Header};
use std::sync::Arc;

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

/// Sending half.
pub trait LinkTx: Send {
    /// Write one PDU: header (lengths filled from `ahs` and `data`), AHS, then the data
    /// segment. The link keeps `data` itself until it is written (a gathering link past this
    /// call): a data segment is never copied.
    fn write_pdu<'a>(&'a mut self, header: &'a Header, ahs: &'a [u8], data: Bytes) -> BoxFuture<'a, Result<(), DmError>>;
    /// Apply new framing parameters.
    fn set_params(&mut self, p: LinkParams);
    /// Close the sending direction (what was gathered leaves first).
    fn shutdown(&mut self) -> BoxFuture<'_, ()>;
    /// Gather (`true`): PDUs written from now on may wait in the link, in order, until
    /// [`flush`](Self::flush) (or until a lot has gathered). Default: every PDU leaves at once.
    fn gather(&mut self, on: bool) {
        let _ = on;
    }
    /// Write out what was gathered.
    fn flush(&mut self) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(async { Ok(()) })
    }
    /// Give the buffers of data segments written to `pool` when nothing else holds them (a
    /// gathering link holds them past the sender's own release). Default: they are dropped.
    fn recycle_into(&mut self, pool: Arc<BufferPool>) {
        let _ = pool;
    }
}
