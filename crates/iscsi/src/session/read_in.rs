//! The initiator's side of a command's data as the target moves it (RFC 7143 §11.7, §11.8,
//! §7.1): a read's Data-In ([`ReadIn`]) and a write's R2Ts ([`R2tIn`]), checked before any byte
//! is placed or sent. Sans-IO: a datamover keeps one per task and moves only the bytes. Every
//! error here is the target's breach of the protocol; at ErrorRecoveryLevel 0 the initiator ends
//! the connection (as Linux's initiator does for a DataSN, offset or R2TSN error).

use super::residual::Residual;
use crate::wire::{DataIn, R2t, RESERVED_TAG};
use core::ops::Range;
use riser_scsi::sense::Status;

/// How a target broke the rules for a command's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DataInError {
    /// A Data-In (or R2T) whose DataSN (R2TSN) is not the next one (§11.7.5, §11.8.3).
    #[error("sequence number {got} where {expected} was next")]
    SequenceNumber {
        /// The next number.
        expected: u32,
        /// The number received.
        got: u32,
    },
    /// A Data-In whose offset does not continue the data (DataPDUInOrder and
    /// DataSequenceInOrder are Yes).
    #[error("Data-In at offset {got} where {expected} was next")]
    Offset {
        /// The next offset.
        expected: u32,
        /// The offset received.
        got: u32,
    },
    /// Data (or an R2T's range) beyond the command's expected transfer length.
    #[error("data up to byte {end} of a {len}-byte transfer")]
    BeyondLength {
        /// Where the data would end.
        end: u64,
        /// The expected transfer length.
        len: u32,
    },
    /// A GOOD status for a read whose data did not all arrive: the bytes the target says it
    /// moved (the expected length less an underflow residual) exceed what it sent.
    #[error("GOOD status after {got} bytes of read data where {due} were due")]
    Missing {
        /// Bytes received.
        got: u32,
        /// Bytes due.
        due: u32,
    },
    /// An R2T asking for no data, or with the reserved Target Transfer Tag (§11.8).
    #[error("an R2T for no data or with the reserved Target Transfer Tag")]
    EmptyR2t,
}

/// A read's Data-In as the initiator receives it: DataSN from 0, each PDU continuing where the
/// last ended (when DataPDUInOrder and DataSequenceInOrder are Yes, as riser always offers and
/// their OR makes them), within the command's expected length; a GOOD status only once every
/// byte it vouches for has arrived. [`place`](Self::place) before writing a PDU's bytes,
/// [`accept`](Self::accept) after, [`settle`](Self::settle) at the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadIn {
    len: u32,
    received: u32,
    next_sn: u32,
    in_order: bool,
}

impl ReadIn {
    /// A read of `len` expected bytes; `in_order`: DataPDUInOrder and DataSequenceInOrder both
    /// Yes (otherwise only the bounds are checked and bytes counted).
    pub const fn new(len: u32, in_order: bool) -> Self {
        Self { len, received: 0, next_sn: 0, in_order }
    }

    /// Where the `len` bytes of Data-In `d` go in the read buffer, or why they must not.
    pub fn place(&self, d: &DataIn, len: u32) -> Result<Range<usize>, DataInError> {
        let end = u64::from(d.buffer_offset) + u64::from(len);
        if end > u64::from(self.len) {
            return Err(DataInError::BeyondLength { end, len: self.len });
        }
        if self.in_order {
            if d.data_sn != self.next_sn {
                return Err(DataInError::SequenceNumber { expected: self.next_sn, got: d.data_sn });
            }
            if d.buffer_offset != self.received {
                return Err(DataInError::Offset { expected: self.received, got: d.buffer_offset });
            }
        }
        Ok(d.buffer_offset as usize..end as usize)
    }

    /// A [`place`](Self::place)d PDU's `len` bytes are in the buffer.
    pub fn accept(&mut self, len: u32) {
        self.next_sn = self.next_sn.wrapping_add(1);
        self.received = self.received.saturating_add(len).min(self.len);
    }

    /// The DataSN the next Data-In must carry (on a bidirectional command, the R2TSN of the next
    /// R2T: they share the numbering, §11.8.3).
    pub const fn next_sn(&self) -> u32 {
        self.next_sn
    }

    /// An R2T of the same (bidirectional) command took the next number of the shared
    /// DataSN/R2TSN space.
    pub fn r2t_numbered(&mut self) {
        self.next_sn = self.next_sn.wrapping_add(1);
    }

    /// Bytes received so far.
    pub const fn received(&self) -> u32 {
        self.received
    }

    /// Whether Data-In must arrive in order: then the bytes received are the read's first
    /// [`received`](Self::received), without a gap.
    pub const fn in_order(&self) -> bool {
        self.in_order
    }

    /// The command's status arrived: a GOOD status vouches for the expected length less an
    /// underflow residual, all of which must have arrived. Any other status vouches for no data.
    pub fn settle(&self, status: Status, residual: Residual) -> Result<(), DataInError> {
        if status != Status::GOOD {
            return Ok(());
        }
        let due = residual.keep(self.len as usize) as u32;
        if self.received < due {
            return Err(DataInError::Missing { got: self.received, due });
        }
        Ok(())
    }
}

/// A write's R2Ts as the initiator serves them: R2TSN from 0 (shared with DataSN on a
/// bidirectional command, see [`ReadIn::r2t_numbered`]), each asking for some data, all of it
/// within the write's length, never with the reserved Target Transfer Tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2tIn {
    len: u32,
    next_sn: u32,
}

