//! riser-iwarp: a software RNIC. The iWARP protocol suite — MPA (RFC 5044, with the RFC 6581
//! enhanced connection setup), DDP (RFC 5041) and RDMAP (RFC 5040) — in user space over
//! ordinary TCP sockets, implementing the `riser-verbs` provider traits. It speaks the same
//! wire protocol as Linux's soft-iWARP (siw) and iWARP hardware, so riser's iSER runs on any
//! machine and interoperates with kernel peers.
//!
//! Each connected queue pair runs two tasks on the tokio runtime current when it connects (or,
//! outside any runtime, on a runtime the RNIC starts once for all such queue pairs): a
//! receiver that parses FPDUs from the socket and places tagged data straight from the socket
//! into registered memory after checking the STag, protection domain, access rights and bounds
//! (a violation gets a Terminate and error completions, never a write outside a region), and a
//! transmitter that segments work requests and Read Responses into FPDUs written with vectored
//! writes from registered memory.

#![warn(missing_docs)]

mod rnic;
pub mod wire;

pub use rnic::{MAX_IRD_ORD, RnicConfig, SoftCq, SoftListener, SoftMr, SoftPd, SoftQp, SoftRequest, SoftRnic};
pub use wire::Term;

#[doc(hidden)]
pub mod fuzzing {
    //! Entry points for the fuzz targets.
    pub use crate::rnic::{detached_qp, fuzz_receive};
}
