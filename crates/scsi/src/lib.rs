//! # riser-scsi — the SCSI command codec
//!
//! The bottom layer of riser: Command Descriptor Blocks (CDBs), sense data and the data-in /
//! parameter-list payloads that a SCSI block target (SBC-4 / SPC-5) and an initiator exchange.
//! It knows nothing of iSCSI, sockets or storage; it only turns bytes into typed values and back.
//!
//! * [`cdb::Cdb`] parses and builds every CDB a block target needs; unknown opcodes are kept raw
//!   so they round-trip and can be answered with `ILLEGAL REQUEST / INVALID COMMAND OPERATION CODE`.
//! * [`sense::Sense`] builds and parses fixed (0x70/0x71) and descriptor (0x72/0x73) sense data;
//!   [`sense::SenseKey`] and [`sense::AscAscq`] name the codes.
//! * [`lun::Lun`] is the SAM 8-byte LUN with peripheral and flat addressing.
//! * Payload modules: [`inquiry`] (standard data and VPD pages), [`capacity`] (READ CAPACITY,
//!   GET LBA STATUS), [`mode`] (MODE SENSE/SELECT pages), [`report`] (REPORT LUNS, REPORT SUPPORTED
//!   OPERATION CODES), [`unmap`] (UNMAP parameter list), [`pr`] (PERSISTENT RESERVE IN/OUT),
//!   [`alua`] (asymmetric access states, REPORT TARGET PORT GROUPS).
//!   [`copy`] (EXTENDED COPY parameter lists, RECEIVE COPY RESULTS data, VPD page 0x8F).
//!
//! Every parser is total: malformed input gives an error, never a panic.
//!
//! ```
//! use riser_scsi::cdb::{Cdb, Rw, CdbSize};
//! let cdb = Cdb::Read(Rw { size: CdbSize::Ten, lba: 2048, blocks: 8, ..Rw::default() });
//! let bytes = cdb.to_vec();
//! assert_eq!(bytes, [0x28, 0, 0, 0, 0x08, 0, 0, 0, 8, 0]);
//! assert_eq!(Cdb::parse(&bytes).unwrap(), cdb);
//! ```
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![warn(missing_docs)]

extern crate alloc;

pub mod alua;
pub mod capacity;
pub mod cdb;
pub mod copy;
pub mod inquiry;
pub mod lun;
pub mod mode;
pub mod pr;
pub mod report;
pub mod sense;
pub mod unmap;

mod be;

/// A payload or CDB was malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Fewer bytes than the structure needs.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// Which structure.
        what: &'static str,
        /// Bytes required.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A field holds a value this codec cannot represent; `byte`/`bit` locate it (SPC sense-key
    /// specific field pointer semantics).
    #[error("invalid field in {what} at byte {byte}")]
    InvalidField {
        /// Which structure.
        what: &'static str,
        /// Byte offset of the offending field.
        byte: u16,
        /// Bit position (0-7) if known.
        bit: Option<u8>,
    },
}

impl Error {
    /// The sense data a target returns (with CHECK CONDITION) when a CDB (`in_cdb`) or a
    /// parameter list fails to parse: INVALID FIELD IN CDB / PARAMETER LIST with a field
    /// pointer, or PARAMETER LIST LENGTH ERROR for a short parameter list.
    pub fn sense(&self, in_cdb: bool) -> sense::Sense {
        match *self {
            Self::InvalidField { byte, bit, .. } if in_cdb => sense::Sense::invalid_field_in_cdb(byte, bit),
            Self::InvalidField { byte, bit, .. } => sense::Sense::invalid_field_in_parameter_list(byte, bit),
            Self::Truncated { .. } if in_cdb => sense::Sense::invalid_field_in_cdb(0, None),
            Self::Truncated { .. } => sense::Sense::new(sense::SenseKey::ILLEGAL_REQUEST, sense::AscAscq::PARAMETER_LIST_LENGTH_ERROR),
        }
    }

    pub(crate) const fn truncated(what: &'static str, need: usize, have: usize) -> Self {
        Self::Truncated { what, need, have }
    }
}