impl R2tIn {
    /// A write of `len` bytes.
    pub const fn new(len: u32) -> Self {
        Self { len, next_sn: 0 }
    }

    /// The range of the write R2T `r` asks for, or why it must not be served. `numbered`: the
    /// R2TSN to expect, when the caller keeps the numbering (a bidirectional command's
    /// [`ReadIn`]); otherwise this write's own count is checked and advanced.
    pub fn serve(&mut self, r: &R2t, numbered: Option<u32>) -> Result<Range<usize>, DataInError> {
        let expected = numbered.unwrap_or(self.next_sn);
        if r.r2t_sn != expected {
            return Err(DataInError::SequenceNumber { expected, got: r.r2t_sn });
        }
        if r.desired_len == 0 || r.ttt == RESERVED_TAG {
            return Err(DataInError::EmptyR2t);
        }
        let end = u64::from(r.buffer_offset) + u64::from(r.desired_len);
        if end > u64::from(self.len) {
            return Err(DataInError::BeyondLength { end, len: self.len });
        }
        if numbered.is_none() {
            self.next_sn = self.next_sn.wrapping_add(1);
        }
        Ok(r.buffer_offset as usize..end as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_in(data_sn: u32, buffer_offset: u32) -> DataIn {
        DataIn { data_sn, buffer_offset, ..DataIn::default() }
    }

    fn r2t(r2t_sn: u32, buffer_offset: u32, desired_len: u32) -> R2t {
        R2t { r2t_sn, buffer_offset, desired_len, ttt: 7, ..R2t::default() }
    }

    #[test]
    fn data_in_must_continue_in_order_within_the_expected_length() {
        let mut r = ReadIn::new(8192, true);
        assert_eq!(r.place(&data_in(0, 0), 4096), Ok(0..4096));
        r.accept(4096);
        // §11.7.5: DataSN counts the Data-In of the command from 0.
        assert_eq!(r.place(&data_in(2, 4096), 4096), Err(DataInError::SequenceNumber { expected: 1, got: 2 }));
        assert_eq!(r.place(&data_in(1, 0), 4096), Err(DataInError::Offset { expected: 4096, got: 0 }));
        assert_eq!(r.place(&data_in(1, 4096), 4097), Err(DataInError::BeyondLength { end: 8193, len: 8192 }));
        assert_eq!(r.place(&data_in(1, u32::MAX), 4096), Err(DataInError::BeyondLength { end: u64::from(u32::MAX) + 4096, len: 8192 }));
        assert_eq!(r.place(&data_in(1, 4096), 4096), Ok(4096..8192));
        r.accept(4096);
        assert_eq!(r.received(), 8192);
        assert_eq!(r.settle(Status::GOOD, Residual::None), Ok(()));
    }

    #[test]
    fn out_of_order_data_is_only_bounded() {
        let mut r = ReadIn::new(8192, false);
        assert_eq!(r.place(&data_in(5, 4096), 4096), Ok(4096..8192));
        r.accept(4096);
        assert_eq!(r.place(&data_in(0, 0), 4096), Ok(0..4096));
        assert!(r.place(&data_in(0, 8000), 193).is_err());
    }

    #[test]
    fn a_good_status_needs_every_byte_it_vouches_for() {
        let mut r = ReadIn::new(4096, true);
        r.accept(512);
        assert_eq!(r.settle(Status::GOOD, Residual::None), Err(DataInError::Missing { got: 512, due: 4096 }));
        assert_eq!(r.settle(Status::GOOD, Residual::Underflow(3584)), Ok(()));
        assert_eq!(r.settle(Status::GOOD, Residual::Underflow(3000)), Err(DataInError::Missing { got: 512, due: 1096 }));
        // An overflow moved the expected length (the rest was not sent).
        assert!(r.settle(Status::GOOD, Residual::Overflow(10)).is_err());
        // A failed command vouches for no data.
        assert_eq!(r.settle(Status::CHECK_CONDITION, Residual::None), Ok(()));
        assert_eq!(ReadIn::new(4096, true).settle(Status::GOOD, Residual::Underflow(4096)), Ok(()));
    }

    #[test]
    fn r2ts_are_numbered_nonempty_and_within_the_write() {
        let mut w = R2tIn::new(65536);
        assert_eq!(w.serve(&r2t(0, 0, 32768), None), Ok(0..32768));
        assert_eq!(w.serve(&r2t(0, 32768, 32768), None), Err(DataInError::SequenceNumber { expected: 1, got: 0 }));
        assert_eq!(w.serve(&r2t(1, 32768, 32769), None), Err(DataInError::BeyondLength { end: 65537, len: 65536 }));
        assert_eq!(w.serve(&r2t(1, 32768, 0), None), Err(DataInError::EmptyR2t));
        assert_eq!(w.serve(&R2t { ttt: RESERVED_TAG, ..r2t(1, 0, 1) }, None), Err(DataInError::EmptyR2t));
        assert_eq!(w.serve(&r2t(1, 32768, 32768), None), Ok(32768..65536));
        // A bidirectional command's numbering is its read's.
        let mut read = ReadIn::new(4096, true);
        read.accept(4096);
        assert_eq!(w.serve(&r2t(2, 0, 4096), Some(read.next_sn())), Err(DataInError::SequenceNumber { expected: 1, got: 2 }));
        assert_eq!(w.serve(&r2t(1, 0, 4096), Some(read.next_sn())), Ok(0..4096));
        read.r2t_numbered();
        assert_eq!(read.place(&data_in(2, 4096), 0), Ok(4096..4096));
    }
}
