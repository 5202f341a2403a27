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
//! | `verbs` | `riser-verbs` | RDMA provider interface (feature `rdma`) |
//! | `iwarp` | `riser-iwarp` | software iWARP RNIC over TCP (feature `rdma`) |
//! | `iser` | `riser-iser` | iSER datamover over `verbs` (feature `rdma`) |
//! | `service` | `riser-service` | the target as a service: configuration, control plane, metrics (feature `service`) |
//! | `rbd` | `riser-rbd` | Ceph librados/librbd binding (feature `rbd`) |
//!
//! Features: `std` (default) — standard-library support in the layers (CRC32C digests with
//! hardware acceleration, `std::error::Error`); `target` and `rdma` (default) — the tokio-based
//! layers; `rdma-core` — the rdma-core provider in `verbs::rdma_core` (real RDMA devices, rxe,
//! siw); `service` (default) — `service`, riser-service: the target as an operable service
//! (configuration model, control plane, metrics) and `cli`, what the programs share; `rbd` —
//! Ceph RBD images as stores (`target::rbd`) through librbd, linked dynamically. Without default
//! features only `scsi` and `iscsi` remain, and the crate is `no_std` + `alloc`.
//!
//! ## The layers
//!
//! From the bottom: `scsi` turns CDBs, sense and payloads into values; `iscsi` is the protocol
//! without I/O (PDUs, text keys, login, sequence numbers); `datamover` is the RFC 5047 seam
//! below which data actually moves — `tcp` over a socket, `iser` over RDMA through the `verbs`
//! traits, provided by `iwarp` (software, any machine) or `verbs::rdma_core` (RNICs); `target`
//! and `initiator` are the two roles, written against the seam only; `service` runs the target
//! from a configuration file with a control plane and metrics. Each module is the whole layer
//! crate, so `riser::target::server::Target` is `riser_target::server::Target`, and the layer
//! crates' own docs hold their guides and examples. The repository's `examples/embed_*.rs`
//! (see the README's "Embedding riser") are programs built on these paths.
//!
//! ## Example
//!
//! Two layers through the facade: a READ (10) built by `scsi`, executed by a `target` logical
//! unit over RAM, its data checked.
//!
//! ```rust
//! # #[cfg(feature = "target")] {
//! use riser::scsi::cdb::{Cdb, CdbSize, Rw};
//! use riser::scsi::sense::Status;
//! use riser::target::backend::{BlockBackend, RamBackend};
//! use riser::target::lu::{LogicalUnit, LuIdentity, Nexus};
//! use std::sync::Arc;
//!
//! let ram = Arc::new(RamBackend::new(1 << 20, 512));
//! ram.write(512, &[0xab; 512]).unwrap(); // LBA 1
//! let lu = LogicalUnit::new(ram, LuIdentity::random());
//! let nexus = Nexus::new("iqn.2026-11.io.example:host,i,0x400001370000", "iqn.2026-11.io.example:disk,t,0x1", 1);
//!
//! let read = Cdb::Read(Rw { size: CdbSize::Ten, lba: 1, blocks: 1, ..Rw::default() }).to_vec();
//! let plan = lu.plan(&read, &nexus).expect("a valid READ (10)");
//! let outcome = lu.execute(&plan, &[], &nexus);
//! assert_eq!(outcome.status, Status::GOOD);
//! assert!(outcome.data.len() == 512 && outcome.data.iter().all(|&b| b == 0xab));
//! # }
//! ```
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "target")]
#[cfg_attr(docsrs, doc(cfg(feature = "target")))]
pub use riser_datamover as datamover;
#[cfg(feature = "target")]
#[cfg_attr(docsrs, doc(cfg(feature = "target")))]
pub use riser_initiator as initiator;
pub use riser_iscsi as iscsi;
#[cfg(feature = "rdma")]
#[cfg_attr(docsrs, doc(cfg(feature = "rdma")))]
pub use riser_iser as iser;
#[cfg(feature = "rdma")]
#[cfg_attr(docsrs, doc(cfg(feature = "rdma")))]
pub use riser_iwarp as iwarp;
/// The librbd binding (feature `rbd`).
#[cfg(feature = "rbd")]
#[cfg_attr(docsrs, doc(cfg(feature = "rbd")))]
pub use riser_rbd as rbd;
pub use riser_scsi as scsi;
#[cfg(feature = "target")]
#[cfg_attr(docsrs, doc(cfg(feature = "target")))]
pub use riser_target as target;
#[cfg(feature = "target")]
#[cfg_attr(docsrs, doc(cfg(feature = "target")))]
pub use riser_tcp as tcp;
#[cfg(feature = "rdma")]
#[cfg_attr(docsrs, doc(cfg(feature = "rdma")))]
pub use riser_verbs as verbs;

#[cfg(feature = "service")]
#[cfg_attr(docsrs, doc(cfg(feature = "service")))]
pub use riser_service as service;
/// What the programs share: sizes, portals, CHAP credentials, `KEY=VALUE` settings, logging
/// (feature `service`; riser-service's `cli`).
#[cfg(feature = "service")]
#[cfg_attr(docsrs, doc(cfg(feature = "service")))]
pub use riser_service::cli;
