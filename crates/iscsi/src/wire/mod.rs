//! The iSCSI wire format: the BHS view, per-opcode header values, AHS, and whole PDUs.
//!
//! Two levels, as in smoltcp: [`Bhs`] is a zero-copy view over header bytes with getters and
//! setters; [`Header`] is an owned value per opcode holding only the fields that opcode defines.
//! [`Pdu`] joins a header with its AHS and data segment, which stay slices of (or `Bytes` handles
//! into) the receive buffer: data is never copied into a PDU value.
//!
//! Contract: [`Pdu::parse`] never panics; reserved fields are ignored on parse and written as
//! zero on emit. Digests and padding on the stream are the TCP datamover's business; `Pdu`
//! knows only the padding needed to find the next PDU in a contiguous buffer.
//!
//! Layout, as h2's `frame/`: `bhs.rs` names the offsets every BHS shares, each PDU family has
//! its file (`nop.rs`, `scsi.rs`, `task_mgmt.rs`, `login.rs`, `text.rs`, `data.rs`, `logout.rs`,
//! `snack.rs`, `async_msg.rs`, `reject.rs`) holding its header structs, their `parse` and `emit`
//! over named field offsets, its code spaces and its byte-array tests, and `pdu.rs` dispatches
//! by opcode ([`Header`]) and frames whole PDUs ([`Pdu`], [`PduLayout`]).

