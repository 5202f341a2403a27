//! # riser — iSCSI (RFC 7143) with iSER (RFC 7145), as layered crates
//!
//! This facade re-exports the layers so an embedder depends on one crate:
//!
//! | module | crate | layer |
//! |---|---|---|
//! | [`scsi`] | `riser-scsi` | SCSI CDBs, sense, payloads (no_std + alloc) |
//! | [`iscsi`] | `riser-iscsi` | sans-IO iSCSI: PDU codec, text keys, negotiation, login with CHAP |
//!
//! The datamover seam, the TCP and iSER datamovers, the target and the initiator join as their
//! crates land (see `docs/ARCHITECTURE.md`).
//!
//! Features: `std` (default) — standard-library support in the layers (CRC32C digests with
//! hardware acceleration, `std::error::Error`).
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

pub use riser_iscsi as iscsi;
pub use riser_scsi as scsi;
