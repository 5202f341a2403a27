//! riser-iwarp: a software RNIC. The iWARP protocol suite — MPA (RFC 5044, with the RFC 6581
//! enhanced connection setup), DDP (RFC 5041) and RDMAP (RFC 5040) — in user space over
//! ordinary TCP sockets, implementing the `riser-verbs` provider traits. It speaks the same
//! wire protocol as Linux's soft-iWARP (siw) and iWARP hardware, so riser's iSER runs on any
//! machine and interoperates with kernel peers.
//!
//! Each connected queue pair runs two threads: a receiver that parses FPDUs from the socket
//! and places tagged data straight from the socket into registered memory after checking the
//! STag, protection domain, access rights and bounds (a violation gets a Terminate and error
//! completions, never a write outside a region), and a transmitter that segments work requests
//! and Read Responses into FPDUs written with vectored writes from registered memory.

#![warn(missing_docs)]

mod rnic;
pub mod wire;

pub use rnic::{MAX_IRD_ORD, RnicConfig, SoftCq, SoftListener, SoftMr, SoftPd, SoftQp, SoftRequest, SoftRnic};

#[doc(hidden)]
pub mod fuzzing {
    //! Entry points for the fuzz targets.
    pub use crate::rnic::{detached_qp, fuzz_receive};
}

/// A Terminate's layer, error type and error code (RFC 5040 §7, RFC 5041 §7, RFC 5044 §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    /// 0 RDMAP, 1 DDP, 2 LLP (MPA).
    pub layer: u8,
    /// Error type within the layer.
    pub etype: u8,
    /// Error code.
    pub code: u8,
}

impl Term {
    /// RDMAP local catastrophic error.
    pub const RDMAP_CATASTROPHIC: Self = Self { layer: 0, etype: 0, code: 0xff };
    /// RDMAP remote protection: invalid STag (Read source).
    pub const RDMAP_INVALID_STAG: Self = Self { layer: 0, etype: 1, code: 0 };
    /// RDMAP remote protection: base or bounds violation (Read source).
    pub const RDMAP_BOUNDS: Self = Self { layer: 0, etype: 1, code: 1 };
    /// RDMAP remote protection: access rights violation (no REMOTE_READ).
    pub const RDMAP_ACCESS: Self = Self { layer: 0, etype: 1, code: 2 };
    /// RDMAP remote protection: STag not associated with this stream (other PD).
    pub const RDMAP_PD: Self = Self { layer: 0, etype: 1, code: 3 };
    /// RDMAP remote operation: invalid RDMAP version.
    pub const RDMAP_BAD_VERSION: Self = Self { layer: 0, etype: 2, code: 5 };
    /// RDMAP remote operation: unexpected opcode.
    pub const RDMAP_BAD_OPCODE: Self = Self { layer: 0, etype: 2, code: 6 };
    /// RDMAP remote operation: catastrophic error localised to the stream (IRD exceeded).
    pub const RDMAP_IRD_EXCEEDED: Self = Self { layer: 0, etype: 2, code: 7 };
    /// RDMAP remote operation: cannot invalidate the STag of a Send with Invalidate.
    pub const RDMAP_CANNOT_INVALIDATE: Self = Self { layer: 0, etype: 2, code: 9 };
    /// DDP local catastrophic error.
    pub const DDP_CATASTROPHIC: Self = Self { layer: 1, etype: 0, code: 0 };
    /// DDP tagged buffer: invalid STag (unknown, stale key, invalidated, or no REMOTE_WRITE).
    pub const DDP_TAGGED_INVALID_STAG: Self = Self { layer: 1, etype: 1, code: 0 };
    /// DDP tagged buffer: base or bounds violation.
    pub const DDP_TAGGED_BOUNDS: Self = Self { layer: 1, etype: 1, code: 1 };
    /// DDP tagged buffer: STag not associated with this stream (other PD).
    pub const DDP_TAGGED_PD: Self = Self { layer: 1, etype: 1, code: 2 };
    /// DDP tagged buffer: invalid DDP version.
    pub const DDP_TAGGED_BAD_VERSION: Self = Self { layer: 1, etype: 1, code: 4 };
    /// DDP untagged buffer: invalid queue number.
    pub const DDP_UNTAGGED_INVALID_QN: Self = Self { layer: 1, etype: 2, code: 1 };
    /// DDP untagged buffer: no buffer posted (or the message does not fit it).
    pub const DDP_UNTAGGED_NO_BUFFER: Self = Self { layer: 1, etype: 2, code: 2 };
    /// DDP untagged buffer: MSN out of range.
    pub const DDP_UNTAGGED_BAD_MSN: Self = Self { layer: 1, etype: 2, code: 3 };
    /// DDP untagged buffer: MO does not follow the bytes received.
    pub const DDP_UNTAGGED_BAD_MO: Self = Self { layer: 1, etype: 2, code: 4 };
    /// DDP untagged buffer: invalid DDP version.
    pub const DDP_UNTAGGED_BAD_VERSION: Self = Self { layer: 1, etype: 2, code: 6 };
    /// MPA: CRC error.
    pub const MPA_CRC: Self = Self { layer: 2, etype: 0, code: 2 };
    /// MPA: FPDU framing error (length shorter than the header).
    pub const MPA_FRAMING: Self = Self { layer: 2, etype: 0, code: 3 };

    /// Whether the peer refused a remote access (as opposed to an operation or transport error).
    pub fn is_protection(self) -> bool {
        self.layer <= 1 && self.etype == 1
    }
}

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let layer = ["RDMAP", "DDP", "MPA"].get(usize::from(self.layer)).copied().unwrap_or("?");
        write!(f, "{layer} type {} code {:#04x}", self.etype, self.code)
    }
}
