//! An in-memory link: PDUs pass through channels instead of a socket, so sessions can be tested
//! without I/O. [`pair`] gives the two ends; each end is a [`LinkRx`] and a [`LinkTx`] for a
//! [`crate::PduDatamover`], or can be driven by hand in a test through [`RawEnd`].

use crate::link::{LinkParams, LinkRx, LinkTx, RxHeader};
use bytes::Bytes;
use riser_datamover::{BoxFuture, DmError};
use riser_iscsi::keys::DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH;
use riser_iscsi::wire::{DecodeError, Header};
use tokio::sync::mpsc;

/// One PDU in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Header.
    pub header: Header,
    /// AHS.
    pub ahs: Bytes,
    /// Data segment.
    pub data: Bytes,
}

/// Receiving end of a loopback link.
#[derive(Debug)]
pub struct LoopRx {
    rx: mpsc::UnboundedReceiver<Frame>,
    current: Option<Bytes>,
    max_data: u32,
}

/// Sending end of a loopback link.
#[derive(Debug)]
pub struct LoopTx {
    tx: Option<mpsc::UnboundedSender<Frame>>,
}

/// Two connected ends: `(a_rx, a_tx)` and `(b_rx, b_tx)`.
pub fn pair() -> ((LoopRx, LoopTx), (LoopRx, LoopTx)) {
    let (a_tx, b_rx) = mpsc::unbounded_channel();
    let (b_tx, a_rx) = mpsc::unbounded_channel();
    let end = |rx, tx| (LoopRx { rx, current: None, max_data: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH }, LoopTx { tx: Some(tx) });
    (end(a_rx, a_tx), end(b_rx, b_tx))
}

impl LinkRx for LoopRx {
    fn read_header(&mut self) -> BoxFuture<'_, Result<Option<RxHeader>, DmError>> {
        Box::pin(async move {
            let Some(f) = self.rx.recv().await else {
                return Ok(None);
            };
            if f.data.len() > self.max_data as usize {
                return Err(DecodeError::DataSegmentTooLong { len: f.data.len() as u32, max: self.max_data }.into());
            }
            let data_len = f.data.len();
            self.current = Some(f.data);
            Ok(Some(RxHeader { header: f.header, ahs: f.ahs, data_len, malformed: None }))
        })
    }

    fn read_data<'a>(&'a mut self, dst: &'a mut [u8]) -> BoxFuture<'a, Result<(), DmError>> {
        Box::pin(async move {
            let src = self.current.take().unwrap_or_default();
            if src.len() != dst.len() {
                return Err(riser_datamover::Violation::SegmentLengthMismatch.into());
            }
            dst.copy_from_slice(&src);
            Ok(())
        })
    }

    fn set_params(&mut self, p: LinkParams) {
        self.max_data = p.max_recv_data_segment_length;
    }
}

impl LinkTx for LoopTx {
    fn queue_pdu(&mut self, header: &Header, ahs: &[u8], data: Bytes) -> Result<bool, DmError> {
        // Handed to the other end at once: nothing waits here.
        let tx = self.tx.as_ref().ok_or(DmError::Closed)?;
        tx.send(Frame { header: *header, ahs: Bytes::copy_from_slice(ahs), data }).map_err(|_| DmError::Closed)?;
        Ok(false)
    }

    fn would_gather(&self, _len: usize) -> bool {
        true
    }

    fn poll_flush(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), DmError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn set_params(&mut self, _p: LinkParams) {}

    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        self.tx = None;
        Box::pin(async {})
    }
}

/// A hand-driven end for tests: send and receive whole frames.
#[derive(Debug)]
pub struct RawEnd {
    /// Incoming frames.
    pub rx: LoopRx,
    /// Outgoing frames.
    pub tx: LoopTx,
}

impl RawEnd {
    /// Send a PDU.
    pub fn send(&self, header: Header, data: impl Into<Bytes>) -> Result<(), DmError> {
        let tx = self.tx.tx.as_ref().ok_or(DmError::Closed)?;
        tx.send(Frame { header, ahs: Bytes::new(), data: data.into() }).map_err(|_| DmError::Closed)
    }
    /// Receive the next PDU (`None` when the other end is gone).
    pub async fn recv(&mut self) -> Option<Frame> {
        self.rx.rx.recv().await
    }
}
