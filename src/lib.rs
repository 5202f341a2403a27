//! # riser — iSCSI (RFC 7143) with iSER (RFC 7145), as layered crates
//!
//! This facade re-exports the layers so an embedder depends on one crate:
//!
//! | module | crate | layer |
//! |---|---|---|
//! | [`scsi`] | `riser-scsi` | SCSI CDBs, sense, payloads (no_std + alloc) |
//! | [`iscsi`] | `riser-iscsi` | sans-IO iSCSI: PDU codec, text keys, negotiation, login with CHAP |
//! | `datamover` | `riser-datamover` | RFC 5047 Datamover Interface (feature `target`) |
//! | `tcp` | `riser-tcp` | iSCSI/TCP datamover (feature `target`) |
//! | `target` | `riser-target` | SCSI block target core and iSCSI target server (feature `target`) |
//! | `initiator` | `riser-initiator` | async iSCSI initiator (feature `target`) |
//!
//! The datamover seam, the TCP and iSER datamovers, the target and the initiator join as their
//! crates land (see `docs/ARCHITECTURE.md`).
//!
//! Features: `std` (default) — standard-library support in the layers (CRC32C digests with
//! hardware acceleration, `std::error::Error`).
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

#[cfg(feature = "target")]
pub use riser_datamover as datamover;
#[cfg(feature = "target")]
pub use riser_initiator as initiator;
pub use riser_iscsi as iscsi;
pub use riser_scsi as scsi;
#[cfg(feature = "target")]
pub use riser_target as target;
#[cfg(feature = "target")]
pub use riser_tcp as tcp;
