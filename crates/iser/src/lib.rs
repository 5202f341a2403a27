//! riser-iser: the iSER datamover (RFC 7145) for initiator and target, over any riser-verbs
//! provider (the software iWARP RNIC, or rdma-core).
//!
//! Every iSCSI PDU travels as one RDMA Send — `[iSER header 28 B | BHS 48 B | data]` — from the
//! first Login Request on; Data-In, R2T and solicited Data-Out never appear. The target's
//! Put_Data is an RDMA Write to the read STag and VA the initiator advertised in the command's
//! iSER header, Get_Data an RDMA Read from the write STag and VA; the initiator gives each
//! command's buffers a new key per command and direction (registered afresh, or on a provider
//! that can swap a region's buffer a kept region re-keyed for a small read) and revokes them
//! when the command ends. The iSCSI layer above is the same as over TCP: it sees only the
//! `riser_datamover::Datamover` trait.
//!
//! ## Main types
//!
//! * [`connect`] (initiator) and [`accept`] (target, from a provider's connection request)
//!   set up a queue pair, exchange the iSER private data of RFC 7145 §5.1 and give an
//!   [`IserDatamover`], the `riser_datamover::Datamover` of one connection. Its
//!   [`driver`](IserDatamover::driver) is spawned on tokio and turns completions into events.
//! * [`IserConfig`] sizes it (receive depth and size, IRD/ORD, send queue, Send with
//!   Invalidate, unsolicited Data-Out); its builder methods start from the defaults.
//! * [`header`] is the iSER header codec.
//!
//! Nobody needs to call these to serve iSER: `riser_target::server::Target::serve_iser` and
//! riser-initiator's iSER connector do. They are for an embedder wiring the datamover into
//! code of its own, as below.
//!
//! ## Example
//!
//! A target and an initiator side over the software iWARP RNIC on loopback; the initiator's
//! NOP-Out reaches the target as a control event.
//!
//! ```rust
//! use bytes::Bytes;
//! use riser_datamover::{ConnectionResources, ControlPdu, Datamover, DmEvent};
//! use riser_iscsi::wire::{Header, NopOut, RESERVED_TAG};
//! use riser_iser::{IserConfig, accept, connect};
//! use riser_iwarp::SoftRnic;
//! use riser_verbs::{Listener, Provider};
//!
//! let config = IserConfig::default().recv_depth(32).ird(4).ord(4);
//! assert_eq!((config.recv_depth, config.ird), (32, 4));
//!
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! rt.block_on(async move {
//!     let rnic = SoftRnic::default();
//!     let listener = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
//!     let addr = listener.local_addr().unwrap();
//!     // Connection setup blocks (RDMA CM style): run both ends on the blocking pool.
//!     let (r, c) = (rnic.clone(), config.clone());
//!     let target = tokio::task::spawn_blocking(move || accept(&r, listener.get_request().unwrap(), c).unwrap().0);
//!     let (r, c) = (rnic.clone(), config.clone());
//!     let initiator = tokio::task::spawn_blocking(move || connect(&r, addr, c).unwrap()).await.unwrap();
//!     let target = target.await.unwrap();
//!     for dm in [&target, &initiator] {
//!         tokio::spawn(dm.driver());
//!         dm.allocate_connection_resources(ConnectionResources::default()).unwrap();
//!         dm.enable();
//!     }
//!
//!     // One RDMA Send: [iSER header | BHS | "ping"].
//!     let ping = NopOut { immediate: true, itt: 1, ttt: RESERVED_TAG, ..NopOut::default() };
//!     initiator.send_control(ControlPdu::new(Header::NopOut(ping), Bytes::from_static(b"ping"))).await.unwrap();
//!     match target.next_event().await {
//!         DmEvent::Control(pdu) => {
//!             assert!(matches!(pdu.header, Header::NopOut(NopOut { itt: 1, .. })));
//!             assert_eq!(pdu.data, "ping");
//!         }
//!         other => panic!("unexpected {other:?}"),
//!     }
//!     initiator.terminate();
//!     target.terminate();
//! });
//! ```

#![warn(missing_docs)]

pub mod header;
mod mover;

pub use mover::{ANSWERS_RESERVED, DEFAULT_READ_DATA_IN_FLIGHT, DEFAULT_SIGNAL_EVERY, IserConfig, IserDatamover, accept, connect};

#[doc(hidden)]
pub mod fuzzing {
    //! Entry points for the fuzz targets.
    pub use crate::mover::fuzz_receive;
}

/// Largest write a target accepts in one command (its task buffer).
pub const MAX_TASK_BUFFER: usize = riser_datamover::MAX_TASK_BUFFER as usize;
