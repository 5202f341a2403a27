//! The full-feature phase: what both roles decide about a session once login is over.
//!
//! [`transfer`] holds the data-transfer arithmetic of RFC 7143 §13 as one value per
//! connection ([`TransferLimits`]): which side's MaxRecvDataSegmentLength bounds whose PDUs, and
//! how a write's data splits into immediate, unsolicited and solicited parts. The TCP and iSER
//! datamovers and the target core all ask it, so each rule is written once.

pub mod transfer;

pub use transfer::{TransferLimits, WriteSplit};
