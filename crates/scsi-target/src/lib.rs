//! # riser-target — the SCSI block target core and the iSCSI target server
//!
//! * [`backend`]: the [`backend::BlockBackend`] trait with RAM and file/block-device stores.
//! * [`aio`]: the [`aio::AsyncBackend`] trait, for stores whose I/O completes as futures.
//! * `rbd` (feature `rbd`): Ceph RBD images as asynchronous stores, through librbd.
//! * [`lu`]: [`lu::LogicalUnit`], a transport-agnostic SBC-4/SPC-5 emulation: CDB in, status,
//!   sense and data out.
//! * [`server`]: [`server::Target`], which accepts iSCSI/TCP connections, runs the login state
//!   machine of riser-iscsi, and drives sessions through the riser-datamover seam.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod aio;
pub mod backend;
pub mod lu;
#[cfg(feature = "rbd")]
#[cfg_attr(docsrs, doc(cfg(feature = "rbd")))]
pub mod rbd;
pub mod server;

/// Largest data-out a single command may carry.
pub const MAX_DATA_OUT: u32 = riser_datamover::MAX_TASK_BUFFER;