/// An open code space: a newtype over the wire value with named constants, whose `Debug` prints
/// the constant's name (or the type and the value when unassigned).
macro_rules! code_space {
    ($(#[$m:meta])* $name:ident($ty:ty) { $($(#[$cm:meta])* $c:ident = $v:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $ty);
        impl $name {
            $($(#[$cm])* pub const $c: Self = Self($v);)*
        }
        impl ::core::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                match self.0 {
                    $($v => f.write_str(stringify!($c)),)*
                    other => write!(f, "{}({:#x})", stringify!($name), other),
                }
            }
        }
    };
}

mod ahs;
mod async_msg;
mod bhs;
mod data;
mod login;
mod logout;
mod nop;
mod pdu;
mod reject;
mod scsi;
mod snack;
mod task_mgmt;
mod text;

pub use ahs::{AHS_BIDI_READ_LENGTH, AHS_EXTENDED_CDB, Ahs, AhsIter, bidi_read_length_ahs, extended_cdb_ahs};
pub use async_msg::{AsyncEvent, AsyncMessage};
pub use bhs::{BHS_LEN, Bhs, FINAL, IMMEDIATE, pad4};
pub use data::{DataIn, DataOut, R2t};
pub use login::{LoginRequest, LoginResponse, LoginStatus};
pub use logout::{LogoutReason, LogoutRequest, LogoutResponse, LogoutResponseCode};
pub use nop::{NopIn, NopOut};
pub use pdu::{Header, Isid, Pdu, PduLayout, Stage};
pub use reject::{Reject, RejectReason};
pub use scsi::{ScsiCommand, ScsiResponse};
pub use snack::Snack;
pub use task_mgmt::{TaskMgmtRequest, TaskMgmtResponse, TmfFunction, TmfResponse};
pub use text::{TextRequest, TextResponse};

use core::fmt;

/// Largest DataSegmentLength the 24-bit field can express.
pub const MAX_DATA_SEGMENT_LEN: u32 = (1 << 24) - 1;

/// The reserved "no task" tag.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// An iSCSI opcode (6 bits), open code space.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

#[allow(missing_docs)]
impl Opcode {
    pub const NOP_OUT: Self = Self(0x00);
    pub const SCSI_COMMAND: Self = Self(0x01);
    pub const TASK_MGMT_REQUEST: Self = Self(0x02);
    pub const LOGIN_REQUEST: Self = Self(0x03);
    pub const TEXT_REQUEST: Self = Self(0x04);
    pub const DATA_OUT: Self = Self(0x05);
    pub const LOGOUT_REQUEST: Self = Self(0x06);
    pub const SNACK: Self = Self(0x10);
    pub const NOP_IN: Self = Self(0x20);
    pub const SCSI_RESPONSE: Self = Self(0x21);
    pub const TASK_MGMT_RESPONSE: Self = Self(0x22);
    pub const LOGIN_RESPONSE: Self = Self(0x23);
    pub const TEXT_RESPONSE: Self = Self(0x24);
    pub const DATA_IN: Self = Self(0x25);
    pub const LOGOUT_RESPONSE: Self = Self(0x26);
    pub const R2T: Self = Self(0x31);
    pub const ASYNC_MESSAGE: Self = Self(0x32);
    pub const REJECT: Self = Self(0x3f);

    /// Sent by initiators (bit 5 clear).
    pub const fn is_initiator(self) -> bool {
        self.0 & 0x20 == 0
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = match *self {
            Self::NOP_OUT => "NOP-Out",
            Self::SCSI_COMMAND => "SCSI Command",
            Self::TASK_MGMT_REQUEST => "Task Management Request",
            Self::LOGIN_REQUEST => "Login Request",
            Self::TEXT_REQUEST => "Text Request",
            Self::DATA_OUT => "SCSI Data-Out",
            Self::LOGOUT_REQUEST => "Logout Request",
            Self::SNACK => "SNACK Request",
            Self::NOP_IN => "NOP-In",
            Self::SCSI_RESPONSE => "SCSI Response",
            Self::TASK_MGMT_RESPONSE => "Task Management Response",
            Self::LOGIN_RESPONSE => "Login Response",
            Self::TEXT_RESPONSE => "Text Response",
            Self::DATA_IN => "SCSI Data-In",
            Self::LOGOUT_RESPONSE => "Logout Response",
            Self::R2T => "R2T",
            Self::ASYNC_MESSAGE => "Asynchronous Message",
            Self::REJECT => "Reject",
            _ => return write!(f, "Opcode({:#04x})", self.0),
        };
        f.write_str(n)
    }
}

/// Why bytes are not a valid PDU. Cheap (`Copy`), no allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the header says.
    #[error("truncated PDU: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes required.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// An AHS's length runs past TotalAHSLength.
    #[error("AHS length inconsistent with TotalAHSLength")]
    BadAhsLength,
    /// DataSegmentLength above the receiver's limit.
    #[error("data segment of {len} bytes exceeds the limit of {max}")]
    DataSegmentTooLong {
        /// Announced length.
        len: u32,
        /// Limit in force.
        max: u32,
    },
    /// A field holds a value the PDU cannot have.
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
    /// The header digest (CRC32C over BHS and AHS) does not match.
    #[error("header digest error")]
    HeaderDigest,
    /// The data digest (CRC32C over data and padding) does not match.
    #[error("data digest error")]
    DataDigest,
}

/// What goes on the wire in answer to a malformed PDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reaction {
    /// Answer with a Reject PDU carrying the offending header, and go on.
    Reject(RejectReason),
    /// The byte stream can no longer be trusted: drop the connection (ERL 0 recovery).
    DropConnection,
}

impl DecodeError {
    /// The reaction RFC 7143 asks for (§7.9, §11.17). A header that parsed but holds an
    /// impossible field is rejected; lost framing or an oversized segment drops the connection
    /// (the receiver cannot, or must not, read past it). A digest error drops the connection
    /// too: with a bad header digest the lengths cannot be trusted, and at ErrorRecoveryLevel 0
    /// (riser's) a data digest error is recovered by dropping the connection (§7.8).
    pub const fn reaction(&self) -> Reaction {
        match self {
            Self::InvalidField(_) => Reaction::Reject(RejectReason::INVALID_PDU_FIELD),
            Self::Truncated { .. } | Self::BadAhsLength | Self::DataSegmentTooLong { .. } | Self::HeaderDigest | Self::DataDigest => {
                Reaction::DropConnection
            }
        }
    }
}
