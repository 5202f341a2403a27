//! # riser-target — the SCSI block target core and the iSCSI target server
//!
//! * [`backend`]: the [`backend::BlockBackend`] trait with RAM and file/block-device stores.
//! * [`aio`]: the [`aio::AsyncBackend`] trait, for stores whose I/O completes as futures.
//! * `rbd` (feature `rbd`): Ceph RBD images as asynchronous stores, through librbd.
//! * [`lu`]: [`lu::LogicalUnit`], a transport-agnostic SBC-4/SPC-5 emulation: CDB in, status,
//!   sense and data out.
//! * [`server`]: [`server::Target`], which accepts iSCSI/TCP connections, runs the login state
//!   machine of riser-iscsi, and drives sessions through the riser-datamover seam.
//!
//! ## How the pieces fit
//!
//! A store ([`backend::BlockBackend`], or [`aio::AsyncBackend`] for one of one's own whose I/O
//! completes as futures) becomes a [`lu::LogicalUnit`]; logical units are numbered LUNs of a
//! [`server::Node`] (an iSCSI target name, with its portal groups, ACL and LUN maps); nodes are
//! served by one [`server::Target`] built from a [`server::TargetConfig`] (limits, timeouts,
//! login settings). The target runs inside the caller's tokio runtime: [`server::Target::serve`]
//! accepts iSCSI/TCP connections on a listener the caller bound (feature `tcp`),
//! `Target::serve_iser` accepts iSER ones from any riser-verbs provider (feature `iser`), and
//! [`server::Target::connection`] takes a connection over a datamover of one's own. Nodes, LUNs,
//! ACL entries and portals can be changed while it serves (`add_lun`, `set_acl`, …);
//! [`server::Target::stats`] gives the statistics, [`server::Target::drain`] ends the sessions
//! before a stop.
//!
//! The repository's `examples/` show more: `embed_target_backend.rs` (a copy-on-write
//! `AsyncBackend`, read back through riser-initiator), `embed_tcp_and_iser.rs` and
//! `embed_custom_datamover.rs`.
//!
//! ## Example
//!
//! A logical unit over 1 MiB of RAM answers a READ CAPACITY (10) directly — the core needs no
//! network — and is then served on a loopback port the OS picks, until the target is drained
//! and its task dropped.
//!
//! ```rust
//! use riser_scsi::{capacity::Capacity10, sense::Status};
//! use riser_target::backend::{BlockBackend, RamBackend};
//! use riser_target::lu::{LogicalUnit, LuIdentity, Nexus};
//! use riser_target::server::{Node, Target, TargetConfig};
//! use std::{sync::Arc, time::Duration};
//!
//! let ram = Arc::new(RamBackend::new(1 << 20, 512));
//! ram.write(0, &[0x5a; 512]).unwrap(); // LBA 0
//! let lu = Arc::new(LogicalUnit::new(ram, LuIdentity::random()));
//!
//! // The I_T nexus a command comes through: initiator port and target port names.
//! let nexus = Nexus::new("iqn.2026-11.io.example:host,i,0x400001370000", "iqn.2026-11.io.example:disk,t,0x1", 1);
//! let read_capacity_10 = [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0];
//! let plan = lu.plan(&read_capacity_10, &nexus).expect("a valid CDB");
//! let outcome = lu.execute(&plan, &[], &nexus);
//! assert_eq!(outcome.status, Status::GOOD);
//! let capacity = Capacity10::parse(&outcome.data).unwrap();
//! assert_eq!((capacity.last_lba, capacity.block_len), (2047, 512));
//!
//! // The same logical unit as LUN 0 of a target node, served inside one's own runtime.
//! let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
//! rt.block_on(async {
//!     let node = Node::new("iqn.2026-11.io.example:disk").lun(lu);
//!     let target = Target::new(TargetConfig::default().node(node));
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//!     let addr = listener.local_addr().unwrap();
//!     let portal = tokio::spawn(target.clone().serve(listener));
//!     // An initiator logs in at `addr` (riser-initiator's `Session::connect`, open-iscsi,
//!     // libiscsi); here a bare TCP connection shows the portal accepts.
//!     let _conn = tokio::net::TcpStream::connect(addr).await.unwrap();
//!     assert_eq!(target.nodes().len(), 1);
//!     assert!(target.sessions().is_empty(), "no login yet");
//!     // Stop: no more connections, then ask sessions to log out (none here) and wait for them.
//!     portal.abort();
//!     assert_eq!(target.drain(Duration::from_secs(1)).await, 0);
//! });
//! ```
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
